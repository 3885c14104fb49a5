//! Stream end, dropped handles/streams, shard counts, build errors.
mod support;
use support::shards::*;

use std::time::Duration;

use futures::{FutureExt, StreamExt};
use tokio::time::Instant;
use tokio_wheel::{BuildError, Wheel};

#[tokio::test(start_paused = true)]
async fn stream_ends_after_timers_dropped_with_live_handles_shards8() {
    let wheel = Wheel::builder().shards(8).build();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    let start = Instant::now();
    let hs: Vec<_> = (0..64u32)
        .map(|k| timers.insert(k, k * 10, Duration::from_secs(10 + k as u64)))
        .collect();
    drop(timers);
    // postpone half of them through the handles after the last Timers is gone
    tokio::time::sleep(Duration::from_secs(5)).await;
    for h in hs.iter().filter(|h| h.key() % 2 == 0) {
        h.reset(Duration::from_secs(100));
    }
    // advance some earlier through the handles (a command)
    for h in hs.iter().filter(|h| h.key() % 4 == 1) {
        h.reset_at(start + Duration::from_secs(6));
    }
    let mut got = Vec::new();
    while let Some(e) = tokio::time::timeout(GUARD * 10, expired.next())
        .await
        .expect("stream did not end: Timers dropped, every entry fired")
    {
        assert!(Instant::now() >= e.deadline(), "early");
        got.push((*e.key(), e.deadline()));
    }
    assert_eq!(
        got.len(),
        64,
        "every entry fires once before the stream ends"
    );
    for (k, d) in &got {
        let want = if k % 2 == 0 {
            start + Duration::from_secs(105)
        } else if k % 4 == 1 {
            start + Duration::from_secs(6)
        } else {
            start + Duration::from_secs(10 + *k as u64)
        };
        assert!(
            close(*d, want),
            "key {k}: deadline {:?} want {:?}",
            *d - start,
            want - start
        );
    }
    assert!(hs.iter().all(|h| h.is_stale()));
    let s = wheel.stats();
    assert_eq!(s.inserted, s.fired + s.cancelled + s.pending, "{s:?}");
}

#[tokio::test(start_paused = true)]
async fn stream_ends_when_handles_remove_last_entries_after_timers_dropped_shards8() {
    let wheel = Wheel::builder().shards(8).build();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    let hs: Vec<_> = (0..40u32)
        .map(|k| timers.insert(k, k, Duration::from_secs(3600)))
        .collect();
    drop(timers);
    for (i, h) in hs.iter().enumerate() {
        if i % 2 == 0 {
            h.remove();
        } else {
            assert_eq!(h.take().await, Some(i as u32));
        }
    }
    let r = tokio::time::timeout(Duration::from_secs(60), expired.next())
        .await
        .expect("stream still open with nothing pending and no Timers");
    assert!(r.is_none(), "got {r:?}");
}

#[tokio::test(start_paused = true)]
async fn stream_ends_at_once_with_nothing_pending_shards16() {
    let wheel = Wheel::builder().shards(16).build();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    let t2 = timers.clone();
    t2.set(1, 1, Duration::from_secs(1));
    assert_eq!(t2.take(&1).await, Some(1));
    drop(timers);
    drop(t2);
    let r = tokio::time::timeout(Duration::from_secs(60), expired.next())
        .await
        .expect("stream did not end");
    assert!(r.is_none());
}

/// Expirations dropped while shards are firing: no panic, the set keeps working, stats add up.
#[test]
fn expirations_dropped_while_shards_fire_shards6() {
    let rt = mt_runtime(2);
    rt.block_on(async {
        let wheel = Wheel::builder().shards(6).build();
        let (timers, mut expired) = wheel.keyed::<u64, Vec<u8>>();
        for k in 0..20_000u64 {
            timers.set(k, vec![0; 16], Duration::from_micros(k % 5000));
        }
        let mut n = 0;
        while n < 100 {
            expired.next().await.unwrap();
            n += 1;
        }
        drop(expired);
        // keep working
        let producer = {
            let timers = timers.clone();
            std::thread::spawn(move || {
                for k in 100_000..120_000u64 {
                    timers.set(k, vec![1], Duration::from_micros(k % 3000));
                }
            })
        };
        producer.join().unwrap();
        timers.set(7, vec![7], Duration::from_secs(3600));
        assert_eq!(timers.take(&7).await, Some(vec![7]));
        timers.set(8, vec![8], Duration::from_secs(3600));
        tokio::time::timeout(GUARD, async {
            loop {
                if timers.len().await == 1 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("entries never drained after the stream was dropped");
        assert_eq!(timers.drain().await, vec![(8, vec![8])]);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let s = wheel.stats();
        assert_eq!(s.inserted, s.fired + s.cancelled + s.pending, "{s:?}");
        assert_eq!(
            s.expirations_backlog, 0,
            "backlog should be 0 once the stream is gone: {s:?}"
        );
    });
}

#[test]
fn default_shards_follow_worker_threads() {
    let rt = mt_runtime(2);
    rt.block_on(async {
        let w = Wheel::new();
        assert_eq!(w.keyed::<u8, ()>().0.shards(), 2);
    });
    let rt3 = mt_runtime(3);
    rt3.block_on(async {
        let w = Wheel::builder().build();
        assert_eq!(w.keyed::<u8, ()>().0.shards(), 3);
        let w = Wheel::builder().runtime(rt.handle().clone()).build();
        assert_eq!(
            w.keyed::<u8, ()>().0.shards(),
            2,
            "default follows the runtime the actors run on"
        );
    });
    let ct = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    ct.block_on(async {
        assert_eq!(Wheel::new().keyed::<u8, ()>().0.shards(), 1);
        let w = Wheel::builder().own_thread(true).build();
        assert_eq!(w.keyed::<u8, ()>().0.shards(), 1);
    });
}

#[tokio::test]
async fn shards_out_of_range_are_refused() {
    for n in [0usize, 257, 1000, usize::MAX] {
        match Wheel::builder().shards(n).try_build() {
            Err(BuildError::Shards(m)) => assert_eq!(m, n),
            other => panic!("shards({n}) gave {:?}", other.map(|_| ())),
        }
        let msg = std::panic::catch_unwind(|| Wheel::builder().shards(n).build())
            .err()
            .unwrap();
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(
            msg.contains(&n.to_string()),
            "panic message {msg:?} should say which n"
        );
    }
    for n in [1usize, 2, 255, 256] {
        let w = Wheel::builder().shards(n).try_build().unwrap();
        assert_eq!(w.keyed::<u8, ()>().0.shards(), n);
    }
}

#[tokio::test(start_paused = true)]
async fn shards256_few_keys() {
    let wheel = Wheel::builder().shards(256).build();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    let start = Instant::now();
    for k in 0..5u32 {
        timers.set(k, k, Duration::from_secs(10 - k as u64));
    }
    let h = timers.insert(9, 9, Duration::from_secs(3));
    assert_eq!(timers.len().await, 6);
    let mut order = Vec::new();
    for _ in 0..6 {
        let e = expired.next().await.unwrap();
        assert!(Instant::now() >= e.deadline());
        order.push((*e.key(), (e.deadline() - start).as_secs()));
    }
    assert_eq!(
        order,
        vec![(9, 3), (4, 6), (3, 7), (2, 8), (1, 9), (0, 10)],
        "distinct seconds apart: deadline order"
    );
    assert!(h.is_stale());
    assert_eq!(timers.len().await, 0);
    timers.set(1, 1, Duration::from_secs(1));
    assert_eq!(timers.drain().await, vec![(1, 1)]);
    timers.set(2, 2, Duration::from_secs(1));
    wheel.shutdown().await;
    let e = expired.next().await.unwrap();
    assert!(e.is_shutdown());
    assert_eq!(e.into_parts(), (2, 2));
    assert!(expired.next().await.is_none());
    assert!(expired.next().now_or_never().flatten().is_none());
    let s = wheel.stats();
    assert_eq!(s.inserted, s.fired + s.cancelled + s.pending, "{s:?}");
}

/// A current-thread runtime with shards(4), fed from other threads.
#[test]
fn current_thread_shards4_fed_from_threads() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let wheel = rt.block_on(async { Wheel::builder().shards(4).build() });
    let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
    assert_eq!(timers.shards(), 4);
    let mut threads = Vec::new();
    for t in 0..3u64 {
        let timers = timers.clone();
        threads.push(std::thread::spawn(move || {
            let mut taken = Vec::new();
            for i in 0..20_000u64 {
                let k = t << 32 | i;
                timers.set(k, k, Duration::from_micros(i % 4000));
                if i % 3 == 0 {
                    timers.reset(&k, Duration::from_millis(2));
                }
                if i % 7 == 0 && futures::executor::block_on(timers.take(&k)).is_some() {
                    taken.push(k);
                }
            }
            taken
        }));
    }
    let (fired, taken) = rt.block_on(async {
        let t = timers.clone();
        let joiner = tokio::task::spawn_blocking(move || {
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect::<Vec<_>>()
        });
        drop(timers);
        let mut fired = Vec::new();
        let mut beat_gap = Duration::ZERO;
        let hb = tokio::spawn(async move {
            let mut last = std::time::Instant::now();
            let mut worst = Duration::ZERO;
            for _ in 0..200 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                worst = worst.max(last.elapsed());
                last = std::time::Instant::now();
            }
            worst
        });
        let taken = tokio::time::timeout(GUARD, joiner)
            .await
            .expect("producers hung")
            .unwrap();
        drop(t);
        while let Some(e) = tokio::time::timeout(GUARD, expired.next())
            .await
            .expect("stream did not end")
        {
            assert!(Instant::now() >= e.deadline());
            fired.push(*e.key());
        }
        beat_gap = beat_gap.max(hb.await.unwrap());
        println!("worst heartbeat gap {beat_gap:?}");
        (fired, taken)
    });
    let mut all: Vec<u64> = fired.into_iter().chain(taken).collect();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "some key fired/taken twice");
    assert_eq!(n, 60_000, "every key exactly once (fired or taken)");
    let s = wheel.stats();
    assert_eq!(s.inserted, s.fired + s.cancelled + s.pending, "{s:?}");
}
