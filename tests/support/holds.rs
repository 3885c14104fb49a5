//! What the outside attack on keyed holds shares (`tests/attack_keyed_holds_*.rs`): a prelude
//! of the imports its tests use, a small generator, and readers of the expiration stream with
//! a 60 s hang guard.
#![allow(unused_imports)] // a prelude: each file uses part of it

pub use std::collections::{HashMap, HashSet};
pub use std::sync::Arc;
pub use std::sync::atomic::{AtomicBool, Ordering};
pub use std::time::Duration;

pub use futures::{FutureExt, StreamExt};
pub use tokio::time::Instant;
pub use tokio_wheel::Wheel;
pub use tokio_wheel::keyed::{Expirations, Expired, KeyedTimer, Timers};

pub use super::two_workers;

pub static RSTATS: std::sync::Mutex<std::collections::BTreeMap<String, u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());
pub static FIRED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub const HANG: Duration = Duration::from_secs(60);
pub const HOUR: Duration = Duration::from_secs(3_600);

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A current-thread runtime whose clock starts paused.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

/// Spins (politely) until `t`.
pub fn spin_until(t: Instant) {
    loop {
        let now = Instant::now();
        if now >= t {
            return;
        }
        if t - now > ms(2) {
            std::thread::sleep(t - now - ms(1));
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Reads the stream until it ends (hang guard 60 s), each item with the moment it was read.
pub async fn read_to_end(expired: &mut Expirations<u64, u64>) -> Vec<(Expired<u64, u64>, Instant)> {
    let mut got = Vec::new();
    tokio::time::timeout(HANG, async {
        while let Some(e) = expired.next().await {
            got.push((e, Instant::now()));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the stream did not end within 60 s ({} read)", got.len()));
    got
}

/// Reads `n` items (hang guard 60 s).
pub async fn read_n(
    expired: &mut Expirations<u64, u64>,
    n: usize,
) -> Vec<(Expired<u64, u64>, Instant)> {
    let mut got = Vec::new();
    tokio::time::timeout(HANG, async {
        while got.len() < n {
            match expired.next().await {
                Some(e) => got.push((e, Instant::now())),
                None => break,
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("only {} of {n} expirations within 60 s", got.len()));
    got
}
