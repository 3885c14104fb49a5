//! The tower layer: tower's timeout contract on the wheel, in a real hyper server and
//! service by service under paused time.

use std::convert::Infallible;
use std::fmt;
use std::future::{Future, pending};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_wheel::Elapsed;
use tokio_wheel::Wheel;
use tokio_wheel::tower::{BoxError, Timeout, TimeoutLayer};
use tower::{Layer, Service, ServiceBuilder, ServiceExt, service_fn};

// ---------------------------------------------------------------------------------------
// A real server.

/// `/<ms>` answers after `ms` milliseconds.
async fn answer_after(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let ms = request
        .uri()
        .path()
        .trim_start_matches('/')
        .parse()
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

/// Turns a timeout into a 504, as a real server would.
fn gateway_timeout(
    result: Result<Response<Full<Bytes>>, BoxError>,
) -> Result<Response<Full<Bytes>>, BoxError> {
    match result {
        Err(error) if error.downcast_ref::<Elapsed>().is_some() => {
            let mut response = Response::new(Full::new(Bytes::from_static(b"timeout")));
            *response.status_mut() = StatusCode::GATEWAY_TIMEOUT;
            Ok(response)
        }
        other => other,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_server_answers_slow_requests_with_the_layers_elapsed() {
    let wheel = Wheel::new();
    let timeout = Duration::from_millis(200);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let svc = ServiceBuilder::new()
        .map_result(gateway_timeout)
        .layer(TimeoutLayer::new(&wheel, timeout))
        .service_fn(answer_after);
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let svc = TowerToHyperService::new(svc.clone());
            tokio::spawn(async move {
                let _ = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });

    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut get = async |path: &str| {
        let request = Request::get(format!("http://{addr}{path}"))
            .body(Empty::<Bytes>::new())
            .unwrap();
        let start = Instant::now();
        send.ready().await.unwrap();
        let response = send.send_request(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, body, start.elapsed())
    };
    let (status, body, _) = get("/0").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
    let (status, body, took) = get("/2000").await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::GATEWAY_TIMEOUT, &b"timeout"[..])
    );
    // The handler answers OK after 2 s: a 504 means the layer cut it first.
    assert!(took >= timeout, "timed out after {took:?}");
    // The connection goes on serving.
    let (status, _, _) = get("/10").await;
    assert_eq!(status, StatusCode::OK);
}

// ---------------------------------------------------------------------------------------
// Service by service, paused time.

fn sleeper(wheel: &Wheel) -> impl Service<u64, Response = u64, Error = Infallible> + Clone {
    let wheel = wheel.clone();
    service_fn(move |ms: u64| {
        let nap = wheel.sleep(Duration::from_millis(ms));
        async move {
            nap.await;
            Ok(ms)
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_slow_request_fails_with_a_downcastable_elapsed() {
    let wheel = Wheel::new();
    let svc = TimeoutLayer::new(&wheel, Duration::from_millis(300)).layer(sleeper(&wheel));
    let start = Instant::now();
    let error = svc.clone().oneshot(1000).await.unwrap_err();
    let elapsed = error
        .downcast_ref::<Elapsed>()
        .expect("the error is our Elapsed");
    assert!(!elapsed.is_shutdown());
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert_eq!(svc.oneshot(100).await.unwrap(), 100);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_counts_from_call_not_from_the_first_poll() {
    let wheel = Wheel::new();
    let mut svc = Timeout::new(sleeper(&wheel), &wheel, Duration::from_millis(300));
    svc.ready().await.unwrap();
    let called = Instant::now();
    let response = svc.call(1000);
    assert_eq!(
        response.deadline(),
        Some(called + Duration::from_millis(300))
    );
    tokio::time::advance(Duration::from_millis(200)).await;
    let error = response.await.unwrap_err();
    assert!(error.is::<Elapsed>());
    assert_eq!(called.elapsed(), Duration::from_millis(300));

    // Called, then first polled after the deadline: elapsed on that poll.
    svc.ready().await.unwrap();
    let response = svc.call(1000);
    tokio::time::advance(Duration::from_millis(500)).await;
    let mut response = Box::pin(response);
    let first = response
        .as_mut()
        .poll(&mut Context::from_waker(std::task::Waker::noop()));
    match first {
        Poll::Ready(Err(error)) => assert!(error.is::<Elapsed>()),
        other => panic!("not elapsed on the first poll past the deadline: {other:?}"),
    }
}

#[derive(Debug)]
struct Overloaded;

impl fmt::Display for Overloaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("overloaded")
    }
}

impl std::error::Error for Overloaded {}

/// A service that is not ready once, then fails readiness; its calls fail too.
#[derive(Clone, Default)]
struct Refusing {
    polled: bool,
}

impl Service<()> for Refusing {
    type Response = ();
    type Error = Overloaded;
    type Future = std::future::Ready<Result<(), Overloaded>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Overloaded>> {
        if !self.polled {
            self.polled = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(Err(Overloaded))
    }

    fn call(&mut self, (): ()) -> Self::Future {
        std::future::ready(Err(Overloaded))
    }
}

#[tokio::test(start_paused = true)]
async fn poll_ready_passes_through_and_inner_errors_are_boxed_unchanged() {
    let wheel = Wheel::new();
    let mut svc = Timeout::new(Refusing::default(), &wheel, Duration::from_secs(1));
    let noop = &mut Context::from_waker(std::task::Waker::noop());
    assert!(
        svc.poll_ready(noop).is_pending(),
        "readiness is the inner's"
    );
    match svc.poll_ready(noop) {
        Poll::Ready(Err(error)) => assert!(error.is::<Overloaded>()),
        other => panic!("{other:?}"),
    }
    let error = svc.call(()).await.unwrap_err();
    assert!(error.is::<Overloaded>(), "{error}");
    assert!(!error.is::<Elapsed>());
    wheel.flush().await;
    assert_eq!(
        wheel.stats().inserted,
        0,
        "a ready response registered a timer"
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_in_time_costs_at_most_one_dropped_timer() {
    let wheel = Wheel::new();
    let svc = TimeoutLayer::new(&wheel, Duration::from_secs(30)).layer(sleeper(&wheel));
    for _ in 0..100 {
        assert_eq!(svc.clone().oneshot(0).await.unwrap(), 0);
    }
    wheel.flush().await;
    let stats = wheel.stats();
    assert_eq!(
        stats.inserted, 0,
        "responses ready at once registered timers"
    );

    let inner = service_fn(|()| async {
        tokio::task::yield_now().await;
        Ok::<_, Infallible>(())
    });
    let svc = TimeoutLayer::new(&wheel, Duration::from_secs(30)).layer(inner);
    for _ in 0..100 {
        svc.clone().oneshot(()).await.unwrap();
    }
    wheel.flush().await;
    let stats = wheel.stats();
    // Each request that was pending once registered at most its timeout's one timer, and
    // dropped it: nothing fired, nothing is left.
    assert!(stats.inserted <= 100, "{stats:?}");
    assert_eq!(stats.fired, 0);
    assert_eq!(stats.pending, 0);
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_pending_requests_with_a_shutdown_elapsed() {
    let wheel = Wheel::new();
    let svc = TimeoutLayer::new(&wheel, Duration::from_secs(60))
        .layer(service_fn(|()| pending::<Result<(), Infallible>>()));
    let request = tokio::spawn(svc.oneshot(()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    wheel.shutdown().await;
    let error = request.await.unwrap().unwrap_err();
    let elapsed = error.downcast_ref::<Elapsed>().unwrap();
    assert!(elapsed.is_shutdown());
}

#[tokio::test(start_paused = true)]
async fn a_duration_max_timeout_never_fires() {
    let wheel = Wheel::new();
    let svc = TimeoutLayer::new(&wheel, Duration::MAX).layer(sleeper(&wheel));
    let hour = 3_600_000;
    assert_eq!(svc.oneshot(hour * 24 * 365).await.unwrap(), hour * 24 * 365);
}

#[test]
fn layer_and_service_are_clone_send_sync() {
    fn clone_send_sync<T: Clone + Send + Sync + 'static>() {}
    clone_send_sync::<TimeoutLayer>();
    clone_send_sync::<Timeout<tower::util::BoxCloneSyncService<(), (), BoxError>>>();
    fn send<T: Send>(_: &T) {}
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let wheel = Wheel::new();
    let echo = service_fn(|n: u64| async move { Ok::<_, Infallible>(n) });
    let mut svc = Timeout::new(echo, &wheel, Duration::from_secs(1));
    let response = svc.call(1);
    send(&response);
    // The same type as tower's own BoxError.
    let _: tower::BoxError = BoxError::from("same type");
}
