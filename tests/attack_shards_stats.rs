//! Stats::inserted probes (paused time, one shard and many).
use std::time::Duration;
use tokio_wheel::Wheel;

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
}

async fn probe(
    shards: usize,
    name: &str,
    f: impl AsyncFnOnce(&tokio_wheel::Timers<u32, u32>) -> u64,
) {
    let wheel = Wheel::builder().shards(shards).build();
    let (t, _e) = wheel.keyed::<u32, u32>();
    let sets = f(&t).await;
    let _ = t.len().await;
    settle().await;
    let s = wheel.stats();
    assert_eq!(
        s.inserted,
        s.fired + s.cancelled + s.pending,
        "{name} shards {shards}: {s:?}"
    );
    // Not promised: a set and a remove that meet before the actor applies them cancel out
    // (neither is counted). Only "no more than the sets made" and the invariant are checked.
    assert!(s.inserted <= sets, "{name} shards {shards}: inserted {s:?}");
}

#[tokio::test(start_paused = true)]
async fn stats_inserted_probes() {
    for shards in [1, 4] {
        probe(shards, "set set", async |t| {
            t.set(1, 1, Duration::from_secs(5));
            t.set(1, 2, Duration::from_secs(5));
            2
        })
        .await;
        probe(shards, "insert set", async |t| {
            let _h = t.insert(1, 1, Duration::from_secs(5));
            t.set(1, 2, Duration::from_secs(5));
            2
        })
        .await;
        probe(shards, "set remove", async |t| {
            t.set(1, 1, Duration::from_secs(5));
            t.remove(&1);
            1
        })
        .await;
        probe(shards, "set drain set", async |t| {
            t.set(1, 1, Duration::from_secs(5));
            t.drain().await;
            t.set(1, 2, Duration::from_secs(5));
            2
        })
        .await;
        probe(shards, "insert hremove set", async |t| {
            let h = t.insert(1, 1, Duration::from_secs(5));
            h.remove();
            t.set(1, 2, Duration::from_secs(5));
            2
        })
        .await;
        probe(shards, "set fire set", async |t| {
            t.set(1, 1, Duration::from_secs(1));
            tokio::time::sleep(Duration::from_secs(2)).await;
            t.set(1, 2, Duration::from_secs(5));
            2
        })
        .await;
        probe(shards, "insert, handle reset later, fire, set", async |t| {
            let h = t.insert(1, 1, Duration::from_secs(1));
            h.reset(Duration::from_secs(3));
            tokio::time::sleep(Duration::from_secs(5)).await;
            t.set(1, 2, Duration::from_secs(5));
            2
        })
        .await;
        probe(shards, "set, reset earlier, set", async |t| {
            t.set(1, 1, Duration::from_secs(10));
            t.reset(&1, Duration::from_secs(1));
            t.set(1, 3, Duration::from_secs(10));
            2
        })
        .await;
        probe(shards, "set, drain, drain", async |t| {
            t.set(1, 1, Duration::from_secs(10));
            t.set(2, 1, Duration::from_secs(10));
            t.drain().await;
            t.drain().await;
            2
        })
        .await;
    }
}
