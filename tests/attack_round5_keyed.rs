//! Outside attack, round 5, on API.md §3 with keyed calls made from many threads and tasks at
//! once: 2-worker runtimes, plain `std::thread`s, hand-offs through channels and a `Mutex`,
//! `spawn_blocking`, and a current-thread runtime fed from other threads.
//!
//! Each test checks an outcome that the order of the calls implies (value, deadline through
//! `Expired::deadline`, fired or not, counts), never how long anything took. Real time: a
//! deadline that must not fire is hours away, one that must fire is due within a second; a
//! `tokio::time::timeout` of tens of seconds only turns a hang into a failure.

mod support;

use support::round5::*;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use tokio::time::Instant;
use tokio_wheel::Wheel;

/// Whether two deadlines are the same up to the wheel's 1 ms resolution (deadlines the tests
/// tell apart are at least 5 ms apart).
fn same(a: Instant, b: Instant) -> bool {
    let gap = if a > b { a - b } else { b - a };
    gap <= ms(1)
}

// ───────────── one handle's commands, made by a task that moves between workers ─────────────

/// 16 tasks on 2 workers, each yielding (so it is stolen across workers) or going through
/// `spawn_blocking` between two commands on its key. Three scripts, each with an outcome that
/// only the order made gives.
#[test]
fn a_task_moving_between_workers_keeps_its_commands_in_order() {
    const TASKS: u64 = 16;
    let per_task = scale(150, 3_000);
    let runtime = runtime();
    runtime.block_on(async {
        let wheel = Wheel::new();
        let (timers, mut expired) = wheel.keyed::<u64, u64>();
        // Deadlines that fire, likely in the past by the time the last command is made: the
        // value-1 deadline may fire before the set of value 2 is made (then both arrive).
        let anchor = Instant::now() + ms(300);
        let first = move |k: u64| anchor + ms(10 * (k % 20));
        let last = move |k: u64| first(k) + ms(5);
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let timers = timers.clone();
                tokio::spawn(async move {
                    for i in 0..per_task {
                        let k = task * 1_000_000 + i;
                        match i % 3 {
                            // Fires once with value 2 at `last(k)`.
                            0 => {
                                timers.set(k, 1, HOUR);
                                tokio::task::yield_now().await;
                                if i % 2 == 0 {
                                    let timers = timers.clone();
                                    tokio::task::spawn_blocking(move || {
                                        timers.reset_at(&k, first(k))
                                    })
                                    .await
                                    .unwrap();
                                } else {
                                    timers.reset_at(&k, first(k));
                                }
                                tokio::task::yield_now().await;
                                timers.set(k, 2, 2 * HOUR);
                                tokio::task::yield_now().await;
                                timers.reset_at(&k, last(k));
                            }
                            // Still set with value 2 at the end, never fired.
                            1 => {
                                timers.set_at(k, 1, first(k));
                                tokio::task::yield_now().await;
                                timers.remove(&k);
                                tokio::task::yield_now().await;
                                timers.set(k, 2, HOUR);
                                tokio::task::yield_now().await;
                                timers.reset(&k, 2 * HOUR);
                            }
                            // Gone at the end, never fired.
                            _ => {
                                timers.set(k, 1, HOUR);
                                tokio::task::yield_now().await;
                                timers.set(k, 2, 2 * HOUR);
                                tokio::task::yield_now().await;
                                timers.remove(&k);
                            }
                        }
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let keys = || (0..TASKS).flat_map(|t| (0..per_task).map(move |i| (t * 1_000_000 + i, i)));
        let to_fire = keys().filter(|(_, i)| i % 3 == 0).count();
        let got = read_until(&mut expired, |got| {
            got.iter().filter(|(e, _)| *e.value() == 2).count() >= to_fire
        })
        .await;
        let mut twos = HashSet::new();
        for (e, read) in &got {
            let k = *e.key();
            assert_eq!(k % 1_000_000 % 3, 0, "key {k} fired: {e:?}");
            assert!(*read >= e.deadline(), "key {k} fired early");
            match e.value() {
                2 => {
                    assert!(twos.insert(k), "key {k} fired twice with value 2");
                    assert!(
                        same(e.deadline(), last(k)),
                        "key {k}: value 2 fired for another deadline than the last made: {e:?}"
                    );
                }
                _ => assert!(
                    same(e.deadline(), first(k)),
                    "key {k}: value 1 fired for a deadline it never had: {e:?}"
                ),
            }
        }
        let survivors = keys().filter(|(_, i)| i % 3 == 1).count();
        assert_eq!(
            timers.len().await,
            survivors,
            "a remove or set out of order"
        );
        for (k, i) in keys() {
            let taken = timers.take(&k).await;
            match i % 3 {
                1 => assert_eq!(taken, Some(2), "key {k}"),
                _ => assert_eq!(taken, None, "key {k}"),
            }
        }
        assert_eq!(support::stats_once(&wheel, |s| s.pending == 0).pending, 0);
    });
}

// ───────────── chains of hand-offs between threads ─────────────

/// How far ahead this file's "soon" deadlines are: far enough that no hand-off between two
/// threads of a loaded machine lags that long (the later command must return before it),
/// near enough that a command applied out of order fires within the test.
const SOON: Duration = Duration::from_millis(1_500);

/// Thread A inserts and moves the entry earlier, B postpones it (through the handle or by
/// key), C moves it again: each later call was made after the earlier returned, so every
/// entry ends due in two hours and nothing fires, whatever thread made what.
#[test]
fn a_chain_of_three_threads_ends_with_the_last_move_made() {
    let keys = scale(3_000, 40_000);
    let runtime = runtime();
    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, _expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    let (to_b, at_b) = mpsc::channel();
    let (to_c, at_c) = mpsc::channel();
    let a = {
        let timers = timers.clone();
        std::thread::spawn(move || {
            for k in 0..keys {
                let t = timers.insert(k, k, HOUR);
                if k % 2 == 0 {
                    // Earlier, through the handle: a store and a command.
                    t.reset_at(Instant::now() + SOON);
                }
                to_b.send(t).unwrap();
            }
        })
    };
    let b = {
        let timers = timers.clone();
        std::thread::spawn(move || {
            for t in at_b {
                if t.key() % 2 == 0 {
                    // Later, through the handle: after A's earlier move.
                    t.reset(2 * HOUR);
                } else {
                    // Earlier, by key, while the handle sits in a channel.
                    timers.reset_at(t.key(), Instant::now() + SOON);
                }
                to_c.send(t).unwrap();
            }
        })
    };
    let c = std::thread::spawn(move || {
        let mut handles = Vec::new();
        for t in at_c {
            if t.key() % 2 == 1 {
                // Later, through the handle, after B's earlier by-key move.
                t.reset(2 * HOUR);
            }
            handles.push(t);
        }
        handles
    });
    a.join().unwrap();
    b.join().unwrap();
    let handles = c.join().unwrap();
    runtime.block_on(async {
        // Well past every earlier deadline: a move applied out of order would have fired by
        // now.
        tokio::time::sleep(SOON + ms(300)).await;
        assert_eq!(wheel.stats().fired, 0, "an earlier move undid a later one");
        assert_eq!(timers.len().await, keys as usize);
        for t in &handles {
            let k = *t.key();
            let taken = if k % 4 < 2 {
                t.take().await
            } else {
                timers.take(&k).await
            };
            assert_eq!(taken, Some(k), "key {k}");
        }
    });
}

/// Set (value 1) on a tokio task, set again (value 2) on a `spawn_blocking` thread, then a
/// take or a remove on a plain thread; hand-offs through one `Mutex`-guarded queue per step.
/// A take made after both sets returned gets value 2; a removed key never fires.
#[test]
fn hand_offs_through_a_mutex_keep_set_set_take_in_order() {
    let keys = scale(2_000, 30_000);
    let runtime = runtime();
    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, mut expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    let second: Arc<Mutex<Vec<u64>>> = Arc::default();
    let third: Arc<Mutex<Vec<u64>>> = Arc::default();
    let first_done = Arc::new(AtomicBool::new(false));
    let second_done = Arc::new(AtomicBool::new(false));
    let setter = {
        let (timers, second, done) = (timers.clone(), second.clone(), first_done.clone());
        runtime.spawn(async move {
            for k in 0..keys {
                // Due soon: value 1 arriving means the second set lost to it.
                timers.set(k, 1, SOON);
                second.lock().unwrap().push(k);
                if k % 8 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let resetter = {
        let (timers, second, third, done) = (
            timers.clone(),
            second.clone(),
            third.clone(),
            second_done.clone(),
        );
        let first_done = first_done.clone();
        runtime.spawn_blocking(move || {
            loop {
                let finished = first_done.load(Ordering::SeqCst);
                let batch = std::mem::take(&mut *second.lock().unwrap());
                for k in &batch {
                    timers.set(*k, 2, HOUR);
                }
                third.lock().unwrap().extend(batch);
                if finished && second.lock().unwrap().is_empty() {
                    break;
                }
                std::thread::yield_now();
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let taker = {
        let (timers, handle) = (timers.clone(), runtime.handle().clone());
        std::thread::spawn(move || {
            let mut taken = Vec::new();
            loop {
                let finished = second_done.load(Ordering::SeqCst);
                let batch = std::mem::take(&mut *third.lock().unwrap());
                for k in batch {
                    if k % 2 == 0 {
                        taken.push((k, handle.block_on(timers.take(&k))));
                    } else {
                        timers.remove(&k);
                    }
                }
                if finished && third.lock().unwrap().is_empty() {
                    return taken;
                }
                std::thread::yield_now();
            }
        })
    };
    runtime.block_on(async {
        setter.await.unwrap();
        resetter.await.unwrap();
    });
    let taken = taker.join().unwrap();
    assert_eq!(taken.len() as u64, keys / 2);
    for (k, value) in taken {
        assert_eq!(
            value,
            Some(2),
            "key {k}: a take did not see the set made before it"
        );
    }
    runtime.block_on(async {
        assert_eq!(
            timers.len().await,
            0,
            "a remove applied before a set made before it"
        );
        tokio::time::sleep(ms(100)).await;
        drop(timers);
        let left: Vec<_> = read_until(&mut expired, |_| false).await;
        assert!(left.is_empty(), "fired: {:?}", left.first());
    });
}

// ───────────── len and drain against other threads' sets ─────────────

/// One round: 8 producers (4 plain threads, 2 tasks on the 2 workers, 2 `spawn_blocking`)
/// set, replace, remove and reset their own keys, then report; a `len` made after every
/// report counts exactly the keys they left set, and a `drain` returns them with their last
/// values.
fn burst_then_count(runtime: &tokio::runtime::Runtime, timers: &tokio_wheel::Timers<u64, u64>) {
    let per = scale(1_000, 20_000);
    for round in 0..scale(5, 20) {
        let (done, reports) = mpsc::channel::<()>();
        let work = move |timers: tokio_wheel::Timers<u64, u64>, producer: u64| {
            let base = (round * 8 + producer) * 1_000_000;
            for i in 0..per {
                let k = base + i;
                timers.set(k, 1, HOUR);
                if i % 3 == 0 {
                    timers.remove(&k);
                }
                if i % 5 == 0 {
                    timers.set(k, 2, HOUR);
                }
                timers.reset(&k, 2 * HOUR);
            }
        };
        for producer in 0..8 {
            let (timers, done) = (timers.clone(), done.clone());
            match producer % 4 {
                0 | 1 => {
                    std::thread::spawn(move || {
                        work(timers, producer);
                        done.send(()).unwrap();
                    });
                }
                2 => {
                    runtime.spawn(async move {
                        tokio::task::yield_now().await;
                        work(timers, producer);
                        done.send(()).unwrap();
                    });
                }
                _ => {
                    runtime.spawn_blocking(move || {
                        work(timers, producer);
                        done.send(()).unwrap();
                    });
                }
            }
        }
        // Waits inside the runtime, so that a current-thread one runs its tasks meanwhile.
        runtime.block_on(async {
            let mut reported = 0;
            while reported < 8 {
                match reports.try_recv() {
                    Ok(()) => reported += 1,
                    Err(_) => tokio::time::sleep(ms(1)).await,
                }
            }
        });
        // Left set: keys with i % 3 != 0, plus those set again after the remove (i % 15 == 0).
        let left = (0..per).filter(|i| i % 3 != 0 || i % 5 == 0).count() * 8;
        assert_eq!(runtime.block_on(timers.len()), left, "round {round}");
        let drained = runtime.block_on(timers.drain());
        assert_eq!(drained.len(), left, "round {round}");
        for (k, v) in drained {
            let i = k % 1_000_000;
            assert_eq!(v, if i % 5 == 0 { 2 } else { 1 }, "round {round} key {k}");
        }
    }
}

#[test]
fn len_and_drain_after_a_burst_from_eight_producers_count_exactly_it() {
    let runtime = runtime();
    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, _expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    burst_then_count(&runtime, &timers);
}

/// The same with the wheel on a current-thread runtime: the actor runs only while the main
/// thread blocks on a `len` or `drain`, fed from the other threads (its `spawn`ed producers run
/// there too).
#[test]
fn len_and_drain_on_a_current_thread_runtime_fed_from_other_threads() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, _expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    burst_then_count(&runtime, &timers);
}

/// Four threads set keys (some due within 30 ms) while the main thread drains again and
/// again: each key ends up exactly once in some drain's result, in the final drain, or in the
/// stream.
#[test]
fn drains_racing_sets_and_expiry_lose_and_double_nothing() {
    let per = scale(3_000, 30_000);
    let runtime = runtime();
    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, mut expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    let setters: Vec<_> = (0..4u64)
        .map(|t| {
            let timers = timers.clone();
            std::thread::spawn(move || {
                for i in 0..per {
                    let k = t * 1_000_000 + i;
                    let after = if i % 2 == 0 { ms(i % 30) } else { HOUR };
                    timers.set(k, k, after);
                }
            })
        })
        .collect();
    let mut seen: HashMap<u64, u32> = HashMap::new();
    let mut drains = 0;
    while setters.iter().any(|s| !s.is_finished()) || drains < 3 {
        for (k, v) in runtime.block_on(timers.drain()) {
            assert_eq!(k, v);
            *seen.entry(k).or_default() += 1;
        }
        drains += 1;
    }
    for setter in setters {
        setter.join().unwrap();
    }
    for (k, _) in runtime.block_on(timers.drain()) {
        *seen.entry(k).or_default() += 1;
    }
    let fired = runtime.block_on(async {
        drop(timers);
        read_until(&mut expired, |_| false).await
    });
    for (e, read) in &fired {
        assert!(*read >= e.deadline(), "key {} fired early", e.key());
        *seen.entry(*e.key()).or_default() += 1;
    }
    assert_eq!(seen.len() as u64, 4 * per, "keys lost");
    for (k, n) in seen {
        assert_eq!(n, 1, "key {k} came back {n} times");
    }
    assert_eq!(support::stats_once(&wheel, |s| s.pending == 0).pending, 0);
}
