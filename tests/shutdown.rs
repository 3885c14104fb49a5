//! Shutdown and lifetime: nothing hangs, nothing panics, everything pending resolves.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use support::{poll_once, settle};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_wheel::{JobError, Schedule, Wheel};

const LONG: Duration = Duration::from_secs(3_600);

#[tokio::test(start_paused = true)]
async fn shutdown_resolves_every_pending_thing_at_once() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let sleep = tokio::spawn(wheel.sleep(LONG));
    let timeout = tokio::spawn(wheel.timeout(LONG, std::future::pending::<()>()));
    let mut interval = wheel.interval(LONG);
    interval.tick().await;
    let ticking = tokio::spawn(async move {
        interval.tick().await;
        interval
    });
    let job = wheel.spawn_after(LONG, async { 1 });
    let periodic = wheel.spawn_every(LONG, Schedule::FixedRate, || async {});
    let (timers, mut expired) = wheel.keyed::<u8, &str>();
    timers.set(1, "one", LONG);
    timers.set(2, "two", LONG);
    settle().await;

    wheel.shutdown().await;

    sleep.await.unwrap();
    let elapsed = timeout.await.unwrap().unwrap_err();
    assert!(elapsed.is_shutdown());
    assert_eq!(
        elapsed.to_string(),
        "timer wheel shut down before the deadline"
    );
    let mut interval = ticking.await.unwrap();
    interval.tick().await; // resolves at once from now on
    assert!(interval.next().await.is_none(), "the interval stream ends");
    assert_eq!(job.await, Err(JobError::Shutdown));
    assert_eq!(periodic.await, Err(JobError::Shutdown));
    let mut flushed = Vec::new();
    while let Some(e) = expired.next().await {
        assert!(e.is_shutdown());
        flushed.push(e.into_parts());
    }
    flushed.sort_unstable();
    assert_eq!(flushed, [(1, "one"), (2, "two")]);
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "nothing waited for a deadline"
    );
    let stats = wheel.stats();
    assert_eq!(stats.pending, 0);
    assert_eq!(stats.actors, 0);
    assert_eq!(
        stats.inserted,
        stats.fired + stats.cancelled + stats.pending
    );
}

#[tokio::test(start_paused = true)]
async fn a_running_job_finishes_after_shutdown() {
    let wheel = Wheel::new();
    let (release, released) = oneshot::channel::<()>();
    let job = wheel.spawn_after(Duration::from_millis(1), async move {
        released.await.unwrap();
        "done"
    });
    tokio::time::sleep(Duration::from_millis(5)).await;
    wheel.shutdown().await;
    release.send(()).unwrap();
    assert_eq!(job.await, Ok("done"));
}

#[tokio::test(start_paused = true)]
async fn calls_on_a_stopped_wheel_return_promptly() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    wheel.shutdown().await;
    wheel.shutdown().await; // twice is harmless
    assert!(wheel.is_shutdown());

    assert_eq!(poll_once(wheel.sleep(LONG)), std::task::Poll::Ready(()));
    assert!(
        wheel
            .timeout(LONG, std::future::pending::<()>())
            .await
            .unwrap_err()
            .is_shutdown()
    );
    assert_eq!(
        wheel.spawn_after(LONG, async { 1 }).await,
        Err(JobError::Shutdown)
    );
    assert_eq!(
        wheel
            .spawn_every(LONG, Schedule::FixedDelay, || async {})
            .await,
        Err(JobError::Shutdown)
    );

    timers.set(1, 1, LONG); // refused silently
    assert_eq!(timers.take(&1).await, None);
    assert_eq!(timers.drain().await, Vec::new());
    assert_eq!(timers.len().await, 0);
    assert!(expired.next().await.is_none());

    let (late_timers, mut late_expired) = wheel.keyed::<u8, u8>();
    late_timers.set(1, 1, LONG);
    assert_eq!(late_timers.len().await, 0);
    assert!(late_expired.next().await.is_none());
}

/// Refused means finished before the first poll, for periodic jobs as for one-shot ones
/// (outside attack: a periodic one spawned its driver and finished a moment later).
#[tokio::test(start_paused = true)]
async fn jobs_made_on_a_stopped_wheel_are_finished_before_their_first_poll() {
    let wheel = Wheel::new();
    wheel.shutdown().await;
    let one_shot = wheel.spawn_after(LONG, async { 1 });
    assert!(one_shot.is_finished());
    assert_eq!(
        poll_once(one_shot),
        std::task::Poll::Ready(Err(JobError::Shutdown))
    );
    for schedule in [Schedule::FixedRate, Schedule::FixedDelay] {
        let every = wheel.spawn_every(LONG, schedule, || async {});
        assert!(every.is_finished(), "{schedule:?}");
        assert!(!every.cancel(), "{schedule:?}: nothing was pending");
        assert!(!every.reschedule(Instant::now() + LONG));
        assert_eq!(
            poll_once(every),
            std::task::Poll::Ready(Err(JobError::Shutdown)),
            "{schedule:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_in_the_middle_of_a_burst_loses_nothing() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    let sleeps: Vec<_> = (0..2_000u64)
        .map(|i| tokio::spawn(wheel.sleep(Duration::from_millis(i % 20))))
        .collect();
    for k in 0..2_000 {
        timers.set(k, k, Duration::from_millis(u64::from(k % 20)));
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    wheel.shutdown().await;
    for sleep in sleeps {
        sleep.await.unwrap();
    }
    let mut seen = 0;
    while let Some(e) = expired.next().await {
        let _ = e.is_shutdown();
        seen += 1;
    }
    assert_eq!(
        seen, 2_000,
        "every keyed entry was delivered, expired or flushed"
    );
    let s = wheel.stats();
    assert_eq!(s.inserted, s.fired + s.cancelled + s.pending);
}

#[tokio::test(start_paused = true)]
async fn a_detached_job_runs_after_every_handle_is_dropped_then_the_actor_exits() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let wheel = Wheel::new();
    let (sender, receiver) = oneshot::channel();
    drop(wheel.spawn_after(
        Duration::from_secs(10),
        async move { sender.send(()).unwrap() },
    ));
    drop(wheel);
    receiver.await.unwrap();
    settle().await;
    assert_eq!(metrics.num_alive_tasks(), 0, "the actor exited on its own");
}

#[tokio::test(start_paused = true)]
async fn the_actor_exits_once_nothing_needs_it() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let wheel = Wheel::new();
    let (timers, expired) = wheel.keyed::<u8, u8>();
    settle().await;
    assert_eq!(metrics.num_alive_tasks(), 2);
    drop((wheel, timers, expired));
    settle().await;
    assert_eq!(metrics.num_alive_tasks(), 0);
}

#[test]
fn the_actor_runtime_shutting_down_acts_as_shutdown() {
    let actor_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_time()
        .build()
        .unwrap();
    let user_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let wheel = Wheel::builder()
        .runtime(actor_runtime.handle().clone())
        .build();
    let ran = Arc::new(AtomicBool::new(false));
    let flag = ran.clone();

    let (sleep, timeout, job, timers, mut expired) = user_runtime.block_on(async {
        let sleep = tokio::spawn(wheel.sleep(LONG));
        let timeout = tokio::spawn(wheel.timeout(LONG, std::future::pending::<()>()));
        let job = wheel.spawn_after(LONG, async move { flag.store(true, Ordering::SeqCst) });
        let (timers, expired) = wheel.keyed::<u8, u8>();
        timers.set(1, 1, LONG);
        assert_eq!(timers.len().await, 1);
        tokio::task::yield_now().await;
        (sleep, timeout, job, timers, expired)
    });

    actor_runtime.shutdown_timeout(Duration::from_secs(5));

    user_runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            sleep.await.unwrap();
            assert!(timeout.await.unwrap().unwrap_err().is_shutdown());
            assert_eq!(job.await, Err(JobError::Shutdown));
            let e = expired.next().await.unwrap();
            assert!(e.is_shutdown());
            assert!(expired.next().await.is_none());
            assert!(wheel.is_shutdown());
            assert_eq!(poll_once(wheel.sleep(LONG)), std::task::Poll::Ready(()));
            assert_eq!(timers.len().await, 0);
        })
        .await
        .expect("something hung after the actor's runtime shut down");
    });
    assert!(!ran.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn keyed_commands_queued_before_shutdown_are_applied_before_the_flush() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<&str, u8>();
    timers.set("a", 1, LONG);
    assert_eq!(timers.len().await, 1, "a is applied");
    // Queued, not yet applied, when shutdown is called.
    timers.remove(&"a");
    timers.set("b", 2, LONG);
    timers.set("c", 3, LONG);
    timers.reset(&"c", LONG * 2);
    timers.remove(&"c");
    wheel.shutdown().await;
    let mut flushed = Vec::new();
    while let Some(e) = expired.next().await {
        assert!(e.is_shutdown());
        flushed.push(e.into_parts());
    }
    assert_eq!(flushed, [("b", 2)], "a and c were removed; b was set");
    timers.set("d", 4, LONG);
    assert_eq!(timers.len().await, 0, "set after shutdown is refused");
}

/// Sets `n` keys (removing every tenth right after) from a separate thread, without waiting
/// for the actor. Returns the keys that must be delivered.
fn set_from_a_thread(timers: tokio_wheel::Timers<u32, u32>, n: u32) -> Vec<u32> {
    std::thread::spawn(move || {
        for key in 0..n {
            timers.set(key, key * 2, LONG);
            if key % 10 == 0 {
                timers.remove(&key);
            }
        }
        (0..n).filter(|key| key % 10 != 0).collect()
    })
    .join()
    .unwrap()
}

/// Reads every expiration, checking each is a shutdown flush carrying its value; returns the
/// keys, sorted.
async fn read_flush(expired: &mut tokio_wheel::Expirations<u32, u32>) -> Vec<u32> {
    let mut keys = Vec::new();
    while let Some(e) = expired.next().await {
        assert!(
            e.is_shutdown(),
            "{:?} expired instead of being flushed",
            e.key()
        );
        let (key, value) = e.into_parts();
        assert_eq!(value, key * 2);
        keys.push(key);
    }
    keys.sort_unstable();
    keys
}

#[test]
fn twenty_thousand_keyed_entries_set_just_before_shutdown_are_each_delivered_once() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let wheel = Wheel::new();
        let (timers, mut expired) = wheel.keyed::<u32, u32>();
        // Set (and remove every tenth) from this task, then shut down at once: most commands
        // are still queued when shutdown begins.
        let mut expected = Vec::new();
        for key in 0..20_000 {
            timers.set(key, key * 2, LONG);
            if key % 10 == 0 {
                timers.remove(&key);
            } else {
                expected.push(key);
            }
        }
        wheel.shutdown().await;
        assert_eq!(read_flush(&mut expired).await, expected);
        let s = wheel.stats();
        assert_eq!(s.inserted, s.fired + s.cancelled + s.pending, "{s:?}");
        assert_eq!(s.pending, 0);
    });
}

#[test]
fn twenty_thousand_keyed_entries_in_flight_when_the_runtime_dies_are_each_delivered_once() {
    for flavor in ["current_thread", "multi_thread"] {
        let actor_runtime = match flavor {
            "current_thread" => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            _ => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap(),
        };
        let wheel = Wheel::builder()
            .runtime(actor_runtime.handle().clone())
            .build();
        let (timers, mut expired) = wheel.keyed::<u32, u32>();
        let sleep = wheel.sleep(LONG);
        let job = wheel.spawn_after(LONG, async { 1 });
        let expected = set_from_a_thread(timers.clone(), 20_000);
        drop(actor_runtime);

        let reader = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        reader.block_on(async {
            tokio::time::timeout(Duration::from_secs(60), async {
                assert_eq!(read_flush(&mut expired).await, expected, "{flavor}");
                assert!(wheel.is_shutdown());
                sleep.await;
                assert_eq!(job.await, Err(JobError::Shutdown));
                timers.set(1, 1, LONG);
                assert_eq!(timers.len().await, 0);
            })
            .await
            .expect("something hung after the runtime died");
        });
    }
}

#[tokio::test(start_paused = true)]
async fn a_sleep_reset_again_and_again_after_shutdown_stays_complete() {
    let wheel = Wheel::new();
    let mut sleep = Box::pin(wheel.sleep(Duration::from_millis(1)));
    sleep.as_mut().await;
    wheel.shutdown().await;
    // Re-arming after the wheel stopped is refused: the sleep completes at once...
    sleep.as_mut().reset(Instant::now() + LONG);
    assert_eq!(poll_once(sleep.as_mut()), std::task::Poll::Ready(()));
    // ...and so after every later reset too (it used to hang here, on a word re-armed for an
    // actor that was gone).
    sleep.as_mut().reset(Instant::now() + LONG * 2);
    assert_eq!(poll_once(sleep.as_mut()), std::task::Poll::Ready(()));
    assert!(sleep.is_elapsed());
}

/// Tasks that await and re-arm timers in a loop while the wheel shuts down: every one of them
/// finishes promptly (an independent attack found resets and interval ticks hanging here).
#[test]
fn timers_awaited_and_reset_in_a_loop_all_finish_when_the_wheel_shuts_down() {
    for (kind, round) in (0..4).flat_map(|kind| (0..6u64).map(move |round| (kind, round))) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let wheel = Wheel::new();
            let tasks: Vec<_> = (0..200u64)
                .map(|i| {
                    let wheel = wheel.clone();
                    let period = Duration::from_millis(1 + i % 3);
                    tokio::spawn(async move {
                        match kind {
                            0 => {
                                let mut sleep = Box::pin(wheel.sleep(period));
                                for _ in 0..10 {
                                    sleep.as_mut().await;
                                    let next = sleep.deadline() + period;
                                    sleep.as_mut().reset(next);
                                }
                            }
                            1 => {
                                let mut interval = wheel.interval(period);
                                for _ in 0..10 {
                                    interval.tick().await;
                                }
                            }
                            2 => {
                                for _ in 0..10 {
                                    let never = std::future::pending::<()>();
                                    let _ = wheel.timeout(period, never).await;
                                }
                            }
                            _ => {
                                for _ in 0..10 {
                                    let _ = wheel.spawn_after(period, async {}).await;
                                }
                            }
                        }
                    })
                })
                .collect();
            tokio::time::sleep(Duration::from_micros(500 + round * 300)).await;
            wheel.shutdown().await;
            tokio::time::timeout(Duration::from_secs(60), async {
                for task in tasks {
                    task.await.unwrap();
                }
            })
            .await
            .unwrap_or_else(|_| panic!("kind {kind}, round {round}: a task hung after shutdown"));
        });
    }
}
