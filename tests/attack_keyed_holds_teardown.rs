//! Outside attack on API.md §3, keyed holds at a set's teardown: every `Timers` clone dropped
//! at once right after commands, the actor's runtime going away, and an idle set staying idle
//! after a drain that follows a firing (once a finding: the actor spun on a core, and paused
//! time never advanced).
//!
//! Written from the contract (API.md, rustdoc) only. Each test checks an outcome the order of
//! the calls implies (value, `Expired::deadline`, fired or not, exactly once, never before the
//! deadline as read at delivery), never how long anything took. Real-time tests use
//! `tokio::time::timeout` of 60 s only as a hang guard. Shared helpers: `support/holds.rs`.

mod support;

use support::holds::*;

// ═══════════════ real time: every Timers clone dropped at once, right after commands ═══════════════

/// Four threads, each with its own `Timers` clone, set keys due within 20 ms, remove and set
/// some again, move some through handles (earlier: a command, then later), take a few, and
/// drop their clone at once with the main thread's: the stream delivers exactly what was left
/// set, once each, never early, and ends; every `take` answered `Some` iff its key is not in
/// the stream. A `remove` that returned only at or after its set's deadline (due within
/// microseconds) raced the expiry: that set may have fired once first (CI saw it once).
#[test]
fn every_clone_dropped_at_once_right_after_commands() {
    let rt = two_workers();
    for round in 0..30u64 {
        let wheel = rt.block_on(async { Wheel::new() });
        let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
        let consumer = rt.spawn(async move { read_to_end(&mut expired).await });
        let barrier = Arc::new(std::sync::Barrier::new(5));
        let rth = rt.handle().clone();
        let threads: Vec<_> = (0..4u64)
            .map(|j| {
                let (timers, barrier, rth) = (timers.clone(), barrier.clone(), rth.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng::new(round * 17 + j + 5);
                    // key -> Some((value, deadline)) left set; handles kept alive (stale or not).
                    let mut model: HashMap<u64, Option<(u64, Instant)>> = HashMap::new();
                    let mut takes: Vec<(u64, Option<u64>)> = Vec::new();
                    let mut keep = Vec::new();
                    let mut early_ok = Vec::new();
                    // Keys removed only once their first deadline had passed.
                    let mut racy = Vec::new();
                    barrier.wait();
                    for n in 0..60u64 {
                        let k = j * 1_000 + n;
                        let d = Instant::now() + us(rng.below(20_000));
                        match n % 6 {
                            0 | 1 => {
                                timers.set_at(k, 1, d);
                                model.insert(k, Some((1, d)));
                            }
                            2 => {
                                timers.set_at(k, 1, d);
                                timers.remove(&k);
                                if Instant::now() < d {
                                    model.insert(k, None);
                                } else {
                                    // Removed at or after its deadline: it may have fired first.
                                    racy.push(k);
                                }
                            }
                            3 => {
                                timers.set_at(k, 1, d);
                                timers.remove(&k);
                                if Instant::now() >= d {
                                    racy.push(k);
                                }
                                timers.set_at(k, 2, d + ms(1));
                                model.insert(k, Some((2, d + ms(1))));
                            }
                            4 => {
                                let h = timers.insert_at(k, 1, d + ms(10));
                                h.reset_at(d); // earlier: a command
                                h.reset_at(d + ms(2)); // later, behind it
                                let r2 = Instant::now();
                                if r2 < d {
                                    model.insert(k, Some((1, d + ms(2))));
                                } else {
                                    // It may have fired at `d` before the later move was made.
                                    early_ok.push((k, d, d + ms(2)));
                                    model.insert(k, None);
                                }
                                keep.push(h);
                            }
                            _ => {
                                timers.set_at(k, 1, d);
                                if rng.chance(50) {
                                    let got = rth.block_on(timers.take(&k));
                                    takes.push((k, got));
                                    model.insert(k, None); // fixed below from the answer
                                } else {
                                    model.insert(k, Some((1, d)));
                                }
                            }
                        }
                    }
                    drop(timers);
                    (model, takes, keep, early_ok, racy)
                })
            })
            .collect();
        barrier.wait();
        drop(timers);
        let mut model = HashMap::new();
        let mut takes = Vec::new();
        let mut keep = Vec::new();
        let mut either = Vec::new();
        let mut racy = HashSet::new();
        for th in threads {
            let (m, t, k, e, r) = th.join().unwrap();
            model.extend(m);
            takes.extend(t);
            keep.extend(k);
            either.extend(e);
            racy.extend(r);
        }
        let got = rt.block_on(consumer).unwrap();
        let mut bad = Vec::new();
        let mut seen: HashMap<u64, (u64, Instant)> = HashMap::new();
        let mut racy_fired = HashSet::new();
        for (e, at) in &got {
            if *at < e.deadline() {
                bad.push(format!("key {}: early", e.key()));
            }
            let first = (*e.value(), e.deadline());
            if racy.contains(e.key()) {
                // Its first set may have fired before the remove (value 1), then its second
                // set, if any (value 2): each at most once.
                if first.0 == 1 && !racy_fired.insert(*e.key()) {
                    bad.push(format!("key {}: its first set delivered twice", e.key()));
                }
                if first.0 == 1 {
                    continue;
                }
            }
            if seen.insert(*e.key(), first).is_some() {
                bad.push(format!("key {}: delivered twice", e.key()));
            }
        }
        for (k, got) in &takes {
            match (got, seen.remove(k)) {
                (Some(1), None) => {}
                (None, Some(_)) => {}
                (g, s) => bad.push(format!("key {k}: take {g:?}, delivered {s:?}")),
            }
        }
        for (k, d1, d2) in &either {
            match seen.remove(k) {
                Some((1, d)) if d == *d1 || d == *d2 => {}
                g => bad.push(format!(
                    "key {k}: moved to d then d + 2 ms, delivered {g:?}"
                )),
            }
        }
        let took: HashSet<u64> = takes.iter().map(|(k, _)| *k).collect();
        let either: HashSet<u64> = either.iter().map(|(k, _, _)| *k).collect();
        for k in &racy {
            if !model.contains_key(k) {
                // Case 2: removed after its deadline; fired once (above) or not at all.
                seen.remove(k);
            }
        }
        for (k, want) in &model {
            if took.contains(k) || either.contains(k) {
                continue;
            }
            match (want, seen.remove(k)) {
                (None, None) => {}
                (Some(w), Some(g)) if *w == g => {}
                (w, g) => bad.push(format!("key {k}: left {w:?}, delivered {g:?}")),
            }
        }
        for k in seen.keys() {
            bad.push(format!("key {k}: delivered, never set"));
        }
        for h in &keep {
            if !h.is_stale() {
                bad.push(format!(
                    "key {}: handle not stale after the stream ended",
                    h.key()
                ));
            }
        }
        assert!(
            bad.is_empty(),
            "round {round}: {} broken:\n{}",
            bad.len(),
            bad.join("\n")
        );
    }
}

// ═══════════════ the actor's runtime goes away ═══════════════

/// "Every command made before `shutdown()` is called (or before the actor's runtime goes
/// away) is applied before the shutdown flush." Commands made back to back with no yield
/// (sets, replacements, handle moves earlier and later, removes through handles and by key),
/// then the runtime is dropped: the stream, read afterwards on another executor, delivers each
/// entry left set exactly once marked `is_shutdown` with its last value and deadline, never a
/// removed one, and ends.
#[test]
fn commands_made_before_the_runtime_goes_away_are_applied_before_the_flush() {
    for flavor in 0..2 {
        let rt = if flavor == 0 {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        } else {
            two_workers()
        };
        let wheel = rt.block_on(async { Wheel::new() });
        let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
        let t = Instant::now() + HOUR;
        let mut want: Vec<(u64, u64, Instant)> = Vec::new();
        let mut keep = Vec::new();
        for k in 0..200u64 {
            match k % 5 {
                0 => {
                    timers.set_at(k, 1, t);
                    timers.set_at(k, 2, t + ms(k));
                    want.push((k, 2, t + ms(k)));
                }
                1 => {
                    let h = timers.insert_at(k, 1, t);
                    h.reset_at(t - ms(k)); // earlier: a command
                    h.reset_at(t + ms(k)); // later, behind it
                    want.push((k, 1, t + ms(k)));
                    keep.push(h);
                }
                2 => {
                    let h = timers.insert_at(k, 1, t);
                    h.reset_at(t - ms(1));
                    h.remove();
                    keep.push(h);
                }
                3 => {
                    let h = timers.insert_at(k, 1, t);
                    timers.remove(&k);
                    timers.set_at(k, 3, t);
                    h.reset_at(t - ms(5)); // stale
                    want.push((k, 3, t));
                    keep.push(h);
                }
                _ => {
                    let h = timers.insert_at(k, 1, t);
                    timers.reset_at(&k, t - ms(3)); // by key, earlier
                    h.reset_at(t + ms(3)); // later, behind it
                    want.push((k, 1, t + ms(3)));
                    keep.push(h);
                }
            }
        }
        drop(rt);
        let mut got = Vec::new();
        let ended = std::thread::spawn(move || {
            futures::executor::block_on(async {
                while let Some(e) = expired.next().await {
                    got.push((*e.key(), *e.value(), e.deadline(), e.is_shutdown()));
                }
            });
            got
        });
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(ended.join());
        });
        let got = rx
            .recv_timeout(HANG)
            .unwrap_or_else(|_| {
                panic!("flavor {flavor}: the stream did not end after the runtime went away")
            })
            .unwrap();
        assert!(
            got.iter().all(|g| g.3),
            "flavor {flavor}: an entry not marked is_shutdown"
        );
        let mut got: Vec<(u64, u64, Instant)> =
            got.into_iter().map(|(k, v, d, _)| (k, v, d)).collect();
        got.sort();
        want.sort();
        let missing: Vec<_> = want.iter().filter(|w| !got.contains(w)).collect();
        let extra: Vec<_> = got.iter().filter(|g| !want.contains(g)).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "flavor {flavor}: missing {} {missing:?}\nextra {} {extra:?}",
            missing.len(),
            extra.len()
        );
        for h in &keep {
            assert!(h.is_stale());
        }
        drop(timers);
    }
}

// ═══════════════ an idle set stays idle after a drain ═══════════════

/// `Stats::wakeups`: "It stays still while nothing is due and no command arrives." After an
/// entry fired and the set was drained (empty or not), nothing is due and no command comes:
/// the set's actor must sleep, not turn over and over (a core at 100 %).
#[test]
fn an_idle_set_stays_idle_after_a_drain_that_follows_a_firing() {
    let rt = two_workers();
    for with_entry in [false, true] {
        let wheel = rt.block_on(async { Wheel::new() });
        let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
        timers.set(1, 1, ms(5));
        let e = rt
            .block_on(async { tokio::time::timeout(HANG, expired.next()).await })
            .unwrap()
            .unwrap();
        assert_eq!(*e.key(), 1);
        if with_entry {
            timers.set(2, 2, HOUR);
        }
        rt.block_on(timers.drain());
        let before = wheel.stats().wakeups;
        std::thread::sleep(ms(300));
        let turns = wheel.stats().wakeups - before;
        assert!(
            turns < 100,
            "with_entry {with_entry}: the set's actor turned {turns} times in 300 ms with nothing due and no command"
        );
    }
}

/// The same under paused time: an actor that never goes idle keeps the paused clock from
/// advancing, so a plain `sleep` after the drain never completes. (Run on its own thread, with
/// a 60 s hang guard.)
#[test]
fn paused_time_still_advances_after_a_drain_that_follows_a_firing() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        paused_runtime().block_on(async {
            let wheel = Wheel::new();
            let (timers, mut expired) = wheel.keyed::<u64, u64>();
            timers.set(1, 1, ms(5));
            expired.next().await.unwrap();
            tokio::time::sleep(ms(80)).await;
            assert!(timers.drain().await.is_empty());
            tokio::time::sleep(ms(150)).await;
        });
        let _ = tx.send(());
    });
    // The spinning thread (if any) is left behind; the process ends with the test run.
    assert!(
        rx.recv_timeout(HANG).is_ok(),
        "a 150 ms sleep (paused time) after set → fire → drain never completed within 60 s: the set's actor never idles"
    );
}
