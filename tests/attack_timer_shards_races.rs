//! Outside attack on timer shards in real time on a two-worker runtime: `reset` racing the
//! old deadline's firing when the handle has moved to another thread than the one that
//! registered it, registration/drop churn from many threads with `Stats` checked after
//! `flush`, and `flush` itself racing producers. Outcomes only (never early, counts); every
//! real wait is a hang guard.

mod support;

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tokio_wheel::{Sleep, Wheel};

use support::{Rng, poll_once, two_workers};

const HANG: Duration = Duration::from_secs(60);
const THREADS: usize = 6;

/// Joins `threads`, asserts none of their sleeps (`what`) completed early, then flushes (under
/// the hang guard) and checks that nothing is pending and the counts add up.
fn joined_none_early_then_settled(
    runtime: &tokio::runtime::Runtime,
    wheel: &Wheel,
    threads: Vec<std::thread::JoinHandle<()>>,
    early: &AtomicUsize,
    what: &str,
) {
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(early.load(Ordering::SeqCst), 0, "{what} completed early");
    settled(runtime, wheel);
}

/// Flushes (under the hang guard) and checks that nothing is pending and the counts add up;
/// returns the stats.
fn settled(runtime: &tokio::runtime::Runtime, wheel: &Wheel) -> tokio_wheel::Stats {
    runtime.block_on(async {
        tokio::time::timeout(HANG, wheel.flush())
            .await
            .expect("flush hung");
    });
    let stats = wheel.stats();
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(stats.inserted, stats.fired + stats.cancelled, "{stats:?}");
    stats
}

#[test]
fn reset_later_on_another_thread_racing_the_old_firing_is_never_early() {
    let runtime = two_workers();
    let wheel = runtime.block_on(async { Wheel::builder().timer_shards(4).build() });
    let early = Arc::new(AtomicUsize::new(0));
    // Pairs of threads: the registrar files sleeps due within a millisecond and hands each to
    // its mover at once; the mover pushes it later (the old deadline firing meanwhile or not)
    // and awaits it there.
    let mut threads = Vec::new();
    for pair in 0..THREADS / 2 {
        let (send, receive) = mpsc::channel::<Sleep>();
        let (wheel, handle) = (wheel.clone(), runtime.handle().clone());
        threads.push(std::thread::spawn(move || {
            let _entered = handle.enter();
            let mut rng = Rng(pair as u64 + 11);
            for _ in 0..300 {
                let mut sleep = wheel.sleep(Duration::from_micros(200 + rng.below(800)));
                // Registered here, on this thread's lane.
                let _ = poll_once(&mut sleep);
                send.send(sleep).unwrap();
            }
        }));
        let (handle, early) = (runtime.handle().clone(), early.clone());
        threads.push(std::thread::spawn(move || {
            let _entered = handle.enter();
            let mut rng = Rng(pair as u64 + 101);
            let mut moved = Vec::new();
            for mut sleep in receive {
                let new = Instant::now() + Duration::from_micros(100 + rng.below(2_000));
                Pin::new(&mut sleep).reset(new);
                assert_eq!(sleep.deadline(), new);
                moved.push(sleep);
            }
            for sleep in moved {
                let deadline = sleep.deadline();
                futures::executor::block_on(sleep);
                if Instant::now() < deadline {
                    early.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    joined_none_early_then_settled(&runtime, &wheel, threads, &early, "a moved sleep");
}

#[test]
fn reset_after_completion_on_another_thread_completes_at_the_new_deadline() {
    let runtime = two_workers();
    let wheel = runtime.block_on(async { Wheel::builder().timer_shards(3).build() });
    let early = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..THREADS)
        .map(|index| {
            let (wheel, handle, early) = (wheel.clone(), runtime.handle().clone(), early.clone());
            std::thread::spawn(move || {
                let _entered = handle.enter();
                let mut rng = Rng(index as u64 + 7);
                // Completed on this thread, then re-armed and awaited on a helper thread.
                for _ in 0..40 {
                    let mut sleep = wheel.sleep(Duration::from_micros(rng.below(1_500)));
                    futures::executor::block_on(&mut sleep);
                    let next = Instant::now() + Duration::from_micros(rng.below(1_500));
                    let handle = tokio::runtime::Handle::current();
                    let was_early = std::thread::spawn(move || {
                        let _entered = handle.enter();
                        Pin::new(&mut sleep).reset(next);
                        futures::executor::block_on(&mut sleep);
                        Instant::now() < next
                    })
                    .join()
                    .unwrap();
                    if was_early {
                        early.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    joined_none_early_then_settled(&runtime, &wheel, threads, &early, "a re-armed sleep");
}

#[test]
fn churn_from_many_threads_then_flush_the_stats_add_up() {
    let runtime = two_workers();
    let wheel = runtime.block_on(async { Wheel::builder().timer_shards(4).build() });
    let threads: Vec<_> = (0..THREADS)
        .map(|index| {
            let (wheel, handle) = (wheel.clone(), runtime.handle().clone());
            std::thread::spawn(move || {
                let _entered = handle.enter();
                let mut rng = Rng(index as u64 * 31 + 5);
                let mut kept: Vec<Sleep> = Vec::new();
                let mut live: Vec<Sleep> = Vec::new();
                for _ in 0..3_000 {
                    match rng.below(6) {
                        // Registered near: fires, or is dropped.
                        0 | 1 => {
                            let mut sleep = wheel.sleep(Duration::from_micros(rng.below(3_000)));
                            if poll_once(&mut sleep).is_pending() {
                                live.push(sleep);
                            }
                        }
                        // Far, kept to the end: pending.
                        2 => {
                            let mut sleep = wheel.sleep(Duration::from_secs(3_600));
                            assert!(poll_once(&mut sleep).is_pending());
                            kept.push(sleep);
                        }
                        // Moved earlier or later, or dropped.
                        3 if !live.is_empty() => {
                            let at = rng.below(live.len() as u64) as usize;
                            let to = Instant::now() + Duration::from_micros(rng.below(3_000));
                            Pin::new(&mut live[at]).reset(to);
                        }
                        4 if !live.is_empty() => {
                            let at = rng.below(live.len() as u64) as usize;
                            drop(live.swap_remove(at));
                        }
                        _ => {
                            // Completed by a poll once due (or fired by the actor).
                            live.retain_mut(|sleep| poll_once(sleep) == Poll::Pending);
                        }
                    }
                }
                // Everything still live completes (never early), then the far ones stay.
                for sleep in live {
                    let deadline = sleep.deadline();
                    futures::executor::block_on(sleep);
                    assert!(Instant::now() >= deadline, "completed early");
                }
                kept
            })
        })
        .collect();
    let kept: Vec<Vec<Sleep>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let far: usize = kept.iter().map(Vec::len).sum();
    runtime.block_on(async {
        tokio::time::timeout(HANG, wheel.flush())
            .await
            .expect("flush hung");
    });
    let stats = wheel.stats();
    assert_eq!(stats.pending, far as u64, "{stats:?}");
    assert_eq!(
        stats.inserted,
        stats.fired + stats.cancelled + stats.pending,
        "{stats:?}"
    );
    drop(kept);
    let stats = settled(&runtime, &wheel);
    assert_eq!(stats.actors, 4, "{stats:?}");
}

#[test]
fn flush_racing_producers_counts_everything_made_before_it() {
    let runtime = two_workers();
    let wheel = runtime.block_on(async { Wheel::builder().timer_shards(4).build() });
    // Each producer registers far sleeps and, after each batch, records how many it has made;
    // a flush started after reading that count must show at least that many pending.
    let made = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producers: Vec<_> = (0..4)
        .map(|_| {
            let (wheel, handle) = (wheel.clone(), runtime.handle().clone());
            let (made, stop) = (made.clone(), stop.clone());
            std::thread::spawn(move || {
                let _entered = handle.enter();
                let mut kept = Vec::new();
                while !stop.load(Ordering::SeqCst) && kept.len() < 20_000 {
                    for _ in 0..50 {
                        let mut sleep = wheel.sleep(Duration::from_secs(3_600));
                        assert!(poll_once(&mut sleep).is_pending());
                        kept.push(sleep);
                    }
                    made.fetch_add(50, Ordering::SeqCst);
                }
                kept
            })
        })
        .collect();
    runtime.block_on(async {
        for _ in 0..30 {
            let before = made.load(Ordering::SeqCst) as u64;
            tokio::time::timeout(HANG, wheel.flush())
                .await
                .expect("flush hung");
            let stats = wheel.stats();
            assert!(
                stats.pending >= before,
                "flush returned before every shard applied what was made before it: \
                 {before} made, {stats:?}"
            );
            tokio::task::yield_now().await;
        }
    });
    stop.store(true, Ordering::SeqCst);
    let kept: Vec<_> = producers.into_iter().map(|t| t.join().unwrap()).collect();
    let total: usize = kept.iter().map(Vec::len).sum();
    runtime.block_on(wheel.flush());
    assert_eq!(wheel.stats().pending, total as u64);
}
