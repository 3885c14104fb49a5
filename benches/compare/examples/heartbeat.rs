//! The actor as a citizen of its runtime, as a figure (API.md "Fairness and memory": a 10 ms
//! heartbeat never sees a gap over 100 ms while the actor works through a flood). The tests
//! assert the outcome (other tasks are polled during a flood); the gap is measured here.
//!
//! Run: `cargo run --release -p tokio-wheel-compare --example heartbeat [-- --runs 3]`.
//!
//! For a current-thread and a 2-worker runtime: a task beats every 10 ms for 1.5 s while two
//! other threads flood — **wheel**: keyed sets + by-key resets over 10^6 keys and sleeps
//! registered and dropped, on a wheel whose actor runs on that runtime; **tokio**: the same
//! sleeps on tokio's own timer (its driver runs on that runtime); **noise**: two threads that
//! only spin (the machine's own share of a gap). Printed: the longest gap and the 99th
//! percentile of the gaps, in ms (a gap of 10 is a perfect beat), medians over the runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_wheel::Wheel;

const FLOOD: Duration = Duration::from_millis(1_500);
const KEYS: u64 = 1_000_000;

#[derive(Clone, Copy, PartialEq)]
enum Load {
    Wheel,
    Tokio,
    Noise,
}

/// Starts the two flooding threads; they stop when `stop` is set.
fn flood(
    load: Load,
    runtime: &tokio::runtime::Runtime,
    stop: Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    let wheel = {
        let _entered = runtime.enter();
        Wheel::new()
    };
    let (timers, expired) = {
        let _entered = runtime.enter();
        wheel.keyed::<u64, u64>()
    };
    drop(expired);
    let handle = runtime.handle().clone();
    (0..2)
        .map(|thread| {
            let (stop, wheel, timers, handle) =
                (stop.clone(), wheel.clone(), timers.clone(), handle.clone());
            std::thread::spawn(move || {
                let _entered = handle.enter();
                let waker = std::task::Waker::noop();
                let mut cx = std::task::Context::from_waker(waker);
                let mut key = 0u64;
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    match (load, thread) {
                        (Load::Noise, _) => {
                            for _ in 0..1_000 {
                                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                            }
                        }
                        (Load::Wheel, 0) => {
                            for _ in 0..1_000 {
                                timers.set(key, key, Duration::from_secs(60));
                                timers.reset(&(key / 2), Duration::from_secs(90));
                                key = (key + 1) % KEYS;
                            }
                        }
                        (Load::Wheel, _) => {
                            let mut kept = Vec::with_capacity(1_000);
                            for i in 0..1_000u64 {
                                let mut sleep = wheel.sleep(Duration::from_secs(30 + i));
                                let _ = std::future::Future::poll(
                                    std::pin::Pin::new(&mut sleep),
                                    &mut cx,
                                );
                                kept.push(sleep);
                            }
                        }
                        (Load::Tokio, _) => {
                            let mut kept = Vec::with_capacity(1_000);
                            for i in 0..1_000u64 {
                                let mut sleep =
                                    Box::pin(tokio::time::sleep(Duration::from_secs(30 + i)));
                                let _ = std::future::Future::poll(sleep.as_mut(), &mut cx);
                                kept.push(sleep);
                            }
                        }
                    }
                }
            })
        })
        .collect()
}

/// Beats every 10 ms for [`FLOOD`]: every gap between beats.
async fn heartbeat() -> Vec<Duration> {
    let mut gaps = Vec::new();
    let mut last = Instant::now();
    let until = last + FLOOD;
    while last < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = Instant::now();
        gaps.push(now - last);
        last = now;
    }
    gaps
}

/// (longest gap, p99 gap) in ms, for one run.
fn run(current_thread: bool, load: Load) -> (f64, f64) {
    let runtime = if current_thread {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    }
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let threads = flood(load, &runtime, stop.clone());
    let mut gaps = runtime.block_on(async { tokio::spawn(heartbeat()).await.unwrap() });
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().unwrap();
    }
    gaps.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (ms(gaps[gaps.len() - 1]), ms(gaps[gaps.len() * 99 / 100]))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runs: usize = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1))
        .map_or(3, |v| v.parse().expect("--runs N"));
    println!("| runtime | flood | longest gap ms | p99 gap ms |");
    println!("|---|---|---|---|");
    for (current_thread, name) in [(true, "current-thread"), (false, "multi-thread, 2 workers")] {
        for (load, load_name) in [
            (Load::Noise, "none (two spinning threads)"),
            (Load::Tokio, "tokio sleeps from two threads"),
            (Load::Wheel, "wheel: keyed set + reset, sleeps"),
        ] {
            let mut results: Vec<(f64, f64)> =
                (0..runs).map(|_| run(current_thread, load)).collect();
            let mut longest: Vec<f64> = results.iter().map(|r| r.0).collect();
            longest.sort_by(f64::total_cmp);
            results.sort_by(|a, b| a.1.total_cmp(&b.1));
            println!(
                "| {name} | {load_name} | {:.1} | {:.1} |",
                longest[runs / 2],
                results[runs / 2].1
            );
        }
    }
}
