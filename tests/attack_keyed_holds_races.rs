//! Outside attack on API.md §3, keyed holds: moves by handle and by key racing the deadline
//! from threads on two workers (a later `reset` that returned before the deadline always
//! wins; a hold never starves the firing), set / remove / set scripts, and two clones of one
//! handle moving and taking. `RACE_STATS=1` prints how the `race_*` moves fell around the
//! deadline.
//!
//! Written from the contract (API.md, rustdoc) only. Each test checks an outcome the order of
//! the calls implies (value, `Expired::deadline`, fired or not, exactly once, never before the
//! deadline as read at delivery), never how long anything took. Real-time tests use
//! `tokio::time::timeout` of 60 s only as a hang guard. Shared helpers: `support/holds.rs`.

mod support;

use support::holds::*;

// ═══════════════════ real time: moves racing the deadline, 2 workers ═══════════════════

#[derive(Clone, Copy, Debug, PartialEq)]
enum Race {
    /// `h.reset_at(T + 20 ms)` (later: one store) near `T`.
    HandleLater,
    /// The word first pushed to `T + 500 ms` (the entry stays filed at `T`), then near `T`
    /// `h.reset_at(T + 20 ms)` (earlier than the word: a command that holds the entry).
    HandleEarlierCommand,
    /// `timers.reset_at(&k, T + 20 ms)` near `T`.
    ByKeyLater,
    /// `timers.reset_at(&k, T + 10 ms)` then `h.reset_at(T + 20 ms)` near `T`: the handle's
    /// move queues behind the by-key command.
    ByKeyThenHandle,
    /// `h.reset_at(T + 20 ms)` then `timers.reset_at(&k, T + 10 ms)` near `T`.
    HandleThenByKey,
    /// `h.reset_at(T − 2 ms)` (a command; due at once) then `h.reset_at(T + 20 ms)`.
    HandleEarlyThenLater,
}

/// Keys due 400 µs apart; two threads each make their keys' moves between 500 µs before the
/// deadline and 700 µs after it. Returns the broken rules.
fn race_round(mode: Race, round: u64) -> Vec<String> {
    const K: u64 = 240;
    let rt = two_workers();
    let wheel = rt.block_on(async { Wheel::new() });
    let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
    let base = Instant::now() + ms(40);
    let t_of = move |i: u64| base + us(i * 400);
    let handles: Arc<Vec<KeyedTimer<u64, u64>>> =
        Arc::new((0..K).map(|i| timers.insert_at(i, i, t_of(i))).collect());
    if mode == Race::HandleEarlierCommand {
        for (i, h) in handles.iter().enumerate() {
            h.reset_at(t_of(i as u64) + ms(500));
        }
    }
    let consumer = rt.spawn(async move {
        let got = read_n(&mut expired, K as usize).await;
        (got, expired)
    });
    let threads: Vec<_> = (0..2u64)
        .map(|j| {
            let handles = handles.clone();
            let timers = timers.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(round * 7 + j + 1);
                let mut rec = Vec::new();
                for i in (j..K).step_by(2) {
                    let t = t_of(i);
                    // From 500 µs before the deadline to 700 µs after it.
                    spin_until(t - us(500) + us(rng.below(1_200)));
                    let h = &handles[i as usize];
                    let (r1, r2);
                    match mode {
                        Race::HandleLater | Race::HandleEarlierCommand => {
                            h.reset_at(t + ms(20));
                            r1 = Instant::now();
                            r2 = r1;
                        }
                        Race::ByKeyLater => {
                            timers.reset_at(&i, t + ms(20));
                            r1 = Instant::now();
                            r2 = r1;
                        }
                        Race::ByKeyThenHandle => {
                            timers.reset_at(&i, t + ms(10));
                            r1 = Instant::now();
                            h.reset_at(t + ms(20));
                            r2 = Instant::now();
                        }
                        Race::HandleThenByKey => {
                            h.reset_at(t + ms(20));
                            r1 = Instant::now();
                            timers.reset_at(&i, t + ms(10));
                            r2 = Instant::now();
                        }
                        Race::HandleEarlyThenLater => {
                            h.reset_at(t - ms(2));
                            r1 = Instant::now();
                            h.reset_at(t + ms(20));
                            r2 = Instant::now();
                        }
                    }
                    rec.push((i, r1, r2));
                }
                rec
            })
        })
        .collect();
    let mut rec: HashMap<u64, (Instant, Instant)> = HashMap::new();
    for th in threads {
        for (i, r1, r2) in th.join().unwrap() {
            rec.insert(i, (r1, r2));
        }
    }
    let (got, mut expired) = rt.block_on(consumer).unwrap();
    let mut bad = Vec::new();
    let mut seen = HashSet::new();
    for (e, at) in &got {
        let i = *e.key();
        let t = t_of(i);
        let d = e.deadline();
        let (r1, r2) = rec[&i];
        let rel = |x: Instant| -> String {
            if x >= t {
                format!("+{:?}", x - t)
            } else {
                format!("-{:?}", t - x)
            }
        };
        let what = format!(
            "{mode:?} key {i}: fired for T{} (moves returned at T{} / T{})",
            rel(d),
            rel(r1),
            rel(r2)
        );
        if !seen.insert(i) {
            bad.push(format!("{what}: delivered twice"));
        }
        if *at < d {
            bad.push(format!("{what}: delivered early, at T{}", rel(*at)));
        }
        if handles[i as usize].deadline() != d {
            bad.push(format!(
                "{what}: handle's deadline() is T{}",
                rel(handles[i as usize].deadline())
            ));
        }
        let ok = match mode {
            Race::HandleLater => d == t + ms(20) || (d == t && r1 >= t),
            Race::HandleEarlierCommand => d == t + ms(20),
            Race::ByKeyLater => d == t + ms(20) || (d == t && r1 >= t),
            // The first move's deadline may fire before the second move is made when the
            // thread is preempted between the two (a loaded machine): then it is allowed.
            Race::ByKeyThenHandle => {
                d == t + ms(20) || (d == t && r2 >= t) || (d == t + ms(10) && r2 >= d)
            }
            Race::HandleThenByKey => {
                d == t + ms(10) || (d == t && r2 >= t) || (d == t + ms(20) && r2 >= d)
            }
            Race::HandleEarlyThenLater => d == t + ms(20) || d == t - ms(2) || (d == t && r1 >= t),
        };
        if !ok {
            bad.push(what);
        }
        if std::env::var("RACE_STATS").is_ok() {
            let close = if r1 < t {
                t - r1 < us(100)
            } else {
                r1 - t < us(100)
            };
            let k = if r1 < t {
                "before"
            } else if d == t {
                "after-old"
            } else {
                "after-new"
            };
            RSTATS
                .lock()
                .unwrap()
                .entry(format!(
                    "{mode:?} {k}{}",
                    if close { " (within 100us)" } else { "" }
                ))
                .and_modify(|n: &mut u64| *n += 1)
                .or_insert(1);
        }
    }
    // Nothing left, nothing more, and the stream ends once the handles and timers go.
    let n = rt.block_on(timers.len());
    if n != 0 {
        bad.push(format!("{mode:?}: len {n} after every key fired"));
    }
    drop(timers);
    drop(handles);
    let rest = rt.block_on(read_to_end(&mut expired));
    if !rest.is_empty() {
        bad.push(format!("{mode:?}: {} more expirations", rest.len()));
    }
    bad
}

fn race(mode: Race) {
    let mut bad = Vec::new();
    for round in 0..8 {
        bad.extend(race_round(mode, round));
    }
    if std::env::var("RACE_STATS").is_ok() {
        eprintln!("{:#?}", RSTATS.lock().unwrap());
    }
    assert!(bad.is_empty(), "{} broken:\n{}", bad.len(), bad.join("\n"));
}

/// A handle's later move (one store) that returned before the deadline always lands.
#[test]
fn race_handle_later_move_vs_expiry() {
    race(Race::HandleLater);
}

/// A handle's earlier move (a command, holding the entry) always lands here: the entry was
/// postponed to T + 500 ms long before, so it is live until T + 20 ms at least.
#[test]
fn race_handle_earlier_command_vs_lazy_refile() {
    race(Race::HandleEarlierCommand);
}

/// A by-key later move that returned before the deadline lands (API.md: "a `reset` racing
/// expiry fires once, never early"; commands take effect in order).
#[test]
fn race_by_key_later_move_vs_expiry() {
    race(Race::ByKeyLater);
}

/// By key then through the handle: the handle's move queues behind the command in flight
/// and is the one that ends up set (never T + 10 ms); if it returned before T it lands.
#[test]
fn race_by_key_then_handle_vs_expiry() {
    race(Race::ByKeyThenHandle);
}

/// Through the handle then by key: the by-key move is the last made, so never T + 20 ms.
#[test]
fn race_handle_then_by_key_vs_expiry() {
    race(Race::HandleThenByKey);
}

/// An earlier move (a command) then a later one through the same handle: never the old T when
/// the first returned before it.
#[test]
fn race_handle_earlier_then_later_vs_expiry() {
    race(Race::HandleEarlyThenLater);
}

// ═══════════════ real time: set / remove / set on one key from one handle ═══════════════

/// Four threads, 300 keys each, each key through one of six scripts made back to back
/// without waiting; afterwards `len` counts exactly the keys the scripts leave set, nothing
/// fires (stale handles' moves to now touch nothing), and `drain` returns the last values.
#[test]
fn set_remove_set_scripts_from_four_threads() {
    let rt = two_workers();
    let wheel = rt.block_on(async { Wheel::new() });
    let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
    for round in 0..5u64 {
        let threads: Vec<_> = (0..4u64)
            .map(|j| {
                let timers = timers.clone();
                std::thread::spawn(move || {
                    let mut keep = Vec::new();
                    let mut want = Vec::new();
                    for n in 0..300u64 {
                        let k = round * 10_000 + j * 1_000 + n;
                        match (n + round) % 6 {
                            0 => {
                                timers.set(k, 1, HOUR);
                                timers.remove(&k);
                                timers.set(k, 2, HOUR);
                                want.push((k, 2));
                            }
                            1 => {
                                let h = timers.insert(k, 1, HOUR);
                                h.remove();
                                let h2 = timers.insert(k, 2, HOUR);
                                h.reset_at(Instant::now());
                                h.remove();
                                keep.push(h);
                                keep.push(h2);
                                want.push((k, 2));
                            }
                            2 => {
                                timers.set(k, 1, HOUR);
                                timers.remove(&k);
                                timers.set(k, 2, HOUR);
                                timers.remove(&k);
                            }
                            3 => {
                                let h = timers.insert(k, 1, HOUR);
                                h.reset_at(Instant::now() + HOUR / 2); // earlier: a command
                                timers.set(k, 2, HOUR);
                                h.reset_at(Instant::now()); // stale
                                keep.push(h);
                                want.push((k, 2));
                            }
                            4 => {
                                let h = timers.insert(k, 1, HOUR);
                                timers.remove(&k);
                                h.reset_at(Instant::now()); // stale (removal in flight)
                                keep.push(h);
                            }
                            _ => {
                                let h = timers.insert(k, 1, HOUR);
                                // Earlier: a command. (Half an hour, not a few ms: a thread
                                // preempted between the two calls must not let it fire.)
                                h.reset_at(Instant::now() + HOUR / 2);
                                h.reset(HOUR); // later, behind it: wins
                                keep.push(h);
                                want.push((k, 1));
                            }
                        }
                    }
                    (keep, want)
                })
            })
            .collect();
        let mut keep = Vec::new();
        let mut want = Vec::new();
        for th in threads {
            let (k, w) = th.join().unwrap();
            keep.extend(k);
            want.extend(w);
        }
        let n = rt.block_on(timers.len());
        assert_eq!(n, want.len(), "round {round}: len");
        std::thread::sleep(ms(100));
        rt.block_on(async {
            tokio::task::yield_now().await;
        });
        if let Some(Some(e)) = expired.next().now_or_never() {
            panic!("round {round}: key {} fired (value {})", e.key(), e.value());
        }
        let mut got = rt.block_on(timers.drain());
        got.sort();
        want.sort();
        assert_eq!(got, want, "round {round}: drain");
        for h in &keep {
            assert!(h.is_stale());
        }
    }
}

// ═══════════════ real time: a hold must not starve the firing ═══════════════

/// An entry already due while two threads keep its handle's commands in flight (moves to
/// the past, alternating earlier and later, so one is always queued): the entry still fires,
/// once, while they are at it (they stop once it has, or after the hang guard). A loaded CI
/// machine once saw it held back for the whole guard: the actor waited for a moment with no
/// command in flight. It now waits only for the commands made before the entry was due (the
/// interleaving is replayed deterministically in `actor::keyed::tests`).
#[test]
fn moves_to_the_past_kept_in_flight_do_not_starve_the_firing() {
    let rt = two_workers();
    let wheel = rt.block_on(async { Wheel::new() });
    for by_key in [false, true] {
        let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
        let t = Instant::now() + ms(5);
        let h = timers.insert_at(1, 1, t + ms(10));
        let fired = Arc::new(AtomicBool::new(false));
        let gave_up = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..2u64)
            .map(|j| {
                let (h, timers, fired, gave_up) =
                    (h.clone(), timers.clone(), fired.clone(), gave_up.clone());
                std::thread::spawn(move || {
                    let until = std::time::Instant::now() + HANG;
                    let mut n = 0u64;
                    while !fired.load(Ordering::Relaxed) {
                        let d = t - us((n + j) % 2);
                        if by_key {
                            timers.reset_at(&1, d);
                        } else {
                            h.reset_at(d);
                        }
                        n += 1;
                        if std::time::Instant::now() > until {
                            gave_up.store(true, Ordering::Relaxed);
                            break;
                        }
                    }
                })
            })
            .collect();
        let e = rt.block_on(async { tokio::time::timeout(HANG, expired.next()).await });
        fired.store(true, Ordering::Relaxed);
        for th in threads {
            th.join().unwrap();
        }
        let e = e.expect("never fired").unwrap();
        assert!(
            !gave_up.load(Ordering::Relaxed),
            "by_key {by_key}: held back for the whole hang guard of moves"
        );
        assert!(e.deadline() <= t);
        drop(timers);
        drop(h);
        let rest = rt.block_on(read_to_end(&mut expired));
        assert!(rest.is_empty(), "by_key {by_key}: delivered again");
    }
}

// ═══════════════ real time: two clones of one handle, moving and taking ═══════════════

/// Per key, one thread moves the entry through one clone (earlier and later, around its
/// deadline) while another takes it through another clone at a random moment: every key ends
/// exactly once (taken with `Some`, or delivered — never both, never neither), never early.
#[test]
fn two_clones_moving_and_taking_around_the_deadline_end_each_key_once() {
    const K: u64 = 300;
    let rt = two_workers();
    for round in 0..6u64 {
        let wheel = rt.block_on(async { Wheel::new() });
        let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
        let base = Instant::now() + ms(30);
        let t_of = move |i: u64| base + us(i * 300);
        let handles: Arc<Vec<KeyedTimer<u64, u64>>> =
            Arc::new((0..K).map(|i| timers.insert_at(i, i, t_of(i))).collect());
        drop(timers);
        let consumer = rt.spawn(async move { read_to_end(&mut expired).await });
        let rth = rt.handle().clone();
        let mover = {
            let handles = handles.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(round * 5 + 1);
                let h: Vec<KeyedTimer<u64, u64>> = handles.iter().cloned().collect();
                for i in 0..K {
                    let t = t_of(i);
                    spin_until(t - us(400) + us(rng.below(800)));
                    for _ in 0..3 {
                        let d = if rng.chance(50) {
                            t - us(200)
                        } else {
                            t + us(rng.below(3_000))
                        };
                        h[i as usize].reset_at(d);
                    }
                }
            })
        };
        let taker = {
            let handles = handles.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(round * 5 + 2);
                let h: Vec<KeyedTimer<u64, u64>> = handles.iter().cloned().collect();
                let mut took = HashMap::new();
                for i in 0..K {
                    let t = t_of(i);
                    spin_until(t - us(400) + us(rng.below(1_000)));
                    took.insert(i, rth.block_on(h[i as usize].take()));
                }
                took
            })
        };
        mover.join().unwrap();
        let took = taker.join().unwrap();
        drop(handles);
        let got = rt.block_on(consumer).unwrap();
        let mut fired: HashMap<u64, u32> = HashMap::new();
        let mut bad = Vec::new();
        for (e, at) in &got {
            *fired.entry(*e.key()).or_default() += 1;
            if *at < e.deadline() {
                bad.push(format!("key {}: early", e.key()));
            }
        }
        for i in 0..K {
            let f = fired.get(&i).copied().unwrap_or(0);
            match (took[&i], f) {
                (Some(v), 0) if v == i => {}
                (None, 1) => {}
                (t, f) => bad.push(format!("key {i}: take {t:?}, delivered {f} times")),
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
