//! Real timers on real runtimes: never early, each fires once. How late they are is a timing
//! fact, measured by the benchmarks (`fire p99 lateness` in BENCHMARKS.md), not asserted here:
//! a loaded 2-core machine can delay any thread by any amount.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_wheel::Wheel;

/// Awaits `future`, failing the test if it has not completed after a minute: a guard against a
/// wheel that stopped firing (timed by tokio's own timer), not a figure.
async fn unless_hung<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), future)
        .await
        .expect("never completed (hang guard)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_timers_are_never_early_and_each_fires_once() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let tasks: Vec<_> = (0..400u64)
        .map(|i| {
            let wheel = wheel.clone();
            tokio::spawn(async move {
                let deadline = start + Duration::from_millis(20 + (i * 37) % 300);
                wheel.sleep_until(deadline).await;
                let now = Instant::now();
                assert!(now >= deadline, "fired {:?} early", deadline - now);
            })
        })
        .collect();
    for task in tasks {
        unless_hung(task).await.unwrap();
    }
    let stats = wheel.stats();
    assert_eq!(stats.fired, 400, "{stats:?}");
    assert_eq!(stats.pending, 0, "{stats:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn real_timers_work_on_a_current_thread_runtime() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let timeout =
        unless_hung(wheel.timeout(Duration::from_millis(30), std::future::pending::<()>())).await;
    assert!(timeout.is_err());
    assert!(start.elapsed() >= Duration::from_millis(30), "never early");
    let start = Instant::now();
    let job = wheel.spawn_after(Duration::from_millis(10), async { Instant::now() });
    let ran_at = unless_hung(job).await.unwrap();
    assert!(ran_at >= start + Duration::from_millis(10), "never early");
}
