//! Commands never pile up without bound (API.md, "Fairness and memory"; issue 28 item 1):
//! producers flooding a keyed set with by-key resets, from plain threads and from tasks of a
//! multi-thread runtime, wait for the actor once their inbox shard is full, so the memory the
//! waiting commands take stays bounded (a counting allocator measures it) and an authoritative
//! call made during the flood is answered. A flood from a current-thread runtime's own task
//! (where waiting could stop the actor) still completes.

#[path = "support/counting.rs"]
mod counting;

use std::sync::atomic::Ordering;
use std::time::Duration;

use counting::{Counting, LIVE, PEAK, reset_peak};
use tokio_wheel::Wheel;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const KEYS: u64 = 1_000;
const HOUR: Duration = Duration::from_secs(3600);
/// What the waiting commands may take at most, over the baseline: the documented bound (twice
/// 256 Ki commands, about 40 bytes each) with room for the actor's own tables.
const LIMIT: isize = 64 << 20;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Each producer makes `per_producer` by-key resets on the set's keys as fast as it can.
const PER_PRODUCER: u64 = 6_000_000;

#[test]
fn a_by_key_reset_flood_from_threads_takes_bounded_memory_and_a_take_is_answered() {
    reset_flood_from_threads(None);
}

/// The set's shards share the bound: sixteen of them (as on a 16-worker machine) take no
/// more than one.
#[test]
fn a_flood_over_sixteen_shards_takes_the_same_bounded_memory() {
    reset_flood_from_threads(Some(16));
}

fn reset_flood_from_threads(shards: Option<usize>) {
    let runtime = runtime();
    let wheel = runtime.block_on(async {
        match shards {
            Some(n) => Wheel::builder().shards(n).build(),
            None => Wheel::new(),
        }
    });
    let (timers, _expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    for key in 0..KEYS {
        timers.set(key, key, HOUR);
    }
    runtime.block_on(async { assert_eq!(timers.len().await, KEYS as usize) });
    let baseline = LIVE.load(Ordering::Relaxed);
    reset_peak();

    let producers: Vec<_> = (0..2)
        .map(|p| {
            let timers = timers.clone();
            std::thread::spawn(move || {
                for i in 0..PER_PRODUCER {
                    timers.reset(&((i * 7 + p) % KEYS), HOUR);
                }
            })
        })
        .collect();
    // During the flood: a take by key is answered (with its value: nothing expired).
    let taken = runtime.block_on(async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        tokio::time::timeout(Duration::from_secs(60), timers.take(&(KEYS - 1))).await
    });
    assert_eq!(taken, Ok(Some(KEYS - 1)), "the take was not answered");
    for producer in producers {
        producer.join().unwrap();
    }
    let peak = PEAK.load(Ordering::Relaxed) - baseline;
    assert!(
        peak < LIMIT,
        "the flood took {} MiB over the baseline (bound {} MiB)",
        peak >> 20,
        LIMIT >> 20
    );
    runtime.block_on(async {
        // Resets of the taken key after the take are no-ops (absent): the rest are all there.
        assert_eq!(timers.len().await, KEYS as usize - 1);
    });
}

#[test]
fn a_flood_from_tasks_of_a_multi_thread_runtime_is_bounded_and_loses_nothing() {
    let runtime = runtime();
    let wheel = runtime.block_on(async { Wheel::new() });
    let (timers, _expired) = runtime.block_on(async { wheel.keyed::<u64, u64>() });
    for key in 0..KEYS {
        timers.set(key, key, HOUR);
    }
    runtime.block_on(async { timers.len().await });
    let baseline = LIVE.load(Ordering::Relaxed);
    reset_peak();
    runtime.block_on(async {
        // Tasks that never yield: a full shard makes them wait through `block_in_place`.
        let tasks: Vec<_> = (0..4)
            .map(|p| {
                let timers = timers.clone();
                tokio::spawn(async move {
                    for i in 0..PER_PRODUCER / 2 {
                        timers.reset(&((i + p) % KEYS), HOUR);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(timers.len().await, KEYS as usize);
    });
    let peak = PEAK.load(Ordering::Relaxed) - baseline;
    assert!(peak < LIMIT, "the flood took {} MiB", peak >> 20);
}

#[test]
fn a_flood_on_a_current_thread_runtime_completes() {
    // The actor shares the producer's only thread: the producer must never wait for it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let wheel = Wheel::new();
        let (timers, _expired) = wheel.keyed::<u64, u64>();
        for key in 0..KEYS {
            timers.set(key, key, HOUR);
        }
        for i in 0..1_000_000u64 {
            timers.reset(&(i % KEYS), HOUR);
        }
        assert_eq!(timers.len().await, KEYS as usize);
    });
}

#[test]
fn a_producer_thread_goes_on_when_the_actors_runtime_is_not_driven() {
    // The actor's current-thread runtime is driven only inside `block_on`; between two, a
    // producer thread that fills its shard waits for it at most a second, then goes on
    // (waiting longer would deadlock a driver that joins the producer first).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (wheel, timers) = runtime.block_on(async {
        let wheel = Wheel::new();
        let (timers, _expired) = wheel.keyed::<u64, u64>();
        for key in 0..KEYS {
            timers.set(key, key, HOUR);
        }
        assert_eq!(timers.len().await, KEYS as usize);
        (wheel, timers)
    });
    let producer = {
        let timers = timers.clone();
        std::thread::spawn(move || {
            for i in 0..1_000_000u64 {
                timers.reset(&(i % KEYS), HOUR);
            }
        })
    };
    producer.join().unwrap();
    runtime.block_on(async {
        assert_eq!(timers.len().await, KEYS as usize, "nothing lost");
        wheel.shutdown().await;
    });
}
