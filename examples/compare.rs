//! tokio-wheel side by side with `tokio::time`, `tokio_util::time::DelayQueue` and (for
//! timeouts) `pingora-timeout`: every
//! scenario of BENCHMARKS.md in one run, printed as markdown tables (medians, spread, ratios).
//!
//! Run: `cargo run --release --example compare` (several minutes), or `-- --quick` (seconds,
//! n = 10^4 only, as CI does). `-- --sizes 10000,100000` picks the sizes.

#[path = "../benches/support/scenarios.rs"]
mod scenarios;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use scenarios::*;
use tokio_wheel::Wheel;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const OURS: &str = "tokio-wheel";
/// The largest n the fire scenario runs at.
const FIRE_MAX: usize = 100_000;

/// One measured quantity: samples per system, lower is better.
struct Table {
    title: String,
    unit: &'static str,
    /// (row label, system) → samples.
    cells: BTreeMap<(String, String), Vec<f64>>,
    rows: Vec<String>,
    systems: Vec<String>,
}

impl Table {
    fn new(title: &str, unit: &'static str) -> Table {
        Table {
            title: title.to_owned(),
            unit,
            cells: BTreeMap::new(),
            rows: Vec::new(),
            systems: Vec::new(),
        }
    }

    fn add(&mut self, row: &str, system: &str, value: f64) {
        if !self.rows.iter().any(|r| r == row) {
            self.rows.push(row.to_owned());
        }
        if !self.systems.iter().any(|s| s == system) {
            self.systems.push(system.to_owned());
        }
        self.cells
            .entry((row.to_owned(), system.to_owned()))
            .or_default()
            .push(value);
    }

    fn median(&self, row: &str, system: &str) -> Option<f64> {
        let mut samples = self
            .cells
            .get(&(row.to_owned(), system.to_owned()))?
            .clone();
        samples.sort_by(f64::total_cmp);
        Some(samples[samples.len() / 2])
    }

    fn print(&self) {
        println!(
            "\n### {} ({}; median [min–max]; lower is better)\n",
            self.title, self.unit
        );
        let ours: Vec<&String> = self
            .systems
            .iter()
            .filter(|s| s.starts_with(OURS))
            .collect();
        let mut header = format!("| {} |", "case");
        for system in &self.systems {
            header += &format!(" {system} |");
        }
        for system in &ours {
            header += &format!(" {system} vs best peer |");
        }
        println!("{header}");
        println!("|{}", "---|".repeat(1 + self.systems.len() + ours.len()));
        for row in &self.rows {
            let mut line = format!("| {row} |");
            for system in &self.systems {
                let cell = match self.cells.get(&(row.clone(), system.clone())) {
                    Some(samples) => {
                        let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
                        let max = samples.iter().copied().fold(0.0, f64::max);
                        let median = self.median(row, system).unwrap();
                        if samples.len() > 1 {
                            format!("{} [{}–{}]", fmt(median), fmt(min), fmt(max))
                        } else {
                            fmt(median)
                        }
                    }
                    None => "–".to_owned(),
                };
                line += &format!(" {cell} |");
            }
            let best_peer = self
                .systems
                .iter()
                .filter(|s| !s.starts_with(OURS))
                .filter_map(|s| self.median(row, s))
                .fold(f64::INFINITY, f64::min);
            for system in &ours {
                let ratio = match self.median(row, system) {
                    Some(value) if best_peer.is_finite() && value > 0.0 => {
                        format!(
                            "**{:.2}×** {}",
                            best_peer / value,
                            if best_peer >= value {
                                "better"
                            } else {
                                "worse"
                            }
                        )
                    }
                    _ => "–".to_owned(),
                };
                line += &format!(" {ratio} |");
            }
            println!("{line}");
        }
    }
}

fn fmt(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

struct Progress {
    done: usize,
    total: usize,
}

impl Progress {
    fn step(&mut self, what: &str) {
        self.done += 1;
        let width = 30;
        let filled = width * self.done / self.total.max(1);
        eprint!(
            "\r[{}{}] {:>3}/{} {:<48}",
            "#".repeat(filled),
            " ".repeat(width - filled),
            self.done,
            self.total,
            what
        );
        let _ = std::io::stderr().flush();
    }
}

fn ns_per(duration: Duration, ops: usize) -> f64 {
    duration.as_nanos() as f64 / ops as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let sizes: Vec<usize> = match args.iter().position(|a| a == "--sizes") {
        Some(i) => args[i + 1]
            .split(',')
            .map(|s| s.parse().expect("--sizes 10000,100000"))
            .collect(),
        None if quick => vec![10_000],
        None => vec![10_000, 100_000, 1_000_000],
    };
    let reps = if quick { 2 } else { 5 };
    // `--only NAME` runs one scenario group (schedule, postpone, churn, memory, fire,
    // producers, idle), e.g. under a profiler.
    let only = args
        .iter()
        .position(|a| a == "--only")
        .map(|i| args[i + 1].clone());
    let wanted = |name: &str| only.as_deref().is_none_or(|only| only == name);
    let rounds = 10;
    let producer_pairs = if quick { 20_000 } else { 200_000 };
    let runtime = runtime();
    let handle = runtime.handle().clone();
    let wheel = move || Wheel::builder().runtime(handle.clone()).build();

    let per_size = reps * (3 + 1 + 2 * 5 + 3) + 5 + 4;
    let mut progress = Progress {
        done: 0,
        total: sizes.len() * per_size + 3 * reps * 3 + if quick { 0 } else { 2 },
    };

    let mut schedule = Table::new(
        "Schedule: register n timers (deadlines in [1 s, 60 s])",
        "ns per timer",
    );
    let mut cancel = Table::new("Cancel: drop or remove those n timers", "ns per timer");
    let mut timeouts = Table::new(
        "Timeouts: wrap a pending future, poll once, drop before the deadline",
        "ns per timeout",
    );
    let mut postpone = Table::new("Postpone: move each of n timers 10 times", "ns per move");
    let mut churn = Table::new(
        "Keyed churn: 4n random ops (½ reset, ¼ remove, ¼ set)",
        "ns per op",
    );
    let mut fire_cpu = Table::new(
        "Fire: n timers over 1 s on 2 workers",
        "CPU ns per fired timer",
    );
    let mut lateness = Table::new("Fire: lateness", "µs, p50 / p99 / max rows");
    let mut memory = Table::new("Memory per pending timer", "heap bytes");
    let mut producers = Table::new(
        "Many producers: register + cancel pairs from P tasks at once",
        "ns per pair",
    );
    let mut idle = Table::new(
        "Idle: 2 s with 10^5 far-future timers pending",
        "CPU ms (wheel wake-ups)",
    );

    for &n in &sizes {
        let delays = Arc::new(Rng(42).delays(n));
        let label = format!("n = {n}");
        for _ in 0..reps {
            if !wanted("schedule") {
                break;
            }
            progress.step(&format!("schedule+cancel n={n}"));
            let (s, c) = on_worker(&runtime, schedule_cancel_tokio(delays.clone()));
            schedule.add(&label, "tokio::time", ns_per(s, n));
            cancel.add(&label, "tokio::time", ns_per(c, n));
            progress.step(&format!("schedule+cancel n={n}"));
            let (s, c) = on_worker(&runtime, schedule_cancel_delay_queue(delays.clone()));
            schedule.add(&label, "DelayQueue", ns_per(s, n));
            cancel.add(&label, "DelayQueue", ns_per(c, n));
            progress.step(&format!("schedule+cancel n={n}"));
            let r = on_worker(&runtime, schedule_cancel_wheel(wheel(), delays.clone()));
            schedule.add(&label, OURS, ns_per(r.scheduled, n));
            cancel.add(&label, OURS, ns_per(r.cancelled, n));
            schedule.add(
                &label,
                "tokio-wheel (caller side only)",
                ns_per(r.caller_scheduled, n),
            );
            cancel.add(
                &label,
                "tokio-wheel (caller side only)",
                ns_per(r.caller_cancelled, n),
            );
        }
        for _ in 0..reps {
            if !wanted("timeouts") {
                break;
            }
            progress.step(&format!("timeouts n={n}"));
            let d = on_worker(&runtime, timeout_churn_tokio(delays.clone()));
            timeouts.add(&label, "tokio::time::timeout", ns_per(d, n));
            let d = on_worker(&runtime, timeout_churn_pingora(delays.clone()));
            timeouts.add(&label, "pingora fast_timeout", ns_per(d, n));
            let d = on_worker(&runtime, timeout_churn_wheel(wheel(), delays.clone()));
            timeouts.add(&label, OURS, ns_per(d, n));
        }
        for how in [Move::Later, Move::Earlier] {
            let row = format!("{how:?}, n = {n}");
            let moves = n * rounds as usize;
            for _ in 0..reps {
                if !wanted("postpone") {
                    break;
                }
                progress.step(&format!("postpone {how:?} n={n}"));
                let d = on_worker(&runtime, postpone_tokio(n, rounds, how));
                postpone.add(&row, "tokio Sleep::reset", ns_per(d, moves));
                progress.step(&format!("postpone {how:?} n={n}"));
                let d = on_worker(&runtime, postpone_delay_queue(n, rounds, how));
                postpone.add(&row, "&mut DelayQueue::reset", ns_per(d, moves));
                progress.step(&format!("postpone {how:?} n={n}"));
                let d = on_worker(&runtime, postpone_shared_delay_queue(n, rounds, how));
                postpone.add(&row, "Mutex<DelayQueue>::reset", ns_per(d, moves));
                progress.step(&format!("postpone {how:?} n={n}"));
                let d = on_worker(&runtime, postpone_wheel(wheel(), n, rounds, how));
                postpone.add(&row, "tokio-wheel Sleep::reset", ns_per(d, moves));
                progress.step(&format!("postpone {how:?} n={n}"));
                let d = on_worker(&runtime, postpone_keyed(wheel(), n, rounds, how));
                postpone.add(&row, "tokio-wheel Timers::reset", ns_per(d, moves));
            }
        }
        let ops = Arc::new(churn_ops(n, 4 * n));
        for _ in 0..reps {
            if !wanted("churn") {
                break;
            }
            progress.step(&format!("keyed churn n={n}"));
            let d = on_worker(&runtime, churn_delay_queue(n, ops.clone()));
            churn.add(&label, "&mut DelayQueue + HashMap", ns_per(d, ops.len()));
            progress.step(&format!("keyed churn n={n}"));
            let d = on_worker(&runtime, churn_shared_delay_queue(n, ops.clone()));
            churn.add(&label, "Mutex<DelayQueue + HashMap>", ns_per(d, ops.len()));
            progress.step(&format!("keyed churn n={n}"));
            let d = on_worker(&runtime, churn_keyed(wheel(), n, ops.clone()));
            churn.add(&label, "tokio-wheel Timers", ns_per(d, ops.len()));
        }
        if wanted("memory") {
            progress.step(&format!("memory n={n}"));
            let b = on_worker(&runtime, bytes_per_timer(n, None, hold_tokio_sleeps));
            memory.add(&label, "tokio Box<Sleep>", b);
            let b = on_worker(&runtime, bytes_per_timer(n, None, hold_delay_queue));
            memory.add(&label, "DelayQueue entry", b);
            progress.step(&format!("memory n={n}"));
            let w = wheel();
            let b = on_worker(
                &runtime,
                bytes_per_timer(n, Some(w.clone()), move |n| hold_wheel_sleeps(w, n)),
            );
            memory.add(&label, "tokio-wheel Sleep", b);
            progress.step(&format!("memory n={n}"));
            let w = wheel();
            let b = on_worker(
                &runtime,
                bytes_per_timer(n, Some(w.clone()), move |n| hold_wheel_jobs(w, n)),
            );
            memory.add(&label, "tokio-wheel job", b);
            progress.step(&format!("memory n={n}"));
            let w = wheel();
            let b = on_worker(
                &runtime,
                bytes_per_timer(n, Some(w.clone()), move |n| hold_keyed(w, n)),
            );
            memory.add(&label, "tokio-wheel keyed entry", b);
            progress.step(&format!("memory n={n}"));
        }

        for round in 0..4 {
            // Above ~6·10^5 pending tokio sleeps in FuturesUnordered shards, tokio's side of
            // this harness stops making progress (BENCHMARKS.md): fire is measured up to 10^5.
            if !wanted("fire") || n > FIRE_MAX {
                break;
            }
            progress.step(&format!("fire n={n} ({round}/4)"));
            let mut record = |system: &str, report: FireReport| {
                fire_cpu.add(&label, system, report.cpu_per_timer.as_nanos() as f64);
                let us = |d: Duration| d.as_nanos() as f64 / 1_000.0;
                lateness.add(&format!("{label} p50"), system, us(report.percentile(0.5)));
                lateness.add(&format!("{label} p99"), system, us(report.percentile(0.99)));
                lateness.add(&format!("{label} max"), system, us(report.max()));
            };
            match round {
                0 => record("tokio::time", on_worker(&runtime, fire_tokio(n))),
                1 => record("DelayQueue", on_worker(&runtime, fire_delay_queue(n))),
                2 => record(
                    "tokio-wheel Sleep",
                    on_worker(&runtime, fire_wheel(wheel(), n)),
                ),
                _ => record(
                    "tokio-wheel keyed",
                    on_worker(&runtime, fire_keyed(wheel(), n)),
                ),
            }
        }
    }

    for tasks in [2, 8, 64] {
        let row = format!("P = {tasks}");
        let per_task = producer_pairs / tasks;
        for _ in 0..reps {
            if !wanted("producers") {
                break;
            }
            progress.step(&format!("producers P={tasks}"));
            let d = on_worker(&runtime, producers_tokio(tasks, per_task));
            producers.add(&row, "tokio::time", ns_per(d, per_task * tasks));
            progress.step(&format!("producers P={tasks}"));
            let d = on_worker(&runtime, producers_shared_delay_queue(tasks, per_task));
            producers.add(&row, "Mutex<DelayQueue>", ns_per(d, per_task * tasks));
            progress.step(&format!("producers P={tasks}"));
            let d = on_worker(&runtime, producers_wheel(wheel(), tasks, per_task));
            producers.add(&row, OURS, ns_per(d, per_task * tasks));
        }
    }

    if !quick && wanted("idle") {
        progress.step("idle tokio");
        let report = on_worker(&runtime, idle_tokio(100_000));
        idle.add("n = 100000", "tokio::time", report.cpu.as_secs_f64() * 1e3);
        progress.step("idle tokio-wheel");
        let report = on_worker(&runtime, idle_wheel(wheel(), 100_000));
        idle.add("n = 100000", OURS, report.cpu.as_secs_f64() * 1e3);
        idle.add(
            "n = 100000 (wake-ups)",
            OURS,
            report.wakeups.unwrap_or(0) as f64,
        );
    }
    eprintln!();

    println!("## tokio-wheel vs tokio::time vs DelayQueue\n");
    println!(
        "`cargo run --release --example compare{}` · {} repetitions · 2 Tokio workers",
        if quick { " -- --quick" } else { "" },
        reps
    );
    for table in [
        &schedule, &cancel, &timeouts, &postpone, &churn, &producers, &fire_cpu, &lateness,
        &memory, &idle,
    ] {
        if !table.rows.is_empty() {
            table.print();
        }
    }
}
