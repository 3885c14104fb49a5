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

/// A multi-thread runtime with two workers (this machine class's cores), timers enabled.
pub fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
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
