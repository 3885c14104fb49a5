//! Outside attacks, round 4, on moving timers earlier (API.md §1 `Sleep::reset`, §3
//! `KeyedTimer::reset_at` and `Timers::reset_at`): many small moves within one slot and across
//! slot and level boundaries, deadlines from 1 ms to days, with other timers in the same slots.
//! Every timer must fire at or after its final deadline and at most a tick after it (paused
//! time, so no scheduling latency). Written from the contract and the public rustdoc only.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_wheel::Wheel;

#[path = "support/attack.rs"]
mod attack;
use attack::{ms, secs};

#[path = "support/rng.rs"]
#[allow(dead_code)]
mod rng;
use rng::Rng;

fn full() -> bool {
    std::env::var_os("TOKIO_WHEEL_FULL").is_some()
}

/// The default tick: how late a timer may fire in paused time.
const TICK: Duration = Duration::from_millis(1);

/// First deadlines on every level of the default (clock) layout, and on its boundaries.
fn bases() -> Vec<Duration> {
    vec![
        ms(2),
        ms(5),
        ms(63),
        ms(999),
        ms(1_000),
        ms(1_001),
        ms(1_500),
        ms(59_999),
        ms(60_000),
        ms(61_700),
        secs(3_599),
        secs(3_601),
        secs(5 * 3_600),
        secs(25 * 3_600),
    ]
}

/// What fired: `(name, final deadline, when it fired)`.
type Log = Arc<Mutex<Vec<(String, Instant, Instant)>>>;

/// Checks every record: fired at or after its final deadline, at most a tick after it.
fn check(log: &Log, expected: usize) {
    check_within(log, expected, TICK);
}

/// [`check`] with `late` for how late a timer may fire.
fn check_within(log: &Log, expected: usize, late: Duration) {
    let log = log.lock().unwrap();
    assert_eq!(log.len(), expected, "how many fired");
    for (name, deadline, at) in log.iter() {
        assert!(at >= deadline, "{name} fired {:?} early", *deadline - *at);
        assert!(
            *at - *deadline <= late,
            "{name} fired {:?} late",
            *at - *deadline
        );
    }
}

/// The next deadline of a timer moving earlier: mostly a small step (within the slot),
/// sometimes a big one (across slots and levels), now and then a small step later.
fn next_deadline(rng: &mut Rng, deadline: Instant) -> Option<Instant> {
    let now = Instant::now();
    let room = deadline.checked_duration_since(now)?.as_micros() as u64;
    if room < 2_000 {
        return None;
    }
    let micros = match rng.below(10) {
        0..=5 => deadline - Duration::from_micros(1 + rng.below(700)),
        6..=8 => deadline - Duration::from_micros(1 + rng.below(room - 1_500)),
        _ => deadline + Duration::from_micros(1 + rng.below(900)),
    };
    Some(micros)
}

/// Waits a random part of what is left before `deadline` (paused time jumps there).
async fn wait_some(rng: &mut Rng, deadline: Instant) {
    let room = deadline.saturating_duration_since(Instant::now());
    let wait = room.mul_f64(rng.below(60) as f64 / 100.0);
    tokio::time::sleep(wait).await;
}

/// A `Sleep` moved toward now many times, time passing between the moves; fires at its
/// final deadline. Other sleeps sit in the same slots, fixed: they fire at theirs.
#[tokio::test(start_paused = true)]
async fn sleeps_moved_earlier_many_times_fire_at_their_final_deadline() {
    let wheel = Wheel::new();
    let log: Log = Arc::default();
    let per_base = if full() { 128 } else { 16 };
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    let mut expected = 0;
    for (b, base) in bases().into_iter().enumerate() {
        for n in 0..per_base {
            let (wheel, log) = (wheel.clone(), log.clone());
            let mut rng = Rng(1 + (b * 1_000 + n) as u64);
            let name = format!("moving sleep {base:?}/{n}");
            tasks.push(tokio::spawn(async move {
                let mut deadline = t0 + base;
                let mut sleep = wheel.sleep_until(deadline);
                let mut done = false;
                while let Some(next) = next_deadline(&mut rng, deadline) {
                    // tokio's own sleep rounds up to a millisecond: the wait may reach the
                    // deadline, and the sleep then completes (checked below).
                    done = tokio::select! {
                        biased;
                        _ = &mut sleep => true,
                        _ = wait_some(&mut rng, deadline) => false,
                    };
                    if done {
                        break;
                    }
                    // `wait_some` may have used up the room: move only into the future.
                    if next > Instant::now() {
                        Pin::new(&mut sleep).reset(next);
                        deadline = next;
                    }
                }
                if !done {
                    sleep.await;
                }
                log.lock().unwrap().push((name, deadline, Instant::now()));
            }));
            expected += 1;
        }
        // Fixed neighbours in the slots the moving ones pass through.
        for part in [1.0, 0.75, 0.5, 0.25, 0.125] {
            for extra in [0, 300, 999] {
                let deadline = t0 + base.mul_f64(part) + Duration::from_micros(extra);
                let (wheel, log) = (wheel.clone(), log.clone());
                tasks.push(tokio::spawn(async move {
                    wheel.sleep_until(deadline).await;
                    log.lock().unwrap().push((
                        format!("fixed sleep {:?}", deadline - t0),
                        deadline,
                        Instant::now(),
                    ));
                }));
                expected += 1;
            }
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    check(&log, expected);
}

/// Sleeps in one slot moved earlier by a microsecond at a time without time passing (the
/// move stays on the slot's list), in a slot of each level: each fires at its final deadline,
/// and they fire in deadline order across ticks.
#[tokio::test(start_paused = true)]
async fn sleeps_moved_earlier_within_their_slot_fire_in_deadline_order() {
    let wheel = Wheel::new();
    let t0 = Instant::now();
    let log: Log = Arc::default();
    let mut tasks = Vec::new();
    let mut expected = 0;
    // The last millisecond of a slot on each level: ms, s, min, h.
    for slot_end in [ms(11), ms(1_999), ms(120_999), secs(7_199)] {
        for i in 0..20u64 {
            let start = t0 + slot_end - Duration::from_micros(1 + i);
            let mut sleep = wheel.sleep_until(start);
            // Register it (first poll), then move it 1 µs at a time, i × 40 times.
            let _ = attack::poll_once(&mut sleep);
            let mut deadline = start;
            for _ in 0..i * 40 {
                deadline -= Duration::from_micros(1);
                Pin::new(&mut sleep).reset(deadline);
            }
            let log = log.clone();
            let name = format!("sleep {:?}", deadline - t0);
            tasks.push(tokio::spawn(async move {
                sleep.await;
                log.lock().unwrap().push((name, deadline, Instant::now()));
            }));
            expected += 1;
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    check(&log, expected);
    // Order across ticks: a sleep due in an earlier tick fired no later.
    let log = log.lock().unwrap();
    for a in log.iter() {
        for b in log.iter() {
            if a.1 + TICK <= b.1 {
                assert!(a.2 <= b.2, "{} fired after {}", a.0, b.0);
            }
        }
    }
}

/// Keyed entries moved toward now many times — by their handle (earlier: a command; later:
/// a store) and by key, time passing between the moves — among fixed entries in the same
/// slots: each fires once, with its final deadline, never early, at most a tick late.
#[tokio::test(start_paused = true)]
async fn keyed_entries_moved_earlier_many_times_fire_once_at_their_final_deadline() {
    let wheel = Wheel::new();
    let (timers, expired) = wheel.keyed::<String, u64>();
    let t0 = Instant::now();
    let reader = tokio::spawn(async move {
        expired
            .map(|e| (e.deadline(), Instant::now(), e.into_parts()))
            .collect::<Vec<_>>()
            .await
    });
    let per_base = if full() { 128 } else { 16 };
    let finals: Arc<Mutex<BTreeMap<String, (u64, Instant)>>> = Arc::default();
    let mut tasks = Vec::new();
    for (b, base) in bases().into_iter().enumerate() {
        for n in 0..per_base {
            let (timers, finals) = (timers.clone(), finals.clone());
            let mut rng = Rng(7 + (b * 1_000 + n) as u64);
            let key = format!("moving {base:?}/{n}");
            let value = (b * 1_000 + n) as u64;
            tasks.push(tokio::spawn(async move {
                let mut deadline = t0 + base;
                let handle = timers.insert_at(key.clone(), value, deadline);
                let mut step = 0u64;
                while let Some(next) = next_deadline(&mut rng, deadline) {
                    wait_some(&mut rng, deadline).await;
                    // tokio's sleep rounds up to a millisecond: the wait may reach the
                    // deadline, and the entry may have fired (a later move then does nothing).
                    if Instant::now() >= deadline {
                        break;
                    }
                    if next > Instant::now() {
                        if step % 3 == 2 {
                            timers.reset_at(&key, next);
                        } else {
                            handle.reset_at(next);
                        }
                        deadline = next;
                        step += 1;
                    }
                }
                finals.lock().unwrap().insert(key, (value, deadline));
            }));
        }
        for part in [1.0, 0.75, 0.5, 0.25, 0.125] {
            for extra in [0, 300, 999] {
                let deadline = t0 + base.mul_f64(part) + Duration::from_micros(extra);
                let key = format!("fixed {:?}", deadline - t0);
                timers.set_at(key.clone(), u64::MAX, deadline);
                finals.lock().unwrap().insert(key, (u64::MAX, deadline));
            }
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    tokio::time::sleep(secs(26 * 3_600)).await;
    drop(timers);
    let fired = reader.await.unwrap();
    let mut finals = std::mem::take(&mut *finals.lock().unwrap());
    let expected = finals.len();
    let log: Log = Arc::default();
    for (deadline, at, (key, value)) in fired {
        let (want_value, want_deadline) = finals
            .remove(&key)
            .unwrap_or_else(|| panic!("{key} fired twice"));
        assert_eq!((value, deadline), (want_value, want_deadline), "{key}");
        log.lock().unwrap().push((key, deadline, at));
    }
    assert!(finals.is_empty(), "never fired: {finals:?}");
    // One tick, as API.md says: a burst of moves in the tick an entry was due used to delay
    // it by one more (`an_entry_due_while_a_burst_of_moves_arrives_fires_within_a_tick`).
    check(&log, expected);
}

/// Deadlines on and next to the boundaries of the clock layout's levels (ms, s, min, h, day).
fn boundaries() -> Vec<Duration> {
    let mut points = vec![ms(1), ms(2)];
    for unit in [ms(1_000), ms(60_000), secs(3_600), secs(86_400)] {
        for n in [1, 2] {
            let at = unit * n;
            points.extend([at - ms(1), at, at + ms(1), at + Duration::from_micros(500)]);
        }
    }
    points.push(secs(3 * 86_400 + 17));
    points
}

/// Where the clock is when the moves happen, from the wheel's start.
fn phases() -> Vec<Duration> {
    vec![
        Duration::ZERO,
        Duration::from_micros(300),
        ms(500),
        ms(999),
        ms(1_000),
        ms(59_500),
        secs(3_599),
    ]
}

/// Every pair of boundary deadlines (old later than new), for clocks at several phases: a
/// sleep filed at the old deadline, then moved to the new one, fires at the new one. A fixed
/// sleep stays at each old and each new deadline.
#[tokio::test(start_paused = true)]
async fn sleeps_moved_earlier_across_level_boundaries_fire_at_the_new_deadline() {
    for phase in phases() {
        let wheel = Wheel::new();
        let t0 = Instant::now();
        let log: Log = Arc::default();
        let mut moving = Vec::new();
        let points = boundaries();
        for &old in &points {
            for &new in points.iter().filter(|&&new| new < old && new > phase) {
                let mut sleep = wheel.sleep_until(t0 + old);
                let _ = attack::poll_once(&mut sleep); // filed at the old deadline
                moving.push((sleep, old, new));
            }
        }
        let mut tasks = Vec::new();
        let mut expected = 0;
        for &at in points.iter().filter(|&&at| at > phase) {
            let (wheel, log) = (wheel.clone(), log.clone());
            tasks.push(tokio::spawn(async move {
                wheel.sleep_until(t0 + at).await;
                log.lock()
                    .unwrap()
                    .push((format!("fixed {at:?}"), t0 + at, Instant::now()));
            }));
            expected += 1;
        }
        tokio::time::advance(phase).await;
        for (mut sleep, old, new) in moving {
            assert!(
                attack::poll_once(&mut sleep).is_pending(),
                "{old:?} fired at {phase:?}"
            );
            Pin::new(&mut sleep).reset(t0 + new);
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                sleep.await;
                log.lock().unwrap().push((
                    format!("{old:?} -> {new:?} at {phase:?}"),
                    t0 + new,
                    Instant::now(),
                ));
            }));
            expected += 1;
        }
        for task in tasks {
            task.await.unwrap();
        }
        check(&log, expected);
    }
}

/// The same pairs for keyed entries, moved by handle and by key: each fires once, with the
/// new deadline, at it.
#[tokio::test(start_paused = true)]
async fn keyed_entries_moved_earlier_across_level_boundaries_fire_at_the_new_deadline() {
    for phase in phases() {
        let wheel = Wheel::new();
        let (timers, expired) = wheel.keyed::<(u8, Duration, Duration), u64>();
        let t0 = Instant::now();
        let reader = tokio::spawn(async move {
            expired
                .map(|e| (e.deadline(), Instant::now(), e.into_parts().0))
                .collect::<Vec<_>>()
                .await
        });
        let points = boundaries();
        let mut handles = Vec::new();
        let mut want = BTreeMap::new();
        for &old in &points {
            for &new in points.iter().filter(|&&new| new < old && new > phase) {
                handles.push((timers.insert_at((0, old, new), 0, t0 + old), new));
                timers.set_at((1, old, new), 1, t0 + old);
                want.insert((0, old, new), t0 + new);
                want.insert((1, old, new), t0 + new);
            }
            if old > phase {
                timers.set_at((2, old, old), 2, t0 + old);
                want.insert((2, old, old), t0 + old);
            }
        }
        let _ = timers.len().await; // all filed at the old deadlines
        tokio::time::advance(phase).await;
        for (handle, new) in &handles {
            handle.reset_at(t0 + *new);
            let &(_, old, new) = handle.key();
            timers.reset_at(&(1, old, new), t0 + new);
        }
        tokio::time::sleep(secs(4 * 86_400)).await;
        drop(timers);
        let log: Log = Arc::default();
        for (deadline, at, key) in reader.await.unwrap() {
            let name = format!("{key:?} at {phase:?}");
            let want = want.remove(&key).unwrap_or_else(|| panic!("{name} twice"));
            assert_eq!(deadline, want, "{name}");
            log.lock().unwrap().push((name, deadline, at));
        }
        assert!(want.is_empty(), "never fired at {phase:?}: {want:?}");
        let n = log.lock().unwrap().len();
        check(&log, n);
    }
}

/// Each boundary pair again, but each timer alone in its own wheel, so nothing else wakes
/// the actor: moved earlier (within its slot or not), it still fires at the new deadline.
#[tokio::test(start_paused = true)]
async fn a_lone_sleep_moved_earlier_fires_at_the_new_deadline() {
    let points = boundaries();
    for phase in [Duration::ZERO, ms(500), ms(59_500)] {
        for &old in &points {
            for &new in points.iter().filter(|&&new| new < old && new > phase) {
                let wheel = Wheel::new();
                let t0 = Instant::now();
                let mut sleep = wheel.sleep_until(t0 + old);
                let _ = attack::poll_once(&mut sleep);
                tokio::time::sleep(phase).await;
                Pin::new(&mut sleep).reset(t0 + new);
                sleep.await;
                let at = Instant::now() - t0;
                assert!(
                    at >= new && at - new <= TICK,
                    "{old:?} -> {new:?} at {phase:?}: fired at {at:?}"
                );
                wheel.shutdown().await;
            }
        }
    }
}

/// The same for a lone keyed entry, moved by its handle or by key.
#[tokio::test(start_paused = true)]
async fn a_lone_keyed_entry_moved_earlier_fires_at_the_new_deadline() {
    let points = boundaries();
    for phase in [Duration::ZERO, ms(500), ms(59_500)] {
        for by_key in [false, true] {
            for &old in &points {
                for &new in points.iter().filter(|&&new| new < old && new > phase) {
                    let wheel = Wheel::new();
                    let (timers, mut expired) = wheel.keyed::<u8, u8>();
                    let t0 = Instant::now();
                    let handle = timers.insert_at(1, 2, t0 + old);
                    let _ = timers.len().await;
                    tokio::time::sleep(phase).await;
                    if by_key {
                        timers.reset_at(&1, t0 + new);
                    } else {
                        handle.reset_at(t0 + new);
                    }
                    let e = expired.next().await.unwrap();
                    let at = Instant::now() - t0;
                    let name = format!("{old:?} -> {new:?} at {phase:?}, by key: {by_key}");
                    assert_eq!((e.deadline(), e.into_parts()), (t0 + new, (1, 2)), "{name}");
                    assert!(at >= new && at - new <= TICK, "{name}: fired at {at:?}");
                    wheel.shutdown().await;
                }
            }
        }
    }
}

/// One slot of each level crowded with sleeps; rounds of moves earlier within the slot,
/// drops of neighbours (unlinking them next to moved ones) and new sleeps (reusing the
/// dropped ones' pool slots), time passing toward the slot: every sleep left fires at its
/// final deadline.
#[tokio::test(start_paused = true)]
async fn sleeps_moved_within_a_crowded_slot_among_drops_and_reuse_fire_on_time() {
    let wheel = Wheel::new();
    let t0 = Instant::now();
    let mut rng = Rng(0x5107);
    // (slot start, slot width): a second, a minute, an hour, each some way ahead.
    let slots = [
        (secs(5), secs(1)),
        (secs(180), secs(60)),
        (secs(3 * 3_600), secs(3_600)),
    ];
    let mut live: Vec<(tokio_wheel::Sleep, Instant)> = Vec::new();
    let in_slot = |rng: &mut Rng, s: usize| {
        let (start, width) = slots[s];
        t0 + start + Duration::from_micros(rng.below(width.as_micros() as u64))
    };
    for s in 0..slots.len() {
        for _ in 0..64 {
            let d = in_slot(&mut rng, s);
            let mut sleep = wheel.sleep_until(d);
            let _ = attack::poll_once(&mut sleep);
            live.push((sleep, d));
        }
    }
    let rounds = if full() { 2_000 } else { 300 };
    for round in 0..rounds {
        let at = rng.below(live.len() as u64) as usize;
        match rng.below(4) {
            0 | 1 => {
                // Earlier, staying in the slot (and in the future).
                let (sleep, d) = &mut live[at];
                let s = slots
                    .iter()
                    .position(|&(start, width)| *d < t0 + start + width)
                    .unwrap();
                let floor = (t0 + slots[s].0).max(Instant::now() + ms(1));
                if *d > floor {
                    let room = (*d - floor).as_micros() as u64;
                    *d -= Duration::from_micros(1 + rng.below(room));
                    Pin::new(sleep).reset(*d);
                }
            }
            2 => {
                drop(live.swap_remove(at));
            }
            _ => {
                let s = rng.below(slots.len() as u64) as usize;
                let d = in_slot(&mut rng, s);
                let mut sleep = wheel.sleep_until(d);
                let _ = attack::poll_once(&mut sleep);
                live.push((sleep, d));
            }
        }
        if round % 50 == 49 {
            // Let the actor apply them, and time pass (never into the first slot). Whole
            // milliseconds: after an advance off tokio's millisecond grid, tokio's own timers
            // (which the actor sleeps on) fire up to 1 ms later than the grid would.
            tokio::time::advance(ms(rng.below(40))).await;
            attack::settle().await;
        }
    }
    let log: Log = Arc::default();
    let expected = live.len();
    let mut tasks = Vec::new();
    for (sleep, d) in live {
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            sleep.await;
            log.lock()
                .unwrap()
                .push((format!("sleep {:?}", d - t0), d, Instant::now()));
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    if std::env::var_os("DBG").is_some() {
        let mut l = log.lock().unwrap().clone();
        l.sort_by_key(|x| x.2);
        for (n, d, at) in l.iter().take(40) {
            eprintln!("{n} d={:?} at={:?} late={:?}", *d - t0, *at - t0, *at - *d);
        }
    }
    check(&log, expected);
}
