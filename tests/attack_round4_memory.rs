//! Outside attack, round 4, on API.md "Fairness and memory": a keyed flood of which a few
//! entries survive; once the survivors are gone too (taken, or fired), the wheel is empty and
//! idle, and the memory the flood took must come back without another command. Real time on a
//! 2-worker runtime (memory is given back after idling a moment), with a counting allocator.

use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use tokio_wheel::{Expirations, Timers, Wheel};

#[path = "support/counting.rs"]
mod counting;
use counting::{Counting, LIVE};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Memory a quiet wheel may keep beyond the baseline (as `tests/idle_memory.rs`).
const SLACK: isize = 1 << 20;

fn full() -> bool {
    std::env::var_os("TOKIO_WHEEL_FULL").is_some()
}

/// Live bytes beyond `baseline` once they fall under [`SLACK`], or after `wait` of real time.
/// A hang guard, not a figure: memory that never comes back fails the test after this.
const HANG: Duration = Duration::from_secs(60);

fn retained_after(baseline: isize, wait: Duration) -> isize {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let retained = LIVE.load(Ordering::Relaxed) - baseline;
        if retained < SLACK || std::time::Instant::now() > deadline {
            return retained;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The tests here measure the one global heap: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// A runtime, a wheel on it and a keyed set, with the heap bytes live once they are made.
fn setup() -> (
    tokio::runtime::Runtime,
    Wheel,
    Timers<u64, u64>,
    Expirations<u64, u64>,
    isize,
) {
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
    (runtime, wheel, timers, expired, baseline)
}

/// Sets `keys` keys due in an hour, then removes all but every 1 000th.
fn flood(runtime: &tokio::runtime::Runtime, timers: &Timers<u64, u64>, keys: u64) -> usize {
    for key in 0..keys {
        timers.set(key, key, Duration::from_secs(3_600));
    }
    for key in 0..keys {
        if key % 1_000 != 0 {
            timers.remove(&key);
        }
    }
    let survivors = keys.div_ceil(1_000) as usize;
    assert_eq!(runtime.block_on(timers.len()), survivors);
    survivors
}

/// Survivors of a flood that go (taken, or moved earlier and fired) before the wheel has
/// idled: once it is empty and idle, the flood's memory is back.
#[test]
fn flood_memory_comes_back_once_its_survivors_are_taken_or_fired() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (runtime, _wheel, timers, mut expired, baseline) = setup();
    let keys: u64 = if full() { 1_000_000 } else { 200_000 };
    for round in 0..2u64 {
        let survivors = flood(&runtime, &timers, keys);
        if round == 0 {
            for key in (0..keys).step_by(1_000) {
                assert_eq!(runtime.block_on(timers.take(&key)), Some(key));
            }
        } else {
            for key in (0..keys).step_by(1_000) {
                timers.reset(&key, Duration::from_millis(5));
            }
            runtime.block_on(async {
                for _ in 0..survivors {
                    let e = tokio::time::timeout(HANG, expired.next())
                        .await
                        .expect("a survivor never fired")
                        .unwrap();
                    assert_eq!(e.key() % 1_000, 0);
                }
            });
        }
        assert_eq!(runtime.block_on(timers.len()), 0);
        let retained = retained_after(baseline, HANG);
        assert!(
            retained < SLACK,
            "round {round}: {retained} bytes still held once the last survivor went"
        );
    }
}

/// A finding of the round-4 attack, fixed (it failed every run before): a flood of 200 000 keys leaves 200 survivors spread over it (every 1 000th); the
/// wheel idles 2 s with them set (it keeps ~9.6 MB then, ~50 KB per survivor), then they are
/// removed (or moved to 5 ms and fired: the same). Empty and idle, the set still holds
/// ~10.4 MB (seen for 6 s, and after 1 000 more sets and removes; a second flood removed whole
/// gives it back). With 1 or 2 survivors, 200 adjacent ones, or survivors gone before the
/// idle pause, the memory comes back.
#[test]
fn flood_memory_comes_back_once_scattered_survivors_go_after_an_idle_pause() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (runtime, _wheel, timers, _expired, baseline) = setup();
    let keys = 200_000u64;
    flood(&runtime, &timers, keys);
    std::thread::sleep(Duration::from_secs(2));
    let held = LIVE.load(Ordering::Relaxed) - baseline;
    for key in (0..keys).step_by(1_000) {
        timers.remove(&key);
    }
    assert_eq!(runtime.block_on(timers.len()), 0);
    let retained = retained_after(baseline, HANG);
    assert!(
        retained < SLACK,
        "{retained} bytes still held once empty and idle ({held} held with the survivors)"
    );
}

/// A flood whose first 300 keys survive (the index and its storage can shrink around them):
/// after the wheel idled and gave memory back, the survivors are still found — taken, moved
/// earlier by key and by handle, replaced — and fire once each, never early; then the memory
/// is back.
#[test]
fn survivors_of_a_shrunk_flood_are_found_moved_and_fired() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (runtime, _wheel, timers, mut expired, baseline) = setup();
    let keys: u64 = if full() { 1_000_000 } else { 200_000 };
    let survivors = 300u64;
    let handles: Vec<_> = (0..survivors)
        .map(|key| timers.insert(key, key, Duration::from_secs(3_600)))
        .collect();
    for key in survivors..keys {
        timers.set(key, key, Duration::from_secs(3_600));
    }
    for key in survivors..keys {
        timers.remove(&key);
    }
    assert_eq!(runtime.block_on(timers.len()), survivors as usize);
    std::thread::sleep(Duration::from_secs(2));
    let held = LIVE.load(Ordering::Relaxed) - baseline;
    eprintln!("{held} bytes held with {survivors} survivors after idling");
    let start = tokio::time::Instant::now();
    let mut want = std::collections::BTreeMap::new();
    for (i, handle) in handles.iter().enumerate() {
        let key = *handle.key();
        let after = Duration::from_millis(5 + i as u64 % 40);
        match i % 5 {
            0 => assert_eq!(runtime.block_on(timers.take(&key)), Some(key)),
            1 => assert_eq!(runtime.block_on(handle.take()), Some(key)),
            2 => {
                handle.reset(after);
                want.insert(key, (key, start + after));
            }
            3 => {
                timers.reset(&key, after);
                want.insert(key, (key, start + after));
            }
            _ => {
                timers.set(key, key + 1, after);
                want.insert(key, (key + 1, start + after));
            }
        }
    }
    for key in (survivors..keys).step_by(997) {
        assert_eq!(runtime.block_on(timers.take(&key)), None, "{key}");
    }
    runtime.block_on(async {
        for _ in 0..want.len() {
            let e = tokio::time::timeout(HANG, expired.next())
                .await
                .expect("a survivor never fired")
                .unwrap();
            assert!(tokio::time::Instant::now() >= e.deadline(), "fired early");
            let deadline = e.deadline();
            let (key, value) = e.into_parts();
            let (want_value, want_deadline) = want.remove(&key).expect("fired twice");
            assert_eq!(value, want_value, "{key}");
            assert!(deadline >= want_deadline, "{key}: deadline");
        }
    });
    assert_eq!(runtime.block_on(timers.len()), 0);
    drop(handles);
    let retained = retained_after(baseline, HANG);
    assert!(retained < SLACK, "{retained} bytes still held once empty");
}
