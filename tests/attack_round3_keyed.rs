//! Outside attacks, round 3, on API.md §3 (keyed timers: races, floods, drain, stream end),
//! written from the contract and the public rustdoc only. Every attack that holds is kept as a
//! regression test, named by the behaviour; a broken promise is kept as
//! `#[ignore = "finding: …"]`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_wheel::Wheel;

#[path = "support/attack.rs"]
mod attack;
use attack::{ms, secs};

fn full() -> bool {
    std::env::var_os("TOKIO_WHEEL_FULL").is_some()
}

// ───────────────────────────── §3: keyed: drain, stream end ─────────────────────────────

/// `drain` racing expiry on 2 workers: every entry comes back exactly once, either in a drain
/// or as an expiration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_racing_expiry_returns_each_entry_exactly_once() {
    let wheel = Wheel::new();
    let (timers, expired) = wheel.keyed::<u32, u32>();
    let reader = tokio::spawn(async move {
        expired
            .map(|e| e.into_parts().0)
            .collect::<Vec<u32>>()
            .await
    });
    let rounds = if full() { 200 } else { 40 };
    let per = 100u32;
    let mut drained = Vec::new();
    for r in 0..rounds {
        for k in r * per..(r + 1) * per {
            timers.set(k, k, Duration::from_micros(200 + 37 * u64::from(k % 50)));
        }
        let spin = std::time::Instant::now() + Duration::from_micros(100 * u64::from(r % 20));
        while std::time::Instant::now() < spin {
            std::hint::spin_loop();
        }
        drained.extend(timers.drain().await.into_iter().map(|(k, v)| {
            assert_eq!(k, v);
            k
        }));
    }
    drop(timers);
    let fired = tokio::time::timeout(secs(30), reader)
        .await
        .expect("stream did not end")
        .unwrap();
    let mut all: Vec<u32> = drained.into_iter().chain(fired).collect();
    all.sort_unstable();
    let want: Vec<u32> = (0..rounds * per).collect();
    assert_eq!(all, want);
}

/// Dropping every `Timers` with entries pending: they still fire at their deadlines (not as
/// shutdown), then the stream ends.
#[tokio::test(start_paused = true)]
async fn stream_delivers_pending_entries_after_timers_drop_then_ends() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    let t0 = Instant::now();
    for k in 1..=5u32 {
        timers.set(k, k, ms(10 * u64::from(k)));
    }
    drop(timers);
    for k in 1..=5u32 {
        let e = expired.next().await.expect("ended early");
        assert!(!e.is_shutdown());
        assert_eq!(*e.key(), k);
        assert!(Instant::now() - t0 >= ms(10 * u64::from(k)));
    }
    assert!(expired.next().await.is_none());
}

// ───────────────────────────── §3: keyed, ordering under floods ─────────────────────────────

/// Was a finding (fixed): the smallest shape of the flood hang: 4 000 keyed `set`s due in 1 ms,
/// sent in one loop on a 2-worker runtime, in real time. The keyed actor stopped for good (seen
/// for 150 s, at ~100 % CPU): `len()` never answered and expirations stopped (API.md §3, and
/// "calls … return promptly"): its firing loop chased the clock with entries it held back. Measured: 1 000 keys due in 1 ms pass, 2 000 hang; 20 000 due in 20 ms hang,
/// 20 000 due in 500 ms and 100 000 due in 2 s pass; yielding in the sender does not help;
/// also seen on a current-thread runtime and with `own_thread(true)`; never with paused time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_actor_keeps_answering_when_a_big_batch_comes_due() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u64, u64>();
    let n = 4_000u64;
    for k in 0..n {
        timers.set(k, k, ms(1));
    }
    let len = tokio::time::timeout(secs(10), timers.len()).await;
    assert!(
        len.is_ok(),
        "len() did not answer in 10 s; {:?}",
        wheel.stats()
    );
    for i in 0..n {
        let e = tokio::time::timeout(secs(10), expired.next()).await;
        assert!(e.is_ok(), "expirations stopped after {i} of {n}");
    }
}

/// Was a finding (fixed): the same hang seen through `shutdown()`: with the keyed actor stuck on a batch that came
/// due, `wheel.shutdown()` does not return either (API.md: nothing created by the wheel ever
/// hangs because the wheel stopped; shutdown is graceful). Also seen on a current-thread
/// runtime, with `Builder::own_thread(true)`, and with a reader draining the stream meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_after_a_big_keyed_batch_comes_due() {
    let wheel = Wheel::new();
    let (timers, expired) = wheel.keyed::<u64, u64>();
    let reader = tokio::spawn(expired.count());
    for k in 0..20_000u64 {
        timers.set(k, k, ms(20));
    }
    tokio::time::sleep(ms(100)).await;
    let stopped = tokio::time::timeout(secs(10), wheel.shutdown()).await;
    assert!(stopped.is_ok(), "shutdown() did not return in 10 s");
    let read = tokio::time::timeout(secs(10), reader).await;
    assert!(matches!(read, Ok(Ok(20_000))), "{read:?}");
}

/// Per key, one task sends a script whose last word is known; four such tasks flood the same
/// keyed set at once while earlier entries come due. Each key must end as its script says:
/// exactly one expiration, with the value of the last `set`, never before its deadline.
///
/// The script's second command moves the entry to 1 ms from then, and its third removes it.
/// Where the remove returned before that deadline could have passed, the entry never fires
/// with its first value. A producer preempted for a millisecond between the two (a loaded
/// 2-core machine does that) made its remove after the deadline: the entry may then fire
/// with its first value — once, before the last value's expiration — as API.md allows a
/// removal racing expiry (seen in CI: once in ~20 whole-suite runs, with the previous
/// release too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_handles_commands_apply_in_order_under_a_flood() {
    commands_in_order_under_a_flood(if full() { 50_000 } else { 5_000 }).await;
}

/// The same at a size the keyed actor survives today (4 × 400 keys, 8 commands each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_handles_commands_apply_in_order_under_a_small_flood() {
    commands_in_order_under_a_flood(400).await;
}

async fn commands_in_order_under_a_flood(per_task: u64) {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u64, u64>();
    let tasks = 4u64;
    let mut senders = Vec::new();
    for t in 0..tasks {
        let timers = timers.clone();
        senders.push(tokio::spawn(async move {
            let base = t * per_task;
            let mut raced = HashSet::new();
            for k in base..base + per_task {
                timers.set(k, 1, secs(3600));
                let before_reset = Instant::now();
                timers.reset(&k, ms(1));
                timers.remove(&k);
                // The deadline is at least 1 ms after `before_reset`: a remove that returned
                // sooner was surely made before it.
                if before_reset.elapsed() >= ms(1) {
                    raced.insert(k);
                }
                timers.set(k, 2, secs(3600));
                let h = timers.insert(k, 3, secs(7200));
                h.reset(secs(9000));
                timers.set(k, 4, secs(3600));
                timers.reset(&k, ms(20 + k % 13));
                if k % 512 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            raced
        }));
    }
    let mut raced = HashSet::new();
    for s in senders {
        raced.extend(s.await.unwrap());
    }
    let total = (tasks * per_task) as usize;
    let mut seen: HashMap<u64, u64> = HashMap::with_capacity(total);
    let mut first_values = HashSet::new();
    while seen.len() < total {
        let Ok(e) = tokio::time::timeout(secs(20), expired.next()).await else {
            let missing: Vec<u64> = (0..tasks * per_task)
                .filter(|k| !seen.contains_key(k))
                .take(10)
                .collect();
            panic!(
                "expirations stalled after {} of {total}; len {:?}; missing e.g. {missing:?}; {:?}",
                seen.len(),
                tokio::time::timeout(secs(5), timers.len()).await,
                wheel.stats()
            );
        };
        let e = e.expect("stream ended");
        assert!(!e.is_shutdown());
        let fired_at = Instant::now();
        assert!(
            fired_at >= e.deadline(),
            "early by {:?}",
            e.deadline() - fired_at
        );
        let (k, v) = e.into_parts();
        if v == 1 && raced.contains(&k) && !seen.contains_key(&k) {
            assert!(
                first_values.insert(k),
                "key {k} fired twice with its first value"
            );
            continue;
        }
        assert_eq!(v, 4, "key {k} fired with value {v}");
        assert!(seen.insert(k, v).is_none(), "key {k} fired twice");
    }
    assert_eq!(timers.len().await, 0);
    let stats = wheel.stats();
    assert_eq!(
        stats.inserted,
        stats.fired + stats.cancelled + stats.pending,
        "{stats:?}"
    );
}

/// A by-key `remove` / later `reset` that returned before the entry's deadline wins: the
/// entry never fires (remove) or fires only at the new deadline (reset). 2 workers; the
/// commands race the deadline from another task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_key_remove_or_reset_returned_before_the_deadline_wins() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    let n = if full() { 20_000 } else { 2_000 };
    // Per key: (deadline, returned at, kind), kind 0 = removed, 1 = moved to +1 h.
    type Acted = HashMap<u32, (Instant, Instant, u8)>;
    // (key, deadline, seen at).
    type Fired = Vec<(u32, Instant, Instant)>;
    let log: Arc<Mutex<Acted>> = Default::default();
    let fired: Arc<Mutex<Fired>> = Default::default();
    let reader = {
        let fired = fired.clone();
        tokio::spawn(async move {
            while let Some(e) = expired.next().await {
                fired
                    .lock()
                    .unwrap()
                    .push((*e.key(), e.deadline(), Instant::now()));
            }
        })
    };
    let mut workers = Vec::new();
    for w in 0..4u32 {
        let timers = timers.clone();
        let log = log.clone();
        workers.push(tokio::spawn(async move {
            for k in (w..n).step_by(4) {
                let deadline = Instant::now() + ms(2);
                timers.set_at(k, k, deadline);
                // Spin until about the deadline, then act.
                let target = deadline - Duration::from_micros(150 * (k % 8) as u64);
                while Instant::now() < target {
                    std::hint::spin_loop();
                    if k % 2 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                let kind = (k / 4 % 2) as u8;
                if kind == 0 {
                    timers.remove(&k);
                } else {
                    timers.reset_at(&k, deadline + secs(3600));
                }
                log.lock()
                    .unwrap()
                    .insert(k, (deadline, Instant::now(), kind));
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    tokio::time::sleep(ms(50)).await;
    drop(timers);
    let log = log.lock().unwrap().clone();
    let mut broken = Vec::new();
    for (k, dl, at) in fired.lock().unwrap().iter() {
        assert!(at >= dl, "key {k} fired early");
        let (deadline, returned, kind) = log[k];
        if returned < deadline {
            broken.push((*k, kind, deadline - returned));
        }
    }
    reader.abort();
    assert!(
        broken.is_empty(),
        "{} entries fired though a remove/reset had returned before their deadline: {:?}",
        broken.len(),
        &broken[..broken.len().min(5)]
    );
}

/// `take` by key racing expiry: `Some` exactly when no expiration for that entry is ever seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_key_take_racing_expiry_is_authoritative() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    let n = if full() { 20_000u32 } else { 2_000 };
    let taken: Arc<Mutex<Vec<(u32, bool)>>> = Default::default();
    let mut workers = Vec::new();
    for w in 0..4u32 {
        let timers = timers.clone();
        let taken = taken.clone();
        workers.push(tokio::spawn(async move {
            for k in (w..n).step_by(4) {
                timers.set(k, k, ms(1));
                if k % 3 == 0 {
                    tokio::task::yield_now().await;
                }
                let std_wait =
                    std::time::Instant::now() + Duration::from_micros(100 * (k % 15) as u64);
                while std::time::Instant::now() < std_wait {
                    std::hint::spin_loop();
                }
                let got = timers.take(&k).await;
                if let Some(v) = got {
                    assert_eq!(v, k);
                }
                taken.lock().unwrap().push((k, got.is_some()));
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    tokio::time::sleep(ms(20)).await;
    drop(timers);
    let mut fired = std::collections::HashSet::new();
    while let Some(e) = tokio::time::timeout(secs(30), expired.next())
        .await
        .expect("stream stalled")
    {
        assert!(fired.insert(*e.key()), "key {} fired twice", e.key());
    }
    let taken = taken.lock().unwrap();
    assert_eq!(taken.len(), n as usize);
    for &(k, some) in taken.iter() {
        assert_ne!(
            some,
            fired.contains(&k),
            "key {k}: take said {some}, fired {}",
            fired.contains(&k)
        );
    }
}

/// By-key `set`/`reset` with `Duration::MAX` and a far instant: no panic, nothing fires in 30
/// years of paused time, and a later short `reset` still brings the entry back. (A century
/// hits `keyed_entries_fire_after_the_clock_ran_a_century`.)
#[tokio::test(start_paused = true)]
async fn by_key_duration_max_never_fires_and_can_come_back() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    timers.set(1, 1, Duration::MAX);
    timers.set(2, 2, ms(5));
    timers.reset(&2, Duration::MAX);
    timers.set_at(3, 3, Instant::now() + secs(86_400 * 365 * 500));
    assert_eq!(timers.len().await, 3);
    for _ in 0..30 {
        tokio::time::advance(secs(86_400 * 365)).await;
    }
    attack::quiet(&mut expired).await;
    let t = Instant::now();
    timers.reset(&2, ms(3));
    let e = expired.next().await.unwrap();
    assert_eq!(*e.key(), 2);
    assert!(Instant::now() - t >= ms(3));
    assert_eq!(timers.len().await, 2);
}

/// After the paused clock has run 100 years past a keyed set's creation, a new entry due in
/// 3 ms never fires (waited an hour of paused time; the same with an entry pending or not).
/// API.md §1: a timer fires at most one tick after its deadline; sleeps on the same wheel do
/// (checked to 100 years). Measured: 50 years fine, 100 years lost (2^41 ms ≈ 69.7 years lies
/// between; a guess, not checked).
#[tokio::test(start_paused = true)]
#[ignore = "documented limit, not a bug: a deadline more than 73 years after the wheel was built never fires (README, Saturation)"]
async fn keyed_entries_fire_after_the_clock_ran_a_century() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    assert_eq!(timers.len().await, 0);
    for _ in 0..100 {
        tokio::time::advance(secs(86_400 * 365)).await;
    }
    let t = Instant::now();
    timers.set(1, 1, ms(3));
    let got = tokio::time::timeout(secs(3600), expired.next()).await;
    assert!(
        got.is_ok(),
        "the entry due in 3 ms did not fire within an hour"
    );
    assert!(Instant::now() - t >= ms(3));
}
