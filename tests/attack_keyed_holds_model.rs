//! Outside attack on API.md §3, keyed holds (a `KeyedTimer`'s queued command holds its entry
//! back from firing): random scripts of one task's calls under paused time, against a
//! sequential model.
//!
//! `random_scripts_match_a_sequential_model` takes `SCRIPTS=n` (default 4000; `NO_DRAIN=1`
//! skips drains), `SEED=n` (one seed, traced); `MINIMISE=seed cargo test … minimise --
//! --ignored --nocapture` shrinks a failing seed (each try in a child process, so a hang is
//! killed after 10 s).
//!
//! Written from the contract (API.md, rustdoc) only. Each test checks an outcome the order of
//! the calls implies (value, `Expired::deadline`, fired or not, exactly once, never before the
//! deadline as read at delivery), never how long anything took. Real-time tests use
//! `tokio::time::timeout` of 60 s only as a hang guard. Shared helpers: `support/holds.rs`.

mod support;

use support::holds::*;

// ════════════════════════ paused time: a model of one task's calls ════════════════════════

#[derive(Clone, Debug)]
struct MEntry {
    value: u64,
    deadline: Instant,
    generation: u64,
}

struct MHandle {
    key: u64,
    generation: u64,
    timer: KeyedTimer<u64, u64>,
}

struct Model {
    start: Instant,
    slot: u64, // now == start + 5 ms + slot * 10 ms
    entries: HashMap<u64, MEntry>,
    /// For each generation that went: the deadline it had when it went.
    gone: HashMap<u64, Instant>,
    next_generation: u64,
    handles: Vec<MHandle>,
    log: Vec<String>,
}

impl Model {
    fn now(&self) -> Instant {
        self.start + ms(5 + self.slot * 10)
    }
    fn go(&mut self, key: u64) -> Option<MEntry> {
        let e = self.entries.remove(&key)?;
        self.gone.insert(e.generation, e.deadline);
        Some(e)
    }
    fn set(&mut self, key: u64, value: u64, deadline: Instant) -> u64 {
        self.go(key);
        let generation = self.next_generation;
        self.next_generation += 1;
        self.entries.insert(
            key,
            MEntry {
                value,
                deadline,
                generation,
            },
        );
        generation
    }
    fn live(&self, h: &MHandle) -> Option<&MEntry> {
        self.entries
            .get(&h.key)
            .filter(|e| e.generation == h.generation)
    }
    fn due(&self) -> Vec<u64> {
        let now = self.now();
        let mut v: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| e.deadline <= now)
            .map(|(k, _)| *k)
            .collect();
        v.sort();
        v
    }
}

async fn collect_due(m: &mut Model, expired: &mut Expirations<u64, u64>, what: &str) {
    let due = m.due();
    let before = Instant::now();
    let mut want: Vec<(u64, u64, Instant)> = Vec::new();
    for k in &due {
        let e = m.go(*k).unwrap();
        want.push((*k, e.value, e.deadline));
    }
    let mut got = Vec::new();
    for _ in 0..want.len() {
        let e = tokio::time::timeout(Duration::from_secs(7_300), expired.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{what}: an expected expiration never came\n{}",
                    m.log.join("\n")
                )
            })
            .expect("stream ended early");
        assert!(
            Instant::now() >= e.deadline(),
            "{what}: delivered before its deadline\n{}",
            m.log.join("\n")
        );
        assert!(!e.is_shutdown());
        got.push((*e.key(), *e.value(), e.deadline()));
    }
    assert_eq!(
        Instant::now(),
        before,
        "{what}: the due expirations were not there without time passing; want {want:?} got {got:?}\n{}",
        m.log.join("\n")
    );
    got.sort();
    want.sort();
    assert_eq!(got, want, "{what}: wrong expirations\n{}", m.log.join("\n"));
    FIRED.fetch_add(got.len() as u64, Ordering::Relaxed);
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    if let Some(Some(e)) = expired.next().now_or_never() {
        panic!(
            "{what}: unexpected expiration {:?} at slot {}\n{}",
            (e.key(), e.value(), e.deadline() - m.start),
            m.slot,
            m.log.join("\n")
        );
    }
}

async fn sync(m: &mut Model, timers: &Timers<u64, u64>, expired: &mut Expirations<u64, u64>) {
    let due = m.due().len();
    let n = timers.len().await;
    let count = m.entries.len();
    assert!(
        n <= count && n + due >= count,
        "len {n}, model {count} ({due} due)\n{}",
        m.log.join("\n")
    );
    collect_due(m, expired, "sync").await;
    check_handles(m, true);
}

/// `barrier`: a `len` has just answered, so the actor has applied every command made so far.
/// Without one the actor may not have got to a removal or replacement yet (`is_stale` is "as
/// far as the actor has got"), so only a live handle is checked then.
fn check_handles(m: &Model, barrier: bool) {
    for (i, h) in m.handles.iter().enumerate() {
        match m.live(h) {
            Some(e) => {
                assert!(
                    !h.timer.is_stale(),
                    "handle {i} (key {}) stale while live\n{}",
                    h.key,
                    m.log.join("\n")
                );
                if !barrier {
                    continue;
                }
                assert_eq!(
                    h.timer.deadline(),
                    e.deadline,
                    "handle {i} (key {}) deadline\n{}",
                    h.key,
                    m.log.join("\n")
                );
            }
            None if !barrier => {}
            None => {
                assert!(
                    h.timer.is_stale(),
                    "handle {i} (key {}) not stale after it went\n{}",
                    h.key,
                    m.log.join("\n")
                );
                assert_eq!(
                    h.timer.deadline(),
                    m.gone[&h.generation],
                    "stale handle {i} (key {}): not the deadline the entry had when it went\n{}",
                    h.key,
                    m.log.join("\n")
                );
            }
        }
    }
}

/// A deadline: `Some(j)` is `start + 10 ms · j` (`j` may be at or before now), `None` is an
/// hour from now.
type D = Option<u64>;

#[derive(Clone, Debug)]
enum Op {
    SetAt(u64, D),
    Insert(u64, D, bool),
    Reset(u64, D, bool),
    HReset(usize, D, bool),
    Remove(u64),
    HRemove(usize),
    Take(u64),
    HTake(usize),
    Yield,
    Advance(u64),
    Drain,
    Len,
    /// Take one entry due now (`r` picks it), through a handle if `bool`.
    TakeDue(u64, bool),
}

fn gen_ops(seed: u64) -> Vec<Op> {
    let mut rng = Rng::new(seed);
    let mut slot = 0u64;
    let mut handles = 0usize;
    let mut ops = Vec::new();
    for _ in 0..70 {
        let key = rng.below(3);
        let d: D = if rng.chance(10) {
            None
        } else {
            Some((slot as i64 - 1 + rng.below(7) as i64).max(0) as u64)
        };
        let rel = rng.chance(50);
        let op = match rng.below(14) {
            0 => Op::SetAt(key, d),
            1 | 2 => {
                handles += 1;
                Op::Insert(key, d, rel)
            }
            3 => Op::Reset(key, d, rel),
            4..=6 if handles > 0 => Op::HReset(rng.below(handles as u64) as usize, d, rel),
            7 => Op::Remove(key),
            8 if handles > 0 => Op::HRemove(rng.below(handles as u64) as usize),
            9 => Op::Take(key),
            10 if handles > 0 => Op::HTake(rng.below(handles as u64) as usize),
            11 => Op::Yield,
            12 => {
                let n = 1 + rng.below(3);
                slot += n;
                Op::Advance(n)
            }
            13 if rng.chance(30) => Op::Drain,
            13 => Op::Len,
            _ => continue,
        };
        ops.push(op);
        if rng.chance(25) {
            ops.push(Op::TakeDue(rng.next(), rng.chance(50)));
        }
    }
    ops
}

async fn run_script(seed: u64) {
    replay(seed, &gen_ops(seed)).await
}

async fn replay(seed: u64, ops: &[Op]) {
    let mut rng = Rng::new(seed ^ 0x5555);
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u64, u64>();
    let start = Instant::now();
    tokio::time::sleep(ms(5)).await;
    let mut m = Model {
        start,
        slot: 0,
        entries: HashMap::new(),
        gone: HashMap::new(),
        next_generation: 0,
        handles: Vec::new(),
        log: vec![format!("seed {seed}")],
    };
    let mut value = 100;
    for (idx, op) in ops.iter().enumerate() {
        value += 1;
        let now = m.now();
        let chosen: &D = match op {
            Op::SetAt(_, d) | Op::Insert(_, d, _) | Op::Reset(_, d, _) | Op::HReset(_, d, _) => d,
            _ => &None,
        };
        let (d, dlog) = match chosen {
            None => (now + HOUR, "now+1h".to_string()),
            Some(j) => (start + ms(10 * j), format!("{}ms", 10 * j)),
        };
        let rel = matches!(
            op,
            Op::Insert(_, _, true) | Op::Reset(_, _, true) | Op::HReset(_, _, true)
        ) && d > now;
        let t = m.slot * 10 + 5;
        if std::env::var("SEED").is_ok() {
            let mut es: Vec<_> = m
                .entries
                .iter()
                .map(|(k, e)| {
                    (
                        *k,
                        e.value,
                        e.generation,
                        (e.deadline - m.start).as_millis(),
                    )
                })
                .collect();
            es.sort();
            let hs: Vec<_> = m.handles.iter().map(|h| (h.key, h.generation)).collect();
            eprintln!("[t={t}] {op:?}  entries(k,v,gen,ms) {es:?} handles(k,gen) {hs:?}");
        }
        match op {
            Op::SetAt(key, _) => {
                let key = *key;
                m.log
                    .push(format!("[t={t}] set_at({key}, {value}, {dlog})"));
                timers.set_at(key, value, d);
                m.set(key, value, d);
            }
            Op::Insert(key, _, _) => {
                let key = *key;
                m.log.push(format!(
                    "[t={t}] h{} = insert({key}, {value}, {dlog}) rel={rel}",
                    m.handles.len()
                ));
                let timer = if rel {
                    timers.insert(key, value, d - now)
                } else {
                    timers.insert_at(key, value, d)
                };
                let generation = m.set(key, value, d);
                m.handles.push(MHandle {
                    key,
                    generation,
                    timer,
                });
            }
            Op::Reset(key, _, _) => {
                m.log
                    .push(format!("[t={t}] reset(&{key}, {dlog}) rel={rel}"));
                if rel {
                    timers.reset(key, d - now)
                } else {
                    timers.reset_at(key, d)
                }
                if let Some(e) = m.entries.get_mut(key) {
                    e.deadline = d;
                }
            }
            Op::HReset(i, _, _) => {
                let i = *i;
                if i >= m.handles.len() {
                    continue;
                }
                m.log.push(format!("[t={t}] h{i}.reset({dlog}) rel={rel}"));
                if rel {
                    m.handles[i].timer.reset(d - now)
                } else {
                    m.handles[i].timer.reset_at(d)
                }
                let (k, g) = (m.handles[i].key, m.handles[i].generation);
                if let Some(e) = m.entries.get_mut(&k).filter(|e| e.generation == g) {
                    e.deadline = d;
                }
            }
            Op::Remove(key) => {
                m.log.push(format!("[t={t}] remove(&{key})"));
                timers.remove(key);
                m.go(*key);
            }
            Op::HRemove(i) => {
                let i = *i;
                if i >= m.handles.len() {
                    continue;
                }
                m.log.push(format!("[t={t}] h{i}.remove()"));
                m.handles[i].timer.remove();
                if m.live(&m.handles[i]).is_some() {
                    let k = m.handles[i].key;
                    m.go(k);
                }
            }
            Op::Take(key) => {
                m.log.push(format!("[t={t}] take(&{key})"));
                let got = timers.take(key).await;
                let want = m.go(*key).map(|e| e.value);
                assert_eq!(got, want, "take(&{key})\n{}", m.log.join("\n"));
            }
            Op::HTake(i) => {
                let i = *i;
                if i >= m.handles.len() {
                    continue;
                }
                m.log.push(format!("[t={t}] h{i}.take()"));
                let got = m.handles[i].timer.take().await;
                let want = if m.live(&m.handles[i]).is_some() {
                    let k = m.handles[i].key;
                    m.go(k).map(|e| e.value)
                } else {
                    None
                };
                assert_eq!(got, want, "h{i}.take()\n{}", m.log.join("\n"));
            }
            Op::Yield => {
                m.log.push(format!("[t={t}] yield"));
                tokio::task::yield_now().await;
            }
            Op::Advance(n) => {
                m.log.push(format!("[t={t}] advance {}ms", n * 10));
                tokio::time::sleep(ms(10 * n)).await;
                m.slot += n;
                assert_eq!(Instant::now(), m.now());
                collect_due(&mut m, &mut expired, "advance").await;
                check_handles(&m, false);
            }
            Op::Drain if std::env::var("NO_DRAIN").is_ok() => {}
            Op::Drain => {
                m.log.push(format!("[t={t}] drain"));
                let mut got = timers.drain().await;
                got.sort();
                let mut want: Vec<(u64, u64)> =
                    m.entries.iter().map(|(k, e)| (*k, e.value)).collect();
                want.sort();
                for (k, _) in &want {
                    m.go(*k);
                }
                assert_eq!(got, want, "drain\n{}", m.log.join("\n"));
            }
            Op::Len => {
                m.log.push(format!("[t={t}] len"));
                sync(&mut m, &timers, &mut expired).await;
            }
            Op::TakeDue(r, via_handle) => {
                // Either answer is authoritative for an entry already due.
                let due = m.due();
                if due.is_empty() {
                    continue;
                }
                let k = due[(*r % due.len() as u64) as usize];
                let via = m
                    .handles
                    .iter()
                    .position(|h| m.live(h).is_some() && h.key == k);
                let got = match via {
                    Some(i) if *via_handle => {
                        m.log.push(format!("[t={t}] h{i}.take() [due]"));
                        m.handles[i].timer.take().await
                    }
                    _ => {
                        m.log.push(format!("[t={t}] take(&{k}) [due]"));
                        timers.take(&k).await
                    }
                };
                if let Some(v) = got {
                    assert_eq!(
                        v,
                        m.entries[&k].value,
                        "take of a due entry\n{}",
                        m.log.join("\n")
                    );
                    m.go(k);
                }
            }
        }
        // Let entries due now fire before the next call (unless the next op takes one).
        if !m.due().is_empty() && !matches!(ops.get(idx + 1), Some(Op::TakeDue(..))) {
            m.log.push(format!("[t={t}] sync"));
            sync(&mut m, &timers, &mut expired).await;
        }
    }
    m.log.push("final sync".into());
    sync(&mut m, &timers, &mut expired).await;

    // Drop every Timers clone but keep the handles: what is pending still fires (live handles
    // still act, an earlier move through one included), then the stream ends.
    drop(timers);
    for i in 0..m.handles.len() {
        if m.live(&m.handles[i]).is_some() && rng.chance(50) {
            let d = m.now() + ms(10 + 10 * rng.below(3));
            m.log
                .push(format!("after drop: h{i}.reset_at({:?})", d - m.start));
            m.handles[i].timer.reset_at(d);
            let k = m.handles[i].key;
            m.entries.get_mut(&k).unwrap().deadline = d;
        }
    }
    let mut want: Vec<(u64, u64, Instant)> = m
        .entries
        .iter()
        .map(|(k, e)| (*k, e.value, e.deadline))
        .collect();
    want.sort();
    let mut got = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(7_300), expired.next()).await {
            Ok(Some(e)) => {
                assert!(
                    Instant::now() >= e.deadline(),
                    "early after drop\n{}",
                    m.log.join("\n")
                );
                got.push((*e.key(), *e.value(), e.deadline()));
            }
            Ok(None) => break,
            Err(_) => panic!(
                "stream did not end after every Timers was dropped; got {got:?} want {want:?}\n{}",
                m.log.join("\n")
            ),
        }
    }
    got.sort();
    assert_eq!(
        got,
        want,
        "after the last Timers went\n{}",
        m.log.join("\n")
    );
    for (i, h) in m.handles.iter().enumerate() {
        assert!(
            h.timer.is_stale(),
            "handle {i} not stale after the stream ended\n{}",
            m.log.join("\n")
        );
        assert_eq!(h.timer.take().await, None);
    }
}

fn ops_to_string(ops: &[Op]) -> String {
    let d = |d: &D| d.map_or("-".to_string(), |j| j.to_string());
    ops.iter()
        .map(|op| match op {
            Op::SetAt(k, x) => format!("S,{k},{}", d(x)),
            Op::Insert(k, x, r) => format!("I,{k},{},{}", d(x), *r as u8),
            Op::Reset(k, x, r) => format!("R,{k},{},{}", d(x), *r as u8),
            Op::HReset(i, x, r) => format!("H,{i},{},{}", d(x), *r as u8),
            Op::Remove(k) => format!("M,{k}"),
            Op::HRemove(i) => format!("N,{i}"),
            Op::Take(k) => format!("T,{k}"),
            Op::HTake(i) => format!("U,{i}"),
            Op::Yield => "Y".into(),
            Op::Advance(n) => format!("A,{n}"),
            Op::Drain => "D".into(),
            Op::Len => "L".into(),
            Op::TakeDue(r, b) => format!("Q,{r},{}", *b as u8),
        })
        .collect::<Vec<_>>()
        .join(";")
}

fn ops_from_string(s: &str) -> Vec<Op> {
    s.split(';')
        .filter(|t| !t.is_empty())
        .map(|t| {
            let f: Vec<&str> = t.split(',').collect();
            let n = |i: usize| f[i].parse::<u64>().unwrap();
            let d = |i: usize| if f[i] == "-" { None } else { Some(n(i)) };
            match f[0] {
                "S" => Op::SetAt(n(1), d(2)),
                "I" => Op::Insert(n(1), d(2), n(3) == 1),
                "R" => Op::Reset(n(1), d(2), n(3) == 1),
                "H" => Op::HReset(n(1) as usize, d(2), n(3) == 1),
                "M" => Op::Remove(n(1)),
                "N" => Op::HRemove(n(1) as usize),
                "T" => Op::Take(n(1)),
                "U" => Op::HTake(n(1) as usize),
                "Y" => Op::Yield,
                "A" => Op::Advance(n(1)),
                "D" => Op::Drain,
                "L" => Op::Len,
                "Q" => Op::TakeDue(n(1), n(2) == 1),
                x => panic!("bad op {x}"),
            }
        })
        .collect()
}

/// Replays `OPS` (for the minimiser, which runs it in a child process so a hang can be killed).
#[test]
#[ignore = "a tool for `minimise`"]
fn replay_ops_from_env() {
    let ops = ops_from_string(&std::env::var("OPS").expect("OPS"));
    let seed = std::env::var("MINIMISE").map_or(0, |s| s.parse().unwrap());
    paused_runtime().block_on(replay(seed, &ops));
}

/// `None`: passes; `Some("HANG")`: still running after 10 s; else the panic's first line.
fn outcome(seed: u64, ops: &[Op]) -> Option<String> {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "replay_ops_from_env",
            "--ignored",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("OPS", ops_to_string(ops))
        .env("MINIMISE", seed.to_string())
        .env_remove("SEED")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            if status.success() {
                return None;
            }
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr).to_string();
            let first = err
                .lines()
                .skip_while(|l| !l.contains("panicked at"))
                .nth(1)
                .unwrap_or("?")
                .to_string();
            return Some(first);
        }
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            return Some("HANG".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Minimises a failing seed's script:
/// `MINIMISE=seed cargo test … minimise -- --ignored --nocapture`.
#[test]
#[ignore = "a tool: shrinks a failing script of random_scripts_match_a_sequential_model"]
fn minimise() {
    let seed: u64 = std::env::var("MINIMISE")
        .expect("MINIMISE=seed")
        .parse()
        .unwrap();
    let mut ops = gen_ops(seed);
    let first = outcome(seed, &ops).expect("the seed passes");
    println!("failure: {first}");
    let kind = first.split(':').next().unwrap_or("").to_string();
    let mut i = 0;
    while i < ops.len() {
        let mut fewer = ops.clone();
        fewer.remove(i);
        match outcome(seed, &fewer) {
            Some(msg) if msg.starts_with(&kind) => ops = fewer,
            _ => i += 1,
        }
    }
    println!("OPS={}", ops_to_string(&ops));
    println!("{ops:#?}");
}

#[tokio::test(start_paused = true)]
async fn random_scripts_match_a_sequential_model() {
    let seeds: Vec<u64> = match std::env::var("SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => (1..=std::env::var("SCRIPTS").map_or(4000, |s| s.parse().unwrap())).collect(),
    };
    for seed in seeds {
        if std::env::var("PROGRESS").is_ok() {
            eprintln!("seed {seed}");
        }
        run_script(seed).await;
    }
    eprintln!("fired checked: {}", FIRED.load(Ordering::Relaxed));
}
