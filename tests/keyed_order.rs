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
                // Due soon: a removal lost to the set would show as an expiration too. (Not
                // sooner than the remover may lag behind on a loaded machine: it must come
                // first.)
                timers.set(key, key, Duration::from_millis(1_500 + key % 50));
                handed.send(key).unwrap();
            }
        })
    };
    setter.join().unwrap();
    remover.join().unwrap();
    runtime.block_on(async {
        assert_eq!(timers.len().await, 0, "a remove applied before its set");
        tokio::time::sleep(Duration::from_millis(1_600)).await;
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

/// A `remove` right behind its key's `set` on the same thread, before the actor took the set,
/// takes the set's place in the queue: the actor files nothing, and the outcome is the one
/// the order implies (nothing set, nothing fires; an entry the set would have replaced is
/// removed).
#[tokio::test(start_paused = true)]
async fn a_remove_right_behind_its_set_takes_its_place_and_the_actor_files_nothing() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u64, u64>();
    timers.set(1, 10, Duration::from_secs(5));
    assert_eq!(timers.len().await, 1);
    let before = wheel.stats();
    for key in 1..=100 {
        timers.set(key, key, Duration::from_secs(5));
        timers.remove(&key);
    }
    assert_eq!(timers.len().await, 0, "key 1's older entry is removed too");
    let after = support::stats_once(&wheel, |s| s.cancelled > before.cancelled);
    assert_eq!(
        after.inserted, before.inserted,
        "the actor filed none of the sets"
    );
    assert_eq!(after.cancelled, before.cancelled + 1, "key 1's older entry");
    assert_eq!(
        after.inserted,
        after.fired + after.cancelled + after.pending
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    drop(timers);
    assert!(expired.next().await.is_none(), "nothing fired");
}

/// A `set` made on another thread after this thread's `set` (and before its `remove`) keeps
/// the two sets in order: the remove, made last, wins, though it came right behind this
/// thread's own set in its queue.
#[test]
fn a_remove_behind_its_set_still_comes_after_a_set_made_in_between_elsewhere() {
    let runtime = support::two_workers();
    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, _expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    for key in 0..2_000u64 {
        timers.set(key, 1, Duration::from_secs(60));
        let other = timers.clone();
        std::thread::spawn(move || other.set(key, 2, Duration::from_secs(60)))
            .join()
            .unwrap();
        timers.remove(&key);
    }
    let left = runtime.block_on(timers.drain());
    assert!(
        left.is_empty(),
        "set after the removes: {:?}",
        &left[..left.len().min(5)]
    );
}

/// A by-key command on the key between the set and the remove (a reset to an earlier
/// deadline, which is not merged into the set), or a `len` on every
/// key, keeps the remove a command of its own: each applies in the order made.
#[tokio::test(start_paused = true)]
async fn a_remove_behind_a_later_command_on_its_key_is_sent_as_made() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u64, u64>();
    let before = wheel.stats();
    timers.set(1, 1, Duration::from_secs(5));
    timers.reset(&1, Duration::from_secs(2)); // earlier: a command of its own
    timers.remove(&1);
    timers.set(2, 2, Duration::from_secs(5));
    // Polled once: the question is sent, the answer not yet back.
    let mut len = Box::pin(timers.len());
    assert!(futures::poll!(&mut len).is_pending());
    timers.remove(&2);
    assert_eq!(len.await, 1, "the len made between saw key 2 set");
    assert_eq!(timers.len().await, 0);
    let after = support::stats_once(&wheel, |s| s.cancelled >= before.cancelled + 2);
    assert_eq!(after.inserted, before.inserted + 2, "both sets were filed");
    drop(timers);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(expired.next().await.is_none(), "nothing fired");
}

/// Keep-alive resets of one key in a burst (each later than the last), made before the actor
/// took the first: each moves the queued command's deadline, so the actor applies one; the
/// entry fires once, at the last deadline, never before.
#[tokio::test(start_paused = true)]
async fn a_burst_of_later_resets_on_a_key_costs_the_actor_one_command() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u64, u64>();
    let start = tokio::time::Instant::now();
    timers.set(1, 1, Duration::from_secs(5));
    timers.set(2, 2, Duration::from_secs(5));
    assert_eq!(timers.len().await, 2);
    let before = wheel.stats();
    for i in 1..=100 {
        timers.reset(&1, Duration::from_secs(5) + Duration::from_millis(i));
    }
    // A reset to an earlier deadline is a command of its own, after the burst.
    timers.set(3, 3, Duration::from_secs(9));
    timers.reset(&3, Duration::from_secs(1));
    assert_eq!(timers.len().await, 3);
    let after = support::stats_once(&wheel, |s| s.commands >= before.commands + 4);
    assert!(
        after.commands - before.commands <= 5,
        "the burst cost the actor {} commands",
        after.commands - before.commands
    );
    let mut fired = Vec::new();
    drop(timers);
    while let Some(e) = expired.next().await {
        assert!(tokio::time::Instant::now() >= e.deadline(), "fired early");
        fired.push((*e.key(), e.deadline() - start));
    }
    assert_eq!(
        fired,
        [
            (3, Duration::from_secs(1)),
            (2, Duration::from_secs(5)),
            (1, Duration::from_secs(5) + Duration::from_millis(100)),
        ]
    );
}

/// A reset behind a set made on another thread in between keeps its place after it: the
/// other thread's set (made later) takes effect, then this reset moves it (the shutdown flush
/// shows each entry's deadline).
#[test]
fn a_reset_behind_its_set_still_comes_after_a_set_made_in_between_elsewhere() {
    let runtime = support::two_workers();
    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, mut expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    let start = runtime.block_on(async { tokio::time::Instant::now() });
    let (set_at, reset_at) = (
        start + Duration::from_secs(60),
        start + Duration::from_secs(3600),
    );
    for key in 0..1_000u64 {
        timers.set_at(key, 1, set_at);
        let other = timers.clone();
        std::thread::spawn(move || other.set_at(key, 2, set_at))
            .join()
            .unwrap();
        timers.reset_at(&key, reset_at);
    }
    runtime.block_on(wheel.shutdown());
    let mut seen = 0;
    while let Some(e) = runtime.block_on(expired.next()) {
        assert!(e.is_shutdown());
        assert_eq!(*e.value(), 2, "key {}", e.key());
        assert_eq!(
            e.deadline(),
            reset_at,
            "key {}: the reset was undone",
            e.key()
        );
        seen += 1;
    }
    assert_eq!(seen, 1_000);
}
