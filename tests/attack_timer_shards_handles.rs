//! Outside attack on timer shards: a timer stays on the lane of the thread that registered
//! it, and its handle may then be used from any other thread. Commands from one handle must
//! apply in the order made, whichever thread makes them; never early; `reset` before and after
//! completion; cancel after fire is a no-op; stats add up after `flush`. Paused time on a
//! current-thread runtime (the other threads run while the runtime's thread waits for them,
//! so the clock cannot move meanwhile), public API only.

mod support;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tokio_wheel::{JobError, JobHandle, Sleep, Wheel};

use support::poll_once;

const TICK: Duration = Duration::from_millis(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Runs `work` on a new plain thread inside the runtime's context (its clock) and waits for it.
fn on_thread<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    let handle = tokio::runtime::Handle::current();
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                let _entered = handle.enter();
                work()
            })
            .join()
            .unwrap()
    })
}

/// A sleep registered (polled once) on a fresh thread: on that thread's lane.
fn registered_elsewhere(wheel: &Wheel, deadline: Instant) -> Sleep {
    on_thread(|| {
        let mut sleep = wheel.sleep_until(deadline);
        assert!(poll_once(&mut sleep).is_pending());
        sleep
    })
}

/// Awaits `sleep` and asserts it completed at its deadline: never early, at most a tick late.
async fn completes_on_time(sleep: &mut Sleep) {
    let deadline = sleep.deadline();
    sleep.await;
    let now = Instant::now();
    assert!(now >= deadline, "early by {:?}", deadline - now);
    assert!(now <= deadline + TICK, "late by {:?}", now - deadline);
}

#[tokio::test(start_paused = true)]
async fn resets_from_other_threads_apply_in_order() {
    for shards in 1..=8 {
        let wheel = Wheel::builder().timer_shards(shards).build();
        let start = Instant::now();
        let mut sleeps: Vec<Sleep> = (0..8)
            .map(|_| registered_elsewhere(&wheel, start + ms(100)))
            .collect();
        // Thread B: earlier (a command to the registering lane), then later (no message).
        // Thread C: earlier again. The last one made wins: due at +7 ms.
        for sleep in &mut sleeps {
            on_thread(|| {
                Pin::new(&mut *sleep).reset(start + ms(10));
                Pin::new(&mut *sleep).reset(start + ms(50));
            });
            on_thread(|| Pin::new(&mut *sleep).reset(start + ms(7)));
        }
        for sleep in &mut sleeps {
            assert_eq!(sleep.deadline(), start + ms(7));
            completes_on_time(sleep).await;
        }
        // After completion, re-armed from yet other threads: later, then earlier, then later.
        let restart = Instant::now();
        for sleep in &mut sleeps {
            on_thread(|| Pin::new(&mut *sleep).reset(restart + ms(40)));
            on_thread(|| {
                Pin::new(&mut *sleep).reset(restart + ms(5));
                Pin::new(&mut *sleep).reset(restart + ms(20));
            });
        }
        assert!(sleeps.iter().all(|sleep| !sleep.is_elapsed()));
        for sleep in &mut sleeps {
            completes_on_time(sleep).await;
        }
        wheel.flush().await;
        let stats = wheel.stats();
        assert_eq!(stats.pending, 0, "shards {shards}: {stats:?}");
        assert_eq!(
            stats.inserted,
            stats.fired + stats.cancelled + stats.pending,
            "shards {shards}: {stats:?}"
        );
        assert_eq!(stats.fired, 16, "shards {shards}: {stats:?}");
        wheel.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_sleep_due_is_ready_on_the_poll_after_advance_on_every_lane() {
    let wheel = Wheel::builder().timer_shards(5).build();
    let start = Instant::now();
    let mut sleeps: Vec<Sleep> = (0..20)
        .map(|i| registered_elsewhere(&wheel, start + ms(3 + i)))
        .collect();
    tokio::time::advance(ms(12)).await;
    for (i, sleep) in sleeps.iter_mut().enumerate() {
        let due = 3 + i as u64 <= 12;
        assert_eq!(poll_once(&mut *sleep).is_ready(), due, "sleep {i}");
    }
    // Polled from another thread at or after its deadline: ready there too.
    tokio::time::advance(ms(20)).await;
    let ready = on_thread(|| {
        sleeps
            .iter_mut()
            .map(|sleep| poll_once(sleep).is_ready())
            .filter(|&ready| ready)
            .count()
    });
    assert_eq!(ready, 20);
    drop(sleeps);
    wheel.flush().await;
    let stats = wheel.stats();
    assert_eq!(stats.inserted, 20, "{stats:?}");
    assert_eq!(stats.fired + stats.cancelled, 20, "{stats:?}");
    assert_eq!(stats.fired, 20, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn sleeps_dropped_on_other_threads_never_fire_and_counts_add_up() {
    let wheel = Wheel::builder().timer_shards(4).build();
    let start = Instant::now();
    let woken = Arc::new(AtomicUsize::new(0));
    // Registered on several lanes, each with a waker counting wake-ups.
    let mut sleeps: Vec<Sleep> = Vec::new();
    for i in 0..40u64 {
        let counter = woken.clone();
        sleeps.push(on_thread(|| {
            let waker = futures::task::waker(Arc::new(Count(counter)));
            let mut sleep = wheel.sleep_until(start + ms(5 + i % 10));
            let mut cx = std::task::Context::from_waker(&waker);
            assert!(Pin::new(&mut sleep).poll(&mut cx).is_pending());
            sleep
        }));
    }
    // Half the actor has taken (a flush between), half not yet.
    wheel.flush().await;
    let late: Vec<Sleep> = (0..40u64)
        .map(|i| registered_elsewhere(&wheel, start + ms(5 + i % 10)))
        .collect();
    // Dropped on other threads: all of the first batch, all of the late batch.
    on_thread(move || drop(sleeps));
    on_thread(move || drop(late));
    tokio::time::sleep(ms(30)).await;
    assert_eq!(
        woken.load(Ordering::SeqCst),
        0,
        "a dropped sleep woke its task"
    );
    wheel.flush().await;
    let stats = wheel.stats();
    assert_eq!(stats.fired, 0, "{stats:?}");
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(stats.inserted, stats.cancelled, "{stats:?}");
    assert!(stats.inserted >= 40, "{stats:?}");
}

struct Count(Arc<AtomicUsize>);
impl futures::task::ArcWake for Count {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        arc_self.0.fetch_add(1, Ordering::SeqCst);
    }
}

use std::future::Future;

#[tokio::test(start_paused = true)]
async fn jobs_made_on_one_thread_are_moved_and_stopped_from_others() {
    let wheel = Wheel::builder().timer_shards(4).build();
    let start = Instant::now();
    let ran = Arc::new(AtomicUsize::new(0));
    let make = |i: u64| {
        let (wheel, ran) = (wheel.clone(), ran.clone());
        on_thread(move || {
            wheel.spawn_at(start + ms(100), async move {
                ran.fetch_add(1, Ordering::SeqCst);
                (i, Instant::now())
            })
        })
    };
    let jobs: Vec<JobHandle<(u64, Instant)>> = (0..24).map(make).collect();
    let mut expect = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let i = i as u64;
        match i % 4 {
            // Cancelled elsewhere: true once, false after.
            0 => {
                assert!(on_thread(|| job.cancel()));
                assert!(!on_thread(|| job.cancel()));
                assert!(!job.reschedule(start + ms(1)));
                expect.push(None);
            }
            // Earlier on one thread, later on another, earlier on a third: the last wins.
            1 => {
                assert!(on_thread(|| job.reschedule(start + ms(10))));
                assert!(on_thread(|| job.reschedule(start + ms(60))));
                assert!(on_thread(|| job.reschedule(start + ms(20 + i))));
                expect.push(Some(start + ms(20 + i)));
            }
            // Later only.
            2 => {
                assert!(on_thread(|| job.reschedule(start + ms(150 + i))));
                expect.push(Some(start + ms(150 + i)));
            }
            // Aborted before it starts.
            _ => {
                on_thread(|| job.abort());
                expect.push(None);
            }
        }
    }
    for (job, expect) in jobs.into_iter().zip(expect) {
        let result = job.await;
        match expect {
            None => assert_eq!(result, Err(JobError::Cancelled)),
            Some(due) => {
                let (_, ran_at) = result.unwrap();
                assert!(ran_at >= due, "ran early: {:?} before", due - ran_at);
                assert!(ran_at <= due + TICK, "late by {:?}", ran_at - due);
            }
        }
    }
    assert_eq!(ran.load(Ordering::SeqCst), 12);
    wheel.flush().await;
    let stats = wheel.stats();
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(stats.inserted, 24, "{stats:?}");
    assert_eq!(stats.fired, 12, "{stats:?}");
    assert_eq!(stats.cancelled, 12, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn cancel_after_fire_is_a_no_op_from_any_thread() {
    let wheel = Wheel::builder().timer_shards(3).build();
    let jobs: Vec<JobHandle<u32>> = (0..9u32)
        .map(|i| on_thread(|| wheel.spawn_after(ms(5), async move { i })))
        .collect();
    tokio::time::sleep(ms(10)).await;
    wheel.flush().await;
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
    for (i, job) in jobs.into_iter().enumerate() {
        assert!(!on_thread(|| job.cancel()), "job {i}: cancel after fire");
        assert!(!on_thread(|| job.reschedule(Instant::now() + ms(5))));
        on_thread(|| job.abort());
        assert_eq!(job.await, Ok(i as u32), "job {i}");
    }
    let stats = wheel.stats();
    assert_eq!((stats.fired, stats.cancelled, stats.pending), (9, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn timeouts_and_intervals_first_polled_on_other_threads() {
    let wheel = Wheel::builder().timer_shards(4).build();
    // A timeout registered on another thread's lane, finished here.
    let start = Instant::now();
    let mut timeouts: Vec<_> = (0..8u64)
        .map(|i| {
            on_thread(|| {
                let mut t = Box::pin(wheel.timeout(ms(10 + i), std::future::pending::<()>()));
                assert!(poll_once(t.as_mut()).is_pending());
                t
            })
        })
        .collect();
    for (i, t) in timeouts.iter_mut().enumerate() {
        let elapsed = t.as_mut().await.unwrap_err();
        assert!(!elapsed.is_shutdown());
        let due = start + ms(10 + i as u64);
        assert!(Instant::now() >= due && Instant::now() <= due + TICK);
    }
    // An interval whose ticks are polled on a different thread each time.
    let period = ms(7);
    let begin = Instant::now();
    let mut interval = wheel.interval(period);
    for k in 0..10u32 {
        let tick = on_thread(|| match poll_once(interval.tick()) {
            Poll::Ready(at) => Some(at),
            Poll::Pending => None,
        });
        let scheduled = match tick {
            Some(at) => at,
            None => interval.tick().await,
        };
        assert_eq!(scheduled, begin + period * k, "tick {k}");
        assert!(Instant::now() >= scheduled, "tick {k} early");
    }
    wheel.flush().await;
    let stats = wheel.stats();
    assert_eq!(
        stats.inserted,
        stats.fired + stats.cancelled + stats.pending,
        "{stats:?}"
    );
}
