//! Outside attack, round 5, on API.md §3 and "Observing and stopping" with keyed calls made
//! from many threads at once (part two, after `attack_round5_keyed.rs`): `take` against
//! resets from other threads, handles used on other threads than their inserter's, shutdown
//! while threads set and remove, and `Stats` after floods from eight threads.
//!
//! Each test checks an outcome that the order of the calls implies (value, deadline through
//! `Expired::deadline`, fired or not, counts), never how long anything took. Real time: a
//! deadline that must not fire is hours away, one that must fire is due within a second; a
//! `tokio::time::timeout` of tens of seconds only turns a hang into a failure.

mod support;

use support::round5::*;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use tokio::time::Instant;
use tokio_wheel::Wheel;

// ───────────── take is authoritative against resets from other threads ─────────────

/// Entries due within ~40 ms; two threads keep moving them (by key and through handles,
/// earlier and later) while a third takes each. Every key ends exactly once: taken (`Some`)
/// or in the stream, never both, never neither, never early.
#[test]
fn take_racing_resets_from_other_threads_is_authoritative() {
    let keys = scale(2_000, 20_000);
    let runtime = runtime();
    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, mut expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    let handles: Arc<Vec<_>> = Arc::new(
        (0..keys)
            .map(|k| timers.insert(k, k, ms(10 + k % 30)))
            .collect(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let resetters: Vec<_> = (0..2u64)
        .map(|r| {
            let (timers, handles, stop) = (timers.clone(), handles.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut step = r;
                // Bounded too, so a take that never answers cannot flood memory.
                while !stop.load(Ordering::SeqCst) && step < 400_000 {
                    let k = (step * 7_919) % keys;
                    let after = ms(1 + step % 25);
                    match step % 3 {
                        0 => timers.reset(&k, after),
                        1 => handles[k as usize].reset(after),
                        _ => handles[k as usize].reset_at(Instant::now() + after),
                    }
                    step += 2;
                    // Paced: an unpaced flood of moves only queues up behind the takes.
                    if step % 64 == 0 {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            })
        })
        .collect();
    let taker = {
        let (timers, handles, handle) = (timers.clone(), handles.clone(), runtime.handle().clone());
        std::thread::spawn(move || {
            (0..keys)
                .rev()
                .filter_map(|k| {
                    let value = handle.block_on(async {
                        let take = async {
                            if k % 2 == 0 {
                                timers.take(&k).await
                            } else {
                                handles[k as usize].take().await
                            }
                        };
                        tokio::time::timeout(HANG, take)
                            .await
                            .unwrap_or_else(|_| panic!("take of key {k} never answered"))
                    });
                    value.map(|v| {
                        assert_eq!(v, k);
                        k
                    })
                })
                .collect::<Vec<_>>()
        })
    };
    let taken = taker.join().unwrap();
    stop.store(true, Ordering::SeqCst);
    for resetter in resetters {
        resetter.join().unwrap();
    }
    drop(handles);
    let fired = runtime.block_on(async {
        drop(timers);
        read_until(&mut expired, |_| false).await
    });
    let mut seen = vec![0u8; keys as usize];
    for k in &taken {
        seen[*k as usize] += 1;
    }
    for (e, read) in &fired {
        assert!(*read >= e.deadline(), "key {} fired early", e.key());
        assert_eq!(e.key(), e.value());
        seen[*e.key() as usize] += 1;
    }
    for (k, n) in seen.iter().enumerate() {
        assert_eq!(*n, 1, "key {k} taken or fired {n} times");
    }
    let stats = support::stats_once(&wheel, |s| s.pending == 0);
    assert_eq!(stats.fired, fired.len() as u64, "{stats:?}");
    assert_eq!(stats.cancelled, taken.len() as u64, "{stats:?}");
    assert_eq!(stats.pending, 0, "{stats:?}");
}

// ───────────── handles on other threads, mixed with by-key calls ─────────────

/// Entries inserted on one thread; another keeps them alive through their handles (later, and
/// a little earlier: a command) while a third resets them by key; both stop long before any
/// is due. Each entry fires exactly once, for a deadline no earlier than the later of the two
/// threads' last moves allows, and never before that deadline.
#[test]
fn keep_alives_from_two_threads_fire_once_never_early() {
    let keys = scale(200, 2_000);
    let runtime = runtime();
    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, mut expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    let handles = {
        let timers = timers.clone();
        std::thread::spawn(move || {
            (0..keys)
                .map(|k| timers.insert(k, k, ms(150)))
                .collect::<Vec<_>>()
        })
        .join()
        .unwrap()
    };
    let handles = Arc::new(handles);
    // Each returns, per key, the moment just before its last move (the move's deadline is no
    // earlier than that plus its delay).
    let by_handle = {
        let handles = handles.clone();
        std::thread::spawn(move || {
            let mut last = vec![Instant::now(); keys as usize];
            for round in 0..10u64 {
                for t in handles.iter() {
                    last[*t.key() as usize] = Instant::now();
                    if round % 2 == 0 {
                        t.reset(ms(200));
                    } else {
                        t.reset_at(Instant::now() + ms(190));
                    }
                }
                std::thread::sleep(ms(5));
            }
            last
        })
    };
    let by_key = {
        let timers = timers.clone();
        std::thread::spawn(move || {
            let mut last = vec![Instant::now(); keys as usize];
            for _ in 0..10u64 {
                for k in 0..keys {
                    last[k as usize] = Instant::now();
                    timers.reset(&k, ms(200));
                }
                std::thread::sleep(ms(5));
            }
            last
        })
    };
    let handle_last = by_handle.join().unwrap();
    let key_last = by_key.join().unwrap();
    let fired = runtime.block_on(read_until(&mut expired, |got| got.len() >= keys as usize));
    let mut seen = HashSet::new();
    for (e, read) in &fired {
        let k = *e.key() as usize;
        assert!(seen.insert(k), "key {k} fired twice");
        assert!(*read >= e.deadline(), "key {k} fired before its deadline");
        let floor = (handle_last[k] + ms(190)).min(key_last[k] + ms(200));
        assert!(
            e.deadline() >= floor,
            "key {k} fired for a deadline older than both threads' last moves"
        );
    }
    // Handles are stale now: on another thread, none of their calls does anything.
    let handles = Arc::try_unwrap(handles).unwrap();
    let handle = runtime.handle().clone();
    std::thread::spawn(move || {
        for t in &handles {
            t.reset_at(Instant::now());
            t.reset(ms(1));
            t.remove();
            assert_eq!(handle.block_on(t.take()), None);
        }
    })
    .join()
    .unwrap();
    runtime.block_on(async {
        assert_eq!(timers.len().await, 0);
        assert_eq!(support::stats_once(&wheel, |s| s.fired == keys).fired, keys);
    });
}

/// A key replaced by `set` on thread B (value 2, due in an hour) while thread A still holds
/// the first entry's handle, which reaches thread C only after the set returned: C moves it to
/// now, removes and takes it; none of that touches the new entry.
#[test]
fn a_handle_replaced_on_another_thread_does_nothing_to_the_new_entry() {
    let keys = scale(3_000, 30_000);
    let runtime = runtime();
    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, _expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    let (to_b, at_b) = mpsc::channel();
    let (to_c, at_c) = mpsc::channel();
    let a = {
        let timers = timers.clone();
        std::thread::spawn(move || {
            for k in 0..keys {
                to_b.send(timers.insert(k, 1, HOUR)).unwrap();
            }
        })
    };
    let b = {
        let timers = timers.clone();
        std::thread::spawn(move || {
            for t in at_b {
                timers.set(*t.key(), 2, HOUR);
                to_c.send(t).unwrap();
            }
        })
    };
    let c = {
        let handle = runtime.handle().clone();
        std::thread::spawn(move || {
            for t in at_c {
                match t.key() % 4 {
                    0 => t.reset_at(Instant::now()),
                    1 => t.reset(Duration::ZERO),
                    2 => t.remove(),
                    _ => assert_eq!(handle.block_on(t.take()), None, "a stale take got a value"),
                }
            }
        })
    };
    a.join().unwrap();
    b.join().unwrap();
    c.join().unwrap();
    runtime.block_on(async {
        tokio::time::sleep(ms(100)).await;
        assert_eq!(wheel.stats().fired, 0, "a stale handle moved the new entry");
        for k in 0..keys {
            assert_eq!(timers.take(&k).await, Some(2), "key {k}");
        }
    });
}

// ───────────── shutdown while many threads set and remove ─────────────

/// Four threads set (and now and then remove) their own keys, due in an hour, while the main
/// thread calls `shutdown()`. A thread that saw the flag still down after a call returned made
/// that call before `shutdown()` was called: such a set (not removed) arrives exactly once
/// marked `is_shutdown`, such a removed key never does; nothing arrives twice; calls after
/// the shutdown answer empty.
#[test]
fn shutdown_while_threads_set_and_remove_delivers_each_entry_made_before_it_once() {
    for round in 0..scale(5, 30) {
        let runtime = runtime();
        let wheel = runtime.block_on(async { Wheel::new() });
        let (timers, mut expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
        let called = Arc::new(AtomicBool::new(false));
        let (started, ready) = mpsc::channel();
        let workers: Vec<_> = (0..4u64)
            .map(|t| {
                let (timers, called, started) = (timers.clone(), called.clone(), started.clone());
                std::thread::spawn(move || {
                    // (key, whether it must arrive) for the calls made before shutdown().
                    let mut before = Vec::new();
                    let mut i = 0u64;
                    loop {
                        let k = t * 1_000_000_000 + i;
                        timers.set(k, k, HOUR);
                        let removed = i % 4 == 3;
                        if removed {
                            timers.remove(&k);
                        }
                        if called.load(Ordering::SeqCst) {
                            break;
                        }
                        before.push((k, !removed));
                        if i == 100 {
                            started.send(()).unwrap();
                        }
                        i += 1;
                        if i > 10_000_000 {
                            panic!("shutdown never observed");
                        }
                    }
                    // Calls after it: refused silently, promptly.
                    let k = t * 1_000_000_000 + i + 1;
                    timers.set(k, k, HOUR);
                    timers.remove(&k);
                    before
                })
            })
            .collect();
        for _ in 0..4 {
            ready.recv().unwrap();
        }
        called.store(true, Ordering::SeqCst);
        runtime.block_on(async {
            tokio::time::timeout(HANG, wheel.shutdown())
                .await
                .expect("shutdown hung");
        });
        let made: Vec<_> = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        let delivered = runtime.block_on(async {
            let got = read_until(&mut expired, |_| false).await;
            // Calls on a stopped wheel answer empty, at once.
            tokio::time::timeout(HANG, async {
                assert_eq!(timers.len().await, 0);
                assert!(timers.drain().await.is_empty());
                assert_eq!(timers.take(&0).await, None);
                timers.set(0, 0, ms(1));
                assert_eq!(timers.len().await, 0);
            })
            .await
            .expect("a call on a stopped wheel hung");
            got
        });
        let mut arrived: HashMap<u64, u32> = HashMap::new();
        for (e, _) in &delivered {
            assert!(e.is_shutdown(), "round {round}: {e:?}");
            assert_eq!(e.key(), e.value());
            *arrived.entry(*e.key()).or_default() += 1;
        }
        for (k, n) in &arrived {
            assert_eq!(*n, 1, "round {round}: key {k} arrived {n} times");
        }
        for (k, must) in made {
            let n = arrived.get(&k).copied().unwrap_or(0);
            if must {
                assert_eq!(
                    n, 1,
                    "round {round}: key {k} set before shutdown() was lost"
                );
            } else {
                assert_eq!(
                    n, 0,
                    "round {round}: key {k} removed before shutdown() arrived"
                );
            }
        }
    }
}

// ───────────── stats after multi-threaded floods ─────────────

/// Eight threads at once: each sets its keys, a quarter due within 20 ms, the rest in an hour;
/// removes a quarter and takes a quarter of those (before they could fire). Once the soon ones
/// have arrived, `pending`, `fired` and `cancelled` add up to exactly that.
#[test]
fn stats_add_up_after_a_flood_from_eight_threads() {
    let per = scale(2_000, 50_000);
    let runtime = runtime();
    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, mut expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (timers, handle) = (timers.clone(), runtime.handle().clone());
            std::thread::spawn(move || {
                let mut taken = 0;
                for i in 0..per {
                    let k = t * 1_000_000 + i;
                    let after = if i % 4 == 0 { ms(i % 20) } else { HOUR };
                    timers.set(k, k, after);
                }
                for i in 0..per {
                    let k = t * 1_000_000 + i;
                    match i % 4 {
                        1 => timers.remove(&k),
                        2 => {
                            assert_eq!(handle.block_on(timers.take(&k)), Some(k));
                            taken += 1;
                        }
                        _ => {}
                    }
                }
                taken
            })
        })
        .collect();
    let taken: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(taken, 8 * per / 4);
    let soon = (8 * per / 4) as usize;
    let fired = runtime.block_on(read_until(&mut expired, |got| got.len() >= soon));
    assert_eq!(fired.len(), soon);
    for (e, _) in &fired {
        assert_eq!(e.key() % 1_000_000 % 4, 0, "{e:?}");
    }
    let left = runtime.block_on(timers.len());
    assert_eq!(left as u64, 8 * per / 4);
    let stats = support::stats_once(&wheel, |s| s.pending == left as u64);
    assert_eq!(stats.pending, left as u64, "{stats:?}");
    assert_eq!(stats.fired, soon as u64, "{stats:?}");
    assert_eq!(stats.cancelled, 2 * 8 * per / 4, "{stats:?}");
    assert_eq!(stats.inserted, 8 * per, "{stats:?}");
    assert_eq!(
        stats.inserted,
        stats.fired + stats.cancelled + stats.pending,
        "{stats:?}"
    );
}

/// Two threads flood by-key and handle resets, unpaced, while a third takes keys one by one:
/// every take is answered, with its key's value, and nothing else is lost.
///
/// Round 5's attack first asked for every take within 20 s of flooding and saw the takes fall
/// ever further behind (each waits for what was made before it, and two unpaced producers
/// outrun one actor: the queue is unbounded by design, and grew to 15 GB in 10 minutes). That
/// is the documented policy, the same before per-thread shards (measured on the previous
/// main: take latencies 4, 17, 35, 86, 260 ms for the first five), and it deserves its own
/// issue (backpressure). What the attack also exposed was real: the merge moved up to a whole
/// hand-on's worth from the first shard and one command from each other, so a flooding
/// thread's shard could starve the rest (`a_long_queue_does_not_starve_the_other_shards` in
/// `src/actor/keyed/order.rs`). Here the flood is bounded, and the outcome checked.
#[test]
fn takes_are_answered_while_other_threads_flood_resets() {
    let keys = 2_000u64;
    let per_resetter = scale(300_000, 3_000_000);
    let runtime = runtime();
    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, _expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    let handles: Arc<Vec<_>> = Arc::new((0..keys).map(|k| timers.insert(k, k, HOUR)).collect());
    let resetters: Vec<_> = (0..2u64)
        .map(|r| {
            let (timers, handles) = (timers.clone(), handles.clone());
            std::thread::spawn(move || {
                for step in (r..).step_by(2).take(per_resetter as usize) {
                    let k = (step * 7_919) % keys;
                    match step % 3 {
                        0 => timers.reset(&k, HOUR),
                        1 => handles[k as usize].reset(HOUR),
                        _ => handles[k as usize].reset_at(Instant::now() + HOUR),
                    }
                }
            })
        })
        .collect();
    let taker = {
        let (timers, handle) = (timers.clone(), runtime.handle().clone());
        std::thread::spawn(move || {
            (0..keys)
                .map(|k| handle.block_on(timers.take(&k)))
                .collect::<Vec<_>>()
        })
    };
    for resetter in resetters {
        resetter.join().unwrap();
    }
    let taken = taker.join().unwrap();
    for (k, value) in taken.into_iter().enumerate() {
        assert_eq!(value, Some(k as u64), "take of key {k}");
    }
    assert_eq!(runtime.block_on(timers.len()), 0);
    assert!(handles.iter().all(|handle| handle.is_stale()));
}
