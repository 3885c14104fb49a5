//! Outside attack on the wheel's per-thread context copies and the inbox's once-per-turn
//! pending flag, through the public API only (API.md "Starting a wheel", §1, §2, "Observing
//! and stopping"). A `Sleep`, `Timeout`, `Interval` or job holds the copy of the thread that
//! made it: these tests make futures on many threads, move them to others, drop every `Wheel`
//! handle while they are pending, shut down, drop runtimes, flood, and make and drop many
//! wheels, asserting outcomes only (completion, never early, counts). Real waits are hang
//! guards, not timing figures.
//!
//! The file runs one test at a time (`SERIAL`): the counting allocator's figure is the whole
//! process's, and the machine has two cores.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, MutexGuard, mpsc};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::StreamExt;
use tokio::runtime::{Handle, Runtime};
use tokio::time::Instant;
use tokio_wheel::{
    Interval, JobError, JobHandle, MissedTickBehavior, Schedule, Sleep, Timeout, Wheel,
};

#[path = "support/counting.rs"]
mod counting;
use counting::{Counting, LIVE};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A hang guard: nothing here should take more than a fraction of it.
const HANG: Duration = Duration::from_secs(20);

/// One test at a time (one heap, two cores).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn multi(workers: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

fn current() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `future` on `runtime`, failing (not hanging) if it takes longer than [`HANG`].
fn guarded<F: Future>(runtime: &Runtime, what: &str, future: F) -> F::Output {
    runtime.block_on(async {
        tokio::time::timeout(HANG, future)
            .await
            .unwrap_or_else(|_| panic!("hung: {what}"))
    })
}

/// The same from a thread that is not the runtime's driver (through its handle).
fn guarded_on<F: Future>(handle: &Handle, what: &str, future: F) -> F::Output {
    handle.block_on(async {
        tokio::time::timeout(HANG, future)
            .await
            .unwrap_or_else(|_| panic!("hung: {what}"))
    })
}

/// Waits in real time until `done`, failing after [`HANG`].
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let until = std::time::Instant::now() + HANG;
    while !done() {
        assert!(std::time::Instant::now() < until, "hung: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn poll_noop<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(Waker::noop()))
}

/// Once every command is applied (`flush`), the counters add up and nothing is pending.
fn assert_stats_settled(wheel: &Wheel, what: &str) {
    let stats = wheel.stats();
    assert_eq!(
        stats.inserted,
        stats.fired + stats.cancelled + stats.pending,
        "{what}: counters do not add up: {stats:?}"
    );
    assert_eq!(stats.pending, 0, "{what}: timers left pending: {stats:?}");
}

type PendingTimeout = Pin<Box<Timeout<std::future::Pending<()>>>>;

/// What one producer thread made, to be awaited elsewhere.
struct Made {
    unpolled: Sleep,
    polled: Sleep,
    timeout: PendingTimeout,
    timeout_at: PendingTimeout,
    interval: Interval,
    job: JobHandle<Instant>,
}

/// Check 1: futures and jobs made on 16 threads (so on every copy of the context), all `Wheel`
/// handles dropped while they are pending: each completes at its deadline, never early, the
/// detached jobs still run (one of them awaiting a sleep made on its producer thread), a timer made on another thread and first polled after everything
/// else finished still waits for its deadline (it is not resolved as if the wheel had
/// stopped), and once nothing is left the wheel stops by itself.
#[test]
fn futures_made_on_many_threads_outlive_every_handle() {
    let _serial = serial();
    outlive_every_handle(false);
}

/// Check 1b: the same with the actors on the wheel's own thread.
#[test]
fn futures_made_on_many_threads_outlive_every_handle_own_thread() {
    let _serial = serial();
    outlive_every_handle(true);
}

fn outlive_every_handle(own_thread: bool) {
    const THREADS: usize = 16;
    let runtime = multi(4);
    let wheel = runtime.block_on(async {
        Wheel::builder()
            .timer_shards(2)
            .own_thread(own_thread)
            .build()
    });
    let stopped = wheel.stopped();
    let detached_ran = Arc::new(AtomicUsize::new(0));
    let early = Arc::new(AtomicUsize::new(0));

    let (sender, made) = mpsc::channel::<Made>();
    let producers: Vec<_> = (0..THREADS)
        .map(|i| {
            let (wheel, sender, handle) = (wheel.clone(), sender.clone(), runtime.handle().clone());
            let (detached_ran, early) = (detached_ran.clone(), early.clone());
            std::thread::spawn(move || {
                let _entered = handle.enter();
                let ms = |base: u64| Duration::from_millis(base + 7 * i as u64);
                let mut polled = wheel.sleep(ms(40));
                let _ = poll_noop(&mut polled);
                let (ran, late_early) = (detached_ran.clone(), early.clone());
                let detached_deadline = Instant::now() + ms(30);
                drop(wheel.spawn_at(detached_deadline, async move {
                    if Instant::now() < detached_deadline {
                        early.fetch_add(1, Ordering::SeqCst);
                    }
                    detached_ran.fetch_add(1, Ordering::SeqCst);
                }));
                // A detached job whose future holds a sleep made here: it may be the last
                // thing that needs the wheel.
                let inner = wheel.sleep(ms(90));
                drop(wheel.spawn_after(ms(10), async move {
                    let deadline = inner.deadline();
                    inner.await;
                    if Instant::now() < deadline {
                        late_early.fetch_add(1, Ordering::SeqCst);
                    }
                    ran.fetch_add(1, Ordering::SeqCst);
                }));
                let job_deadline = Instant::now() + ms(50);
                let made = Made {
                    unpolled: wheel.sleep(ms(20)),
                    polled,
                    timeout: Box::pin(wheel.timeout(ms(30), std::future::pending())),
                    timeout_at: Box::pin(
                        wheel.timeout_at(Instant::now() + ms(60), std::future::pending()),
                    ),
                    interval: wheel.interval_at(Instant::now() + ms(10), Duration::from_millis(9)),
                    job: wheel.spawn_at(job_deadline, async { Instant::now() }),
                };
                sender.send(made).unwrap();
            })
        })
        .collect();
    drop(sender);
    for producer in producers {
        producer.join().unwrap();
    }
    let made: Vec<Made> = made.iter().collect();
    assert_eq!(made.len(), THREADS);

    // The last timer, made on its own thread and left unpolled until the rest is over.
    let (late_sleep, late_timeout) = {
        let (wheel, handle) = (wheel.clone(), runtime.handle().clone());
        std::thread::spawn(move || {
            let _entered = handle.enter();
            let deadline = Instant::now() + Duration::from_millis(900);
            let sleep = wheel.sleep_until(deadline);
            let timeout = Box::pin(wheel.timeout_at(deadline, std::future::pending::<()>()));
            (sleep, timeout)
        })
        .join()
        .unwrap()
    };

    drop(wheel); // every `Wheel` handle is gone from here
    assert!(!stopped.is_stopped(), "stopped with futures still pending");

    let tasks: Vec<_> = made
        .into_iter()
        .map(|made| {
            let early = early.clone();
            runtime.spawn(async move {
                let Made {
                    unpolled,
                    polled,
                    mut timeout,
                    mut timeout_at,
                    mut interval,
                    job,
                } = made;
                let check = |deadline: Instant| {
                    if Instant::now() < deadline {
                        early.fetch_add(1, Ordering::SeqCst);
                    }
                };
                let deadline = unpolled.deadline();
                unpolled.await;
                check(deadline);
                let deadline = polled.deadline();
                polled.await;
                check(deadline);
                let outcome = timeout.as_mut().await;
                assert!(matches!(outcome, Err(e) if !e.is_shutdown()), "{outcome:?}");
                check(timeout.deadline().expect("polled: it has a deadline"));
                let outcome = timeout_at.as_mut().await;
                assert!(matches!(outcome, Err(e) if !e.is_shutdown()), "{outcome:?}");
                check(timeout_at.deadline().expect("it has a deadline"));
                for _ in 0..3 {
                    let tick = interval.tick().await;
                    check(tick);
                }
                let job_deadline = job.deadline();
                let ran_at = job
                    .await
                    .expect("a job made before every handle dropped runs");
                assert!(ran_at >= job_deadline, "job ran early");
            })
        })
        .collect();
    guarded(&runtime, "futures made on other threads", async {
        for task in tasks {
            task.await.unwrap();
        }
    });
    wait_until("detached jobs", || {
        detached_ran.load(Ordering::SeqCst) == 2 * THREADS
    });

    // Give a wrongly quitting actor time to go: the late timers still hold the wheel.
    guarded(&runtime, "pause", async {
        tokio::time::sleep(Duration::from_millis(50)).await
    });
    assert!(!stopped.is_stopped(), "stopped while a sleep is still held");
    let deadline = late_sleep.deadline();
    let late_outcome = guarded(&runtime, "late timers", async move {
        late_sleep.await;
        let slept_until = Instant::now();
        let outcome = late_timeout.await;
        (slept_until, outcome)
    });
    assert!(late_outcome.0 >= deadline, "late sleep completed early");
    assert!(
        matches!(late_outcome.1, Err(e) if !e.is_shutdown()),
        "late timeout resolved as shut down: {:?}",
        late_outcome.1
    );
    assert_eq!(early.load(Ordering::SeqCst), 0, "timers completed early");
    // Nothing is left: the actors exit on their own.
    guarded(&runtime, "wheel stops by itself", stopped.clone());
}

/// Check 2: one sleep per iteration, made on thread A, first polled on thread B, reset on
/// thread C (later, earlier, into the past), awaited (some re-armed after completing) and
/// dropped on a runtime worker D — or dropped pending there: each completes at its last
/// deadline, never before it, and after `flush` the counters add up with nothing pending.
#[test]
fn a_sleep_made_polled_reset_and_dropped_on_four_threads() {
    let _serial = serial();
    const SLEEPS: usize = 2_000;
    let runtime = multi(4);
    let wheel = runtime.block_on(async { Wheel::builder().timer_shards(2).build() });
    let (to_b, at_b) = mpsc::channel::<(usize, Sleep)>();
    let (to_c, at_c) = mpsc::channel::<(usize, Sleep)>();
    let (to_d, at_d) = mpsc::channel::<(usize, Sleep)>();
    let a = {
        let wheel = wheel.clone();
        std::thread::spawn(move || {
            for i in 0..SLEEPS {
                to_b.send((i, wheel.sleep(Duration::from_millis(200))))
                    .unwrap();
            }
        })
    };
    let b = std::thread::spawn(move || {
        for (i, mut sleep) in at_b {
            let _ = poll_noop(&mut sleep);
            to_c.send((i, sleep)).unwrap();
        }
    });
    let c = std::thread::spawn(move || {
        for (i, mut sleep) in at_c {
            let now = Instant::now();
            let deadline = match i % 4 {
                0 => now + Duration::from_millis(260),
                1 => now + Duration::from_millis(3 + (i % 7) as u64),
                2 => now - Duration::from_millis(1),
                _ => now + Duration::from_millis(15),
            };
            Pin::new(&mut sleep).reset(deadline);
            to_d.send((i, sleep)).unwrap();
        }
    });
    a.join().unwrap();
    b.join().unwrap();
    c.join().unwrap();
    let early = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = at_d
        .iter()
        .map(|(i, mut sleep)| {
            let early = early.clone();
            runtime.spawn(async move {
                if i % 5 == 4 {
                    // Dropped pending on this worker.
                    let _ = poll_noop(&mut sleep);
                    return;
                }
                let deadline = sleep.deadline();
                (&mut sleep).await;
                if Instant::now() < deadline {
                    early.fetch_add(1, Ordering::SeqCst);
                }
                if i % 4 == 3 {
                    // Re-armed after completing, on yet another thread's copy.
                    let again = Instant::now() + Duration::from_millis(5);
                    Pin::new(&mut sleep).reset(again);
                    (&mut sleep).await;
                    if Instant::now() < again {
                        early.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    guarded(&runtime, "sleeps passed between threads", async {
        for task in tasks {
            task.await.unwrap();
        }
        wheel.flush().await;
    });
    assert_eq!(early.load(Ordering::SeqCst), 0, "sleeps completed early");
    assert_stats_settled(&wheel, "four threads");
}

/// Check 3: shutdown with futures made on 16 threads, some being awaited on runtime tasks,
/// some never polled until after it: sleeps and interval ticks resolve, timeouts are
/// `Elapsed` with `is_shutdown()`, jobs not started are `JobError::Shutdown` (their futures
/// never run), periodic jobs end `Shutdown`; what is made after shutdown on yet another
/// thread is refused at once. Nothing hangs.
#[test]
fn shutdown_resolves_futures_made_on_many_threads() {
    let _serial = serial();
    const THREADS: usize = 16;
    let runtime = multi(4);
    let wheel = runtime.block_on(async { Wheel::new() });
    let job_ran = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicUsize::new(0));
    let hour = Duration::from_secs(3_600);

    let producers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (wheel, handle) = (wheel.clone(), runtime.handle().clone());
            let (job_ran, started) = (job_ran.clone(), started.clone());
            std::thread::spawn(move || {
                let _entered = handle.enter();
                let mut polled = wheel.sleep(hour);
                assert!(poll_noop(&mut polled).is_pending());
                let unpolled = wheel.sleep(hour);
                let mut timeout = Box::pin(wheel.timeout(hour, std::future::pending::<()>()));
                assert!(poll_noop(&mut timeout).is_pending());
                let unpolled_timeout = Box::pin(wheel.timeout(hour, std::future::pending::<()>()));
                let mut interval = wheel.interval(hour);
                assert!(poll_noop(&mut Box::pin(interval.tick())).is_ready());
                let ran = job_ran.clone();
                let job = wheel.spawn_after(hour, async move { ran.store(true, Ordering::SeqCst) });
                let ran = job_ran.clone();
                let every = wheel.spawn_every(hour, Schedule::FixedRate, move || {
                    let ran = ran.clone();
                    async move { ran.store(true, Ordering::SeqCst) }
                });
                let awaited = handle.spawn({
                    let started = started.clone();
                    async move {
                        started.fetch_add(1, Ordering::SeqCst);
                        polled.await;
                        let outcome = timeout.await;
                        assert!(matches!(outcome, Err(e) if e.is_shutdown()), "{outcome:?}");
                        interval.tick().await;
                        assert_eq!(job.await, Err(JobError::Shutdown));
                        assert_eq!(every.await, Err(JobError::Shutdown));
                    }
                });
                (awaited, unpolled, unpolled_timeout)
            })
        })
        .collect();
    let made: Vec<_> = producers.into_iter().map(|p| p.join().unwrap()).collect();
    wait_until("tasks started", || {
        started.load(Ordering::SeqCst) == THREADS
    });
    guarded(&runtime, "shutdown", wheel.shutdown());
    assert!(wheel.is_shutdown());

    // Made after shutdown, on a thread that never made a timer before.
    let (after_sleep, after_timeout, after_job) = {
        let (wheel, handle) = (wheel.clone(), runtime.handle().clone());
        std::thread::spawn(move || {
            let _entered = handle.enter();
            (
                wheel.sleep(hour),
                Box::pin(wheel.timeout(hour, std::future::pending::<()>())),
                wheel.spawn_after(hour, async { 1 }),
            )
        })
        .join()
        .unwrap()
    };
    guarded(&runtime, "futures after shutdown", async move {
        for (awaited, unpolled, unpolled_timeout) in made {
            awaited.await.unwrap();
            unpolled.await;
            let outcome = unpolled_timeout.await;
            assert!(matches!(outcome, Err(e) if e.is_shutdown()), "{outcome:?}");
        }
        after_sleep.await;
        let outcome = after_timeout.await;
        assert!(matches!(outcome, Err(e) if e.is_shutdown()), "{outcome:?}");
        assert_eq!(after_job.await, Err(JobError::Shutdown));
    });
    assert!(!job_ran.load(Ordering::SeqCst), "a job ran after shutdown");
}

/// Check 4: a second runtime's tasks make sleeps, timeouts and detached jobs on a wheel that
/// lives on the first one, then that runtime is dropped with them pending: the wheel goes on
/// (new sleeps complete, never early), the detached jobs run on the wheel's runtime, the
/// counters settle with nothing pending, and the wheel stops by itself once dropped.
#[test]
fn a_runtime_that_made_timers_goes_away_while_the_wheel_lives_on() {
    let _serial = serial();
    const TASKS: usize = 32;
    let home = multi(2);
    let wheel = home.block_on(async { Wheel::builder().timer_shards(2).build() });
    let stopped = wheel.stopped();
    let jobs_ran = Arc::new(AtomicUsize::new(0));
    let early = Arc::new(AtomicUsize::new(0));
    {
        let other = multi(4);
        let ready = Arc::new(AtomicUsize::new(0));
        for i in 0..TASKS {
            let (wheel, jobs_ran, early, ready) = (
                wheel.clone(),
                jobs_ran.clone(),
                early.clone(),
                ready.clone(),
            );
            other.spawn(async move {
                let deadline = Instant::now() + Duration::from_millis(2 + (i % 5) as u64);
                wheel.sleep_until(deadline).await;
                if Instant::now() < deadline {
                    early.fetch_add(1, Ordering::SeqCst);
                }
                let job_deadline = Instant::now() + Duration::from_millis(20 + i as u64);
                drop(wheel.spawn_at(job_deadline, async move {
                    if Instant::now() < job_deadline {
                        early.fetch_add(1, Ordering::SeqCst);
                    }
                    jobs_ran.fetch_add(1, Ordering::SeqCst);
                }));
                let held = wheel.sleep(Duration::from_secs(3_600));
                let timeout =
                    wheel.timeout(Duration::from_secs(3_600), std::future::pending::<()>());
                drop(wheel);
                ready.fetch_add(1, Ordering::SeqCst);
                let _ = tokio::join!(held, timeout);
            });
        }
        wait_until("other runtime's tasks", || {
            ready.load(Ordering::SeqCst) == TASKS
        });
        drop(other); // its tasks, and the timers they hold, are dropped
    }
    guarded(&home, "the wheel after the other runtime went", async {
        let deadline = Instant::now() + Duration::from_millis(10);
        wheel.sleep_until(deadline).await;
        assert!(Instant::now() >= deadline, "sleep completed early");
    });
    wait_until("detached jobs made on the other runtime", || {
        jobs_ran.load(Ordering::SeqCst) == TASKS
    });
    assert_eq!(early.load(Ordering::SeqCst), 0, "timers completed early");
    guarded(&home, "flush", wheel.flush());
    assert!(
        !wheel.is_shutdown(),
        "the wheel stopped with another runtime"
    );
    assert_stats_settled(&wheel, "other runtime dropped");
    drop(wheel);
    guarded(&home, "wheel stops by itself", stopped);
}

/// A flood of sleeps made, registered and dropped on `THREADS` threads, while a task on the
/// wheel's runtime awaits short sleeps one after another and the producers themselves block on
/// a short one now and then: every short sleep completes (no missed wake-up), never early; a
/// `flush` made during and after the flood returns; the counters settle.
fn flood_with_probes(runtime: &Runtime, wheel: &Wheel, what: &str) {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 50_000;
    let early = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(THREADS + 1));
    let producers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (wheel, handle) = (wheel.clone(), runtime.handle().clone());
            let (early, start) = (early.clone(), start.clone());
            std::thread::spawn(move || {
                let _entered = handle.enter();
                start.wait();
                let mut kept = Vec::new();
                for i in 0..PER_THREAD {
                    let far = Duration::from_secs(60 + (i % 100) as u64);
                    let mut sleep = wheel.sleep(far);
                    let _ = poll_noop(&mut sleep);
                    if i % 64 == t {
                        kept.push(sleep); // released later, behind other commands
                    } else {
                        drop(sleep); // withdrawn: the shard may go empty again
                    }
                    if i % 2_000 == 1_999 {
                        // The same shard, flagged before, now carries a near deadline.
                        let deadline = Instant::now() + Duration::from_millis(1);
                        let probe = wheel.sleep_until(deadline);
                        futures::executor::block_on(async {
                            tokio::time::timeout(HANG, probe)
                                .await
                                .expect("hung: a producer's short sleep")
                        });
                        if Instant::now() < deadline {
                            early.fetch_add(1, Ordering::SeqCst);
                        }
                        kept.clear();
                    }
                }
            })
        })
        .collect();
    let probe = {
        let (wheel, early, done) = (wheel.clone(), early.clone(), done.clone());
        runtime.spawn(async move {
            let mut probes = 0u32;
            while !done.load(Ordering::SeqCst) || probes < 50 {
                let deadline = Instant::now() + Duration::from_millis(1 + (probes % 3) as u64);
                tokio::time::timeout(HANG, wheel.sleep_until(deadline))
                    .await
                    .expect("hung: the probe's short sleep");
                if Instant::now() < deadline {
                    early.fetch_add(1, Ordering::SeqCst);
                }
                probes += 1;
                if probes == 20 {
                    tokio::time::timeout(HANG, wheel.flush())
                        .await
                        .expect("hung: a flush during the flood");
                }
            }
            probes
        })
    };
    start.wait();
    for producer in producers {
        producer.join().unwrap();
    }
    done.store(true, Ordering::SeqCst);
    let probes = guarded(runtime, what, async {
        let probes = probe.await.unwrap();
        wheel.flush().await;
        probes
    });
    assert!(probes >= 50);
    assert_eq!(
        early.load(Ordering::SeqCst),
        0,
        "{what}: sleeps completed early"
    );
    assert_stats_settled(wheel, what);
}

/// Check 5a: the flood with probes, on a four-worker runtime with two timer shards.
#[test]
fn a_flood_from_many_threads_misses_no_wake_up_multi_thread() {
    let _serial = serial();
    let runtime = multi(4);
    let wheel = runtime.block_on(async { Wheel::builder().timer_shards(2).build() });
    flood_with_probes(&runtime, &wheel, "multi-thread flood");
}

/// Check 5b: the same with the actor on a current-thread runtime that the test thread drives.
#[test]
fn a_flood_from_many_threads_misses_no_wake_up_current_thread() {
    let _serial = serial();
    let runtime = current();
    let wheel = runtime.block_on(async { Wheel::new() });
    // Drive the runtime from this thread while the flood runs.
    let driver_done = Arc::new(AtomicBool::new(false));
    std::thread::scope(|scope| {
        let flood = scope.spawn(|| {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                flood_with_probes_on_handle(runtime.handle(), &wheel)
            }));
            driver_done.store(true, Ordering::SeqCst);
            outcome
        });
        runtime.block_on(async {
            while !driver_done.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        if let Err(panic) = flood.join().unwrap() {
            std::panic::resume_unwind(panic);
        }
    });
    guarded(&runtime, "flush", wheel.flush());
    assert_stats_settled(&wheel, "current-thread flood");
}

/// [`flood_with_probes`] for a current-thread runtime driven by another thread: the probe
/// task is spawned on it, everything else waits through the handle.
fn flood_with_probes_on_handle(handle: &Handle, wheel: &Wheel) {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 50_000;
    let early = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (wheel, handle, early) = (wheel.clone(), handle.clone(), early.clone());
            std::thread::spawn(move || {
                let _entered = handle.enter();
                for i in 0..PER_THREAD {
                    let mut sleep = wheel.sleep(Duration::from_secs(30 + (i % 50) as u64));
                    let _ = poll_noop(&mut sleep);
                    drop(sleep);
                    if i % 2_500 == 2_499 - t {
                        let deadline = Instant::now() + Duration::from_millis(1);
                        guarded_on(
                            &handle,
                            "a producer's short sleep",
                            wheel.sleep_until(deadline),
                        );
                        if Instant::now() < deadline {
                            early.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            })
        })
        .collect();
    let probe = {
        let (wheel, early, done) = (wheel.clone(), early.clone(), done.clone());
        handle.spawn(async move {
            let mut probes = 0u32;
            while !done.load(Ordering::SeqCst) || probes < 50 {
                let deadline = Instant::now() + Duration::from_millis(1);
                tokio::time::timeout(HANG, wheel.sleep_until(deadline))
                    .await
                    .expect("hung: the probe's short sleep");
                if Instant::now() < deadline {
                    early.fetch_add(1, Ordering::SeqCst);
                }
                probes += 1;
            }
            probes
        })
    };
    guarded_on(handle, "a flush during the flood", wheel.flush());
    for producer in producers {
        producer.join().unwrap();
    }
    done.store(true, Ordering::SeqCst);
    let probes = guarded_on(handle, "probe", probe).unwrap();
    assert!(probes >= 50);
    assert_eq!(early.load(Ordering::SeqCst), 0, "sleeps completed early");
}

/// Check 6: targets the once-per-turn pending flag: on each of several threads, a far sleep
/// registers (flagging the thread's shard), is dropped (withdrawn: the shard may be empty
/// again, still flagged) or kept, and a near sleep follows into the same shard; the thread
/// blocks on it. Each near sleep must complete, never early, with the actor idle in between
/// (the thread waits a moment now and then so the actor goes to sleep with nothing to do).
#[test]
fn a_near_sleep_after_a_withdrawn_far_one_on_the_same_thread_wakes_the_actor() {
    let _serial = serial();
    for runtime in [current(), multi(2)] {
        let wheel = runtime.block_on(async { Wheel::builder().timer_shards(2).build() });
        let handle = runtime.handle().clone();
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (wheel, handle) = (wheel.clone(), handle.clone());
                std::thread::spawn(move || {
                    let _entered = handle.enter();
                    let mut early = 0;
                    for i in 0..600u32 {
                        let mut far = wheel.sleep(Duration::from_secs(3_600));
                        let _ = poll_noop(&mut far);
                        let keep = (i + t) % 3 == 0;
                        let kept = if keep { Some(far) } else { None };
                        if i % 50 == 0 {
                            // Let the actor go idle with the far sleep's shard flagged or not.
                            std::thread::sleep(Duration::from_millis(12));
                        }
                        let deadline = Instant::now() + Duration::from_micros(300);
                        let near = wheel.sleep_until(deadline);
                        futures::executor::block_on(async {
                            tokio::time::timeout(HANG, near)
                                .await
                                .expect("hung: a near sleep after a far one")
                        });
                        if Instant::now() < deadline {
                            early += 1;
                        }
                        drop(kept);
                    }
                    early
                })
            })
            .collect();
        let stop_driver = stop.clone();
        let joiner = std::thread::spawn(move || {
            let early: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
            stop_driver.store(true, Ordering::SeqCst);
            early
        });
        // A current-thread runtime needs a driver.
        runtime.block_on(async {
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        assert_eq!(joiner.join().unwrap(), 0, "near sleeps completed early");
        guarded(&runtime, "flush", wheel.flush());
        assert_stats_settled(&wheel, "near after far");
    }
}

/// Check 7: paused time. Sleeps, timeouts and intervals made by spawned tasks and by threads
/// entered into the runtime (each on its own copy of the context), registered where they were
/// made: after each `advance`, one poll completes exactly those due by then, with no yield in
/// between, and none that is not due.
#[test]
fn paused_time_advance_then_poll_completes_every_due_timer_made_anywhere() {
    let _serial = serial();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let wheel = Wheel::builder().timer_shards(2).build();
        let start = Instant::now();
        let at = move |ms: u64| start + Duration::from_millis(ms);
        let mut sleeps: Vec<Sleep> = Vec::new();
        let mut timeouts: Vec<PendingTimeout> = Vec::new();
        // From spawned tasks (registered there).
        let mut tasks = Vec::new();
        for i in 0..16u64 {
            let wheel = wheel.clone();
            tasks.push(tokio::spawn(async move {
                let mut sleep = wheel.sleep_until(at(3 + 7 * i));
                assert!(poll_noop(&mut sleep).is_pending());
                let mut timeout = Box::pin(wheel.timeout_at(at(5 + 6 * i), std::future::pending()));
                assert!(poll_noop(&mut timeout).is_pending());
                (sleep, timeout)
            }));
        }
        for task in tasks {
            let (sleep, timeout) = task.await.unwrap();
            sleeps.push(sleep);
            timeouts.push(timeout);
        }
        // From threads entered into this runtime (its paused clock), registered there.
        let handle = Handle::current();
        let mut intervals: Vec<(Interval, Instant)> = Vec::new();
        let made: Vec<_> = (0..16u64)
            .map(|i| {
                let (wheel, handle) = (wheel.clone(), handle.clone());
                std::thread::spawn(move || {
                    let _entered = handle.enter();
                    let mut sleep = wheel.sleep_until(at(1 + 5 * i));
                    assert!(poll_noop(&mut sleep).is_pending());
                    let unpolled = wheel.sleep_until(at(2 + 9 * i));
                    let mut timeout =
                        Box::pin(wheel.timeout_at(at(4 + 8 * i), std::future::pending()));
                    assert!(poll_noop(&mut timeout).is_pending());
                    let mut interval = wheel.interval_at(at(3 + i), Duration::from_millis(11));
                    interval.set_missed_tick_behavior(MissedTickBehavior::Burst);
                    assert!(
                        interval
                            .poll_tick(&mut Context::from_waker(Waker::noop()))
                            .is_pending()
                    );
                    (sleep, unpolled, timeout, (interval, at(3 + i)))
                })
                .join()
                .unwrap()
            })
            .collect();
        for (sleep, unpolled, timeout, interval) in made {
            sleeps.push(sleep);
            sleeps.push(unpolled);
            timeouts.push(timeout);
            intervals.push(interval);
        }
        let mut sleeps: Vec<Option<Sleep>> = sleeps.into_iter().map(Some).collect();
        let mut timeouts: Vec<Option<PendingTimeout>> = timeouts.into_iter().map(Some).collect();
        let cx = &mut Context::from_waker(Waker::noop());
        for step in 1..=40u64 {
            tokio::time::advance(Duration::from_millis(4)).await;
            let now = Instant::now();
            for slot in sleeps.iter_mut() {
                let Some(sleep) = slot else { continue };
                let due = sleep.deadline() <= now;
                let ready = Pin::new(&mut *sleep).poll(cx).is_ready();
                assert_eq!(
                    ready,
                    due,
                    "step {step}: sleep due {:?}",
                    sleep.deadline() - start
                );
                if ready {
                    *slot = None;
                }
            }
            for slot in timeouts.iter_mut() {
                let Some(timeout) = slot else { continue };
                let deadline = timeout.deadline().expect("polled");
                let outcome = timeout.as_mut().poll(cx);
                assert_eq!(outcome.is_ready(), deadline <= now, "step {step}: timeout");
                if let Poll::Ready(outcome) = outcome {
                    assert!(matches!(outcome, Err(e) if !e.is_shutdown()), "{outcome:?}");
                    *slot = None;
                }
            }
            for (interval, next) in intervals.iter_mut() {
                // Burst (the default): every overdue tick is ready back to back.
                while *next <= now {
                    match interval.poll_tick(cx) {
                        Poll::Ready(tick) => assert_eq!(tick, *next, "step {step}"),
                        Poll::Pending => panic!("step {step}: a due interval tick is pending"),
                    }
                    *next += Duration::from_millis(11);
                }
                assert!(
                    interval.poll_tick(cx).is_pending(),
                    "step {step}: tick early"
                );
            }
        }
        assert!(sleeps.iter().all(Option::is_none), "sleeps left");
        assert!(timeouts.iter().all(Option::is_none), "timeouts left");
        drop(intervals);
        wheel.flush().await;
        assert_stats_settled(&wheel, "paused time");
    });
}

/// Check 8: jobs made on many threads, their handles moved to other threads that cancel,
/// reschedule, detach or await them: a cancelled job (`cancel()` true) never runs and its
/// handle says `Cancelled`; every other job runs exactly once, never before its last
/// deadline; the counters settle.
#[test]
fn jobs_made_on_one_thread_and_controlled_from_another() {
    let _serial = serial();
    const THREADS: usize = 16;
    const PER_THREAD: usize = 16;
    let runtime = multi(4);
    let wheel = runtime.block_on(async { Wheel::builder().timer_shards(2).build() });
    let jobs = THREADS * PER_THREAD;
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..jobs).map(|_| AtomicU32::new(0)).collect());
    let early = Arc::new(AtomicUsize::new(0));
    // Each job's deadline as last set (by its maker, or a successful reschedule).
    let deadlines: Arc<Vec<Mutex<Option<Instant>>>> =
        Arc::new((0..jobs).map(|_| Mutex::new(None)).collect());

    let made: Vec<Vec<(usize, JobHandle<()>)>> = (0..THREADS)
        .map(|t| {
            let (wheel, handle) = (wheel.clone(), runtime.handle().clone());
            let (runs, early, deadlines) = (runs.clone(), early.clone(), deadlines.clone());
            std::thread::spawn(move || {
                let _entered = handle.enter();
                (0..PER_THREAD)
                    .map(|j| {
                        let id = t * PER_THREAD + j;
                        let deadline =
                            Instant::now() + Duration::from_millis(30 + (id % 13) as u64);
                        *deadlines[id].lock().unwrap() = Some(deadline);
                        let (runs, early, deadlines) =
                            (runs.clone(), early.clone(), deadlines.clone());
                        let job = wheel.spawn_at(deadline, async move {
                            let due = deadlines[id].lock().unwrap().expect("set");
                            if Instant::now() < due {
                                early.fetch_add(1, Ordering::SeqCst);
                            }
                            runs[id].fetch_add(1, Ordering::SeqCst);
                        });
                        (id, job)
                    })
                    .collect()
            })
            .join()
            .unwrap()
        })
        .collect();
    let cancelled: Arc<Vec<AtomicBool>> =
        Arc::new((0..jobs).map(|_| AtomicBool::new(false)).collect());
    // Controllers: each takes another thread's handles.
    let controllers: Vec<_> = made
        .into_iter()
        .map(|handles| {
            let (handle, cancelled, deadlines) = (
                runtime.handle().clone(),
                cancelled.clone(),
                deadlines.clone(),
            );
            std::thread::spawn(move || {
                let _entered = handle.enter();
                let mut awaited = Vec::new();
                for (id, job) in handles {
                    match id % 4 {
                        0 => {
                            if job.cancel() {
                                cancelled[id].store(true, Ordering::SeqCst);
                            }
                            awaited.push((id, job));
                        }
                        1 => {
                            // The job reads its deadline under this lock: it sees the
                            // new one only if the move succeeded.
                            let later = Instant::now() + Duration::from_millis(60);
                            let mut due = deadlines[id].lock().unwrap();
                            if job.reschedule(later) {
                                *due = Some(later);
                            }
                            drop(due);
                            awaited.push((id, job));
                        }
                        2 => drop(job), // detached
                        _ => awaited.push((id, job)),
                    }
                }
                awaited
            })
        })
        .collect();
    let awaited: Vec<(usize, JobHandle<()>)> = controllers
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    let tasks: Vec<_> = awaited
        .into_iter()
        .map(|(id, job)| {
            let cancelled = cancelled.clone();
            runtime.spawn(async move {
                let outcome = job.await;
                if cancelled[id].load(Ordering::SeqCst) {
                    assert_eq!(outcome, Err(JobError::Cancelled), "job {id}");
                } else {
                    assert_eq!(outcome, Ok(()), "job {id}");
                }
            })
        })
        .collect();
    guarded(&runtime, "jobs", async {
        for task in tasks {
            task.await.unwrap();
        }
    });
    let expected: usize = (0..jobs)
        .filter(|&id| !cancelled[id].load(Ordering::SeqCst))
        .count();
    wait_until("every job not cancelled runs", || {
        runs.iter()
            .map(|r| r.load(Ordering::SeqCst) as usize)
            .sum::<usize>()
            >= expected
    });
    guarded(&runtime, "flush", wheel.flush());
    for id in 0..jobs {
        let ran = runs[id].load(Ordering::SeqCst);
        let want = u32::from(!cancelled[id].load(Ordering::SeqCst));
        assert_eq!(ran, want, "job {id} ran {ran} times");
    }
    assert_eq!(early.load(Ordering::SeqCst), 0, "jobs ran early");
    assert_stats_settled(&wheel, "jobs");
}

/// Check 9: a keyed set flooded with set/remove from 8 threads while a task sets a near key
/// and waits for it, over and over: each near key is delivered (no missed wake-up through the
/// pending flag, which keyed inboxes share), never early; `len` answers during and after.
#[test]
fn keyed_flood_from_many_threads_delivers_every_near_key() {
    let _serial = serial();
    const THREADS: usize = 8;
    const PER_THREAD: u64 = 10_000;
    const PROBE: u64 = u64::MAX;
    let runtime = multi(4);
    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, mut expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    let done = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..THREADS as u64)
        .map(|t| {
            let (timers, handle) = (timers.clone(), runtime.handle().clone());
            std::thread::spawn(move || {
                let _entered = handle.enter();
                for i in 0..PER_THREAD {
                    let key = t * PER_THREAD + i;
                    timers.set(key, i, Duration::from_secs(600));
                    timers.remove(&key);
                }
            })
        })
        .collect();
    let probe = {
        let (timers, done) = (timers.clone(), done.clone());
        runtime.spawn(async move {
            let mut probes = 0u32;
            while !done.load(Ordering::SeqCst) || probes < 20 {
                let deadline = Instant::now() + Duration::from_millis(1);
                timers.set_at(PROBE, u64::from(probes), deadline);
                let e = tokio::time::timeout(HANG, expired.next())
                    .await
                    .expect("hung: a near key")
                    .expect("stream ended");
                assert_eq!(*e.key(), PROBE);
                assert_eq!(*e.value(), u64::from(probes));
                assert!(!e.is_shutdown());
                assert!(Instant::now() >= deadline, "a key expired early");
                probes += 1;
                if probes == 10 {
                    let _ = tokio::time::timeout(HANG, timers.len())
                        .await
                        .expect("hung: len during the flood");
                }
            }
        })
    };
    for producer in producers {
        producer.join().unwrap();
    }
    done.store(true, Ordering::SeqCst);
    guarded(&runtime, "keyed probe", probe).unwrap();
    assert_eq!(guarded(&runtime, "len", timers.len()), 0);
}

/// What one thread's wheels left behind: their `stopped()` futures.
fn make_and_drop_wheels(
    handle: &Handle,
    per_thread: usize,
    ran: &Arc<AtomicUsize>,
) -> Vec<tokio_wheel::Stopped> {
    let _entered = handle.enter();
    (0..per_thread)
        .map(|i| {
            let wheel = Wheel::builder().timer_shards(1 + i % 2).build();
            let stopped = wheel.stopped();
            let mut far = wheel.sleep(Duration::from_secs(3_600));
            let _ = poll_noop(&mut far);
            let near = wheel.sleep(Duration::from_millis(1));
            let ran = ran.clone();
            drop(wheel.spawn_after(Duration::from_millis(1), async move {
                ran.fetch_add(1, Ordering::SeqCst);
            }));
            let held = wheel.sleep(Duration::from_millis(2));
            drop(wheel);
            guarded_on(handle, "a near sleep of a dropped wheel", async {
                near.await;
                held.await;
            });
            drop(far);
            stopped
        })
        .collect()
}

/// Check 10: many wheels made and dropped from many threads, each with sleeps and a detached
/// job: every wheel stops by itself (`stopped()` resolves), every job runs, and the heap comes
/// back to where it was after a warm-up (no wheel, copy or actor left behind).
#[test]
fn many_wheels_made_and_dropped_on_many_threads_leave_nothing_behind() {
    let _serial = serial();
    const THREADS: usize = 8;
    const PER_THREAD: usize = 12;
    const ROUNDS: usize = 8;
    let runtime = multi(2);
    let ran = Arc::new(AtomicUsize::new(0));
    let round = |runtime: &Runtime| {
        let before = ran.load(Ordering::SeqCst);
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                let (handle, ran) = (runtime.handle().clone(), ran.clone());
                std::thread::spawn(move || make_and_drop_wheels(&handle, PER_THREAD, &ran))
            })
            .collect();
        let stopped: Vec<_> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        guarded(runtime, "every dropped wheel stops", async {
            for stopped in stopped {
                stopped.await;
            }
        });
        wait_until("detached jobs of dropped wheels", || {
            ran.load(Ordering::SeqCst) == before + THREADS * PER_THREAD
        });
        // Let the runtime finish the tasks it just ran (their memory goes with them).
        guarded(runtime, "settle", async {
            tokio::time::sleep(Duration::from_millis(20)).await
        });
    };
    // The size of one live wheel, for scale.
    let before_one = LIVE.load(Ordering::SeqCst);
    let one = runtime.block_on(async { Wheel::new() });
    let one_wheel = LIVE.load(Ordering::SeqCst) - before_one;
    drop(one);
    for _ in 0..2 {
        round(&runtime);
    }
    let baseline = LIVE.load(Ordering::SeqCst);
    for _ in 0..ROUNDS {
        round(&runtime);
    }
    let grown = LIVE.load(Ordering::SeqCst) - baseline;
    let wheels = (ROUNDS * THREADS * PER_THREAD) as isize;
    // Leaking even a tenth of a wheel each time would show many times over.
    let slack = (128 * 1024).min(wheels * one_wheel / 10);
    assert!(
        grown < slack,
        "heap grew {grown} bytes over {wheels} wheels (one wheel: {one_wheel} bytes, slack {slack})"
    );
}

/// Check 11: the pending flag under paused time, where lateness is exact. While the runtime's
/// one thread alternates between the actor and a task that only yields (so the clock stands
/// still and never auto-advances), four threads register and withdraw far sleeps and file
/// near jobs and sleeps into the same shards, racing the actor's turns. Then the runtime goes
/// idle and auto-advances to the actor's alarm: each job and sleep must complete on its own
/// tick — a command the actor failed to notice would only be seen at its next look (a lazy
/// look, 10 ms on) or never, and complete late on the paused clock.
#[test]
fn paused_time_near_timers_sent_during_actor_turns_fire_on_their_tick() {
    let _serial = serial();
    const ROUNDS: usize = 150;
    const THREADS: usize = 4;
    const PER_THREAD: u64 = 30;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let wheel = Wheel::builder()
            .tick(Duration::from_micros(100))
            .timer_shards(2)
            .build();
        // The wheel's tick, plus tokio's millisecond grid the actor's alarm sits on.
        let slack = wheel.tick() + Duration::from_millis(1);
        let handle = Handle::current();
        for round in 0..ROUNDS {
            let finished = Arc::new(AtomicUsize::new(0));
            let threads: Vec<_> = (0..THREADS as u64)
                .map(|t| {
                    let (wheel, handle, finished) =
                        (wheel.clone(), handle.clone(), finished.clone());
                    std::thread::spawn(move || {
                        let _entered = handle.enter();
                        let mut kept = Vec::new();
                        let mut jobs = Vec::new();
                        let mut sleeps = Vec::new();
                        let start = Instant::now(); // the clock stands still meanwhile
                        for i in 0..PER_THREAD {
                            let mut far = wheel.sleep(Duration::from_secs(3_600));
                            let _ = poll_noop(&mut far);
                            if (i + t) % 4 == 0 {
                                kept.push(far);
                            } else {
                                drop(far); // withdrawn: the shard may be empty again
                            }
                            // Deadlines fall as the round goes on, so each is often the
                            // earliest the actor knows of. A sleep just before it is filed and
                            // dropped: applying its release moves the actor's next look later
                            // again, racing the job sent right after it.
                            let step = (i * THREADS as u64 + t) * 100;
                            let deadline = start + Duration::from_micros(13_000 - step);
                            let mut before =
                                wheel.sleep_until(deadline - Duration::from_micros(50));
                            let _ = poll_noop(&mut before);
                            for _ in 0..(i % 4) * 500 {
                                std::hint::spin_loop();
                            }
                            drop(before);
                            jobs.push(wheel.spawn_at(deadline, async { Instant::now() }));
                            if i % 2 == 0 {
                                let mut sleep = wheel.sleep_until(deadline);
                                assert!(poll_noop(&mut sleep).is_pending());
                                sleeps.push(sleep);
                            }
                            if i % 8 == 7 {
                                std::thread::yield_now();
                            }
                        }
                        finished.fetch_add(1, Ordering::SeqCst);
                        (jobs, sleeps, kept)
                    })
                })
                .collect();
            // Keep the runtime busy (no auto-advance) while the actor takes turns.
            while finished.load(Ordering::SeqCst) < THREADS {
                tokio::task::yield_now().await;
            }
            let mut jobs = Vec::new();
            let mut sleeps = Vec::new();
            let mut kept = Vec::new();
            for thread in threads {
                let (j, s, k) = thread.join().unwrap();
                jobs.extend(j);
                sleeps.extend(s);
                kept.extend(k);
            }
            let start = Instant::now();
            // Each sleep's completion seen by a task of its own (as a job's run is).
            let sleeps: Vec<_> = sleeps
                .into_iter()
                .map(|sleep| {
                    let deadline = sleep.deadline();
                    (
                        deadline,
                        tokio::spawn(async move {
                            sleep.await;
                            Instant::now()
                        }),
                    )
                })
                .collect();
            // Now idle: the clock moves to the actor's alarm.
            let jobs = jobs.into_iter().map(|job| (job.deadline(), job));
            let mut done = Vec::new();
            for (deadline, job) in jobs {
                done.push((deadline, job.await.expect("a near job runs"), "job"));
            }
            for (deadline, task) in sleeps {
                done.push((deadline, task.await.unwrap(), "sleep"));
            }
            for (deadline, at, what) in done {
                assert!(at >= deadline, "round {round}: a {what} completed early");
                assert!(
                    at <= deadline + slack,
                    "round {round}: a {what} due {:?} after the round completed {:?} after it",
                    deadline - start,
                    at - start
                );
            }
            drop(kept);
        }
        wheel.flush().await;
        assert_stats_settled(&wheel, "paused near timers");
    });
}

/// Wakes a thread blocked on a sleep, and says at once that it is no longer waiting (so the
/// test's clock stops moving before the thread even runs).
struct FlagWaker {
    waiting: Arc<AtomicBool>,
    wakes: Arc<AtomicUsize>,
    thread: std::thread::Thread,
}

impl std::task::Wake for FlagWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.waiting.store(false, Ordering::SeqCst);
        self.thread.unpark();
    }
}

/// Check 12: the pending flag's race, in lock-step on a paused clock. One thread sends its
/// next near sleep the moment the actor fires its last one — while the actor is still in the
/// turn that fired it, about to publish when it looks next (the previous deadline, now past,
/// is what the thread reads). The test's task moves the clock only while the thread is blocked,
/// in steps of a quarter tick of tokio's grid, so each sleep's completion is seen at the
/// virtual instant it fired: never early, and within a tick plus tokio's millisecond grid
/// (plus two steps) — a command the actor missed would wait for its lazy look (10 ms on) or for
/// ever (the clock then runs 100 ms past the deadline: a missed wake-up).
#[test]
fn paused_time_a_sleep_sent_as_the_actor_fires_the_last_one_is_not_missed() {
    let _serial = serial();
    const SLEEPS: usize = 20_000;
    let step = Duration::from_micros(250);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let wheel = Wheel::builder().tick(Duration::from_micros(100)).build();
        // A tick, tokio's millisecond grid, and a step the clock may move as the sleep fires.
        let slack = wheel.tick() + Duration::from_millis(1) + 2 * step;
        let waiting = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        // Sleeps completed so far: the clock only counts steps past the current one.
        let progress = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (wheel, handle) = (wheel.clone(), Handle::current());
            let (waiting, done, progress) = (waiting.clone(), done.clone(), progress.clone());
            std::thread::spawn(move || {
                let _entered = handle.enter();
                let wakes = Arc::new(AtomicUsize::new(0));
                let waker = Waker::from(Arc::new(FlagWaker {
                    waiting: waiting.clone(),
                    wakes: wakes.clone(),
                    thread: std::thread::current(),
                }));
                let mut cx = Context::from_waker(&waker);
                let mut late = Vec::new();
                let mut kept = None;
                for i in 0..SLEEPS {
                    match i % 3 {
                        // A far registration withdrawn at once: its shard may be empty again.
                        0 => drop({
                            let mut far = wheel.sleep(Duration::from_secs(3_600));
                            let _ = poll_noop(&mut far);
                            far
                        }),
                        // One kept: the actor has something far to wake for.
                        1 => {
                            let mut far = wheel.sleep(Duration::from_secs(60));
                            let _ = poll_noop(&mut far);
                            kept = Some(far);
                        }
                        _ => {}
                    }
                    let deadline =
                        Instant::now() + Duration::from_micros(300 * (1 + (i % 3) as u64));
                    let mut near = wheel.sleep_until(deadline);
                    loop {
                        let seen = wakes.load(Ordering::SeqCst);
                        if Pin::new(&mut near).poll(&mut cx).is_ready() {
                            break;
                        }
                        waiting.store(true, Ordering::SeqCst);
                        if wakes.load(Ordering::SeqCst) != seen {
                            waiting.store(false, Ordering::SeqCst);
                            continue;
                        }
                        let give_up = std::time::Instant::now() + HANG;
                        while waiting.load(Ordering::SeqCst) && !done.load(Ordering::SeqCst) {
                            assert!(std::time::Instant::now() < give_up, "hung: sleep {i}");
                            std::thread::park_timeout(Duration::from_millis(5));
                        }
                        if done.load(Ordering::SeqCst) {
                            return (i, late, false);
                        }
                    }
                    let now = Instant::now();
                    progress.fetch_add(1, Ordering::SeqCst);
                    assert!(now >= deadline, "sleep {i} completed early");
                    if now > deadline + slack {
                        late.push((i, now - deadline));
                    }
                }
                drop(kept);
                done.store(true, Ordering::SeqCst);
                (SLEEPS, late, true)
            })
        };
        let mut steps_without_wake = 0u32;
        let mut seen = 0;
        while !done.load(Ordering::SeqCst) {
            let now_seen = progress.load(Ordering::SeqCst);
            if now_seen != seen {
                seen = now_seen;
                steps_without_wake = 0;
            }
            if waiting.load(Ordering::SeqCst) {
                if steps_without_wake == 400 {
                    // 100 ms of paused clock past a deadline of at most 0.9 ms.
                    done.store(true, Ordering::SeqCst);
                    break;
                }
                tokio::time::advance(step).await;
                steps_without_wake += 1;
            } else {
                tokio::task::yield_now().await;
            }
        }
        let (reached, late, finished) = thread.join().unwrap();
        assert!(
            finished,
            "sleep {reached}: missed wake-up, the clock ran 100 ms past its deadline"
        );
        assert!(
            late.is_empty(),
            "sleeps completed late (index, by): {late:?}"
        );
        wheel.flush().await;
        assert_stats_settled(&wheel, "lock-step");
    });
}
