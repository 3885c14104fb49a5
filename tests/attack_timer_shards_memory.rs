//! Outside attack on timer shards, API.md "Fairness and memory": once the wheel is empty and
//! idle, the memory a flood took returns to the baseline without another command — with the
//! flood spread over several timer shards by many producer threads. Real time on a two-worker
//! runtime, counting allocator; the wait is a hang guard (memory that never comes back fails).

use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_wheel::Wheel;

#[path = "support/counting.rs"]
mod counting;
use counting::{Counting, LIVE};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Memory a quiet wheel may keep beyond the baseline (as `tests/idle_memory.rs`).
const SLACK: isize = 1 << 20;
const HANG: Duration = Duration::from_secs(10);

/// One heap: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn retained_after(baseline: isize) -> isize {
    let deadline = std::time::Instant::now() + HANG;
    loop {
        let retained = LIVE.load(Ordering::Relaxed) - baseline;
        if retained < SLACK || std::time::Instant::now() > deadline {
            return retained;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `threads` producers, each registering `per_thread` far sleeps (then dropping them all) and
/// `per_thread / 4` near ones that fire; returns once they are done.
fn flood(runtime: &tokio::runtime::Runtime, wheel: &Wheel, threads: usize, per_thread: usize) {
    let producers: Vec<_> = (0..threads)
        .map(|_| {
            let (wheel, handle) = (wheel.clone(), runtime.handle().clone());
            std::thread::spawn(move || {
                let _entered = handle.enter();
                let waker = std::task::Waker::noop();
                let mut cx = std::task::Context::from_waker(waker);
                let mut far = Vec::with_capacity(per_thread);
                for _ in 0..per_thread {
                    let mut sleep = wheel.sleep(Duration::from_secs(3_600));
                    assert!(std::pin::Pin::new(&mut sleep).poll(&mut cx).is_pending());
                    far.push(sleep);
                }
                let near: Vec<_> = (0..per_thread / 4)
                    .map(|_| {
                        let mut sleep = wheel.sleep(Duration::from_millis(2));
                        let _ = std::pin::Pin::new(&mut sleep).poll(&mut cx);
                        sleep
                    })
                    .collect();
                drop(far);
                futures::executor::block_on(futures::future::join_all(near));
            })
        })
        .collect();
    for producer in producers {
        producer.join().unwrap();
    }
}

use std::future::Future;

fn flood_then_idle(shards: usize, threads: usize, warm: bool, per_thread: usize) -> (isize, isize) {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let wheel = Wheel::builder()
        .runtime(runtime.handle().clone())
        .timer_shards(shards)
        .build();
    // With `warm`, a small warm-up from as many threads first, so that the baseline is a
    // wheel that has been used a little (as an application's would be); without, the baseline
    // is the wheel just built (as `tests/idle_memory.rs` takes it).
    if warm {
        flood(&runtime, &wheel, threads, 8);
        runtime.block_on(wheel.flush());
    }
    std::thread::sleep(Duration::from_millis(400));
    let baseline = LIVE.load(Ordering::Relaxed);
    flood(&runtime, &wheel, threads, per_thread);
    let peak = LIVE.load(Ordering::Relaxed) - baseline;
    runtime.block_on(wheel.flush());
    let stats = wheel.stats();
    assert_eq!(stats.pending, 0, "{stats:?}");
    let retained = retained_after(baseline);
    eprintln!("timer_shards({shards}): flood peak {peak} bytes, retained once idle {retained}");
    drop(wheel);
    drop(runtime);
    (peak, retained)
}

#[test]
fn one_timer_shard_gives_a_flood_back() {
    let (peak, retained) = flood_then_idle(1, 8, true, 20_000);
    assert!(
        retained < SLACK,
        "1 shard: {retained} bytes retained once idle (peak {peak})"
    );
}

#[test]
fn four_timer_shards_give_a_flood_back() {
    let (peak, retained) = flood_then_idle(4, 8, true, 20_000);
    assert!(
        retained < SLACK,
        "4 shards: {retained} bytes retained once idle (peak {peak})"
    );
}

#[test]
fn eight_timer_shards_give_a_flood_back() {
    let (peak, retained) = flood_then_idle(8, 8, true, 20_000);
    assert!(
        retained < SLACK,
        "8 shards: {retained} bytes retained once idle (peak {peak})"
    );
}

/// Every timer shard that a flood reached keeps its pool's first segments and wheel nodes
/// once idle (~70–110 KiB each, measured: 16 shards keep ~1.2–1.8 MiB, 64 shards ~6.8 MiB,
/// against ~0.1 MiB for one shard taking the same flood), while `Builder::timer_shards` says
/// each shard "costs an idle wheel a few KiB" and API.md says the memory returns to the
/// baseline. A default wheel on a 32-worker runtime has 16 timer shards.
#[test]
fn thirty_two_timer_shards_give_a_flood_back() {
    let (peak, retained) = flood_then_idle(32, 32, false, 10_000);
    assert!(
        retained < SLACK,
        "32 shards: {retained} bytes retained once idle (peak {peak})"
    );
}

/// The same flood on one timer shard, from a wheel just built: back under the slack.
#[test]
fn one_timer_shard_from_a_fresh_wheel_gives_a_32_thread_flood_back() {
    let (peak, retained) = flood_then_idle(1, 32, false, 10_000);
    assert!(
        retained < SLACK,
        "1 shard: {retained} bytes retained once idle (peak {peak})"
    );
}
