//! `Builder::own_thread`: the actors on a thread of their own keep every timer on time while
//! the application's tasks block their workers; jobs still run on the application's runtime;
//! the wheel still stops with that runtime; the thread goes when the wheel does.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant as StdInstant};

use futures::StreamExt;
use tokio::runtime::Runtime;
use tokio_wheel::{BuildError, Wheel};

fn runtime(workers: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

/// How long a test waits for what it awaits before it fails as hung: a guard against a wheel
/// that stopped firing, not a figure (nothing here asserts how fast a timer fires).
const HANG_GUARD: Duration = Duration::from_secs(60);

/// Runs `block` on a thread of its own and waits for it, at most [`HANG_GUARD`]: a test of a
/// wheel that stopped firing fails instead of hanging.
fn unless_hung<T: Send + 'static>(block: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || sender.send(block()));
    receiver
        .recv_timeout(HANG_GUARD)
        .expect("never completed (hang guard)")
}

fn own_wheel(runtime: &Runtime, name: &str) -> Wheel {
    Wheel::builder()
        .runtime(runtime.handle().clone())
        .name(name)
        .own_thread(true)
        .try_build()
        .unwrap()
}

#[test]
fn timers_fire_while_a_task_that_woke_the_actor_blocks_its_worker() {
    // Task A files a timer (waking the actor from its worker: on a shared runtime the actor
    // would sit in that worker's LIFO slot), then blocks that worker until a sleep awaited on
    // the other worker has completed, or the hang guard has passed. The outcome asserted is
    // the order: the sleep completes while A still blocks (no wall-clock bound on how fast).
    // With the actor on the application's runtime this fails: the sleep waits out A's guard.
    let runtime = runtime(2);
    let wheel = own_wheel(&runtime, "lifo");
    let blocked = Arc::new(AtomicBool::new(false));
    let (fired, fired_seen) = std::sync::mpsc::channel::<()>();
    let a = {
        let (wheel, blocked) = (wheel.clone(), blocked.clone());
        runtime.spawn(async move {
            let mut sleep = wheel.sleep(Duration::from_millis(1));
            assert!(support::poll_once(&mut sleep).is_pending());
            blocked.store(true, Ordering::SeqCst);
            // Blocks the worker (a std wait, not an await) until the other sleep fires.
            fired_seen.recv_timeout(HANG_GUARD).is_ok()
        })
    };
    while !blocked.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    runtime.block_on(async {
        let start = StdInstant::now();
        wheel.sleep(Duration::from_millis(10)).await;
        assert!(start.elapsed() >= Duration::from_millis(10), "never early");
    });
    let _ = fired.send(());
    assert!(
        runtime.block_on(a).unwrap(),
        "the sleep completed while another task blocked its worker"
    );
}

#[test]
fn timers_fire_while_nothing_drives_the_applications_runtime() {
    // A current-thread runtime runs only inside `block_on`; here nobody calls it. A wheel
    // whose actor runs there would never fire; on its own thread it fires on time.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let wheel = Wheel::builder()
        .runtime(runtime.handle().clone())
        .own_thread(true)
        .try_build()
        .unwrap();
    let sleep = wheel.sleep(Duration::from_millis(20));
    let start = StdInstant::now();
    unless_hung(|| futures::executor::block_on(sleep));
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(20), "never early: {took:?}");

    // Keyed timers too.
    let (timers, mut expirations) = wheel.keyed::<u32, &str>();
    timers.set(7, "seven", Duration::from_millis(20));
    let expired = unless_hung(move || futures::executor::block_on(expirations.next())).unwrap();
    assert_eq!((*expired.key(), *expired.value()), (7, "seven"));
    assert!(!expired.is_shutdown());
}

#[test]
fn jobs_run_on_the_applications_runtime_not_on_the_wheels_thread() {
    let runtime = runtime(2);
    let wheel = own_wheel(&runtime, "jobs");
    let expected = runtime.handle().id();
    let job = wheel.spawn_after(Duration::from_millis(5), async {
        (
            tokio::runtime::Handle::current().id(),
            std::thread::current().name().map(str::to_owned),
        )
    });
    let (ran_on, thread) = runtime.block_on(job).unwrap();
    assert_eq!(ran_on, expected, "the job ran on the application's runtime");
    assert_ne!(thread.as_deref(), Some("tokio-wheel jobs"));
}

#[tokio::test(start_paused = true)]
async fn a_paused_clock_is_refused() {
    let built = Wheel::builder().own_thread(true).try_build();
    assert_eq!(built.unwrap_err(), BuildError::PausedClock);
    // Without it, paused time works as ever.
    let wheel = Wheel::builder().try_build().unwrap();
    let start = tokio::time::Instant::now();
    wheel.sleep(Duration::from_secs(60)).await;
    assert_eq!(start.elapsed(), Duration::from_secs(60));
}

#[test]
fn a_runtime_without_a_time_driver_is_enough() {
    // The wheel's own runtime has the time driver; the application's needs none.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap();
    let wheel = Wheel::builder()
        .runtime(runtime.handle().clone())
        .own_thread(true)
        .try_build()
        .unwrap();
    let start = StdInstant::now();
    runtime.block_on(wheel.sleep(Duration::from_millis(20)));
    assert!(start.elapsed() >= Duration::from_millis(20));
    assert_eq!(
        runtime.block_on(wheel.spawn_after(Duration::from_millis(5), async { 3 })),
        Ok(3)
    );
}

#[test]
fn the_wheel_stops_with_the_applications_runtime_and_loses_nothing() {
    let runtime = runtime(2);
    let wheel = own_wheel(&runtime, "dies");
    let (timers, expirations) = wheel.keyed::<u32, ()>();
    for key in 0..1_000 {
        timers.set(key, (), Duration::from_secs(3_600));
    }
    let sleep = wheel.sleep(Duration::from_secs(3_600));
    drop(runtime);
    let delivered: Vec<_> = unless_hung(|| futures::executor::block_on(expirations.collect()));
    assert_eq!(delivered.len(), 1_000, "every entry delivered once");
    assert!(delivered.iter().all(|expired| expired.is_shutdown()));
    assert!(wheel.is_shutdown());
    unless_hung(|| futures::executor::block_on(sleep)); // resolves: the wheel stopped
}

#[cfg(target_os = "linux")]
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

#[cfg(target_os = "linux")]
#[test]
fn the_thread_ends_once_the_wheel_is_gone() {
    let runtime = runtime(1);
    // Linux keeps 15 bytes of a thread's name: short wheel names keep it whole.
    for (how, name) in [("shutdown", "s"), ("dropped", "d")] {
        let wheel = own_wheel(&runtime, name);
        let thread = format!("tokio-wheel {name}");
        // The thread names itself once it runs, a moment after `build` returns.
        let start = StdInstant::now();
        while threads_named(&thread) == 0 {
            assert!(
                start.elapsed() < HANG_GUARD,
                "{how}: the wheel's thread never started (hang guard)"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(threads_named(&thread), 1, "{how}: one thread while it runs");
        runtime.block_on(wheel.sleep(Duration::from_millis(1)));
        if how == "shutdown" {
            runtime.block_on(wheel.shutdown());
        }
        drop(wheel);
        let start = StdInstant::now();
        while threads_named(&thread) > 0 {
            assert!(
                start.elapsed() < HANG_GUARD,
                "{how}: the wheel's thread is still there (hang guard)"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[test]
fn shutdown_resolves_everything_as_on_a_shared_runtime() {
    let runtime = runtime(2);
    let wheel = own_wheel(&runtime, "stop");
    runtime.block_on(async {
        let (timers, expirations) = wheel.keyed::<u32, ()>();
        for key in 0..10_000 {
            timers.set(key, (), Duration::from_secs(3_600));
        }
        let sleeps: Vec<_> = (0..1_000)
            .map(|_| tokio::spawn(wheel.sleep(Duration::from_secs(3_600))))
            .collect();
        let job = wheel.spawn_after(Duration::from_secs(3_600), async {});
        wheel.shutdown().await;
        for sleep in sleeps {
            sleep.await.unwrap();
        }
        assert_eq!(job.await, Err(tokio_wheel::JobError::Shutdown));
        let delivered: Vec<_> = expirations.collect().await;
        assert_eq!(delivered.len(), 10_000);
        assert!(wheel.sleep(Duration::from_secs(1)).is_elapsed() || wheel.is_shutdown());
    });
}
