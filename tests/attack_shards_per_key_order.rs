//! Per-key order across threads, shards, clones and KeyedTimer handles.
mod support;
use support::shards::*;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_wheel::{KeyedTimer, Timers, Wheel};

#[derive(Clone, Debug, PartialEq)]
struct Model {
    /// Current (value, deadline) of the key, if set.
    cur: Option<(u64, Instant)>,
    /// Id of the handle whose insert made the current entry (if any).
    handle_id: Option<u64>,
}

struct KeyState {
    model: Model,
    /// handles ever made for this key: (id, handle)
    handles: Vec<(u64, KeyedTimer<u64, u64>)>,
    next_val: u64,
}

/// Apply one random op on `key` through `timers` and check authoritative answers against the model.
#[allow(clippy::type_complexity)] // `block`: runs a `take` future from a plain thread
fn step(
    timers: &Timers<u64, u64>,
    key: u64,
    st: &mut KeyState,
    rng: &mut Rng,
    base: Instant,
    block: &dyn Fn(
        std::pin::Pin<Box<dyn std::future::Future<Output = Option<u64>> + Send + '_>>,
    ) -> Option<u64>,
) {
    let dl = |rng: &mut Rng| base + Duration::from_millis(10 * (1 + rng.below(10_000)));
    st.next_val += 1;
    let v = key * 1_000_000 + st.next_val;
    match rng.below(10) {
        0 | 1 => {
            let d = dl(rng);
            timers.set_at(key, v, d);
            st.model = Model {
                cur: Some((v, d)),
                handle_id: None,
            };
        }
        2 => {
            let d = dl(rng);
            timers.reset_at(&key, d);
            if let Some((val, _)) = st.model.cur {
                st.model.cur = Some((val, d));
            }
        }
        3 => {
            timers.remove(&key);
            st.model = Model {
                cur: None,
                handle_id: None,
            };
        }
        4 => {
            let got = block(Box::pin(timers.take(&key)));
            let want = st.model.cur.map(|(v, _)| v);
            assert_eq!(
                got, want,
                "Timers::take(&{key}) disagrees with the per-key model"
            );
            st.model = Model {
                cur: None,
                handle_id: None,
            };
        }
        5 | 6 => {
            let d = dl(rng);
            let h = timers.insert_at(key, v, d);
            let id = st.next_val;
            st.handles.push((id, h));
            st.model = Model {
                cur: Some((v, d)),
                handle_id: Some(id),
            };
        }
        7..=9 => {
            // act through a random handle of this key (current or stale)
            if st.handles.is_empty() {
                return;
            }
            let i = rng.below(st.handles.len() as u64) as usize;
            let (id, h) = &st.handles[i];
            let live = st.model.handle_id == Some(*id);
            match rng.below(4) {
                0 | 1 => {
                    let d = dl(rng);
                    h.reset_at(d);
                    if live {
                        let (val, _) = st.model.cur.unwrap();
                        st.model.cur = Some((val, d));
                    }
                }
                2 => {
                    h.remove();
                    if live {
                        st.model = Model {
                            cur: None,
                            handle_id: None,
                        };
                    }
                }
                _ => {
                    let got = block(Box::pin(h.take()));
                    let want = if live {
                        st.model.cur.map(|(v, _)| v)
                    } else {
                        None
                    };
                    assert_eq!(
                        got, want,
                        "KeyedTimer::take on key {key} (handle live={live}) disagrees with the model"
                    );
                    if live {
                        st.model = Model {
                            cur: None,
                            handle_id: None,
                        };
                    }
                }
            }
        }
        _ => unreachable!(),
    }
    if rng.below(50) == 0 {
        // forget old stale handles sometimes
        let keep = st.model.handle_id;
        st.handles
            .retain(|(id, _)| Some(*id) == keep || *id % 3 == 0);
    }
}

/// Check final state through a shutdown flush: every set key delivered once, with its value and deadline.
async fn check_final(
    wheel: Wheel,
    timers: Timers<u64, u64>,
    mut expired: tokio_wheel::Expirations<u64, u64>,
    models: HashMap<u64, Model>,
) {
    let expected_len = models.values().filter(|m| m.cur.is_some()).count();
    assert_eq!(
        timers.len().await,
        expected_len,
        "len() after all producers joined"
    );
    wheel.shutdown().await;
    let mut seen = HashMap::new();
    while let Some(e) = tokio::time::timeout(GUARD, expired.next())
        .await
        .expect("stream hung after shutdown")
    {
        assert!(
            e.is_shutdown(),
            "entry {:?} fired though deadlines are an hour away",
            e.key()
        );
        let k = *e.key();
        let d = e.deadline();
        let v = *e.value();
        assert!(
            seen.insert(k, (v, d)).is_none(),
            "key {k} delivered twice by the shutdown flush"
        );
    }
    for (k, m) in &models {
        match (m.cur, seen.get(k)) {
            (None, None) => {}
            (Some((v, d)), Some((gv, gd))) => {
                assert_eq!(
                    *gv, v,
                    "key {k}: flushed value differs from the last command's value"
                );
                assert!(
                    close(*gd, d),
                    "key {k}: flushed deadline {gd:?} != expected {d:?}"
                );
            }
            (want, got) => panic!("key {k}: expected {want:?}, flushed {got:?}"),
        }
    }
    assert_eq!(seen.len(), expected_len);
}

#[test]
fn per_key_order_random_ops_threads_handles_shards8() {
    let rt = mt_runtime(2);
    let wheel = rt.block_on(async { Wheel::builder().shards(8).build() });
    let (timers, expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
    assert_eq!(timers.shards(), 8);
    let base = Instant::now() + Duration::from_secs(3600);
    let models = Arc::new(Mutex::new(HashMap::new()));
    let mut threads = Vec::new();
    for t in 0..4u64 {
        let timers = timers.clone();
        let models = models.clone();
        let handle = rt.handle().clone();
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng::new(t + 17);
            let mut states: HashMap<u64, KeyState> = HashMap::new();
            let keys: Vec<u64> = (0..96).map(|i| t * 1000 + i).collect();
            for _ in 0..6000 {
                let k = keys[rng.below(keys.len() as u64) as usize];
                let st = states.entry(k).or_insert_with(|| KeyState {
                    model: Model {
                        cur: None,
                        handle_id: None,
                    },
                    handles: vec![],
                    next_val: 0,
                });
                if t % 2 == 0 {
                    step(&timers, k, st, &mut rng, base, &|f| {
                        futures::executor::block_on(f)
                    });
                } else {
                    step(&timers, k, st, &mut rng, base, &|f| handle.block_on(f));
                }
            }
            let mut m = models.lock().unwrap();
            for (k, st) in states {
                m.insert(k, st.model);
            }
        }));
    }
    for th in threads {
        th.join().unwrap();
    }
    let models = Arc::try_unwrap(models).unwrap().into_inner().unwrap();
    rt.block_on(async move {
        tokio::time::timeout(GUARD, check_final(wheel, timers, expired, models))
            .await
            .expect("hang");
    });
}

/// Ops on one key are passed from thread to thread (token ring): each op is made after the
/// previous one returned, on another thread and through another Timers clone.
#[test]
fn per_key_order_token_ring_across_threads_shards5() {
    let rt = mt_runtime(2);
    let wheel = rt.block_on(async { Wheel::builder().shards(5).build() });
    let (timers, expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
    let base = Instant::now() + Duration::from_secs(3600);
    const THREADS: usize = 3;
    const KEYS: u64 = 300;
    const STEPS: u32 = 60;
    type Msg = (u64, u32, KeyState, Rng);
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS)
        .map(|_| std::sync::mpsc::channel::<Option<Msg>>())
        .unzip();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<(u64, Model)>();
    let mut threads = Vec::new();
    for (i, rx) in rxs.into_iter().enumerate() {
        let next = txs[(i + 1) % THREADS].clone();
        let timers = timers.clone();
        let done_tx = done_tx.clone();
        let handle = rt.handle().clone();
        threads.push(std::thread::spawn(move || {
            while let Ok(Some((k, n, mut st, mut rng))) = rx.recv() {
                if i == 0 {
                    step(&timers, k, &mut st, &mut rng, base, &|f| {
                        futures::executor::block_on(f)
                    });
                } else {
                    step(&timers, k, &mut st, &mut rng, base, &|f| handle.block_on(f));
                }
                if n + 1 == STEPS {
                    done_tx.send((k, st.model.clone())).unwrap();
                } else {
                    let _ = next.send(Some((k, n + 1, st, rng)));
                }
            }
        }));
    }
    drop(done_tx);
    for k in 0..KEYS {
        let st = KeyState {
            model: Model {
                cur: None,
                handle_id: None,
            },
            handles: vec![],
            next_val: 0,
        };
        txs[(k as usize) % THREADS]
            .send(Some((k, 0, st, Rng::new(k + 1))))
            .unwrap();
    }
    let mut models = HashMap::new();
    for _ in 0..KEYS {
        let (k, m) = done_rx.recv_timeout(GUARD).expect("ring hung");
        models.insert(k, m);
    }
    for tx in &txs {
        tx.send(None).unwrap();
    }
    drop(txs);
    for th in threads {
        th.join().unwrap();
    }
    rt.block_on(async move {
        tokio::time::timeout(GUARD, check_final(wheel, timers, expired, models))
            .await
            .expect("hang");
    });
}
