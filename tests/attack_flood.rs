//! Outside attacks on "Commands never pile up without bound" (API.md, "Fairness and memory")
//! for keyed timers: floods of by-key `reset` / `set` / `remove` from many threads and from
//! tasks, with memory counted by a global allocator, authoritative calls made during the flood,
//! a shutdown in the middle, current-thread producers, a value whose `Drop` sets, and per-key
//! order. Tests run one at a time (a lock), so each one's memory peak is its own.

#[path = "support/counting.rs"]
mod counting;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use counting::{Counting, LIVE, PEAK, reset_peak};
use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel::keyed::Timers;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const HOUR: Duration = Duration::from_secs(3600);
const KEYS: u64 = 1_000;
/// The documented bound (2 × 256 Ki commands, tens of MiB) with room for tables.
const LIMIT: isize = 64 << 20;
/// "Eventually" guard for an answer during a flood.
const ANSWER: Duration = Duration::from_secs(60);

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

fn peak_over(baseline: isize) -> isize {
    PEAK.load(Ordering::Relaxed) - baseline
}

/// xorshift, per producer.
fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// One mixed command on a random key: set, reset (twice as often) or remove.
fn mixed(timers: &Timers<u64, u64>, next: &mut impl FnMut() -> u64, i: u64) {
    let key = next() % KEYS;
    match i % 4 {
        0 => timers.set(key, i, HOUR),
        1 | 2 => timers.reset(&key, HOUR),
        _ => timers.remove(&key),
    }
}

/// 16 plain threads (8× the cores) and 8 never-yielding tasks of a 2-worker runtime flood
/// set/reset/remove; during the flood `len`, `take` and `drain` are answered, and the memory
/// over the baseline stays within the bound.
#[test]
fn sixteen_threads_and_busy_tasks_flood_bounded_and_answered() {
    let _serial = serial();
    let rt = runtime(2);
    let wheel = rt.block_on(async { Wheel::new() });
    let (timers, _expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
    for key in 0..KEYS {
        timers.set(key, key, HOUR);
    }
    rt.block_on(async { assert_eq!(timers.len().await, KEYS as usize) });
    let baseline = LIVE.load(Ordering::Relaxed);
    reset_peak();
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..16)
        .map(|p| {
            let (timers, stop, made) = (timers.clone(), stop.clone(), made.clone());
            std::thread::spawn(move || {
                let mut next = rng(p + 1);
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    mixed(&timers, &mut next, i);
                    i += 1;
                }
                made.fetch_add(i, Ordering::Relaxed);
            })
        })
        .collect();
    let tasks: Vec<_> = (0..8)
        .map(|p| {
            let (timers, stop, made) = (timers.clone(), stop.clone(), made.clone());
            rt.spawn(async move {
                let mut next = rng(100 + p);
                let mut i = 0;
                // Never yields: only the backpressure lets the actor in.
                while !stop.load(Ordering::Relaxed) {
                    mixed(&timers, &mut next, i);
                    i += 1;
                }
                made.fetch_add(i, Ordering::Relaxed);
            })
        })
        .collect();
    // Authoritative calls from a plain thread during the flood.
    let handle = rt.handle().clone();
    let mut answered = 0;
    let flood_until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < flood_until {
        let len = handle.block_on(async { tokio::time::timeout(ANSWER, timers.len()).await });
        assert!(len.expect("len answered during the flood") <= KEYS as usize);
        let take = handle.block_on(async { tokio::time::timeout(ANSWER, timers.take(&7)).await });
        if let Some(v) = take.expect("take answered during the flood") {
            assert!(v == 7 || v % 4 == 0, "a value never set: {v}");
        }
        answered += 2;
        if answered % 10 == 0 {
            let all = handle.block_on(async { tokio::time::timeout(ANSWER, timers.drain()).await });
            let all = all.expect("drain answered during the flood");
            assert!(all.len() <= KEYS as usize);
            answered += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    rt.block_on(async {
        for t in tasks {
            tokio::time::timeout(ANSWER, t).await.unwrap().unwrap();
        }
    });
    let peak = peak_over(baseline);
    eprintln!(
        "{} commands, {answered} answers, peak +{} MiB",
        made.load(Ordering::Relaxed),
        peak >> 20
    );
    // Every call above was answered within ANSWER (the `expect`s); how many rounds fit in
    // the 3 s depends on the machine, so only the first is required.
    assert!(answered >= 2, "no round of calls was made: {answered}");
    assert!(
        peak < LIMIT,
        "the flood took {} MiB over the baseline (bound {} MiB)",
        peak >> 20,
        LIMIT >> 20
    );
    rt.block_on(async {
        let len = tokio::time::timeout(ANSWER, timers.len()).await.unwrap();
        assert!(len <= KEYS as usize);
        tokio::time::timeout(ANSWER, wheel.shutdown())
            .await
            .unwrap();
    });
}

/// One handle shared by threads and tasks: a `remove` followed by a `set` of the same key
/// (made in that order, on one thread, on a task that moves between workers, or handed from
/// one thread to another) is applied in that order while 6 threads flood the same keys with
/// resets; the last value set is what `take` finds.
#[test]
fn a_set_after_a_remove_is_applied_in_order_under_a_flood() {
    let _serial = serial();
    let rt = runtime(2);
    let wheel = rt.block_on(async { Wheel::new() });
    let (timers, _expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
    let timers = Arc::new(timers);
    let stop = Arc::new(AtomicBool::new(false));
    let flooders: Vec<_> = (0..6)
        .map(|p| {
            let (timers, stop) = (timers.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut next = rng(p + 7);
                while !stop.load(Ordering::Relaxed) {
                    let key = next() % 400;
                    timers.reset(&key, HOUR);
                    timers.reset(&key, HOUR * 2);
                }
            })
        })
        .collect();
    const ROUNDS: u64 = 3_000;
    // Plain threads, keys 0..100 (4 × 25): remove then set, over and over.
    let checkers: Vec<_> = (0..4u64)
        .map(|c| {
            let timers = timers.clone();
            std::thread::spawn(move || {
                for round in 0..ROUNDS {
                    let key = c * 25 + round % 25;
                    timers.set(key, round * 10, HOUR);
                    timers.remove(&key);
                    timers.set(key, round * 10 + 1, HOUR);
                    timers.reset(&key, HOUR * 3);
                }
            })
        })
        .collect();
    // Tasks on the multi-thread runtime, keys 100..200, yielding between the remove and the
    // set (so they may move to another worker, and another inbox shard).
    let tasks: Vec<_> = (0..4u64)
        .map(|c| {
            let timers = timers.clone();
            rt.spawn(async move {
                for round in 0..ROUNDS / 3 {
                    let key = 100 + c * 25 + round % 25;
                    timers.remove(&key);
                    tokio::task::yield_now().await;
                    timers.set(key, round * 10 + 1, HOUR);
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    // Hand-off between threads, keys 200..225: A removes, then tells B, which sets.
    let (tx, rx) = std::sync::mpsc::sync_channel::<(u64, u64)>(64);
    let remover = {
        let timers = timers.clone();
        std::thread::spawn(move || {
            for round in 0..ROUNDS {
                let key = 200 + round % 25;
                timers.set(key, 0, HOUR);
                timers.remove(&key);
                tx.send((key, round * 10 + 1)).unwrap();
            }
        })
    };
    let setter = {
        let timers = timers.clone();
        std::thread::spawn(move || {
            while let Ok((key, value)) = rx.recv() {
                timers.set(key, value, HOUR);
            }
        })
    };
    for c in checkers {
        c.join().unwrap();
    }
    remover.join().unwrap();
    setter.join().unwrap();
    rt.block_on(async {
        for t in tasks {
            tokio::time::timeout(ANSWER, t).await.unwrap().unwrap();
        }
    });
    // Still flooding: the takes are answered, and each finds the last value set.
    rt.block_on(async {
        for c in 0..4u64 {
            for j in 0..25 {
                let key = c * 25 + j;
                let last = (0..ROUNDS).filter(|r| r % 25 == j).max().unwrap() * 10 + 1;
                let got = tokio::time::timeout(ANSWER, timers.take(&key))
                    .await
                    .unwrap();
                assert_eq!(got, Some(last), "thread key {key}");
            }
        }
        for c in 0..4u64 {
            for j in 0..25 {
                let key = 100 + c * 25 + j;
                let last = (0..ROUNDS / 3).filter(|r| r % 25 == j).max().unwrap() * 10 + 1;
                let got = tokio::time::timeout(ANSWER, timers.take(&key))
                    .await
                    .unwrap();
                assert_eq!(got, Some(last), "task key {key}");
            }
        }
        for j in 0..25 {
            let key = 200 + j;
            let last = (0..ROUNDS).filter(|r| r % 25 == j).max().unwrap() * 10 + 1;
            let got = tokio::time::timeout(ANSWER, timers.take(&key))
                .await
                .unwrap();
            assert_eq!(got, Some(last), "hand-off key {key}");
        }
    });
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.join().unwrap();
    }
    rt.block_on(async {
        tokio::time::timeout(ANSWER, wheel.shutdown())
            .await
            .unwrap()
    });
}

/// A flood from 8 threads and 4 tasks while another thread calls `shutdown()`: the shutdown
/// returns, every producer's calls return (set refused silently), the stream delivers what is
/// left marked `is_shutdown()` and ends, and later calls answer empty at once.
#[test]
fn a_flood_while_shutdown_is_called_from_another_thread() {
    let _serial = serial();
    let rt = runtime(2);
    let wheel = rt.block_on(async { Wheel::new() });
    let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
    let baseline = LIVE.load(Ordering::Relaxed);
    reset_peak();
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..8)
        .map(|p| {
            let (timers, stop) = (timers.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut next = rng(p + 31);
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    mixed(&timers, &mut next, i);
                    i += 1;
                }
            })
        })
        .collect();
    let tasks: Vec<_> = (0..4)
        .map(|p| {
            let (timers, stop) = (timers.clone(), stop.clone());
            rt.spawn(async move {
                let mut next = rng(p + 61);
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    mixed(&timers, &mut next, i);
                    i += 1;
                    if i % 4096 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();
    let reader = rt.spawn(async move {
        let mut normal_after_shutdown = 0u64;
        let mut shutdown_marked = 0u64;
        while let Some(e) = expired.next().await {
            if e.is_shutdown() {
                shutdown_marked += 1;
            } else if shutdown_marked > 0 {
                normal_after_shutdown += 1;
            }
        }
        (shutdown_marked, normal_after_shutdown)
    });
    std::thread::sleep(Duration::from_millis(800));
    let stopper = {
        let (wheel, handle) = (wheel.clone(), rt.handle().clone());
        std::thread::spawn(move || {
            handle.block_on(async { tokio::time::timeout(ANSWER, wheel.shutdown()).await })
        })
    };
    stopper
        .join()
        .unwrap()
        .expect("shutdown() returned during a flood");
    // Producers keep calling on the stopped wheel for a moment: those calls return.
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for p in producers {
            p.join().unwrap();
        }
        tx.send(()).unwrap();
    });
    rx.recv_timeout(ANSWER)
        .expect("flooding threads did not return after the shutdown");
    rt.block_on(async {
        for t in tasks {
            tokio::time::timeout(ANSWER, t).await.unwrap().unwrap();
        }
        let (marked, normal_after) = tokio::time::timeout(ANSWER, reader)
            .await
            .expect("the stream ended after the shutdown")
            .unwrap();
        assert_eq!(normal_after, 0, "a normal expiry after the shutdown flush");
        assert!(marked > 0, "nothing delivered by the shutdown flush");
        // Stopped wheel: prompt empty answers.
        timers.set(1, 1, HOUR);
        assert_eq!(tokio::time::timeout(ANSWER, timers.len()).await.unwrap(), 0);
        assert_eq!(
            tokio::time::timeout(ANSWER, timers.take(&1)).await.unwrap(),
            None
        );
        assert!(
            tokio::time::timeout(ANSWER, timers.drain())
                .await
                .unwrap()
                .is_empty()
        );
    });
    let peak = peak_over(baseline);
    assert!(peak < LIMIT, "peak +{} MiB", peak >> 20);
}

/// The wheel on a current-thread runtime, flooded by that runtime's own task (never
/// yielding) and then asked: no deadlock, the answer is right.
#[test]
fn a_current_thread_wheel_flooded_by_its_own_task_does_not_deadlock() {
    let _serial = serial();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let wheel = Wheel::new();
        let (timers, _expired) = wheel.keyed::<u64, u64>();
        for key in 0..KEYS {
            timers.set(key, key, HOUR);
        }
        // Far past the shard bound, without a yield.
        for i in 0..600_000u64 {
            timers.reset(&(i % KEYS), HOUR);
        }
        timers.remove(&3);
        timers.set(3, 33, HOUR);
        let len = tokio::time::timeout(ANSWER, timers.len()).await.unwrap();
        assert_eq!(len, KEYS as usize);
        assert_eq!(
            tokio::time::timeout(ANSWER, timers.take(&3)).await.unwrap(),
            Some(33)
        );
        tokio::time::timeout(ANSWER, wheel.shutdown())
            .await
            .unwrap();
    });
}

/// Producers on current-thread runtimes of their own (two threads), feeding a wheel that runs
/// on a multi-thread runtime, yielding to their runtime every 1 000 commands: a `len` made
/// during the flood is answered, nothing deadlocks, and the waiting commands stay within the
/// bound ("whatever rate producers on any number of threads make commands at").
fn current_thread_producers_of_another_runtime(check_memory: bool) {
    let _serial = serial();
    let rt = runtime(2);
    let wheel = rt.block_on(async { Wheel::new() });
    let (timers, _expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
    for key in 0..KEYS {
        timers.set(key, key, HOUR);
    }
    rt.block_on(async { assert_eq!(timers.len().await, KEYS as usize) });
    let baseline = LIVE.load(Ordering::Relaxed);
    reset_peak();
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicU64::new(0));
    let producers: Vec<_> = (0..2)
        .map(|p| {
            let (timers, stop, made) = (timers.clone(), stop.clone(), made.clone());
            std::thread::spawn(move || {
                let local = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                local.block_on(async move {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        timers.reset(&((i * 7 + p) % KEYS), HOUR);
                        i += 1;
                        if i % 1000 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                    made.fetch_add(i, Ordering::Relaxed);
                });
            })
        })
        .collect();
    let handle = rt.handle().clone();
    let flood = Duration::from_millis(if check_memory { 3000 } else { 1000 });
    let until = std::time::Instant::now() + flood;
    let mut answered = 0;
    while std::time::Instant::now() < until {
        let len = handle.block_on(async { tokio::time::timeout(ANSWER, timers.len()).await });
        assert_eq!(len.expect("len answered during the flood"), KEYS as usize);
        answered += 1;
        if check_memory && peak_over(baseline) > 4 * LIMIT {
            break; // clearly unbounded; stop before the machine suffers
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for p in producers {
        p.join().unwrap();
    }
    let peak = peak_over(baseline);
    eprintln!(
        "{} commands from current-thread runtimes, {answered} answers, peak +{} MiB",
        made.load(Ordering::Relaxed),
        peak >> 20
    );
    assert!(answered >= 1);
    rt.block_on(async {
        assert_eq!(
            tokio::time::timeout(ANSWER, timers.len()).await.unwrap(),
            KEYS as usize
        );
        tokio::time::timeout(ANSWER, wheel.shutdown())
            .await
            .unwrap();
    });
    if check_memory {
        assert!(
            peak < LIMIT,
            "producers on current-thread runtimes (not the wheel's) took {} MiB over the baseline (bound {} MiB)",
            peak >> 20,
            LIMIT >> 20
        );
    }
}

#[test]
fn current_thread_producers_of_another_runtime_do_not_deadlock() {
    current_thread_producers_of_another_runtime(false);
}

#[test]
fn current_thread_producers_of_another_runtime_take_bounded_memory() {
    current_thread_producers_of_another_runtime(true);
}

/// A value whose `Drop` calls `set` on the same keyed set (a chain, depth-limited). Four
/// threads flood `set` on a few keys, so the actor drops replaced values (and their `Drop`
/// sets) while shards are full; takes from the runtime drop values on its threads. Nothing
/// deadlocks, the sets made from `Drop` are applied, and a shutdown at the end completes.
struct Chained {
    timers: Arc<Mutex<Option<Timers<u64, Chained>>>>,
    key: u64,
    depth: u32,
    drops: Arc<AtomicUsize>,
}

impl Drop for Chained {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::Relaxed);
        if self.depth == 0 {
            return;
        }
        let timers = self.timers.lock().unwrap().clone();
        if let Some(timers) = timers {
            timers.set(
                1_000_000 + self.key,
                Chained {
                    timers: self.timers.clone(),
                    key: self.key,
                    depth: self.depth - 1,
                    drops: self.drops.clone(),
                },
                HOUR,
            );
        }
    }
}

#[test]
fn a_value_whose_drop_sets_the_same_set_under_a_flood() {
    let _serial = serial();
    let rt = runtime(2);
    let wheel = rt.block_on(async { Wheel::new() });
    let (timers, expired) = rt.block_on(async { wheel.keyed::<u64, Chained>() });
    let shared = Arc::new(Mutex::new(Some(timers.clone())));
    let drops = Arc::new(AtomicUsize::new(0));
    let made = Arc::new(AtomicUsize::new(0));
    let producers: Vec<_> = (0..4u64)
        .map(|p| {
            let (timers, shared, drops, made) =
                (timers.clone(), shared.clone(), drops.clone(), made.clone());
            std::thread::spawn(move || {
                for i in 0..60_000u64 {
                    let key = p * 8 + i % 8;
                    timers.set(
                        key,
                        Chained {
                            timers: shared.clone(),
                            key,
                            depth: 2,
                            drops: drops.clone(),
                        },
                        HOUR,
                    );
                    if i % 3 == 0 {
                        timers.reset(&key, HOUR * 2);
                    }
                }
                made.fetch_add(60_000, Ordering::Relaxed);
            })
        })
        .collect();
    // During the flood: takes (the value dropped here sets again) answered.
    rt.block_on(async {
        for round in 0..20u64 {
            let key = round % 32;
            let got = tokio::time::timeout(ANSWER, timers.take(&key))
                .await
                .expect("take answered during the flood");
            drop(got);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    for p in producers {
        p.join().unwrap();
    }
    rt.block_on(async {
        // Every chained key a replaced value set from its Drop is there.
        let len = tokio::time::timeout(ANSWER, timers.len()).await.unwrap();
        assert!(len > 32, "only {len} entries");
        for key in 0..32u64 {
            let chained = tokio::time::timeout(ANSWER, timers.take(&(1_000_000 + key)))
                .await
                .unwrap();
            assert!(
                chained.is_some(),
                "the set made from Drop for {key} is missing"
            );
        }
        assert!(drops.load(Ordering::Relaxed) > 200_000);
        // Shut down with the values still holding the set: the flush delivers them (their
        // Drop sets are refused silently), the stream ends.
        tokio::time::timeout(ANSWER, wheel.shutdown())
            .await
            .expect("shutdown with self-setting values");
        let rest: Vec<_> = tokio::time::timeout(ANSWER, expired.collect::<Vec<_>>())
            .await
            .expect("the stream ends");
        assert!(rest.iter().all(|e| e.is_shutdown()));
        drop(rest);
        shared.lock().unwrap().take();
        assert_eq!(tokio::time::timeout(ANSWER, timers.len()).await.unwrap(), 0);
    });
}

/// The same self-setting values, dropped by the actor *during* the shutdown flush (no reader
/// of the stream, the stream dropped first): the shutdown still completes.
#[test]
fn values_setting_from_drop_during_the_shutdown_flush() {
    let _serial = serial();
    let rt = runtime(2);
    let wheel = rt.block_on(async { Wheel::new() });
    let (timers, expired) = rt.block_on(async { wheel.keyed::<u64, Chained>() });
    drop(expired);
    let shared = Arc::new(Mutex::new(Some(timers.clone())));
    let drops = Arc::new(AtomicUsize::new(0));
    for key in 0..10_000u64 {
        timers.set(
            key,
            Chained {
                timers: shared.clone(),
                key,
                depth: 3,
                drops: drops.clone(),
            },
            HOUR,
        );
    }
    let stopper = {
        let (wheel, handle) = (wheel.clone(), rt.handle().clone());
        std::thread::spawn(move || {
            handle.block_on(async { tokio::time::timeout(ANSWER, wheel.shutdown()).await })
        })
    };
    // Keep setting (and replacing: drops in the actor) while it stops.
    for i in 0..50_000u64 {
        let key = i % 10_000;
        timers.set(
            key,
            Chained {
                timers: shared.clone(),
                key,
                depth: 3,
                drops: drops.clone(),
            },
            HOUR,
        );
    }
    stopper.join().unwrap().expect("shutdown completed");
    rt.block_on(async {
        assert_eq!(tokio::time::timeout(ANSWER, timers.len()).await.unwrap(), 0);
    });
    shared.lock().unwrap().take();
}
