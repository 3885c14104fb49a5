//! What the outside attack on keyed shards shares (`tests/attack_shards_*.rs`).
#![allow(dead_code)]

use std::time::Duration;

/// Tiny deterministic PRNG (xorshift64*).
#[derive(Clone)]
pub struct Rng(pub u64);
impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545F4914F6CDD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub fn mt_runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

/// A current-thread runtime on the real clock.
pub fn ct_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

pub const GUARD: Duration = Duration::from_secs(60);

/// Awaits `f`, failing the test if it takes longer than [`GUARD`] (a hang, not a slow run).
pub async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(GUARD, f).await {
        Ok(out) => out,
        Err(_) => panic!("gave up after {GUARD:?}: {what} hangs"),
    }
}

/// |a - b| <= 1 ms (deadlines round to a tick).
pub fn close(a: tokio::time::Instant, b: tokio::time::Instant) -> bool {
    let d = if a > b { a - b } else { b - a };
    d <= Duration::from_millis(1)
}

/// `ci` normally, `full` with `TOKIO_WHEEL_FULL=1` (README: heavy tests at full size).
pub fn scaled<T>(ci: T, full: T) -> T {
    if std::env::var("TOKIO_WHEEL_FULL").is_ok_and(|v| v == "1") {
        full
    } else {
        ci
    }
}
