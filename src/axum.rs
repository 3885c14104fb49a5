//! axum 0.8 on the wheel (feature `axum`): idle keep-alive connections closed through
//! `axum::serve` itself, and no handler code to keep a slow request's connection open.
//!
//! Two pieces, on axum's own extension points:
//!
//! - [`IdleListener`] is an [`axum::serve::Listener`]: every connection it accepts is an
//!   [`IdleIo`], closed once no byte has moved for the idle timeout and no request is in
//!   progress.
//! - [`busy_aware`] is the make-service `axum::serve` takes: each request holds its connection
//!   busy from the moment hyper calls the app **until its response body has been sent in full
//!   or dropped, and its request body has been read to its end or dropped** (an upload the
//!   app still reads after answering holds it too), and gets the peer's address as
//!   [`ConnectInfo`].
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use std::time::Duration;
//!
//! use axum::Router;
//! use axum::extract::ConnectInfo;
//! use axum::routing::get;
//! use tokio::net::TcpListener;
//! use tokio_wheel::Wheel;
//! use tokio_wheel::axum::{IdleListener, busy_aware};
//!
//! # async fn run() -> std::io::Result<()> {
//! let wheel = Wheel::new();
//! let app = Router::new().route(
//!     "/",
//!     get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { format!("hello {peer}") }),
//! );
//! let listener = TcpListener::bind("127.0.0.1:3000").await?;
//! let listener = IdleListener::new(listener, &wheel, Duration::from_secs(60));
//! axum::serve(listener, busy_aware(app))
//!     .with_graceful_shutdown(async { tokio::signal::ctrl_c().await.unwrap() })
//!     .await
//! # }
//! ```
//!
//! What counts, said plainly:
//!
//! - **HTTP/1.1 and HTTP/2** (h2c with prior knowledge: feature `axum` turns on axum's
//!   `http2`). An HTTP/2 connection is idle when none of its streams is open (a response
//!   still being sent, or a request body still coming in) and no byte has moved for the
//!   timeout; a request body the app drops unread resets its stream, and holds nothing.
//!   Its keep-alive pings are traffic, so a ping interval under the timeout keeps an idle
//!   HTTP/2 connection open.
//! - **After an upgrade** (a WebSocket), only traffic counts: the `101` response ends the
//!   request, so a socket silent for the timeout is closed. Send pings more often than that.
//! - **Without `busy_aware`** (plain `app` given to `axum::serve` with an `IdleListener`), a
//!   handler that runs longer than the timeout has its connection cut: keep the two together.
//! - **Shutdown**: after [`Wheel::shutdown`](crate::Wheel::shutdown) idle connections close at
//!   once and busy ones when their last response ends; axum's `with_graceful_shutdown` works
//!   as usual (it closes idle keep-alive connections itself and waits for the busy ones).
//!
//! # Cost
//!
//! An idle connection costs what its [`IdleIo`] adds: measured, 80–83 heap bytes (a boxed
//! tokio `Sleep` per connection adds 112; BENCHMARKS.md), and no wheel timer of its own (a
//! wheel's idle connections share one sweeper). Each read or write that moves bytes is a clock
//! read and one atomic; a read that would wait is one waker registration and one load. A
//! request costs one busy guard (an `Arc` clone, an atomic increment, and at release a clock
//! read and two or three atomics), no message to the wheel's actor, the `ConnectInfo`
//! extension, and one allocation to carry the guard in axum's `Body` (none when the response
//! body is empty). A request with a body (an upload) costs a second guard and a second
//! allocation, its body boxed with that guard; a request without one costs neither.

use std::convert::Infallible;
use std::fmt;
use std::future::{Ready, ready};
use std::io;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::serve::{IncomingStream, Listener};
use futures::future::{FutureExt, Map};
use hyper::{Request, Response};
use tokio::net::TcpListener;
use tower_service::Service;

use crate::Wheel;
use crate::hyper::{Group, IdleHandle, IdleIo};
use crate::tower::hold_request_body;
use crate::tower::{BusyBody, BusyFuture, BusyService};

/// A listener whose every accepted connection is an [`IdleIo`]: closed once no byte has moved
/// in either direction for the idle timeout and no request is in progress. An
/// [`axum::serve::Listener`], with the inner listener's address type.
///
/// Give [`busy_aware`]`(app)` to `axum::serve` with it, so that requests hold their connection
/// open. Any axum listener can be wrapped (a `TcpListener`, a `UnixListener`, one made with
/// axum's `ListenerExt::tap_io` to set `TCP_NODELAY`, ...).
///
/// ```
/// use std::time::Duration;
///
/// use axum::serve::Listener;
/// use tokio_wheel::Wheel;
/// use tokio_wheel::axum::IdleListener;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let wheel = Wheel::new();
/// let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let addr = tcp.local_addr()?;
/// let mut listener = IdleListener::new(tcp, &wheel, Duration::from_secs(60));
/// assert_eq!(listener.local_addr()?, addr);
///
/// let _client = tokio::net::TcpStream::connect(addr).await?;
/// let (io, _peer) = listener.accept().await;
/// assert_eq!(io.timeout(), Duration::from_secs(60));
/// # Ok(())
/// # }
/// ```
pub struct IdleListener<L = TcpListener> {
    listener: L,
    /// The wheel's idle connections: found once, not per connection.
    group: Arc<Group>,
    timeout: Duration,
}

impl<L> IdleListener<L> {
    /// Wraps `listener`: each connection it accepts closes after `timeout` without traffic
    /// and with no request in progress (see [`IdleIo`] for the rules, `Duration::ZERO` and
    /// `Duration::MAX` included).
    pub fn new(listener: L, wheel: &Wheel, timeout: Duration) -> IdleListener<L> {
        IdleListener {
            listener,
            group: Group::of(wheel),
            timeout,
        }
    }

    /// The idle timeout of each connection.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The inner listener.
    pub fn get_ref(&self) -> &L {
        &self.listener
    }

    /// The inner listener, mutably.
    pub fn get_mut(&mut self) -> &mut L {
        &mut self.listener
    }

    /// The inner listener.
    pub fn into_inner(self) -> L {
        self.listener
    }
}

impl<L: Listener> Listener for IdleListener<L> {
    type Io = IdleIo<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (IdleIo<L::Io>, L::Addr) {
        let (io, addr) = self.listener.accept().await;
        (IdleIo::in_group(io, self.group.clone(), self.timeout), addr)
    }

    fn local_addr(&self) -> io::Result<L::Addr> {
        self.listener.local_addr()
    }
}

impl<L: fmt::Debug> fmt::Debug for IdleListener<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdleListener")
            .field("listener", &self.listener)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The make-service to give `axum::serve` with an [`IdleListener`]: for each connection, `app`
/// with every request holding the connection busy until its response body has been sent in
/// full or dropped and its request body read to its end or dropped, and carrying the peer's
/// address as [`ConnectInfo`]`<Addr>`.
///
/// `app` is any service `axum::serve` takes: an `axum::Router` (with its state provided), or a
/// tower service of axum's requests and responses. So a slow handler, a streamed body that
/// pauses, an HTTP/2 request longer than the idle timeout are never cut; once the last
/// response ends, the countdown restarts.
///
/// ```no_run
/// use std::time::Duration;
///
/// use axum::Router;
/// use axum::routing::get;
/// use tokio_wheel::Wheel;
/// use tokio_wheel::axum::{IdleListener, busy_aware};
///
/// # async fn run() -> std::io::Result<()> {
/// let wheel = Wheel::new();
/// let slow = {
///     let wheel = wheel.clone();
///     move || async move {
///         wheel.sleep(Duration::from_secs(90)).await; // longer than the idle timeout
///         "done"
///     }
/// };
/// let app = Router::new().route("/slow", get(slow));
/// let tcp = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// axum::serve(IdleListener::new(tcp, &wheel, Duration::from_secs(60)), busy_aware(app)).await
/// # }
/// ```
pub fn busy_aware<S>(app: S) -> BusyAware<S> {
    BusyAware { app }
}

/// The make-service [`busy_aware`] returns: one [`BusyConnection`] per connection accepted by
/// an [`IdleListener`].
#[derive(Debug, Clone)]
pub struct BusyAware<S> {
    app: S,
}

impl<S> BusyAware<S> {
    /// The app.
    pub fn get_ref(&self) -> &S {
        &self.app
    }

    /// The app.
    pub fn into_inner(self) -> S {
        self.app
    }
}

impl<S, L> Service<IncomingStream<'_, IdleListener<L>>> for BusyAware<S>
where
    S: Clone,
    L: Listener,
    L::Addr: Clone,
{
    type Response = BusyConnection<S, L::Addr>;
    type Error = Infallible;
    type Future = Ready<Result<BusyConnection<S, L::Addr>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, stream: IncomingStream<'_, IdleListener<L>>) -> Self::Future {
        ready(Ok(BusyConnection {
            app: BusyService::new(self.app.clone(), stream.io().handle()),
            peer: ConnectInfo(stream.remote_addr().clone()),
        }))
    }
}

/// One connection's service, made by [`BusyAware`]: the app, with each request holding the
/// connection busy until its response body is sent in full or dropped (and its request body
/// read or dropped), and carrying
/// [`ConnectInfo`]`<Addr>`.
#[derive(Debug, Clone)]
pub struct BusyConnection<S, Addr> {
    app: BusyService<S>,
    peer: ConnectInfo<Addr>,
}

impl<S, Addr> BusyConnection<S, Addr> {
    /// The connection's handle: [`IdleHandle::busy`], [`IdleHandle::touch`].
    pub fn idle_handle(&self) -> &IdleHandle {
        self.app.idle_handle()
    }

    /// The peer's address.
    pub fn peer(&self) -> &Addr {
        &self.peer.0
    }
}

/// What makes a [`BusyConnection`]'s response: the app's, with the guard in its body.
type IntoAxum =
    fn(Result<Response<BusyBody<Body>>, Infallible>) -> Result<Response<Body>, Infallible>;

fn into_axum(
    outcome: Result<Response<BusyBody<Body>>, Infallible>,
) -> Result<Response<Body>, Infallible> {
    outcome.map(|response| response.map(axum_body))
}

/// An axum body carrying its guard; one that holds none (empty, or already released) needs
/// no box for it.
fn axum_body(body: BusyBody<Body>) -> Body {
    if body.is_busy() {
        Body::new(body)
    } else {
        body.into_inner()
    }
}

impl<S, Addr> Service<Request<Body>> for BusyConnection<S, Addr>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    Addr: Clone + Send + Sync + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Map<BusyFuture<S::Future>, IntoAxum>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.app.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // An upload still coming in after its response was sent (an HTTP/2 stream still
        // open) holds the connection too.
        let mut request = hold_request_body(request, self.app.idle_handle()).map(axum_body);
        request.extensions_mut().insert(self.peer.clone());
        self.app.call(request).map(into_axum as IntoAxum)
    }
}
