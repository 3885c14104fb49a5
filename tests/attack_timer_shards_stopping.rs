//! Outside attack on timer shards, API.md "Observing and stopping": shutdown while other
//! threads keep registering, the runtime dropped with timers pending on several shards,
//! calls on a stopped wheel, and every shard's actor exiting on its own once every handle is
//! gone (a detached job still firing first). Public API only; real waits are hang guards.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_wheel::{JobError, JobHandle, Sleep, Wheel};

use support::{poll_once, two_workers};

const HANG: Duration = Duration::from_secs(60);
const THREADS: usize = 8;

/// Waits in real time until `done`, failing after [`HANG`] (a hang, not a timing figure).
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let until = std::time::Instant::now() + HANG;
    while !done() {
        assert!(std::time::Instant::now() < until, "hung: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn block_on_guarded<F: std::future::Future>(what: &str, future: F) -> F::Output {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime
        .block_on(async { tokio::time::timeout(HANG, future).await })
        .unwrap_or_else(|_| panic!("hung: {what}"))
}

#[allow(clippy::type_complexity)]
struct Made {
    sleeps: Vec<Sleep>,
    timeouts: Vec<std::pin::Pin<Box<tokio_wheel::Timeout<std::future::Pending<()>>>>>,
    jobs: Vec<JobHandle<u32>>,
    after_stop: usize,
}

#[test]
fn shutdown_while_threads_keep_registering_resolves_everything() {
    let runtime = two_workers();
    let wheel = runtime.block_on(async { Wheel::builder().timer_shards(4).build() });
    let started = Arc::new(Barrier::new(THREADS + 1));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (wheel, handle, started) =
                (wheel.clone(), runtime.handle().clone(), started.clone());
            std::thread::spawn(move || {
                let _entered = handle.enter();
                let mut made = Made {
                    sleeps: Vec::new(),
                    timeouts: Vec::new(),
                    jobs: Vec::new(),
                    after_stop: 0,
                };
                let mut round = 0u32;
                // Keeps making timers until 50 rounds after it saw the wheel stopped.
                while made.after_stop < 50 {
                    if round == 20 {
                        started.wait();
                    }
                    let stopped = wheel.is_shutdown();
                    let far = Duration::from_secs(3_600);
                    let mut sleep = wheel.sleep(far);
                    let first = poll_once(&mut sleep);
                    if stopped {
                        // Refused: resolves at once.
                        assert_eq!(first, Poll::Ready(()), "a sleep made after shutdown");
                    }
                    made.sleeps.push(sleep);
                    let mut timeout = Box::pin(wheel.timeout(far, std::future::pending::<()>()));
                    let first = poll_once(timeout.as_mut());
                    if stopped {
                        match first {
                            Poll::Ready(Err(elapsed)) => assert!(elapsed.is_shutdown()),
                            other => panic!("a timeout made after shutdown: {other:?}"),
                        }
                    }
                    made.timeouts.push(timeout);
                    let job = wheel.spawn_after(far, async move { round });
                    if stopped {
                        assert!(job.is_finished(), "a job made after shutdown is pending");
                    }
                    made.jobs.push(job);
                    if stopped {
                        made.after_stop += 1;
                    }
                    round += 1;
                }
                made
            })
        })
        .collect();
    started.wait();
    runtime.block_on(async {
        tokio::time::timeout(HANG, wheel.shutdown())
            .await
            .expect("shutdown hung");
    });
    assert!(wheel.is_shutdown());
    let mut total = 0;
    for thread in threads {
        let made = thread.join().unwrap();
        for mut sleep in made.sleeps {
            assert_eq!(poll_once(&mut sleep), Poll::Ready(()));
            total += 1;
        }
        for mut timeout in made.timeouts {
            match poll_once(timeout.as_mut()) {
                Poll::Ready(Err(elapsed)) => assert!(elapsed.is_shutdown()),
                other => panic!("timeout after shutdown: {other:?}"),
            }
        }
        for job in made.jobs {
            assert!(job.is_finished());
            assert_eq!(
                block_on_guarded("job after shutdown", job),
                Err(JobError::Shutdown)
            );
        }
    }
    assert!(total >= THREADS * 70);
    let stats = wheel.stats();
    assert_eq!(stats.actors, 0, "{stats:?}");
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(stats.inserted, stats.fired + stats.cancelled, "{stats:?}");
}

#[test]
fn runtime_dropped_with_timers_pending_on_every_shard() {
    let runtime = two_workers();
    let wheel = runtime.block_on(async { Wheel::builder().timer_shards(4).build() });
    let stopped = wheel.stopped();
    let ran = Arc::new(AtomicUsize::new(0));
    let made: Vec<(Sleep, _, JobHandle<()>, tokio_wheel::Interval)> = (0..THREADS)
        .map(|_| {
            let (wheel, handle, ran) = (wheel.clone(), runtime.handle().clone(), ran.clone());
            std::thread::spawn(move || {
                let _entered = handle.enter();
                let far = Duration::from_secs(3_600);
                let mut sleep = wheel.sleep(far);
                assert!(poll_once(&mut sleep).is_pending());
                let mut timeout = Box::pin(wheel.timeout(far, std::future::pending::<()>()));
                assert!(poll_once(timeout.as_mut()).is_pending());
                let job = wheel.spawn_after(far, async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                });
                let mut interval = wheel.interval_at(Instant::now() + far, far);
                assert!(poll_once(interval.tick()).is_pending());
                (sleep, timeout, job, interval)
            })
            .join()
            .unwrap()
        })
        .collect();
    runtime.block_on(wheel.flush());
    assert_eq!(wheel.stats().pending, 4 * THREADS as u64);
    drop(runtime);
    assert!(wheel.is_shutdown());
    block_on_guarded("stopped()", stopped);
    for (mut sleep, mut timeout, job, mut interval) in made {
        assert_eq!(poll_once(&mut sleep), Poll::Ready(()));
        assert!(sleep.is_elapsed());
        match poll_once(timeout.as_mut()) {
            Poll::Ready(Err(elapsed)) => assert!(elapsed.is_shutdown()),
            other => panic!("timeout after the runtime went: {other:?}"),
        }
        assert_eq!(block_on_guarded("job", job), Err(JobError::Shutdown));
        assert!(poll_once(interval.tick()).is_ready());
        assert_eq!(block_on_guarded("interval stream", interval.next()), None);
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    // Calls on the stopped wheel, from a plain thread and from another runtime: prompt.
    let mut sleep = wheel.sleep(Duration::from_secs(5));
    assert_eq!(poll_once(&mut sleep), Poll::Ready(()));
    let job = wheel.spawn_after(Duration::from_secs(5), async { 1 });
    assert!(job.is_finished());
    assert_eq!(
        block_on_guarded("job on a stopped wheel", job),
        Err(JobError::Shutdown)
    );
    block_on_guarded("flush on a stopped wheel", wheel.flush());
    block_on_guarded("shutdown on a stopped wheel", wheel.shutdown());
    let (timers, _expired) = wheel.keyed::<u32, u32>();
    timers.set(1, 1, Duration::from_secs(1));
    assert_eq!(block_on_guarded("len on a stopped wheel", timers.len()), 0);
    let stats = wheel.stats();
    assert_eq!(stats.actors, 0, "{stats:?}");
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(stats.inserted, stats.fired + stats.cancelled, "{stats:?}");
}

#[test]
fn every_shard_exits_on_its_own_after_its_detached_jobs_fire() {
    let runtime = two_workers();
    let wheel = runtime.block_on(async { Wheel::builder().timer_shards(4).build() });
    let ran = Arc::new(AtomicUsize::new(0));
    let early = Arc::new(AtomicBool::new(false));
    let start = runtime.block_on(async { Instant::now() });
    for index in 0..THREADS as u64 {
        let (wheel, handle) = (wheel.clone(), runtime.handle().clone());
        let (ran, early) = (ran.clone(), early.clone());
        std::thread::spawn(move || {
            let _entered = handle.enter();
            for k in 0..5u64 {
                let due = start + Duration::from_millis(20 + 3 * index + k);
                let (ran, early) = (ran.clone(), early.clone());
                // Detached at once: the handle is dropped here.
                drop(wheel.spawn_at(due, async move {
                    if Instant::now() < due {
                        early.store(true, Ordering::SeqCst);
                    }
                    ran.fetch_add(1, Ordering::SeqCst);
                }));
            }
            // This thread's wheel handle goes with it.
        })
        .join()
        .unwrap();
    }
    drop(wheel);
    wait_until("every actor and job task to end", || {
        runtime.metrics().num_alive_tasks() == 0
    });
    assert_eq!(
        ran.load(Ordering::SeqCst),
        5 * THREADS,
        "a detached job never ran"
    );
    assert!(!early.load(Ordering::SeqCst), "a detached job ran early");
}

#[tokio::test(start_paused = true)]
async fn paused_shutdown_resolves_every_lane_and_interval_streams_end() {
    for shards in [2usize, 5, 8] {
        let wheel = Wheel::builder().timer_shards(shards).build();
        let handle = tokio::runtime::Handle::current();
        let made: Vec<(Sleep, tokio_wheel::Interval)> = (0..16)
            .map(|i| {
                let (wheel, handle) = (wheel.clone(), handle.clone());
                std::thread::spawn(move || {
                    let _entered = handle.enter();
                    let mut sleep = wheel.sleep(Duration::from_secs(10 + i));
                    assert!(poll_once(&mut sleep).is_pending());
                    let mut interval = wheel.interval(Duration::from_secs(1));
                    // The first tick is at once; the second registers on this lane.
                    assert!(poll_once(interval.tick()).is_ready());
                    assert!(poll_once(interval.tick()).is_pending());
                    (sleep, interval)
                })
                .join()
                .unwrap()
            })
            .collect();
        wheel.flush().await;
        assert_eq!(wheel.stats().pending, 32, "shards {shards}");
        wheel.shutdown().await;
        let start = Instant::now();
        for (sleep, mut interval) in made {
            sleep.await;
            assert_eq!(interval.next().await, None);
        }
        // Resolved by shutdown, not by time passing.
        assert_eq!(Instant::now(), start);
        let stats = wheel.stats();
        assert_eq!(stats.actors, 0, "shards {shards}: {stats:?}");
        assert_eq!(stats.pending, 0, "shards {shards}: {stats:?}");
        assert_eq!(
            stats.inserted,
            stats.fired + stats.cancelled,
            "shards {shards}: {stats:?}"
        );
    }
}

#[test]
fn the_actors_runtime_dropped_wakes_tasks_waiting_on_every_lane_elsewhere() {
    // The wheel's actors and jobs on `actors`; the waiting tasks on `users`, another runtime.
    let actors = two_workers();
    let users = two_workers();
    let wheel = Wheel::builder()
        .runtime(actors.handle().clone())
        .timer_shards(4)
        .build();
    let registered = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (wheel, registered) = (wheel.clone(), registered.clone());
            users.spawn(async move {
                let far = Duration::from_secs(3_600);
                let periodic =
                    wheel.spawn_every(far, tokio_wheel::Schedule::FixedRate, || async {});
                let job = wheel.spawn_after(far, async { 1 });
                let mut sleep = std::pin::pin!(wheel.sleep(far));
                let timeout = wheel.timeout(far, std::future::pending::<()>());
                let mut timeout = std::pin::pin!(timeout);
                // Registered on this worker's lane before counting in.
                assert!(futures::poll!(sleep.as_mut()).is_pending());
                assert!(futures::poll!(timeout.as_mut()).is_pending());
                registered.fetch_add(1, Ordering::SeqCst);
                sleep.await;
                let elapsed = timeout.await.unwrap_err();
                assert!(elapsed.is_shutdown(), "task {i}");
                assert_eq!(job.await, Err(JobError::Shutdown), "task {i}");
                assert_eq!(periodic.await, Err(JobError::Shutdown), "task {i}");
            })
        })
        .collect();
    wait_until("every task registered", || {
        registered.load(Ordering::SeqCst) == 32
    });
    drop(actors);
    users.block_on(async {
        for task in tasks {
            tokio::time::timeout(HANG, task)
                .await
                .expect("a task waiting on the wheel hung after its runtime went")
                .unwrap();
        }
    });
    let stats = wheel.stats();
    assert_eq!(stats.actors, 0, "{stats:?}");
    assert_eq!(stats.pending, 0, "{stats:?}");
}
