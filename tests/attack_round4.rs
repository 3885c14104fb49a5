//! Outside attacks, round 4, on API.md §3 (keyed timers at scale: the key index, replace and
//! remove churn, colliding hashes) written from the contract and the public rustdoc only.
//! Moving timers earlier (API.md §1 and §3) is in `attack_round4_moves.rs`. Every attack that
//! holds is kept as a regression test, named by the behaviour; a broken promise is kept as
//! `#[ignore = "finding: …"]` until fixed (both of this round's findings are fixed and run).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_wheel::{Expirations, KeyedTimer, Timers, Wheel};

#[path = "support/attack.rs"]
mod attack;
use attack::{ms, poll_once, secs, settle};

#[path = "support/rng.rs"]
#[allow(dead_code)]
mod rng;
use rng::Rng;

fn full() -> bool {
    std::env::var_os("TOKIO_WHEEL_FULL").is_some()
}

/// How late past its deadline an entry may still be undelivered once the actor has caught up:
/// one tick (the default 1 ms), plus one for a deadline that falls inside a tick.
const LATE: Duration = Duration::from_millis(2);

// ───────────────────────────── key types ─────────────────────────────

/// A key whose every value hashes alike: every key collides in the index.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Collide(u64);

impl Hash for Collide {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(0x5eed);
    }
}

/// A key with only three distinct hashes: long runs of collisions, interleaved.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Few(u64);

impl Hash for Few {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0 % 3);
    }
}

// ───────────────────────────── the model ─────────────────────────────

#[derive(Clone, Copy, Debug)]
struct Entry {
    value: u64,
    deadline: Instant,
    /// Which `set`/`insert` made it: a handle acts only on its own generation.
    generation: u64,
}

/// The keyed set under test, its expected contents, and the handles made so far (live or
/// stale).
struct Harness<K: Ord> {
    timers: Timers<K, u64>,
    expired: Expirations<K, u64>,
    model: BTreeMap<K, Entry>,
    handles: Vec<(u64, KeyedTimer<K, u64>)>,
    next_value: u64,
    next_generation: u64,
    delivered: u64,
    collects: u64,
}

impl<K> Harness<K>
where
    K: Ord + Hash + Eq + Clone + Debug + Send + Sync + 'static,
{
    fn new(wheel: &Wheel) -> Self {
        let (timers, expired) = wheel.keyed::<K, u64>();
        Harness {
            timers,
            expired,
            model: BTreeMap::new(),
            handles: Vec::new(),
            next_value: 0,
            next_generation: 0,
            delivered: 0,
            collects: 0,
        }
    }

    /// Whether `key`'s entry may have fired already (its deadline has passed but it was not
    /// seen yet): calls on it then have two right answers, so the sequence avoids them.
    fn in_doubt(&self, key: &K) -> bool {
        self.model
            .get(key)
            .is_some_and(|e| e.deadline <= Instant::now())
    }

    fn fresh(&mut self, deadline: Instant) -> Entry {
        self.next_value += 1;
        self.next_generation += 1;
        Entry {
            value: self.next_value,
            deadline,
            generation: self.next_generation,
        }
    }

    fn set(&mut self, key: K, deadline: Instant) {
        let entry = self.fresh(deadline);
        self.timers.set_at(key.clone(), entry.value, deadline);
        self.model.insert(key, entry);
    }

    fn insert(&mut self, key: K, deadline: Instant) {
        let entry = self.fresh(deadline);
        let handle = self.timers.insert_at(key.clone(), entry.value, deadline);
        self.model.insert(key, entry);
        if self.handles.len() < 256 {
            self.handles.push((entry.generation, handle));
        } else {
            let at = (entry.generation as usize * 7919) % self.handles.len();
            self.handles[at] = (entry.generation, handle);
        }
    }

    /// Whether handle `at` is the live handle of its key's entry.
    fn handle_live(&self, at: usize) -> bool {
        let (generation, handle) = &self.handles[at];
        self.model
            .get(handle.key())
            .is_some_and(|e| e.generation == *generation)
    }

    /// Lets the actor catch up, reads every expiration it has sent, and checks them against
    /// the model: each is the live entry's key, value and deadline (so exactly once), never
    /// early; and nothing more than [`LATE`] overdue is left undelivered.
    async fn collect(&mut self) {
        let now = Instant::now();
        let mut quiet_rounds = 0;
        let mut rounds = 0;
        while quiet_rounds < 3 {
            rounds += 1;
            settle().await;
            let _ = self.timers.len().await;
            settle().await;
            if self.take_expired(now) == 0 {
                quiet_rounds += 1;
            } else {
                quiet_rounds = 0;
            }
        }
        if rounds > 4 {
            eprintln!("collect took {rounds} rounds");
        }
        // The full scan costs O(keys): with a big model, it runs on every 64th call only.
        self.collects += 1;
        if self.model.len() > 5_000 && self.collects % 64 != 0 {
            return;
        }
        if let Some((key, e)) = self.model.iter().find(|(_, e)| e.deadline + LATE <= now) {
            panic!(
                "{key:?} not delivered {:?} after its deadline",
                now - e.deadline
            );
        }
    }

    /// Reads every expiration ready now; returns how many.
    fn take_expired(&mut self, now: Instant) -> u64 {
        assert_eq!(now, Instant::now(), "time moved while collecting");
        let mut n = 0;
        while let Poll::Ready(next) = poll_once(&mut self.expired.next()) {
            let e = next.expect("the stream ended while timers were alive");
            assert!(!e.is_shutdown());
            assert!(e.deadline() <= now, "fired early: {:?}", e.key());
            let entry = self.model.remove(e.key()).unwrap_or_else(|| {
                panic!("{:?} (value {}) delivered but not set", e.key(), e.value())
            });
            assert_eq!(
                (*e.value(), e.deadline()),
                (entry.value, entry.deadline),
                "{:?}: wrong value or deadline delivered",
                e.key()
            );
            self.delivered += 1;
            n += 1;
        }
        n
    }

    /// `len()` and the handles' views, once no entry is in doubt.
    async fn check_len(&mut self) {
        let now = Instant::now();
        if self.model.values().any(|e| e.deadline <= now) {
            return;
        }
        assert_eq!(self.timers.len().await, self.model.len(), "len()");
        for at in 0..self.handles.len() {
            let live = self.handle_live(at);
            let handle = &self.handles[at].1;
            assert_eq!(
                handle.is_stale(),
                !live,
                "is_stale() of {:?}'s handle",
                handle.key()
            );
            if live {
                assert_eq!(handle.deadline(), self.model[handle.key()].deadline);
            }
        }
    }
}

/// A deadline from 1 ms to hours ahead: most short (within a few slots), some across the
/// seconds and minutes levels, a few hours out.
fn deadline(rng: &mut Rng) -> Instant {
    let now = Instant::now();
    let micros = match rng.below(20) {
        0..=11 => 1_000 + rng.below(50_000),
        12..=16 => 50_000 + rng.below(60_000_000),
        _ => 60_000_000 + rng.below(4 * 3_600_000_000),
    };
    // Whole milliseconds mostly, some inside a tick.
    let micros = if rng.below(4) == 0 {
        micros
    } else {
        micros / 1_000 * 1_000
    };
    now + Duration::from_micros(micros)
}

/// A deadline strictly between now and `current` (earlier than it), when there is one.
fn earlier(rng: &mut Rng, current: Instant) -> Option<Instant> {
    let now = Instant::now();
    let room = current.checked_duration_since(now)?.as_micros() as u64;
    if room <= 1_000 {
        return None;
    }
    let step = match rng.below(3) {
        0 => 1 + rng.below(room.min(1_000) - 1), // within a slot
        _ => 1 + rng.below(room - 1_000),        // across slots and levels
    };
    Some(current - Duration::from_micros(step))
}

/// Random keyed operations on `keys` keys against a `BTreeMap` model, time advancing between
/// them, then everything left fires: each expiration checked (key, value, deadline, once,
/// never early, at most a tick late), `len()`, `take` and the handles' views checked on the way.
async fn random_ops_match_the_model<K>(make: fn(u64) -> K, keys: u64, ops: u64, seed: u64)
where
    K: Ord + Hash + Eq + Clone + Debug + Send + Sync + 'static,
{
    let wheel = Wheel::new();
    let mut h = Harness::<K>::new(&wheel);
    let mut rng = Rng(seed);
    // Start with most keys set, so the index holds thousands of entries at once.
    for k in 0..keys {
        if rng.below(4) != 0 {
            let d = deadline(&mut rng);
            h.set(make(k), d);
        }
    }
    for op in 0..ops {
        let key = make(rng.below(keys));
        let doubt = h.in_doubt(&key);
        match rng.below(100) {
            0..=19 => {
                let d = deadline(&mut rng);
                h.set(key, d)
            }
            20..=29 => {
                let d = deadline(&mut rng);
                h.insert(key, d)
            }
            30..=39 if !doubt => {
                let d = deadline(&mut rng);
                h.timers.reset_at(&key, d);
                if let Some(e) = h.model.get_mut(&key) {
                    e.deadline = d;
                }
            }
            40..=49 if !doubt => {
                if let Some(current) = h.model.get(&key).map(|e| e.deadline) {
                    if let Some(d) = earlier(&mut rng, current) {
                        h.timers.reset_at(&key, d);
                        h.model.get_mut(&key).unwrap().deadline = d;
                    }
                } else {
                    // Absent: a no-op.
                    h.timers.reset(&key, ms(5));
                }
            }
            50..=59 if !h.handles.is_empty() => {
                let at = rng.below(h.handles.len() as u64) as usize;
                let hkey = h.handles[at].1.key().clone();
                if h.in_doubt(&hkey) {
                    continue;
                }
                let live = h.handle_live(at);
                let current = h.model.get(&hkey).map(|e| e.deadline);
                let d = match (rng.below(2), current) {
                    (0, Some(current)) => earlier(&mut rng, current),
                    _ => Some(deadline(&mut rng)),
                };
                if let Some(d) = d {
                    h.handles[at].1.reset_at(d);
                    if live {
                        h.model.get_mut(&hkey).unwrap().deadline = d;
                    }
                }
            }
            60..=65 if !doubt => {
                h.timers.remove(&key);
                h.model.remove(&key);
            }
            66..=71 if !doubt => {
                let got = h.timers.take(&key).await;
                let want = h.model.remove(&key).map(|e| e.value);
                assert_eq!(got, want, "take({key:?})");
            }
            72..=77 if !h.handles.is_empty() => {
                let at = rng.below(h.handles.len() as u64) as usize;
                let hkey = h.handles[at].1.key().clone();
                if h.in_doubt(&hkey) {
                    continue;
                }
                let live = h.handle_live(at);
                let want = live.then(|| h.model.remove(&hkey).unwrap().value);
                if rng.below(2) == 0 {
                    assert_eq!(h.handles[at].1.take().await, want, "handle take({hkey:?})");
                } else {
                    h.handles[at].1.remove();
                }
            }
            78..=79 => h.check_len().await,
            80 if rng.below(20) == 0 && !h.model.values().any(|e| e.deadline <= Instant::now()) => {
                let mut got = h.timers.drain().await;
                got.sort();
                let want: Vec<(K, u64)> = std::mem::take(&mut h.model)
                    .into_iter()
                    .map(|(k, e)| (k, e.value))
                    .collect();
                assert_eq!(got, want, "drain()");
            }
            81..=99 => {
                let step = match rng.below(20) {
                    0..=13 => rng.below(3_000),
                    14..=18 => rng.below(200_000),
                    _ => rng.below(1_800_000_000),
                };
                tokio::time::advance(Duration::from_micros(step)).await;
                h.collect().await;
            }
            _ => {}
        }
        if op % 1_000 == 999 {
            h.collect().await;
            h.check_len().await;
        }
    }
    // Everything left fires, within five hours.
    for _ in 0..5 * 60 {
        tokio::time::advance(secs(60)).await;
        h.collect().await;
    }
    assert!(h.model.is_empty(), "never delivered: {:?}", h.model);
    assert_eq!(h.timers.len().await, 0);
    assert!(h.handles.iter().all(|(_, t)| t.is_stale()));
    assert!(h.delivered > 0);
    // Stats' ledger balances (its documented identity), and counts every delivery.
    let stats = wheel.stats();
    assert_eq!(
        stats.inserted,
        stats.fired + stats.cancelled + stats.pending,
        "{stats:?}"
    );
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(stats.fired, h.delivered, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn random_ops_on_u64_keys_match_a_model() {
    let (keys, ops) = if full() {
        (100_000, 300_000)
    } else {
        (3_000, 40_000)
    };
    random_ops_match_the_model(|k| k, keys, ops, 0x9e37_79b9_7f4a_7c15).await;
}

#[tokio::test(start_paused = true)]
async fn random_ops_on_string_keys_match_a_model() {
    let (keys, ops) = if full() {
        (50_000, 200_000)
    } else {
        (2_000, 20_000)
    };
    random_ops_match_the_model(|k| format!("conn-{k}"), keys, ops, 0x1234_5678_9abc).await;
}

#[tokio::test(start_paused = true)]
async fn random_ops_on_tuple_keys_match_a_model() {
    let (keys, ops) = if full() {
        (50_000, 200_000)
    } else {
        (2_000, 20_000)
    };
    random_ops_match_the_model(
        |k| ((k % 7) as u32, format!("{}", k / 7)),
        keys,
        ops,
        0xdead_beef,
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn random_ops_with_every_key_colliding_match_a_model() {
    random_ops_match_the_model(Collide, 2_000, 20_000, 0x0c01_11de).await;
}

#[tokio::test(start_paused = true)]
async fn random_ops_with_three_distinct_hashes_match_a_model() {
    random_ops_match_the_model(Few, 2_000, 20_000, 0xfe3).await;
}

/// A key whose hash has 61 distinct values: clusters all around the index, some wrapping
/// past its end.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Clustered(u64);

impl Hash for Clustered {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0 % 61);
    }
}

/// A far deadline (1 to 3 hours): nothing fires while the index grows and shrinks.
fn far(rng: &mut Rng) -> Instant {
    Instant::now() + secs(3_600) + Duration::from_millis(rng.below(7_200_000))
}

/// The index grown key by key while older keys are taken, removed, moved and replaced
/// between insertions (so lookups and removals meet every stage of a resize), then shrunk by
/// removing most keys, with lookups after idle pauses of several lengths (so they meet the
/// shrink, whenever it happens); everything left then fires as set.
async fn growth_and_shrink_interleaved_with_lookups<K>(make: fn(u64) -> K, keys: u64, seed: u64)
where
    K: Ord + Hash + Eq + Clone + Debug + Send + Sync + 'static,
{
    let wheel = Wheel::new();
    let mut h = Harness::<K>::new(&wheel);
    let mut rng = Rng(seed);
    for i in 0..keys {
        let d = far(&mut rng);
        h.set(make(i), d);
        let other = make(rng.below(i + 1));
        match rng.below(8) {
            0 => {
                let got = h.timers.take(&other).await;
                assert_eq!(got, h.model.remove(&other).map(|e| e.value), "take");
            }
            1 => {
                h.timers.remove(&other);
                h.model.remove(&other);
            }
            2 => {
                let d = far(&mut rng);
                h.timers.reset_at(&other, d);
                if let Some(e) = h.model.get_mut(&other) {
                    e.deadline = d;
                }
            }
            3 => {
                let d = far(&mut rng);
                h.insert(other, d);
            }
            _ => {}
        }
        if i % 512 == 511 {
            h.check_len().await;
        }
    }
    h.check_len().await;
    // Shrink: all but about one key in 16 removed, with takes among the removals.
    for i in 0..keys {
        if i % 16 != 0 {
            let key = make(i);
            if i % 5 == 0 {
                let got = h.timers.take(&key).await;
                assert_eq!(got, h.model.remove(&key).map(|e| e.value), "take");
            } else {
                h.timers.remove(&key);
                h.model.remove(&key);
            }
        }
    }
    h.check_len().await;
    for pause in [0, 1, 10, 100, 1_000, 10_000, 60_000] {
        tokio::time::advance(ms(pause)).await;
        settle().await;
        for _ in 0..keys / 64 {
            let key = make(rng.below(keys));
            match rng.below(4) {
                0 => {
                    let got = h.timers.take(&key).await;
                    assert_eq!(got, h.model.remove(&key).map(|e| e.value), "take");
                }
                1 => {
                    let d = far(&mut rng);
                    h.set(key, d);
                }
                2 => {
                    let d = far(&mut rng);
                    h.timers.reset_at(&key, d);
                    if let Some(e) = h.model.get_mut(&key) {
                        e.deadline = d;
                    }
                }
                _ => {
                    h.timers.remove(&key);
                    h.model.remove(&key);
                }
            }
        }
        h.check_len().await;
    }
    for _ in 0..4 * 60 {
        tokio::time::advance(secs(60)).await;
        h.collect().await;
    }
    assert!(h.model.is_empty(), "never delivered: {:?}", h.model);
    assert_eq!(h.timers.len().await, 0);
}

#[tokio::test(start_paused = true)]
async fn index_growth_and_shrink_keep_u64_keys_findable() {
    let keys = if full() { 200_000 } else { 20_000 };
    growth_and_shrink_interleaved_with_lookups(|k| k, keys, 0xabc).await;
}

#[tokio::test(start_paused = true)]
async fn index_growth_and_shrink_keep_clustered_keys_findable() {
    let keys = if full() { 20_000 } else { 4_000 };
    growth_and_shrink_interleaved_with_lookups(Clustered, keys, 0x61).await;
}

#[tokio::test(start_paused = true)]
async fn index_growth_and_shrink_keep_colliding_keys_findable() {
    growth_and_shrink_interleaved_with_lookups(Collide, 2_000, 0xc0).await;
}

#[tokio::test(start_paused = true)]
async fn random_ops_with_clustered_hashes_match_a_model() {
    random_ops_match_the_model(Clustered, 3_000, 20_000, 0x6161).await;
}
