//! Sleep futures: deadlines, registration, reset, cancel on drop, saturation.

mod support;

use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use support::{assert_send, assert_unpin, poll_once, settle};
use tokio::time::Instant;
use tokio_wheel::{Sleep, Wheel};

const TICK: Duration = Duration::from_millis(1);

#[tokio::test(start_paused = true)]
async fn sleep_completes_at_its_deadline_and_not_before() {
    let wheel = Wheel::new();
    for millis in [1, 7, 999, 1_000, 1_001, 61_234, 3_600_000 + 5] {
        let start = Instant::now();
        wheel.sleep(Duration::from_millis(millis)).await;
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(millis),
            "{millis} ms sleep took {took:?}"
        );
        assert!(
            took <= Duration::from_millis(millis) + TICK * 2,
            "{millis} ms sleep took {took:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn many_sleeps_fire_in_deadline_order_and_never_early() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (sender, mut fired) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..500u64 {
        let delay = Duration::from_millis((i * 7_919) % 90_000 + 1);
        let sleep = wheel.sleep_until(start + delay);
        let sender = sender.clone();
        tokio::spawn(async move {
            sleep.await;
            sender.send((delay, start.elapsed())).unwrap();
        });
    }
    drop(sender);
    let mut last = Duration::ZERO;
    let mut count = 0;
    while let Some((delay, at)) = fired.recv().await {
        assert!(at >= delay, "fired early: due {delay:?}, at {at:?}");
        assert!(
            at <= delay + TICK * 2,
            "fired late: due {delay:?}, at {at:?}"
        );
        assert!(delay >= last || delay.abs_diff(last) < TICK, "out of order");
        last = last.max(delay);
        count += 1;
    }
    assert_eq!(count, 500);
}

#[tokio::test(start_paused = true)]
async fn deadline_at_or_before_now_resolves_on_first_poll_without_the_actor() {
    let wheel = Wheel::new();
    assert_eq!(poll_once(wheel.sleep(Duration::ZERO)), Poll::Ready(()));
    assert_eq!(
        poll_once(wheel.sleep_until(Instant::now())),
        Poll::Ready(())
    );
    let past = Instant::now() - Duration::from_secs(5);
    assert_eq!(poll_once(wheel.sleep_until(past)), Poll::Ready(()));
    settle().await;
    assert_eq!(
        wheel.stats().inserted,
        0,
        "no timer registered for a past deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn registration_happens_on_first_poll() {
    let wheel = Wheel::new();
    let mut sleep = wheel.sleep(Duration::from_secs(1));
    settle().await;
    assert_eq!(wheel.stats().inserted, 0);
    assert!(poll_once(&mut sleep).is_pending());
    settle().await;
    assert_eq!(wheel.stats().inserted, 1);
    assert_eq!(wheel.stats().pending, 1);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_sleep_cancels_and_reclaims_its_timer() {
    let wheel = Wheel::new();
    let mut sleep = wheel.sleep(Duration::from_secs(60));
    assert!(poll_once(&mut sleep).is_pending());
    settle().await;
    assert_eq!(wheel.stats().pending, 1);
    drop(sleep);
    settle().await;
    let stats = wheel.stats();
    assert_eq!((stats.pending, stats.cancelled, stats.fired), (0, 1, 0));
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(wheel.stats().fired, 0, "a cancelled timer never fires");
}

#[tokio::test(start_paused = true)]
async fn dropping_before_the_actor_takes_it_withdraws_it() {
    let wheel = Wheel::new();
    let arm = || {
        let mut sleep = wheel.sleep(Duration::from_secs(60));
        assert!(poll_once(&mut sleep).is_pending());
        sleep
    };
    // Dropped in the order they were made: each leaves a placeholder in the queue, and the
    // last (the queue's last command) takes itself and those placeholders back.
    let sleeps: Vec<_> = (0..100).map(|_| arm()).collect();
    drop(sleeps);
    settle().await;
    let stats = wheel.stats();
    assert_eq!(stats.commands, 0, "nothing reached the actor");
    assert_eq!((stats.inserted, stats.cancelled, stats.pending), (0, 0, 0));
    // With a live registration after them, the placeholders reach the actor, which skips them.
    let sleeps: Vec<_> = (0..100).map(|_| arm()).collect();
    let kept = arm();
    drop(sleeps);
    settle().await;
    let stats = wheel.stats();
    assert_eq!(stats.commands, 101);
    assert_eq!((stats.inserted, stats.cancelled, stats.pending), (1, 0, 1));
    drop(kept);
    tokio::time::sleep(Duration::from_secs(61)).await;
    let stats = wheel.stats();
    assert_eq!(
        (stats.fired, stats.cancelled),
        (0, 1),
        "a withdrawn timer never fires"
    );
}

#[tokio::test(start_paused = true)]
async fn reset_later_postpones_without_a_message() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let mut sleep = wheel.sleep(Duration::from_millis(100));
    assert!(poll_once(&mut sleep).is_pending());
    settle().await;
    let commands = wheel.stats().commands;
    for step in 1..=10 {
        Pin::new(&mut sleep).reset(start + Duration::from_millis(100 + step * 50));
    }
    settle().await;
    assert_eq!(wheel.stats().commands, commands, "postponing sent commands");
    (&mut sleep).await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(600) && took <= Duration::from_millis(602),
        "{took:?}"
    );
    assert!(
        wheel.stats().rescheduled >= 1,
        "the postponed timer was re-filed lazily"
    );
}

#[tokio::test(start_paused = true)]
async fn reset_earlier_completes_at_the_earlier_deadline() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let mut sleep = Box::pin(wheel.sleep(Duration::from_secs(3_600)));
    assert!(poll_once(&mut sleep).is_pending());
    sleep.as_mut().reset(start + Duration::from_millis(250));
    assert_eq!(sleep.deadline(), start + Duration::from_millis(250));
    sleep.as_mut().await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took <= Duration::from_millis(252),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn reset_after_completion_rearms() {
    let wheel = Wheel::new();
    let mut sleep = wheel.sleep(Duration::from_millis(10));
    (&mut sleep).await;
    assert!(sleep.is_elapsed());
    let again = Instant::now() + Duration::from_millis(40);
    Pin::new(&mut sleep).reset(again);
    assert!(!sleep.is_elapsed());
    assert!(poll_once(&mut sleep).is_pending());
    (&mut sleep).await;
    assert!(Instant::now() >= again);
    assert!(sleep.is_elapsed());
}

#[tokio::test(start_paused = true)]
async fn reset_racing_the_fire_still_waits_for_the_new_deadline() {
    // Whichever of "actor fires the old deadline" and "handle moves it later" wins, the sleep
    // must complete at the new deadline. Yielding 0..4 times walks both interleavings.
    let wheel = Wheel::new();
    for yields in 0..4 {
        let mut sleep = wheel.sleep(Duration::from_millis(10));
        assert!(poll_once(&mut sleep).is_pending());
        settle().await;
        tokio::time::advance(Duration::from_millis(10)).await;
        for _ in 0..yields {
            tokio::task::yield_now().await;
        }
        let new_deadline = Instant::now() + Duration::from_millis(50);
        Pin::new(&mut sleep).reset(new_deadline);
        (&mut sleep).await;
        assert!(
            Instant::now() >= new_deadline,
            "completed early after {yields} yields"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn duration_max_and_far_instants_saturate_and_never_fire() {
    let wheel = Wheel::new();
    let mut forever = wheel.sleep(Duration::MAX);
    assert!(forever.deadline() > Instant::now() + Duration::from_secs(86_400 * 365 * 29));
    let far = Instant::now() + Duration::from_secs(86_400 * 365 * 5);
    let mut far_sleep = wheel.sleep_until(far);
    assert!(poll_once(&mut forever).is_pending());
    assert!(poll_once(&mut far_sleep).is_pending());
    let two_years = Duration::from_secs(86_400 * 730);
    assert!(tokio::time::timeout(two_years, &mut forever).await.is_err());
    assert!(
        tokio::time::timeout(two_years, &mut far_sleep)
            .await
            .is_err()
    );
    assert_eq!(wheel.stats().fired, 0);
    assert_eq!(wheel.stats().pending, 2);
}

#[tokio::test(start_paused = true)]
async fn is_elapsed_and_deadline_report_state() {
    let wheel = Wheel::new();
    let deadline = Instant::now() + Duration::from_millis(5);
    let mut sleep = wheel.sleep_until(deadline);
    assert_eq!(sleep.deadline(), deadline);
    assert!(!sleep.is_elapsed());
    (&mut sleep).await;
    assert!(sleep.is_elapsed());
}

#[test]
fn handles_are_send_and_sleep_is_unpin() {
    assert_send::<Sleep>();
    assert_unpin::<Sleep>();
    assert_send::<Wheel>();
    support::assert_sync::<Wheel>();
}

#[test]
fn a_sleep_is_forty_bytes_as_documented() {
    // The future itself; its shared state is a 32-byte pool slot (see `Sleep`'s docs).
    assert_eq!(std::mem::size_of::<Sleep>(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeps_work_on_a_multi_thread_runtime() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let tasks: Vec<_> = (1..=50u64)
        .map(|i| {
            let wheel = wheel.clone();
            tokio::spawn(async move {
                let deadline = start + Duration::from_millis(i * 2);
                wheel.sleep_until(deadline).await;
                assert!(Instant::now() >= deadline, "fired early");
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    // Every registered sleep fired (one polled first after its deadline — a loaded machine
    // starts tasks late — completes at once without registering, so the count can be under
    // 50). Stats are published once per actor turn, which may end just after the wake-ups:
    // wait for the turn, generously.
    wheel.flush().await;
    for _ in 0..10_000 {
        let stats = wheel.stats();
        if stats.pending == 0 && stats.fired == stats.inserted {
            assert!(stats.inserted <= 50 && stats.cancelled == 0, "{stats:?}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!(
        "registered sleeps never all counted fired: {:?}",
        wheel.stats()
    );
}
