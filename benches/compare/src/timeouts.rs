//! Timeouts: around a ready future, and dropped while pending (churn).

use super::*;

// ---------------------------------------------------------------- timeouts

/// A timeout around a future that is already ready, awaited n times: the common case of a
/// request that answers in time. Returns the time for all n.
pub async fn ready_timeout_tokio(delays: Arc<Vec<Duration>>) -> Duration {
    let start = Instant::now();
    for (i, &delay) in delays.iter().enumerate() {
        let output = tokio::time::timeout(black_box(delay), std::future::ready(i)).await;
        black_box(output.expect("ready future"));
    }
    start.elapsed()
}

/// The same with pingora-timeout's `fast_timeout`.
pub async fn ready_timeout_pingora(delays: Arc<Vec<Duration>>) -> Duration {
    let start = Instant::now();
    for (i, &delay) in delays.iter().enumerate() {
        let output =
            pingora_timeout::fast_timeout::fast_timeout(black_box(delay), std::future::ready(i))
                .await;
        black_box(output.expect("ready future"));
    }
    start.elapsed()
}

/// The same with tokio-wheel, until the actor has applied everything (nothing: a timeout
/// whose future is ready registers no timer).
pub async fn ready_timeout_wheel(wheel: Wheel, delays: Arc<Vec<Duration>>) -> Duration {
    let start = Instant::now();
    for (i, &delay) in delays.iter().enumerate() {
        let output = wheel.timeout(black_box(delay), std::future::ready(i)).await;
        black_box(output.expect("ready future"));
    }
    wheel.flush().await;
    start.elapsed()
}

/// The request-with-timeout pattern: a timeout around a future that is still pending is polled
/// once (arming its timer) and dropped before it fires. Returns the time for all n.
///
/// Beware when reading tokio's figure: a registration earlier than the wake-up its driver is
/// parked for unparks the driver (a thread wake-up, ~0.5 µs here). With no other tokio timer
/// pending, every registration of this loop does; with one due sooner pending (as in most
/// servers, or while tokio-wheel's actor has a look armed after the previous repetition),
/// none does. Measured in this harness: ~600 ns against ~95 ns per timeout.
pub async fn timeout_churn_tokio(delays: Arc<Vec<Duration>>) -> Duration {
    let start = Instant::now();
    for &delay in delays.iter() {
        let mut timeout = pin!(tokio::time::timeout(delay, std::future::pending::<()>()));
        assert!(poll_once(timeout.as_mut()).is_pending());
    }
    start.elapsed()
}

/// The same with pingora-timeout's `fast_timeout` (timers shared per 10 ms tick).
pub async fn timeout_churn_pingora(delays: Arc<Vec<Duration>>) -> Duration {
    let start = Instant::now();
    for &delay in delays.iter() {
        let mut timeout = pin!(pingora_timeout::fast_timeout::fast_timeout(
            delay,
            std::future::pending::<()>()
        ));
        assert!(poll_once(timeout.as_mut()).is_pending());
    }
    start.elapsed()
}

/// The same with tokio-wheel, until the actor has applied everything.
pub async fn timeout_churn_wheel(wheel: Wheel, delays: Arc<Vec<Duration>>) -> Duration {
    let start = Instant::now();
    for &delay in delays.iter() {
        let mut timeout = pin!(wheel.timeout(delay, std::future::pending::<()>()));
        assert!(poll_once(timeout.as_mut()).is_pending());
    }
    wheel.flush().await;
    start.elapsed()
}
