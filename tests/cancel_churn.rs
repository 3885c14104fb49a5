//! The server hot path: many tasks each arm a far-future sleep, hold it across a yield, and
//! drop it unfired (a keep-alive server's header-read timer) — 10^6 of them. While they flow,
//! the wheel's memory stays bounded (its queue holds at most one lazy look's worth of
//! commands, its pool only the sleeps alive at once); nothing fires; the stats add up; and once
//! the flow stops, memory is back to its baseline without another command.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Duration;

use tokio_wheel::Wheel;

#[path = "support/counting.rs"]
mod counting;
use counting::{Counting, LIVE, PEAK, reset_peak};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const SLEEPS: usize = 1_000_000;
const TASKS: usize = 64;
/// What the flow may hold at its peak beyond the baseline: the tasks themselves, a pool of
/// at most a few thousand slots, a few milliseconds of queued commands per inbox shard.
const PEAK_BOUND: isize = 4 << 20;
/// Memory a quiet wheel may keep beyond the baseline (buffers it retains on purpose).
const SLACK: isize = 1 << 20;

#[test]
fn a_million_short_lived_cancelled_sleeps_keep_memory_bounded_and_give_it_back() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let wheel = Wheel::builder().runtime(runtime.handle().clone()).build();
    runtime.block_on(wheel.flush());
    std::thread::sleep(Duration::from_millis(50));
    let baseline = LIVE.load(Ordering::Relaxed);
    reset_peak();

    runtime.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let wheel = wheel.clone();
                tokio::spawn(async move {
                    for _ in 0..SLEEPS / TASKS {
                        let mut sleep = wheel.sleep(Duration::from_secs(30));
                        // Polled with the task's own waker, as a server's connection task does.
                        std::future::poll_fn(|cx| {
                            assert!(Pin::new(&mut sleep).poll(cx).is_pending());
                            Poll::Ready(())
                        })
                        .await;
                        tokio::task::yield_now().await;
                        drop(sleep);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
    let peak = PEAK.load(Ordering::Relaxed) - baseline;

    // No barrier: the actor takes what is left on its own, within its lazy bound (the wait
    // is a hang guard, not a figure).
    let until = std::time::Instant::now() + Duration::from_secs(60);
    let stats = loop {
        let stats = wheel.stats();
        if stats.pending == 0 && stats.inserted == stats.cancelled {
            break stats;
        }
        assert!(
            std::time::Instant::now() < until,
            "releases never applied: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(stats.fired, 0, "{stats:?}");
    // Memory comes back on its own once the actor is idle; the wait is a hang guard.
    let until = std::time::Instant::now() + Duration::from_secs(60);
    let retained = loop {
        let retained = LIVE.load(Ordering::Relaxed) - baseline;
        if retained < SLACK || std::time::Instant::now() > until {
            break retained;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!(
        "{SLEEPS} sleeps from {TASKS} tasks: {} filed by the actor, {} commands, {} actor \
         wake-ups; peak {peak} bytes over the baseline, {retained} retained when idle",
        stats.inserted, stats.commands, stats.wakeups
    );
    assert!(peak < PEAK_BOUND, "{peak} bytes at the peak of the flow");
    assert!(retained < SLACK, "{retained} bytes still held once idle");
    drop(wheel);
}
