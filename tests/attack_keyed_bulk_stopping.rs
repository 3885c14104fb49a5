//! Keyed sets under bulk loads stopped midway (an independent attacker's program, kept as a
//! regression test): `shutdown()` called from another task, or the actor's runtime dropped,
//! while one producer sets, removes and resets hundreds of thousands of keys. Every entry set
//! before the stop and not removed is delivered exactly once, marked `is_shutdown()`; no
//! removed one is; the delivered keys are an unbroken prefix of the producer's order; the
//! stream ends and calls on the stopped wheel answer empty at once. Stats add up.

mod support;
use support::shards::{ct_runtime as ct, mt_runtime as mt, within};

use futures::StreamExt;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio_wheel::{Expirations, Timers, Wheel};

/// Reads the stream to its end (bounded), returning key -> (count, all_shutdown).
async fn read_all(mut exp: Expirations<u64, u64>) -> HashMap<u64, (usize, bool)> {
    let mut m: HashMap<u64, (usize, bool)> = HashMap::new();
    while let Some(e) = within("the expirations stream", exp.next()).await {
        assert_eq!(*e.key(), *e.value());
        let ent = m.entry(*e.key()).or_insert((0, true));
        ent.0 += 1;
        ent.1 &= e.is_shutdown();
    }
    m
}

/// Calls on a stopped wheel answer at once, empty.
async fn answers_empty(t: &Timers<u64, u64>) {
    assert_eq!(within("len", t.len()).await, 0);
    assert_eq!(within("take", t.take(&2)).await, None);
    assert!(within("drain", t.drain()).await.is_empty());
}

fn check(
    m: &HashMap<u64, (usize, bool)>,
    must_upto: u64,
    total: u64,
    removed: impl Fn(u64) -> bool,
) {
    let dups: Vec<_> = m.iter().filter(|(_, (c, _))| *c > 1).take(5).collect();
    assert!(dups.is_empty(), "delivered more than once: {dups:?}");
    let not_sd: Vec<_> = m.iter().filter(|(_, (_, s))| !*s).take(5).collect();
    assert!(not_sd.is_empty(), "not marked shutdown: {not_sd:?}");
    let bad: Vec<_> = m
        .keys()
        .filter(|k| removed(**k) && **k < must_upto)
        .take(5)
        .collect();
    // removed keys: only allowed if the remove could have been after shutdown; caller passes
    // `removed` for keys whose remove was certainly before.
    assert!(
        bad.is_empty(),
        "removed key delivered: {bad:?} ({} delivered)",
        m.len()
    );
    let missing: Vec<_> = (0..must_upto)
        .filter(|k| !removed(*k) && !m.contains_key(k))
        .take(10)
        .collect();
    assert!(
        missing.is_empty(),
        "set before shutdown, not delivered: {missing:?} (must_upto {must_upto}, delivered {})",
        m.len()
    );
    // prefix: if j delivered then every non-removed k<j delivered
    if let Some(maxk) = m.keys().max() {
        let holes: Vec<_> = (0..*maxk)
            .filter(|k| !removed(*k) && !m.contains_key(k))
            .take(10)
            .collect();
        // removed keys above the cut may show only at the very top (the boundary key)
        let late_removed: Vec<_> = m
            .keys()
            .filter(|k| removed(**k) && **k >= must_upto && **k != *maxk)
            .take(5)
            .collect();
        assert!(
            late_removed.is_empty(),
            "removed key delivered below the max delivered {maxk}: {late_removed:?}"
        );
        assert!(
            holes.is_empty(),
            "holes below delivered max {maxk}: {holes:?}"
        );
        assert!(*maxk < total);
    }
}

/// One producer task; shutdown called from another task mid-load.
async fn shutdown_mid_load(shards: usize, n: u64, yield_every: u64, shutdown_after_ms: u64) {
    let w = Wheel::builder().shards(shards).build();
    let (t, exp) = w.keyed::<u64, u64>();
    let reader = tokio::spawn(read_all(exp));
    let called = Arc::new(AtomicBool::new(false));
    let before_idx = Arc::new(AtomicU64::new(0)); // keys < this were fully made before shutdown
    let prod = {
        let (t, called, before_idx) = (t.clone(), called.clone(), before_idx.clone());
        tokio::spawn(async move {
            for i in 0..n {
                t.set(i, i, Duration::from_secs(3600));
                if i % 3 == 0 {
                    t.remove(&i);
                } else if i % 3 == 1 {
                    t.reset(&i, Duration::from_secs(7200));
                }
                if !called.load(Ordering::SeqCst) {
                    before_idx.store(i + 1, Ordering::SeqCst);
                }
                if i % yield_every == 0 {
                    tokio::task::yield_now().await;
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(shutdown_after_ms)).await;
    called.store(true, Ordering::SeqCst);
    within("shutdown", w.shutdown()).await;
    let b = before_idx.load(Ordering::SeqCst);
    within("the producer", prod).await.unwrap();
    answers_empty(&t).await;
    let m = within("the reader", reader).await.unwrap();
    eprintln!("shards {shards}: before_idx {b}, delivered {}", m.len());
    check(&m, b, n, |k| k % 3 == 0);
    let s = w.stats();
    assert_eq!(s.inserted, s.fired + s.cancelled + s.pending, "{s:?}");
    assert_eq!(s.pending, 0, "{s:?}");
}

#[tokio::test]
async fn ct_shutdown_mid_load_s1() {
    shutdown_mid_load(1, 300_000, 2_000, 30).await;
}
#[tokio::test]
async fn ct_shutdown_mid_load_s3() {
    shutdown_mid_load(3, 300_000, 2_000, 30).await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn mt1_shutdown_mid_load_s2() {
    shutdown_mid_load(2, 300_000, 2_000, 30).await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mt2_shutdown_mid_load_s1() {
    shutdown_mid_load(1, 300_000, 5_000, 30).await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mt2_shutdown_mid_load_s8() {
    shutdown_mid_load(8, 300_000, 5_000, 30).await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mt4_shutdown_mid_load_s3() {
    shutdown_mid_load(3, 300_000, 1_000_000, 20).await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mt4_shutdown_mid_load_default() {
    shutdown_mid_load(4, 300_000, 100, 20).await;
}

/// The runtime running the actor is dropped while a producer on a plain thread is setting.
fn runtime_drop_mid_load(rt: tokio::runtime::Runtime, shards: usize, n: u64, drop_after_ms: u64) {
    let w = rt.block_on(async { Wheel::builder().shards(shards).build() });
    let (t, exp) = rt.block_on(async { w.keyed::<u64, u64>() });
    let gone = Arc::new(AtomicBool::new(false));
    let before_idx = Arc::new(AtomicU64::new(0));
    let prod = {
        let (t, gone, before_idx) = (t.clone(), gone.clone(), before_idx.clone());
        std::thread::spawn(move || {
            for i in 0..n {
                t.set(i, i, Duration::from_secs(3600));
                if i % 3 == 0 {
                    t.remove(&i);
                }
                if !gone.load(Ordering::SeqCst) {
                    before_idx.store(i + 1, Ordering::SeqCst);
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(drop_after_ms));
    gone.store(true, Ordering::SeqCst);
    let b = before_idx.load(Ordering::SeqCst);
    drop(rt);
    ct().block_on(async {
        let m = read_all(exp).await;
        eprintln!("shards {shards}: before_idx {b}, delivered {}", m.len());
        check(&m, b, n, |k| k % 3 == 0);
        assert!(w.is_shutdown());
        within("stopped", w.stopped()).await;
        within("shutdown", w.shutdown()).await;
        answers_empty(&t).await;
    });
    prod.join().unwrap();
}

#[test]
fn rtdrop_ct_s1() {
    runtime_drop_mid_load(ct(), 1, 500_000, 50);
}
#[test]
fn rtdrop_ct_s3() {
    runtime_drop_mid_load(ct(), 3, 500_000, 50);
}
#[test]
fn rtdrop_mt1_s2() {
    runtime_drop_mid_load(mt(1), 2, 500_000, 50);
}
#[test]
fn rtdrop_mt2_s1() {
    runtime_drop_mid_load(mt(2), 1, 500_000, 50);
}
#[test]
fn rtdrop_mt2_s8() {
    runtime_drop_mid_load(mt(2), 8, 500_000, 50);
}
#[test]
fn rtdrop_mt4_s3() {
    runtime_drop_mid_load(mt(4), 3, 500_000, 50);
}
