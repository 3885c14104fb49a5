//! hyper on the wheel (feature `hyper`): [`HyperTimer`], hyper's timer, and [`IdleIo`], the
//! idle-connection timeout hyper lacks.
//!
//! Both use only the wheel's public API and work for HTTP/1 and HTTP/2, with hyper's own
//! connection builders and hyper-util's (`server::conn::auto::Builder`, the legacy client's
//! `pool_timer`).
//!
//! A whole server with both (and the tower layer) is README's "In a hyper or axum server" and
//! `servers/examples/hyper_server.rs`; in short:
//!
//! ```text
//! let timer = HyperTimer::new(&wheel);
//! let io = IdleIo::new(stream, &wheel, Duration::from_secs(60));   // any AsyncRead + AsyncWrite
//! let idle = io.handle();                                          // a handler holds idle.busy()
//! http1::Builder::new()
//!     .timer(timer.clone())
//!     .header_read_timeout(Duration::from_secs(90))                // slowloris: on the wheel
//!     .serve_connection(TokioIo::new(io), service);
//! ```
//!
//! Here both on their own, without an HTTP stack: an idle stream is closed after `d` of
//! silence, and hyper's timer calls land on the wheel.
//!
//! ```
//! use std::time::Duration;
//!
//! use hyper::rt::Timer;
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use tokio_wheel::Wheel;
//! use tokio_wheel::hyper::{HyperTimer, IdleIo};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let wheel = Wheel::new();
//! let (stream, mut peer) = tokio::io::duplex(64);
//! let mut io = IdleIo::new(stream, &wheel, Duration::from_secs(60));
//! peer.write_all(b"ping").await.unwrap();
//! let mut buf = [0; 4];
//! io.read_exact(&mut buf).await.unwrap(); // traffic: the countdown restarts
//! let error = io.read(&mut buf).await.unwrap_err(); // then 60 s of silence
//! assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
//!
//! let timer = HyperTimer::new(&wheel);
//! let start = timer.now();
//! timer.sleep(Duration::from_secs(10)).await;
//! assert!(timer.now() >= start + Duration::from_secs(10));
//! # }
//! ```

mod idle;
mod timer;

#[cfg(feature = "axum")]
pub(crate) use idle::Group;
pub use idle::{Busy, IdleHandle, IdleIo};
pub use timer::{HyperSleep, HyperTimer};
