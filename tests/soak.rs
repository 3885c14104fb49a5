//! A bounded randomized soak: many tasks mix every operation — sleeps with resets and drops,
//! timeouts, jobs with cancels and reschedules, keyed set/reset/remove/take — on a
//! multi-thread runtime in real time, each checked against what it expected, and the
//! totals checked at the end.
//!
//! Seconds long by default; `SOAK_SECONDS=600 cargo test --release --test soak` for a long
//! run.

mod support;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use support::Rng;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_wheel::{JobError, Wheel};

/// What the keyed model knows about a key.
#[derive(Debug, Default)]
struct KeyState {
    /// Deadlines set for the key and not yet delivered or taken: a delivery must match one.
    outstanding: Vec<Instant>,
    /// The deadline of the last `set_at`, unless a reset or take came after it: this one must
    /// be delivered. (A reset may lose its race with the fire, so it promises nothing.)
    must_deliver: Option<Instant>,
}

type KeyedModel = Arc<Mutex<HashMap<u32, KeyState>>>;

#[derive(Default)]
struct Tally {
    sleeps: AtomicU64,
    jobs_ran: AtomicU64,
    jobs_cancelled: AtomicU64,
    keyed_fired: AtomicU64,
    keyed_taken: AtomicU64,
}

async fn sleeper(wheel: Wheel, mut rng: Rng, until: Instant, tally: Arc<Tally>) {
    while Instant::now() < until {
        let mut sleep = wheel.sleep(rng.millis(20));
        match rng.below(4) {
            0 => {
                // Move it a few times, then wait for the final deadline.
                let _ = futures::poll!(&mut sleep);
                for _ in 0..rng.below(4) {
                    Pin::new(&mut sleep).reset(Instant::now() + rng.millis(20));
                }
                let deadline = sleep.deadline();
                sleep.await;
                assert!(Instant::now() >= deadline, "a reset sleep completed early");
            }
            1 => {
                // Register and drop before it fires.
                let _ = futures::poll!(&mut sleep);
                drop(sleep);
            }
            2 => {
                let limit = rng.millis(10);
                let start = Instant::now();
                let work = tokio::time::sleep(rng.millis(10));
                match wheel.timeout(limit, work).await {
                    Ok(()) => {}
                    Err(elapsed) => {
                        assert!(!elapsed.is_shutdown());
                        assert!(start.elapsed() >= limit, "a timeout elapsed early");
                    }
                }
            }
            _ => {
                let deadline = sleep.deadline();
                sleep.await;
                assert!(Instant::now() >= deadline, "a sleep completed early");
            }
        }
        tally.sleeps.fetch_add(1, Ordering::Relaxed);
    }
}

async fn jobber(wheel: Wheel, mut rng: Rng, until: Instant, tally: Arc<Tally>) {
    while Instant::now() < until {
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        let due = Instant::now() + rng.millis(15);
        let job = wheel.spawn_at(due, async move {
            flag.store(true, Ordering::SeqCst);
            Instant::now()
        });
        let mut final_due = due;
        if rng.below(3) == 0 {
            let moved = Instant::now() + rng.millis(15);
            if job.reschedule(moved) {
                final_due = moved;
            }
        }
        tokio::time::sleep(rng.millis(15)).await;
        let cancelled = rng.below(2) == 0 && job.cancel();
        let result = job.await;
        if cancelled {
            assert_eq!(result, Err(JobError::Cancelled));
            assert!(!ran.load(Ordering::SeqCst), "a cancelled job ran");
            tally.jobs_cancelled.fetch_add(1, Ordering::Relaxed);
        } else {
            let started = result.expect("an uncancelled job runs");
            assert!(ran.load(Ordering::SeqCst));
            assert!(started >= final_due, "a job started early");
            tally.jobs_ran.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[test]
fn soak_every_operation_against_its_expectations() {
    let seconds: u64 = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let wheel = Wheel::builder().name("soak").build();
        let tally = Arc::new(Tally::default());
        let until = Instant::now() + Duration::from_secs(seconds);

        let (timers, mut expired) = wheel.keyed::<u32, u32>();
        let model: KeyedModel = Arc::default();
        let reader = tokio::spawn({
            let model = model.clone();
            let tally = tally.clone();
            async move {
                while let Some(e) = expired.next().await {
                    assert!(!e.is_shutdown());
                    let now = Instant::now();
                    assert!(now >= e.deadline(), "a keyed timer fired early");
                    let (key, value) = (*e.key(), *e.value());
                    assert_eq!(key, value);
                    let mut model = model.lock().await;
                    let state = model.get_mut(&key).expect("fired a key that was never set");
                    let position = state
                        .outstanding
                        .iter()
                        .position(|&d| d == e.deadline())
                        .expect("delivered a deadline not set, or delivered it twice");
                    state.outstanding.remove(position);
                    if state.must_deliver == Some(e.deadline()) {
                        state.must_deliver = None;
                    }
                    tally.keyed_fired.fetch_add(1, Ordering::Relaxed);
                }
            }
        });

        let mut tasks = Vec::new();
        for seed in 1..=16u64 {
            tasks.push(tokio::spawn(sleeper(wheel.clone(), Rng(seed * 7_919), until, tally.clone())));
        }
        for seed in 1..=8u64 {
            tasks.push(tokio::spawn(jobber(wheel.clone(), Rng(seed * 104_729), until, tally.clone())));
        }
        // Keyed: one writer at a time per key range, all commands through the shared model.
        for writer in 0..4u32 {
            let (timers, model, tally) = (timers.clone(), model.clone(), tally.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng(u64::from(writer) * 31 + 5);
                while Instant::now() < until {
                    let key = writer * 1_000 + rng.below(50) as u32;
                    let mut model = model.lock().await;
                    match rng.below(4) {
                        0 | 1 => {
                            let deadline = Instant::now() + rng.millis(20);
                            timers.set_at(key, key, deadline);
                            let state = model.entry(key).or_default();
                            state.outstanding.push(deadline);
                            state.must_deliver = Some(deadline);
                        }
                        2 => {
                            let deadline = Instant::now() + rng.millis(20);
                            timers.reset_at(&key, deadline);
                            let state = model.entry(key).or_default();
                            state.outstanding.push(deadline);
                            state.must_deliver = None;
                        }
                        _ => {
                            let taken = timers.take(&key).await;
                            // The stream reader removes fired keys under this same lock, so a
                            // key the model holds is either taken now or already in the stream.
                            if let Some(value) = taken {
                                assert_eq!(value, key);
                                let state = model.get_mut(&key).expect("took a key that was never set");
                                assert!(!state.outstanding.is_empty(), "took a key with nothing outstanding");
                                // Which outstanding deadline was live is not known here (a
                                // reset may have been a no-op); `races.rs` checks take versus
                                // fire exactly. Nothing set before the take must arrive now.
                                state.must_deliver = None;
                                tally.keyed_taken.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    drop(model);
                    tokio::time::sleep(rng.millis(2)).await;
                }
            }));
        }
        for task in tasks {
            task.await.expect("a soak task failed");
        }
        // Let every keyed timer still set fire, then close the set.
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(timers);
        reader.await.expect("the expiration reader failed");
        for (key, state) in model.lock().await.iter() {
            assert_eq!(state.must_deliver, None, "key {key} was set but never delivered");
        }

        wheel.flush().await;
        let s = wheel.stats();
        assert_eq!(s.inserted, s.fired + s.cancelled + s.pending, "{s:?}");
        assert_eq!(s.pending, 0, "{s:?}");
        eprintln!(
            "soak {seconds} s: {} sleeps, {} jobs ran, {} cancelled, {} keyed fired, {} taken; {} commands, max lateness {:?}",
            tally.sleeps.load(Ordering::Relaxed),
            tally.jobs_ran.load(Ordering::Relaxed),
            tally.jobs_cancelled.load(Ordering::Relaxed),
            tally.keyed_fired.load(Ordering::Relaxed),
            tally.keyed_taken.load(Ordering::Relaxed),
            s.commands,
            s.max_lateness
        );
    });
}
