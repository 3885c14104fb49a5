//! Outside attack on keyed sets' early take (a send that makes a thread's queue hold 512
//! commands wakes the actor and, on a multi-thread runtime, spawns an empty task so the actor
//! runs beside the producer) and on `Timers::remove` / `Timers::reset` rewriting one of the
//! last 8 queued commands under one lock.
//!
//! Public API only (API.md section 3, "Fairness and memory"). Deadlines that must not race
//! are an hour or more away; every real-time wait has a give-up timeout of 30 s or more.

mod support;
use support::shards::{Rng, mt_runtime};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_wheel::{Expirations, Expired, Timers, Wheel};

const GIVE_UP: Duration = Duration::from_secs(40);
const HOUR: Duration = Duration::from_secs(3600);

fn ct() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn ct_paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(GIVE_UP, f).await {
        Ok(out) => out,
        Err(_) => panic!("gave up after {GIVE_UP:?}: {what} hangs"),
    }
}

/// Reads the stream to its end (real time, with a give-up).
async fn read_all<K, V>(expired: &mut Expirations<K, V>) -> Vec<Expired<K, V>>
where
    K: Send + 'static,
    V: Send + 'static,
{
    let mut out = Vec::new();
    within("expirations stream end", async {
        while let Some(e) = expired.next().await {
            out.push(e);
        }
    })
    .await;
    out
}

/// The expected state of a keyed set: key -> (value, deadline).
type Model = HashMap<u32, (u64, Instant)>;

/// One synchronous by-key command on both the set and the model. `small` keys are the ones
/// that collide within the last-8 window; `far` keys spread over the set.
fn random_sync_op(
    rng: &mut Rng,
    timers: &Timers<u32, u64>,
    model: &mut Model,
    base: Instant,
    op_id: u64,
) {
    let key = if rng.below(2) == 0 {
        rng.below(12) as u32
    } else {
        rng.below(4096) as u32
    };
    let deadline = base + Duration::from_millis(rng.below(3_600_000));
    match rng.below(100) {
        0..=39 => {
            timers.set_at(key, op_id, deadline);
            model.insert(key, (op_id, deadline));
        }
        40..=69 => {
            timers.reset_at(&key, deadline);
            if let Some(entry) = model.get_mut(&key) {
                entry.1 = deadline;
            }
        }
        70..=89 => {
            timers.remove(&key);
            model.remove(&key);
        }
        _ => {
            // set immediately followed by remove or by a reset pair: the rewrite paths.
            timers.set_at(key, op_id, deadline);
            match rng.below(3) {
                0 => {
                    timers.remove(&key);
                    model.remove(&key);
                }
                1 => {
                    let earlier = deadline - Duration::from_millis(1 + rng.below(1000));
                    let later = deadline + Duration::from_millis(1 + rng.below(1000));
                    timers.reset_at(&key, earlier);
                    timers.reset_at(&key, later);
                    model.insert(key, (op_id, later));
                }
                _ => {
                    let later = deadline + Duration::from_millis(1 + rng.below(1000));
                    let earlier = deadline - Duration::from_millis(1 + rng.below(1000));
                    timers.reset_at(&key, later);
                    timers.reset_at(&key, earlier);
                    model.insert(key, (op_id, earlier));
                }
            }
        }
    }
}

/// Bursts of synchronous commands (lengths straddling 512 and its multiples), each followed by
/// an authoritative call checked against the model. Returns the model.
async fn model_run(timers: &Timers<u32, u64>, seed: u64, bursts: usize) -> Model {
    let mut rng = Rng::new(seed);
    let mut model = Model::new();
    // Deadlines between one and two hours from now: nothing fires during the run.
    let base = Instant::now() + HOUR;
    let mut op_id = 0u64;
    for burst in 0..bursts {
        // Mostly lengths just around 512 / 1024 / 1536, sometimes anything.
        let len = match rng.below(4) {
            0 => 505 + rng.below(16),
            1 => 1017 + rng.below(16),
            2 => 1529 + rng.below(16),
            _ => 1 + rng.below(2000),
        };
        for _ in 0..len {
            op_id += 1;
            random_sync_op(&mut rng, timers, &mut model, base, op_id);
        }
        match rng.below(3) {
            0 => {
                let key = rng.below(12) as u32;
                let got = timers.take(&key).await;
                let want = model.remove(&key).map(|(v, _)| v);
                assert_eq!(
                    got, want,
                    "seed {seed} burst {burst}: take({key}) after {op_id} ops"
                );
            }
            1 => {
                let got = timers.len().await;
                assert_eq!(
                    got,
                    model.len(),
                    "seed {seed} burst {burst}: len after {op_id} ops"
                );
            }
            _ => tokio::task::yield_now().await,
        }
    }
    model
}

/// Checks what the shutdown flush delivered against the model: each entry exactly once, with
/// its value and deadline, marked is_shutdown; nothing else.
fn check_flush(model: &Model, delivered: Vec<Expired<u32, u64>>, what: &str) {
    let mut seen = HashMap::new();
    for e in delivered {
        assert!(
            e.is_shutdown(),
            "{what}: key {} fired before shutdown (deadlines are an hour away)",
            e.key()
        );
        let deadline = e.deadline();
        let (k, v) = e.into_parts();
        assert!(
            seen.insert(k, (v, deadline)).is_none(),
            "{what}: key {k} delivered twice"
        );
    }
    let mut missing: Vec<_> = model.keys().filter(|k| !seen.contains_key(k)).collect();
    missing.sort();
    assert!(
        missing.is_empty(),
        "{what}: set and not removed, never delivered: {missing:?}"
    );
    let mut extra: Vec<_> = seen.keys().filter(|k| !model.contains_key(k)).collect();
    extra.sort();
    assert!(
        extra.is_empty(),
        "{what}: removed (or never set) yet delivered: {extra:?}"
    );
    for (k, want) in model {
        assert_eq!(seen[k], *want, "{what}: key {k} (value, deadline)");
    }
}

fn model_then_shutdown(rt: tokio::runtime::Runtime, shards: usize, seed: u64, bursts: usize) {
    rt.block_on(async {
        let wheel = Wheel::builder().shards(shards).build();
        let (timers, mut expired) = wheel.keyed::<u32, u64>();
        let model = within("model run", model_run(&timers, seed, bursts)).await;
        assert_eq!(within("len", timers.len()).await, model.len());
        within("shutdown", wheel.shutdown()).await;
        let delivered = read_all(&mut expired).await;
        check_flush(&model, delivered, &format!("shards {shards} seed {seed}"));
    });
}

/// Order per key across the 512-command boundaries and the last-8 rewrites, one task, multi-
/// thread runtime (the early take hands the actor to the other worker mid-burst).
#[test]
fn model_bursts_multi_thread_one_shard() {
    for seed in 1..=3 {
        model_then_shutdown(mt_runtime(2), 1, seed, 60);
    }
}

#[test]
fn model_bursts_multi_thread_three_shards() {
    for seed in 11..=13 {
        model_then_shutdown(mt_runtime(2), 3, seed, 60);
    }
}

#[test]
fn model_bursts_current_thread() {
    for (shards, seed) in [(1, 21), (3, 22), (2, 23)] {
        model_then_shutdown(ct(), shards, seed, 60);
    }
}

#[test]
fn model_bursts_one_worker() {
    model_then_shutdown(mt_runtime(1), 1, 31, 60);
    model_then_shutdown(mt_runtime(1), 2, 32, 60);
}

/// Paused time, current thread: after the model run, let every entry fire. Each fires exactly
/// once, at its (last) deadline, never early; removed keys never.
#[test]
fn model_bursts_paused_fire() {
    for (shards, seed) in [(1u64, 41u64), (3, 42)] {
        ct_paused().block_on(async {
            let wheel = Wheel::builder().shards(shards as usize).build();
            let (timers, mut expired) = wheel.keyed::<u32, u64>();
            let start = Instant::now();
            let model = model_run(&timers, seed, 40).await;
            assert_eq!(Instant::now(), start, "paused time moved during the run");
            assert_eq!(timers.len().await, model.len());
            drop(timers);
            let mut seen = HashMap::new();
            while let Some(e) = expired.next().await {
                let now = Instant::now();
                assert!(!e.is_shutdown());
                let (k, v) = (*e.key(), *e.value());
                let want = model
                    .get(&k)
                    .unwrap_or_else(|| panic!("seed {seed}: removed key {k} fired"));
                assert_eq!((v, e.deadline()), *want, "seed {seed}: key {k}");
                assert!(
                    now >= want.1,
                    "seed {seed}: key {k} fired early: {:?} before its deadline",
                    want.1 - now
                );
                assert!(
                    seen.insert(k, v).is_none(),
                    "seed {seed}: key {k} fired twice"
                );
            }
            assert_eq!(seen.len(), model.len(), "seed {seed}: entries never fired");
        });
    }
}

/// Exact boundary placement: with one shard and a fresh set, a thread's queue grows from
/// empty, so the Nth command of the burst is the Nth in the queue unless the actor took it
/// meanwhile. For every offset around 512 and 1024, the probe sequence on key P starts at
/// that command number: set / remove / set / reset-earlier / reset-later / remove / set.
#[test]
fn probe_sequences_at_every_offset_around_512() {
    for flavor in 0..2 {
        let rt = if flavor == 0 { mt_runtime(2) } else { ct() };
        rt.block_on(async {
            let wheel = Wheel::builder().shards(1).build();
            let (timers, mut expired) = wheel.keyed::<u32, u64>();
            let base = Instant::now() + HOUR;
            let mut model = Model::new();
            let mut filler = 1_000_000u32;
            for (round, offset) in (495..530).chain(1010..1030).enumerate() {
                // Settle so the queue starts empty: len is a barrier.
                let _ = timers.len().await;
                for _ in 0..offset {
                    filler += 1;
                    timers.set_at(filler, 0, base);
                    model.insert(filler, (0, base));
                }
                let p = round as u32;
                let d = |ms: u64| base + Duration::from_millis(ms);
                let v = round as u64 * 10;
                // #offset: set, #offset+1: remove (rewrites the set in place, or queues)
                timers.set_at(p, v + 1, d(5000));
                timers.remove(&p);
                // set again, reset earlier (own command), later (merges into that reset)
                timers.set_at(p, v + 2, d(6000));
                timers.reset_at(&p, d(4000));
                timers.reset_at(&p, d(7000));
                // a second key: set, reset later (merges into the set), remove (must not
                // skip past the merged set's seq)
                timers.set_at(p + 500, v + 3, d(1000));
                timers.reset_at(&(p + 500), d(9000));
                timers.remove(&(p + 500));
                timers.reset_at(&(p + 500), d(9500)); // absent: no-op
                model.insert(p, (v + 2, d(7000)));
                // third key: set, remove, set (the value of the last set must survive)
                timers.set_at(p + 1000, v + 4, d(100));
                timers.remove(&(p + 1000));
                timers.set_at(p + 1000, v + 5, d(200));
                model.insert(p + 1000, (v + 5, d(200)));
                if round % 4 == 0 {
                    let got = timers.take(&(p + 1000)).await;
                    assert_eq!(
                        got,
                        Some(v + 5),
                        "offset {offset}: take after set/remove/set"
                    );
                    model.remove(&(p + 1000));
                }
            }
            assert_eq!(timers.len().await, model.len());
            wheel.shutdown().await;
            let delivered = read_all(&mut expired).await;
            check_flush(&model, delivered, &format!("probe flavor {flavor}"));
        });
    }
}

/// Several tasks on a 2-worker runtime share keys; each command is made under one async
/// mutex, so a command made after another returned must take effect after it (API: "one made
/// after another returned (on any thread...) takes effect after it"). Each task makes bursts
/// that cross 512 on its own queue.
#[test]
fn cross_task_happens_before_bursts() {
    for shards in [1usize, 3] {
        mt_runtime(2).block_on(async {
            let wheel = Wheel::builder().shards(shards).build();
            let (timers, mut expired) = wheel.keyed::<u32, u64>();
            let base = Instant::now() + HOUR;
            let state = Arc::new(tokio::sync::Mutex::new((Model::new(), 0u64)));
            let mut tasks = Vec::new();
            for t in 0..4u64 {
                let timers = timers.clone();
                let state = state.clone();
                tasks.push(tokio::spawn(async move {
                    let mut rng = Rng::new(100 + t + shards as u64 * 7);
                    for _ in 0..1500 {
                        let mut guard = state.lock().await;
                        let (model, op_id) = &mut *guard;
                        // mostly a few commands per turn (the keys' commands interleave
                        // across the tasks' queues), sometimes a burst across 512
                        let len = if rng.below(50) == 0 {
                            500 + rng.below(40)
                        } else {
                            1 + rng.below(8)
                        };
                        for _ in 0..len {
                            *op_id += 1;
                            random_sync_op(&mut rng, &timers, model, base, *op_id);
                        }
                        if rng.below(40) == 0 {
                            let key = rng.below(12) as u32;
                            let got = timers.take(&key).await;
                            let want = model.remove(&key).map(|(v, _)| v);
                            assert_eq!(got, want, "task {t}: take({key})");
                        }
                        drop(guard);
                        tokio::task::yield_now().await;
                    }
                }));
            }
            for task in tasks {
                within("task", task).await.unwrap();
            }
            let model = state.lock().await.0.clone();
            assert_eq!(timers.len().await, model.len());
            wheel.shutdown().await;
            check_flush(
                &model,
                read_all(&mut expired).await,
                &format!("cross-task shards {shards}"),
            );
        });
    }
}

/// The same across plain std threads (no runtime on the producers: the early take only
/// wakes), a std mutex ordering the commands.
#[test]
fn cross_std_thread_happens_before_bursts() {
    let rt = mt_runtime(2);
    let wheel = rt.block_on(async { Wheel::builder().shards(2).build() });
    let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u32, u64>() });
    let base = rt.block_on(async { Instant::now() }) + HOUR;
    let state = Arc::new(std::sync::Mutex::new((Model::new(), 0u64)));
    let handles: Vec<_> = (0..3u64)
        .map(|t| {
            let timers = timers.clone();
            let state = state.clone();
            let rt = rt.handle().clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(300 + t);
                for _ in 0..2000 {
                    let mut guard = state.lock().unwrap();
                    let (model, op_id) = &mut *guard;
                    let len = if rng.below(50) == 0 {
                        505 + rng.below(20)
                    } else {
                        1 + rng.below(8)
                    };
                    for _ in 0..len {
                        *op_id += 1;
                        random_sync_op(&mut rng, &timers, model, base, *op_id);
                    }
                    if rng.below(40) == 0 {
                        let key = rng.below(12) as u32;
                        let got = rt.block_on(timers.take(&key));
                        let want = model.remove(&key).map(|(v, _)| v);
                        assert_eq!(got, want, "thread {t}: take({key})");
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let model = state.lock().unwrap().0.clone();
    rt.block_on(async {
        assert_eq!(within("len", timers.len()).await, model.len());
        wheel.shutdown().await;
        check_flush(&model, read_all(&mut expired).await, "cross std threads");
    });
}

/// A producer that never yields sets keys 0..N in order; another task drains over and over.
/// Each drain is a cut of one producer's commands: the union of the drains so far is always a
/// prefix 0..p of the keys, and in the end every key is drained exactly once.
#[test]
fn drains_during_bulk_load_are_prefixes() {
    for shards in [1usize, 3] {
        mt_runtime(2).block_on(async {
            const N: u32 = 60_000;
            let wheel = Wheel::builder().shards(shards).build();
            let (timers, _expired) = wheel.keyed::<u32, u32>();
            let done = Arc::new(AtomicBool::new(false));
            let producer = {
                let timers = timers.clone();
                let done = done.clone();
                tokio::spawn(async move {
                    for k in 0..N {
                        timers.set(k, k, HOUR);
                    }
                    done.store(true, Ordering::SeqCst);
                })
            };
            let mut all: Vec<u32> = Vec::new();
            let mut cuts = 0;
            within("drains", async {
                loop {
                    let finished = done.load(Ordering::SeqCst);
                    let drained = timers.drain().await;
                    for (k, v) in &drained {
                        assert_eq!(k, v);
                    }
                    all.extend(drained.into_iter().map(|(k, _)| k));
                    let mut sorted = all.clone();
                    sorted.sort_unstable();
                    for (i, k) in sorted.iter().enumerate() {
                        assert_eq!(
                            *k as usize, i,
                            "shards {shards}: after {cuts} drains the union is not a prefix of the keys set in order (or has a duplicate)"
                        );
                    }
                    cuts += 1;
                    if finished {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
            })
            .await;
            within("producer", producer).await.unwrap();
            all.extend(timers.drain().await.into_iter().map(|(k, _)| k));
            assert_eq!(all.len(), N as usize, "shards {shards}: keys lost or duplicated");
            assert_eq!(all.iter().copied().collect::<HashSet<_>>().len(), N as usize);
            assert_eq!(timers.len().await, 0);
        });
    }
}

/// len during a bulk load from another task: monotone (one task's successive calls, only
/// sets of new keys), never above what was made, and exact from the producer itself.
#[test]
fn len_during_bulk_load_monotone_and_exact() {
    for shards in [1usize, 3] {
        mt_runtime(2).block_on(async {
            const N: u32 = 50_000;
            let wheel = Wheel::builder().shards(shards).build();
            let (timers, _expired) = wheel.keyed::<u32, u32>();
            let made = Arc::new(AtomicUsize::new(0));
            let done = Arc::new(AtomicBool::new(false));
            let watcher = {
                let timers = timers.clone();
                let made = made.clone();
                let done = done.clone();
                tokio::spawn(async move {
                    let mut last = 0;
                    let mut looks = 0u64;
                    while !done.load(Ordering::SeqCst) {
                        let n = timers.len().await;
                        let bound = made.load(Ordering::SeqCst);
                        // `made` is bumped after the set returns, so a len answered now cannot
                        // exceed the sets made, which is at most bound + 1.
                        assert!(n <= bound + 1, "len {n} above the {bound} sets made");
                        assert!(n >= last, "len went backwards: {last} then {n}");
                        last = n;
                        looks += 1;
                        tokio::task::yield_now().await;
                    }
                    looks
                })
            };
            within("producer", async {
                for k in 0..N {
                    timers.set(k, k, HOUR);
                    made.store(k as usize + 1, Ordering::SeqCst);
                    if k % 4099 == 4098 {
                        assert_eq!(timers.len().await, k as usize + 1, "producer's own len");
                    }
                }
            })
            .await;
            done.store(true, Ordering::SeqCst);
            within("watcher", watcher).await.unwrap();
            assert_eq!(timers.len().await, N as usize);
        });
    }
}

/// take during a bulk load of sets that are due soon (real time, ms): every key is either
/// taken (Some) or delivered by the stream, exactly one of the two, never early.
#[test]
fn take_vs_expiry_during_bulk_load() {
    mt_runtime(2).block_on(async {
        const N: u32 = 20_000;
        let wheel = Wheel::builder().shards(2).build();
        let (timers, mut expired) = wheel.keyed::<u32, u32>();
        let start = Instant::now();
        let producer = {
            let timers = timers.clone();
            tokio::spawn(async move {
                let mut taken = Vec::new();
                for k in 0..N {
                    timers.set_at(k, k, start + Duration::from_millis((k % 40) as u64));
                    if k % 700 == 699 {
                        // take a few recent and a few older keys
                        for j in [k, k - 3, k - 300, k - 650] {
                            if let Some(v) = timers.take(&j).await {
                                assert_eq!(v, j);
                                taken.push(j);
                            }
                        }
                    }
                }
                taken
            })
        };
        let taken = within("producer", producer).await.unwrap();
        drop(timers);
        let mut fired = HashSet::new();
        within("stream", async {
            while let Some(e) = expired.next().await {
                let now = Instant::now();
                assert!(!e.is_shutdown());
                assert!(now >= e.deadline(), "key {} early", e.key());
                assert_eq!(
                    e.deadline(),
                    start + Duration::from_millis((e.key() % 40) as u64)
                );
                assert!(fired.insert(*e.key()), "key {} fired twice", e.key());
            }
        })
        .await;
        for k in &taken {
            assert!(!fired.contains(k), "key {k} taken (Some) and also fired");
        }
        let taken: HashSet<_> = taken.into_iter().collect();
        for k in 0..N {
            assert!(
                fired.contains(&k) || taken.contains(&k),
                "key {k} neither fired nor taken"
            );
        }
    });
}

/// A producer that never yields (10^5 sets) on a 2-worker, a 1-worker runtime, a
/// spawn_blocking thread and a plain std thread: no hang, everything applied (len exact), the
/// other tasks of the runtime still run afterwards.
#[test]
fn never_yielding_producers_do_not_hang() {
    const N: u32 = 100_000;
    for workers in [2usize, 1] {
        let rt = mt_runtime(workers);
        rt.block_on(async {
            let wheel = Wheel::new();
            let (timers, _expired) = wheel.keyed::<u32, u32>();
            let beats = Arc::new(AtomicU64::new(0));
            let heart = {
                let beats = beats.clone();
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        beats.fetch_add(1, Ordering::Relaxed);
                    }
                })
            };
            // in a task
            let t = timers.clone();
            within(
                "task producer",
                tokio::spawn(async move {
                    for k in 0..N {
                        t.set(k, k, HOUR);
                    }
                    assert_eq!(t.len().await, N as usize);
                }),
            )
            .await
            .unwrap();
            // on a blocking thread
            let t = timers.clone();
            within(
                "blocking producer",
                tokio::task::spawn_blocking(move || {
                    for k in 0..N {
                        t.set(k + N, k, HOUR);
                    }
                    for k in 0..N {
                        t.remove(&k);
                    }
                }),
            )
            .await
            .unwrap();
            assert_eq!(within("len", timers.len()).await, N as usize);
            // on a std thread
            let t = timers.clone();
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                for k in 0..N {
                    t.reset(&(k + N), 2 * HOUR);
                    t.set(k + 2 * N, k, HOUR);
                }
                let _ = tx.send(());
            });
            within("std producer", rx).await.unwrap();
            assert_eq!(within("len", timers.len()).await, 2 * N as usize);
            let before = beats.load(Ordering::Relaxed);
            within("heartbeat", async {
                while beats.load(Ordering::Relaxed) < before + 3 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await;
            heart.abort();
            let drained = within("drain", timers.drain()).await;
            assert_eq!(drained.len(), 2 * N as usize);
        });
    }
}

/// The wheel's actors on another runtime than the producer (Builder::runtime): a current-
/// thread producer runtime feeding a multi-thread actor runtime, and a multi-thread producer
/// feeding a current-thread actor runtime driven on its own thread. Bulk load, removes at the
/// 512 boundary, then shutdown: the flush matches.
#[test]
fn actors_on_another_runtime() {
    // actors on MT, producer on CT
    let actors = mt_runtime(2);
    let producer = ct();
    let wheel = Wheel::builder()
        .shards(2)
        .runtime(actors.handle().clone())
        .build_in(&producer);
    run_other_runtime(&producer, wheel, "ct producer, mt actors");

    // actors on a CT runtime driven by its own thread, producer on MT
    let actors_ct = ct();
    let handle = actors_ct.handle().clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let driver = std::thread::spawn(move || {
        actors_ct.block_on(async {
            let _ = stop_rx.await;
        });
    });
    let producer = mt_runtime(2);
    let wheel = Wheel::builder()
        .shards(1)
        .runtime(handle)
        .build_in(&producer);
    run_other_runtime(&producer, wheel, "mt producer, ct actors");
    let _ = stop_tx.send(());
    driver.join().unwrap();
}

trait BuildIn {
    fn build_in(self, rt: &tokio::runtime::Runtime) -> Wheel;
}
impl BuildIn for tokio_wheel::Builder {
    fn build_in(self, rt: &tokio::runtime::Runtime) -> Wheel {
        let _guard = rt.enter();
        self.build()
    }
}

fn run_other_runtime(producer: &tokio::runtime::Runtime, wheel: Wheel, what: &str) {
    producer.block_on(async {
        let (timers, mut expired) = wheel.keyed::<u32, u64>();
        let model = within(what, model_run(&timers, 77, 40)).await;
        let t = timers.clone();
        let model2 = within(
            what,
            tokio::spawn(async move {
                let mut m = Model::new();
                let base = Instant::now() + HOUR;
                for k in 0..30_000u32 {
                    let key = 100_000 + k;
                    t.set_at(key, k as u64, base);
                    m.insert(key, (k as u64, base));
                    if k % 512 == 511 || k % 512 == 0 {
                        t.remove(&key);
                        m.remove(&key);
                    }
                }
                m
            }),
        )
        .await
        .unwrap();
        let mut all = model.clone();
        all.extend(model2);
        assert_eq!(within("len", timers.len()).await, all.len(), "{what}");
        within("shutdown", wheel.shutdown()).await;
        check_flush(&all, read_all(&mut expired).await, what);
    });
}

/// Shutdown while a producer (a std thread, no yielding) is in a bulk load: every key set
/// before shutdown() was called is delivered exactly once, is_shutdown; keys set after it at
/// most once; removed keys (removed before the shutdown) never; the producer finishes.
#[test]
fn shutdown_during_bulk_load() {
    for shards in [1usize, 3] {
        let rt = mt_runtime(2);
        let wheel = rt.block_on(async { Wheel::builder().shards(shards).build() });
        let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u32, u32>() });
        const N: u32 = 80_000;
        let half = Arc::new(AtomicU64::new(u64::MAX));
        let (half_tx, half_rx) = std::sync::mpsc::channel::<u32>();
        let producer = {
            let timers = timers.clone();
            std::thread::spawn(move || {
                for k in 0..N {
                    timers.set(k, k, HOUR);
                    if k % 3 == 0 {
                        // remove right behind its set (the last-8 rewrite) or later
                        timers.remove(&k);
                    }
                    if k % 5 == 0 && k >= 10 {
                        timers.remove(&(k - 10));
                    }
                    if k == N / 2 {
                        half_tx.send(k).unwrap();
                    }
                }
            })
        };
        let made_before = half_rx.recv_timeout(GIVE_UP).expect("producer stalled");
        half.store(made_before as u64, Ordering::SeqCst);
        rt.block_on(async {
            within("shutdown", wheel.shutdown()).await;
        });
        producer.join().unwrap();
        let removed = |k: u32| k % 3 == 0 || (k + 10 < N && (k + 10) % 5 == 0);
        let delivered = rt.block_on(async { read_all(&mut expired).await });
        let mut seen = HashSet::new();
        for e in delivered {
            assert!(
                e.is_shutdown(),
                "shards {shards}: key {} fired before shutdown",
                e.key()
            );
            let (k, v) = e.into_parts();
            assert_eq!(k, v);
            assert!(seen.insert(k), "shards {shards}: key {k} delivered twice");
            if k + 10 <= made_before {
                // both the set and its removes were made before shutdown was called
                assert!(
                    !removed(k),
                    "shards {shards}: key {k} removed before shutdown yet delivered"
                );
            }
        }
        for k in 0..=made_before {
            if !removed(k) {
                assert!(
                    seen.contains(&k),
                    "shards {shards}: key {k} set before shutdown, never delivered"
                );
            }
        }
        // after the stop: calls return promptly and answer empty
        rt.block_on(async {
            timers.set(1, 1, HOUR);
            assert_eq!(within("len after stop", timers.len()).await, 0);
            assert_eq!(within("take after stop", timers.take(&2)).await, None);
        });
    }
}

/// Drop the Timers in the middle of a bulk load (paused time): every key set and not removed
/// fires exactly once at its deadline, then the stream ends.
#[test]
fn drop_timers_mid_bulk_paused() {
    ct_paused().block_on(async {
        let wheel = Wheel::builder().shards(2).build();
        let (timers, mut expired) = wheel.keyed::<u32, u32>();
        let start = Instant::now();
        const N: u32 = 20_000;
        let clone = timers.clone();
        let mut first = Some(timers);
        for k in 0..N {
            let t = match (&first, k % 2) {
                (Some(t), 0) => t,
                _ => &clone,
            };
            t.set_at(k, k, start + Duration::from_millis(1 + (k % 997) as u64));
            if k % 7 == 0 {
                t.remove(&k);
            }
            if k == N / 2 {
                // the first handle goes mid-bulk; the clone finishes the load
                drop(first.take());
            }
        }
        drop(clone);
        let mut seen = HashSet::new();
        while let Some(e) = expired.next().await {
            let k = *e.key();
            assert!(k % 7 != 0, "removed key {k} fired");
            assert!(Instant::now() >= e.deadline(), "key {k} early");
            assert_eq!(
                e.deadline(),
                start + Duration::from_millis(1 + (k % 997) as u64)
            );
            assert!(seen.insert(k), "key {k} twice");
        }
        assert_eq!(seen.len(), (0..N).filter(|k| k % 7 != 0).count());
    });
}

/// Drop the Timers on another thread while its bulk load is still being applied (multi-thread,
/// real time, ms deadlines): each key fires exactly once, never early, the stream ends. A
/// removed key never fires if its `remove` returned before its deadline; on a loaded machine
/// the loop may reach a key after its deadline, and then the expiry may win (API.md §3).
#[test]
fn drop_timers_mid_bulk_multi_thread() {
    mt_runtime(2).block_on(async {
        let wheel = Wheel::builder().shards(3).build();
        let (timers, mut expired) = wheel.keyed::<u32, u32>();
        let start = Instant::now();
        const N: u32 = 50_000;
        let deadline = move |k: u32| start + Duration::from_millis(20 + (k % 50) as u64);
        let producer = std::thread::spawn(move || {
            // Removed keys whose `remove` returned only at or after their deadline.
            let mut late_removes = HashSet::new();
            for k in 0..N {
                timers.set_at(k, k, deadline(k));
                if k % 11 == 0 {
                    timers.remove(&k);
                    if Instant::now() >= deadline(k) {
                        late_removes.insert(k);
                    }
                }
            }
            drop(timers);
            late_removes
        });
        let mut seen = HashSet::new();
        within("stream end", async {
            while let Some(e) = expired.next().await {
                let k = *e.key();
                assert!(Instant::now() >= e.deadline(), "key {k} early");
                assert_eq!(e.deadline(), deadline(k));
                assert!(!e.is_shutdown());
                assert!(seen.insert(k), "key {k} twice");
            }
        })
        .await;
        let late_removes = producer.join().unwrap();
        let removed_fired: Vec<u32> = seen.iter().copied().filter(|k| k % 11 == 0).collect();
        for k in &removed_fired {
            assert!(
                late_removes.contains(k),
                "removed key {k} fired although its remove returned before its deadline"
            );
        }
        let kept = (0..N).filter(|k| k % 11 != 0).count();
        assert_eq!(seen.len(), kept + removed_fired.len());
    });
}

/// Drop the Expirations mid-bulk, then keep loading: nothing hangs or panics, authoritative
/// calls still answer exactly.
#[test]
fn drop_expirations_mid_bulk() {
    mt_runtime(2).block_on(async {
        let wheel = Wheel::builder().shards(2).build();
        let (timers, expired) = wheel.keyed::<u32, u32>();
        let start = Instant::now();
        let t = timers.clone();
        let producer = tokio::spawn(async move {
            for k in 0..40_000u32 {
                // half due at once (fire into a dropped stream), half an hour away
                let at = if k % 2 == 0 { start } else { start + HOUR };
                t.set_at(k, k, at);
            }
        });
        tokio::task::yield_now().await;
        drop(expired);
        within("producer", producer).await.unwrap();
        within("settle", async {
            loop {
                if timers.len().await == 20_000 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert_eq!(timers.take(&1).await, Some(1));
        assert_eq!(timers.take(&0).await, None);
        assert_eq!(timers.len().await, 19_999);
    });
}

/// Drop the runtime running the actors while a std thread is in a bulk load: the producer
/// finishes (its sends are refused once stopped, never hang), the stream — read without a
/// runtime — delivers each key set before the drop began exactly once, marked is_shutdown,
/// and ends.
#[test]
fn drop_runtime_mid_bulk() {
    let rt = mt_runtime(2);
    let wheel = rt.block_on(async { Wheel::builder().shards(2).build() });
    let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u32, u32>() });
    const N: u32 = 200_000;
    let (half_tx, half_rx) = std::sync::mpsc::channel::<u32>();
    let producer = std::thread::spawn(move || {
        for k in 0..N {
            timers.set(k, k, HOUR);
            if k % 4 == 0 {
                timers.remove(&k);
            }
            if k == 30_000 {
                half_tx.send(k).unwrap();
            }
        }
    });
    let made_before = half_rx.recv_timeout(GIVE_UP).expect("producer stalled");
    drop(rt);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        producer.join().unwrap();
        let _ = done_tx.send(());
    });
    done_rx
        .recv_timeout(GIVE_UP)
        .expect("producer hangs after its runtime went away");
    let (res_tx, res_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let out: Vec<_> = futures::executor::block_on(async {
            let mut out = Vec::new();
            while let Some(e) = expired.next().await {
                out.push((e.is_shutdown(), e.into_parts()));
            }
            out
        });
        let _ = res_tx.send(out);
    });
    let delivered = res_rx
        .recv_timeout(GIVE_UP)
        .expect("stream never ends after the runtime went away");
    let mut seen = HashSet::new();
    for (shutdown, (k, v)) in delivered {
        assert!(
            shutdown,
            "key {k} fired (an hour away) instead of a shutdown flush"
        );
        assert_eq!(k, v);
        assert!(
            k % 4 != 0 || k > made_before,
            "key {k} removed before the drop, yet delivered"
        );
        assert!(seen.insert(k), "key {k} delivered twice");
    }
    for k in 0..=made_before {
        if k % 4 != 0 {
            assert!(
                seen.contains(&k),
                "key {k} set before the runtime went away, not delivered"
            );
        }
    }
    drop(wheel);
}

/// Exactly-once per key with keys set from several tasks in bursts, deadlines due within a
/// few ms (real time), removes made right behind their sets and after the 512th command:
/// every set-and-not-removed key fires once, the removed ones never.
#[test]
fn removes_right_behind_sets_never_fire() {
    mt_runtime(2).block_on(async {
        let wheel = Wheel::builder().shards(3).build();
        let (timers, mut expired) = wheel.keyed::<u32, u32>();
        let start = Instant::now();
        let mut tasks = Vec::new();
        for t in 0..4u32 {
            let timers = timers.clone();
            tasks.push(tokio::spawn(async move {
                for k in 0..15_000u32 {
                    let key = t * 1_000_000 + k;
                    // Removed keys are due an hour away (a remove applied after its key's
                    // deadline may lose): a lost remove keeps the stream open (give-up).
                    if k % 2 == 0 {
                        timers.set_at(key, key, start + HOUR);
                        timers.remove(&key);
                    } else {
                        timers.set_at(
                            key,
                            key,
                            start + Duration::from_millis(30 + (k % 30) as u64),
                        );
                    }
                    if k % 1000 == 999 {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        for task in tasks {
            within("task", task).await.unwrap();
        }
        // The removed keys (an hour away) are gone: len counts only odd keys not yet fired.
        let pending = timers.len().await;
        assert!(
            pending <= 30_000,
            "len {pending}: removed keys still counted"
        );
        drop(timers);
        let fired = Arc::new(AtomicUsize::new(0));
        let mut seen = HashSet::new();
        within("stream", async {
            while let Some(e) = expired.next().await {
                let k = *e.key();
                assert!(k % 2 == 1, "removed key {k} fired");
                assert!(Instant::now() >= e.deadline());
                assert!(seen.insert(k), "key {k} twice");
                fired.fetch_add(1, Ordering::Relaxed);
            }
        })
        .await;
        assert_eq!(seen.len(), 4 * 7_500);
    });
}

/// Paused time, near deadlines: bursts (crossing 512) of set / reset earlier / reset later /
/// remove on keys due within 0..60 ms, made with no time passing, then time runs. Each entry
/// fires exactly once at its last deadline (never at a deadline a later command moved, never
/// early, at most a tick late); removed ones never.
#[test]
fn paused_near_deadlines_bursts_fire_at_final_deadline() {
    for shards in [1usize, 3] {
        ct_paused().block_on(async {
            let wheel = Wheel::builder().shards(shards).build();
            let (timers, mut expired) = wheel.keyed::<u32, u64>();
            let mut rng = Rng::new(500 + shards as u64);
            let mut op_id = 0u64;
            for round in 0..12u32 {
                let base = Instant::now();
                let mut model = Model::new();
                let len = [
                    511u64, 512, 513, 1023, 1024, 1025, 1535, 1537, 700, 2048, 515, 509,
                ][round as usize];
                for _ in 0..len {
                    op_id += 1;
                    let key = round * 100_000
                        + if rng.below(2) == 0 {
                            rng.below(10)
                        } else {
                            rng.below(3000)
                        } as u32;
                    let at = |rng: &mut Rng| base + Duration::from_millis(rng.below(60));
                    match rng.below(10) {
                        0..=4 => {
                            let d = at(&mut rng);
                            timers.set_at(key, op_id, d);
                            model.insert(key, (op_id, d));
                        }
                        5..=7 => {
                            let d = at(&mut rng);
                            timers.reset_at(&key, d);
                            if let Some(e) = model.get_mut(&key) {
                                e.1 = d;
                            }
                        }
                        _ => {
                            timers.remove(&key);
                            model.remove(&key);
                        }
                    }
                }
                assert_eq!(Instant::now(), base, "time moved during a burst");
                let mut seen = HashMap::new();
                while seen.len() < model.len() {
                    let e = tokio::time::timeout(Duration::from_secs(10), expired.next())
                        .await
                        .unwrap_or_else(|_| {
                            panic!(
                                "shards {shards} round {round}: {} of {} entries never fired",
                                model.len() - seen.len(),
                                model.len()
                            )
                        })
                        .unwrap();
                    let now = Instant::now();
                    let k = *e.key();
                    let want = model.get(&k).unwrap_or_else(|| {
                        panic!("shards {shards} round {round}: removed key {k} fired")
                    });
                    assert_eq!(
                        (*e.value(), e.deadline()),
                        *want,
                        "shards {shards} round {round}: key {k} (value, deadline)"
                    );
                    assert!(
                        now >= want.1,
                        "shards {shards} round {round}: key {k} early"
                    );
                    assert!(
                        now <= want.1 + Duration::from_millis(2),
                        "shards {shards} round {round}: key {k} fired {:?} late",
                        now - want.1
                    );
                    assert!(seen.insert(k, ()).is_none(), "key {k} twice");
                }
                // nothing else pending from this round
                assert_eq!(timers.len().await, 0, "shards {shards} round {round}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    }
}

/// Keyed handles in the bursts: insert, handle reset (earlier / later), handle remove, by-key
/// set / reset / remove, crossing 512. A handle acts only while its entry is the key's
/// current one. Then shutdown: the flush matches the model (value and deadline).
#[test]
fn model_bursts_with_handles() {
    for (workers, shards, seed) in [(2usize, 1usize, 61u64), (2, 3, 62), (0, 2, 63)] {
        let rt = if workers == 0 {
            ct()
        } else {
            mt_runtime(workers)
        };
        rt.block_on(async {
            let wheel = Wheel::builder().shards(shards).build();
            let (timers, mut expired) = wheel.keyed::<u32, u64>();
            let base = Instant::now() + HOUR;
            let mut rng = Rng::new(seed);
            // key -> (value, deadline, generation)
            let mut model: HashMap<u32, (u64, Instant, u64)> = HashMap::new();
            let mut handles: HashMap<u32, (tokio_wheel::KeyedTimer<u32, u64>, u64)> =
                HashMap::new();
            let mut op_id = 0u64;
            for burst in 0..50 {
                let len = 500 + rng.below(40);
                for _ in 0..len {
                    op_id += 1;
                    let key = if rng.below(2) == 0 {
                        rng.below(10)
                    } else {
                        rng.below(2000)
                    } as u32;
                    let d = base + Duration::from_millis(rng.below(3_600_000));
                    match rng.below(12) {
                        0..=2 => {
                            let h = timers.insert_at(key, op_id, d);
                            model.insert(key, (op_id, d, op_id));
                            handles.insert(key, (h, op_id));
                        }
                        3 | 4 => {
                            if let Some((h, generation)) = handles.get(&key) {
                                h.reset_at(d);
                                if let Some(e) = model.get_mut(&key) {
                                    if e.2 == *generation {
                                        e.1 = d;
                                    }
                                }
                            }
                        }
                        5 => {
                            if let Some((h, generation)) = handles.get(&key) {
                                h.remove();
                                if model.get(&key).is_some_and(|e| e.2 == *generation) {
                                    model.remove(&key);
                                }
                            }
                        }
                        6 | 7 => {
                            timers.set_at(key, op_id, d);
                            model.insert(key, (op_id, d, op_id));
                        }
                        8 | 9 => {
                            timers.reset_at(&key, d);
                            if let Some(e) = model.get_mut(&key) {
                                e.1 = d;
                            }
                        }
                        _ => {
                            timers.remove(&key);
                            model.remove(&key);
                        }
                    }
                }
                if burst % 3 == 0 {
                    let key = rng.below(10) as u32;
                    if let Some((h, generation)) = handles.get(&key) {
                        let got = h.take().await;
                        let want = if model.get(&key).is_some_and(|e| e.2 == *generation) {
                            model.remove(&key).map(|e| e.0)
                        } else {
                            None
                        };
                        assert_eq!(got, want, "seed {seed} burst {burst}: handle take({key})");
                    }
                } else {
                    assert_eq!(
                        timers.len().await,
                        model.len(),
                        "seed {seed} burst {burst}: len"
                    );
                }
            }
            let flat: Model = model.iter().map(|(k, e)| (*k, (e.0, e.1))).collect();
            wheel.shutdown().await;
            check_flush(
                &flat,
                read_all(&mut expired).await,
                &format!("handles seed {seed}"),
            );
        });
    }
}

/// A thread that runs the closures it is sent, one at a time, and says when each is done:
/// commands made there go to that thread's queue, and each returns before the driver sends
/// the next one anywhere (happens-before across threads, strictly sequenced).
struct Runner {
    jobs: std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>,
    done: std::sync::mpsc::Receiver<()>,
}

impl Runner {
    fn new() -> Runner {
        let (jobs, rx) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let (tx, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for job in rx {
                job();
                if tx.send(()).is_err() {
                    break;
                }
            }
        });
        Runner { jobs, done }
    }

    fn run(&self, job: impl FnOnce() + Send + 'static) {
        self.jobs.send(Box::new(job)).unwrap();
        self.done
            .recv_timeout(GIVE_UP)
            .expect("runner thread hangs");
    }
}

/// Commands on one key from different threads, each made after the previous returned:
/// - set (T1), set (T2), remove (T1): the remove applies after T2's set — absent;
/// - set 1h (T1), reset 3h (T2), reset 2h (T1): the last reset wins — 2h;
/// - set (T1), len made on T2 (polled once, not awaited), remove (T1): len counts the key.
///
/// Each of T1's second commands finds its own earlier set among its queue's last 8
/// commands (unless the actor took it): it may rewrite that set only if nothing on the key's
/// stripe was counted after it.
#[test]
fn ping_pong_across_threads_on_one_key() {
    for shards in [1usize, 2] {
        let rt = mt_runtime(2);
        let wheel = rt.block_on(async { Wheel::builder().shards(shards).build() });
        let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u32, u64>() });
        let base = rt.block_on(async { Instant::now() }) + HOUR;
        let runners: Vec<Runner> = (0..3).map(|_| Runner::new()).collect();
        let mut model = Model::new();
        let pairs = [(0usize, 1usize), (1, 2), (2, 0), (1, 0), (2, 1), (0, 2)];
        for round in 0..1800u32 {
            let (a, b) = pairs[round as usize % pairs.len()];
            let k = round;
            let v = round as u64 * 10;
            match round / 6 % 3 {
                0 => {
                    let t = timers.clone();
                    runners[a].run(move || t.set_at(k, v + 1, base));
                    let t = timers.clone();
                    runners[b].run(move || t.set_at(k, v + 2, base + HOUR));
                    let t = timers.clone();
                    runners[a].run(move || t.remove(&k));
                }
                1 => {
                    let t = timers.clone();
                    runners[a].run(move || t.set_at(k, v + 1, base));
                    let t = timers.clone();
                    runners[b].run(move || t.reset_at(&k, base + 2 * HOUR));
                    let t = timers.clone();
                    runners[a].run(move || t.reset_at(&k, base + HOUR));
                    model.insert(k, (v + 1, base + HOUR));
                }
                _ => {
                    let t = timers.clone();
                    runners[a].run(move || t.set_at(k, v + 1, base));
                    model.insert(k, (v + 1, base));
                    let want = model.len();
                    let t = timers.clone();
                    let (ftx, frx) = std::sync::mpsc::channel();
                    runners[b].run(move || {
                        let mut len = Box::pin(async move { t.len().await });
                        // made (queued) by this first poll, on this thread
                        let answered = match poll_once(&mut len) {
                            std::task::Poll::Ready(n) => Ok(n),
                            std::task::Poll::Pending => Err(len),
                        };
                        ftx.send(answered).unwrap();
                    });
                    let len = frx.recv().unwrap();
                    let t = timers.clone();
                    runners[a].run(move || t.remove(&k));
                    model.remove(&k);
                    let got = match len {
                        Ok(n) => n,
                        Err(len) => rt.block_on(async { within("len", len).await }),
                    };
                    assert_eq!(
                        got, want,
                        "shards {shards} round {round}: a len made before the remove (after the set) must count the key"
                    );
                }
            }
            if round % 300 == 299 {
                let got = rt.block_on(async { within("len", timers.len()).await });
                assert_eq!(got, model.len(), "shards {shards} round {round}: len");
            }
        }
        rt.block_on(async {
            wheel.shutdown().await;
            check_flush(
                &model,
                read_all(&mut expired).await,
                &format!("ping-pong shards {shards}"),
            );
        });
    }
}

fn poll_once<F: std::future::Future + Unpin>(f: &mut F) -> std::task::Poll<F::Output> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    std::pin::Pin::new(f).poll(&mut cx)
}
