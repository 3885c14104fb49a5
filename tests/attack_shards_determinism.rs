//! The same deterministic paused-time script gives the same results with 1, 3, 8 and 256 shards.
mod support;
use support::shards::*;

use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_wheel::{KeyedTimer, Wheel};

#[derive(Debug, PartialEq, Eq, Clone, PartialOrd, Ord)]
enum Obs {
    Take(u32, Option<u64>),
    HTake(u32, Option<u64>),
    Len(usize),
    Drain(Vec<(u32, u64)>),
    Stale(u32, bool),
}

type Exp = (
    u32,
    u64,
    u64,  /*deadline ms*/
    bool, /*shutdown*/
    u64,  /*received ms*/
);

async fn script(
    shards: usize,
    seed: u64,
    shutdown_at_end: bool,
) -> (Vec<Obs>, Vec<Exp>, (u64, u64, u64, u64)) {
    script_dbg(shards, seed, shutdown_at_end, false).await
}

async fn script_dbg(
    shards: usize,
    seed: u64,
    shutdown_at_end: bool,
    debug: bool,
) -> (Vec<Obs>, Vec<Exp>, (u64, u64, u64, u64)) {
    let wheel = Wheel::builder().shards(shards).build();
    let (timers, mut expired) = wheel.keyed::<u32, u64>();
    let start = Instant::now();
    let ms = move |i: Instant| (i - start).as_millis() as u64;
    let reader = tokio::spawn(async move {
        let mut v = Vec::new();
        while let Some(e) = expired.next().await {
            let now = Instant::now();
            assert!(e.is_shutdown() || now >= e.deadline(), "early");
            v.push((
                *e.key(),
                *e.value(),
                ms(e.deadline()),
                e.is_shutdown(),
                ms(now),
            ));
        }
        v
    });
    let mut rng = Rng::new(seed);
    let mut obs = Vec::new();
    let mut handles: Vec<KeyedTimer<u32, u64>> = Vec::new();
    let mut val = 0u64;
    let mut sets = 0u64;
    let mut now_s = 0u64;
    // deadlines at x.5 s, observation points at whole seconds
    let dl = |rng: &mut Rng, now_s: u64| {
        start + Duration::from_millis((now_s + 1 + rng.below(30)) * 1000 + 500)
    };
    for _ in 0..3000 {
        let k = rng.below(150) as u32;
        val += 1;
        let kind = rng.below(16);
        match kind {
            0..=3 => {
                sets += 1;
                timers.set_at(k, val, dl(&mut rng, now_s))
            }
            4 => {
                sets += 1;
                timers.set(
                    k,
                    val,
                    Duration::from_millis((1 + rng.below(30)) * 1000 + 500),
                )
            }
            5 => timers.reset_at(&k, dl(&mut rng, now_s)),
            6 => timers.remove(&k),
            7 => obs.push(Obs::Take(k, timers.take(&k).await)),
            8 | 9 => {
                sets += 1;
                handles.push(timers.insert_at(k, val, dl(&mut rng, now_s)))
            }
            10 | 11 if !handles.is_empty() => {
                let h = &handles[rng.below(handles.len() as u64) as usize];
                match rng.below(4) {
                    0 => h.reset(Duration::from_millis((1 + rng.below(30)) * 1000 + 500)),
                    1 => h.reset_at(dl(&mut rng, now_s)),
                    2 => h.remove(),
                    _ => obs.push(Obs::HTake(*h.key(), h.take().await)),
                }
            }
            12 => obs.push(Obs::Len(timers.len().await)),
            13 if rng.below(10) == 0 => {
                let mut d = timers.drain().await;
                d.sort();
                obs.push(Obs::Drain(d));
            }
            14 | 15 => {
                let secs = rng.below(3);
                now_s += secs;
                tokio::time::sleep_until(start + Duration::from_secs(now_s)).await;
                if secs == 0 {
                    continue;
                }
                // a barrier first: is_stale only reflects what the actor has applied
                obs.push(Obs::Len(timers.len().await));
                for h in &handles {
                    obs.push(Obs::Stale(*h.key(), h.is_stale()));
                }
                handles.retain(|h| !h.is_stale());
            }
            _ => {}
        }
        if debug {
            let _ = timers.len().await;
            for _ in 0..5 {
                tokio::task::yield_now().await;
            }
            let st = wheel.stats();
            assert!(st.inserted <= sets);
        }
    }
    obs.push(Obs::Len(timers.len().await));
    if shutdown_at_end {
        wheel.shutdown().await;
    } else {
        drop(timers);
    }
    let exps = tokio::time::timeout(Duration::from_secs(100_000), reader)
        .await
        .expect("stream did not end")
        .unwrap();
    tokio::task::yield_now().await;
    let s = wheel.stats();
    assert_eq!(
        s.inserted,
        s.fired + s.cancelled + s.pending,
        "shards {shards}: {s:?}"
    );
    assert_eq!(s.pending, 0, "{s:?}");
    assert!(
        s.inserted <= sets,
        "shards {shards} seed {seed}: Stats::inserted > number of set/set_at/insert calls made ({s:?})"
    );
    (obs, exps, (s.inserted, s.fired, s.cancelled, s.rescheduled))
}

async fn compare(seed: u64, shutdown: bool) {
    let (o1, mut e1, s1) = script(1, seed, shutdown).await;
    for n in [3usize, 8, 256] {
        let (on, mut en, sn) = script(n, seed, shutdown).await;
        for (i, (a, b)) in o1.iter().zip(on.iter()).enumerate() {
            assert_eq!(
                a, b,
                "seed {seed}: observation #{i} differs between shards(1) and shards({n})"
            );
        }
        assert_eq!(o1.len(), on.len());
        e1.sort();
        en.sort();
        assert_eq!(
            e1.len(),
            en.len(),
            "seed {seed}: number of expirations differs between shards(1) and shards({n})"
        );
        assert_eq!(
            e1, en,
            "seed {seed}: expirations (key, value, deadline, shutdown, received) differ between shards(1) and shards({n})"
        );
        assert_eq!(s1.1, sn.1, "fired differs");
    }
}

#[tokio::test(start_paused = true)]
async fn same_script_same_results_1_vs_many_shards_drop() {
    for seed in 1..scaled(3, 6) {
        compare(seed, false).await;
    }
}

#[tokio::test(start_paused = true)]
async fn same_script_same_results_1_vs_many_shards_shutdown() {
    for seed in 10..scaled(12, 15) {
        compare(seed, true).await;
    }
}

/// Same, on a multi-thread runtime (paused clock needs current-thread, so real time and
/// deadlines far away: only the authoritative answers and the shutdown flush are compared).
#[test]
fn same_script_far_deadlines_multithread() {
    let rt = mt_runtime(2);
    rt.block_on(async {
        async fn run(shards: usize) -> (Vec<Obs>, Vec<(u32, u64)>) {
            let wheel = Wheel::builder().shards(shards).build();
            let (timers, expired) = wheel.keyed::<u32, u64>();
            let mut rng = Rng::new(42);
            let mut obs = Vec::new();
            let mut hs = Vec::new();
            for v in 0..20_000u64 {
                let k = rng.below(500) as u32;
                match rng.below(8) {
                    0 | 1 => timers.set(k, v, Duration::from_secs(3600)),
                    2 => timers.remove(&k),
                    3 => obs.push(Obs::Take(k, timers.take(&k).await)),
                    4 => hs.push(timers.insert(k, v, Duration::from_secs(7200))),
                    5 if !hs.is_empty() => {
                        let h: &KeyedTimer<u32, u64> = &hs[rng.below(hs.len() as u64) as usize];
                        if rng.below(2) == 0 {
                            h.remove()
                        } else {
                            obs.push(Obs::HTake(*h.key(), h.take().await))
                        }
                    }
                    6 => obs.push(Obs::Len(timers.len().await)),
                    _ => timers.reset(&k, Duration::from_secs(5000)),
                }
            }
            wheel.shutdown().await;
            let mut f: Vec<_> = expired
                .map(|e| {
                    assert!(e.is_shutdown());
                    e.into_parts()
                })
                .collect()
                .await;
            f.sort();
            (obs, f)
        }
        let a = run(1).await;
        for n in [2, 8, 64] {
            let b = run(n).await;
            assert_eq!(
                a.0, b.0,
                "authoritative answers differ between shards(1) and shards({n})"
            );
            assert_eq!(
                a.1, b.1,
                "shutdown flush differs between shards(1) and shards({n})"
            );
        }
    });
}
