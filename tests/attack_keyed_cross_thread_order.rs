//! Per-key order across threads and across a handle and by-key calls (an independent
//! attacker's program, kept as a regression test): a command made after another thread's call
//! on the same key returned takes effect after it, through another `Timers` clone or through
//! a `KeyedTimer` handed over a channel (API.md §3: "Commands from one handle take effect in
//! the order they were made"; the handle and the by-key calls act on the same entry).

mod support;
use support::shards::within;

use futures::StreamExt;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use tokio_wheel::{Expirations, Timers, Wheel};

/// Checks `len`, stops the wheel and returns what the shutdown flush delivered, key →
/// (value, deadline), each key at most once.
async fn flushed(
    wheel: &Wheel,
    timers: &Timers<u64, u64>,
    mut expired: Expirations<u64, u64>,
    len: usize,
) -> HashMap<u64, (u64, Instant)> {
    assert_eq!(within("len", timers.len()).await, len, "len");
    within("shutdown", wheel.shutdown()).await;
    let mut got = HashMap::new();
    while let Some(e) = within("the expirations stream", expired.next()).await {
        assert!(
            got.insert(*e.key(), (*e.value(), e.deadline())).is_none(),
            "key {} delivered twice",
            e.key()
        );
    }
    got
}

/// Fails with the first few keys whose delivery is not `want(key)`.
fn assert_each<T: PartialEq + std::fmt::Debug>(
    n: u64,
    got: impl Fn(u64) -> Option<T>,
    want: impl Fn(u64) -> Option<T>,
) {
    let bad: Vec<_> = (0..n)
        .filter(|&k| got(k) != want(k))
        .map(|k| (k, got(k), want(k)))
        .take(6)
        .collect();
    assert!(bad.is_empty(), "(key, delivered, expected): {bad:?}");
}

/// Thread A sets keys; thread B, after seeing A's call returned (atomic progress), acts on the same key
/// through another Timers clone. B's command must take effect after A's.
async fn cross(shards: usize, n: u64) {
    let w = Wheel::builder().shards(shards).build();
    let (t, exp) = w.keyed::<u64, u64>();
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
    let got = flushed(&w, &t, exp, (n - n.div_ceil(4)) as usize).await;
    assert_each(
        n,
        |i| got.get(&i).map(|&(v, d)| (v, d - start)),
        |i| match i % 4 {
            0 => None,
            1 => Some((2, Duration::from_secs(5000))),
            2 => Some((1, Duration::from_secs(100))),
            _ => Some((1, Duration::from_secs(3600))),
        },
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
    let (t, exp) = w.keyed::<u64, u64>();
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
    let got = flushed(&w, &t, exp, (0..n).filter(|i| i % 3 != 2).count()).await;
    assert_each(
        n,
        |i| got.get(&i).map(|&(_, d)| d - start),
        |i| match i % 3 {
            0 => Some(Duration::from_secs(2000)),
            1 => Some(Duration::from_secs(500)),
            _ => None,
        },
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
