//! Per-key order across threads and across a handle and by-key calls (an independent
//! attacker's program, kept as a regression test): a command made after another thread's call
//! on the same key returned takes effect after it, through another `Timers` clone or through
//! a `KeyedTimer` handed over a channel (API.md §3: "Commands from one handle take effect in
//! the order they were made"; the handle and the by-key calls act on the same entry).

use futures::StreamExt;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use tokio_wheel::Wheel;

/// Thread A sets keys; thread B, after seeing A's call returned (atomic progress), acts on the same key
/// through another Timers clone. B's command must take effect after A's.
async fn cross(shards: usize, n: u64) {
    let w = Wheel::builder().shards(shards).build();
    let (t, mut exp) = w.keyed::<u64, u64>();
    let start = Instant::now();
    let prog = Arc::new(AtomicU64::new(0));
    let (ta, pa) = (t.clone(), prog.clone());
    let a = std::thread::spawn(move || {
        for i in 0..n {
            ta.set_at(i, 1, start + Duration::from_secs(3600));
            pa.store(i + 1, Ordering::Release);
        }
    });
    let (tb, pb) = (t.clone(), prog.clone());
    let b = std::thread::spawn(move || {
        let mut i = 0;
        while i < n {
            let p = pb.load(Ordering::Acquire);
            while i < p {
                match i % 4 {
                    0 => tb.remove(&i),
                    1 => tb.set_at(i, 2, start + Duration::from_secs(5000)),
                    2 => tb.reset_at(&i, start + Duration::from_secs(100)),
                    _ => {}
                }
                i += 1;
            }
        }
    });
    a.join().unwrap();
    b.join().unwrap();
    let want = (n - n.div_ceil(4)) as usize;
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(60), t.len())
            .await
            .unwrap(),
        want,
        "len"
    );
    tokio::time::timeout(Duration::from_secs(60), w.shutdown())
        .await
        .unwrap();
    let mut got = HashMap::new();
    while let Some(e) = tokio::time::timeout(Duration::from_secs(30), exp.next())
        .await
        .expect("hung")
    {
        assert!(
            got.insert(*e.key(), (*e.value(), e.deadline())).is_none(),
            "twice"
        );
    }
    let mut bad = Vec::new();
    for i in 0..n {
        let exp_v = match i % 4 {
            0 => None,
            1 => Some((2, start + Duration::from_secs(5000))),
            2 => Some((1, start + Duration::from_secs(100))),
            _ => Some((1, start + Duration::from_secs(3600))),
        };
        if got.get(&i).copied() != exp_v {
            bad.push((
                i,
                got.get(&i).map(|(v, d)| (*v, *d - start)),
                exp_v.map(|(v, d)| (v, d - start)),
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{} wrong: {:?}",
        bad.len(),
        &bad[..bad.len().min(6)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mt2_cross_s1() {
    cross(1, 200_000).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mt2_cross_s3() {
    cross(3, 200_000).await
}
#[tokio::test]
async fn ct_cross_s2() {
    cross(2, 200_000).await
}

/// Handle passed to another thread: B's handle calls come after A's by-key calls.
async fn handle_cross(shards: usize, n: u64) {
    let w = Wheel::builder().shards(shards).build();
    let (t, mut exp) = w.keyed::<u64, u64>();
    let start = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    let ta = t.clone();
    let a = std::thread::spawn(move || {
        for i in 0..n {
            let h = ta.insert_at(i, 1, start + Duration::from_secs(3600));
            ta.reset_at(&i, start + Duration::from_secs(1000)); // by-key earlier, in flight
            tx.send(h).unwrap();
        }
    });
    let b = std::thread::spawn(move || {
        for (i, h) in rx.into_iter().enumerate() {
            match i % 3 {
                0 => h.reset_at(start + Duration::from_secs(2000)), // later than 1000: atomic path behind in-flight cmd
                1 => h.reset_at(start + Duration::from_secs(500)),  // earlier: command
                _ => h.remove(),
            }
        }
    });
    a.join().unwrap();
    b.join().unwrap();
    let want = (0..n).filter(|i| i % 3 != 2).count();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(60), t.len())
            .await
            .unwrap(),
        want,
        "len"
    );
    tokio::time::timeout(Duration::from_secs(60), w.shutdown())
        .await
        .unwrap();
    let mut got = HashMap::new();
    while let Some(e) = tokio::time::timeout(Duration::from_secs(30), exp.next())
        .await
        .expect("hung")
    {
        assert!(got.insert(*e.key(), e.deadline()).is_none(), "twice");
    }
    let mut bad = Vec::new();
    for i in 0..n {
        let want = match i % 3 {
            0 => Some(start + Duration::from_secs(2000)),
            1 => Some(start + Duration::from_secs(500)),
            _ => None,
        };
        if got.get(&i).copied() != want {
            bad.push((i, got.get(&i).map(|d| *d - start), want.map(|d| d - start)));
        }
    }
    assert!(
        bad.is_empty(),
        "{} wrong: {:?}",
        bad.len(),
        &bad[..bad.len().min(6)]
    );
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mt2_handle_cross_s1() {
    handle_cross(1, 100_000).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mt2_handle_cross_s3() {
    handle_cross(3, 100_000).await
}
