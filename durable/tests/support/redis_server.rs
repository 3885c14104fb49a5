//! A `redis-server` of the test's own, on an ephemeral loopback port, with an append-only
//! file so it can be restarted without losing data. Started per test: hermetic and
//! parallel-safe. Extra arguments (a password, a `--replicaof`, TLS certificates) go after
//! the defaults, so they override them.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    /// The port speaks TLS only (`--port 0 --tls-port <port>`).
    tls: bool,
    extra: Vec<String>,
    dir: tempfile::TempDir,
}

/// Skips a test that needs `what`, or fails it in CI (`CI` or `TOKIO_WHEEL_REQUIRE_REDIS`
/// set): a missing tool must not pass for a green run there.
pub fn skip_or_fail(what: &str) {
    if std::env::var_os("CI").is_some() || std::env::var_os("TOKIO_WHEEL_REQUIRE_REDIS").is_some() {
        panic!("{what}");
    }
    eprintln!("SKIPPED: {what}");
}

/// Starts a server, or explains what is missing. In CI (`CI` set) a missing `redis-server` is
/// a failure; elsewhere the Redis tests are skipped with a message.
pub fn start() -> Option<RedisServer> {
    start_with(&[])
}

/// Starts a server with these extra arguments (e.g. `["--requirepass", "secret"]`).
pub fn start_with(extra: &[&str]) -> Option<RedisServer> {
    let mut server = prepare(false, extra)?;
    if let Err(log) = server.launch() {
        panic!("redis-server did not start:\n{log}");
    }
    Some(server)
}

/// Starts a server whose port speaks only TLS, with these extra arguments (the certificate
/// files). A `redis-server` built without TLS is skipped (failed in CI).
pub fn start_tls(extra: &[&str]) -> Option<RedisServer> {
    let mut server = prepare(true, extra)?;
    match server.launch() {
        Ok(()) => Some(server),
        Err(log) if log.to_lowercase().contains("tls") => {
            skip_or_fail(&format!(
                "this redis-server has no TLS support (`--tls-port` refused):\n{log}"
            ));
            None
        }
        Err(log) => panic!("redis-server (TLS) did not start:\n{log}"),
    }
}

fn prepare(tls: bool, extra: &[&str]) -> Option<RedisServer> {
    if Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        skip_or_fail(
            "redis-server is not on PATH: install it (e.g. `apt-get install -y redis-server`) \
             to run the Redis tests",
        );
        return None;
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    Some(RedisServer {
        child: None,
        port,
        tls,
        extra: extra.iter().map(|arg| (*arg).to_owned()).collect(),
        dir: tempfile::tempdir().unwrap(),
    })
}

impl RedisServer {
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id (to freeze it with SIGSTOP), while it runs.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server runs").id()
    }

    /// The server's data directory (a tempdir removed with the server).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Launches the server and waits until its port accepts; if it exits first, returns
    /// what it logged.
    fn launch(&mut self) -> Result<(), String> {
        let port = self.port.to_string();
        let ports: &[&str] = if self.tls {
            &["--port", "0", "--tls-port", &port]
        } else {
            &["--port", &port]
        };
        let log = self.dir.path().join("redis.log");
        let child = Command::new("redis-server")
            .args(ports)
            .args(["--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Ok(Some(status)) = self.child.as_mut().unwrap().try_wait() {
                self.child = None;
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("exited with {status}: {text}"));
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Stops the server (SIGKILL: the append-only file keeps what was acknowledged).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Replaces the extra arguments the next (re)start uses.
    pub fn set_extra(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|arg| (*arg).to_owned()).collect();
    }

    /// Starts it again on the same port, arguments and data.
    pub fn restart(&mut self) {
        self.stop();
        if let Err(log) = self.launch() {
            panic!("redis-server did not restart:\n{log}");
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(feature = "redis")]
/// Every key on the server with its serialized value (but the kept replies of calls, which
/// expire on their own): equal before and after means nothing was written.
pub fn snapshot(url: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut connection = redis::Client::open(url).unwrap().get_connection().unwrap();
    let mut keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut connection).unwrap();
    // Kept replies of the set-up's calls expire on their own: not a write by the CLI.
    keys.retain(|key| !key.windows(6).any(|w| w == b":call:"));
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let value: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut connection).unwrap();
            (key, value)
        })
        .collect()
}
