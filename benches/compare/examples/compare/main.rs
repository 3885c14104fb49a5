//! tokio-wheel side by side with `tokio::time`, `tokio_util::time::DelayQueue`,
//! `pingora-timeout` (timeouts), `kestrel-timer` and `hierarchical_hash_wheel_timer`: every
//! scenario of BENCHMARKS.md in one run, printed as markdown tables (medians, spread, ratios).
//!
//! Run: `cargo run --release -p tokio-wheel-compare --example compare` (several minutes), or `-- --quick` (seconds,
//! n = 10^4 only, as CI does).
//!
//! Options:
//! - `--sizes 10000,100000` picks the sizes (default 10^4, 10^5, 10^6; `--quick`: 10^4).
//! - `--memory-sizes 10000,10000000` picks the sizes of the memory scenario (default: the
//!   sizes; `--full` adds 10^7).
//! - `--full`: memory also at 10^7 (several GiB of heap while it runs).
//! - `--only NAME` runs one scenario group: idle, schedule, ready, timeouts, postpone, keyed,
//!   churn, producers, keyed-producers, requests, fire, memory (e.g. under a profiler).
//! - `--reps 9` sets the repetitions reported per case (default 5; `--quick`: 2).
//! - `--shards 1` sets how many actors each keyed set runs (default: one per worker, 2).
//! - `--request-tasks 64,256` picks the task counts of the requests scenario (default 128).
//!
//! Which peer is in which scenario, and why not elsewhere: see the head of
//! `benches/compare/src/lib.rs`.

use std::sync::Arc;

use tokio_wheel::Wheel;
use tokio_wheel_compare::*;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const OURS: &str = "tokio-wheel";
const OURS_CALLER: &str = "tokio-wheel (caller side only)";
const TOKIO: &str = "tokio::time";
const DELAY_QUEUE: &str = "DelayQueue";
const KESTREL: &str = "kestrel-timer";
const HASH_WHEEL: &str = "hierarchical_hash_wheel_timer";
const HASH_WHEEL_CALLER: &str = "hierarchical_hash_wheel_timer (caller side only)";
/// The requests scenario's floor: the same work with no timer.
const NO_TIMER: &str = "no timer";
/// Marks a column that is not end to end: never taken as the best peer.
const CALLER_SIDE: &str = "caller side only";
/// The number of far-future timers pending in the idle scenario.
const IDLE_TIMERS: usize = 100_000;

mod memory;
mod report;
use report::{Progress, Table, ns_per, parse_sizes};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let full = args.iter().any(|a| a == "--full");
    let sizes = parse_sizes(&args, "--sizes").unwrap_or_else(|| {
        if quick {
            vec![10_000]
        } else {
            vec![10_000, 100_000, 1_000_000]
        }
    });
    let memory_sizes = parse_sizes(&args, "--memory-sizes").unwrap_or_else(|| {
        let mut memory_sizes = sizes.clone();
        if full && !memory_sizes.contains(&10_000_000) {
            memory_sizes.push(10_000_000);
        }
        memory_sizes
    });
    // Repetitions reported; each system also runs one warm-up repetition first, not reported.
    let reps = parse_sizes(&args, "--reps")
        .and_then(|reps| reps.first().copied())
        .unwrap_or(if quick { 2 } else { 5 });
    let only = args
        .iter()
        .position(|a| a == "--only")
        .map(|i| args[i + 1].clone());
    let wanted = |name: &str| only.as_deref().is_none_or(|only| only == name);
    // Idle takes 2 s per system: not in the quick run unless asked for by name.
    let run_idle = wanted("idle") && (!quick || only.is_some());
    let rounds = 10;
    let producer_pairs = if quick { 20_000 } else { 200_000 };
    let producer_counts = [2, 8, 64];
    let request_tasks = parse_sizes(&args, "--request-tasks").unwrap_or_else(|| vec![128]);
    let requests_total = if quick { 50_000 } else { 256_000 };
    let runtime = runtime();
    let handle = runtime.handle().clone();
    // Keyed sets' shards (`Builder::shards`); default: one per worker.
    let shards = parse_sizes(&args, "--shards").and_then(|shards| shards.first().copied());
    let new_wheel = move || {
        let builder = Wheel::builder().runtime(handle.clone());
        match shards {
            Some(n) => builder.shards(n),
            None => builder,
        }
        .build()
    };
    // Ends a memory measurement's wheel, in which no timer may have fired.
    let shutdown = |runtime: &tokio::runtime::Runtime, wheel: Wheel| {
        on_worker(runtime, async move {
            let fired = wheel.stats().fired;
            assert_eq!(
                fired, 0,
                "harness bug: timers fired while memory was counted"
            );
            wheel.shutdown().await
        });
    };
    // Ends a group's long-lived wheel, which every repetition must have left empty.
    let retire = |runtime: &tokio::runtime::Runtime, wheel: Wheel| {
        on_worker(runtime, async move {
            wheel.flush().await;
            let pending = wheel.stats().pending;
            assert_eq!(pending, 0, "harness bug: a repetition left timers pending");
            wheel.shutdown().await
        });
    };

    let runs = reps + 1;
    let mut total = 0;
    let mut plan = |name: &str, steps: usize| {
        if wanted(name) {
            total += steps;
        }
    };
    plan("schedule", sizes.len() * runs * 5);
    plan("ready", sizes.len() * runs * 3);
    plan("timeouts", sizes.len() * runs * 3);
    plan("postpone", sizes.len() * 2 * runs * 7);
    plan("keyed", sizes.len() * runs * 3);
    plan("churn", sizes.len() * runs * 3);
    plan("producers", producer_counts.len() * runs * 5);
    plan("keyed-producers", producer_counts.len() * 2 * runs * 2);
    plan("requests", request_tasks.len() * runs * 4);
    plan(
        "fire",
        sizes.iter().map(|&n| fire_reps(n, reps)).sum::<usize>() * 6,
    );
    plan("memory", memory_sizes.len() * 8);
    if run_idle {
        total += 4;
    }
    let mut progress = Progress { done: 0, total };

    let mut schedule = Table::new(
        "Schedule: register n timers (deadlines in [1 s, 60 s])",
        "ns per timer",
    )
    .versus(TOKIO);
    let mut cancel =
        Table::new("Cancel: drop or remove those n timers", "ns per timer").versus(TOKIO);
    let mut pair = Table::new(
        "Schedule + cancel pair: register n timers, then cancel them all (the two rows above summed per repetition)",
        "ns per pair",
    )
    .versus(TOKIO);
    let mut ready = Table::new(
        "Ready-future timeout: `timeout(d, ready)` awaited n times",
        "ns per timeout",
    )
    .versus("tokio::time::timeout");
    let mut timeouts = Table::new(
        "Timeouts: wrap a pending future, poll once, drop before the deadline",
        "ns per timeout",
    )
    .versus("tokio::time::timeout");
    let mut postpone = Table::new("Postpone: move each of n timers 10 times", "ns per move")
        .versus("tokio Sleep::reset");
    let mut keyed = Table::new(
        "Keyed schedule + cancel: set n keys (deadlines in [1 s, 60 s]), then remove each",
        "ns per key",
    );
    let mut churn = Table::new(
        "Keyed churn: 4n random ops (½ reset, ¼ remove, ¼ set)",
        "ns per op",
    );
    let mut fire_cpu = Table::new(
        "Fire: n timers over 1 s on 2 workers",
        "CPU ns per fired timer, all threads",
    )
    .versus(TOKIO);
    let mut lateness = Table::new(
        "Fire: lateness, completion seen minus deadline",
        "µs, negative = early; p50 / p99 / max rows",
    )
    .versus(TOKIO);
    let mut early = Table::new(
        "Fire: timers seen complete before their deadline",
        "count of n, and the earliest one's µs before its deadline",
    );
    let mut memory = Table::new(
        "Memory per pending timer (deadlines in [1 h, 2 h))",
        "heap bytes",
    );
    let mut producers = Table::new(
        "Many producers: register + cancel pairs from P tasks at once",
        "ns per pair",
    )
    .versus(TOKIO);
    let mut keyed_producers = Table::new(
        "Keyed, many producers: P tasks each set a key and remove it (+ reset by key between), 10^4 keys pending",
        "ns per key",
    )
    .versus("Mutex<DelayQueue + HashMap>");
    let mut request_cpu = Table::new(
        "Requests: T tasks each arm a 30 s timer, await a real 200–400 µs round trip, drop the timer",
        "CPU ns per request, all threads",
    )
    .versus(TOKIO);
    request_cpu.exclude(NO_TIMER, "it arms no timer: the floor the others add to");
    let mut request_timer = Table::new(
        "Requests: the timer's share (CPU per request minus the no-timer run of the same repetition)",
        "CPU ns per request",
    )
    .versus(TOKIO);
    let mut request_heap = Table::new("Requests: peak live heap while they ran", "KiB");
    request_heap.exclude(NO_TIMER, "it arms no timer");
    let mut idle = Table::new(
        "Idle: 2 s with 10^5 far-future timers pending",
        "CPU ms; wake-ups in 2 s",
    );

    // Idle first: pingora-timeout's clock thread, started by the first `fast_timeout` (ready
    // and timeouts groups), wakes every 10 ms for the rest of the process and cannot be
    // stopped; its wake-ups are left out of the count, but its CPU would not be.
    if run_idle {
        let n = IDLE_TIMERS;
        let cpu_row = format!("n = {n}, CPU ms");
        let switches_row = format!("n = {n}, thread wake-ups (voluntary context switches)");
        let wakeups_row = format!("n = {n}, actor wake-ups (tokio-wheel Stats)");
        let mut record = |system: &str, report: IdleReport| {
            idle.add(&cpu_row, system, report.cpu.as_secs_f64() * 1e3);
            if let Some(switches) = report.thread_wakeups {
                idle.add(&switches_row, system, switches as f64);
            }
            if let Some(wakeups) = report.wakeups {
                idle.add(&wakeups_row, system, wakeups as f64);
            }
        };
        progress.step("idle tokio");
        record(TOKIO, on_worker(&runtime, idle_tokio(n)));
        progress.step("idle kestrel-timer");
        let timer = kestrel(&runtime);
        record(KESTREL, on_worker(&runtime, idle_kestrel(timer.clone(), n)));
        on_worker(&runtime, kestrel_shutdown(timer));
        progress.step("idle hierarchical_hash_wheel_timer");
        let timer = hash_wheel();
        record(
            HASH_WHEEL,
            on_worker(&runtime, idle_hash_wheel(timer.timer_ref(), n)),
        );
        timer.shutdown().expect("timer thread");
        progress.step("idle tokio-wheel");
        let wheel = new_wheel();
        record(OURS, on_worker(&runtime, idle_wheel(wheel.clone(), n)));
        retire(&runtime, wheel);
    }

    if wanted("schedule") {
        let wheel = new_wheel();
        let kestrel_timer = kestrel(&runtime);
        let thread_timer = hash_wheel();
        for &n in &sizes {
            let delays = Arc::new(Rng(42).delays(n));
            let label = format!("n = {n}");
            for rep in 0..runs {
                progress.step(&format!("schedule+cancel n={n}"));
                let tokio = on_worker(&runtime, schedule_cancel_tokio(delays.clone()));
                progress.step(&format!("schedule+cancel n={n}"));
                let queue = on_worker(&runtime, schedule_cancel_delay_queue(delays.clone()));
                progress.step(&format!("schedule+cancel n={n}"));
                let kestrel = on_worker(
                    &runtime,
                    schedule_cancel_kestrel(kestrel_timer.clone(), delays.clone()),
                );
                progress.step(&format!("schedule+cancel n={n}"));
                let thread = on_worker(
                    &runtime,
                    schedule_cancel_hash_wheel(thread_timer.timer_ref(), delays.clone()),
                );
                progress.step(&format!("schedule+cancel n={n}"));
                let ours = on_worker(
                    &runtime,
                    schedule_cancel_wheel(wheel.clone(), delays.clone()),
                );
                if rep == 0 {
                    continue; // warm-up
                }
                for (system, r, caller) in [
                    (TOKIO, tokio, false),
                    (DELAY_QUEUE, queue, false),
                    (KESTREL, kestrel, false),
                    (HASH_WHEEL, thread, false),
                    (HASH_WHEEL_CALLER, thread, true),
                    (OURS, ours, false),
                    (OURS_CALLER, ours, true),
                ] {
                    let (s, c, p) = if caller {
                        (r.caller_scheduled, r.caller_cancelled, r.caller_pair())
                    } else {
                        (r.scheduled, r.cancelled, r.pair())
                    };
                    schedule.add(&label, system, ns_per(s, n));
                    cancel.add(&label, system, ns_per(c, n));
                    pair.add(&label, system, ns_per(p, n));
                }
            }
        }
        retire(&runtime, wheel);
        on_worker(&runtime, kestrel_shutdown(kestrel_timer));
        thread_timer.shutdown().expect("timer thread");
    }

    if wanted("ready") {
        let wheel = new_wheel();
        for &n in &sizes {
            let delays = Arc::new(Rng(42).delays(n));
            let label = format!("n = {n}");
            for rep in 0..runs {
                progress.step(&format!("ready-future timeout n={n}"));
                let tokio = on_worker(&runtime, ready_timeout_tokio(delays.clone()));
                progress.step(&format!("ready-future timeout n={n}"));
                let pingora = on_worker(&runtime, ready_timeout_pingora(delays.clone()));
                progress.step(&format!("ready-future timeout n={n}"));
                let ours = on_worker(&runtime, ready_timeout_wheel(wheel.clone(), delays.clone()));
                if rep > 0 {
                    ready.add(&label, "tokio::time::timeout", ns_per(tokio, n));
                    ready.add(&label, "pingora fast_timeout", ns_per(pingora, n));
                    ready.add(&label, OURS, ns_per(ours, n));
                }
            }
        }
        retire(&runtime, wheel);
    }

    if wanted("timeouts") {
        let wheel = new_wheel();
        for &n in &sizes {
            let delays = Arc::new(Rng(42).delays(n));
            let label = format!("n = {n}");
            for rep in 0..runs {
                progress.step(&format!("timeouts n={n}"));
                let tokio = on_worker(&runtime, timeout_churn_tokio(delays.clone()));
                progress.step(&format!("timeouts n={n}"));
                let pingora = on_worker(&runtime, timeout_churn_pingora(delays.clone()));
                progress.step(&format!("timeouts n={n}"));
                let ours = on_worker(&runtime, timeout_churn_wheel(wheel.clone(), delays.clone()));
                if rep > 0 {
                    timeouts.add(&label, "tokio::time::timeout", ns_per(tokio, n));
                    timeouts.add(&label, "pingora fast_timeout", ns_per(pingora, n));
                    timeouts.add(&label, OURS, ns_per(ours, n));
                }
            }
        }
        retire(&runtime, wheel);
    }

    if wanted("postpone") {
        let wheel = new_wheel();
        let set = on_worker(&runtime, {
            let wheel = wheel.clone();
            async move { KeyedSet::<()>::new(&wheel) }
        });
        let kestrel_timer = kestrel(&runtime);
        for &n in &sizes {
            for how in [Move::Later, Move::Earlier] {
                let row = format!("{how:?}, n = {n}");
                let moves = n * rounds as usize;
                for rep in 0..runs {
                    let what = format!("postpone {how:?} n={n}");
                    progress.step(&what);
                    let tokio = on_worker(&runtime, postpone_tokio(n, rounds, how));
                    progress.step(&what);
                    let queue = on_worker(&runtime, postpone_delay_queue(n, rounds, how));
                    progress.step(&what);
                    let shared = on_worker(&runtime, postpone_shared_delay_queue(n, rounds, how));
                    progress.step(&what);
                    let kestrel = on_worker(
                        &runtime,
                        postpone_kestrel(kestrel_timer.clone(), n, rounds, how),
                    );
                    progress.step(&what);
                    let sleeps = on_worker(&runtime, postpone_wheel(wheel.clone(), n, rounds, how));
                    progress.step(&what);
                    let keyed =
                        on_worker(&runtime, postpone_keyed(set.timers.clone(), n, rounds, how));
                    progress.step(&what);
                    let handles = on_worker(
                        &runtime,
                        postpone_keyed_handle(set.timers.clone(), n, rounds, how),
                    );
                    if rep == 0 {
                        continue;
                    }
                    postpone.add(&row, "tokio Sleep::reset", ns_per(tokio, moves));
                    postpone.add(&row, "&mut DelayQueue::reset", ns_per(queue, moves));
                    postpone.add(&row, "Mutex<DelayQueue>::reset", ns_per(shared, moves));
                    postpone.add(&row, "kestrel-timer postpone", ns_per(kestrel, moves));
                    postpone.add(&row, "tokio-wheel Sleep::reset", ns_per(sleeps, moves));
                    postpone.add(&row, "tokio-wheel Timers::reset", ns_per(keyed, moves));
                    postpone.add(
                        &row,
                        "tokio-wheel KeyedTimer::reset",
                        ns_per(handles, moves),
                    );
                }
            }
        }
        drop(set);
        retire(&runtime, wheel);
        on_worker(&runtime, kestrel_shutdown(kestrel_timer));
    }

    if wanted("keyed") {
        let wheel = new_wheel();
        let set = on_worker(&runtime, {
            let wheel = wheel.clone();
            async move { KeyedSet::<()>::new(&wheel) }
        });
        for &n in &sizes {
            let delays = Arc::new(Rng(42).delays(n));
            for rep in 0..runs {
                progress.step(&format!("keyed schedule+cancel n={n}"));
                let queue = on_worker(&runtime, keyed_schedule_cancel_delay_queue(delays.clone()));
                progress.step(&format!("keyed schedule+cancel n={n}"));
                let shared = on_worker(
                    &runtime,
                    keyed_schedule_cancel_shared_delay_queue(delays.clone()),
                );
                progress.step(&format!("keyed schedule+cancel n={n}"));
                let ours = on_worker(
                    &runtime,
                    keyed_schedule_cancel_wheel(set.timers.clone(), delays.clone()),
                );
                if rep == 0 {
                    continue;
                }
                for (system, r, caller) in [
                    ("&mut DelayQueue + HashMap", queue, false),
                    ("Mutex<DelayQueue + HashMap>", shared, false),
                    ("tokio-wheel Timers", ours, false),
                    ("tokio-wheel Timers (caller side only)", ours, true),
                ] {
                    let (s, c, p) = if caller {
                        (r.caller_scheduled, r.caller_cancelled, r.caller_pair())
                    } else {
                        (r.scheduled, r.cancelled, r.pair())
                    };
                    keyed.add(&format!("n = {n}, set"), system, ns_per(s, n));
                    keyed.add(&format!("n = {n}, remove"), system, ns_per(c, n));
                    keyed.add(&format!("n = {n}, set + remove"), system, ns_per(p, n));
                }
            }
        }
        drop(set);
        retire(&runtime, wheel);
    }

    if wanted("churn") {
        let wheel = new_wheel();
        let set = on_worker(&runtime, {
            let wheel = wheel.clone();
            async move { KeyedSet::<u64>::new(&wheel) }
        });
        for &n in &sizes {
            let label = format!("n = {n}");
            let ops = Arc::new(churn_ops(n, 4 * n));
            for rep in 0..runs {
                progress.step(&format!("keyed churn n={n}"));
                let queue = on_worker(&runtime, churn_delay_queue(n, ops.clone()));
                progress.step(&format!("keyed churn n={n}"));
                let shared = on_worker(&runtime, churn_shared_delay_queue(n, ops.clone()));
                progress.step(&format!("keyed churn n={n}"));
                let ours = on_worker(&runtime, churn_keyed(set.timers.clone(), n, ops.clone()));
                if rep > 0 {
                    churn.add(
                        &label,
                        "&mut DelayQueue + HashMap",
                        ns_per(queue, ops.len()),
                    );
                    churn.add(
                        &label,
                        "Mutex<DelayQueue + HashMap>",
                        ns_per(shared, ops.len()),
                    );
                    churn.add(&label, "tokio-wheel Timers", ns_per(ours, ops.len()));
                }
            }
        }
        drop(set);
        retire(&runtime, wheel);
    }

    if wanted("producers") {
        let wheel = new_wheel();
        let kestrel_timer = kestrel(&runtime);
        let thread_timer = hash_wheel();
        for tasks in producer_counts {
            let row = format!("P = {tasks}");
            let per_task = producer_pairs / tasks;
            let pairs = per_task * tasks;
            for rep in 0..runs {
                progress.step(&format!("producers P={tasks}"));
                let tokio = on_worker(&runtime, producers_tokio(tasks, per_task));
                progress.step(&format!("producers P={tasks}"));
                let shared = on_worker(&runtime, producers_shared_delay_queue(tasks, per_task));
                progress.step(&format!("producers P={tasks}"));
                let kestrel = on_worker(
                    &runtime,
                    producers_kestrel(kestrel_timer.clone(), tasks, per_task),
                );
                progress.step(&format!("producers P={tasks}"));
                let thread = on_worker(
                    &runtime,
                    producers_hash_wheel(thread_timer.timer_ref(), tasks, per_task),
                );
                progress.step(&format!("producers P={tasks}"));
                let ours = on_worker(&runtime, producers_wheel(wheel.clone(), tasks, per_task));
                if rep > 0 {
                    producers.add(&row, TOKIO, ns_per(tokio, pairs));
                    producers.add(&row, "Mutex<DelayQueue>", ns_per(shared, pairs));
                    producers.add(&row, "Arc<kestrel-timer>", ns_per(kestrel, pairs));
                    producers.add(&row, HASH_WHEEL, ns_per(thread, pairs));
                    producers.add(&row, OURS, ns_per(ours, pairs));
                }
            }
        }
        retire(&runtime, wheel);
        on_worker(&runtime, kestrel_shutdown(kestrel_timer));
        thread_timer.shutdown().expect("timer thread");
    }

    if wanted("keyed-producers") {
        let wheel = new_wheel();
        let set = on_worker(&runtime, {
            let wheel = wheel.clone();
            async move { KeyedSet::<u64>::new(&wheel) }
        });
        for tasks in producer_counts {
            let per_task = producer_pairs / tasks;
            let keys = per_task * tasks;
            for reset in [false, true] {
                let row = if reset {
                    format!("P = {tasks}, set + reset + remove")
                } else {
                    format!("P = {tasks}, set + remove")
                };
                for rep in 0..runs {
                    progress.step(&format!("keyed producers P={tasks}"));
                    let shared = on_worker(
                        &runtime,
                        producers_keyed_shared_delay_queue(tasks, per_task, reset),
                    );
                    progress.step(&format!("keyed producers P={tasks}"));
                    let ours = on_worker(
                        &runtime,
                        producers_keyed_wheel(set.timers.clone(), tasks, per_task, reset),
                    );
                    if rep > 0 {
                        keyed_producers.add(
                            &row,
                            "Mutex<DelayQueue + HashMap>",
                            ns_per(shared, keys),
                        );
                        keyed_producers.add(&row, "tokio-wheel Timers", ns_per(ours, keys));
                    }
                }
            }
        }
        drop(set);
        retire(&runtime, wheel);
    }

    if wanted("requests") {
        let wheel = new_wheel();
        for &tasks in &request_tasks {
            let per_task = requests_total / tasks;
            let row = format!("T = {tasks}");
            for rep in 0..runs {
                let what = format!("requests T={tasks}");
                progress.step(&what);
                let none = on_worker(&runtime, requests_none(tasks, per_task));
                progress.step(&what);
                let tokio = on_worker(&runtime, requests_tokio(tasks, per_task));
                progress.step(&what);
                let pingora = on_worker(&runtime, requests_pingora(tasks, per_task));
                progress.step(&what);
                let ours = on_worker(&runtime, requests_wheel(wheel.clone(), tasks, per_task));
                if rep == 0 {
                    continue;
                }
                let floor = none.cpu_per_request.as_nanos() as f64;
                for (system, r) in [
                    (NO_TIMER, none),
                    (TOKIO, tokio),
                    ("pingora fast_sleep", pingora),
                    (OURS, ours),
                ] {
                    let cpu = r.cpu_per_request.as_nanos() as f64;
                    request_cpu.add(&format!("{row}, CPU"), system, cpu);
                    request_cpu.add(
                        &format!("{row}, wall"),
                        system,
                        r.wall_per_request.as_nanos() as f64,
                    );
                    request_heap.add(&row, system, r.peak_heap as f64 / 1024.0);
                    if system != NO_TIMER {
                        request_timer.add(&row, system, cpu - floor);
                    }
                }
            }
        }
        retire(&runtime, wheel);
    }

    if wanted("fire") {
        let wheel = new_wheel();
        let mut set = Some(on_worker(&runtime, {
            let wheel = wheel.clone();
            async move { KeyedSet::<()>::new(&wheel) }
        }));
        for (n, _) in sizes
            .iter()
            .flat_map(|&n| (0..fire_reps(n, reps)).map(move |rep| (n, rep)))
        {
            let label = format!("n = {n}");
            let mut record = |system: &str, report: FireReport| {
                fire_cpu.add(&label, system, report.cpu_per_timer.as_nanos() as f64);
                let us = |ns: i64| ns as f64 / 1_000.0;
                lateness.add(&format!("{label} p50"), system, us(report.percentile(0.5)));
                lateness.add(&format!("{label} p99"), system, us(report.percentile(0.99)));
                lateness.add(&format!("{label} max"), system, us(report.max()));
                early.add(&format!("{label}, timers"), system, report.early() as f64);
                early.add(
                    &format!("{label}, most early (µs)"),
                    system,
                    report.most_early().as_nanos() as f64 / 1_000.0,
                );
                if report.early() > 0 {
                    lateness.exclude(system, "it completed timers before their deadline");
                }
            };
            progress.step(&format!("fire n={n} tokio"));
            record(TOKIO, on_worker(&runtime, fire_tokio(n)));
            progress.step(&format!("fire n={n} DelayQueue"));
            record(DELAY_QUEUE, on_worker(&runtime, fire_delay_queue(n)));
            // A kestrel wheel and a timer thread per run: an idle one still ticks (kestrel
            // every 10 ms) and would be charged to the other peers' CPU.
            progress.step(&format!("fire n={n} kestrel-timer"));
            let timer = kestrel(&runtime);
            record(KESTREL, on_worker(&runtime, fire_kestrel(timer.clone(), n)));
            on_worker(&runtime, kestrel_shutdown(timer));
            progress.step(&format!("fire n={n} hierarchical_hash_wheel_timer"));
            let timer = hash_wheel();
            record(
                HASH_WHEEL,
                on_worker(&runtime, fire_hash_wheel(timer.timer_ref(), n)),
            );
            timer.shutdown().expect("timer thread");
            progress.step(&format!("fire n={n} tokio-wheel Sleep"));
            record(
                "tokio-wheel Sleep",
                on_worker(&runtime, fire_wheel(wheel.clone(), n)),
            );
            progress.step(&format!("fire n={n} tokio-wheel keyed"));
            let (report, keyed_set) =
                on_worker(&runtime, fire_keyed(set.take().expect("keyed set"), n));
            set = Some(keyed_set);
            record("tokio-wheel keyed", report);
        }
        drop(set);
        retire(&runtime, wheel);
    }

    if wanted("memory") {
        memory::run(
            &runtime,
            &memory_sizes,
            &new_wheel,
            &shutdown,
            &mut progress,
            &mut memory,
        );
    }
    eprintln!();

    report::print_header(&args, reps, run_idle && pingora_clock_running());
    for table in [
        &idle,
        &schedule,
        &cancel,
        &pair,
        &ready,
        &timeouts,
        &postpone,
        &keyed,
        &churn,
        &producers,
        &keyed_producers,
        &request_cpu,
        &request_timer,
        &request_heap,
        &fire_cpu,
        &lateness,
        &early,
        &memory,
    ] {
        if !table.rows.is_empty() {
            table.print();
        }
    }
}

/// How many times the fire scenario runs at size `n`, every system taking its turn each
/// time: `reps` up to 10^5 timers (a run lasts about a second, and one sample of a CPU
/// figure this small is at the machine's mercy), once above (a run of 10^6 costs seconds of
/// set-up and GiBs of heap).
fn fire_reps(n: usize, reps: usize) -> usize {
    if n <= 100_000 { reps } else { 1 }
}
