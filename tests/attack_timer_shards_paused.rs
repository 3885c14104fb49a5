//! Outside attack on timer shards under paused time on current-thread runtimes: for every
//! count 1..=8, timers registered from many threads fire never early and at most a tick late;
//! `advance` then a poll completes what is due on every lane (intervals burst as tokio's);
//! `Duration::MAX` and far instants saturate on every lane; periodic jobs never overlap and
//! keep their schedule. Public API only.

mod support;

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tokio_wheel::{JobError, MissedTickBehavior, Schedule, Sleep, Wheel};

use support::{Rng, poll_once};

const THREADS: usize = 8;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Runs `work(i)` on `THREADS` plain threads inside the current runtime's context and waits
/// for them (the runtime's thread is held meanwhile: paused time cannot move).
fn on_threads<T: Send>(work: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let handle = tokio::runtime::Handle::current();
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|i| {
                let (handle, work) = (handle.clone(), &work);
                scope.spawn(move || {
                    let _entered = handle.enter();
                    work(i)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

#[tokio::test(start_paused = true)]
async fn every_shard_count_fires_sleeps_timeouts_and_jobs_on_time() {
    for shards in 1..=8 {
        let wheel = Wheel::builder().timer_shards(shards).build();
        let tick = wheel.tick();
        let start = Instant::now();
        // Sub-millisecond deadlines too: they round up, never down.
        let made = on_threads(|i| {
            let mut rng = Rng(i as u64 * 7 + shards as u64);
            let mut sleeps = Vec::new();
            let mut jobs = Vec::new();
            let mut timeouts = Vec::new();
            for _ in 0..10 {
                let deadline = start + Duration::from_micros(500 + rng.below(40_000));
                let mut sleep = wheel.sleep_until(deadline);
                assert!(poll_once(&mut sleep).is_pending());
                sleeps.push(sleep);
                let due = start + Duration::from_micros(500 + rng.below(40_000));
                jobs.push((due, wheel.spawn_at(due, async { Instant::now() })));
                let until = start + Duration::from_micros(500 + rng.below(40_000));
                let mut timeout = Box::pin(wheel.timeout_at(until, std::future::pending::<()>()));
                assert!(poll_once(timeout.as_mut()).is_pending());
                timeouts.push((until, timeout));
            }
            (sleeps, jobs, timeouts)
        });
        let fired = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (sleeps, jobs, timeouts) in made {
            for sleep in sleeps {
                let fired = fired.clone();
                tasks.push(tokio::spawn(async move {
                    let deadline = sleep.deadline();
                    sleep.await;
                    fired.lock().unwrap().push((deadline, Instant::now()));
                }));
            }
            for (due, job) in jobs {
                let fired = fired.clone();
                tasks.push(tokio::spawn(async move {
                    let ran = job.await.unwrap();
                    fired.lock().unwrap().push((due, ran));
                }));
            }
            for (until, timeout) in timeouts {
                let fired = fired.clone();
                tasks.push(tokio::spawn(async move {
                    let elapsed = timeout.await.unwrap_err();
                    assert!(!elapsed.is_shutdown());
                    fired.lock().unwrap().push((until, Instant::now()));
                }));
            }
        }
        for task in tasks {
            task.await.unwrap();
        }
        let fired = fired.lock().unwrap().clone();
        assert_eq!(fired.len(), THREADS * 30);
        for (deadline, at) in fired {
            assert!(
                at >= deadline,
                "shards {shards}: early by {:?}",
                deadline - at
            );
            assert!(
                at <= deadline + tick,
                "shards {shards}: late by {:?}",
                at - deadline
            );
        }
        wheel.flush().await;
        let stats = wheel.stats();
        assert_eq!(stats.pending, 0, "shards {shards}: {stats:?}");
        assert_eq!(
            stats.inserted,
            (THREADS * 30) as u64,
            "shards {shards}: {stats:?}"
        );
        assert_eq!(
            stats.fired,
            (THREADS * 30) as u64,
            "shards {shards}: {stats:?}"
        );
        assert!(stats.max_lateness <= tick, "shards {shards}: {stats:?}");
        wheel.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn advance_then_poll_completes_due_ticks_on_every_lane_with_burst() {
    let wheel = Wheel::builder().timer_shards(6).build();
    let period = ms(10);
    let start = Instant::now();
    let mut intervals = on_threads(|i| {
        let mut interval = wheel.interval_at(start + period, period);
        assert_eq!(interval.missed_tick_behavior(), MissedTickBehavior::Burst);
        // Registered on this thread's lane.
        assert!(poll_once(interval.tick()).is_pending());
        let mut sleep = wheel.sleep_until(start + ms(3 + i as u64));
        assert!(poll_once(&mut sleep).is_pending());
        (interval, sleep)
    });
    tokio::time::advance(ms(55)).await;
    for (interval, sleep) in &mut intervals {
        assert_eq!(poll_once(&mut *sleep), Poll::Ready(()));
        // Ticks at 10..=50 are overdue: five back to back, the sixth not yet.
        for k in 1..=5u32 {
            match poll_once(interval.tick()) {
                Poll::Ready(at) => assert_eq!(at, start + period * k),
                Poll::Pending => panic!("overdue tick {k} not ready after advance"),
            }
        }
        assert!(poll_once(interval.tick()).is_pending());
    }
    // The next tick (60 ms) fires from the actor, for each lane.
    for (interval, _) in &mut intervals {
        assert_eq!(interval.tick().await, start + ms(60));
        assert_eq!(Instant::now(), start + ms(60));
    }
    wheel.flush().await;
    let stats = wheel.stats();
    assert_eq!(
        stats.inserted,
        stats.fired + stats.cancelled + stats.pending,
        "{stats:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn duration_max_and_far_instants_saturate_on_every_lane() {
    for tick in [Duration::from_millis(1), Duration::from_micros(1)] {
        let wheel = Wheel::builder().tick(tick).timer_shards(4).build();
        let ran = Arc::new(AtomicUsize::new(0));
        let now = Instant::now();
        let far_instant = now
            .checked_add(Duration::from_secs(500 * 365 * 24 * 3_600))
            .unwrap_or(now);
        let mut made = on_threads(|_| {
            let mut sleep = wheel.sleep(Duration::MAX);
            assert!(poll_once(&mut sleep).is_pending());
            let mut far = wheel.sleep_until(far_instant);
            assert!(poll_once(&mut far).is_pending());
            let mut timeout = Box::pin(wheel.timeout(Duration::MAX, std::future::pending::<()>()));
            assert!(poll_once(timeout.as_mut()).is_pending());
            let ran = ran.clone();
            let job = wheel.spawn_after(Duration::MAX, async move {
                ran.fetch_add(1, Ordering::SeqCst);
            });
            let mut interval = wheel.interval(Duration::MAX);
            assert!(poll_once(interval.tick()).is_ready());
            assert!(poll_once(interval.tick()).is_pending());
            // Moved to Duration::MAX from a timer due soon, from this thread.
            let mut moved = wheel.sleep(ms(5));
            assert!(poll_once(&mut moved).is_pending());
            Pin::new(&mut moved).reset(Instant::now() + Duration::from_secs(u32::MAX as u64));
            (sleep, far, timeout, job, interval, moved)
        });
        // A century of paused time, in steps.
        for _ in 0..100 {
            tokio::time::advance(Duration::from_secs(365 * 24 * 3_600)).await;
        }
        for (sleep, far, timeout, job, interval, moved) in &mut made {
            assert!(poll_once(&mut *sleep).is_pending(), "tick {tick:?}");
            assert!(poll_once(&mut *far).is_pending(), "tick {tick:?}");
            assert!(poll_once(timeout.as_mut()).is_pending(), "tick {tick:?}");
            assert!(!job.is_finished(), "tick {tick:?}");
            assert!(poll_once(interval.tick()).is_pending(), "tick {tick:?}");
            assert!(poll_once(&mut *moved).is_pending(), "tick {tick:?}");
        }
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        wheel.flush().await;
        let stats = wheel.stats();
        assert_eq!(stats.fired, 0, "tick {tick:?}: {stats:?}");
        assert_eq!(
            stats.pending,
            6 * THREADS as u64,
            "tick {tick:?}: {stats:?}"
        );
        wheel.shutdown().await;
        for (sleep, _, _, job, _, _) in made {
            sleep.await;
            assert_eq!(job.await, Err(JobError::Shutdown));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn periodic_jobs_made_on_many_threads_never_overlap_and_keep_schedule() {
    let wheel = Wheel::builder().timer_shards(4).build();
    let tick = wheel.tick();
    let period = ms(10);
    let start = Instant::now();
    type Log = Arc<Mutex<Vec<(Instant, Instant)>>>;
    let made = on_threads(|i| {
        let schedule = if i % 2 == 0 {
            Schedule::FixedRate
        } else {
            Schedule::FixedDelay
        };
        let running = Arc::new(AtomicBool::new(false));
        let overlapped = Arc::new(AtomicBool::new(false));
        let log: Log = Arc::new(Mutex::new(Vec::new()));
        let w = wheel.clone();
        let (r, o, l) = (running.clone(), overlapped.clone(), log.clone());
        let job = wheel.spawn_every(period, schedule, move || {
            let (w, r, o, l) = (w.clone(), r.clone(), o.clone(), l.clone());
            async move {
                if r.swap(true, Ordering::SeqCst) {
                    o.store(true, Ordering::SeqCst);
                }
                let began = Instant::now();
                // Each run outlasts its period (25 ms against 10 ms).
                w.sleep(ms(25)).await;
                r.store(false, Ordering::SeqCst);
                l.lock().unwrap().push((began, Instant::now()));
            }
        });
        (schedule, job, overlapped, log)
    });
    tokio::time::sleep(ms(200)).await;
    let mut handles = Vec::new();
    for (schedule, job, overlapped, log) in made {
        // Stopped from another thread than the one that made it.
        let cancelled = on_threads(|i| i == 0 && job.cancel());
        assert!(cancelled[0]);
        handles.push((schedule, job, overlapped, log));
    }
    for (schedule, job, overlapped, log) in handles {
        assert_eq!(job.await, Err(JobError::Cancelled));
        assert!(
            !overlapped.load(Ordering::SeqCst),
            "{schedule:?}: runs overlapped"
        );
        let log = log.lock().unwrap().clone();
        assert!(log.len() >= 4, "{schedule:?}: {log:?}");
        let first = log[0].0;
        assert!(first >= start + period && first <= start + period + tick);
        for pair in log.windows(2) {
            let ((_, ended), (next, _)) = (pair[0], pair[1]);
            assert!(next >= ended, "{schedule:?}: overlap {log:?}");
            match schedule {
                // As tokio's `Interval` with `Skip` (the crate's stated reference): a run
                // starts on a slot, or — its slot missed while the last run went on — as
                // soon as that run ends; never more than a period after it ends.
                Schedule::FixedRate => {
                    let offset = (next - start).as_micros() % period.as_micros();
                    let on_slot = offset <= tick.as_micros();
                    let at_once = next - ended <= tick;
                    assert!(on_slot || at_once, "{schedule:?}: {log:?}");
                    assert!(next - ended < period + tick, "{schedule:?}: {log:?}");
                }
                // A period after each run ends.
                Schedule::FixedDelay => {
                    assert!(next - ended >= period, "{schedule:?}: {log:?}");
                    assert!(next - ended <= period + tick, "{schedule:?}: {log:?}");
                }
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_sleep_registered_before_and_after_shards_fill_their_queues() {
    // Many sleeps per thread (several thousand per lane), all due at one of few instants:
    // every lane fires its whole share at that instant, none early.
    let wheel = Wheel::builder().timer_shards(3).build();
    let start = Instant::now();
    let sleeps: Vec<Vec<Sleep>> = on_threads(|i| {
        (0..5_000u64)
            .map(|k| {
                let mut sleep = wheel.sleep_until(start + ms(1 + (k + i as u64) % 4));
                assert!(poll_once(&mut sleep).is_pending());
                sleep
            })
            .collect()
    });
    let mut sleeps: Vec<Sleep> = sleeps.into_iter().flatten().collect();
    for step in 1..=4u64 {
        tokio::time::sleep_until(start + ms(step)).await;
        for sleep in &mut sleeps {
            let due = sleep.deadline() <= Instant::now();
            assert_eq!(poll_once(&mut *sleep).is_ready(), due, "step {step}");
        }
    }
    drop(sleeps);
    wheel.flush().await;
    let stats = wheel.stats();
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(stats.inserted, stats.fired + stats.cancelled, "{stats:?}");
    assert_eq!(stats.fired, (THREADS * 5_000) as u64, "{stats:?}");
}
