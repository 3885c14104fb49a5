//! Outside attacks, round 4, on the keyed set's index at scale (API.md §3): churn on one key,
//! replace-heavy loads, removal patterns, and the survivors of a flood after the wheel went
//! idle. Written from the contract and the public rustdoc only; see `attack_round4.rs`.

use std::collections::BTreeMap;
use std::hash::Hash;
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_wheel::{Expirations, Timers, Wheel};

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

/// How late past its deadline an entry may fire in paused time: one tick (the default 1 ms),
/// plus one for a deadline that falls inside a tick.
const LATE: Duration = Duration::from_millis(2);

// ───────────────────────────── churn, removal patterns, floods ─────────────────────────────

/// Reads every expiration until `until`, letting paused time run there; returns them as
/// `(key, value, deadline, seen at)`.
async fn expire_until<K>(
    timers: &Timers<K, u64>,
    expired: &mut Expirations<K, u64>,
    until: Instant,
) -> Vec<(K, u64, Instant, Instant)>
where
    K: Eq + Hash + Clone + Send + 'static,
{
    let mut seen = Vec::new();
    loop {
        tokio::select! {
            biased;
            e = expired.next() => {
                let e = e.expect("stream ended");
                let (deadline, now) = (e.deadline(), Instant::now());
                let (k, v) = e.into_parts();
                seen.push((k, v, deadline, now));
            }
            _ = tokio::time::sleep_until(until) => break,
        }
    }
    let _ = timers.len().await;
    settle().await;
    while let Poll::Ready(Some(e)) = poll_once(&mut expired.next()) {
        let (deadline, now) = (e.deadline(), Instant::now());
        let (k, v) = e.into_parts();
        seen.push((k, v, deadline, now));
    }
    seen
}

/// One key set, removed and set again many times (with `len()` and `take` in between): the
/// index never keeps a second entry or a tombstone that a later lookup trips on; only the
/// last value fires, once, at its deadline.
#[tokio::test(start_paused = true)]
async fn churn_on_one_key_leaves_exactly_the_last_entry() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u64, u64>();
    let t0 = Instant::now();
    let rounds = if full() { 200_000 } else { 20_000 };
    // Neighbours that stay set throughout, so the key's probe run has company.
    for k in 1..64u64 {
        timers.set(k, k, secs(7_200));
    }
    for i in 0..rounds {
        timers.set(0, i, ms(10 + i % 50));
        timers.remove(&0);
        timers.set(0, i, ms(100 + i % 50));
        if i % 1_000 == 0 {
            assert_eq!(timers.len().await, 64, "round {i}");
            assert_eq!(timers.take(&0).await, Some(i));
            assert_eq!(timers.take(&0).await, None);
            timers.set(0, i, ms(100 + i % 50));
        }
    }
    assert_eq!(timers.len().await, 64);
    let last = rounds - 1;
    let deadline = t0 + ms(100 + last % 50);
    let seen = expire_until(&timers, &mut expired, t0 + secs(3_600)).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    let (k, v, d, at) = seen[0];
    assert_eq!((k, v, d), (0, last, deadline));
    assert!(
        at >= deadline && at - deadline <= LATE,
        "fired at {:?}",
        at - t0
    );
    assert_eq!(timers.len().await, 63);
}

/// Replace-heavy load: every key replaced many times with later and earlier deadlines; each
/// fires once, with its last value and deadline.
#[tokio::test(start_paused = true)]
async fn replacing_keys_many_times_fires_each_once_with_its_last_value() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u64, u64>();
    let t0 = Instant::now();
    let (keys, times) = if full() {
        (100_000u64, 20u64)
    } else {
        (5_000, 10)
    };
    let mut rng = Rng(77);
    let mut want = BTreeMap::new();
    for round in 0..times {
        for k in 0..keys {
            let d = ms(1 + rng.below(20_000));
            timers.set(k, round * keys + k, d);
            want.insert(k, (round * keys + k, t0 + d));
        }
        assert_eq!(timers.len().await, keys as usize);
    }
    let seen = expire_until(&timers, &mut expired, t0 + secs(30)).await;
    assert_eq!(seen.len(), keys as usize);
    for (k, v, d, at) in seen {
        let (wv, wd) = want.remove(&k).expect("fired twice");
        assert_eq!((v, d), (wv, wd), "key {k}");
        assert!(
            at >= d && at - d <= LATE,
            "key {k} fired {:?} after",
            at - d
        );
    }
    assert_eq!(timers.len().await, 0);
}

/// Every other key removed (each removal shifts entries back in the index), then every key
/// looked up: the survivors are all found by `reset`, `take` and the expirations, the removed
/// ones by none of them.
#[tokio::test(start_paused = true)]
async fn removing_every_other_key_keeps_the_rest_findable() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u64, u64>();
    let t0 = Instant::now();
    let keys = if full() { 100_000u64 } else { 20_000 };
    for k in 0..keys {
        timers.set(k, k, secs(3_600));
    }
    for k in (0..keys).step_by(2) {
        timers.remove(&k);
    }
    assert_eq!(timers.len().await, keys as usize / 2);
    // Odd keys: a quarter taken, the rest moved earlier by key (to 1..=1000 ms).
    let mut taken = 0;
    for k in (1..keys).step_by(2) {
        if k % 4 == 1 {
            assert_eq!(timers.take(&k).await, Some(k), "take({k})");
            taken += 1;
        } else {
            timers.reset(&k, ms(1 + k % 1_000));
        }
    }
    // Removed keys: nothing to find.
    for k in (0..keys).step_by(2) {
        timers.reset(&k, ms(1));
        if k % 64 == 0 {
            assert_eq!(timers.take(&k).await, None, "take({k}) after remove");
        }
    }
    assert_eq!(timers.len().await, keys as usize / 2 - taken);
    let seen = expire_until(&timers, &mut expired, t0 + secs(2)).await;
    assert_eq!(seen.len(), keys as usize / 2 - taken);
    let mut fired = std::collections::BTreeSet::new();
    for (k, v, d, at) in seen {
        assert_eq!(k, v);
        assert!(k % 4 == 3, "key {k} fired");
        assert_eq!(d, t0 + ms(1 + k % 1_000));
        assert!(
            at >= d && at - d <= LATE,
            "key {k} fired {:?} after",
            at - d
        );
        assert!(fired.insert(k), "key {k} fired twice");
    }
    assert_eq!(timers.len().await, 0);
    quiet_after(&mut expired, secs(7_200)).await;
}

/// Nothing more expires over `d` of paused time.
async fn quiet_after<K, V>(expired: &mut Expirations<K, V>, d: Duration) {
    tokio::select! {
        e = expired.next() => panic!("an expiration came: {:?}", e.map(|e| e.deadline())),
        _ = tokio::time::sleep(d) => {}
    }
}

/// A flood of keys, most removed, the wheel left idle long enough to give memory back (so
/// the index shrinks around the survivors), then the survivors moved (later by handle,
/// earlier by key), some taken and some replaced: each found and fired correctly.
#[tokio::test(start_paused = true)]
async fn survivors_of_a_flood_are_found_after_the_index_shrinks() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u64, u64>();
    let keys = if full() { 1_000_000u64 } else { 100_000 };
    let mut handles = Vec::new();
    for k in 0..keys {
        if k % 997 == 0 {
            handles.push(timers.insert(k, k, secs(3_600)));
        } else {
            timers.set(k, k, secs(3_600));
        }
    }
    for k in 0..keys {
        if k % 997 != 0 {
            timers.remove(&k);
        }
    }
    let survivors = handles.len();
    assert_eq!(timers.len().await, survivors);
    // Idle for a while: nothing due, no command.
    quiet_after(&mut expired, secs(60)).await;
    // Real time too, in case giving memory back waits on it.
    tokio::task::spawn_blocking(|| std::thread::sleep(ms(300)))
        .await
        .unwrap();
    settle().await;
    assert_eq!(timers.len().await, survivors);
    let t1 = Instant::now();
    let mut want = BTreeMap::new();
    for (i, h) in handles.iter().enumerate() {
        let k = *h.key();
        match i % 4 {
            0 => {
                assert_eq!(timers.take(&k).await, Some(k), "take({k})");
                assert!(h.take().await.is_none());
            }
            1 => {
                h.reset(secs(7_200)); // later, by the handle
                want.insert(k, (k, t1 + secs(7_200)));
            }
            2 => {
                timers.reset(&k, ms(1 + i as u64)); // earlier, by key
                want.insert(k, (k, t1 + ms(1 + i as u64)));
            }
            _ => {
                timers.set(k, k + 1, ms(500 + i as u64)); // replaced
                h.reset(ms(1)); // stale: nothing
                want.insert(k, (k + 1, t1 + ms(500 + i as u64)));
            }
        }
    }
    // Removed keys stay gone.
    for k in (1..keys).step_by(101) {
        if k % 997 != 0 {
            assert_eq!(timers.take(&k).await, None, "take({k})");
        }
    }
    assert_eq!(timers.len().await, want.len());
    let seen = expire_until(&timers, &mut expired, t1 + secs(7_300)).await;
    assert_eq!(seen.len(), want.len());
    for (k, v, d, at) in seen {
        let (wv, wd) = want.remove(&k).expect("fired twice or not set");
        assert_eq!((v, d), (wv, wd), "key {k}");
        assert!(
            at >= d && at - d <= LATE,
            "key {k} fired {:?} after",
            at - d
        );
    }
    assert_eq!(timers.len().await, 0);
}

/// Eight tasks on two workers, each with its own `Timers` clone and its own keys, grow and
/// shrink one index at once (set, replace, remove, take, move by key and by handle; nothing
/// due meanwhile): `take` answers as each task's model says, `len()` matches the sum, and once
/// everything is moved to a few milliseconds ahead, each live entry fires once with its last
/// value, never early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_owners_growing_and_shrinking_one_index_agree_with_their_models() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u64, u64>();
    let per_task = if full() { 50_000u64 } else { 5_000 };
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let timers = timers.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(t + 11);
            let mut model = BTreeMap::new();
            let mut handles = Vec::new();
            let base = t * per_task * 2;
            for round in 0..3u64 {
                for i in 0..per_task {
                    let key = base + rng.below(per_task * 2);
                    let value = round * 1_000_000_000 + t * 10_000_000 + i;
                    match rng.below(10) {
                        0..=3 => {
                            timers.set(key, value, secs(3_600 + rng.below(3_600)));
                            model.insert(key, value);
                        }
                        4 => {
                            handles.push(timers.insert(key, value, secs(3_600)));
                            model.insert(key, value);
                        }
                        5..=6 => {
                            timers.remove(&key);
                            model.remove(&key);
                        }
                        7 => {
                            assert_eq!(timers.take(&key).await, model.remove(&key), "{key}");
                        }
                        8 => timers.reset(&key, secs(3_600 + rng.below(3_600))),
                        _ => {
                            if let Some(h) =
                                handles.get(rng.below(handles.len() as u64 + 1) as usize)
                            {
                                h.reset(secs(3_600 + rng.below(3_600)));
                            }
                        }
                    }
                }
                // Shrink: most of this task's keys removed.
                for key in base..base + per_task * 2 {
                    if key % 7 != 0 {
                        timers.remove(&key);
                        model.remove(&key);
                    }
                }
                tokio::task::yield_now().await;
            }
            model
        }));
    }
    let mut want = BTreeMap::new();
    for task in tasks {
        want.extend(task.await.unwrap());
    }
    assert_eq!(timers.len().await, want.len());
    let t1 = Instant::now();
    for (i, key) in want.keys().enumerate() {
        timers.reset(key, ms(5 + i as u64 % 50));
    }
    let n = want.len();
    for _ in 0..n {
        let e = tokio::time::timeout(secs(30), expired.next())
            .await
            .expect("an entry never fired")
            .unwrap();
        assert!(Instant::now() >= e.deadline(), "fired early");
        assert!(e.deadline() >= t1 + ms(5));
        let (key, value) = e.into_parts();
        assert_eq!(
            want.remove(&key),
            Some(value),
            "key {key}: fired twice or wrong value"
        );
    }
    assert!(want.is_empty());
    assert_eq!(timers.len().await, 0);
}

/// Thousands of keys filed in one slot of each upper level (a second, a minute, an hour
/// ahead), then each moved within its slot: earlier by key or by handle (the entry stays on
/// the slot's list with a new tick), or later by handle (refiled when its old tick comes).
/// Each fires once, at its final deadline, at most a tick late; none early.
#[tokio::test(start_paused = true)]
async fn many_keys_moved_within_their_upper_level_slot_fire_at_their_final_deadline() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u64, u64>();
    let t0 = Instant::now();
    let per_slot = if full() { 100_000u64 } else { 5_000 };
    let slots = [
        (secs(5), secs(1)),
        (secs(180), secs(60)),
        (secs(7_200), secs(3_600)),
    ];
    let mut rng = Rng(0x5107);
    let mut want = BTreeMap::new();
    let mut handles = Vec::new();
    for (s, &(start, width)) in slots.iter().enumerate() {
        let width = width.as_micros() as u64;
        for i in 0..per_slot {
            let key = s as u64 * per_slot + i;
            // In the slot's upper half, so earlier moves can stay inside it.
            let at = width / 2 + rng.below(width / 2);
            let deadline = t0 + start + Duration::from_micros(at);
            handles.push((timers.insert_at(key, key, deadline), start, at));
        }
    }
    assert_eq!(timers.len().await, handles.len());
    for (i, (handle, start, at)) in handles.iter().enumerate() {
        let key = *handle.key();
        let new = match i % 4 {
            0 => *at - rng.below(*at),
            1 => *at - rng.below(1_000).min(*at),
            2 => *at + rng.below(1_000),
            _ => *at,
        };
        let deadline = t0 + *start + Duration::from_micros(new);
        if i % 2 == 0 {
            timers.reset_at(&key, deadline);
        } else {
            handle.reset_at(deadline);
        }
        want.insert(key, deadline);
    }
    let seen = expire_until(&timers, &mut expired, t0 + secs(3 * 3_600)).await;
    assert_eq!(seen.len(), want.len());
    for (k, v, d, at) in seen {
        assert_eq!(k, v);
        let wd = want.remove(&k).expect("fired twice");
        assert_eq!(d, wd, "key {k}: deadline");
        assert!(
            at >= d && at - d <= LATE,
            "key {k} fired {:?} after",
            at - d
        );
    }
}

/// `drain` right behind a flood (while the index is still growing), then the same keys set
/// again into the emptied index, some replaced and taken: the drain returns each key once
/// with its value, and the second generation fires as set, nothing of the first.
#[tokio::test(start_paused = true)]
async fn drain_behind_a_flood_then_refill_returns_and_fires_each_key_once() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<String, u64>();
    let t0 = Instant::now();
    let keys = if full() { 200_000u64 } else { 20_000 };
    for round in 0..3u64 {
        for k in 0..keys {
            timers.set(format!("k{k}"), round * keys + k, secs(60 + k % 600));
        }
        let mut drained = timers.drain().await;
        assert_eq!(drained.len(), keys as usize, "round {round}");
        drained.sort_by_key(|(_, v)| *v);
        for (i, (k, v)) in drained.into_iter().enumerate() {
            assert_eq!((k, v), (format!("k{i}"), round * keys + i as u64));
        }
        assert_eq!(timers.len().await, 0);
    }
    let mut want = BTreeMap::new();
    for k in (0..keys).step_by(2) {
        timers.set(format!("k{k}"), k, ms(1 + k % 1_000));
        want.insert(format!("k{k}"), (k, t0 + ms(1 + k % 1_000)));
    }
    for k in (0..keys).step_by(6) {
        let key = format!("k{k}");
        if k % 12 == 0 {
            assert_eq!(timers.take(&key).await, Some(k));
            want.remove(&key);
        } else {
            timers.set(key.clone(), k + 1, ms(1_500));
            want.insert(key, (k + 1, t0 + ms(1_500)));
        }
    }
    assert_eq!(timers.len().await, want.len());
    let seen = expire_until(&timers, &mut expired, t0 + secs(2)).await;
    assert_eq!(seen.len(), want.len());
    for (k, v, d, at) in seen {
        let (wv, wd) = want.remove(&k).expect("fired twice or not set");
        assert_eq!((v, d), (wv, wd), "{k}");
        assert!(at >= d && at - d <= LATE, "{k} fired {:?} after", at - d);
    }
    quiet_after(&mut expired, secs(3_600)).await;
}

/// A key that holds a token, equal and hashed by its id alone.
#[derive(Clone, Debug)]
struct Tracked {
    id: u64,
    _token: std::sync::Arc<()>,
}

impl PartialEq for Tracked {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Tracked {}

impl Hash for Tracked {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // A few distinct hashes only: long probe runs, many backward shifts on removal.
        state.write_u64(self.id % 5);
    }
}

/// Every key and value the set was given is dropped once it is gone — replaced, removed,
/// taken, drained or fired — however the index shifted entries around: no copy kept (a
/// leak), none dropped twice (the token's count would fall short).
#[tokio::test(start_paused = true)]
async fn keys_and_values_are_dropped_once_they_are_gone() {
    let token = std::sync::Arc::new(());
    {
        let wheel = Wheel::new();
        let (timers, mut expired) = wheel.keyed::<Tracked, std::sync::Arc<()>>();
        let t0 = Instant::now();
        let mut rng = Rng(0xd207);
        let keys = if full() { 20_000u64 } else { 2_000 };
        let mut handles = Vec::new();
        for i in 0..keys * 5 {
            let k = rng.below(keys);
            let key = Tracked {
                id: k,
                _token: token.clone(),
            };
            match rng.below(6) {
                0 | 1 => timers.set(key, token.clone(), ms(1 + rng.below(5_000))),
                2 => handles.push(timers.insert(key, token.clone(), ms(1 + rng.below(5_000)))),
                3 => timers.remove(&key),
                4 => drop(timers.take(&key).await),
                _ => timers.reset(&key, ms(1 + rng.below(5_000))),
            }
            if i % 997 == 0 {
                tokio::time::advance(ms(rng.below(50))).await;
            }
            if i == keys * 4 {
                drop(timers.drain().await);
            }
        }
        drop(handles);
        let until = tokio::time::sleep_until(t0 + secs(10));
        tokio::pin!(until);
        loop {
            tokio::select! {
                e = expired.next() => drop(e.expect("stream ended")),
                _ = &mut until => break,
            }
        }
        let _ = timers.len().await;
        settle().await;
        while let Poll::Ready(Some(e)) = poll_once(&mut expired.next()) {
            drop(e);
        }
        assert_eq!(timers.len().await, 0);
        // Every expiration read: the set holds nothing of ours.
        assert_eq!(std::sync::Arc::strong_count(&token), 1, "copies still held");
    }
    assert_eq!(std::sync::Arc::strong_count(&token), 1);
}
