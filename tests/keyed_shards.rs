//! Keyed sets spread over several actors (`Builder::shards`): what holds per key with one
//! actor holds with many, and the calls on every key (`len`, `drain`, shutdown) cover them all.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_wheel::{BuildError, Wheel};

use support::two_workers;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn a_set_runs_one_shard_per_worker_by_default_and_as_many_as_asked() {
    let rt = two_workers();
    rt.block_on(async {
        let (timers, _expired) = Wheel::new().keyed::<u64, ()>();
        assert_eq!(timers.shards(), 2, "one per worker of a two-worker runtime");
        let wheel = Wheel::builder().shards(5).build();
        assert_eq!(wheel.keyed::<u64, ()>().0.shards(), 5);
    });
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    current.block_on(async {
        assert_eq!(Wheel::new().keyed::<u64, ()>().0.shards(), 1);
    });
}

#[tokio::test]
async fn a_shard_count_outside_one_to_256_is_refused_with_a_clear_error() {
    for n in [0, 257, usize::MAX] {
        let error = Wheel::builder().shards(n).try_build().unwrap_err();
        assert_eq!(error, BuildError::Shards(n));
        assert!(error.to_string().contains("1 to 256"), "{error}");
    }
    assert!(Wheel::builder().shards(256).try_build().is_ok());
}

/// Keys of every shard: `len` counts them all, `take` finds each, `drain` returns the rest,
/// and nothing fires afterwards.
#[tokio::test(start_paused = true)]
async fn len_take_and_drain_cover_every_shard() {
    let wheel = Wheel::builder().shards(4).build();
    let (timers, mut expired) = wheel.keyed::<u64, u64>();
    for key in 0..1000 {
        timers.set(key, key * 10, Duration::from_secs(60));
    }
    assert_eq!(timers.len().await, 1000);
    for key in (0..1000).step_by(3) {
        assert_eq!(timers.take(&key).await, Some(key * 10), "key {key}");
    }
    let mut drained = timers.drain().await;
    drained.sort();
    let want: Vec<_> = (0..1000)
        .filter(|key| key % 3 != 0)
        .map(|key| (key, key * 10))
        .collect();
    assert_eq!(drained, want);
    assert_eq!(timers.len().await, 0);
    drop(timers);
    assert!(
        expired.next().await.is_none(),
        "nothing left to fire, and the stream ends once every shard's actor has stopped"
    );
}

/// Keys on every shard, each fired once and never early, with the value it was last set to.
#[tokio::test(start_paused = true)]
async fn every_key_of_every_shard_fires_once_never_early() {
    let wheel = Wheel::builder().shards(3).build();
    let (timers, mut expired) = wheel.keyed::<u64, u64>();
    let start = Instant::now();
    for key in 0..300 {
        timers.set(key, 0, ms(10 + key));
        timers.set(key, key, ms(20 + key % 50));
    }
    drop(timers);
    let mut seen = HashSet::new();
    while let Some(e) = expired.next().await {
        let (key, value) = (*e.key(), *e.value());
        assert_eq!(value, key, "the last set wins");
        assert_eq!(e.deadline(), start + ms(20 + key % 50));
        assert!(Instant::now() >= e.deadline(), "key {key} fired early");
        assert!(seen.insert(key), "key {key} fired twice");
    }
    assert_eq!(seen.len(), 300);
    let stats = wheel.stats();
    assert_eq!(
        stats.inserted,
        stats.fired + stats.cancelled + stats.pending
    );
    assert_eq!(stats.fired, 300);
}

/// Commands on a key from one thread apply in the order they were made, with many threads
/// at it on keys of every shard at once: set, reset, remove — and a final set that stays.
#[test]
fn commands_on_a_key_keep_their_order_with_many_threads_on_many_shards() {
    let rt = two_workers();
    let wheel = rt.block_on(async { Wheel::builder().shards(4).build() });
    let (timers, _expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let timers = timers.clone();
            std::thread::spawn(move || {
                for i in 0..2000u64 {
                    let key = t * 10_000 + i;
                    timers.set(key, 1, Duration::from_secs(60));
                    timers.reset(&key, Duration::from_secs(90));
                    timers.remove(&key);
                    timers.set(key, 2, Duration::from_secs(120));
                    if i % 2 == 0 {
                        timers.remove(&key);
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let mut left: Vec<_> = rt.block_on(timers.drain());
    left.sort();
    let want: Vec<_> = (0..4u64)
        .flat_map(|t| (1..2000u64).step_by(2).map(move |i| (t * 10_000 + i, 2)))
        .collect();
    assert_eq!(left, want);
}

/// A shutdown delivers each pending entry of every shard once, marked, then ends the stream;
/// a removed one never.
#[tokio::test(start_paused = true)]
async fn shutdown_flushes_every_shard_once() {
    let wheel = Wheel::builder().shards(4).build();
    let (timers, mut expired) = wheel.keyed::<u64, ()>();
    for key in 0..500 {
        timers.set(key, (), Duration::from_secs(3600));
    }
    for key in 0..100 {
        timers.remove(&key);
    }
    wheel.shutdown().await;
    let mut seen = HashMap::new();
    while let Some(e) = expired.next().await {
        assert!(e.is_shutdown());
        *seen.entry(*e.key()).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 400);
    assert!(seen.iter().all(|(key, n)| *key >= 100 && *n == 1));
    assert_eq!(timers.len().await, 0, "a stopped wheel answers empty");
}

/// Producers on several threads flood a sharded set; `len` made meanwhile is answered, and
/// every key ends up counted.
#[test]
fn a_flood_from_many_threads_over_many_shards_is_applied_whole() {
    let rt = two_workers();
    let wheel = rt.block_on(async { Wheel::builder().shards(2).build() });
    let (timers, _expired) = rt.block_on(async { wheel.keyed::<u64, ()>() });
    let timers = Arc::new(timers);
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let timers = timers.clone();
            std::thread::spawn(move || {
                for i in 0..100_000u64 {
                    timers.set(t * 1_000_000 + i % 5000, (), Duration::from_secs(60));
                }
            })
        })
        .collect();
    let during = rt.block_on(timers.len());
    assert!(during <= 15_000);
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(rt.block_on(timers.len()), 15_000);
}

/// A task that sets thousands of keys without yielding has them applied beside it, on the
/// other worker, rather than all at once when it finally asks (the keyed inbox's early take:
/// the actor is woken, and handed to an idle worker, every few hundred queued commands). The
/// producer keeps the worker it runs on and watches `stats()`, which only an actor's turn
/// moves; it gives up after 20 s of real time, far beyond any scheduling delay.
#[test]
fn a_bulk_load_is_applied_while_its_producer_is_still_running() {
    let rt = two_workers();
    rt.block_on(async {
        let wheel = Wheel::builder().shards(1).build();
        let (timers, _expired) = wheel.keyed::<u64, ()>();
        let producer = tokio::spawn({
            let wheel = wheel.clone();
            async move {
                let before = wheel.stats().inserted;
                for key in 0..4096 {
                    timers.set(key, (), Duration::from_secs(60));
                }
                // No await from here on: only another worker can run the actor.
                let give_up = std::time::Instant::now() + Duration::from_secs(20);
                while wheel.stats().inserted == before && std::time::Instant::now() < give_up {
                    std::thread::yield_now();
                }
                let applied = wheel.stats().inserted - before;
                (applied, timers.len().await)
            }
        });
        let (applied, len) = producer.await.unwrap();
        assert!(applied > 0, "nothing was applied while the producer ran");
        assert_eq!(len, 4096);
    });
}
