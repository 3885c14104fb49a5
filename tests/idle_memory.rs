//! Once a wheel is empty and idle after a flood, the memory the flood took returns to the
//! baseline on its own — without another command to prompt the actor.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_wheel::Wheel;

#[path = "support/counting.rs"]
mod counting;
use counting::{Counting, LIVE};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Memory a quiet wheel may keep beyond the baseline (buffers it retains on purpose).
const SLACK: isize = 1 << 20;

/// Waits, without sending the wheel anything, until its actors have applied `commands`
/// commands and hold nothing, then a little longer.
fn wait_until_idle(wheel: &Wheel, commands: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let stats = wheel.stats();
        if stats.commands >= commands && stats.pending == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never idle: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
}

#[test]
fn memory_taken_by_a_flood_returns_once_idle_without_another_command() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let wheel = Wheel::builder().runtime(runtime.handle().clone()).build();
    let (timers, expired) = {
        let _entered = runtime.enter();
        wheel.keyed::<u64, u64>()
    };
    std::thread::sleep(Duration::from_millis(50));
    let baseline = LIVE.load(Ordering::Relaxed);

    // Keyed: 2·10^6 sets then 2·10^6 removes, sent faster than the actor applies them.
    const KEYS: u64 = 2_000_000;
    for key in 0..KEYS {
        timers.set(key, key, Duration::from_secs(3_600));
    }
    for key in 0..KEYS {
        timers.remove(&key);
    }
    let flood_peak = LIVE.load(Ordering::Relaxed) - baseline;
    wait_until_idle(&wheel, 2 * KEYS);
    let keyed_retained = retained_after_idle(baseline);
    eprintln!("keyed flood: {flood_peak} bytes at its peak, {keyed_retained} retained when idle");
    assert!(
        keyed_retained < SLACK,
        "{keyed_retained} bytes still held after a keyed flood"
    );

    // Sleeps: 10^6 pending at once (the pool grows to hold them), then all dropped.
    let before = wheel.stats().commands;
    let sleeps: Vec<_> = (0..1_000_000u64)
        .map(|i| {
            let mut sleep = wheel.sleep(Duration::from_secs(3_600 + i % 1_000));
            let waker = std::task::Waker::noop();
            let _ = std::future::Future::poll(
                std::pin::Pin::new(&mut sleep),
                &mut std::task::Context::from_waker(waker),
            );
            sleep
        })
        .collect();
    // Let the actor file them all (a barrier: it would not otherwise take registrations due
    // an hour from now yet), so dropping them releases rather than withdraws.
    runtime.block_on(wheel.flush());
    assert_eq!(wheel.stats().pending, 1_000_000);
    drop(sleeps);
    wait_until_idle(&wheel, before + 2_000_000);
    let retained = retained_after_idle(baseline);
    eprintln!("sleep flood: {retained} bytes retained when idle");
    assert!(
        retained < SLACK,
        "{retained} bytes still held after a flood of sleeps"
    );

    // Jobs that fire while their handles live on past the idle grace (the actor's first try
    // to give memory back finds their slots held), handles dropped later: the slots coming
    // back must prompt another try.
    let before = wheel.stats().commands;
    let jobs: Vec<_> = (0..300_000u64)
        .map(|i| wheel.spawn_after(Duration::from_millis(10 + i % 100), async move { i }))
        .collect();
    wait_until_idle(&wheel, before + 300_000);
    std::thread::sleep(3 * Duration::from_millis(200));
    let before = wheel.stats().commands;
    drop(jobs);
    wait_until_idle(&wheel, before + 300_000);
    let retained = retained_after_idle(baseline);
    eprintln!("jobs: {retained} bytes retained when idle");
    assert!(
        retained < SLACK,
        "{retained} bytes still held after a flood of jobs whose handles outlived their run"
    );
    drop((timers, expired));
}

/// Live bytes beyond `baseline` once memory has come back, or after a minute of waiting (the
/// actor gives memory back after staying idle for a moment, on its own; the minute is a hang
/// guard, not a figure).
fn retained_after_idle(baseline: isize) -> isize {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let retained = LIVE.load(Ordering::Relaxed) - baseline;
        if retained < SLACK || std::time::Instant::now() > deadline {
            return retained;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
