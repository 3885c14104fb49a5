//! Keyed timers through a handle to one entry: `Timers::insert` and `KeyedTimer`.

mod support;

use std::time::Duration;

use futures::StreamExt;
use support::{Rng, poll_once, settle};
use tokio::time::Instant;
use tokio_wheel::{Expirations, KeyedTimer, Wheel};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Asserts that nothing expires (or is flushed) now: the stream has nothing ready.
async fn nothing_expired<K, V>(expired: &mut Expirations<K, V>) {
    settle().await;
    assert!(poll_once(expired.next()).is_pending(), "an expiration came");
}

#[tokio::test(start_paused = true)]
async fn insert_returns_a_handle_to_an_entry_that_expires_with_its_value() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u32, String>();
    let timer = timers.insert(7, "seven".into(), secs(30));
    let at = timers.insert_at(8, "eight".into(), start + secs(40));
    assert_eq!((*timer.key(), *at.key()), (7, 8));
    assert_eq!(timer.deadline(), start + secs(30));
    assert_eq!(at.deadline(), start + secs(40));
    assert!(!timer.is_stale());
    assert_eq!(timers.len().await, 2);

    let e = expired.next().await.unwrap();
    assert_eq!(start.elapsed(), secs(30));
    assert_eq!(e.deadline(), start + secs(30));
    assert!(!e.is_shutdown());
    assert_eq!(e.into_parts(), (7, "seven".to_owned()));
    assert!(timer.is_stale(), "expired: the handle is stale");
    assert_eq!(
        timer.deadline(),
        start + secs(30),
        "the deadline it fired for"
    );

    let e = expired.next().await.unwrap();
    assert_eq!(start.elapsed(), secs(40));
    assert_eq!(e.into_parts(), (8, "eight".to_owned()));
}

#[tokio::test(start_paused = true)]
async fn a_later_reset_through_the_handle_moves_expiry_exactly_and_fires_once() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, ()>();
    let timer = timers.insert(1, (), secs(10));
    tokio::time::sleep(secs(5)).await;
    timer.reset(secs(20));
    assert_eq!(timer.deadline(), start + secs(25), "visible at once");

    // Past the old deadline, and up to just before the new one: nothing.
    tokio::time::sleep_until(start + secs(25) - Duration::from_millis(1)).await;
    nothing_expired(&mut expired).await;

    let e = expired.next().await.unwrap();
    assert_eq!(e.deadline(), start + secs(25));
    assert!(start.elapsed() >= secs(25));
    assert!(
        start.elapsed() <= secs(25) + wheel.tick(),
        "{:?}",
        start.elapsed()
    );
    tokio::time::sleep(secs(60)).await;
    nothing_expired(&mut expired).await;
    let stats = wheel.stats();
    assert_eq!((stats.inserted, stats.fired, stats.pending), (1, 1, 0));
}

#[tokio::test(start_paused = true)]
async fn postponing_through_the_handle_sends_no_command() {
    let wheel = Wheel::new();
    let (timers, _expired) = wheel.keyed::<u8, ()>();
    let timer = timers.insert(1, (), secs(10));
    assert_eq!(timers.len().await, 1);
    settle().await;
    let before = wheel.stats().commands;
    for i in 1..=1_000 {
        timer.reset(secs(10 + i));
    }
    assert_eq!(timers.len().await, 1); // a barrier: the one command counted below
    settle().await;
    assert_eq!(wheel.stats().commands, before + 1);
}

#[tokio::test(start_paused = true)]
async fn an_earlier_reset_through_the_handle_fires_at_the_new_deadline() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    let timer = timers.insert(1, 10, secs(100));
    let _other = timers.insert(2, 20, secs(50));
    assert_eq!(timers.len().await, 2);
    timer.reset_at(start + secs(5));
    assert_eq!(timer.deadline(), start + secs(5));
    let e = expired.next().await.unwrap();
    assert_eq!(e.into_parts(), (1, 10));
    assert_eq!(start.elapsed(), secs(5));
    // And earlier again, before the actor has even filed it.
    let again = timers.insert(3, 30, secs(100));
    again.reset(secs(1));
    let e = expired.next().await.unwrap();
    assert_eq!(e.into_parts(), (3, 30));
    assert_eq!(start.elapsed(), secs(6));
}

/// An earlier move queues an advance, but the next move of the same handle need not wait for
/// it: the handle stores it at once (its `deadline()` shows it), and the entry fires for it —
/// not for the earlier deadline the advance was sent for, and not before.
#[tokio::test(start_paused = true)]
async fn a_move_right_after_an_earlier_one_is_stored_at_once_and_wins() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    let timer = timers.insert(1, 10, secs(100));
    assert_eq!(timers.len().await, 1);
    let commands = wheel.stats().commands;
    timer.reset_at(start + secs(5)); // earlier: an advance is queued
    timer.reset_at(start + secs(40)); // later, with the advance still queued
    assert_eq!(timer.deadline(), start + secs(40));
    timer.reset_at(start + secs(20)); // earlier again
    assert_eq!(timer.deadline(), start + secs(20));
    let e = expired.next().await.unwrap();
    assert_eq!(start.elapsed(), secs(20));
    assert_eq!(
        (e.into_parts(), e_deadline(&timer)),
        ((1, 10), start + secs(20))
    );
    // Two advances and nothing else: the later move was one store, not a queued move.
    assert_eq!(wheel.stats().commands - commands, 2);
}

fn e_deadline(timer: &KeyedTimer<u8, u8>) -> Instant {
    assert!(timer.is_stale());
    timer.deadline()
}

#[tokio::test(start_paused = true)]
async fn remove_and_take_through_the_handle() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u8, &str>();
    let removed = timers.insert(1, "removed", secs(1));
    let taken = timers.insert(2, "taken", secs(1));
    timers.set(3, "kept", secs(2));
    removed.remove();
    assert_eq!(taken.take().await, Some("taken"));
    assert_eq!(taken.take().await, None, "taken already");
    assert!(removed.is_stale() && taken.is_stale());
    assert_eq!(timers.len().await, 1);
    assert_eq!(expired.next().await.unwrap().into_parts(), (3, "kept"));
    let stats = wheel.stats();
    assert_eq!((stats.cancelled, stats.fired), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn clones_of_a_handle_act_on_one_entry() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    let timer = timers.insert(1, 1, secs(10));
    let clone = timer.clone();
    // Made while the insert is in flight, the move queues behind it...
    clone.reset(secs(20));
    assert_eq!(timers.len().await, 1);
    // ...and shows in every clone once applied.
    assert_eq!(timer.deadline(), start + secs(20));
    let e = expired.next().await.unwrap();
    assert_eq!(e.deadline(), start + secs(20));
    assert!(timer.is_stale() && clone.is_stale());
    // Dropping every handle leaves an entry set.
    drop(timers.insert(2, 2, secs(1)));
    assert_eq!(expired.next().await.unwrap().into_parts(), (2, 2));
}

/// A stale handle: `reset` and `remove` change nothing, `take` answers `None`, `deadline`
/// keeps the deadline the entry had when it went.
async fn assert_stale(timer: &KeyedTimer<u8, &'static str>, went_at: Instant) {
    assert!(timer.is_stale());
    timer.reset(secs(1));
    timer.reset(secs(1_000));
    timer.remove();
    assert_eq!(timer.take().await, None);
    assert_eq!(timer.deadline(), went_at);
}

#[tokio::test(start_paused = true)]
async fn a_replaced_entry_leaves_its_handle_stale() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, &'static str>();
    let old = timers.insert(1, "old", secs(10));
    timers.set(1, "by set", secs(30));
    let by_set = timers.len().await;
    assert_eq!(by_set, 1);
    assert_stale(&old, start + secs(10)).await;

    let newer = timers.insert(1, "by insert", secs(40));
    assert_eq!(timers.len().await, 1);
    assert!(!newer.is_stale());
    assert_stale(&old, start + secs(10)).await;

    let newest = timers.insert(1, "newest", secs(50));
    assert_eq!(timers.len().await, 1);
    assert_stale(&newer, start + secs(40)).await;
    newest.reset(secs(60));

    let e = expired.next().await.unwrap();
    assert_eq!(e.into_parts(), (1, "newest"));
    assert_eq!(start.elapsed(), secs(60), "no stale call moved it");
    nothing_expired(&mut expired).await;
}

#[tokio::test(start_paused = true)]
async fn removal_by_key_take_by_key_drain_and_expiry_leave_handles_stale() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, &'static str>();
    let removed = timers.insert(1, "removed", secs(10));
    let taken = timers.insert(2, "taken", secs(10));
    let drained = timers.insert(3, "drained", secs(10));
    timers.remove(&1);
    assert_eq!(timers.take(&2).await, Some("taken"));
    assert_stale(&removed, start + secs(10)).await;
    assert_stale(&taken, start + secs(10)).await;
    assert_eq!(timers.drain().await, [(3, "drained")]);
    assert_stale(&drained, start + secs(10)).await;

    let fired = timers.insert(4, "fired", secs(5));
    assert_eq!(expired.next().await.unwrap().into_parts(), (4, "fired"));
    assert_stale(&fired, start + secs(5)).await;

    // The key set again, by a later call: the stale handle still touches nothing.
    timers.set(4, "again", secs(10));
    assert_stale(&fired, start + secs(5)).await;
    assert_eq!(timers.len().await, 1);
    assert_eq!(expired.next().await.unwrap().into_parts(), (4, "again"));
    assert_eq!(start.elapsed(), secs(15));
    nothing_expired(&mut expired).await;
}

#[tokio::test(start_paused = true)]
async fn handle_and_by_key_calls_from_one_task_apply_in_order() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, u8>();

    // By key earlier, then the handle later: the handle's wins, though the by-key command
    // reaches the actor after the handle could have stored.
    let a = timers.insert(1, 1, secs(10));
    timers.reset(&1, secs(5));
    a.reset(secs(50));
    // The handle earlier, then by key later: the by-key call wins.
    let b = timers.insert(2, 2, secs(10));
    b.reset(secs(3));
    timers.reset(&2, secs(40));
    // Removed by key, then postponed through the handle: stays removed.
    let c = timers.insert(3, 3, secs(10));
    timers.remove(&3);
    c.reset(secs(20));
    // Removed through the handle, then set by key: the new entry lives.
    let d = timers.insert(4, 4, secs(10));
    d.remove();
    timers.set(4, 44, secs(30));
    d.reset(secs(1)); // stale by now (in order): nothing

    let mut seen = Vec::new();
    for _ in 0..3 {
        let e = expired.next().await.unwrap();
        seen.push((e.into_parts(), start.elapsed().as_secs()));
    }
    assert_eq!(seen, [((4, 44), 30), ((2, 2), 40), ((1, 1), 50)]);
    assert!(c.take().await.is_none());
    assert_eq!(timers.len().await, 0);
    nothing_expired(&mut expired).await;
}

#[tokio::test(start_paused = true)]
async fn a_handle_in_another_task_postpones_its_own_entry() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u32, &str>();
    let timer = timers.insert(1, "conn", secs(30));
    let connection = tokio::spawn(async move {
        for _ in 0..5 {
            tokio::time::sleep(secs(20)).await;
            timer.reset(secs(30));
        }
    });
    let e = expired.next().await.unwrap();
    assert_eq!(e.into_parts(), (1, "conn"));
    assert_eq!(
        start.elapsed(),
        secs(130),
        "30 s after the last of 5 messages"
    );
    connection.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn shutdown_delivers_pending_entries_once_and_leaves_handles_stale() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, &'static str>();
    let pending = timers.insert(1, "pending", secs(3_600));
    let moved = timers.insert(2, "moved", secs(3_600));
    moved.reset(secs(7_200));
    let removed = timers.insert(3, "removed", secs(3_600));
    removed.remove();
    // Made before shutdown, not yet applied: applied before the flush.
    let queued = timers.insert(4, "queued", secs(3_600));

    wheel.shutdown().await;

    let mut flushed = Vec::new();
    while let Some(e) = expired.next().await {
        assert!(e.is_shutdown());
        flushed.push((e.key().to_owned(), e.deadline()));
    }
    flushed.sort_unstable();
    assert_eq!(
        flushed,
        [
            (1, start + secs(3_600)),
            (2, start + secs(7_200)),
            (4, start + secs(3_600))
        ]
    );
    // Every call returns at once and does nothing.
    for timer in [&pending, &moved, &removed, &queued] {
        assert!(timer.is_stale());
        timer.reset(secs(1));
        timer.reset_at(start);
        timer.remove();
        assert_eq!(timer.take().await, None);
    }
    assert_eq!(moved.deadline(), start + secs(7_200));
    let late = timers.insert(5, "late", secs(1));
    assert!(late.is_stale(), "refused: stale from the start");
    assert_eq!(late.take().await, None);
    assert_eq!(timers.len().await, 0);
    assert_eq!(start.elapsed(), Duration::ZERO, "nothing waited");
}

#[tokio::test(start_paused = true)]
async fn keyed_stats_add_up_with_handles() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    let handles: Vec<_> = (0..50)
        .map(|k| timers.insert(k, k, secs(u64::from(k) + 1)))
        .collect();
    for handle in &handles[..10] {
        handle.remove();
    }
    for handle in &handles[10..20] {
        handle.reset(secs(1_000));
    }
    for _ in 0..20 {
        expired.next().await.unwrap();
    }
    settle().await;
    let s = wheel.stats();
    assert_eq!(
        (s.inserted, s.cancelled, s.fired, s.pending),
        (50, 10, 20, 20)
    );
    assert_eq!(s.inserted, s.fired + s.cancelled + s.pending);
}

#[test]
fn a_handle_has_the_promised_traits() {
    support::assert_send::<KeyedTimer<String, Vec<u8>>>();
    support::assert_sync::<KeyedTimer<String, Vec<u8>>>();
    fn assert_clone_debug<T: Clone + std::fmt::Debug>() {}
    assert_clone_debug::<KeyedTimer<String, Vec<u8>>>();
}

#[tokio::test(start_paused = true)]
async fn a_handle_shows_its_key_deadline_and_staleness() {
    let wheel = Wheel::new();
    let (timers, _expired) = wheel.keyed::<&str, ()>();
    let timer = timers.insert("conn-1", (), secs(1));
    let shown = format!("{timer:?}");
    assert!(shown.starts_with("KeyedTimer { key: \"conn-1\""), "{shown}");
    assert!(shown.contains("stale: false"), "{shown}");
}

/// A handle resets its entry over and over, to deadlines around now, while the actor fires
/// it, on two workers in real time: each entry fires exactly once, never before the deadline
/// it fired for, and that deadline is the one its word held when it fired — the latest set
/// before it fired. Resets after that do nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_racing_expiry_fires_once_and_never_early() {
    const ROUNDS: u32 = 300;
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    let mut rng = Rng(0x5EED);
    for round in 0..ROUNDS {
        let timer = timers.insert(round, round, Duration::from_micros(rng.below(300)));
        let seed = rng.next();
        let resetter = tokio::spawn(async move {
            let mut rng = Rng(seed | 1);
            let mut set = vec![timer.deadline()];
            let began = std::time::Instant::now();
            while !timer.is_stale() && began.elapsed() < Duration::from_millis(20) {
                // Mostly later, now and then earlier: both paths race the actor.
                let deadline = Instant::now() + Duration::from_micros(rng.below(400));
                timer.reset_at(deadline);
                set.push(deadline);
                if rng.below(8) == 0 {
                    tokio::task::yield_now().await;
                }
            }
            (timer, set)
        });
        let e = tokio::time::timeout(Duration::from_secs(60), expired.next())
            .await
            .expect("the entry fires")
            .unwrap();
        let seen = Instant::now();
        let (timer, set) = resetter.await.unwrap();
        assert_eq!(e.key(), &round);
        assert!(seen >= e.deadline(), "round {round} fired early");
        assert!(
            set.contains(&e.deadline()),
            "round {round}: a deadline never set"
        );
        let after = Instant::now();
        assert!(timer.is_stale());
        timer.reset_at(after + secs(1));
        assert_eq!(
            timer.deadline(),
            e.deadline(),
            "round {round}: the handle's word holds the deadline it fired for"
        );
    }
    // No entry fired twice.
    drop(timers);
    let extra = tokio::time::timeout(Duration::from_secs(60), expired.next())
        .await
        .expect("the stream ends");
    assert!(
        extra.is_none(),
        "fired twice: {:?}",
        extra.map(|e| e.into_parts())
    );
    let stats = wheel.stats();
    assert_eq!(stats.fired, u64::from(ROUNDS));
}

/// Spins (no sleep: finer than a timer) until `at`.
fn spin_until(at: Instant) {
    while Instant::now() < at {
        std::hint::spin_loop();
    }
}

/// A later `reset` through the handle that returned before the entry's deadline always wins:
/// the entry expires at the new deadline only — also when the reset had to queue behind a
/// by-key command in flight on its key, and while a flood of by-key commands on other keys
/// keeps the actor firing between slices of its batches (where it has taken commands but not
/// applied them). Many rounds on two workers, each reset made at a random moment just before
/// (or after) the old deadline; the rounds where the reset returned before it and the entry
/// still fired at it are counted, and there must be none. Catches an actor that fires an
/// entry whose handle's move is registered but not yet applied (with both of its hold-backs
/// disabled, the deadline word's and the flood's by stripe, ~50 of ~700 such rounds lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_that_returned_before_the_old_deadline_always_wins_in_every_round() {
    const WAVES: u64 = 150;
    const PER_WAVE: u64 = 8;
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u64, ()>();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let (timers, stop) = (timers.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut key = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for _ in 0..256 {
                    let other = (1 << 40) + key % 50_000;
                    timers.set(other, (), secs(3_600));
                    timers.reset(&other, secs(3_601));
                    key += 1;
                }
                std::thread::yield_now();
            }
        })
    };
    let mut rng = Rng(0x00DD_BA11);
    let (mut raced, mut lost) = (0, Vec::new());
    for wave in 0..WAVES {
        let mut resets = Vec::new();
        for i in 0..PER_WAVE {
            let key = wave * PER_WAVE + i;
            let old = Instant::now() + Duration::from_micros(1_500 + rng.below(1_000));
            let timer = timers.insert_at(key, (), old);
            if rng.below(2) == 0 {
                // A by-key command in flight on the key: the handle's reset queues behind it.
                timers.reset_at(&key, old);
            }
            let lead = Duration::from_micros(rng.below(300));
            resets.push(tokio::task::spawn_blocking(move || {
                spin_until(old - lead);
                let new = old + Duration::from_millis(5);
                timer.reset_at(new);
                (key, old, new, Instant::now())
            }));
        }
        let mut fired = std::collections::HashMap::new();
        while fired.len() < PER_WAVE as usize {
            let e = tokio::time::timeout(secs(30), expired.next())
                .await
                .expect("an entry never expired (30 s)")
                .expect("the stream ended early");
            assert!(
                fired.insert(*e.key(), e.deadline()).is_none(),
                "fired twice"
            );
        }
        for reset in resets {
            let (key, old, new, returned) = reset.await.unwrap();
            let deadline = fired[&key];
            assert!(
                deadline == old || deadline == new,
                "key {key}: a deadline never set"
            );
            if returned < old {
                raced += 1;
                if deadline == old {
                    lost.push(key);
                }
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flood.join().unwrap();
    eprintln!(
        "{raced} of {} resets returned before the old deadline",
        WAVES * PER_WAVE
    );
    assert!(
        lost.is_empty(),
        "{} of {raced} resets that returned before the old deadline lost to it: keys {lost:?}",
        lost.len()
    );
    assert!(
        raced > 0,
        "no reset returned before its deadline: the race never ran"
    );
}

/// A handle made stale in any way — its entry removed by key or through the handle, taken,
/// drained, replaced or expired, while another task still resets it — lets the stream end
/// once the last `Timers` is gone (API.md §3): what a stale handle holds keeps neither the
/// stream open nor the set's actor running. On two workers, the last `Timers` dropped at a
/// random moment of the race. Catches a set that waits for its handles to go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_handles_of_every_kind_never_keep_the_stream_open() {
    let wheel = Wheel::new();
    let mut rng = Rng(0x57A1E);
    for round in 0..200 {
        let (timers, mut expired) = wheel.keyed::<u32, u32>();
        let handles: Vec<_> = (0..4)
            .map(|key| timers.insert(key, key, Duration::from_micros(200 + rng.below(800))))
            .collect();
        let resetters: Vec<_> = handles
            .iter()
            .cloned()
            .map(|timer| {
                let spin = Duration::from_micros(rng.below(600));
                tokio::spawn(async move {
                    let began = std::time::Instant::now();
                    while !timer.is_stale() && began.elapsed() < spin {
                        timer.reset(Duration::from_micros(300));
                        tokio::task::yield_now().await;
                    }
                    timer
                })
            })
            .collect();
        let how = rng.below(6);
        match how {
            0 => {} // they expire
            1 => (0..4).for_each(|key| timers.remove(&key)),
            2 => handles.iter().for_each(|timer| timer.remove()),
            3 => {
                for timer in &handles {
                    let _ = timer.take().await;
                }
            }
            4 => drop(timers.drain().await),
            _ => (0..4).for_each(|key| timers.set(key, 9, Duration::from_micros(100))),
        }
        tokio::time::sleep(Duration::from_micros(rng.below(500))).await;
        drop(timers);
        let mut stale = Vec::new();
        for resetter in resetters {
            stale.push(resetter.await.unwrap());
        }
        let ended = tokio::time::timeout(secs(30), async {
            while let Some(e) = expired.next().await {
                assert!(!e.is_shutdown(), "round {round}: flushed by a stop");
            }
        })
        .await;
        assert!(
            ended.is_ok(),
            "round {round} (way {how}): the stream stayed open (30 s) with only stale handles"
        );
        assert!(stale.iter().all(KeyedTimer::is_stale), "round {round}");
        drop((handles, stale));
    }
}
