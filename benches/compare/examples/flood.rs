//! The flood of issue 28: producer threads calling `timers.reset(&key, ..)` by key on 1 000
//! keys as fast as they can, while a task calls `take` now and then. Prints the commands per
//! second the producers got through, the peak heap over the baseline (a counting allocator),
//! and how long each `take` took to be answered (median, max) — against the same flood on a
//! `Mutex<DelayQueue + HashMap>`, the peer a keyed user would write.
//!
//! ```text
//! cargo run --release -p tokio-wheel-compare --example flood -- [--secs 5] [--threads 2]
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::time::DelayQueue;
use tokio_util::time::delay_queue::Key;
use tokio_wheel::Wheel;

#[path = "../../../tests/support/counting.rs"]
mod counting;
use counting::{Counting, LIVE, PEAK};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const KEYS: u64 = 1_000;
const HOUR: Duration = Duration::from_secs(3600);

struct Figures {
    commands_per_sec: f64,
    peak_mib: f64,
    take_median_ms: f64,
    take_max_ms: f64,
}

/// Runs `reset` from `threads` threads for `secs`, while `take` runs every 100 ms.
fn flood(
    runtime: &tokio::runtime::Runtime,
    threads: u64,
    secs: f64,
    reset: impl Fn(u64) + Send + Sync + 'static,
    take: impl Fn(u64) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>,
) -> Figures {
    let reset = Arc::new(reset);
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicU64::new(0));
    let baseline = LIVE.load(Ordering::Relaxed);
    PEAK.store(baseline, Ordering::Relaxed);
    let start = Instant::now();
    let producers: Vec<_> = (0..threads)
        .map(|p| {
            let (reset, stop, made) = (reset.clone(), stop.clone(), made.clone());
            std::thread::spawn(move || {
                let mut i = p;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..1024 {
                        reset(i % KEYS);
                        i += threads;
                    }
                    made.fetch_add(1024, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut takes = Vec::new();
    runtime.block_on(async {
        let mut key = 0;
        while start.elapsed().as_secs_f64() < secs {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let asked = Instant::now();
            assert!(take(key).await, "the take found its key gone");
            takes.push(asked.elapsed().as_secs_f64() * 1e3);
            key += 1;
        }
    });
    stop.store(true, Ordering::Relaxed);
    for producer in producers {
        producer.join().unwrap();
    }
    let took = start.elapsed().as_secs_f64();
    takes.sort_by(f64::total_cmp);
    Figures {
        commands_per_sec: made.load(Ordering::Relaxed) as f64 / took,
        peak_mib: (PEAK.load(Ordering::Relaxed) - baseline) as f64 / (1 << 20) as f64,
        take_median_ms: takes[takes.len() / 2],
        take_max_ms: *takes.last().unwrap(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|arg| arg == flag)
            .and_then(|at| args.get(at + 1))
            .cloned()
    };
    let secs: f64 = value("--secs").map_or(5.0, |s| s.parse().unwrap());
    let threads: u64 = value("--threads").map_or(2, |s| s.parse().unwrap());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, _expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    for key in 0..KEYS {
        timers.set(key, key, HOUR);
    }
    let ours = {
        let (resets, takes) = (timers.clone(), timers.clone());
        flood(
            &runtime,
            threads,
            secs,
            move |key| resets.reset(&key, HOUR),
            move |key| {
                let timers = takes.clone();
                Box::pin(async move {
                    let found = timers.take(&key).await.is_some();
                    timers.set(key, key, HOUR);
                    found
                })
            },
        )
    };

    type Peer = Mutex<(DelayQueue<u64>, HashMap<u64, Key>)>;
    let peer: Arc<Peer> = Arc::new(Mutex::new((DelayQueue::new(), HashMap::new())));
    runtime.block_on(async {
        let mut guard = peer.lock().unwrap();
        let (queue, keys) = &mut *guard;
        for key in 0..KEYS {
            let at = queue.insert(key, HOUR);
            keys.insert(key, at);
        }
    });
    let theirs = {
        let (resets, takes) = (peer.clone(), peer.clone());
        flood(
            &runtime,
            threads,
            secs,
            move |key| {
                let mut guard = resets.lock().unwrap();
                let (queue, keys) = &mut *guard;
                if let Some(at) = keys.get(&key) {
                    queue.reset(at, HOUR);
                }
            },
            move |key| {
                let peer = takes.clone();
                Box::pin(async move {
                    let mut guard = peer.lock().unwrap();
                    let (queue, keys) = &mut *guard;
                    let found = keys.remove(&key).map(|at| queue.remove(&at)).is_some();
                    let at = queue.insert(key, HOUR);
                    keys.insert(key, at);
                    found
                })
            },
        )
    };

    println!(
        "flood: {threads} threads resetting {KEYS} keys by key for {secs} s, a take every 100 ms"
    );
    println!("| set | resets/s | peak heap over baseline MiB | take median / max ms |");
    println!("|---|---|---|---|");
    for (name, f) in [
        ("tokio-wheel Timers", &ours),
        ("Mutex<DelayQueue + HashMap>", &theirs),
    ] {
        println!(
            "| {name} | {:.1} M | {:.1} | {:.2} / {:.2} |",
            f.commands_per_sec / 1e6,
            f.peak_mib,
            f.take_median_ms,
            f.take_max_ms
        );
    }
}
