//! A `redis-server` of the test's own, on an ephemeral loopback port, with an append-only
//! file so it can be restarted without losing data. Started per test: hermetic and
//! parallel-safe.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

/// Starts a server, or explains what is missing. In CI (`CI` set) a missing `redis-server` is
/// a failure; elsewhere the Redis tests are skipped with a message.
pub fn start() -> Option<RedisServer> {
    if Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        let message = "redis-server is not on PATH: install it (e.g. `apt-get install -y redis-server`) \
                       to run the Redis tests";
        if std::env::var_os("CI").is_some()
            || std::env::var_os("TOKIO_WHEEL_REQUIRE_REDIS").is_some()
        {
            panic!("{message}");
        }
        eprintln!("SKIPPED: {message}");
        return None;
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = RedisServer {
        child: None,
        port,
        dir: tempfile::tempdir().unwrap(),
    };
    server.launch();
    Some(server)
}

impl RedisServer {
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    fn launch(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops the server (SIGKILL: the append-only file keeps what was acknowledged).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and data.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
