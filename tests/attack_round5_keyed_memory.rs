//! Outside attack, round 5, on API.md "Fairness and memory" with a keyed flood made from eight
//! threads at once (so into many per-thread inbox shards, unlike `tests/idle_memory.rs` and
//! `tests/attack_round4_memory.rs`, which flood from one): once the set is empty and idle, the
//! memory the flood took comes back without another command. Real time on a 2-worker runtime,
//! with the counting allocator of `tests/support/counting.rs`.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_wheel::Wheel;

#[path = "support/counting.rs"]
mod counting;
use counting::{Counting, LIVE};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Memory a quiet wheel may keep beyond the baseline (as `tests/idle_memory.rs`).
const SLACK: isize = 1 << 20;

#[test]
fn memory_of_a_flood_from_eight_threads_comes_back_once_idle() {
    let per_thread: u64 = if std::env::var_os("TOKIO_WHEEL_FULL").is_some() {
        250_000
    } else {
        40_000
    };
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
    // Eight threads at once: set keys due in an hour (some through handles), then remove them.
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let timers = timers.clone();
            std::thread::spawn(move || {
                let base = t * 1_000_000_000;
                let mut handles = Vec::new();
                for i in 0..per_thread {
                    if i % 10 == 0 {
                        handles.push(timers.insert(base + i, i, Duration::from_secs(3_600)));
                    } else {
                        timers.set(base + i, i, Duration::from_secs(3_600));
                    }
                }
                for i in 0..per_thread {
                    if i % 10 != 0 {
                        timers.remove(&(base + i));
                    }
                }
                for handle in &handles {
                    handle.reset(Duration::from_secs(7_200));
                    handle.remove();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let peak = LIVE.load(Ordering::Relaxed) - baseline;
    // A barrier over every key: everything made above is applied, and nothing is left.
    assert_eq!(runtime.block_on(timers.len()), 0);
    let stats = support::stats_once(&wheel, |s| s.pending == 0);
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(stats.cancelled, 8 * per_thread, "{stats:?}");
    // Now idle: nothing more is sent; memory must come back on its own (the wait is a hang
    // guard, not a figure).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let retained = loop {
        let retained = LIVE.load(Ordering::Relaxed) - baseline;
        if retained < SLACK || std::time::Instant::now() > deadline {
            break retained;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("8-thread keyed flood: {peak} bytes after sending, {retained} retained when idle");
    assert!(
        retained < SLACK,
        "{retained} bytes still held after a flood from eight threads went idle"
    );
    drop((timers, expired));
}
