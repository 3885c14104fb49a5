//! A flood of commands: 10^7 from 64 tasks at once. Nothing is lost (the stats add up), the
//! actor keeps firing on time meanwhile, and memory returns to its baseline afterwards.
//!
//! Backpressure is a documented choice: the command queue is unbounded, so producers never
//! wait; the actor applies what it takes in time-bounded stretches and fires due timers (and
//! yields) between them.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::time::Instant;
use tokio_wheel::Wheel;

#[path = "support/counting.rs"]
mod counting;
use counting::{Counting, LIVE};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Registrations in the flood, each one command to the actor (each is also dropped soon after: a
/// sleep dropped before the actor took its command withdraws it, so the actor never files it).
/// `FLOOD_COMMANDS` overrides.
fn flood_commands() -> usize {
    std::env::var("FLOOD_COMMANDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000)
}

const PRODUCERS: usize = 64;

#[test]
fn a_flood_loses_nothing_keeps_firing_and_gives_memory_back() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let wheel = Wheel::new();
        wheel.flush().await;
        let baseline = LIVE.load(Ordering::Relaxed);

        // A heartbeat on the flooded wheel that must keep firing while the flood goes on.
        let flood_over = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let heartbeat = tokio::spawn({
            let (wheel, flood_over) = (wheel.clone(), flood_over.clone());
            async move {
                let mut worst = Duration::ZERO;
                let mut beats = 0;
                let mut interval = wheel.interval(Duration::from_millis(20));
                while !flood_over.load(Ordering::SeqCst) {
                    let scheduled = interval.tick().await;
                    worst = worst.max(scheduled.elapsed());
                    beats += 1;
                }
                (beats, worst)
            }
        });

        let per_task = flood_commands() / PRODUCERS;
        let start = Instant::now();
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let wheel = wheel.clone();
                tokio::spawn(async move {
                    let mut kept = Vec::new();
                    // Each sleep lives while the next few are made: dropped while it is not the
                    // last command of its shard, it leaves a placeholder there (the last one
                    // would be taken back), so every registration reaches the actor.
                    let mut recent = std::collections::VecDeque::new();
                    for i in 0..per_task {
                        let mut sleep = wheel.sleep(Duration::from_secs(60 + (i % 600) as u64));
                        let _ = Pin::new(&mut sleep).poll(&mut Context::from_waker(Waker::noop()));
                        // Keep every 64th of one producer's timers pending for a while.
                        if p == 0 && i % 64 == 0 {
                            kept.push(sleep);
                        } else {
                            recent.push_back(sleep);
                            if recent.len() > 4 {
                                recent.pop_front();
                            }
                        }
                        if i % 256 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                    kept
                })
            })
            .collect();
        let mut kept = Vec::new();
        for producer in producers {
            kept.extend(producer.await.unwrap());
        }
        wheel.flush().await;
        let flood_time = start.elapsed();
        flood_over.store(true, Ordering::SeqCst);

        let (beats, worst) = heartbeat.await.unwrap();
        wheel.flush().await;
        let s = wheel.stats();
        let timers = (per_task * PRODUCERS) as u64;
        // Every kept timer is pending; every other flood timer was withdrawn or cancelled; the
        // heartbeat's fired. Each registration queued one command.
        assert_eq!(s.pending, kept.len() as u64, "{s:?}");
        assert_eq!(s.inserted, s.fired + s.cancelled + s.pending, "{s:?}");
        assert!(s.commands >= timers, "{s:?}");
        // How late the actor fires during a flood is a timing fact for the benchmarks; here
        // only that the wheel kept firing it: the interval ticked again (its first tick is at
        // once) before the flood was through — 10^7 commands take far longer than one 20 ms
        // period on any machine. (fairness.rs: the runtime's other tasks are polled meanwhile.)
        assert!(beats >= 2, "the heartbeat never ticked during the flood");

        drop(kept);
        wheel.flush().await;
        // The actor gives flood-sized memory back once it has stayed idle for a moment.
        let mut after = LIVE.load(Ordering::Relaxed);
        // (The wait is a hang guard, not a figure.)
        let until = Instant::now() + Duration::from_secs(60);
        while after - baseline >= 4 << 20 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
            after = LIVE.load(Ordering::Relaxed);
        }
        assert_eq!(wheel.stats().pending, 0);
        // The wheel and the queue give back their flood-sized buffers once empty; allow a
        // little for buffers a quiet wheel keeps.
        let retained = after - baseline;
        assert!(retained < 4 << 20, "{retained} bytes still held after the flood");
        eprintln!(
            "flood: {} commands in {flood_time:?}; actor max lateness {:?}; heartbeat task worst {worst:?}; {retained} bytes retained",
            s.commands, s.max_lateness
        );
    });
}
