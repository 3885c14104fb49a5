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
        tokio::time::timeout(Duration::from_secs(5), async {
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
