//! Outside attacks, round 4, on moving timers earlier with other layouts and ticks (API.md
//! "Starting a wheel", §1 and §3): binary and tiny custom layouts (whose top level is soon
//! passed, so deadlines wait in the overflow list), and a 10 ms tick. A lone sleep or keyed
//! entry is filed at one deadline and moved to an earlier one, on and around every level's
//! span and far past the top: it fires at the new deadline, at most a tick late, in paused
//! time. Written from the contract and the public rustdoc only.

use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_wheel::{Layout, Wheel};

#[path = "support/attack.rs"]
mod attack;

#[path = "support/rng.rs"]
#[allow(dead_code)]
mod rng;
use rng::Rng;

fn full() -> bool {
    std::env::var_os("TOKIO_WHEEL_FULL").is_some()
}

/// Layouts and ticks under attack.
fn configs() -> Vec<(&'static str, Layout, Duration)> {
    let ms = Duration::from_millis;
    vec![
        ("binary, 1 ms", Layout::binary(), ms(1)),
        ("clock, 10 ms", Layout::clock(), ms(10)),
        ("binary, 10 ms", Layout::binary(), ms(10)),
        ("[4, 4], 1 ms", Layout::custom(&[4, 4]).unwrap(), ms(1)),
        (
            "[2, 3, 5], 1 ms",
            Layout::custom(&[2, 3, 5]).unwrap(),
            ms(1),
        ),
        (
            "[8, 8, 8], 1 ms",
            Layout::custom(&[8, 8, 8]).unwrap(),
            ms(1),
        ),
        ("[16, 2], 10 ms", Layout::custom(&[16, 2]).unwrap(), ms(10)),
    ]
}

/// Deadlines (from the wheel's start) on and around each level's span, and past the top.
fn points(layout: &Layout, tick: Duration) -> Vec<Duration> {
    let mut points = vec![tick, 2 * tick, tick * 3 / 2];
    let mut span = tick;
    for slots in layout.slots_per_level(tick).unwrap() {
        span = span.saturating_mul(slots);
        if span > Duration::from_secs(400 * 86_400) {
            break;
        }
        for at in [span, 2 * span] {
            points.extend([at - tick, at, at + tick, at + tick / 2]);
        }
    }
    // Past the top level (in the overflow list when the wheel is small).
    for times in [3, 10] {
        let at = span.saturating_mul(times);
        if at < Duration::from_secs(400 * 86_400) {
            points.extend([at - tick, at, at + tick]);
        }
    }
    points.sort();
    points.dedup();
    points
}

/// Where the clock is when the move happens: at the start, inside the first level, and
/// past a top-level wrap of the smallest layouts (whole milliseconds, on tokio's grid).
fn phases(tick: Duration) -> Vec<Duration> {
    vec![Duration::ZERO, tick * 3, tick * 37]
}

/// A wheel with this layout and tick.
fn wheel(layout: &Layout, tick: Duration) -> Wheel {
    Wheel::builder().layout(layout.clone()).tick(tick).build()
}

/// `(old, new)` pairs with `phase < new < old`: all of them, or `limit` drawn at random.
fn pairs(
    points: &[Duration],
    phase: Duration,
    limit: usize,
    rng: &mut Rng,
) -> Vec<(Duration, Duration)> {
    let mut all = Vec::new();
    for &old in points {
        for &new in points.iter().filter(|&&new| new < old && new > phase) {
            all.push((old, new));
        }
    }
    while all.len() > limit {
        let at = rng.below(all.len() as u64) as usize;
        all.swap_remove(at);
    }
    all
}

#[tokio::test(start_paused = true)]
async fn a_lone_sleep_moved_earlier_fires_at_the_new_deadline_on_any_layout() {
    let limit = if full() { usize::MAX } else { 120 };
    let mut rng = Rng(0x1a70);
    for (name, layout, tick) in configs() {
        let points = points(&layout, tick);
        for phase in phases(tick) {
            for (old, new) in pairs(&points, phase, limit, &mut rng) {
                let wheel = wheel(&layout, tick);
                let t0 = Instant::now();
                let mut sleep = wheel.sleep_until(t0 + old);
                let _ = attack::poll_once(&mut sleep);
                tokio::time::sleep(phase).await;
                Pin::new(&mut sleep).reset(t0 + new);
                sleep.await;
                let at = Instant::now() - t0;
                assert!(
                    at >= new && at - new <= tick,
                    "{name}: {old:?} -> {new:?} at {phase:?}: fired at {at:?}"
                );
                wheel.shutdown().await;
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_lone_keyed_entry_moved_earlier_fires_at_the_new_deadline_on_any_layout() {
    let limit = if full() { usize::MAX } else { 120 };
    let mut rng = Rng(0x1a71);
    for (name, layout, tick) in configs() {
        let points = points(&layout, tick);
        for phase in phases(tick) {
            for (i, (old, new)) in pairs(&points, phase, limit, &mut rng)
                .into_iter()
                .enumerate()
            {
                let wheel = wheel(&layout, tick);
                let (timers, mut expired) = wheel.keyed::<u8, u8>();
                let t0 = Instant::now();
                let handle = timers.insert_at(1, 2, t0 + old);
                let _ = timers.len().await;
                tokio::time::sleep(phase).await;
                let by_key = i % 2 == 1;
                if by_key {
                    timers.reset_at(&1, t0 + new);
                } else {
                    handle.reset_at(t0 + new);
                }
                let e = expired.next().await.unwrap();
                let at = Instant::now() - t0;
                let what = format!("{name}: {old:?} -> {new:?} at {phase:?}, by key: {by_key}");
                assert_eq!((e.deadline(), e.into_parts()), (t0 + new, (1, 2)), "{what}");
                assert!(at >= new && at - new <= tick, "{what}: fired at {at:?}");
                wheel.shutdown().await;
            }
        }
    }
}

/// 300 timers (sleeps and keyed entries) on a tiny layout, moved earlier through its
/// overflow list, a task reading the stream; see [`moved_through_the_overflow_list`].
#[tokio::test(start_paused = true)]
async fn timers_moved_earlier_through_the_overflow_list_fire_at_their_final_deadline() {
    let n = if full() { 3_000 } else { 300 };
    moved_through_the_overflow_list(n, true).await;
}

/// The same with 2 000 timers and the stream read only between the test's sleeps (no task
/// waiting on it). (With one `len()` round trip before reading, entries due 16 ms earlier,
/// at a top-level wrap, were not in the stream yet, and came after another: `len()` orders
/// commands, it does not wait for due entries to be sent. The reader-task variant shows them
/// sent on time.)
#[tokio::test(start_paused = true)]
async fn overflow_moves_fire_on_time_with_the_stream_read_between_sleeps() {
    moved_through_the_overflow_list(2_000, false).await;
}

/// `n` timers on a tiny layout ([4, 4] with 1 ms ticks: 16 ms before the overflow list),
/// filed up to two minutes ahead and moved earlier step by step while time passes (so
/// entries move out of the overflow list, and within it): each fires at its final deadline.
/// With `reader`, a task notes when each expiration arrives (at most a tick late);
/// without, the stream is read between sleeps and nothing may be left undelivered two ticks
/// after its deadline.
async fn moved_through_the_overflow_list(n: u64, reader: bool) {
    let tick = Duration::from_millis(1);
    let wheel = wheel(&Layout::custom(&[4, 4]).unwrap(), tick);
    let (timers, expired) = wheel.keyed::<u64, u64>();
    let t0 = Instant::now();
    let mut rng = Rng(0x0f10);
    // A reader notes when each expiration arrives (paused time: when the actor sent it).
    let (tx, mut arrived) = tokio::sync::mpsc::unbounded_channel();
    let mut direct = None;
    if reader {
        read_in_a_task(expired, tx);
    } else {
        direct = Some((expired, tx));
    }
    let mut deadlines: Vec<Instant> = (0..n)
        .map(|_| t0 + Duration::from_micros(1_000 + rng.below(120_000_000)))
        .collect();
    let handles: Vec<_> = (0..n)
        .map(|k| timers.insert_at(k, k, deadlines[k as usize]))
        .collect();
    let mut sleeps: Vec<_> = deadlines.iter().map(|&d| wheel.sleep_until(d)).collect();
    for s in &mut sleeps {
        let _ = attack::poll_once(s);
    }
    let mut fired = vec![false; n as usize];
    let mut sleep_done = vec![false; n as usize];
    // Moves, while whole milliseconds pass.
    for round in 0..200u64 {
        for _ in 0..n / 4 {
            let k = rng.below(n) as usize;
            let now = Instant::now();
            let Some(room) = deadlines[k].checked_duration_since(now + tick * 2) else {
                continue;
            };
            if fired[k] || sleep_done[k] || room.is_zero() {
                continue;
            }
            let new = deadlines[k] - Duration::from_micros(1 + rng.below(room.as_micros() as u64));
            deadlines[k] = new;
            if round % 2 == 0 {
                handles[k].reset_at(new);
            } else {
                timers.reset_at(&(k as u64), new);
            }
            Pin::new(&mut sleeps[k]).reset(new);
        }
        tokio::time::sleep(Duration::from_millis(rng.below(300))).await;
        // Let the actor catch up: until three rounds bring nothing new.
        let mut quiet = 0;
        while quiet < 3 {
            attack::settle().await;
            let _ = timers.len().await;
            attack::settle().await;
            if let Some((expired, tx)) = direct.as_mut() {
                // No reader task: what the stream holds now, with no arrival time.
                while let Poll::Ready(Some(e)) = attack::poll_once(&mut expired.next()) {
                    let _ = tx.send((*e.key() as usize, e.deadline(), None));
                }
            }
            quiet = if collect(&mut arrived, &deadlines, &mut fired, tick) == 0 {
                quiet + 1
            } else {
                0
            };
        }
        let now = Instant::now();
        for (k, d) in deadlines.iter().enumerate() {
            assert!(
                fired[k] || *d + tick * 2 > now,
                "key {k} not fired {:?} after",
                now - *d
            );
        }
        for (k, s) in sleeps.iter_mut().enumerate() {
            if !sleep_done[k] && attack::poll_once(s).is_ready() {
                assert!(Instant::now() >= deadlines[k], "sleep {k} early");
                sleep_done[k] = true;
            }
        }
    }
    // The rest: wait until each fires, keyed through the stream, sleeps in tasks.
    let mut tasks = Vec::new();
    for (k, s) in sleeps.into_iter().enumerate() {
        if !sleep_done[k] {
            let d = deadlines[k];
            tasks.push(tokio::spawn(async move {
                s.await;
                let at = Instant::now();
                assert!(at >= d && at - d <= tick, "sleep {k}: {:?} after", at - d);
            }));
        }
    }
    if let Some((expired, tx)) = direct.take() {
        read_in_a_task(expired, tx);
    }
    while fired.iter().any(|f| !f) {
        let (k, deadline, at) = arrived.recv().await.unwrap();
        check_one(k, deadline, at, &deadlines, &mut fired, tick);
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// What arrives: key, deadline, and when (if a task read it as it came).
type Arrival = (usize, Instant, Option<Instant>);

/// A task that reads `expired`, noting when each expiration arrives.
fn read_in_a_task(
    expired: tokio_wheel::Expirations<u64, u64>,
    tx: tokio::sync::mpsc::UnboundedSender<Arrival>,
) {
    tokio::spawn(expired.for_each(move |e| {
        let _ = tx.send((*e.key() as usize, e.deadline(), Some(Instant::now())));
        async {}
    }));
}

/// Reads the expirations that arrived; returns how many.
fn collect(
    arrived: &mut tokio::sync::mpsc::UnboundedReceiver<Arrival>,
    deadlines: &[Instant],
    fired: &mut [bool],
    tick: Duration,
) -> usize {
    let mut n = 0;
    while let Ok((k, deadline, at)) = arrived.try_recv() {
        check_one(k, deadline, at, deadlines, fired, tick);
        n += 1;
    }
    n
}

/// One expiration: its key's current deadline, once, never early, at most a tick late (API.md;
/// a burst of moves used to make it two: see `attack_round4_races.rs`).
fn check_one(
    k: usize,
    deadline: Instant,
    at: Option<Instant>,
    deadlines: &[Instant],
    fired: &mut [bool],
    tick: Duration,
) {
    assert!(!fired[k], "key {k} fired twice");
    assert_eq!(deadline, deadlines[k], "key {k}");
    assert!(Instant::now() >= deadline, "key {k} early");
    // Arrival noted by a reader task: at most a tick late. Read by the test between its
    // sleeps, lateness is judged by what is left undelivered instead.
    if let Some(at) = at {
        assert!(at >= deadline, "key {k} early");
        assert!(
            at - deadline <= tick,
            "key {k} fired {:?} late",
            at - deadline
        );
    }
    fired[k] = true;
}
