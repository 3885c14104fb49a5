//! Helpers shared by the queue's integration tests.
#![allow(dead_code)]

pub mod backend;
#[cfg(feature = "dashboard")]
pub mod board;
#[cfg(all(feature = "dashboard", feature = "cli"))]
pub mod board_twq;
#[cfg(feature = "dashboard")]
pub mod browser;
pub mod proxy;
#[cfg(feature = "redis")]
pub mod redis_cluster;
pub mod redis_server;
#[path = "../../../tests/support/rng.rs"]
mod rng;
#[cfg(feature = "cli")]
pub mod twq;
#[allow(unused_imports)]
pub use rng::Rng;

/// An append-only line log that a test and its child processes write. Plain writes reach the
/// kernel at once, so a SIGKILL loses nothing that was written.
#[derive(Clone)]
pub struct LineLog(std::sync::Arc<std::sync::Mutex<std::fs::File>>);

impl LineLog {
    pub fn open(path: impl AsRef<std::path::Path>) -> LineLog {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        LineLog(std::sync::Arc::new(std::sync::Mutex::new(file)))
    }

    pub fn line(&self, text: String) {
        use std::io::Write;
        let mut file = self.0.lock().unwrap();
        file.write_all(format!("{text}\n").as_bytes()).unwrap();
    }
}
