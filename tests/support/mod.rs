//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod wheel_model;

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// Lets the actor (and any spawned job) run: on a current-thread runtime every ready task gets
/// a turn per yield.
pub async fn settle() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

/// Polls a future once with a no-op waker.
pub fn poll_once<F: Future>(future: F) -> Poll<F::Output> {
    let mut future = pin!(future);
    future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
}

/// A small deterministic generator (xorshift): tests need repeatable spread, not quality.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in `0..max` milliseconds, microsecond grain.
    pub fn millis(&mut self, max: u64) -> std::time::Duration {
        std::time::Duration::from_micros(self.below(max * 1_000))
    }
}

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

/// Asserts at compile time that a type is `Send`.
pub fn assert_send<T: Send>() {}
/// Asserts at compile time that a type is `Sync`.
pub fn assert_sync<T: Sync>() {}
/// Asserts at compile time that a type is `Unpin`.
pub fn assert_unpin<T: Unpin>() {}
pub mod proxy;
#[cfg(feature = "redis")]
pub mod redis_cluster;
pub mod redis_server;
