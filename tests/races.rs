//! Races on a multi-thread runtime, in real time: cancel, reset and take racing the actor's
//! fire. Each must have exactly one outcome — never both, never neither. Delays and race
//! offsets come from proptest, so every run walks many different interleavings.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use proptest::prelude::*;
use tokio::time::Instant;
use tokio_wheel::{JobError, Wheel};

/// Waits about `micros` µs by spinning with yields, so the race lands near the deadline with
/// finer grain than a timer allows.
async fn wait_around(micros: u64) {
    let until = std::time::Instant::now() + Duration::from_micros(micros);
    while std::time::Instant::now() < until {
        tokio::task::yield_now().await;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn cancel_racing_a_job_start_has_exactly_one_outcome(delay_us in 500u64..3_000, offset_us in 0u64..3_000) {
        let runtime = support::two_workers();
        runtime.block_on(async {
            let wheel = Wheel::new();
            let handles: Vec<_> = (0..32).map(|_| {
                let ran = Arc::new(AtomicBool::new(false));
                let flag = ran.clone();
                let job = wheel.spawn_after(Duration::from_micros(delay_us), async move {
                    flag.store(true, Ordering::SeqCst);
                });
                (job, ran)
            }).collect();
            wait_around(offset_us).await;
            for (job, ran) in handles {
                let cancelled = job.cancel();
                let result = job.await;
                // Let a job that was started finish setting its flag.
                wait_around(200).await;
                if cancelled {
                    assert_eq!(result, Err(JobError::Cancelled));
                    assert!(!ran.load(Ordering::SeqCst), "cancel said never, yet it ran");
                } else {
                    assert_eq!(result, Ok(()));
                    assert!(ran.load(Ordering::SeqCst), "cancel said too late, yet it never ran");
                }
            }
            wheel.flush().await;
            let s = wheel.stats();
            assert_eq!(s.inserted, s.fired + s.cancelled + s.pending);
            assert_eq!(s.pending, 0);
        });
    }

    #[test]
    fn a_reset_racing_the_fire_always_waits_for_the_new_deadline(delay_us in 500u64..3_000, offset_us in 0u64..3_000) {
        let runtime = support::two_workers();
        runtime.block_on(async {
            let wheel = Wheel::new();
            let tasks: Vec<_> = (0..32).map(|_| {
                let wheel = wheel.clone();
                tokio::spawn(async move {
                    let mut sleep = Box::pin(wheel.sleep(Duration::from_micros(delay_us)));
                    // Register, then race the reset against the fire.
                    let _ = futures::poll!(sleep.as_mut());
                    wait_around(offset_us).await;
                    let deadline = Instant::now() + Duration::from_millis(3);
                    sleep.as_mut().reset(deadline);
                    sleep.await;
                    assert!(Instant::now() >= deadline, "completed before the new deadline");
                })
            }).collect();
            for task in tasks {
                task.await.unwrap();
            }
        });
    }

    #[test]
    fn take_racing_an_expiry_has_exactly_one_outcome(delay_us in 500u64..3_000, offset_us in 0u64..3_000) {
        let runtime = support::two_workers();
        runtime.block_on(async {
            let wheel = Wheel::new();
            let (timers, mut expired) = wheel.keyed::<u32, u32>();
            for key in 0..64 {
                timers.set(key, key, Duration::from_micros(delay_us));
            }
            wait_around(offset_us).await;
            let mut taken = Vec::new();
            for key in 0..64 {
                if let Some(value) = timers.take(&key).await {
                    assert_eq!(value, key);
                    taken.push(key);
                }
            }
            drop(timers);
            let mut fired = Vec::new();
            while let Some(e) = expired.next().await {
                fired.push(e.into_parts().0);
            }
            for key in 0..64 {
                let was_taken = taken.contains(&key);
                let did_fire = fired.contains(&key);
                assert!(was_taken != did_fire, "key {key}: taken {was_taken}, fired {did_fire}");
            }
        });
    }

    #[test]
    fn a_by_key_reset_made_before_the_deadline_always_wins(delay_us in 500u64..3_000, offset_us in 0u64..3_000) {
        let runtime = support::two_workers();
        runtime.block_on(async {
            let wheel = Wheel::new();
            let (timers, mut expired) = wheel.keyed::<u32, u32>();
            let deadline = Instant::now() + Duration::from_micros(delay_us);
            for key in 0..64 {
                timers.set_at(key, key, deadline);
            }
            wait_around(offset_us).await;
            let later = deadline + Duration::from_secs(3_600);
            let mut in_time = Vec::new();
            for key in 0..64 {
                timers.reset_at(&key, later);
                if Instant::now() < deadline {
                    in_time.push(key);
                }
            }
            // Whatever fired has fired by now; the rest are delivered by the shutdown.
            tokio::time::sleep_until(deadline + Duration::from_millis(20)).await;
            wheel.shutdown().await;
            while let Some(e) = expired.next().await {
                let key = *e.key();
                if !e.is_shutdown() {
                    assert!(
                        !in_time.contains(&key),
                        "key {key} fired at its old deadline although its reset returned before it"
                    );
                }
            }
        });
    }
}

#[test]
fn a_sleep_dropped_as_it_fires_is_counted_once() {
    support::two_workers().block_on(async {
        let wheel = Wheel::new();
        for round in 0..200u64 {
            let mut sleep = Box::pin(wheel.sleep(Duration::from_micros(500 + round % 7 * 100)));
            let _ = futures::poll!(sleep.as_mut());
            wait_around(round % 13 * 80).await;
            drop(sleep);
        }
        wheel.flush().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        wheel.flush().await;
        // A sleep dropped before the actor took its command withdrew it and is never counted;
        // every other one is counted exactly once, fired or cancelled.
        let s = wheel.stats();
        assert!(s.inserted <= 200, "{s:?}");
        assert_eq!(s.fired + s.cancelled, s.inserted, "{s:?}");
        assert_eq!(s.pending, 0);
    });
}
