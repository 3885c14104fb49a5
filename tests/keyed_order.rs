//! Keyed commands made on different threads apply in the order they were made.
//!
//! A keyed set's handles queue into their own thread's inbox shard, and the set's actor puts
//! the shards back in order. These tests make commands on one key from two threads, the second
//! only after the first returned (a hand-off through a channel, as a connection's task hands a
//! key to another), and check the outcome the order implies: a `remove` made after a `set`
//! leaves nothing, a `set` made after a `drain` survives it, a `len` made after sets counts
//! them.

mod support;

use std::sync::mpsc;
use std::time::Duration;

use futures::StreamExt;
use tokio_wheel::Wheel;

const KEYS: u64 = 20_000;

#[test]
fn a_remove_made_on_another_thread_after_the_set_always_wins() {
    let runtime = support::two_workers();
    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, mut expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    let (handed, received) = mpsc::channel::<u64>();
    let remover = {
        let timers = timers.clone();
        std::thread::spawn(move || {
            for key in received {
                timers.remove(&key);
            }
        })
    };
    let setter = {
        let timers = timers.clone();
        std::thread::spawn(move || {
            for key in 0..KEYS {
                // Due soon: a removal lost to the set would show as an expiration too.
                timers.set(key, key, Duration::from_millis(50 + key % 50));
                handed.send(key).unwrap();
            }
        })
    };
    setter.join().unwrap();
    remover.join().unwrap();
    runtime.block_on(async {
        assert_eq!(timers.len().await, 0, "a remove applied before its set");
        tokio::time::sleep(Duration::from_millis(150)).await;
        drop(timers);
        let fired = expired.next().await;
        assert!(fired.is_none(), "a removed key fired: {fired:?}");
    });
    assert_eq!(wheel.stats().fired, 0);
}

#[test]
fn set_reset_and_take_across_threads_keep_their_order() {
    let runtime = support::two_workers();
    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, _expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    // Three threads in a pipeline: set (value 1) → set again (value 2) and reset far → take.
    let (to_second, at_second) = mpsc::channel::<u64>();
    let (to_third, at_third) = mpsc::channel::<u64>();
    let first = {
        let timers = timers.clone();
        std::thread::spawn(move || {
            for key in 0..KEYS {
                timers.set(key, 1, Duration::from_secs(60));
                to_second.send(key).unwrap();
            }
        })
    };
    let second = {
        let timers = timers.clone();
        std::thread::spawn(move || {
            for key in at_second {
                timers.set(key, 2, Duration::from_secs(30));
                timers.reset(&key, Duration::from_secs(90));
                to_third.send(key).unwrap();
            }
        })
    };
    let third = {
        let timers = timers.clone();
        let handle = runtime.handle().clone();
        std::thread::spawn(move || {
            let mut taken = Vec::new();
            for key in at_third {
                taken.push(handle.block_on(timers.take(&key)));
            }
            taken
        })
    };
    first.join().unwrap();
    second.join().unwrap();
    let taken = third.join().unwrap();
    assert_eq!(taken.len(), KEYS as usize);
    assert!(
        taken.iter().all(|value| *value == Some(2)),
        "a take saw another value than the last set's"
    );
    runtime.block_on(async { assert_eq!(timers.len().await, 0) });
}

#[test]
fn a_drain_and_a_len_see_exactly_what_was_made_before_them() {
    let runtime = support::two_workers();
    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, _expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    for round in 0..20u64 {
        let (done, finished) = mpsc::channel::<()>();
        let base = round * 1_000_000;
        // Two threads set 1 000 keys each, then say so.
        let setters: Vec<_> = (0..2)
            .map(|thread| {
                let (timers, done) = (timers.clone(), done.clone());
                std::thread::spawn(move || {
                    for i in 0..1_000 {
                        timers.set(base + thread * 1_000 + i, i, Duration::from_secs(60));
                    }
                    done.send(()).unwrap();
                })
            })
            .collect();
        finished.recv().unwrap();
        finished.recv().unwrap();
        // Made after both: sees all 2 000 (and nothing of the next round).
        assert_eq!(runtime.block_on(timers.len()), 2_000, "round {round}");
        // A third thread sets keys while the drain runs; what the drain missed is still set.
        let late = {
            let timers = timers.clone();
            std::thread::spawn(move || {
                for i in 0..1_000 {
                    timers.set(base + 500_000 + i, i, Duration::from_secs(60));
                }
            })
        };
        let drained = runtime.block_on(timers.drain());
        late.join().unwrap();
        let left = runtime.block_on(timers.len());
        assert!(
            drained.len() >= 2_000,
            "round {round}: drained {}",
            drained.len()
        );
        assert_eq!(
            drained.len() + left,
            3_000,
            "round {round}: a key lost or doubled"
        );
        runtime.block_on(timers.drain());
        for setter in setters {
            setter.join().unwrap();
        }
    }
}
