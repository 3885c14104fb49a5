//! drain racing sets from other threads; len as a barrier; drain/len prefix consistency across shards.
mod support;
use support::shards::*;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_wheel::Wheel;

/// Every key set exactly once is drained exactly once (by one of the racing drains or the final one).
#[test]
fn drain_racing_sets_never_loses_or_duplicates_shards8() {
    let rt = mt_runtime(2);
    let wheel = rt.block_on(async { Wheel::builder().shards(8).build() });
    let (timers, _expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
    const THREADS: u64 = 3;
    const PER: u64 = 20_000;
    let stop = Arc::new(AtomicBool::new(false));
    let drainer = {
        let timers = timers.clone();
        let stop = stop.clone();
        rt.spawn(async move {
            let mut all = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                all.extend(timers.drain().await);
                tokio::task::yield_now().await;
            }
            all
        })
    };
    let mut threads = Vec::new();
    for t in 0..THREADS {
        let timers = timers.clone();
        threads.push(std::thread::spawn(move || {
            for i in 0..PER {
                let k = t * 1_000_000 + i;
                timers.set(k, k + 1, Duration::from_secs(3600));
                // some removes of keys set earlier: removed keys must not be drained afterwards
                if i % 10 == 9 {
                    timers.remove(&(k - 5));
                }
            }
        }));
    }
    for th in threads {
        th.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let mut drained = rt.block_on(async {
        tokio::time::timeout(GUARD, drainer)
            .await
            .expect("hang")
            .unwrap()
    });
    let final_ = rt.block_on(async {
        tokio::time::timeout(GUARD, timers.drain())
            .await
            .expect("hang")
    });
    drained.extend(final_);
    assert_eq!(rt.block_on(timers.len()), 0);
    let mut seen = HashSet::new();
    for (k, v) in &drained {
        assert_eq!(*v, k + 1);
        assert!(seen.insert(*k), "key {k} drained twice");
    }
    for t in 0..THREADS {
        for i in 0..PER {
            let k = t * 1_000_000 + i;
            let removed_later = (i + 5) % 10 == 9 && i + 5 < PER;
            if !removed_later {
                assert!(
                    seen.contains(&k),
                    "key {k} (never removed) lost: neither drained nor still present"
                );
            }
        }
    }
    let s = wheel.stats();
    assert_eq!(s.inserted, s.fired + s.cancelled + s.pending, "{s:?}");
    assert_eq!(s.pending, 0, "{s:?}");
}

/// A std thread sets keys on every shard, then signals; len() made after the signal sees them all.
#[test]
fn len_is_a_barrier_for_other_threads_shards7() {
    let rt = mt_runtime(2);
    let wheel = rt.block_on(async { Wheel::builder().shards(7).build() });
    let (timers, _expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    let producer = {
        let timers = timers.clone();
        std::thread::spawn(move || {
            let mut total = 0u64;
            for round in 0..300u64 {
                let n = 1 + round % 40;
                for j in 0..n {
                    timers.set(round * 1000 + j, 0, Duration::from_secs(3600));
                }
                // and remove a couple from the previous round
                if round > 0 {
                    timers.remove(&((round - 1) * 1000));
                    total -= 1;
                }
                total += n;
                tx.send(total).unwrap();
            }
        })
    };
    rt.block_on(async {
        while let Ok(total) = rx.recv() {
            let len = timers.len().await as u64;
            assert!(
                len >= total,
                "len() = {len} after the producer signalled {total} keys set"
            );
        }
    });
    producer.join().unwrap();
    let expected: u64 = (0..300u64).map(|r| 1 + r % 40).sum::<u64>() - 299;
    assert_eq!(rt.block_on(timers.len()) as u64, expected);
}

/// Linearizability across shards: one producer sets keys 0,1,2,... in order (one handle, so
/// they take effect in that order). A drain taken at any moment should see a prefix of that
/// sequence: seeing key j but not an earlier key i < j means drain observed a later command of
/// the handle but not an earlier one.
#[test]
fn drain_sees_a_prefix_of_one_handles_commands_shards8() {
    prefix(8);
}

/// Control: the same with one shard.
#[test]
fn drain_sees_a_prefix_of_one_handles_commands_shards1_control() {
    prefix(1);
}

fn prefix(shards: usize) {
    let rt = mt_runtime(2);
    let mut violations = Vec::new();
    for attempt in 0..scaled(5, 30) {
        let wheel = rt.block_on(async { Wheel::builder().shards(shards).build() });
        let (timers, _expired) = rt.block_on(async { wheel.keyed::<u64, ()>() });
        let stop = Arc::new(AtomicBool::new(false));
        let producer = {
            let timers = timers.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut k = 0u64;
                while !stop.load(Ordering::Relaxed) && k < 2_000_000 {
                    timers.set(k, (), Duration::from_secs(3600));
                    k += 1;
                }
                k
            })
        };
        let mut drains: Vec<Vec<u64>> = Vec::new();
        rt.block_on(async {
            for _ in 0..50 {
                let mut d: Vec<u64> = timers.drain().await.into_iter().map(|(k, _)| k).collect();
                d.sort_unstable();
                drains.push(d);
            }
        });
        stop.store(true, Ordering::Relaxed);
        let n = producer.join().unwrap();
        let rest: Vec<u64> = rt
            .block_on(timers.drain())
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        // each drain must be one contiguous range starting where the previous one ended
        let mut next = 0u64;
        for (i, d) in drains.iter().enumerate() {
            if d.is_empty() {
                continue;
            }
            let contiguous = d.first() == Some(&next) && d.windows(2).all(|w| w[1] == w[0] + 1);
            if !contiguous {
                let first_gap = d
                    .windows(2)
                    .find(|w| w[1] != w[0] + 1)
                    .map(|w| (w[0], w[1]));
                violations.push(format!(
                    "attempt {attempt} drain {i}: expected contiguous from {next}, got {} keys {:?}..{:?}, first gap {:?}",
                    d.len(), d.first(), d.last(), first_gap
                ));
                next = *d.iter().max().unwrap() + 1;
                continue;
            }
            next = d.last().unwrap() + 1;
        }
        let total: usize = drains.iter().map(Vec::len).sum::<usize>() + rest.len();
        assert_eq!(total as u64, n, "keys lost or duplicated");
        if violations.len() > 5 {
            break;
        }
    }
    assert!(
        violations.is_empty(),
        "drain saw a later command of one handle but not an earlier one ({} cases):\n{}",
        violations.len(),
        violations.join("\n")
    );
}

/// One producer keeps the set at N or N+1 keys (set a new key, then remove an old one).
/// len() answers a count the set never had if its shards are asked at different moments.
fn len_window(shards: usize) {
    let rt = mt_runtime(2);
    let wheel = rt.block_on(async { Wheel::builder().shards(shards).build() });
    let (timers, _expired) = rt.block_on(async { wheel.keyed::<u64, ()>() });
    const N: u64 = 100;
    for k in 0..N {
        timers.set(k, (), Duration::from_secs(3600));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let timers = timers.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) && i < 3_000_000 {
                timers.set(N + i, (), Duration::from_secs(3600));
                timers.remove(&i);
                i += 1;
            }
        })
    };
    let mut bad = Vec::new();
    rt.block_on(async {
        for _ in 0..2000 {
            let len = timers.len().await as u64;
            if len != N && len != N + 1 {
                bad.push(len);
            }
        }
    });
    stop.store(true, Ordering::Relaxed);
    producer.join().unwrap();
    assert_eq!(rt.block_on(timers.len()) as u64, N);
    assert!(
        bad.is_empty(),
        "len() answered counts the set never had (always {N} or {}): {} of 2000 answers, e.g. {:?}",
        N + 1,
        bad.len(),
        &bad[..bad.len().min(10)]
    );
}

#[test]
fn len_answers_only_counts_the_set_had_shards8() {
    len_window(8);
}

#[test]
fn len_answers_only_counts_the_set_had_shards1_control() {
    len_window(1);
}
