//! Starts a throwaway `redis-server` (from PATH) on a free loopback port for the Redis examples,
//! unless `REDIS_URL` names one to use.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Keeps the server running; stops it when dropped.
pub struct Server(Option<Child>);

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The URL to use and the server to keep alive while using it.
pub fn start() -> (Server, String) {
    if let Ok(url) = std::env::var("REDIS_URL") {
        return (Server(None), url);
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server on PATH (apt-get install -y redis-server), or set REDIS_URL");
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(Duration::from_millis(5));
    }
    (Server(Some(child)), format!("redis://127.0.0.1:{port}/"))
}
