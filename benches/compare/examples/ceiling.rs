//! The actor's ceiling (issue 28 item 2): for each pattern, the CPU one producer core spends
//! per operation against the CPU the actor spends applying it. Their ratio is how many
//! producer cores, each making operations flat out, one actor keeps up with — "cores until
//! the actor saturates".
//!
//! Run: `cargo run --release -p tokio-wheel-compare --example ceiling [-- --ops 1000000 --runs 3
//! --shards 1]`.
//!
//! `--shards n` spreads the keyed set and the sleeps over `n` actors each (`Builder::shards`)
//! and runs `n` producer threads, each with its own sleeps (registered on its thread, so on
//! its timer shard) and keys, making `ops / n` operations. The actors all run on the wheel's
//! one thread here, so the actor column is what they spend together per operation: what
//! sharding costs or saves per command. On a machine with a core per shard they apply side by
//! side, and a pattern's ceiling is `n` times one actor's.
//!
//! The wheel runs its actor on its own thread (`Builder::own_thread`), so its CPU time can be
//! read alone (`/proc/self/task/<tid>/schedstat`, nanoseconds on the CPU); the producer is a
//! plain thread whose CPU time is `CLOCK_THREAD_CPUTIME_ID`. Each run ends with
//! `Wheel::flush`, so every operation made was applied before the actor's time is read.
//! Linux only.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::time::Instant;
use tokio_wheel::Wheel;

fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// The CPU time so far of the own thread of the wheel named `name` (threads are named
/// `tokio-wheel <name>`, which the kernel cuts to 15 bytes: a three-character name is whole,
/// so a run never reads the thread of the previous run's wheel, which may still be going).
fn actor_cpu_ns(name: &str) -> u64 {
    let wanted = format!("tokio-wheel {name}");
    for task in std::fs::read_dir("/proc/self/task").expect("/proc") {
        let path = task.unwrap().path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim_end() == wanted {
            let stat = std::fs::read_to_string(path.join("schedstat")).unwrap();
            return stat.split_whitespace().next().unwrap().parse().unwrap();
        }
    }
    panic!("no actor thread named tokio-wheel");
}

fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) {
    let _ = future.poll(&mut Context::from_waker(Waker::noop()));
}

/// A cheap deterministic spread of delays, 1–60 s.
fn delay(i: u64) -> Duration {
    Duration::from_millis(1_000 + (i.wrapping_mul(2_654_435_761) % 59_000))
}

#[derive(Clone, Copy)]
enum Pattern {
    /// A sleep armed and dropped per request (a request deadline that is not reached).
    Request,
    /// Live sleeps moved later (a deadline pushed back on each request: keep-alive).
    SleepChurn,
    /// Live sleeps moved to a random deadline, half of them earlier than before.
    SleepRandom,
    /// `timers.reset(&key, d)` on 1000 live keys.
    ByKeyReset,
    /// `timers.set(key, (), d)` then `timers.remove(&key)`.
    KeyedSetRemove,
}

impl Pattern {
    fn name(self) -> &'static str {
        match self {
            Pattern::Request => "request-shaped: sleep armed + dropped",
            Pattern::SleepChurn => "sleep churn: live `Sleep` reset later",
            Pattern::SleepRandom => "live `Sleep` reset to a random deadline",
            Pattern::ByKeyReset => "by-key reset (1000 keys)",
            Pattern::KeyedSetRemove => "keyed set + remove",
        }
    }
}

/// One run: (producer ns per operation, actor ns per operation).
fn run(runtime: &tokio::runtime::Runtime, pattern: Pattern, ops: u64, shards: usize) -> (f64, f64) {
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let name = format!(
        "{:03}",
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 1000
    );
    let wheel = Wheel::builder()
        .runtime(runtime.handle().clone())
        .name(name.clone())
        .own_thread(true)
        .shards(shards)
        .try_build()
        .expect("a wheel on its own thread");
    let (timers, expired) = wheel.keyed::<u64, ()>();
    // One producer thread per shard, each with its own sleeps (registered on that thread, so
    // on its timer shard) and its own keys, each making its share of the operations.
    let producers = shards as u64;
    let share = ops / producers;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = std::sync::Arc::new(std::sync::Mutex::new(go_rx));
    let threads: Vec<_> = (0..producers)
        .map(|p| {
            let (wheel, timers) = (wheel.clone(), timers.clone());
            let (ready_tx, go_rx) = (ready_tx.clone(), go_rx.clone());
            std::thread::spawn(move || {
                let keys = p * 1_000_000_000;
                let mut sleeps: Vec<_> =
                    (0..1000).map(|i| Box::pin(wheel.sleep(delay(i)))).collect();
                for sleep in &mut sleeps {
                    poll_once(sleep.as_mut());
                }
                for key in 0..1000 {
                    timers.set(keys + key, (), delay(key));
                }
                ready_tx.send(()).unwrap();
                let _ = go_rx.lock().unwrap().recv();
                let start = thread_cpu_ns();
                produce(pattern, share, keys, &wheel, &timers, &mut sleeps);
                let spent = thread_cpu_ns() - start;
                drop(sleeps);
                spent
            })
        })
        .collect();
    for _ in 0..producers {
        ready_rx.recv().unwrap();
    }
    runtime.block_on(wheel.flush());
    runtime.block_on(async { timers.len().await });
    let actor_before = actor_cpu_ns(&name);
    for _ in 0..producers {
        go_tx.send(()).unwrap();
    }
    let producer_ns: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    runtime.block_on(wheel.flush());
    runtime.block_on(async { timers.len().await });
    let actor_ns = actor_cpu_ns(&name) - actor_before;
    drop((timers, expired));
    runtime.block_on(wheel.shutdown());
    let made = (share * producers) as f64;
    (producer_ns as f64 / made, actor_ns as f64 / made)
}

/// One producer's share of a run: `ops` operations of `pattern` on its own sleeps and on keys
/// from `keys` on.
fn produce(
    pattern: Pattern,
    ops: u64,
    keys: u64,
    wheel: &Wheel,
    timers: &tokio_wheel::Timers<u64, ()>,
    sleeps: &mut [Pin<Box<tokio_wheel::Sleep>>],
) {
    match pattern {
        Pattern::Request => {
            for i in 0..ops {
                let mut sleep = wheel.sleep(delay(i));
                poll_once(Pin::new(&mut sleep));
            }
        }
        Pattern::SleepChurn => {
            // Later on every reset, as a keep-alive deadline moves.
            let base = Instant::now() + Duration::from_secs(120);
            for i in 0..ops {
                let sleep = &mut sleeps[(i % 1000) as usize];
                sleep.as_mut().reset(base + Duration::from_micros(i));
                poll_once(sleep.as_mut());
            }
        }
        Pattern::SleepRandom => {
            let now = Instant::now();
            for i in 0..ops {
                let sleep = &mut sleeps[(i % 1000) as usize];
                sleep
                    .as_mut()
                    .reset(now + delay(i) + Duration::from_secs(60));
                poll_once(sleep.as_mut());
            }
        }
        Pattern::ByKeyReset => {
            for i in 0..ops {
                timers.reset(&(keys + i % 1000), delay(i));
            }
        }
        Pattern::KeyedSetRemove => {
            for i in 0..ops {
                let key = keys + 1_000 + i;
                timers.set(key, (), delay(i));
                timers.remove(&key);
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let option = |name: &str, default: u64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map_or(default, |v| v.parse().expect("a number"))
    };
    let ops = option("--ops", 1_000_000);
    let runs = option("--runs", 3) as usize;
    let shards = option("--shards", 1) as usize;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "| pattern ({ops} ops, median of {runs}, {shards} shard(s) and producer(s)) | producer ns/op | actor ns/op | cores until the actor saturates |"
    );
    println!("|---|---|---|---|");
    for pattern in [
        Pattern::Request,
        Pattern::SleepChurn,
        Pattern::SleepRandom,
        Pattern::ByKeyReset,
        Pattern::KeyedSetRemove,
    ] {
        let mut results: Vec<(f64, f64)> = (0..runs)
            .map(|_| run(&runtime, pattern, ops, shards))
            .collect();
        let median = |pick: fn(&(f64, f64)) -> f64, results: &mut Vec<(f64, f64)>| {
            let mut values: Vec<f64> = results.iter().map(pick).collect();
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        let producer = median(|r| r.0, &mut results);
        let actor = median(|r| r.1, &mut results);
        let mut ratios: Vec<f64> = results.iter().map(|(p, a)| p / a.max(0.001)).collect();
        ratios.sort_by(f64::total_cmp);
        let cores = ratios[ratios.len() / 2];
        let cores = if actor < 0.5 {
            format!("> {:.0} (the actor barely works)", producer / 0.5)
        } else {
            format!(
                "{cores:.1} (runs {:.1}–{:.1})",
                ratios[0],
                ratios[ratios.len() - 1]
            )
        };
        println!(
            "| {} | {producer:.0} | {actor:.0} | {cores} |",
            pattern.name()
        );
    }
}
