//! [`BusyLayer`]: every request on a connection holds it busy until its response has been
//! sent, so an [`IdleIo`](crate::hyper::IdleIo) never closes it mid-request — with no
//! handler code.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, SizeHint};
use hyper::{Request, Response};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::hyper::{Busy, IdleHandle};

/// A [`Layer`] for the services of one connection wrapped in an
/// [`IdleIo`](crate::hyper::IdleIo): each request holds the connection busy from the moment
/// hyper calls the service **until its response body has been sent in full or dropped**.
///
/// So a handler slower than the idle timeout, or a streamed body that pauses mid-way, is never
/// cut; once the last response ends, the idle countdown restarts. HTTP/1.1 and HTTP/2 alike
/// (each HTTP/2 stream holds its own guard). Made per connection, from that connection's
/// [`IdleHandle`]; with axum, [`busy_aware`](crate::axum::busy_aware) does this for every
/// connection of `axum::serve`.
///
/// A request body still coming in after the response was sent (an HTTP/2 stream the client
/// keeps open to go on uploading, read by a task the handler handed it to) holds the
/// connection only with [`with_request_bodies`](Self::with_request_bodies), whose inner
/// service sees the request bodies wrapped; this layer hands them on untouched.
///
/// ```
/// use std::time::Duration;
///
/// use hyper::{Request, Response};
/// use tokio_wheel::Wheel;
/// use tokio_wheel::hyper::IdleIo;
/// use tokio_wheel::tower::BusyLayer;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let wheel = Wheel::new();
/// let (stream, _peer) = tokio::io::duplex(64);
/// let io = IdleIo::new(stream, &wheel, Duration::from_secs(60));
/// let idle = io.handle();
/// let hello = service_fn(|_: Request<()>| async {
///     Ok::<_, std::convert::Infallible>(Response::new(String::from("hello")))
/// });
/// let svc = ServiceBuilder::new().layer(BusyLayer::new(io.handle())).service(hello);
///
/// let response = svc.oneshot(Request::new(())).await.unwrap();
/// assert_eq!(idle.busy_count(), 1); // the body has not been sent yet
/// drop(response); // sent (or dropped): the countdown restarts
/// assert_eq!(idle.busy_count(), 0);
/// // With hyper: `serve_connection(TokioIo::new(io), TowerToHyperService::new(svc))`.
/// # }
/// ```
///
/// # Cost
///
/// Per request one [`Busy`] guard — an `Arc` clone and one atomic increment, and at its
/// release a clock read and three atomics — and no message to the wheel's actor, no
/// allocation. A response whose body is empty releases the guard as soon as it is made.
#[derive(Debug, Clone)]
pub struct BusyLayer {
    idle: IdleHandle,
}

impl BusyLayer {
    /// A layer holding `idle`'s connection busy while each request is in progress.
    pub fn new(idle: IdleHandle) -> BusyLayer {
        BusyLayer { idle }
    }

    /// The same, holding the connection busy also while each request's body is still coming
    /// in: until it has been read to its end or dropped, even after the response has been
    /// sent. An HTTP/2 stream whose client is still uploading is open, so its connection is
    /// not idle; nor is an HTTP/1.1 request whose body the service still reads.
    ///
    /// The inner service then sees each request body wrapped in a [`BusyBody`] (this is why
    /// [`new`](Self::new), whose inner service sees the bodies as they come, does not do it);
    /// [`busy_aware`](crate::axum::busy_aware) does it for axum without changing the types a
    /// handler sees.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::sync::{Arc, Mutex};
    /// use std::time::Duration;
    ///
    /// use http_body_util::{BodyExt, Full};
    /// use hyper::body::Bytes;
    /// use hyper::{Request, Response};
    /// use tokio_wheel::Wheel;
    /// use tokio_wheel::hyper::IdleIo;
    /// use tokio_wheel::tower::{BusyBody, BusyLayer};
    /// use tower::{ServiceBuilder, ServiceExt, service_fn};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let wheel = Wheel::new();
    /// let (stream, _peer) = tokio::io::duplex(64);
    /// let io = IdleIo::new(stream, &wheel, Duration::from_secs(60));
    /// let idle = io.handle();
    /// let kept = Arc::new(Mutex::new(None));
    /// let upload = {
    ///     let kept = kept.clone();
    ///     service_fn(move |request: Request<BusyBody<Full<Bytes>>>| {
    ///         // Answer at once; the body is read later (by another task, say).
    ///         *kept.lock().unwrap() = Some(request.into_body());
    ///         async { Ok::<_, Infallible>(Response::new(String::new())) }
    ///     })
    /// };
    /// let svc = ServiceBuilder::new()
    ///     .layer(BusyLayer::new(io.handle()).with_request_bodies())
    ///     .service(upload);
    ///
    /// let response = svc.oneshot(Request::new(Full::new(Bytes::from("data")))).await.unwrap();
    /// drop(response); // the response is sent...
    /// assert_eq!(idle.busy_count(), 1); // ...but the upload is not read yet
    /// let body = kept.lock().unwrap().take().unwrap();
    /// body.collect().await.unwrap();
    /// assert_eq!(idle.busy_count(), 0);
    /// # }
    /// ```
    pub fn with_request_bodies(self) -> BusyExchangeLayer {
        BusyExchangeLayer { idle: self.idle }
    }
}

impl<S> Layer<S> for BusyLayer {
    type Service = BusyService<S>;

    fn layer(&self, inner: S) -> BusyService<S> {
        BusyService::new(inner, self.idle.clone())
    }
}

/// The service [`BusyLayer`] makes: the inner service, with each request holding the
/// connection busy until its response body is sent in full or dropped.
///
/// `poll_ready` and errors pass through unchanged; the response's body is wrapped in a
/// [`BusyBody`], which carries the guard.
#[derive(Debug, Clone)]
pub struct BusyService<S> {
    inner: S,
    idle: IdleHandle,
}

impl<S> BusyService<S> {
    /// Wraps `inner` for the connection `idle` watches.
    pub fn new(inner: S, idle: IdleHandle) -> BusyService<S> {
        BusyService { inner, idle }
    }

    /// The connection's handle.
    pub fn idle_handle(&self) -> &IdleHandle {
        &self.idle
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for BusyService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body,
{
    type Response = Response<BusyBody<ResBody>>;
    type Error = S::Error;
    type Future = BusyFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> BusyFuture<S::Future> {
        // Taken before the inner call: a service that does its work in `call` is covered too.
        let busy = self.idle.busy();
        BusyFuture {
            inner: self.inner.call(request),
            busy: Some(busy),
        }
    }
}

/// [`BusyLayer::with_request_bodies`]: each request holds its connection busy until both its
/// response body has been sent and its request body has been read to its end (or each has
/// been dropped).
#[derive(Debug, Clone)]
pub struct BusyExchangeLayer {
    idle: IdleHandle,
}

impl<S> Layer<S> for BusyExchangeLayer {
    type Service = BusyExchangeService<S>;

    fn layer(&self, inner: S) -> BusyExchangeService<S> {
        BusyExchangeService {
            inner: BusyService::new(inner, self.idle.clone()),
        }
    }
}

/// The service [`BusyExchangeLayer`] makes: a [`BusyService`] whose inner service sees each
/// request body wrapped in a [`BusyBody`] holding the connection busy until it ends.
#[derive(Debug, Clone)]
pub struct BusyExchangeService<S> {
    inner: BusyService<S>,
}

impl<S> BusyExchangeService<S> {
    /// The connection's handle.
    pub fn idle_handle(&self) -> &IdleHandle {
        self.inner.idle_handle()
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner.into_inner()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for BusyExchangeService<S>
where
    S: Service<Request<BusyBody<ReqBody>>, Response = Response<ResBody>>,
    ReqBody: Body,
    ResBody: Body,
{
    type Response = Response<BusyBody<ResBody>>;
    type Error = S::Error;
    type Future = BusyFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> BusyFuture<S::Future> {
        let request = hold_request_body(request, self.inner.idle_handle());
        self.inner.call(request)
    }
}

/// `request` with its body holding `idle`'s connection busy until the body ends or is
/// dropped (a body already at its end takes no guard).
pub(crate) fn hold_request_body<B: Body>(
    request: Request<B>,
    idle: &IdleHandle,
) -> Request<BusyBody<B>> {
    request.map(|body| {
        let busy = (!body.is_end_stream()).then(|| idle.busy());
        BusyBody::new(body, busy)
    })
}

pin_project! {
    /// The response future of [`BusyService`]: holds the connection busy while the response
    /// is being made, then hands the guard to the response's [`BusyBody`] (an error releases
    /// it). Dropping the future releases it.
    #[derive(Debug)]
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct BusyFuture<F> {
        #[pin]
        inner: F,
        busy: Option<Busy>,
    }
}

impl<F, B, E> Future for BusyFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
{
    type Output = Result<Response<BusyBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let outcome = std::task::ready!(this.inner.poll(cx));
        let busy = this.busy.take();
        Poll::Ready(outcome.map(|response| response.map(|body| BusyBody::response(body, busy))))
    }
}

pin_project! {
    /// A body that holds its connection busy while it is in progress: a request's (with
    /// [`BusyLayer::with_request_bodies`]) until it has yielded its last frame; a response's
    /// (from [`BusyService`]) until the connection's [`IdleIo`](crate::hyper::IdleIo) next
    /// completes a flush after that, so an HTTP/1 client that reads the response slowly holds
    /// the connection until the bytes are written — or until it yields an error or is
    /// dropped, whichever comes first.
    ///
    /// Not covered: an HTTP/2 response whose last frame waits in the connection for the
    /// client's flow-control window (the client reads nothing for longer than the idle
    /// timeout while the stream is open). hyper tells nothing of a stream's window, and the
    /// IO sees no byte move either way; such a connection is closed as idle.
    ///
    /// Frames, trailers, `is_end_stream` and `size_hint` are the inner body's, unchanged.
    #[derive(Debug)]
    pub struct BusyBody<B> {
        #[pin]
        inner: B,
        busy: Option<Busy>,
        // A response: at its end, its guard goes at the connection's next flush.
        until_flushed: bool,
    }
}

impl<B: Body> BusyBody<B> {
    /// `inner`, holding `busy` until it ends (a request body's way); a body already at its
    /// end lets go at once.
    pub fn new(inner: B, busy: Option<Busy>) -> BusyBody<B> {
        let busy = busy.filter(|_| !inner.is_end_stream());
        BusyBody {
            inner,
            busy,
            until_flushed: false,
        }
    }

    /// `inner` as a response, holding `busy` until the connection has written its end.
    pub(crate) fn response(inner: B, busy: Option<Busy>) -> BusyBody<B> {
        BusyBody {
            until_flushed: true,
            ..BusyBody::new(inner, busy)
        }
    }
}

impl<B> BusyBody<B> {
    /// Whether the body still holds its connection busy.
    pub fn is_busy(&self) -> bool {
        self.busy.is_some()
    }

    /// The inner body; the connection is no longer held busy by it.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: Body> Body for BusyBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let mut this = self.project();
        let frame = std::task::ready!(this.inner.as_mut().poll_frame(cx));
        let at_end = match &frame {
            Some(Ok(_)) => this.inner.is_end_stream() || this.inner.size_hint().exact() == Some(0),
            Some(Err(_)) | None => true,
        };
        if at_end {
            if let Some(mut busy) = this.busy.take() {
                if *this.until_flushed && !matches!(frame, Some(Err(_))) {
                    // The connection holds the rest of the response now: the guard goes at
                    // the IO's next completed flush, once the bytes are written.
                    busy.release_after_flush();
                }
                // Else traffic follows (hyper writes the frame), and the release touches.
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
