//! Shutdown while producers flood many shards; runtime drop; use after shutdown.
mod support;
use support::shards::*;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use tokio::time::Instant;
use tokio_wheel::Wheel;

#[derive(Default, Debug, Clone)]
struct Rec {
    set_idx: u64,
    removed_idx: Option<u64>,
    taken: Option<bool>, // Some(true): take returned Some
}

fn shutdown_flood(shards: usize, rt: &tokio::runtime::Runtime) {
    let wheel = rt.block_on(async { Wheel::builder().shards(shards).build() });
    let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
    const THREADS: u64 = 3;
    let stop = Arc::new(AtomicBool::new(false));
    let progress: Arc<Vec<AtomicU64>> = Arc::new((0..THREADS).map(|_| AtomicU64::new(0)).collect());
    let recs = Arc::new(Mutex::new(HashMap::<u64, Rec>::new()));
    let mut threads = Vec::new();
    for t in 0..THREADS {
        let (timers, stop, progress, recs) =
            (timers.clone(), stop.clone(), progress.clone(), recs.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng::new(t + 1000);
            let mut mine: HashMap<u64, Rec> = HashMap::new();
            let mut op = 0u64;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) && i < 400_000 {
                let k = t * 10_000_000 + i;
                let d = if rng.below(4) == 0 {
                    Duration::from_millis(rng.below(20))
                } else {
                    Duration::from_secs(3600)
                };
                timers.set(k, k ^ 0xABCD, d);
                op += 1;
                progress[t as usize].store(op, Ordering::Release);
                mine.insert(
                    k,
                    Rec {
                        set_idx: op,
                        ..Default::default()
                    },
                );
                if i >= 7 && rng.below(5) == 0 {
                    let victim = k - 7;
                    if rng.below(2) == 0 {
                        timers.remove(&victim);
                        op += 1;
                        progress[t as usize].store(op, Ordering::Release);
                        mine.get_mut(&victim).unwrap().removed_idx = Some(op);
                    } else {
                        let r = futures::executor::block_on(timers.take(&victim));
                        op += 1;
                        progress[t as usize].store(op, Ordering::Release);
                        let rec = mine.get_mut(&victim).unwrap();
                        if rec.removed_idx.is_none() {
                            if let Some(v) = r {
                                assert_eq!(v, victim ^ 0xABCD);
                            }
                            rec.taken = Some(r.is_some());
                            rec.removed_idx = Some(op);
                        }
                    }
                }
                i += 1;
            }
            recs.lock().unwrap().extend(mine);
        }));
    }
    let collector = rt.spawn(async move {
        let mut got = Vec::new();
        while let Some(e) = expired.next().await {
            if !e.is_shutdown() {
                assert!(Instant::now() >= e.deadline(), "early");
            }
            got.push((*e.key(), *e.value(), e.is_shutdown()));
        }
        // after the end: stays ended
        assert!(
            expired.next().now_or_never().flatten().is_none(),
            "item after stream end"
        );
        got
    });
    // drive the runtime meanwhile (matters for the current-thread variant)
    rt.block_on(async { tokio::time::sleep(Duration::from_millis(150)).await });
    let snap: Vec<u64> = progress.iter().map(|p| p.load(Ordering::Acquire)).collect();
    rt.block_on(async {
        tokio::time::timeout(GUARD, wheel.shutdown())
            .await
            .expect("shutdown hung")
    });
    // calls after shutdown answer promptly and empty
    let (len_after, take_after) =
        rt.block_on(async { (timers.len().await, timers.take(&0).await) });
    assert_eq!(len_after, 0, "len after shutdown");
    assert_eq!(take_after, None, "take after shutdown");
    timers.set(u64::MAX, 1, Duration::ZERO);
    rt.block_on(async { tokio::time::sleep(Duration::from_millis(20)).await });
    stop.store(true, Ordering::Relaxed);
    for th in threads {
        th.join().unwrap();
    }
    drop(timers);
    let got = rt.block_on(async {
        tokio::time::timeout(GUARD, collector)
            .await
            .expect("stream did not end after shutdown")
            .unwrap()
    });
    let recs = recs.lock().unwrap();
    let mut count: HashMap<u64, u32> = HashMap::new();
    let mut kind: HashMap<u64, bool> = HashMap::new();
    for (k, v, sd) in &got {
        kind.insert(*k, *sd);
        assert_ne!(
            *k,
            u64::MAX,
            "a set made after shutdown returned was delivered"
        );
        assert_eq!(*v, k ^ 0xABCD);
        let c = count.entry(*k).or_default();
        *c += 1;
        assert_eq!(*c, 1, "key {k} delivered twice");
    }
    let mut flushed = 0;
    for (k, rec) in recs.iter() {
        let t = (k / 10_000_000) as usize;
        let before = rec.set_idx <= snap[t];
        let delivered = count.contains_key(k);
        if rec.taken == Some(true) {
            assert!(
                !delivered,
                "key {k}: take returned Some but it was also delivered"
            );
        }
        match rec.removed_idx {
            Some(r) if r <= snap[t] => {
                // it may have fired before the removal; it must never come from the shutdown flush
                assert!(
                    kind.get(k) != Some(&true),
                    "key {k}: removed before shutdown() was called but delivered by the shutdown flush"
                );
            }
            _ => {
                if before && rec.taken.is_none() && rec.removed_idx.is_none() {
                    assert!(
                        delivered,
                        "key {k}: set before shutdown() was called, never removed, never delivered"
                    );
                    flushed += 1;
                }
            }
        }
    }
    assert!(flushed > 0);
    let s = wheel.stats();
    assert_eq!(
        s.inserted,
        s.fired + s.cancelled + s.pending,
        "stats don't add up after shutdown: {s:?}"
    );
    println!(
        "keys {} delivered {} (checked-before {flushed})",
        recs.len(),
        got.len()
    );
}

#[test]
fn shutdown_while_flooding_shards8() {
    let rt = mt_runtime(2);
    shutdown_flood(8, &rt);
}

#[test]
fn shutdown_while_flooding_shards3() {
    let rt = mt_runtime(2);
    shutdown_flood(3, &rt);
}

/// current-thread runtime driven by the main thread, fed from std threads
#[test]
fn shutdown_while_flooding_current_thread_shards4() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    shutdown_flood(4, &rt);
}

/// The runtime running the actors goes away: as if shutdown() was called.
#[test]
fn runtime_drop_flushes_every_entry_once_shards4() {
    let rt = mt_runtime(2);
    let (wheel, timers, expired) = rt.block_on(async {
        let wheel = Wheel::builder().shards(4).build();
        let (t, e) = wheel.keyed::<u64, u64>();
        (wheel, t, e)
    });
    for k in 0..5000u64 {
        timers.set(k, k, Duration::from_secs(3600));
    }
    for k in 0..5000u64 {
        if k % 3 == 0 {
            timers.remove(&k);
        }
    }
    let hs: Vec<_> = (5000..5100u64)
        .map(|k| timers.insert(k, k, Duration::from_secs(3600)))
        .collect();
    drop(rt);
    let rt2 = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let got: Vec<_> = rt2.block_on(async move {
        tokio::time::timeout(GUARD, expired.collect::<Vec<_>>())
            .await
            .expect("stream did not end after the runtime went away")
    });
    let mut seen = std::collections::HashSet::new();
    for e in &got {
        assert!(e.is_shutdown());
        assert!(seen.insert(*e.key()), "dup {}", e.key());
        assert!(
            e.key() % 3 != 0 || *e.key() >= 5000,
            "removed key {} delivered",
            e.key()
        );
    }
    let want = (0..5000u64).filter(|k| k % 3 != 0).count() + 100;
    assert_eq!(seen.len(), want, "flush after runtime drop");
    assert!(hs.iter().all(|h| h.is_stale()));
    rt2.block_on(async {
        assert_eq!(timers.len().await, 0);
        assert_eq!(hs[0].take().await, None);
    });
    drop(wheel);
}

#[tokio::test(start_paused = true)]
async fn keyed_set_made_after_shutdown_shards5() {
    let wheel = Wheel::builder().shards(5).build();
    let (t0, mut e0) = wheel.keyed::<u32, u32>();
    t0.set(1, 1, Duration::from_secs(1));
    wheel.shutdown().await;
    let (t, mut e) = wheel.keyed::<u32, u32>();
    assert_eq!(t.shards(), 5);
    t.set(1, 1, Duration::ZERO);
    let h = t.insert(2, 2, Duration::ZERO);
    assert!(
        h.is_stale(),
        "insert after shutdown should give a stale handle"
    );
    assert_eq!(h.take().await, None);
    assert_eq!(t.len().await, 0);
    assert!(t.drain().await.is_empty());
    let r = tokio::time::timeout(GUARD, e.next())
        .await
        .expect("stream of a set made after shutdown hung");
    assert!(
        r.is_none(),
        "stream of a set made after shutdown yielded {r:?}"
    );
    let first = tokio::time::timeout(GUARD, e0.next())
        .await
        .unwrap()
        .unwrap();
    assert!(first.is_shutdown());
    assert_eq!(first.into_parts(), (1, 1));
    assert!(
        tokio::time::timeout(GUARD, e0.next())
            .await
            .unwrap()
            .is_none()
    );
    t0.set(3, 3, Duration::ZERO);
    assert_eq!(t0.take(&3).await, None);
}
