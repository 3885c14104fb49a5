//! Outside attacks on API.md §3: a `KeyedTimer` handle racing expiry on a 2-worker runtime
//! (a reset that returned before the deadline wins; take and earlier moves fire once).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_wheel::Wheel;

#[path = "support/attack.rs"]
mod attack;
use attack::{ms, secs};

// ──────────────────── §3 handle: races on a 2-worker runtime ─────────────────

/// A later `reset` through the handle that *returned* before the entry's current deadline
/// must win ("fires once, never early"); one that lost must find the entry gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_that_returned_before_the_deadline_always_wins() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    let fired: Arc<std::sync::Mutex<Vec<(u32, Instant, Instant)>>> = Default::default();
    let reader = {
        let fired = fired.clone();
        tokio::spawn(async move {
            while let Some(e) = expired.next().await {
                let now = Instant::now();
                fired.lock().unwrap().push((*e.key(), e.deadline(), now));
            }
        })
    };
    let mut tasks = Vec::new();
    for k in 0..64u32 {
        let t = timers.insert(k, k, ms(3 + u64::from(k % 5)));
        tasks.push(tokio::spawn(async move {
            // Moves later; each record: (deadline before, new deadline, returned at).
            let mut log = Vec::new();
            let began = std::time::Instant::now();
            let mut step = 0u64;
            // `deadline()` does not show a move still queued behind another command on this
            // key (API docs), so the task keeps its own latest request: every move is later.
            let mut latest = t.deadline();
            while !t.is_stale() && began.elapsed() < ms(60) {
                let before = t.deadline();
                let new = Instant::now() + Duration::from_micros(500 + (step * 37) % 2500);
                latest = latest.max(new);
                t.reset_at(latest); // never earlier than any earlier request
                let returned = Instant::now();
                log.push((before, latest, returned));
                step += 1;
                if step % 3 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            (t, log)
        }));
    }
    let mut logs = Vec::new();
    for task in tasks {
        let (t, log) = task.await.unwrap();
        logs.push((*t.key(), log)); // handles dropped: they would keep the stream open
    }
    // Everything ends within 60 ms of resets + a few ms; be generous.
    tokio::time::sleep(ms(500)).await;
    drop(timers);
    tokio::time::timeout(secs(10), reader)
        .await
        .expect("stream ends")
        .unwrap();
    let fired = fired.lock().unwrap();
    for (k, log) in &logs {
        let k = *k;
        let mine: Vec<_> = fired.iter().filter(|f| f.0 == k).collect();
        assert_eq!(mine.len(), 1, "key {k} fired {} times", mine.len());
        let (_, deadline, seen) = *mine[0];
        assert!(seen >= deadline, "key {k} delivered before its deadline");
        for &(before, new, returned) in log {
            if returned < before {
                // The entry could not have fired yet (never early): this reset landed.
                assert!(
                    deadline >= new,
                    "key {k}: a reset to {new:?} returned at {returned:?} before the old deadline {before:?}, yet the entry fired for {deadline:?}"
                );
            }
        }
    }
}

/// `take` racing expiry on two workers: exactly one of (Some from take, an expiration).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_racing_expiry_is_exclusive() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    let taken = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for k in 0..200u32 {
        let t = timers.insert(k, k, Duration::from_micros(u64::from(k % 20) * 200));
        let taken = taken.clone();
        tasks.push(tokio::spawn(async move {
            let spin = std::time::Instant::now();
            while spin.elapsed() < Duration::from_micros(u64::from(k % 17) * 250) {
                std::hint::spin_loop();
            }
            if t.take().await.is_some() {
                taken.fetch_add(1, Ordering::SeqCst);
                Some(k)
            } else {
                None
            }
        }));
    }
    let mut took = std::collections::HashSet::new();
    for task in tasks {
        if let Some(k) = task.await.unwrap() {
            took.insert(k);
        }
    }
    drop(timers);
    let mut fired = std::collections::HashSet::new();
    while let Some(e) = tokio::time::timeout(secs(10), expired.next())
        .await
        .expect("stream ends")
    {
        assert!(fired.insert(*e.key()), "fired twice: {}", e.key());
        assert!(!took.contains(e.key()), "taken and fired: {}", e.key());
    }
    assert_eq!(fired.len() + took.len(), 200);
}

/// Earlier moves (commands) racing expiry: fires once, never early, never for a deadline
/// nobody set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn earlier_moves_racing_expiry_fire_once() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, ()>();
    let mut tasks = Vec::new();
    for k in 0..100u32 {
        let t = timers.insert(k, (), ms(2 + u64::from(k % 4)));
        tasks.push(tokio::spawn(async move {
            let mut set = vec![t.deadline()];
            for i in 0..20u64 {
                if t.is_stale() {
                    break;
                }
                let d = Instant::now() + Duration::from_micros(1500u64.saturating_sub(i * 80));
                t.reset_at(d);
                set.push(d);
                tokio::task::yield_now().await;
            }
            (t, set)
        }));
    }
    let mut sets = std::collections::HashMap::new();
    for task in tasks {
        let (t, set) = task.await.unwrap();
        sets.insert(*t.key(), set);
    }
    drop(timers);
    let mut count = std::collections::HashMap::new();
    while let Some(e) = tokio::time::timeout(secs(10), expired.next())
        .await
        .expect("stream ends")
    {
        let seen = Instant::now();
        assert!(seen >= e.deadline());
        let set = &sets[e.key()];
        assert!(
            set.contains(&e.deadline()),
            "key {}: fired for a deadline never set",
            e.key()
        );
        *count.entry(*e.key()).or_insert(0) += 1;
    }
    assert_eq!(count.len(), 100);
    assert!(count.values().all(|&c| c == 1), "{count:?}");
}
