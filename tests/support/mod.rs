//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod holds;
pub mod round5;
pub mod shards;
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

/// A multi-thread runtime with two workers (this machine class's cores), timers enabled.
pub fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The wheel's stats once `done` says they show what the test did, or after 5 s: an actor
/// publishes its counters at the end of its turn, so a `take` or `len` answered during the
/// turn can come a moment before them.
pub fn stats_once(
    wheel: &tokio_wheel::Wheel,
    done: impl Fn(&tokio_wheel::Stats) -> bool,
) -> tokio_wheel::Stats {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let stats = wheel.stats();
        if done(&stats) || std::time::Instant::now() > until {
            return stats;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Polls a future once with a no-op waker.
pub fn poll_once<F: Future>(future: F) -> Poll<F::Output> {
    let mut future = pin!(future);
    future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
}

pub mod rng;
#[allow(unused_imports)]
pub use rng::Rng;

/// Asserts at compile time that a type is `Send`.
pub fn assert_send<T: Send>() {}
/// Asserts at compile time that a type is `Sync`.
pub fn assert_sync<T: Sync>() {}
/// Asserts at compile time that a type is `Unpin`.
pub fn assert_unpin<T: Unpin>() {}
