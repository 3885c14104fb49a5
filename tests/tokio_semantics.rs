//! tokio's semantics wherever the API is the same: `Sleep`, `timeout` and `Interval` side by
//! side with tokio's own under paused time — `advance` then poll, `pause` inside a running
//! runtime, auto-advance — completing at the same instants.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use support::{Rng, poll_once};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_wheel::Wheel;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Polls `future` once with a no-op waker, through a pin.
fn poll_pinned<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    poll_once(Pin::new(future))
}

#[tokio::test(start_paused = true)]
async fn a_sleep_reset_to_the_past_is_ready_on_the_next_poll() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let mut sleep = wheel.sleep(ms(100));
    assert!(poll_pinned(&mut sleep).is_pending(), "registered");
    support::settle().await;
    Pin::new(&mut sleep).reset(start - ms(1));
    assert!(
        poll_pinned(&mut sleep).is_ready(),
        "registered, reset to the past"
    );

    // After it fired, too.
    let mut fired = wheel.sleep(ms(10));
    (&mut fired).await;
    Pin::new(&mut fired).reset(Instant::now());
    assert!(poll_pinned(&mut fired).is_ready(), "fired, reset to now");
    Pin::new(&mut fired).reset(Instant::now() + ms(5));
    assert!(poll_pinned(&mut fired).is_pending(), "re-armed for later");
    assert!(!fired.is_elapsed());
}

/// tokio's `immediate_sleep` and `is_elapsed`: a sleep is elapsed once polled ready or fired,
/// not merely because its deadline passed.
#[tokio::test(start_paused = true)]
async fn is_elapsed_means_polled_ready_or_fired_as_tokios() {
    let wheel = Wheel::new();
    let now = Instant::now();
    let mut ours = wheel.sleep_until(now);
    let mut theirs = Box::pin(tokio::time::sleep_until(now));
    assert_eq!(ours.is_elapsed(), theirs.is_elapsed());
    assert!(!ours.is_elapsed(), "never polled");
    assert!(poll_pinned(&mut ours).is_ready());
    assert!(poll_once(theirs.as_mut()).is_ready());
    assert!(ours.is_elapsed() && theirs.is_elapsed(), "polled ready");

    // Unpolled past its deadline: not elapsed (tokio's was never registered either).
    let unpolled = wheel.sleep(ms(10));
    let tokio_unpolled = tokio::time::sleep(ms(10));
    tokio::time::advance(ms(20)).await;
    assert!(!unpolled.is_elapsed());
    assert_eq!(unpolled.is_elapsed(), tokio_unpolled.is_elapsed());

    // Registered, then the clock passes it: elapsed once the wheel fired it, unpolled since.
    let mut registered = wheel.sleep(ms(10));
    assert!(poll_pinned(&mut registered).is_pending());
    assert!(!registered.is_elapsed());
    tokio::time::advance(ms(10)).await;
    support::settle().await;
    assert!(registered.is_elapsed(), "fired by the wheel");
}

/// Registers a sleep, a timeout and an interval tick due in 10 ms, advances the paused clock
/// by 10 ms and polls each once, with no yield in between: each must be ready (as tokio's own
/// sleep is, when the clock sits on tokio's millisecond grid: `on_grid`).
async fn advance_then_poll(on_grid: bool) {
    let wheel = Wheel::new();
    let mut sleep = wheel.sleep(ms(10));
    let mut timeout = Box::pin(wheel.timeout(ms(10), std::future::pending::<()>()));
    let mut interval = wheel.interval(ms(10));
    assert!(
        poll_once(interval.tick()).is_ready(),
        "the first tick is immediate"
    );
    let mut tokio_sleep = Box::pin(tokio::time::sleep(ms(10)));
    assert!(poll_pinned(&mut sleep).is_pending());
    assert!(poll_once(timeout.as_mut()).is_pending());
    assert!(poll_once(interval.tick()).is_pending());
    assert!(poll_once(tokio_sleep.as_mut()).is_pending());

    tokio::time::advance(ms(10)).await;
    // No further yield: the actor may not have run since the clock moved.
    if on_grid {
        assert!(poll_once(tokio_sleep.as_mut()).is_ready(), "tokio's own");
    }
    assert!(poll_pinned(&mut sleep).is_ready());
    assert!(matches!(poll_once(timeout.as_mut()), Poll::Ready(Err(_))));
    assert!(poll_once(interval.tick()).is_ready());
}

#[tokio::test(start_paused = true)]
async fn advance_then_poll_completes_everything_due_without_extra_yields() {
    advance_then_poll(true).await;
}

#[test]
fn advance_then_poll_completes_everything_due_after_pause_inside_a_running_runtime() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // Off tokio's millisecond grid, where any wake-up through tokio's timer is rounded up
        // (tokio's own sleep would need 11 ms here): the handles must not depend on one.
        std::thread::sleep(Duration::from_micros(1_300));
        tokio::time::pause();
        tokio::time::advance(Duration::from_micros(400)).await;
        advance_then_poll(false).await;
    });
}

#[tokio::test(start_paused = true)]
async fn burst_returns_every_overdue_tick_back_to_back_as_tokio_does() {
    let wheel = Wheel::new();
    let mut ours = wheel.interval(ms(10));
    let mut theirs = tokio::time::interval(ms(10));
    ours.tick().await;
    theirs.tick().await;
    let start = Instant::now();
    // Registered before the clock moves, so the overdue ticks are re-armed timers.
    assert!(poll_once(ours.tick()).is_pending());
    assert!(poll_once(theirs.tick()).is_pending());
    tokio::time::advance(ms(35)).await;
    for n in 1..=3 {
        let Poll::Ready(tick) = poll_once(ours.tick()) else {
            panic!("overdue tick {n} was pending");
        };
        let Poll::Ready(tokio_tick) = poll_once(theirs.tick()) else {
            panic!("tokio's overdue tick {n} was pending");
        };
        assert_eq!(tick, tokio_tick);
        assert_eq!(tick, start + ms(10 * n));
    }
    assert!(poll_once(ours.tick()).is_pending());
    assert!(poll_once(theirs.tick()).is_pending());
}

/// When each of `delays` completes, from a common start: ours and tokio's, side by side, both
/// driven by auto-advance.
async fn completions(wheel: &Wheel, delays: &[Duration]) -> Vec<(Duration, Duration)> {
    let start = Instant::now();
    let tasks: Vec<_> = delays
        .iter()
        .map(|&delay| {
            let ours = wheel.sleep(delay);
            let ours = tokio::spawn(async move {
                ours.await;
                start.elapsed()
            });
            let theirs = tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                start.elapsed()
            });
            (ours, theirs)
        })
        .collect();
    let mut done = Vec::new();
    for (ours, theirs) in tasks {
        done.push((ours.await.unwrap(), theirs.await.unwrap()));
    }
    done
}

#[tokio::test(start_paused = true)]
async fn sleeps_complete_when_tokio_sleeps_with_the_same_deadline_do() {
    let wheel = Wheel::new();
    let mut rng = Rng(17);
    let delays: Vec<Duration> = (0..300).map(|_| rng.millis(3_000)).collect();
    for ((ours, theirs), delay) in completions(&wheel, &delays).await.into_iter().zip(&delays) {
        assert!(ours >= *delay, "early: {delay:?} completed at {ours:?}");
        assert_eq!(ours, theirs, "deadline {delay:?}");
    }
}

#[test]
fn pause_inside_a_running_runtime_rounds_deadlines_once_as_tokio_does() {
    // Each round leaves tokio's millisecond grid at another phase before pausing the clock,
    // with one wheel built before the pause (off every grid) and one after.
    for round in 0..12u64 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let built_before = Wheel::new();
            std::thread::sleep(Duration::from_micros(300 + round * 83));
            tokio::time::pause();
            tokio::time::advance(Duration::from_micros(100 + round * 37)).await;
            let built_after = Wheel::new();
            let mut rng = Rng(5 + round);
            let delays: Vec<Duration> = (0..100)
                .map(|i| {
                    if i % 2 == 0 {
                        ms(1 + rng.below(300))
                    } else {
                        rng.millis(300)
                    }
                })
                .collect();
            for wheel in [&built_before, &built_after] {
                let done = completions(wheel, &delays).await;
                for ((ours, theirs), delay) in done.into_iter().zip(&delays) {
                    assert!(ours >= *delay, "early: {delay:?} completed at {ours:?}");
                    // Never later than tokio's own: rounded once. (It can be earlier: the
                    // actor may be awake for another timer past this one's exact deadline.)
                    assert!(
                        ours <= theirs,
                        "round {round}, {delay:?}: {ours:?} vs {theirs:?}"
                    );
                }
            }
        });
    }
}

#[tokio::test(start_paused = true)]
async fn timeouts_elapse_when_tokio_timeouts_do() {
    let wheel = Wheel::new();
    let mut rng = Rng(9);
    for _ in 0..50 {
        let delay = rng.millis(200);
        let start = Instant::now();
        let (ours, theirs) = tokio::join!(
            async {
                let result = wheel.timeout(delay, std::future::pending::<()>()).await;
                (result.is_err(), start.elapsed())
            },
            async {
                let result = tokio::time::timeout(delay, std::future::pending::<()>()).await;
                (result.is_err(), start.elapsed())
            }
        );
        assert_eq!(ours, theirs, "timeout of {delay:?}");
        assert!(ours.0 && ours.1 >= delay);
    }
}

/// Ticks of ours and tokio's interval, with the same stalls between ticks.
async fn ticks_side_by_side(behavior: MissedTickBehavior, stalls: &[u64]) {
    let wheel = Wheel::new();
    let start = Instant::now();
    let mut ours = wheel.interval_at(start + ms(3), ms(10));
    let mut theirs = tokio::time::interval_at(start + ms(3), ms(10));
    ours.set_missed_tick_behavior(behavior);
    theirs.set_missed_tick_behavior(behavior);
    for &stall in stalls {
        tokio::time::sleep(ms(stall)).await;
        let (a, b) = tokio::join!(ours.tick(), theirs.tick());
        assert_eq!(a, b, "{behavior:?}: scheduled instants differ");
        assert_eq!(ours.next().await, Some(theirs.tick().await), "{behavior:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn every_missed_tick_behavior_matches_tokio() {
    let stalls = [0, 0, 25, 3, 0, 47, 12, 0, 100, 1, 9, 0];
    for behavior in [
        MissedTickBehavior::Burst,
        MissedTickBehavior::Delay,
        MissedTickBehavior::Skip,
    ] {
        ticks_side_by_side(behavior, &stalls).await;
    }
}

/// How many of `steps` awaits of `$step` a loop gets through before a task spawned just
/// before it runs: on a current-thread runtime, that is when the loop first yields. `None`:
/// it never yielded.
macro_rules! steps_before_yield {
    ($steps:expr, $step:expr) => {{
        // Start on a fresh budget.
        tokio::task::yield_now().await;
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        let other =
            tokio::spawn(async move { flag.store(true, std::sync::atomic::Ordering::SeqCst) });
        let mut yielded = None;
        for done in 0..$steps {
            if yielded.is_none() && ran.load(std::sync::atomic::Ordering::SeqCst) {
                yielded = Some(done);
            }
            let _ = $step.await;
        }
        other.await.unwrap();
        yielded
    }};
}

#[tokio::test(start_paused = true)]
async fn due_timers_are_ready_on_the_poll_however_much_budget_the_task_has_spent() {
    // The contract: polled at or after its deadline, a sleep (a timeout, a Burst tick) is
    // Ready on that poll. tokio's spend the task's cooperative budget and turn Pending after
    // 128 completions in one turn; ours do not spend it (a deviation, in the CHANGELOG).
    let wheel = Wheel::new();
    let mut sleeps: Vec<_> = (1..=2_000u64)
        .map(|i| wheel.sleep(Duration::from_micros(i * 977)))
        .collect();
    let mut timeouts: Vec<_> = (1..=500u64)
        .map(|i| Box::pin(wheel.timeout_at(Instant::now() + ms(i), std::future::pending::<()>())))
        .collect();
    for sleep in &mut sleeps {
        assert!(poll_pinned(sleep).is_pending());
    }
    for timeout in &mut timeouts {
        assert!(poll_once(timeout.as_mut()).is_pending());
    }
    tokio::time::advance(Duration::from_secs(2)).await;
    for (n, sleep) in sleeps.iter_mut().enumerate() {
        assert!(poll_pinned(sleep).is_ready(), "sleep {n}");
    }
    for (n, timeout) in timeouts.iter_mut().enumerate() {
        assert!(poll_once(timeout.as_mut()).is_ready(), "timeout {n}");
    }
    let mut ticks = wheel.interval_at(Instant::now() - Duration::from_secs(1), ms(1));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Burst);
    for n in 0..1_000 {
        assert!(
            poll_pinned(&mut Box::pin(ticks.tick())).is_ready(),
            "tick {n}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn awaiting_jobs_and_expirations_yields_to_the_scheduler_when_tokio_would() {
    // Awaiting a finished `JoinHandle` or receiving a buffered message spends tokio's task
    // budget, so a loop over them gives the worker back every so often. Awaiting finished
    // jobs and a batch of expirations must do the same, at the same step.
    let wheel = Wheel::new();

    // Awaiting finished jobs, as awaiting finished tokio tasks.
    let tasks: Vec<_> = (0..1_000).map(|_| tokio::spawn(async {})).collect();
    while !tasks.iter().all(|task| task.is_finished()) {
        tokio::task::yield_now().await;
    }
    let mut tasks = tasks.into_iter();
    let theirs = steps_before_yield!(1_000, tasks.next().unwrap());
    let jobs: Vec<_> = (0..1_000)
        .map(|_| wheel.spawn_after(Duration::ZERO, async {}))
        .collect();
    while !jobs.iter().all(|job| job.is_finished()) {
        tokio::time::sleep(ms(1)).await;
    }
    let mut jobs = jobs.into_iter();
    let ours = steps_before_yield!(1_000, jobs.next().unwrap());
    assert!(theirs.is_some(), "awaiting tokio's tasks yields");
    assert_eq!(ours, theirs, "finished jobs");

    // Expirations handed over in one batch at shutdown, as a channel's buffered messages.
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    for n in 0..1_000 {
        sender.send(n).unwrap();
    }
    let theirs = steps_before_yield!(1_000, receiver.recv());
    let (timers, mut expirations) = wheel.keyed::<u32, ()>();
    for n in 0..1_000 {
        timers.set(n, (), Duration::from_secs(3_600));
    }
    wheel.shutdown().await;
    let ours = steps_before_yield!(1_000, expirations.next());
    assert!(theirs.is_some(), "tokio's channel yields");
    assert_eq!(ours, theirs, "expirations flushed at shutdown");
}

#[tokio::test]
async fn a_timeout_fires_even_when_its_future_always_spends_the_whole_budget() {
    // The inner future spends the last of the budget on every poll, then yields. A timer
    // that refused to run without budget would never get to say the deadline passed.
    let wheel = Wheel::new();
    let greedy = async {
        loop {
            tokio::task::coop::consume_budget().await;
        }
    };
    let outcome =
        tokio::time::timeout(Duration::from_secs(10), wheel.timeout(ms(20), greedy)).await;
    assert!(
        matches!(outcome, Ok(Err(_))),
        "the wheel's timeout elapsed (not tokio's 10 s guard)"
    );
}
