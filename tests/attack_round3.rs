//! Outside attacks, round 3, on API.md §1–§2 (sleeps, timeouts, intervals, layouts, jobs),
//! written from the contract and the public rustdoc only; keyed timers are in
//! `attack_round3_keyed.rs`, stats and stopping in `attack_round3_stopping.rs`. Every attack
//! that holds is kept as a regression test, named by the behaviour; a broken promise is kept as
//! `#[ignore = "finding: …"]`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_wheel::{JobError, Layout, MissedTickBehavior, Schedule, Wheel};

#[path = "support/attack.rs"]
mod attack;
use attack::{ms, poll_once, secs, settle};

fn full() -> bool {
    std::env::var_os("TOKIO_WHEEL_FULL").is_some()
}

// ───────────────────────────── §1: intervals against tokio's ─────────────────────────────

/// Drives a wheel interval and tokio's side by side through the same advances, polling each
/// once per step until pending (API.md: an advance followed by a poll completes every tick due
/// by then, with no extra yields; Burst returns overdue ticks back to back).
async fn interval_matches_tokio(behavior: MissedTickBehavior) {
    interval_matches_tokio_with(behavior, ms(10), ms(20)).await;
}

async fn interval_matches_tokio_with(
    behavior: MissedTickBehavior,
    offset: Duration,
    period: Duration,
) {
    let wheel = Wheel::new();
    let start = Instant::now() + offset;
    let mut ours = wheel.interval_at(start, period);
    let mut theirs = tokio::time::interval_at(start, period);
    ours.set_missed_tick_behavior(behavior);
    theirs.set_missed_tick_behavior(behavior);
    // Steps in ms: small ones, exact hits on ticks, and long stalls that miss several ticks.
    let steps = [
        3u64, 7, 20, 1, 19, 65, 5, 0, 37, 100, 20, 20, 13, 200, 1, 1, 58, 20,
    ];
    for (i, step) in steps.into_iter().enumerate() {
        tokio::time::advance(ms(step)).await;
        let mut ours_got = Vec::new();
        let mut theirs_got = Vec::new();
        // Burst may hand out several ticks per step; bound the loop.
        for _ in 0..50 {
            let mut t = Box::pin(ours.tick());
            match poll_once(&mut t) {
                std::task::Poll::Ready(at) => ours_got.push(at),
                std::task::Poll::Pending => break,
            }
        }
        for _ in 0..50 {
            let mut t = Box::pin(theirs.tick());
            match poll_once(&mut t) {
                std::task::Poll::Ready(at) => theirs_got.push(at),
                std::task::Poll::Pending => break,
            }
        }
        assert_eq!(ours_got, theirs_got, "{behavior:?}, step {i} (+{step} ms)");
    }
}

#[tokio::test(start_paused = true)]
async fn interval_burst_matches_tokio_tick_for_tick() {
    interval_matches_tokio(MissedTickBehavior::Burst).await;
}

#[tokio::test(start_paused = true)]
async fn interval_skip_matches_tokio_tick_for_tick() {
    interval_matches_tokio(MissedTickBehavior::Skip).await;
}

#[tokio::test(start_paused = true)]
async fn interval_delay_matches_tokio_tick_for_tick() {
    interval_matches_tokio(MissedTickBehavior::Delay).await;
}

/// Periods and starts that are not whole ticks (1.5 ms period, 0.3 ms offset, 1 ms tick):
/// still tick for tick with tokio's, in each behaviour.
#[tokio::test(start_paused = true)]
async fn interval_off_tick_period_matches_tokio() {
    for behavior in [
        MissedTickBehavior::Burst,
        MissedTickBehavior::Skip,
        MissedTickBehavior::Delay,
    ] {
        interval_matches_tokio_with(
            behavior,
            Duration::from_micros(300),
            Duration::from_micros(1500),
        )
        .await;
    }
}

/// `interval(period)`'s first tick completes at once, with the creation instant.
#[tokio::test(start_paused = true)]
async fn interval_first_tick_is_immediate() {
    let wheel = Wheel::new();
    let t0 = Instant::now();
    let mut iv = wheel.interval(ms(50));
    let mut first = Box::pin(iv.tick());
    assert_eq!(poll_once(&mut first), std::task::Poll::Ready(t0));
}

// ───────────────────────────── §1: sleeps, timeouts, edges ─────────────────────────────

/// `reset` after completion re-arms: pending again, then ready at the new deadline, never
/// before; a reset to the past after that is ready on the next poll.
#[tokio::test(start_paused = true)]
async fn sleep_reset_after_completion_rearms_and_never_completes_early() {
    let wheel = Wheel::new();
    let mut s = Box::pin(wheel.sleep(ms(5)));
    s.as_mut().await;
    let later = Instant::now() + ms(30);
    s.as_mut().reset(later);
    assert!(!s.is_elapsed());
    assert!(poll_once(&mut s).is_pending());
    tokio::time::advance(ms(29)).await;
    settle().await;
    assert!(poll_once(&mut s).is_pending(), "completed 1 ms early");
    tokio::time::advance(ms(1)).await;
    assert!(
        poll_once(&mut s).is_ready(),
        "not ready on a poll at its deadline"
    );
    s.as_mut().reset(Instant::now() - ms(1));
    assert!(
        poll_once(&mut s).is_ready(),
        "a reset to the past is not ready at once"
    );
}

/// A timeout whose future becomes ready exactly at the deadline: the future was polled at its
/// deadline, so the output wins (tokio polls the inner future first).
#[tokio::test(start_paused = true)]
async fn timeout_at_exactly_the_deadline_prefers_the_output() {
    let wheel = Wheel::new();
    let deadline = Instant::now() + ms(40);
    let got = wheel
        .timeout_at(deadline, async move {
            tokio::time::sleep_until(deadline).await;
            7
        })
        .await;
    assert_eq!(got, Ok(7));
}

/// A timeout with `Duration::MAX` neither panics nor elapses; its future's output comes through.
#[tokio::test(start_paused = true)]
async fn timeout_with_duration_max_returns_the_output() {
    let wheel = Wheel::new();
    let got = wheel
        .timeout(Duration::MAX, async {
            tokio::time::sleep(secs(3600 * 24 * 365)).await;
            1
        })
        .await;
    assert_eq!(got, Ok(1));
}

/// A tiny custom layout (16 ticks of range) on a 1 ms tick: deadlines far past the range go
/// to the overflow list and must still fire at their time, never at the range's end.
#[tokio::test(start_paused = true)]
async fn tiny_custom_layout_never_fires_early_and_fires_within_a_tick() {
    let wheel = Wheel::builder()
        .tick(ms(1))
        .layout(Layout::custom(&[4, 4]).unwrap())
        .build();
    let t0 = Instant::now();
    let delays = [
        1u64, 3, 4, 5, 15, 16, 17, 31, 64, 65, 250, 1000, 4097, 60_000,
    ];
    let mut tasks = Vec::new();
    for d in delays {
        let wheel = wheel.clone();
        tasks.push(tokio::spawn(async move {
            wheel.sleep(ms(d)).await;
            (d, Instant::now() - t0)
        }));
    }
    for t in tasks {
        let (d, took) = t.await.unwrap();
        assert!(took >= ms(d), "{d} ms sleep woke after {took:?}");
        assert!(took <= ms(d + 1), "{d} ms sleep woke after {took:?}");
    }
}

/// A coarse tick (7 ms, not dividing the deadlines) rounds deadlines up, never down.
#[tokio::test(start_paused = true)]
async fn coarse_tick_rounds_up_never_early() {
    let wheel = Wheel::builder().tick(ms(7)).build();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for d in [1u64, 6, 7, 8, 13, 14, 15, 100, 1001] {
        let wheel = wheel.clone();
        tasks.push(tokio::spawn(async move {
            wheel.sleep(ms(d)).await;
            (d, Instant::now() - t0)
        }));
    }
    for t in tasks {
        let (d, took) = t.await.unwrap();
        assert!(took >= ms(d), "{d} ms sleep woke after {took:?}");
        assert!(took <= ms(d + 7), "{d} ms sleep woke after {took:?}");
    }
}

/// Bad builds are errors, never panics: a zero tick, an empty layout, a one-slot level.
#[tokio::test]
async fn bad_builds_are_errors() {
    assert!(Wheel::builder().tick(Duration::ZERO).try_build().is_err());
    assert!(Layout::custom(&[]).is_err());
    assert!(Layout::custom(&[1]).is_err());
    assert!(Layout::custom(&[u32::MAX]).is_err());
    assert!(Layout::custom(&[2; 200]).is_err());
    // A very fine tick with Duration::MAX: no panic, stays pending.
    let wheel = Wheel::builder().tick(Duration::from_nanos(1)).build();
    let mut s = Box::pin(wheel.sleep(Duration::MAX));
    assert!(poll_once(&mut s).is_pending());
    let far = wheel.sleep_until(Instant::now() + secs(86_400 * 365 * 100));
    tokio::pin!(far);
    assert!(poll_once(&mut far).is_pending());
}

// ───────────────────────────── §2: jobs ─────────────────────────────

/// `cancel()` returning true means the job never runs and awaiting says `Cancelled`;
/// `is_finished()` is true right away, since awaiting would return at once.
#[tokio::test(start_paused = true)]
async fn a_cancelled_job_is_finished_at_once() {
    let wheel = Wheel::new();
    let ran = Arc::new(AtomicBool::new(false));
    let job = {
        let ran = ran.clone();
        wheel.spawn_after(secs(1), async move { ran.store(true, Ordering::SeqCst) })
    };
    assert!(job.cancel());
    assert!(
        job.is_finished(),
        "awaiting a cancelled job returns at once, yet is_finished() is false"
    );
    let mut job = job;
    assert!(matches!(
        poll_once(&mut job),
        std::task::Poll::Ready(Err(JobError::Cancelled))
    ));
    tokio::time::sleep(secs(2)).await;
    assert!(!ran.load(Ordering::SeqCst));
}

/// After `abort()` of a job that has not started, awaiting returns `Cancelled` and
/// `is_finished()` agrees with what a poll would do.
#[tokio::test(start_paused = true)]
async fn is_finished_agrees_with_a_poll_after_abort() {
    let wheel = Wheel::new();
    let mut job = wheel.spawn_after(secs(1), async { 1 });
    job.abort();
    settle().await;
    let finished = job.is_finished();
    let polled = poll_once(&mut job);
    assert_eq!(
        finished,
        polled.is_ready(),
        "is_finished {finished}, poll {polled:?}"
    );
    assert!(matches!(
        polled,
        std::task::Poll::Ready(Err(JobError::Cancelled))
    ));
}

/// `is_finished()` true ⇒ a poll is ready; for a job that ran to completion.
#[tokio::test(start_paused = true)]
async fn is_finished_implies_a_ready_poll_after_completion() {
    let wheel = Wheel::new();
    let mut job = wheel.spawn_after(ms(5), async { 9 });
    for _ in 0..200 {
        if job.is_finished() {
            assert_eq!(poll_once(&mut job), std::task::Poll::Ready(Ok(9)));
            return;
        }
        tokio::time::sleep(ms(1)).await;
    }
    panic!("the job never finished");
}

/// Races on 2 workers: a job due about now, cancelled / rescheduled / aborted from another
/// task. `cancel() == true` ⇒ never ran, `Err(Cancelled)`; `false` ⇒ it runs. A reschedule
/// that returned `true` ⇒ the job starts no earlier than the new deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reschedule_abort_racing_the_start_keep_their_word() {
    let wheel = Wheel::new();
    let rounds = if full() { 3000 } else { 300 };
    let mut checks = Vec::new();
    for i in 0..rounds {
        let ran_at: Arc<Mutex<Option<Instant>>> = Default::default();
        let job = {
            let ran_at = ran_at.clone();
            wheel.spawn_after(ms(1 + (i % 3) as u64), async move {
                *ran_at.lock().unwrap() = Some(Instant::now());
                i
            })
        };
        let delay = std::time::Duration::from_micros(200 * (i % 12) as u64);
        checks.push(tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            match i % 3 {
                0 => {
                    let cancelled = job.cancel();
                    let out = job.await;
                    tokio::time::sleep(ms(5)).await;
                    let ran = ran_at.lock().unwrap().is_some();
                    if cancelled {
                        assert_eq!(out, Err(JobError::Cancelled), "round {i}");
                        assert!(!ran, "round {i}: cancel() said true, yet it ran");
                    } else {
                        assert_eq!(out, Ok(i), "round {i}: cancel() said false");
                        assert!(ran);
                    }
                }
                1 => {
                    let new = Instant::now() + ms(4);
                    let moved = job.reschedule(new);
                    let out = job.await;
                    let at = ran_at.lock().unwrap().expect("never ran");
                    assert_eq!(out, Ok(i));
                    if moved {
                        assert!(at >= new, "round {i}: ran {:?} early", new - at);
                    }
                }
                _ => {
                    job.abort();
                    let out = job.await;
                    match out {
                        Ok(v) => assert_eq!(v, i),
                        Err(e) => assert_eq!(e, JobError::Cancelled, "round {i}"),
                    }
                }
            }
        }));
    }
    for c in checks {
        c.await.unwrap();
    }
}

/// FixedRate with runs longer than the period: never overlapping, and starting exactly where
/// a tokio `Interval` with `MissedTickBehavior::Skip` driving the same runs would (the
/// documented model: an overrun slot runs late at once, further missed slots are skipped).
#[tokio::test(start_paused = true)]
async fn fixed_rate_long_runs_never_overlap_and_follow_tokio_skip() {
    // Run n (1-based) lasts 25 ms when odd, 3 ms when even, and 20 ms at n = 6 (ends on a slot).
    fn run_len(n: usize) -> Duration {
        match n {
            6 => ms(20),
            n if n % 2 == 1 => ms(25),
            _ => ms(3),
        }
    }
    let wheel = Wheel::new();
    let period = ms(10);
    let t0 = Instant::now();
    let busy = Arc::new(AtomicBool::new(false));
    let starts: Arc<Mutex<Vec<Duration>>> = Default::default();
    let job = {
        let (busy, starts) = (busy.clone(), starts.clone());
        wheel.spawn_every(period, Schedule::FixedRate, move || {
            let (busy, starts) = (busy.clone(), starts.clone());
            async move {
                assert!(!busy.swap(true, Ordering::SeqCst), "runs overlap");
                let n = {
                    let mut s = starts.lock().unwrap();
                    s.push(Instant::now() - t0);
                    s.len()
                };
                tokio::time::sleep(run_len(n)).await;
                busy.store(false, Ordering::SeqCst);
            }
        })
    };
    let model = tokio::spawn(async move {
        let mut iv = tokio::time::interval_at(t0 + period, period);
        iv.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let mut starts = Vec::new();
        for n in 1..=14 {
            iv.tick().await;
            starts.push(Instant::now() - t0);
            tokio::time::sleep(run_len(n)).await;
        }
        starts
    });
    let want = model.await.unwrap();
    tokio::time::sleep(ms(1)).await;
    job.cancel();
    let got = starts.lock().unwrap().clone();
    assert_eq!(
        &got[..want.len()],
        &want[..],
        "the job's runs against tokio's Skip"
    );
}

/// FixedDelay waits a full period after each run ends; a panicking run is counted and the
/// schedule goes on.
#[tokio::test(start_paused = true)]
async fn fixed_delay_with_panicking_runs_goes_on() {
    let wheel = Wheel::new();
    let t0 = Instant::now();
    let log: Arc<Mutex<Vec<(Duration, Duration)>>> = Default::default();
    let job = {
        let log = log.clone();
        wheel.spawn_every(ms(10), Schedule::FixedDelay, move || {
            let log = log.clone();
            async move {
                let start = Instant::now() - t0;
                tokio::time::sleep(ms(7)).await;
                let n = {
                    let mut l = log.lock().unwrap();
                    l.push((start, Instant::now() - t0));
                    l.len()
                };
                if n % 2 == 0 {
                    panic!("run {n} panics on purpose");
                }
            }
        })
    };
    tokio::time::sleep(ms(200)).await;
    job.abort();
    let out = job.await;
    assert_eq!(out, Err(JobError::Cancelled));
    let log = log.lock().unwrap().clone();
    assert!(log.len() >= 6, "{log:?}");
    assert_eq!(log[0].0, ms(10));
    for w in log.windows(2) {
        assert!(w[1].0 >= w[0].1 + ms(10), "next run began early: {log:?}");
    }
    let stats = wheel.stats();
    assert!(stats.job_panics >= (log.len() / 2) as u64 - 1, "{stats:?}");
}

/// `reschedule` to the past runs the job at once and `deadline()` follows; after the start,
/// `reschedule` and `cancel` answer `false` and change nothing.
#[tokio::test(start_paused = true)]
async fn reschedule_to_the_past_runs_at_once_and_late_calls_say_false() {
    let wheel = Wheel::new();
    let t0 = Instant::now();
    let ran_at: Arc<Mutex<Option<Instant>>> = Default::default();
    let job = {
        let ran_at = ran_at.clone();
        wheel.spawn_after(secs(60), async move {
            *ran_at.lock().unwrap() = Some(Instant::now());
            tokio::time::sleep(secs(1)).await;
            3
        })
    };
    let past = t0 - ms(5);
    assert!(job.reschedule(past));
    assert_eq!(job.deadline(), past);
    tokio::time::sleep(ms(2)).await;
    assert!(
        ran_at.lock().unwrap().is_some(),
        "a job rescheduled to the past did not run"
    );
    assert!(!job.reschedule(t0 + secs(100)));
    assert!(!job.cancel());
    assert_eq!(job.await, Ok(3));
}

/// An interval with a `Duration::MAX` period: the first tick at once, then never again, and no
/// overflow panic on the way.
#[tokio::test(start_paused = true)]
async fn interval_with_duration_max_period_ticks_once() {
    let wheel = Wheel::new();
    let mut iv = wheel.interval(Duration::MAX);
    iv.tick().await;
    for _ in 0..50 {
        tokio::time::advance(secs(86_400 * 365 * 4)).await;
    }
    let mut next = Box::pin(iv.tick());
    assert!(poll_once(&mut next).is_pending());
}
