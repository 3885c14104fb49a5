//! hyper on the wheel (feature `hyper`): [`HyperTimer`], hyper's timer, and [`IdleIo`], the
//! idle-connection timeout hyper lacks.
//!
//! Both use only the wheel's public API and work for HTTP/1 and HTTP/2, with hyper's own
//! connection builders and hyper-util's (`server::conn::auto::Builder`, the legacy client's
//! `pool_timer`).
//!
//! ```no_run
//! use std::convert::Infallible;
//! use std::time::Duration;
//!
//! use http_body_util::Full;
//! use hyper::body::{Bytes, Incoming};
//! use hyper::server::conn::http1;
//! use hyper::service::service_fn;
//! use hyper::{Request, Response};
//! use hyper_util::rt::TokioIo;
//! use tokio::net::TcpListener;
//! use tokio_wheel::Wheel;
//! use tokio_wheel::hyper::{HyperTimer, IdleIo};
//!
//! # #[tokio::main]
//! # async fn main() -> std::io::Result<()> {
//! let wheel = Wheel::new();
//! let timer = HyperTimer::new(&wheel);
//! let listener = TcpListener::bind("127.0.0.1:0").await?;
//! loop {
//!     let (stream, _) = listener.accept().await?;
//!     // Closed after 60 s without a byte either way and no request in progress.
//!     let io = IdleIo::new(stream, &wheel, Duration::from_secs(60));
//!     let idle = io.handle();
//!     let service = service_fn(move |_req: Request<Incoming>| {
//!         let idle = idle.clone();
//!         async move {
//!             let _busy = idle.busy(); // a slow handler keeps its connection open
//!             Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("hello"))))
//!         }
//!     });
//!     let connection = http1::Builder::new()
//!         .timer(timer.clone())
//!         .header_read_timeout(Duration::from_secs(10)) // slowloris: fires on the wheel
//!         .serve_connection(TokioIo::new(io), service);
//!     tokio::spawn(connection);
//! }
//! # }
//! ```

mod idle;
mod timer;

pub use idle::{Busy, IdleHandle, IdleIo};
pub use timer::{HyperSleep, HyperTimer};
