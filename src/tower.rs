//! tower layers on the wheel (feature `tower`): [`TimeoutLayer`], a request deadline with
//! tower's own timeout contract, and — with feature `hyper` too — [`BusyLayer`], which holds
//! an [`IdleIo`](crate::hyper::IdleIo) connection busy while each request is in progress.
//!
//! ```
//! use std::time::Duration;
//!
//! use tokio_wheel::Wheel;
//! use tokio_wheel::tower::TimeoutLayer;
//! use tower::{BoxError, ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let wheel = Wheel::new();
//! let slow = {
//!     let wheel = wheel.clone();
//!     service_fn(move |secs: u64| {
//!         let nap = wheel.sleep(Duration::from_secs(secs));
//!         async move {
//!             nap.await;
//!             Ok::<_, BoxError>(secs)
//!         }
//!     })
//! };
//! let svc = ServiceBuilder::new()
//!     .layer(TimeoutLayer::new(&wheel, Duration::from_secs(30)))
//!     .service(slow);
//!
//! assert_eq!(svc.clone().oneshot(1).await.unwrap(), 1);
//! let error = svc.oneshot(60).await.unwrap_err();
//! assert!(error.downcast_ref::<tokio_wheel::Elapsed>().is_some());
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use crate::{Elapsed, Wheel};

#[cfg(feature = "hyper")]
mod busy;
#[cfg(feature = "axum")]
pub(crate) use busy::hold_request_body;
#[cfg(feature = "hyper")]
pub use busy::{
    BusyBody, BusyExchangeLayer, BusyExchangeService, BusyFuture, BusyLayer, BusyService,
};

/// A type-erased error, as tower's middleware returns: the same type as `tower::BoxError`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A [`Layer`] that bounds each request of the service it wraps by a deadline on the wheel;
/// it makes [`Timeout`] services.
///
/// `Clone + Send + Sync`; cloning clones the wheel's handle.
///
/// ```
/// use std::time::Duration;
///
/// use tokio_wheel::Wheel;
/// use tokio_wheel::tower::TimeoutLayer;
/// use tower::{BoxError, ServiceBuilder, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let wheel = Wheel::new();
/// let never = service_fn(|()| std::future::pending::<Result<(), BoxError>>());
/// let svc = ServiceBuilder::new()
///     .layer(TimeoutLayer::new(&wheel, Duration::from_secs(5)))
///     .service(never);
/// let error = svc.oneshot(()).await.unwrap_err();
/// let elapsed = error.downcast::<tokio_wheel::Elapsed>().unwrap();
/// assert!(!elapsed.is_shutdown());
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct TimeoutLayer {
    wheel: Wheel,
    timeout: Duration,
}

impl TimeoutLayer {
    /// A layer giving each request `timeout` from its `call`, on `wheel`.
    /// `Duration::MAX` saturates: such requests never time out (only a wheel shutdown ends
    /// them).
    pub fn new(wheel: &Wheel, timeout: Duration) -> TimeoutLayer {
        TimeoutLayer {
            wheel: wheel.clone(),
            timeout,
        }
    }
}

impl<S> Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;

    fn layer(&self, inner: S) -> Timeout<S> {
        Timeout {
            inner,
            wheel: self.wheel.clone(),
            timeout: self.timeout,
        }
    }
}

/// A service that fails a request with [`Elapsed`] when its response takes longer than the
/// timeout; made by [`TimeoutLayer`] or [`Timeout::new`].
///
/// It keeps tower's timeout contract (`tower::timeout::Timeout`):
///
/// - `Error = `[`BoxError`]: the inner service's errors are boxed unchanged; a timeout is a
///   boxed [`Elapsed`] (`error.downcast_ref::<tokio_wheel::Elapsed>()`), whose
///   [`is_shutdown`](Elapsed::is_shutdown) is `true` if the wheel shut down first.
/// - `poll_ready` passes through to the inner service (errors boxed); readiness is not timed.
/// - The deadline counts from `call` (one clock read there); the response future,
///   [`ResponseFuture`], drops the inner future when the deadline passes.
///
/// # Cost
///
/// Built on [`Wheel::timeout_at`]: a response that is ready on its first poll registers no
/// timer; one that finishes in time costs one wheel timer registered and dropped.
///
/// ```
/// use std::time::Duration;
///
/// use tokio_wheel::Wheel;
/// use tokio_wheel::tower::Timeout;
/// use tower::{BoxError, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let wheel = Wheel::new();
/// let echo = service_fn(|name: &'static str| async move { Ok::<_, BoxError>(name) });
/// let svc = Timeout::new(echo, &wheel, Duration::from_secs(1));
/// assert_eq!(svc.oneshot("hi").await.unwrap(), "hi");
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Timeout<S> {
    inner: S,
    wheel: Wheel,
    timeout: Duration,
}

impl<S> Timeout<S> {
    /// Wraps `inner`, giving each request `timeout` from its `call`, on `wheel`.
    pub fn new(inner: S, wheel: &Wheel, timeout: Duration) -> Timeout<S> {
        TimeoutLayer::new(wheel, timeout).layer(inner)
    }

    /// The timeout each request gets.
    pub fn timeout(&self) -> Duration {
        self.timeout
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

impl<S, Request> Service<Request> for Timeout<S>
where
    S: Service<Request>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request) -> ResponseFuture<S::Future> {
        let deadline = Instant::now()
            .checked_add(self.timeout)
            // Past the clock's range: the wheel's saturated far future.
            .unwrap_or_else(|| self.wheel.sleep(self.timeout).deadline());
        let response = self.inner.call(request);
        ResponseFuture {
            inner: self.wheel.timeout_at(deadline, response),
        }
    }
}

pin_project! {
    /// The response future of [`Timeout`]: the inner service's response, or a [`BoxError`]
    /// holding the inner error or [`Elapsed`] once the deadline passed.
    ///
    /// Dropping it drops the inner future and cancels the timer.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use tokio::time::Instant;
    /// use tokio_wheel::Wheel;
    /// use tokio_wheel::tower::{ResponseFuture, Timeout};
    /// use tower::{BoxError, Service, ServiceExt, service_fn};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let wheel = Wheel::new();
    /// let echo = service_fn(|n: u32| async move { Ok::<_, BoxError>(n) });
    /// let mut svc = Timeout::new(echo, &wheel, Duration::from_secs(1));
    /// let called = Instant::now();
    /// let response = svc.ready().await.unwrap().call(7);
    /// assert_eq!(response.deadline(), Some(called + Duration::from_secs(1)));
    /// assert_eq!(response.await.unwrap(), 7);
    /// # let _: Option<ResponseFuture<std::future::Ready<Result<u32, BoxError>>>> = None;
    /// # }
    /// ```
    #[derive(Debug)]
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: crate::Timeout<F>,
    }
}

impl<F> ResponseFuture<F> {
    /// The deadline of this request: its `call` plus the timeout.
    pub fn deadline(&self) -> Option<Instant> {
        self.inner.deadline()
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx).map(|outcome| match outcome {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(error)) => Err(error.into()),
            Err(elapsed) => Err(Box::<Elapsed>::new(elapsed) as BoxError),
        })
    }
}
