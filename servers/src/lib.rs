//! This unpublished package holds the real-server tests (`tests/`), the examples
//! (`examples/hyper_server.rs`, `examples/axum_server.rs`) and the benchmarks
//! (`examples/hyper_bench.rs`, `examples/idle_bench.rs`) of `tokio-wheel`'s features `hyper`,
//! `tower` and `axum`, and compiles README.md's server sample. Its one item, [`TokioIdle`], is
//! the benchmarks' peer: idle expiry the usual tokio way.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// The peer of `tokio_wheel::hyper::IdleIo` in the benchmarks: a tokio `Sleep` per connection,
/// reset on every read or write that moves bytes (what a hyper user writes with hyper-util's
/// `TokioTimer`); a read or write that would wait past it answers `TimedOut`.
pub struct TokioIdle<T> {
    io: T,
    timeout: Duration,
    sleep: Pin<Box<Sleep>>,
}

impl<T> TokioIdle<T> {
    /// Wraps `io`, closing it after `timeout` without traffic.
    pub fn new(io: T, timeout: Duration) -> TokioIdle<T> {
        TokioIdle {
            io,
            timeout,
            sleep: Box::pin(tokio::time::sleep(timeout)),
        }
    }

    fn moved(&mut self) {
        let deadline = Instant::now() + self.timeout;
        self.sleep.as_mut().reset(deadline);
    }

    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.sleep.as_mut().poll(cx).is_ready()
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "idle")
}

impl<T: AsyncRead + Unpin> AsyncRead for TokioIdle<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                this.moved();
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(timed_out())),
            other => other,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for TokioIdle<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) if n > 0 => {
                this.moved();
                Poll::Ready(Ok(n))
            }
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(timed_out())),
            other => other,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The README's code samples, the server one included, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeSamples;
