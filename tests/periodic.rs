//! Periodic jobs: fixed rate versus fixed delay, cancel, abort, panics, no overlap.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_wheel::{JobError, Schedule, Wheel};

const PERIOD: Duration = Duration::from_millis(100);

/// Start offsets (ms, relative to `start`) of each run, recorded by the job itself.
type Runs = Arc<Mutex<Vec<u64>>>;

fn recorder(
    start: Instant,
    work: Duration,
    runs: Runs,
) -> impl FnMut() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + 'static
{
    move || {
        let runs = runs.clone();
        Box::pin(async move {
            runs.lock()
                .unwrap()
                .push(start.elapsed().as_millis() as u64);
            tokio::time::sleep(work).await;
        })
    }
}

#[tokio::test(start_paused = true)]
async fn fixed_rate_runs_every_period_from_one_period_on() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let runs = Runs::default();
    let job = wheel.spawn_every(
        PERIOD,
        Schedule::FixedRate,
        recorder(start, Duration::from_millis(10), runs.clone()),
    );
    tokio::time::sleep(Duration::from_millis(550)).await;
    assert_eq!(*runs.lock().unwrap(), [100, 200, 300, 400, 500]);
    assert!(job.cancel());
    assert_eq!(job.await, Err(JobError::Cancelled));
}

/// When a job taking `work` would start, run by tokio's own `Interval` with `Skip` from one
/// period on: the reference `Schedule::FixedRate` follows.
async fn tokio_skip_starts(work: Duration, until: Duration) -> Vec<u64> {
    let start = Instant::now();
    let mut interval = tokio::time::interval_at(start + PERIOD, PERIOD);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut starts = Vec::new();
    loop {
        interval.tick().await;
        if start.elapsed() > until {
            return starts;
        }
        starts.push(start.elapsed().as_millis() as u64);
        tokio::time::sleep(work).await;
    }
}

#[tokio::test(start_paused = true)]
async fn fixed_rate_runs_as_tokios_interval_with_skip() {
    for work in [10, 100, 104, 105, 106, 111, 119, 150, 250] {
        let work = Duration::from_millis(work);
        let until = Duration::from_millis(1_050);
        let wheel = Wheel::new();
        let start = Instant::now();
        let runs = Runs::default();
        let job = wheel.spawn_every(
            PERIOD,
            Schedule::FixedRate,
            recorder(start, work, runs.clone()),
        );
        tokio::time::sleep(until).await;
        job.abort();
        let reference = tokio_skip_starts(work, until).await;
        assert_eq!(*runs.lock().unwrap(), reference, "runs of {work:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn fixed_rate_skips_missed_slots_and_keeps_the_phase() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let runs = Runs::default();
    // Each run takes 250 ms: the slot missed while running runs late, at once (slot 200 at
    // 350); the ones after it are skipped (300); the grid stays 100, 200, 400, 700, 900.
    let job = wheel.spawn_every(
        PERIOD,
        Schedule::FixedRate,
        recorder(start, Duration::from_millis(250), runs.clone()),
    );
    tokio::time::sleep(Duration::from_millis(1_050)).await;
    job.abort();
    assert_eq!(*runs.lock().unwrap(), [100, 350, 600, 850]);
}

#[tokio::test(start_paused = true)]
async fn fixed_delay_waits_a_period_after_each_run() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let runs = Runs::default();
    let job = wheel.spawn_every(
        PERIOD,
        Schedule::FixedDelay,
        recorder(start, Duration::from_millis(250), runs.clone()),
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    job.abort();
    // 100 → ends 350 → 450 → ends 700 → 800 → ends 1050.
    assert_eq!(*runs.lock().unwrap(), [100, 450, 800]);
}

#[tokio::test(start_paused = true)]
async fn runs_never_overlap() {
    let wheel = Wheel::new();
    let active = Arc::new(Mutex::new((0u32, 0u32))); // (running now, most at once)
    let counter = active.clone();
    let job = wheel.spawn_every(Duration::from_millis(10), Schedule::FixedRate, move || {
        let counter = counter.clone();
        async move {
            {
                let mut c = counter.lock().unwrap();
                c.0 += 1;
                c.1 = c.1.max(c.0);
            }
            tokio::time::sleep(Duration::from_millis(35)).await;
            counter.lock().unwrap().0 -= 1;
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    job.abort();
    assert_eq!(active.lock().unwrap().1, 1);
}

#[tokio::test(start_paused = true)]
async fn cancel_lets_the_current_run_finish_and_stops_future_runs() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let runs = Runs::default();
    let finished = Arc::new(Mutex::new(0));
    let (r, f) = (runs.clone(), finished.clone());
    let job = wheel.spawn_every(PERIOD, Schedule::FixedRate, move || {
        let (r, f) = (r.clone(), f.clone());
        async move {
            r.lock().unwrap().push(start.elapsed().as_millis() as u64);
            tokio::time::sleep(Duration::from_millis(50)).await;
            *f.lock().unwrap() += 1;
        }
    });
    tokio::time::sleep(Duration::from_millis(120)).await; // inside the first run
    assert!(job.cancel());
    assert!(!job.cancel());
    assert_eq!(job.await, Err(JobError::Cancelled));
    assert_eq!(
        *finished.lock().unwrap(),
        1,
        "the run in progress completed"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(*runs.lock().unwrap(), [100]);
}

#[tokio::test(start_paused = true)]
async fn abort_stops_a_run_in_progress() {
    let wheel = Wheel::new();
    let finished = Arc::new(Mutex::new(0));
    let f = finished.clone();
    let job = wheel.spawn_every(PERIOD, Schedule::FixedRate, move || {
        let f = f.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            *f.lock().unwrap() += 1;
        }
    });
    tokio::time::sleep(Duration::from_millis(120)).await;
    job.abort();
    assert_eq!(job.await, Err(JobError::Cancelled));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(*finished.lock().unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_run_is_contained_and_the_schedule_goes_on() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let runs = Runs::default();
    let r = runs.clone();
    let job = wheel.spawn_every(PERIOD, Schedule::FixedRate, move || {
        let r = r.clone();
        async move {
            let count = {
                let mut runs = r.lock().unwrap();
                runs.push(start.elapsed().as_millis() as u64);
                runs.len()
            };
            if count % 2 == 1 {
                panic!("odd run");
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(*runs.lock().unwrap(), [100, 200, 300, 400]);
    let stats = wheel.stats();
    assert_eq!((stats.job_panics, stats.periodic_runs), (2, 4));
    job.abort();
}

#[tokio::test(start_paused = true)]
async fn reschedule_moves_the_next_run() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let runs = Runs::default();
    let job = wheel.spawn_every(
        PERIOD,
        Schedule::FixedRate,
        recorder(start, Duration::ZERO, runs.clone()),
    );
    assert_eq!(job.deadline(), start + PERIOD);
    assert!(job.reschedule(start + Duration::from_millis(30)));
    tokio::time::sleep(Duration::from_millis(250)).await;
    job.abort();
    assert_eq!(*runs.lock().unwrap(), [30, 130, 230]);
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "period must be non-zero")]
async fn a_zero_period_panics_with_a_clear_message() {
    drop(Wheel::new().spawn_every(Duration::ZERO, Schedule::FixedDelay, || async {}));
}

#[tokio::test(start_paused = true)]
async fn fixed_rate_does_not_skip_the_slot_a_run_ends_on() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let runs = Runs::default();
    let job = wheel.spawn_every(
        PERIOD,
        Schedule::FixedRate,
        recorder(start, PERIOD, runs.clone()),
    );
    tokio::time::sleep(Duration::from_millis(450)).await;
    job.cancel();
    // tokio's Interval with Skip: 100, 200, 300, 400 — not 100, 300.
    assert_eq!(*runs.lock().unwrap(), [100, 200, 300, 400]);
}

#[test]
fn a_periodic_job_whose_runtime_is_gone_is_finished() {
    let actor_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let wheel = Wheel::builder()
        .runtime(actor_runtime.handle().clone())
        .build();
    let job = wheel.spawn_every(PERIOD, Schedule::FixedDelay, || async {});
    assert!(!job.is_finished());
    drop(actor_runtime);
    assert!(job.is_finished(), "awaiting it would return at once");
    let result = futures::executor::block_on(job);
    assert_eq!(result, Err(JobError::Shutdown));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_always_runs_late_does_not_hold_up_the_wheels_other_timers() {
    // Each run blocks its worker for 150 ms, with a 20 ms period: every next tick is due
    // before the run ends. The driver must still give its worker back between runs, or the
    // actor, woken onto that worker's LIFO slot, waits behind it for good (found by an
    // independent attack: the test hung).
    let wheel = Wheel::new();
    let periodic = wheel.spawn_every(Duration::from_millis(20), Schedule::FixedRate, || {
        std::thread::sleep(Duration::from_millis(150));
        async {}
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    for _ in 0..10 {
        let started = std::time::Instant::now();
        tokio::time::timeout(
            Duration::from_secs(5),
            wheel.sleep(Duration::from_millis(5)),
        )
        .await
        .expect("a 5 ms sleep completed while the late job kept running");
        assert!(started.elapsed() >= Duration::from_millis(5), "never early");
    }
    assert!(periodic.cancel());
}

/// `deadline()` names the next run as soon as a run begins: the next slot for `FixedRate`
/// (not the slot of the run in progress), the earliest possible start for `FixedDelay`, exact
/// once that run ends.
#[tokio::test(start_paused = true)]
async fn deadline_names_the_next_run_as_soon_as_a_run_begins() {
    for schedule in [Schedule::FixedRate, Schedule::FixedDelay] {
        let wheel = Wheel::new();
        let start = Instant::now();
        let (started, mut runs) = tokio::sync::mpsc::unbounded_channel();
        let job = wheel.spawn_every(PERIOD, schedule, move || {
            let started = started.clone();
            async move {
                let _ = started.send(Instant::now());
                tokio::time::sleep(PERIOD / 2).await;
            }
        });
        assert_eq!(
            job.deadline(),
            start + PERIOD,
            "{schedule:?}: before the first run"
        );
        let first = runs.recv().await.unwrap();
        assert_eq!(first, start + PERIOD);
        assert_eq!(
            job.deadline(),
            start + PERIOD * 2,
            "{schedule:?}: while the first run is in progress"
        );
        tokio::time::sleep_until(first + PERIOD / 2 + Duration::from_millis(1)).await;
        let expected = match schedule {
            Schedule::FixedRate => start + PERIOD * 2,
            Schedule::FixedDelay => first + PERIOD / 2 + PERIOD,
        };
        assert_eq!(
            job.deadline(),
            expected,
            "{schedule:?}: after the first run"
        );
        let second = runs.recv().await.unwrap();
        assert_eq!(second, expected, "{schedule:?}: the run came when it said");
        job.cancel();
        let _ = job.await;
    }
}
