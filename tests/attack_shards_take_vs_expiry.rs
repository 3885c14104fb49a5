//! take / KeyedTimer::take / reset racing expiry on many shards, real time, std-thread producers.
mod support;
use support::shards::*;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_wheel::Wheel;

fn spin(us: u64) {
    let s = std::time::Instant::now();
    while s.elapsed() < Duration::from_micros(us) {
        std::hint::spin_loop();
    }
}

#[test]
fn take_vs_expiry_exactly_once_shards6() {
    let rt = mt_runtime(2);
    let wheel = rt.block_on(async { Wheel::builder().shards(6).build() });
    let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
    const THREADS: u64 = 3;
    const PER: u64 = 3000;
    let taken = Arc::new(Mutex::new(Vec::new()));
    // collector
    let collector = rt.spawn(async move {
        let mut got = Vec::new();
        while let Some(e) = expired.next().await {
            let now = Instant::now();
            assert!(
                now >= e.deadline(),
                "key {} delivered early: now {:?} < deadline {:?}",
                e.key(),
                now,
                e.deadline()
            );
            assert!(!e.is_shutdown());
            got.push((*e.key(), *e.value()));
        }
        got
    });
    let mut threads = Vec::new();
    for t in 0..THREADS {
        let timers = timers.clone();
        let taken = taken.clone();
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng::new(t + 99);
            let mut mine = Vec::new();
            for i in 0..PER {
                let k = t * 1_000_000 + i;
                let v = k * 7 + 1;
                let d = Duration::from_micros(rng.below(3000));
                let handle_mode = rng.below(2) == 0;
                let h = if handle_mode {
                    Some(timers.insert(k, v, d))
                } else {
                    timers.set(k, v, d);
                    None
                };
                spin(rng.below(3000));
                let r = match (&h, rng.below(2)) {
                    (Some(h), 0) => futures::executor::block_on(h.take()),
                    _ => futures::executor::block_on(timers.take(&k)),
                };
                if let Some(got) = r {
                    assert_eq!(got, v);
                    mine.push(k);
                }
            }
            taken.lock().unwrap().extend(mine);
        }));
    }
    for th in threads {
        th.join().unwrap();
    }
    let taken = Arc::try_unwrap(taken).unwrap().into_inner().unwrap();
    drop(timers); // stream must end once nothing pending
    let fired = rt.block_on(async {
        tokio::time::timeout(GUARD, collector)
            .await
            .expect("stream did not end after all Timers dropped")
            .unwrap()
    });
    let mut count: HashMap<u64, u32> = HashMap::new();
    for k in taken.iter().copied().chain(fired.iter().map(|(k, _)| *k)) {
        *count.entry(k).or_default() += 1;
    }
    for t in 0..THREADS {
        for i in 0..PER {
            let k = t * 1_000_000 + i;
            let c = count.get(&k).copied().unwrap_or(0);
            assert_eq!(c, 1, "key {k}: taken+fired count is {c}, must be exactly 1");
        }
    }
    let s = wheel.stats();
    assert_eq!(
        s.inserted,
        s.fired + s.cancelled + s.pending,
        "stats do not add up: {s:?}"
    );
    assert_eq!(s.inserted, THREADS * PER, "inserted: {s:?}");
    assert_eq!(s.fired, fired.len() as u64, "{s:?}");
    assert_eq!(s.cancelled, taken.len() as u64, "{s:?}");
    println!("taken {} fired {}", taken.len(), fired.len());
}

/// A handle reset (later) that returned before the old deadline must land: the entry fires at
/// the new deadline, once, never early.
#[test]
fn handle_reset_racing_expiry_never_early_shards4() {
    let rt = mt_runtime(2);
    let wheel = rt.block_on(async { Wheel::builder().shards(4).build() });
    let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
    const THREADS: u64 = 2;
    const PER: u64 = 1500;
    let expect = Arc::new(Mutex::new(HashMap::new())); // key -> (final deadline if reset landed for sure)
    let collector = rt.spawn(async move {
        let mut got = Vec::new();
        while let Some(e) = expired.next().await {
            let now = Instant::now();
            assert!(now >= e.deadline(), "key {} delivered early", e.key());
            got.push((*e.key(), e.deadline(), now));
        }
        got
    });
    let mut threads = Vec::new();
    for t in 0..THREADS {
        let timers = timers.clone();
        let expect = expect.clone();
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng::new(t + 5);
            let mut hs = Vec::new();
            for i in 0..PER {
                let k = t * 1_000_000 + i;
                let first = Instant::now() + Duration::from_micros(500 + rng.below(2000));
                let h = timers.insert_at(k, k, first);
                spin(rng.below(2500));
                let later = Instant::now() + Duration::from_millis(1 + rng.below(4));
                let by_key = rng.below(3) == 0;
                if by_key {
                    timers.reset_at(&k, later);
                } else {
                    h.reset_at(later);
                }
                let returned = Instant::now();
                // If it returned well before the old deadline (1 tick margin), it must have landed.
                let landed_for_sure = returned + Duration::from_millis(1) < first;
                expect
                    .lock()
                    .unwrap()
                    .insert(k, (first, later, landed_for_sure, by_key));
                hs.push(h);
            }
            hs
        }));
    }
    let mut hs = Vec::new();
    for th in threads {
        hs.extend(th.join().unwrap());
    }
    drop(timers);
    let fired = rt.block_on(async {
        tokio::time::timeout(GUARD, collector)
            .await
            .expect("stream did not end")
            .unwrap()
    });
    let expect = expect.lock().unwrap();
    let mut seen = HashMap::new();
    for (k, d, at) in &fired {
        assert!(seen.insert(*k, (*d, *at)).is_none(), "key {k} fired twice");
    }
    assert_eq!(seen.len(), expect.len(), "some keys never fired");
    for (k, (first, later, sure, by_key)) in expect.iter() {
        let (d, at) = seen[k];
        if *sure {
            assert!(
                close(d, *later),
                "key {k} (by_key={by_key}): reset returned before the old deadline but fired with deadline {d:?}, old {first:?}, new {later:?}"
            );
            assert!(at >= *later, "key {k}: fired before its new deadline");
        } else {
            assert!(
                close(d, *later) || close(d, *first),
                "key {k}: odd deadline"
            );
        }
    }
    drop(hs);
    let s = wheel.stats();
    assert_eq!(
        s.inserted,
        s.fired + s.cancelled + s.pending,
        "stats do not add up: {s:?}"
    );
}
