//! Real-time lateness on a multi-thread runtime. Tolerant bounds: this machine is shared.

use std::time::Duration;

use tokio::time::Instant;
use tokio_wheel::Wheel;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_timers_are_never_early_and_rarely_late() {
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
                now - deadline
            })
        })
        .collect();
    let mut lateness = Vec::new();
    for task in tasks {
        lateness.push(task.await.unwrap());
    }
    lateness.sort_unstable();
    let p50 = lateness[lateness.len() / 2];
    let p99 = lateness[lateness.len() * 99 / 100];
    // One tick plus Tokio's own millisecond rounding is the design bound; allow scheduling
    // noise on a busy 2-core machine.
    assert!(p50 <= Duration::from_millis(5), "p50 lateness {p50:?}");
    assert!(p99 <= Duration::from_millis(50), "p99 lateness {p99:?}");
    let stats = wheel.stats();
    assert!(stats.max_lateness < Duration::from_millis(200), "{stats:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn real_timers_work_on_a_current_thread_runtime() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let timeout = wheel
        .timeout(Duration::from_millis(30), std::future::pending::<()>())
        .await;
    assert!(timeout.is_err());
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(30) && took < Duration::from_millis(500),
        "{took:?}"
    );
    let job = wheel.spawn_after(Duration::from_millis(10), async { 3 });
    assert_eq!(job.await, Ok(3));
}
