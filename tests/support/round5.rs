//! Helpers of round 5's outside attack on keyed sets fed from many threads
//! (`tests/attack_round5_keyed*.rs`).
#![allow(dead_code)]

use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_wheel::{Expirations, Expired};

pub const HOUR: Duration = Duration::from_secs(3_600);
/// Only a hang guard: every wait here is over long before it.
pub const HANG: Duration = Duration::from_secs(30);

pub fn full() -> bool {
    std::env::var_os("TOKIO_WHEEL_FULL").is_some()
}

/// `small` by default, `big` with `TOKIO_WHEEL_FULL=1`.
pub fn scale(small: u64, big: u64) -> u64 {
    if full() { big } else { small }
}

pub fn runtime() -> tokio::runtime::Runtime {
    super::two_workers()
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Reads the stream until `done` says enough arrived (or it ends); each item with the moment
/// it was read.
pub async fn read_until(
    expired: &mut Expirations<u64, u64>,
    mut done: impl FnMut(&[(Expired<u64, u64>, Instant)]) -> bool,
) -> Vec<(Expired<u64, u64>, Instant)> {
    let mut got = Vec::new();
    tokio::time::timeout(HANG, async {
        while !done(&got) {
            match expired.next().await {
                Some(e) => got.push((e, Instant::now())),
                None => break,
            }
        }
    })
    .await
    .expect("the stream stalled");
    got
}
