//! `twq … dashboard` as a child process for the board's tests, reached over real HTTP.

use std::time::Duration;

use axum::http::StatusCode;

use super::board::{PANICKED, Reply};
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};

pub struct Board {
    child: Child,
    pub addr: String,
    dir: tempfile::TempDir,
}

impl Drop for Board {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Board {
    /// What the process printed so far (standard output and error).
    pub fn output(&self) -> String {
        let out = std::fs::read_to_string(self.dir.path().join("out")).unwrap_or_default();
        let err = std::fs::read_to_string(self.dir.path().join("err")).unwrap_or_default();
        format!("{out}{err}")
    }

    pub fn get(&self, path: &str) -> Reply {
        http(&self.addr, "GET", path, &[], "")
    }

    pub fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        http(&self.addr, "GET", path, headers, "")
    }

    pub fn post(&self, path: &str, form: &str) -> Reply {
        http(
            &self.addr,
            "POST",
            path,
            &[("Content-Type", "application/x-www-form-urlencoded")],
            form,
        )
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `twq ARGS` (no `TWQ_*` from the environment) and waits until it listens on
/// `addr`; panics with its output if it exits first.
pub fn start(args: &[String], addr: &str) -> Board {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_twq"))
        .args(args)
        .env_remove("TWQ_REDIS")
        .env_remove("TWQ_CLUSTER")
        .env_remove("TWQ_QUEUE")
        .env_remove("TWQ_FILE")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.path().join("out")).unwrap())
        .stderr(std::fs::File::create(dir.path().join("err")).unwrap())
        .spawn()
        .expect("run twq dashboard");
    let mut board = Board {
        child,
        addr: addr.to_owned(),
        dir,
    };
    let started = std::time::Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        if let Ok(Some(status)) = board.child.try_wait() {
            panic!("twq exited with {status}: {}", board.output());
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "twq dashboard did not listen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    board
}

/// Runs `twq ARGS` to its end (at most `limit`): (exit code, everything it printed).
pub fn run(args: &[String], limit: Duration) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_twq"))
        .args(args)
        .env_remove("TWQ_REDIS")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.path().join("out")).unwrap())
        .stderr(std::fs::File::create(dir.path().join("err")).unwrap())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = std::fs::read_to_string(dir.path().join("out")).unwrap_or_default();
    let err = std::fs::read_to_string(dir.path().join("err")).unwrap_or_default();
    (code, format!("{out}{err}"))
}

/// One HTTP/1.1 request on its own connection. Status 0: no answer (connection dropped).
pub fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let has_host = headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host"));
    let mut request = format!("{method} {path} HTTP/1.1\r\n");
    if !has_host {
        request.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Reply {
            status: StatusCode::from_u16(PANICKED).unwrap(),
            headers: Default::default(),
            body: text,
        };
    };
    let mut lines = head.lines();
    let status: u16 = lines.next().unwrap()[9..12].parse().unwrap();
    let mut map = axum::http::HeaderMap::new();
    for line in lines {
        if let Some((k, v)) = line.split_once(':') {
            map.append(
                axum::http::HeaderName::from_bytes(k.trim().as_bytes()).unwrap(),
                axum::http::HeaderValue::from_str(v.trim()).unwrap(),
            );
        }
    }
    Reply {
        status: StatusCode::from_u16(status).unwrap(),
        headers: map,
        body: body.to_owned(),
    }
}

/// Every key of the server with its serialized value, and how many writes it counted.
pub fn snapshot(url: &str) -> (Vec<(String, Vec<u8>)>, String) {
    let mut connection = redis::Client::open(url).unwrap().get_connection().unwrap();
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut connection).unwrap();
    keys.sort();
    let dump = keys
        .into_iter()
        .map(|key| {
            let value: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut connection).unwrap();
            (key, value)
        })
        .collect();
    let info: String = redis::cmd("INFO")
        .arg("persistence")
        .query(&mut connection)
        .unwrap();
    let changes = info
        .lines()
        .find(|l| l.starts_with("rdb_changes_since_last_save"))
        .unwrap()
        .trim()
        .to_owned();
    (dump, changes)
}
