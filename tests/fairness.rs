//! The actor is a good citizen of its runtime: while other threads flood the wheel with
//! commands, a 10 ms heartbeat on the wheel's runtime never sees a gap over 100 ms more than
//! the machine itself imposes (measured beside it with the same CPU competition and no wheel:
//! ~0 on an idle machine), and a job due meanwhile still starts on time — on a current-thread runtime (where the actor shares
//! the one thread with everything else) and on a multi-thread one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_wheel::Wheel;

const FLOOD: Duration = Duration::from_millis(1_500);
const KEYS: u64 = 1_000_000;
const MAX_GAP: Duration = Duration::from_millis(100);

/// Floods `wheel` from two threads until `stop`: one sets and resets keyed timers over a
/// million keys, the other registers and drops sleeps. Returns the threads and a count of
/// calls made.
fn flood(
    wheel: &Wheel,
    runtime: &tokio::runtime::Handle,
    stop: Arc<AtomicBool>,
) -> (Vec<std::thread::JoinHandle<()>>, Arc<AtomicU64>) {
    let calls = Arc::new(AtomicU64::new(0));
    let (timers, expired) = {
        let _entered = runtime.enter();
        wheel.keyed::<u64, u64>()
    };
    drop(expired);
    let keyed = {
        let (stop, calls) = (stop.clone(), calls.clone());
        std::thread::spawn(move || {
            let mut key = 0;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..1_000 {
                    timers.set(key, key, Duration::from_secs(60));
                    timers.reset(&(key / 2), Duration::from_secs(90));
                    key = (key + 1) % KEYS;
                }
                calls.fetch_add(2_000, Ordering::Relaxed);
            }
        })
    };
    let sleeps = {
        let (wheel, calls) = (wheel.clone(), calls.clone());
        std::thread::spawn(move || {
            let waker = std::task::Waker::noop();
            let mut cx = std::task::Context::from_waker(waker);
            let mut kept = Vec::with_capacity(1_000);
            while !stop.load(Ordering::Relaxed) {
                for i in 0..1_000u64 {
                    let mut sleep = wheel.sleep(Duration::from_secs(30 + i));
                    let _ = std::future::Future::poll(std::pin::Pin::new(&mut sleep), &mut cx);
                    kept.push(sleep);
                }
                // Dropped after the actor has likely taken them: real cancels, not withdrawals.
                kept.clear();
                calls.fetch_add(2_000, Ordering::Relaxed);
            }
        })
    };
    (vec![keyed, sleeps], calls)
}

/// Beats every 10 ms for the flood's length, on the current runtime; returns the longest gap
/// between beats.
async fn heartbeat() -> Duration {
    let mut worst = Duration::ZERO;
    let mut last = Instant::now();
    let until = last + FLOOD;
    while last < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = Instant::now();
        worst = worst.max(now - last);
        last = now;
    }
    worst
}

/// [`heartbeat`] while a job due 50 ms in waits on `wheel`; returns the longest gap and how
/// late the job started.
async fn heartbeat_during_a_flood(wheel: Wheel) -> (Duration, Duration) {
    let job_due = Instant::now() + Duration::from_millis(50);
    let job = wheel.spawn_at(job_due, async move { job_due.elapsed() });
    let worst = heartbeat().await;
    (worst, job.await.expect("the job ran"))
}

/// The machine's own share of a gap: the worst 10 ms heartbeat gap on `runtime` while two
/// threads spin for the flood's length without touching any wheel. On an idle 2-core machine it
/// is ~10 ms (the beat itself); a loaded one (another build beside the tests) preempts the
/// heartbeat's thread for longer, and that is not the actor's doing.
fn machine_noise(runtime: &tokio::runtime::Runtime) -> Duration {
    let stop = Arc::new(AtomicBool::new(false));
    let spinners: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            })
        })
        .collect();
    let worst = runtime.block_on(heartbeat());
    stop.store(true, Ordering::Relaxed);
    for spinner in spinners {
        spinner.join().unwrap();
    }
    worst
}

/// One flood at a time: two at once on two cores would measure the machine, not the actor.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn check(flavor: &str, runtime: tokio::runtime::Runtime) {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // The bound is the actor's: what the machine adds by itself (measured just before, with
    // the same CPU competition and no wheel) is allowed on top of it.
    let noise = machine_noise(&runtime).saturating_sub(Duration::from_millis(10));
    let allowed = MAX_GAP + noise;
    let wheel = Wheel::builder().runtime(runtime.handle().clone()).build();
    let stop = Arc::new(AtomicBool::new(false));
    let (flooders, calls) = flood(&wheel, runtime.handle(), stop.clone());
    let beat = runtime.spawn(heartbeat_during_a_flood(wheel.clone()));
    let (worst_gap, job_late) = runtime.block_on(beat).unwrap();
    stop.store(true, Ordering::Relaxed);
    for flooder in flooders {
        flooder.join().unwrap();
    }
    let stats = wheel.stats();
    eprintln!(
        "{flavor}: {} calls; worst heartbeat gap {worst_gap:?} (the machine alone: +{noise:?}); \
         job started {job_late:?} late; {} commands applied",
        calls.load(Ordering::Relaxed),
        stats.commands
    );
    assert!(
        worst_gap <= allowed,
        "{flavor}: heartbeat gap {worst_gap:?} (allowed {allowed:?}: 100 ms + the machine's {noise:?})"
    );
    assert!(
        job_late <= allowed,
        "{flavor}: the job started {job_late:?} late (allowed {allowed:?})"
    );
    assert!(
        stats.commands > 100_000,
        "{flavor}: the flood was too light to mean anything"
    );
    runtime.block_on(wheel.shutdown());
}

/// Runs `check` up to three times, on a fresh runtime each: passes if one run keeps the bound.
/// An actor that starves its runtime (the bug this guards against: gaps of seconds) fails every
/// run; another process preempting the heartbeat's thread (a build beside the tests on two
/// cores: 115–147 ms seen once, 14–20 ms when idle) does not three times in a row.
fn check_at_most_three_times(flavor: &str, runtime: impl Fn() -> tokio::runtime::Runtime) {
    for attempt in 1..=3 {
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(flavor, runtime())));
        match result {
            Ok(()) => return,
            Err(panic) if attempt == 3 => std::panic::resume_unwind(panic),
            Err(_) => eprintln!("{flavor}: attempt {attempt} over the bound; again"),
        }
    }
}

#[test]
fn a_current_thread_runtime_fed_from_other_threads_keeps_polling_its_tasks() {
    check_at_most_three_times("current-thread", || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    });
}

#[test]
fn a_multi_thread_runtime_fed_from_other_threads_keeps_polling_its_tasks() {
    check_at_most_three_times("multi-thread", || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    });
}

/// Beats every 10 ms on a current-thread runtime while `work` runs on another thread against
/// a wheel whose actor lives on that runtime; returns the worst gap between beats, less what
/// the machine alone adds with the same CPU competition (as `check` does: a loaded machine
/// preempts the beat's thread, and that is not the actor's doing).
fn heartbeat_while(work: impl FnOnce(Wheel) + Send + 'static) -> Duration {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let noise = machine_noise(&runtime).saturating_sub(Duration::from_millis(10));
    let wheel = Wheel::builder().runtime(runtime.handle().clone()).build();
    let done = Arc::new(AtomicBool::new(false));
    let worker = {
        let done = done.clone();
        std::thread::spawn(move || {
            work(wheel);
            done.store(true, Ordering::Release);
        })
    };
    let worst = runtime.block_on(async move {
        let mut worst = Duration::ZERO;
        let mut last = Instant::now();
        while !done.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let now = Instant::now();
            worst = worst.max(now - last);
            last = now;
        }
        worst
    });
    worker.join().unwrap();
    eprintln!("worst heartbeat gap {worst:?} (the machine alone: +{noise:?})");
    worst.saturating_sub(noise)
}

/// Runs `future` to completion on a runtime of the calling thread (the work thread's own).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

const BIG: u64 = 200_000;

#[test]
fn draining_a_big_keyed_set_does_not_stall_the_actors_runtime() {
    let worst = heartbeat_while(|wheel| {
        let (timers, _expired) = block_on(async { wheel.keyed::<u64, String>() });
        for key in 0..BIG {
            timers.set(key, "x".to_owned(), Duration::from_secs(3_600));
        }
        let drained = block_on(timers.drain());
        assert_eq!(drained.len() as u64, BIG);
    });
    assert!(worst <= MAX_GAP, "heartbeat gap {worst:?} while draining");
}

#[test]
fn shutting_down_with_many_timers_pending_does_not_stall_the_actors_runtime() {
    let worst = heartbeat_while(|wheel| {
        let (timers, mut expired) = block_on(async { wheel.keyed::<u64, String>() });
        for key in 0..BIG {
            timers.set(key, "x".to_owned(), Duration::from_secs(3_600));
        }
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let sleeps: Vec<_> = (0..BIG)
            .map(|i| {
                let mut sleep = wheel.sleep(Duration::from_secs(3_600 + i));
                let _ = std::future::Future::poll(std::pin::Pin::new(&mut sleep), &mut cx);
                sleep
            })
            .collect();
        let jobs: Vec<_> = (0..BIG)
            .map(|i| wheel.spawn_after(Duration::from_secs(3_600 + i), async {}))
            .collect();
        block_on(async {
            wheel.flush().await;
            assert_eq!(timers.len().await as u64, BIG);
            wheel.shutdown().await;
            let mut flushed = 0;
            while let Some(expiry) = futures::StreamExt::next(&mut expired).await {
                assert!(expiry.is_shutdown());
                flushed += 1;
            }
            assert_eq!(flushed, BIG);
            for job in jobs {
                assert_eq!(job.await, Err(tokio_wheel::JobError::Shutdown));
            }
        });
        drop(sleeps);
    });
    assert!(
        worst <= MAX_GAP,
        "heartbeat gap {worst:?} while shutting down"
    );
}
