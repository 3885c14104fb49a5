//! Outside attack on API.md §3, keyed holds while a set stops: the last `Timers` going while
//! threads act through handles, shutdown in the middle of them, and stale handles and the
//! end of the stream.
//!
//! Written from the contract (API.md, rustdoc) only. Each test checks an outcome the order of
//! the calls implies (value, `Expired::deadline`, fired or not, exactly once, never before the
//! deadline as read at delivery), never how long anything took. Real-time tests use
//! `tokio::time::timeout` of 60 s only as a hang guard. Shared helpers: `support/holds.rs`.

mod support;

use support::holds::*;

// ═══════════════ real time: the last Timers goes while threads act through handles ═══════════════

#[derive(Debug, Clone, Copy)]
enum End {
    Took(Instant, Option<u64>),
    Removed(Instant),
}

/// 400 entries due 30–130 ms out; two threads move them through their handles (later: one
/// store; earlier: a command that holds the entry), and now and then take or remove one,
/// while the main thread drops the only `Timers` 20 ms in. Each entry ends exactly once (taken
/// with `Some`, or in the stream — a take answering `None` means it fired), a move that
/// returned before the deadline it fired for was never lost, a removal that returned before it
/// is never delivered, nothing is early, and the stream ends once all is done.
fn drop_round(round: u64) -> Vec<String> {
    const K: u64 = 400;
    let rt = two_workers();
    let wheel = rt.block_on(async { Wheel::new() });
    let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
    let start = Instant::now();
    let handles: Arc<Vec<KeyedTimer<u64, u64>>> = Arc::new(
        (0..K)
            .map(|i| timers.insert_at(i, i, start + ms(30) + us(i * 250)))
            .collect(),
    );
    let initial: Vec<(Instant, Instant)> = (0..K)
        .map(|i| (start + ms(30) + us(i * 250), start))
        .collect();
    let consumer = rt.spawn(async move { read_to_end(&mut expired).await });
    let stop = Arc::new(AtomicBool::new(false));
    let rth = rt.handle().clone();
    let threads: Vec<_> = (0..2u64)
        .map(|j| {
            let (handles, stop, rth) = (handles.clone(), stop.clone(), rth.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(round * 31 + j + 11);
                let mine: Vec<u64> = (j..K).step_by(2).collect();
                let mut moves: HashMap<u64, Vec<(Instant, Instant)>> = HashMap::new();
                let mut ends: HashMap<u64, End> = HashMap::new();
                while !stop.load(Ordering::Relaxed) {
                    for &i in &mine {
                        if ends.contains_key(&i) {
                            continue;
                        }
                        let h = &handles[i as usize];
                        match rng.below(100) {
                            0..=69 => {
                                let d = Instant::now() + us(rng.below(40_000));
                                h.reset_at(d);
                                moves.entry(i).or_default().push((d, Instant::now()));
                            }
                            70..=72 => {
                                let got = rth.block_on(h.take());
                                ends.insert(i, End::Took(Instant::now(), got));
                            }
                            73..=74 => {
                                h.remove();
                                ends.insert(i, End::Removed(Instant::now()));
                            }
                            _ => {}
                        }
                    }
                    std::thread::sleep(us(300));
                }
                (moves, ends)
            })
        })
        .collect();
    std::thread::sleep(ms(20));
    drop(timers); // the only clone: from now on only handles act
    std::thread::sleep(ms(130));
    stop.store(true, Ordering::Relaxed);
    let mut moves: HashMap<u64, Vec<(Instant, Instant)>> = HashMap::new();
    let mut ends: HashMap<u64, End> = HashMap::new();
    for th in threads {
        let (m, e) = th.join().unwrap();
        moves.extend(m);
        ends.extend(e);
    }
    let got = rt.block_on(consumer).unwrap();
    let mut bad = Vec::new();
    let mut fired: HashMap<u64, Vec<(Instant, Instant, u64)>> = HashMap::new();
    for (e, at) in &got {
        fired
            .entry(*e.key())
            .or_default()
            .push((e.deadline(), *at, *e.value()));
    }
    for i in 0..K {
        let f = fired.get(&i).cloned().unwrap_or_default();
        let mut all = vec![initial[i as usize]];
        all.extend(moves.get(&i).cloned().unwrap_or_default());
        let what = |s: &str| format!("key {i}: {s}");
        if f.len() > 1 {
            bad.push(what(&format!("delivered {} times", f.len())));
            continue;
        }
        match (ends.get(&i), f.first()) {
            (Some(End::Took(_, Some(v))), None) => {
                if *v != i {
                    bad.push(what("take returned another value"));
                }
            }
            (Some(End::Took(_, Some(_))), Some(_)) => {
                bad.push(what("taken with Some and delivered"))
            }
            (Some(End::Took(_, None)), None) => {
                bad.push(what("take answered None but it never fired"))
            }
            (Some(End::Removed(_)), None) => {}
            (None, None) => bad.push(what("never delivered (not taken, not removed)")),
            (end, Some(&(d, at, v))) => {
                if v != i {
                    bad.push(what("wrong value"));
                }
                if at < d {
                    bad.push(what("delivered before its deadline"));
                }
                match all.iter().position(|(md, _)| *md == d) {
                    None => bad.push(what("fired for a deadline no move set")),
                    Some(p) => {
                        if let Some((later, r)) = all[p + 1..].iter().find(|(_, r)| *r < d) {
                            bad.push(what(&format!(
                                "fired for {:?} though a later move (to {:?}) returned {:?} before that",
                                d - start,
                                *later - start,
                                d - *r
                            )));
                        }
                    }
                }
                match end {
                    Some(End::Took(r, None)) if *r < d => {
                        bad.push(what("take answered None before the deadline it fired for"))
                    }
                    Some(End::Removed(r)) if *r < d => bad.push(what(&format!(
                        "removed {:?} before the deadline it then fired for",
                        d - *r
                    ))),
                    _ => {}
                }
            }
        }
        if !handles[i as usize].is_stale() {
            bad.push(what("handle not stale after the stream ended"));
        }
    }
    rt.block_on(wheel.flush());
    let st = wheel.stats();
    if st.pending != 0 || st.inserted != st.fired + st.cancelled {
        bad.push(format!(
            "stats after the stream ended: pending {} inserted {} fired {} cancelled {}",
            st.pending, st.inserted, st.fired, st.cancelled
        ));
    }
    bad
}

#[test]
fn dropping_the_last_timers_while_threads_act_through_handles() {
    let mut bad = Vec::new();
    for round in 0..8 {
        bad.extend(
            drop_round(round)
                .into_iter()
                .map(|b| format!("round {round}: {b}")),
        );
    }
    assert!(bad.is_empty(), "{} broken:\n{}", bad.len(), bad.join("\n"));
}

// ═══════════════ real time: shutdown while threads act through handles and by key ═══════════════

/// Two threads set, insert, move (later and earlier, through current and stale handles),
/// remove and take their own keys (all due in an hour or more) while the main thread calls
/// `shutdown()`. A call that returned while `is_shutdown()` was still false was made before
/// the shutdown: what such calls left set arrives exactly once marked `is_shutdown`, with its
/// last value (and the deadline last set); what they removed never arrives.
fn shutdown_round(round: u64) -> Vec<String> {
    const KEYS_PER_THREAD: u64 = 48;
    let rt = two_workers();
    let wheel = rt.block_on(async { Wheel::new() });
    let (timers, mut expired) = rt.block_on(async { wheel.keyed::<u64, u64>() });
    let consumer = rt.spawn(async move { read_to_end(&mut expired).await });
    let rth = rt.handle().clone();
    let threads: Vec<_> = (0..2u64)
        .map(|j| {
            let (timers, wheel, rth) = (timers.clone(), wheel.clone(), rth.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(round * 131 + j + 3);
                let base = Instant::now() + HOUR;
                let keys: Vec<u64> = (0..KEYS_PER_THREAD).map(|n| j * 1000 + n).collect();
                // Per key: (value, deadline) if set; the current handle; the stale ones.
                let mut model: HashMap<u64, Option<(u64, Instant)>> = HashMap::new();
                let mut current: HashMap<u64, KeyedTimer<u64, u64>> = HashMap::new();
                let mut stale: Vec<KeyedTimer<u64, u64>> = Vec::new();
                let mut bad = Vec::new();
                let mut value = j * 1_000_000;
                let ambiguous;
                loop {
                    let k = keys[rng.below(keys.len() as u64) as usize];
                    value += 1;
                    let d = base + us(rng.below(600_000_000));
                    let op = rng.below(100);
                    let mut took: Option<(Option<u64>, Option<u64>)> = None; // (got, want)
                    match op {
                        0..=19 => {
                            let h = timers.insert_at(k, value, d);
                            if let Some(old) = current.insert(k, h) {
                                stale.push(old);
                            }
                            model.insert(k, Some((value, d)));
                        }
                        20..=29 => {
                            timers.set_at(k, value, d);
                            if let Some(old) = current.remove(&k) {
                                stale.push(old);
                            }
                            model.insert(k, Some((value, d)));
                        }
                        30..=59 => {
                            if let Some(h) = current.get(&k) {
                                h.reset_at(d);
                                if let Some(Some((_, dd))) = model.get_mut(&k) {
                                    *dd = d;
                                }
                            }
                        }
                        60..=64 => {
                            timers.reset_at(&k, d);
                            if let Some(Some((_, dd))) = model.get_mut(&k) {
                                *dd = d;
                            }
                        }
                        65..=71 => {
                            if let Some(h) = current.remove(&k) {
                                h.remove();
                                stale.push(h);
                                model.insert(k, None);
                            }
                        }
                        72..=78 => {
                            if let Some(h) = current.remove(&k) {
                                let got = rth.block_on(h.take());
                                let want = model.insert(k, None).flatten().map(|(v, _)| v);
                                took = Some((got, want));
                                stale.push(h);
                            }
                        }
                        79..=83 => {
                            timers.remove(&k);
                            if let Some(h) = current.remove(&k) {
                                stale.push(h);
                            }
                            model.insert(k, None);
                        }
                        84..=88 => {
                            let got = rth.block_on(timers.take(&k));
                            if let Some(h) = current.remove(&k) {
                                stale.push(h);
                            }
                            let want = model.insert(k, None).flatten().map(|(v, _)| v);
                            took = Some((got, want));
                        }
                        _ => {
                            // A stale handle: an earlier move (would be a command), a later
                            // one, a remove, a take; none may touch its key's later entry.
                            if !stale.is_empty() {
                                let h = &stale[rng.below(stale.len() as u64) as usize];
                                match rng.below(4) {
                                    0 => h.reset_at(Instant::now() + ms(1)),
                                    1 => h.reset_at(base + HOUR * 5),
                                    2 => h.remove(),
                                    _ => {
                                        if let Some(v) = rth.block_on(h.take()) {
                                            bad.push(format!(
                                                "a stale handle of key {} took {v}",
                                                h.key()
                                            ));
                                        }
                                    }
                                }
                            }
                        }
                    }
                    if wheel.is_shutdown() {
                        ambiguous = Some(k);
                        break;
                    }
                    if let Some((got, want)) = took {
                        if got != want {
                            bad.push(format!("key {k}: take answered {got:?}, {want:?} was set"));
                        }
                    }
                    if op % 16 == 0 {
                        std::thread::yield_now();
                    }
                }
                (model, ambiguous, bad)
            })
        })
        .collect();
    let mut rng = Rng::new(round + 99);
    std::thread::sleep(us(3_000 + rng.below(25_000)));
    rt.block_on(wheel.shutdown());
    let mut model = HashMap::new();
    let mut ambiguous = HashSet::new();
    let mut bad = Vec::new();
    for th in threads {
        let (m, a, b) = th.join().unwrap();
        model.extend(m);
        ambiguous.extend(a);
        bad.extend(b);
    }
    let got = rt.block_on(consumer).unwrap();
    let mut seen: HashMap<u64, Vec<&Expired<u64, u64>>> = HashMap::new();
    for (e, _) in &got {
        if !e.is_shutdown() {
            bad.push(format!(
                "key {}: fired, not flushed (due in an hour)",
                e.key()
            ));
        }
        seen.entry(*e.key()).or_default().push(e);
    }
    for (k, want) in &model {
        let s = seen.get(k).cloned().unwrap_or_default();
        if ambiguous.contains(k) {
            if s.len() > 1 {
                bad.push(format!("key {k}: delivered {} times", s.len()));
            }
            continue;
        }
        match (want, s.as_slice()) {
            (None, []) => {}
            (None, s) => bad.push(format!(
                "key {k}: removed before shutdown, delivered {} times",
                s.len()
            )),
            (Some(_), []) => bad.push(format!("key {k}: set before shutdown, never delivered")),
            (Some((v, d)), [e]) => {
                if e.value() != v {
                    bad.push(format!(
                        "key {k}: delivered value {}, last set {v}",
                        e.value()
                    ));
                }
                if e.deadline() != *d {
                    bad.push(format!(
                        "key {k}: delivered with a deadline other than the last set"
                    ));
                }
            }
            (Some(_), s) => bad.push(format!("key {k}: delivered {} times", s.len())),
        }
    }
    for k in seen.keys() {
        if !model.contains_key(k) {
            bad.push(format!("key {k}: delivered but never set"));
        }
    }
    // After the shutdown: calls answer empty, at once.
    if rt.block_on(timers.len()) != 0 || !rt.block_on(timers.drain()).is_empty() {
        bad.push("len/drain not empty after shutdown".into());
    }
    bad
}

#[test]
fn shutdown_while_threads_act_through_handles_applies_what_was_made_before_it() {
    let mut bad = Vec::new();
    for round in 0..10 {
        bad.extend(
            shutdown_round(round)
                .into_iter()
                .map(|b| format!("round {round}: {b}")),
        );
    }
    assert!(bad.is_empty(), "{} broken:\n{}", bad.len(), bad.join("\n"));
}

// ═══════════════ paused time: stale handles and the end of the stream ═══════════════

/// For each way a handle goes stale, with the stale handle's calls (an earlier move, a later
/// one, a remove) made just before the last `Timers` goes, and kept alive: the stream delivers
/// exactly what is pending (the replacement, if any) and then ends.
#[tokio::test(start_paused = true)]
async fn stale_handles_never_keep_the_stream_open() {
    for kind in 0..9 {
        for calls in 0..4 {
            let wheel = Wheel::new();
            let (timers, mut expired) = wheel.keyed::<u64, u64>();
            let t0 = Instant::now();
            let h = timers.insert(1, 1, ms(50));
            let h2 = h.clone();
            let mut want: Vec<(u64, u64, Instant)> = Vec::new();
            match kind {
                0 => {
                    timers.set(1, 2, ms(70));
                    want.push((1, 2, t0 + ms(70)));
                }
                1 => {
                    let _new = timers.insert(1, 2, ms(70));
                    want.push((1, 2, t0 + ms(70)));
                }
                2 => timers.remove(&1),
                3 => h2.remove(),
                4 => assert_eq!(timers.take(&1).await, Some(1)),
                5 => assert_eq!(h2.take().await, Some(1)),
                6 => assert_eq!(timers.drain().await, vec![(1, 1)]),
                7 => {
                    let e = expired.next().await.unwrap();
                    assert_eq!((*e.key(), *e.value(), e.deadline()), (1, 1, t0 + ms(50)));
                }
                _ => {
                    // Stale by a removal still in flight (no yield) behind an earlier move.
                    h2.reset_at(t0 + ms(10));
                    h2.remove();
                }
            }
            match calls {
                0 => {}
                1 => h.reset_at(Instant::now() + ms(5)),
                2 => h.reset(ms(500)),
                _ => {
                    h.reset_at(Instant::now() + ms(5));
                    h2.reset(ms(500));
                    h.remove();
                }
            }
            drop(timers);
            let mut got = Vec::new();
            let ended = tokio::time::timeout(Duration::from_secs(7_200), async {
                while let Some(e) = expired.next().await {
                    assert!(Instant::now() >= e.deadline());
                    got.push((*e.key(), *e.value(), e.deadline()));
                }
            })
            .await;
            assert!(
                ended.is_ok(),
                "kind {kind} calls {calls}: the stream stayed open; got {got:?}"
            );
            assert_eq!(got, want, "kind {kind} calls {calls}");
            assert!(h.is_stale(), "kind {kind} calls {calls}");
            assert_eq!(h.take().await, None, "kind {kind} calls {calls}");
        }
    }
}

/// A live handle after the last `Timers` went: its earlier move (a command), later move, take
/// and remove still act; the stream ends once the entry is gone.
#[tokio::test(start_paused = true)]
async fn a_live_handle_acts_after_the_last_timers_went() {
    for case in 0..6 {
        let wheel = Wheel::new();
        let (timers, mut expired) = wheel.keyed::<u64, u64>();
        let t0 = Instant::now();
        let h = timers.insert(1, 1, ms(50));
        let other = timers.insert(2, 2, ms(80));
        drop(timers);
        let want: Vec<(u64, u64, Instant)> = match case {
            0 => {
                h.reset_at(t0 + ms(10));
                vec![(1, 1, t0 + ms(10)), (2, 2, t0 + ms(80))]
            }
            1 => {
                h.reset(ms(200));
                vec![(2, 2, t0 + ms(80)), (1, 1, t0 + ms(200))]
            }
            2 => {
                assert_eq!(h.take().await, Some(1));
                vec![(2, 2, t0 + ms(80))]
            }
            3 => {
                h.remove();
                other.remove();
                vec![]
            }
            4 => {
                // An earlier move then a later one, both in flight when the actor looks.
                h.reset_at(t0 + ms(10));
                h.reset_at(t0 + ms(120));
                other.reset_at(t0);
                vec![(2, 2, t0), (1, 1, t0 + ms(120))]
            }
            _ => {
                h.reset_at(t0 + ms(10));
                assert_eq!(h.take().await, Some(1));
                assert_eq!(other.take().await, Some(2));
                vec![]
            }
        };
        let mut got = Vec::new();
        let ended = tokio::time::timeout(Duration::from_secs(7_200), async {
            while let Some(e) = expired.next().await {
                assert!(Instant::now() >= e.deadline());
                got.push((*e.key(), *e.value(), e.deadline()));
            }
        })
        .await;
        assert!(
            ended.is_ok(),
            "case {case}: the stream stayed open; got {got:?}"
        );
        assert_eq!(got, want, "case {case}");
    }
}

/// Holds never outlive their entry: an entry whose handle had a command in flight when it was
/// replaced, drained, taken or removed leaves the key's next entry free to fire on time.
#[tokio::test(start_paused = true)]
async fn a_hold_never_outlives_its_entry() {
    for case in 0..7 {
        let wheel = Wheel::new();
        let (timers, mut expired) = wheel.keyed::<u64, u64>();
        let t = Instant::now();
        let want = match case {
            0 => {
                let h = timers.insert(1, 1, HOUR);
                h.reset_at(t + ms(10));
                timers.set(1, 2, ms(20));
                (1, 2, t + ms(20))
            }
            1 => {
                let h = timers.insert(1, 1, ms(50));
                h.reset_at(t + ms(10)); // earlier: a command
                h.reset(ms(40)); // later, behind it
                h.clone().reset_at(t + ms(30)); // earlier again
                (1, 1, t + ms(30))
            }
            2 => {
                let h = timers.insert(1, 1, HOUR);
                h.reset_at(t + ms(10));
                assert_eq!(timers.drain().await, vec![(1, 1)]);
                let _h2 = timers.insert(1, 2, ms(20));
                (1, 2, t + ms(20))
            }
            3 => {
                let h = timers.insert(1, 1, HOUR);
                h.reset_at(t + ms(10));
                assert_eq!(timers.take(&1).await, Some(1));
                timers.set(1, 3, ms(20));
                (1, 3, t + ms(20))
            }
            4 => {
                let h = timers.insert(1, 1, HOUR);
                h.reset_at(t + ms(10));
                h.remove();
                let _h2 = timers.insert(1, 2, ms(20));
                h.reset_at(t); // stale
                (1, 2, t + ms(20))
            }
            5 => {
                let h = timers.insert(1, 1, ms(40));
                timers.reset_at(&1, t + ms(10)); // by key, earlier
                h.reset(ms(30)); // later: behind the by-key command
                timers.remove(&1);
                timers.set(1, 4, ms(20));
                (1, 4, t + ms(20))
            }
            _ => {
                let h = timers.insert(1, 1, ms(40));
                h.reset_at(t - ms(1)); // due at once (a command)
                h.reset(HOUR); // later, queued behind: wins
                let e = tokio::time::timeout(ms(100), expired.next()).await;
                assert!(
                    e.is_err(),
                    "case {case}: fired though moved an hour out: {e:?}"
                );
                assert_eq!(h.deadline(), t + HOUR);
                (1, 1, t + HOUR)
            }
        };
        let e = tokio::time::timeout(Duration::from_secs(7_200), expired.next())
            .await
            .unwrap_or_else(|_| panic!("case {case}: never fired"))
            .unwrap();
        assert!(Instant::now() >= e.deadline());
        assert_eq!((*e.key(), *e.value(), e.deadline()), want, "case {case}");
        assert_eq!(
            Instant::now(),
            want.2,
            "case {case}: fired late (paused time, exact)"
        );
        assert_eq!(timers.len().await, 0);
    }
}
