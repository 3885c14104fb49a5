//! Helpers of the outside attack tests (`tests/attack_*.rs`), written from API.md only.
#![allow(dead_code)]

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt;
use futures::task::noop_waker_ref;
use tokio_wheel::Expirations;

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}
pub fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

pub fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(noop_waker_ref()))
}

/// Lets the actors run (paused time does not move: yields only).
pub async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Nothing expired right now (paused time).
pub async fn quiet<K, V>(expired: &mut Expirations<K, V>) {
    settle().await;
    let mut next = expired.next();
    assert!(poll_once(&mut next).is_pending(), "an expiration came");
}
