//! Bad and extreme input: each has a defined outcome, never a panic or an overflow.

mod support;

use std::time::Duration;

use futures::StreamExt;
use support::{poll_once, settle};
use tokio::time::Instant;
use tokio_wheel::{Schedule, Wheel};

const FOREVER: Duration = Duration::MAX;
const A_YEAR: Duration = Duration::from_secs(365 * 86_400);

#[tokio::test(start_paused = true)]
async fn zero_durations_are_due_at_once_everywhere() {
    let wheel = Wheel::new();
    let start = Instant::now();
    wheel.sleep(Duration::ZERO).await;
    assert!(
        wheel
            .timeout(Duration::ZERO, std::future::pending::<()>())
            .await
            .is_err()
    );
    assert_eq!(wheel.spawn_after(Duration::ZERO, async { 1 }).await, Ok(1));
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    timers.set(1, 1, Duration::ZERO);
    assert_eq!(expired.next().await.unwrap().into_parts(), (1, 1));
    assert!(start.elapsed() <= Duration::from_millis(1));
}

#[tokio::test(start_paused = true)]
async fn past_instants_are_due_at_once_everywhere() {
    let wheel = Wheel::new();
    let past = Instant::now() - Duration::from_secs(3_600);
    wheel.sleep_until(past).await;
    assert_eq!(wheel.spawn_at(past, async { 2 }).await, Ok(2));
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    timers.set_at(1, 1, past);
    let e = expired.next().await.unwrap();
    assert_eq!(e.deadline(), past);
    let mut interval = wheel.interval_at(past, Duration::from_secs(1));
    assert_eq!(interval.tick().await, past);
}

#[tokio::test(start_paused = true)]
async fn duration_max_never_fires_and_never_panics() {
    let wheel = Wheel::new();
    let job = wheel.spawn_after(FOREVER, async { "never" });
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    timers.set(1, 1, FOREVER);
    timers.reset(&1, FOREVER);
    let mut sleep = wheel.sleep(FOREVER);
    assert!(poll_once(&mut sleep).is_pending());
    let mut interval = wheel.interval(FOREVER);
    interval.tick().await; // the first tick is immediate
    let periodic = wheel.spawn_every(FOREVER, Schedule::FixedRate, || async {});
    assert!(job.reschedule(Instant::now() + A_YEAR * 3));

    let timeout = tokio::time::timeout(2 * A_YEAR, async {
        tokio::select! {
            _ = expired.next() => "keyed fired",
            _ = &mut sleep => "sleep fired",
            _ = interval.tick() => "interval ticked",
        }
    });
    assert!(timeout.await.is_err(), "something saturated early");
    assert!(!job.is_finished());
    assert_eq!(wheel.stats().fired, 0);
    assert_eq!(timers.len().await, 1);
    periodic.abort();
    job.abort();
}

#[tokio::test(start_paused = true)]
async fn far_future_instants_saturate() {
    let wheel = Wheel::new();
    let far = Instant::now() + Duration::from_secs(100 * 365 * 86_400);
    let mut sleep = wheel.sleep_until(far);
    assert_eq!(sleep.deadline(), far);
    assert!(poll_once(&mut sleep).is_pending());
    settle().await;
    assert_eq!(wheel.stats().pending, 1);
    assert!(tokio::time::timeout(A_YEAR, &mut sleep).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn a_panic_inside_a_timeout_stays_with_its_caller() {
    let wheel = Wheel::new();
    let task = tokio::spawn({
        let wheel = wheel.clone();
        async move {
            wheel
                .timeout(Duration::from_secs(5), async {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    panic!("user future failed");
                })
                .await
        }
    });
    let error = task.await.unwrap_err();
    assert!(error.is_panic());
    wheel.flush().await;
    // The unwinding timeout dropped its timer: withdrawn before the actor filed it, or
    // cancelled after; either way nothing is pending and nothing fired.
    let s = wheel.stats();
    assert_eq!((s.pending, s.fired), (0, 0), "{s:?}");
    assert_eq!(s.inserted, s.cancelled, "{s:?}");
    wheel.sleep(Duration::from_millis(5)).await; // the wheel is unaffected
}

#[tokio::test(start_paused = true)]
async fn a_huge_tick_is_clamped_by_the_layout_not_by_a_panic() {
    // A one-day tick still works: every deadline rounds up to the next day boundary.
    let wheel = Wheel::builder().tick(Duration::from_secs(86_400)).build();
    let start = Instant::now();
    wheel.sleep(Duration::from_secs(1)).await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took <= Duration::from_secs(86_400),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_deadline_past_the_range_never_fires_even_with_the_finest_tick() {
    const YEAR: Duration = Duration::from_secs(365 * 86_400);
    let wheel = Wheel::builder().tick(Duration::from_nanos(1)).build();
    let start = Instant::now();
    let century = start + YEAR * 100;
    let mut far = wheel.sleep_until(century);
    assert!(poll_once(&mut far).is_pending());
    let job = wheel.spawn_at(century, async { "never" });
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    timers.set_at(1, 1, century);
    let mut within = wheel.sleep_until(start + YEAR * 72);
    assert!(poll_once(&mut within).is_pending());
    settle().await;

    tokio::time::advance(YEAR * 75).await;
    settle().await;
    assert!(
        poll_once(&mut within).is_ready(),
        "72 years is within the range"
    );
    assert!(
        poll_once(&mut far).is_pending(),
        "fired at the end of the range, early"
    );
    assert!(!job.is_finished());
    assert!(poll_once(expired.next()).is_pending());
    assert_eq!(wheel.stats().fired, 1);
}
