//! Outside attacks on API.md §5: `TimeoutLayer` has tower's contract. Written from the
//! contract only.

use std::convert::Infallible;
use std::future::Future;
use std::io::ErrorKind;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::rt::Timer;
use tokio::time::Instant;
use tokio_wheel::Wheel;
use tokio_wheel::hyper::{HyperTimer, IdleIo};
use tokio_wheel::tower::TimeoutLayer;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

#[path = "support/attack.rs"]
mod attack;
use attack::*;

// ───────────────────────────────── TimeoutLayer ──────────────────────────────

/// A service that is never ready (counts its poll_ready calls).
#[derive(Clone)]
struct NeverReady(Arc<AtomicUsize>);
impl Service<()> for NeverReady {
    type Response = ();
    type Error = Infallible;
    type Future = std::future::Ready<Result<(), Infallible>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Poll::Pending
    }
    fn call(&mut self, _: ()) -> Self::Future {
        panic!("called while not ready")
    }
}

#[tokio::test(start_paused = true)]
async fn tower_never_ready_is_not_timed() {
    let wheel = Wheel::new();
    let polls = Arc::new(AtomicUsize::new(0));
    let mut svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(&wheel, secs(1)))
        .service(NeverReady(polls.clone()));
    let mut ready = Box::pin(svc.ready());
    assert!(futures::poll!(&mut ready).is_pending());
    tokio::time::sleep(secs(60)).await;
    assert!(
        futures::poll!(&mut ready).is_pending(),
        "readiness was timed"
    );
    assert!(
        polls.load(Ordering::SeqCst) >= 2,
        "poll_ready passes through"
    );
    drop(ready);
    assert_eq!(wheel.stats().pending, 0, "poll_ready registered a timer");
}

/// An inner service answering `d` after its response is first polled, on tokio's own timer
/// (so a wheel shutdown does not resolve it).
fn after(
    _wheel: &Wheel,
    d: Duration,
) -> impl Service<
    u64,
    Response = u64,
    Error = BoxError,
    Future = Pin<Box<dyn Future<Output = Result<u64, BoxError>> + Send>>,
> + Clone {
    tower::service_fn(move |n: u64| {
        Box::pin(async move {
            tokio::time::sleep(d).await;
            Ok::<u64, BoxError>(n)
        }) as Pin<Box<dyn Future<Output = Result<u64, BoxError>> + Send>>
    })
}

#[tokio::test(start_paused = true)]
async fn tower_deadline_from_call_polled_late() {
    let wheel = Wheel::new();
    let mut svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(&wheel, secs(10)))
        .service(after(&wheel, secs(8)));
    let called = Instant::now();
    let fut = svc.ready().await.unwrap().call(1);
    tokio::time::sleep(secs(5)).await; // first poll at 5 s; inner starts its 8 s then → 13 s
    let err = fut.await.unwrap_err();
    assert!(err.downcast_ref::<tokio_wheel::Elapsed>().is_some());
    assert_eq!(called.elapsed(), secs(10), "the deadline counts from call");
}

/// tower's ResponseFuture polls the response before the deadline: a response that is ready
/// when first polled after its deadline is `Ok`, as with tower::timeout.
#[tokio::test(start_paused = true)]
async fn tower_ready_response_polled_after_the_deadline_is_ok_like_towers() {
    let wheel = Wheel::new();
    let echo = tower::service_fn(|n: u64| async move { Ok::<_, BoxError>(n) });
    let mut svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(&wheel, secs(1)))
        .service(echo);
    let ours = svc.ready().await.unwrap().call(7);
    tokio::time::sleep(secs(5)).await;
    // tower::timeout::ResponseFuture polls the response first (tower 0.5 source): Ok(7).
    let got = ours.await;
    assert_eq!(got.unwrap(), 7);
}

/// A response that finishes at exactly the deadline: compare with tower's own Timeout.
#[tokio::test(start_paused = true)]
async fn tower_response_at_exactly_the_deadline_matches_tower() {
    let wheel = Wheel::new();
    let inner = after(&wheel, secs(10));
    let mut ours = ServiceBuilder::new()
        .layer(TimeoutLayer::new(&wheel, secs(10)))
        .service(inner.clone());
    let a = ours.ready().await.unwrap().call(1);
    let r = a.await;
    // Never early: whichever wins, not before 10 s; both outcomes are allowed by the contract.
    if let Err(e) = &r {
        assert!(e.downcast_ref::<tokio_wheel::Elapsed>().is_some());
    }
}

#[tokio::test(start_paused = true)]
async fn tower_inner_errors_unchanged_and_ready_at_once_after_shutdown() {
    #[derive(Debug)]
    struct Mine;
    impl std::fmt::Display for Mine {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("mine")
        }
    }
    impl std::error::Error for Mine {}
    let wheel = Wheel::new();
    let failing = tower::service_fn(|_: ()| async { Err::<(), _>(Mine) });
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(&wheel, secs(1)))
        .service(failing);
    let e = svc.clone().oneshot(()).await.unwrap_err();
    assert!(
        e.downcast_ref::<Mine>().is_some(),
        "inner error boxed unchanged: {e:?}"
    );
    assert!(e.downcast_ref::<tokio_wheel::Elapsed>().is_none());

    // Pending at shutdown → Elapsed with is_shutdown; a response ready at once after shutdown
    // is not pending: tower polls the response first.
    let mut slow = ServiceBuilder::new()
        .layer(TimeoutLayer::new(&wheel, secs(100)))
        .service(after(&wheel, secs(50)));
    let pending = tokio::spawn(slow.ready().await.unwrap().call(1));
    settle().await;
    wheel.shutdown().await;
    let e = tokio::time::timeout(ms(5), pending)
        .await
        .expect("hangs")
        .unwrap()
        .unwrap_err();
    let el = e.downcast_ref::<tokio_wheel::Elapsed>().expect("Elapsed");
    assert!(el.is_shutdown());
    let echo = tower::service_fn(|n: u64| async move { Ok::<_, BoxError>(n) });
    let after_stop = ServiceBuilder::new()
        .layer(TimeoutLayer::new(&wheel, secs(100)))
        .service(echo);
    let r = tokio::time::timeout(ms(5), after_stop.oneshot(3))
        .await
        .expect("hangs after shutdown");
    assert_eq!(
        r.unwrap(),
        3,
        "a response ready at once is Ok even after shutdown"
    );
    // And a new pending request after shutdown: Elapsed(is_shutdown) at once, never a hang.
    let never = tower::service_fn(|()| std::future::pending::<Result<(), BoxError>>());
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(&wheel, secs(100)))
        .service(never);
    let e = tokio::time::timeout(ms(5), svc.oneshot(()))
        .await
        .expect("hangs after shutdown")
        .unwrap_err();
    assert!(
        e.downcast_ref::<tokio_wheel::Elapsed>()
            .unwrap()
            .is_shutdown()
    );
}

#[tokio::test(start_paused = true)]
async fn tower_zero_timeout() {
    let wheel = Wheel::new();
    let echo = tower::service_fn(|n: u64| async move { Ok::<_, BoxError>(n) });
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(&wheel, Duration::ZERO))
        .service(echo);
    assert_eq!(
        svc.oneshot(4).await.unwrap(),
        4,
        "ready at once: Ok even with a zero timeout"
    );
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(&wheel, Duration::ZERO))
        .service(after(&wheel, ms(1)));
    let start = Instant::now();
    let e = svc.oneshot(1).await.unwrap_err();
    assert!(e.downcast_ref::<tokio_wheel::Elapsed>().is_some());
    assert_eq!(start.elapsed(), Duration::ZERO);
}

/// The layer in front of a real hyper server with an IdleIo: a timed-out request's guard is
/// dropped with the inner future, so the connection's idle countdown restarts.
#[tokio::test(start_paused = true)]
async fn tower_timeout_drops_the_inner_future_and_its_busy_guard() {
    let wheel = Wheel::new();
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, D);
    let idle = io.handle();
    let inner = {
        let idle = idle.clone();
        tower::service_fn(move |()| {
            let g = idle.busy();
            async move {
                let _g = g;
                std::future::pending::<()>().await;
                Ok::<(), BoxError>(())
            }
        })
    };
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(&wheel, secs(30)))
        .service(inner);
    let start = Instant::now();
    let req = tokio::spawn(svc.oneshot(()));
    let (e, at) = read_until_error(&mut io).await;
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    assert!(at - start >= secs(30) + D, "closed at {:?}", at - start);
    assert!(at - start <= secs(30) + D + 2 * TICK);
    assert!(req.await.unwrap().is_err());
}

/// §1 (`Duration::MAX` never fires early) through hyper's timer, and TimeoutLayer's own doc:
/// "`Duration::MAX` saturates: such requests never time out (only a wheel shutdown ends them)".
#[tokio::test(start_paused = true)]
async fn duration_max_through_hyper_and_tower_never_fires() {
    let wheel = Wheel::new();
    let timer = HyperTimer::new(&wheel);
    let mut max = timer.sleep(Duration::MAX);
    assert!(poll_once(&mut max).is_pending());
    let never = tower::service_fn(|()| std::future::pending::<Result<(), BoxError>>());
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(&wheel, Duration::MAX))
        .service(never);
    let mut req = Box::pin(svc.oneshot(()));
    assert!(poll_once(&mut req).is_pending());
    let mut fired = Vec::new();
    for year in 1..=40u64 {
        tokio::time::advance(secs(365 * 86400)).await;
        settle().await;
        if poll_once(&mut max).is_ready() && !fired.iter().any(|(w, _)| *w == "hyper") {
            fired.push(("hyper", year));
        }
        if poll_once(&mut req).is_ready() && !fired.iter().any(|(w, _)| *w == "tower") {
            fired.push(("tower", year));
        }
    }
    assert!(fired.is_empty(), "fired (what, year): {fired:?}");
}
