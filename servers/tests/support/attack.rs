//! Helpers of the outside attack tests on §5 and §5a (`attack_servers.rs`, `attack_tower.rs`,
//! `attack_idle_*.rs`).
#![allow(dead_code)]

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}
pub fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}
pub fn us(u: u64) -> Duration {
    Duration::from_micros(u)
}
/// How late an idle close may be under paused time: one tick and tokio's millisecond grid.
pub const SLACK: Duration = Duration::from_millis(2);
pub const D: Duration = Duration::from_secs(10);
pub const TICK: Duration = Duration::from_millis(1);

pub fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(std::task::Waker::noop()))
}

pub async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Reads (discarding data) until an error; returns it and when it came.
pub async fn read_until_error(io: &mut (impl AsyncRead + Unpin)) -> (io::Error, Instant) {
    let mut buf = [0u8; 256];
    loop {
        match io.read(&mut buf).await {
            Ok(0) => panic!("EOF instead of an error"),
            Ok(_) => {}
            Err(e) => return (e, Instant::now()),
        }
    }
}

/// [`read_until_error`], as the error's kind.
pub async fn read_err(io: &mut (impl AsyncRead + Unpin)) -> (io::ErrorKind, Instant) {
    let (error, at) = read_until_error(io).await;
    (error.kind(), at)
}
