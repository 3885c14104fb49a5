//! Delayed one-shot jobs: run, cancel, reschedule, abort, panic, detach.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use support::settle;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_wheel::{JobError, JobHandle, Wheel};

#[tokio::test(start_paused = true)]
async fn a_job_runs_at_its_deadline_and_returns_its_value() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let job = wheel.spawn_after(Duration::from_secs(30), async move { start.elapsed() });
    assert_eq!(job.deadline(), start + Duration::from_secs(30));
    assert!(!job.is_finished());
    let ran_at = job.await.unwrap();
    assert!(
        ran_at >= Duration::from_secs(30) && ran_at <= Duration::from_millis(30_002),
        "{ran_at:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn spawn_at_a_past_deadline_runs_at_once() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let job = wheel.spawn_at(start - Duration::from_secs(1), async { 1 });
    assert_eq!(job.await, Ok(1));
    assert!(start.elapsed() <= Duration::from_millis(1));
}

#[tokio::test(start_paused = true)]
async fn cancel_before_start_means_it_never_runs() {
    let wheel = Wheel::new();
    let ran = Arc::new(AtomicBool::new(false));
    let flag = ran.clone();
    let job = wheel.spawn_after(Duration::from_secs(1), async move {
        flag.store(true, Ordering::SeqCst)
    });
    settle().await;
    assert!(job.cancel());
    assert!(!job.cancel(), "a second cancel has nothing to cancel");
    assert!(job.is_finished());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(job.await, Err(JobError::Cancelled));
    let stats = wheel.stats();
    assert_eq!((stats.cancelled, stats.pending, stats.fired), (1, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn cancel_before_the_actor_sees_the_job_also_works() {
    let wheel = Wheel::new();
    let job = wheel.spawn_after(Duration::from_secs(1), async { 5 });
    assert!(job.cancel());
    assert_eq!(job.await, Err(JobError::Cancelled));
}

#[tokio::test(start_paused = true)]
async fn cancel_after_start_returns_false_and_the_job_completes() {
    let wheel = Wheel::new();
    let (release, released) = oneshot::channel::<()>();
    let job = wheel.spawn_after(Duration::from_millis(10), async move {
        released.await.unwrap();
        "finished"
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!job.cancel());
    assert!(!job.reschedule(Instant::now() + Duration::from_secs(1)));
    release.send(()).unwrap();
    assert_eq!(job.await, Ok("finished"));
}

#[tokio::test(start_paused = true)]
async fn reschedule_moves_a_pending_job_both_ways() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let later = wheel.spawn_after(Duration::from_secs(1), async move { start.elapsed() });
    let earlier = wheel.spawn_after(Duration::from_secs(100), async move { start.elapsed() });
    settle().await;
    assert!(later.reschedule(start + Duration::from_secs(50)));
    assert!(earlier.reschedule(start + Duration::from_secs(2)));
    assert_eq!(later.deadline(), start + Duration::from_secs(50));
    let ran_earlier = earlier.await.unwrap();
    let ran_later = later.await.unwrap();
    assert!(
        ran_earlier >= Duration::from_secs(2) && ran_earlier < Duration::from_secs(3),
        "{ran_earlier:?}"
    );
    assert!(
        ran_later >= Duration::from_secs(50) && ran_later < Duration::from_secs(51),
        "{ran_later:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn abort_stops_a_running_job() {
    let wheel = Wheel::new();
    let finished = Arc::new(AtomicBool::new(false));
    let flag = finished.clone();
    let job = wheel.spawn_after(Duration::from_millis(10), async move {
        tokio::time::sleep(Duration::from_secs(10)).await;
        flag.store(true, Ordering::SeqCst);
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    job.abort();
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(!finished.load(Ordering::SeqCst));
    assert!(job.is_finished());
    assert_eq!(job.await, Err(JobError::Cancelled));
}

#[tokio::test(start_paused = true)]
async fn abort_before_start_cancels() {
    let wheel = Wheel::new();
    let job = wheel.spawn_after(Duration::from_secs(1), async { 1 });
    job.abort();
    assert_eq!(job.await, Err(JobError::Cancelled));
}

#[tokio::test(start_paused = true)]
async fn abort_after_finishing_keeps_the_result() {
    let wheel = Wheel::new();
    let job = wheel.spawn_after(Duration::from_millis(1), async { 9 });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(job.is_finished());
    job.abort();
    assert_eq!(job.await, Ok(9));
}

#[tokio::test(start_paused = true)]
async fn a_panicking_job_is_reported_and_the_wheel_keeps_running() {
    let wheel = Wheel::new();
    let job: JobHandle<()> = wheel.spawn_after(Duration::from_millis(5), async { panic!("boom") });
    let error = job.await.unwrap_err();
    assert_eq!(error, JobError::Panicked("boom".into()));
    assert!(error.is_panic());
    assert_eq!(error.to_string(), "job panicked: boom");
    let after = wheel.spawn_after(Duration::from_millis(5), async { "still running" });
    assert_eq!(after.await, Ok("still running"));
    assert_eq!(wheel.stats().job_panics, 1);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_handle_detaches_the_job() {
    let wheel = Wheel::new();
    let (sender, receiver) = oneshot::channel();
    drop(wheel.spawn_after(Duration::from_secs(5), async move {
        sender.send("ran").unwrap()
    }));
    assert_eq!(receiver.await, Ok("ran"));
}

#[tokio::test(start_paused = true)]
async fn jobs_run_as_tasks_never_inside_the_actor() {
    // A job that waits a long time must not hold up another job's deadline.
    let wheel = Wheel::new();
    let start = Instant::now();
    let inner = wheel.clone();
    let _slow = wheel.spawn_after(Duration::from_secs(1), async move {
        inner.sleep(Duration::from_secs(100)).await;
    });
    let fast = wheel.spawn_after(Duration::from_secs(2), async move { start.elapsed() });
    let ran = fast.await.unwrap();
    assert!(ran < Duration::from_millis(2_002), "{ran:?}");
}

#[tokio::test(start_paused = true)]
async fn many_jobs_each_run_exactly_once() {
    let wheel = Wheel::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..1_000u64)
        .map(|i| {
            let runs = runs.clone();
            wheel.spawn_after(Duration::from_millis(i % 97 + 1), async move {
                runs.fetch_add(1, Ordering::SeqCst);
                i
            })
        })
        .collect();
    for (i, handle) in handles.into_iter().enumerate() {
        assert_eq!(handle.await, Ok(i as u64));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1_000);
}

#[test]
fn job_handles_are_send() {
    support::assert_send::<JobHandle<String>>();
    support::assert_unpin::<JobHandle<String>>();
}

#[test]
fn is_finished_is_true_as_soon_as_awaiting_the_handle_returns() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let wheel = Wheel::new();
        let mut jobs: Vec<JobHandle<usize>> = (0..20_000)
            .map(|i| wheel.spawn_after(Duration::from_micros(i as u64 % 500), async move { i }))
            .collect();
        for (i, job) in jobs.iter_mut().enumerate() {
            assert_eq!((&mut *job).await, Ok(i));
            assert!(job.is_finished(), "job {i}: awaited, yet not finished");
        }
    });
}

#[test]
fn a_job_whose_runtime_is_gone_is_finished_and_says_shutdown() {
    let actor_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let wheel = Wheel::builder()
        .runtime(actor_runtime.handle().clone())
        .build();
    let pending = wheel.spawn_after(Duration::from_secs(60), async { 1 });
    drop(actor_runtime);
    assert!(pending.is_finished());
    assert_eq!(
        futures::executor::block_on(pending),
        Err(JobError::Shutdown)
    );
}
