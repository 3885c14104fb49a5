//! Fixed rate versus fixed delay, with a job that is sometimes slower than its period.
//!
//! Both schedules run the same job every 100 ms; every third run takes 250 ms. Fixed rate
//! keeps the phase as tokio's `Interval` with `MissedTickBehavior::Skip` does: the slots a slow
//! run overlapped collapse into one run that starts as soon as the slow one ends, and the run
//! after it is back on a multiple of the period. Fixed delay waits a full period after each run
//! ends, so it drifts.
//!
//! Run: `cargo run --release --example periodic` (`-- --quick` for a shorter run).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_wheel::{Schedule, Wheel};

/// One run: when it started and how long it worked, relative to the start of the demo.
#[derive(Debug, Clone, Copy)]
struct Run {
    started: Duration,
    worked: Duration,
}

async fn record(
    wheel: &Wheel,
    schedule: Schedule,
    period: Duration,
    slow: Duration,
    total: Duration,
) -> Vec<Run> {
    let start = Instant::now();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let log = runs.clone();
    let count = Arc::new(Mutex::new(0u32));
    let job = wheel.spawn_every(period, schedule, move || {
        let (log, count) = (log.clone(), count.clone());
        async move {
            let n = {
                let mut count = count.lock().expect("count");
                *count += 1;
                *count
            };
            let worked = if n % 3 == 0 { slow } else { period / 5 };
            let started = start.elapsed();
            tokio::time::sleep(worked).await;
            log.lock().expect("log").push(Run { started, worked });
        }
    });
    wheel.sleep(total).await;
    job.cancel();
    let _ = job.await;
    runs.lock().expect("log").clone()
}

fn print(name: &str, period: Duration, runs: &[Run]) {
    println!("\n{name}:");
    for (i, run) in runs.iter().enumerate() {
        let phase = run.started.as_millis() % period.as_millis();
        let gap = i
            .checked_sub(1)
            .map(|prev| {
                format!(
                    "{:>4} ms after the previous start",
                    (run.started - runs[prev].started).as_millis()
                )
            })
            .unwrap_or_default();
        println!(
            "  run {:>2} starts at {:>5} ms (phase {:>3} ms), works {:>3} ms  {gap}",
            i + 1,
            run.started.as_millis(),
            phase,
            run.worked.as_millis()
        );
    }
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let period = Duration::from_millis(100);
    let slow = Duration::from_millis(250);
    let total = if quick {
        Duration::from_millis(900)
    } else {
        Duration::from_millis(2_000)
    };
    let wheel = Wheel::new();

    println!(
        "A job every {period:?}; every third run works {slow:?}. Running both schedules for {total:?}."
    );
    let (rate, delay) = tokio::join!(
        record(&wheel, Schedule::FixedRate, period, slow, total),
        record(&wheel, Schedule::FixedDelay, period, slow, total),
    );
    print(
        "FixedRate (keeps the phase: missed slots collapse into one late run)",
        period,
        &rate,
    );
    print(
        "FixedDelay (a full period after each run ends)",
        period,
        &delay,
    );

    // What the timelines show, checked: runs never overlap; fixed rate stays on the grid
    // (within scheduling noise); fixed delay waits a period after each run.
    let tolerance = Duration::from_millis(30);
    for runs in [&rate, &delay] {
        for pair in runs.windows(2) {
            assert!(
                pair[1].started >= pair[0].started + pair[0].worked,
                "runs overlapped"
            );
        }
    }
    // A fixed-rate run starts on the grid, or (once) right after a run that overran its slot;
    // missed slots never come back as a burst, so the run after a late one is on the grid.
    let on_grid = |run: &Run| {
        let off_grid = run.started.as_millis() % period.as_millis();
        off_grid <= tolerance.as_millis() || off_grid >= (period - tolerance).as_millis()
    };
    for (i, run) in rate.iter().enumerate() {
        if on_grid(run) {
            continue;
        }
        let previous = i.checked_sub(1).map(|p| rate[p]);
        let catch_up = previous.is_some_and(|prev| {
            prev.worked > period
                && run.started >= prev.started + prev.worked
                && run.started <= prev.started + prev.worked + tolerance
                && on_grid(&prev)
        });
        assert!(catch_up, "fixed rate lost its phase: {run:?}");
    }
    for pair in delay.windows(2) {
        assert!(
            pair[1].started >= pair[0].started + pair[0].worked + period,
            "fixed delay ran early"
        );
    }
    println!(
        "\nIn {total:?}: fixed rate ran {} times, fixed delay {} times.",
        rate.len(),
        delay.len()
    );
    wheel.shutdown().await;
}
