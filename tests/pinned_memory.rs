//! A few long-lived timers hold only their own bytes: once a flood around them is over, the
//! memory it took returns although the wheel is never empty (issue 20, "one long-lived timer
//! pins a flood's memory").
//!
//! 10^5 timers by default, 10^6 with `TOKIO_WHEEL_FULL=1`. The bound is 16 MiB at 10^6 and
//! proportionally less at smaller sizes (the pool used to keep every segment, and the actor's
//! node table every id, while a single slot stayed in use: 56 MiB at 10^6).

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_wheel::Wheel;

#[path = "support/counting.rs"]
mod counting;
use counting::{Counting, LIVE};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The heap count is global: one test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn flood_size() -> u64 {
    if std::env::var_os("TOKIO_WHEEL_FULL").is_some() {
        1_000_000
    } else {
        100_000
    }
}

/// How long the flood's short timers wait, from the start of the flood: long enough that all
/// of them are pending at once (a debug build takes seconds to make 10^6).
fn hold(n: u64) -> Duration {
    Duration::from_secs(if n > 100_000 { 10 } else { 2 })
}

/// A short timer's delay, made now: due `hold(n)` after `start`, spread over 100 ms.
fn short_delay(start: std::time::Instant, n: u64, i: u64) -> Duration {
    (start + hold(n)).saturating_duration_since(std::time::Instant::now())
        + Duration::from_millis(i % 100)
}

/// Live heap growth allowed once the flood is over: 16 MiB per 10^6 timers of the flood.
fn bound(n: u64) -> isize {
    (16 << 20) * n as isize / 1_000_000
}

/// Waits, without sending the wheel anything, until its actors have applied `commands`
/// commands and hold `pending` timers.
fn wait_for(wheel: &Wheel, commands: u64, pending: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let stats = wheel.stats();
        if stats.commands >= commands && stats.pending == pending {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never settled: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Live bytes beyond `baseline`, once they are down to `bound` (the actor gives memory back
/// after a quiet moment, on its own), or what they still are after a 60 s hang guard: an
/// outcome, whatever the machine's load, not a figure within a time.
fn growth_within(baseline: isize, bound: isize) -> isize {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let growth = LIVE.load(Ordering::Relaxed) - baseline;
        if growth <= bound || std::time::Instant::now() > deadline {
            return growth;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn poll_once(sleep: &mut tokio_wheel::Sleep) {
    let waker = std::task::Waker::noop();
    let _ = std::future::Future::poll(
        std::pin::Pin::new(sleep),
        &mut std::task::Context::from_waker(waker),
    );
}

#[test]
fn one_long_timer_does_not_pin_the_memory_of_a_flood() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let n = flood_size();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let wheel = Wheel::builder().runtime(runtime.handle().clone()).build();
    std::thread::sleep(Duration::from_millis(50));
    let baseline = LIVE.load(Ordering::Relaxed);

    // Sleeps: n pending at once, one of them (made in the middle) an hour long.
    let start = std::time::Instant::now();
    let mut long = None;
    let sleeps: Vec<_> = (0..n)
        .filter_map(|i| {
            if i == n / 2 {
                let mut sleep = wheel.sleep(Duration::from_secs(3_600));
                poll_once(&mut sleep);
                long = Some(sleep);
                return None;
            }
            let mut sleep = wheel.sleep(short_delay(start, n, i));
            poll_once(&mut sleep);
            Some(sleep)
        })
        .collect();
    let long = long.unwrap();
    runtime.block_on(wheel.flush());
    let stats = wheel.stats();
    assert_eq!(stats.pending, n, "the flood is pending at once");
    // The rest fire, then their handles go: one release each for those the actor filed (a
    // sleep first polled once its deadline had passed, on a loaded machine, never is).
    wait_for(&wheel, stats.commands, 1);
    assert!(sleeps.iter().all(tokio_wheel::Sleep::is_elapsed));
    drop(sleeps);
    wait_for(&wheel, stats.commands + stats.inserted - 1, 1);
    let growth = growth_within(baseline, bound(n));
    eprintln!("sleeps: {growth} bytes held by one pending sleep after a flood of {n}");
    assert!(!long.is_elapsed(), "the long sleep is still pending");
    assert!(
        growth <= bound(n),
        "one pending sleep holds {growth} bytes of a flood of {n} (bound {})",
        bound(n)
    );
    drop(long);

    // Jobs: the same, one an hour out made in the middle; handles dropped at once (the jobs
    // run detached).
    let before = wheel.stats().commands;
    let start = std::time::Instant::now();
    let mut long_job = None;
    for i in 0..n {
        if i == n / 2 {
            long_job = Some(wheel.spawn_after(Duration::from_secs(3_600), async {}));
        } else {
            drop(wheel.spawn_after(short_delay(start, n, i), async {}));
        }
    }
    runtime.block_on(wheel.flush());
    assert_eq!(wheel.stats().pending, n, "the flood is pending at once");
    // Registrations and releases: two commands per job, one for the long one (and a flush).
    wait_for(&wheel, before + 2 * n, 1);
    let growth = growth_within(baseline, bound(n));
    eprintln!("jobs: {growth} bytes held by one pending job after a flood of {n}");
    assert!(
        growth <= bound(n),
        "one pending job holds {growth} bytes of a flood of {n} (bound {})",
        bound(n)
    );
    let long_job = long_job.unwrap();
    assert!(!long_job.is_finished());
    drop(long_job);
    drop(wheel);
    drop(runtime);
}

#[test]
fn one_long_keyed_entry_does_not_pin_the_memory_of_a_flood() {
    use futures::StreamExt;

    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let n = flood_size();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let wheel = Wheel::builder().runtime(runtime.handle().clone()).build();
    let (timers, mut expired) = {
        let _entered = runtime.enter();
        wheel.keyed::<u64, u64>()
    };
    std::thread::sleep(Duration::from_millis(50));
    let baseline = LIVE.load(Ordering::Relaxed);

    // n entries pending at once, the one made in the middle an hour out.
    let start = std::time::Instant::now();
    for key in 0..n {
        let after = if key == n / 2 {
            Duration::from_secs(3_600)
        } else {
            short_delay(start, n, key)
        };
        timers.set(key, key, after);
    }
    assert_eq!(
        runtime.block_on(timers.len()),
        n as usize,
        "pending at once"
    );
    // The rest expire and are read.
    let read = runtime.block_on(async {
        let mut read = 0;
        while read < n - 1 {
            let entry = expired.next().await.expect("the set is open");
            assert_ne!(*entry.key(), n / 2, "the long entry expired early");
            read += 1;
        }
        read
    });
    assert_eq!(read, n - 1);
    let growth = growth_within(baseline, bound(n));
    eprintln!("keyed: {growth} bytes held by one pending entry after a flood of {n}");
    assert_eq!(
        runtime.block_on(timers.len()),
        1,
        "the long entry is still pending"
    );
    assert!(
        growth <= bound(n),
        "one pending keyed entry holds {growth} bytes of a flood of {n} (bound {})",
        bound(n)
    );
    drop((timers, expired));
    drop(wheel);
    drop(runtime);
}
