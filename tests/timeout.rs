//! Timeouts: the inner future first, the deadline second, shutdown told apart.

mod support;

use std::error::Error;
use std::time::Duration;

use support::settle;
use tokio::time::Instant;
use tokio_wheel::{Elapsed, Wheel};

#[tokio::test(start_paused = true)]
async fn a_ready_future_registers_no_timer() {
    let wheel = Wheel::new();
    for i in 0..100 {
        assert_eq!(
            wheel
                .timeout(Duration::from_secs(1), async move { i })
                .await,
            Ok(i)
        );
    }
    settle().await;
    assert_eq!(wheel.stats().inserted, 0);
    assert_eq!(wheel.stats().commands, 0);
}

#[tokio::test(start_paused = true)]
async fn a_slow_future_times_out_at_the_deadline() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let result = wheel
        .timeout(
            Duration::from_millis(300),
            tokio::time::sleep(Duration::from_secs(10)),
        )
        .await;
    let elapsed = result.unwrap_err();
    assert!(!elapsed.is_shutdown());
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took <= Duration::from_millis(302),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_future_finishing_in_time_returns_its_value_and_cancels_the_timer() {
    let wheel = Wheel::new();
    let slow_enough = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        "done"
    };
    assert_eq!(
        wheel.timeout(Duration::from_secs(5), slow_enough).await,
        Ok("done")
    );
    settle().await;
    let stats = wheel.stats();
    assert_eq!(
        (stats.inserted, stats.cancelled, stats.fired, stats.pending),
        (1, 1, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn timeout_at_uses_the_instant() {
    let wheel = Wheel::new();
    let deadline = Instant::now() + Duration::from_millis(70);
    let timeout = wheel.timeout_at(deadline, std::future::pending::<()>());
    assert_eq!(timeout.deadline(), Some(deadline));
    assert!(timeout.await.is_err());
    assert!(Instant::now() >= deadline);
}

#[tokio::test(start_paused = true)]
async fn the_inner_future_is_reachable() {
    let wheel = Wheel::new();
    let mut timeout = wheel.timeout(Duration::from_secs(1), Box::pin(async { 3 }));
    assert_eq!(timeout.get_mut().await, 3);
    let timeout = wheel.timeout(Duration::from_secs(1), std::future::ready(4));
    assert_eq!(timeout.get_ref().clone().await, 4);
    assert_eq!(timeout.into_inner().await, 4);
}

#[test]
fn elapsed_is_a_proper_error() {
    fn assert_error<E: Error + Send + Sync + PartialEq + Eq + Clone + 'static>() {}
    assert_error::<Elapsed>();
}

#[tokio::test(start_paused = true)]
async fn elapsed_says_what_happened() {
    let wheel = Wheel::new();
    let elapsed = wheel
        .timeout(Duration::from_millis(1), std::future::pending::<()>())
        .await
        .unwrap_err();
    assert_eq!(elapsed.to_string(), "deadline has elapsed");
    assert_eq!(format!("{elapsed:?}"), "Elapsed { shutdown: false }");
}
