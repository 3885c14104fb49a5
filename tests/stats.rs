//! Stats: every counter moves for its own reason, and the totals add up.

mod support;

use std::pin::Pin;
use std::time::Duration;

use futures::StreamExt;
use support::{poll_once, settle};
use tokio_wheel::Wheel;

#[tokio::test(start_paused = true)]
async fn counters_add_up_across_sleeps_jobs_and_keyed_timers() {
    let wheel = Wheel::builder().name("mixed").build();
    // 10 sleeps fire, 5 are dropped while pending, 3 stay pending.
    for _ in 0..10 {
        tokio::spawn(wheel.sleep(Duration::from_millis(5)));
    }
    let mut dropped: Vec<_> = (0..5)
        .map(|_| wheel.sleep(Duration::from_secs(9)))
        .collect();
    let mut kept: Vec<_> = (0..3)
        .map(|_| wheel.sleep(Duration::from_secs(3_600)))
        .collect();
    for sleep in dropped.iter_mut().chain(kept.iter_mut()) {
        assert!(poll_once(sleep).is_pending());
    }
    // 4 jobs run, 2 are cancelled.
    let jobs: Vec<_> = (0..4)
        .map(|i| wheel.spawn_after(Duration::from_millis(7), async move { i }))
        .collect();
    let cancelled: Vec<_> = (0..2)
        .map(|_| wheel.spawn_after(Duration::from_secs(9), async {}))
        .collect();
    // 6 keyed entries: 2 removed, 4 expire.
    let (timers, mut expired) = wheel.keyed::<u8, ()>();
    for k in 0..6 {
        timers.set(k, (), Duration::from_millis(8));
    }
    // Filed first: a remove right behind its set would take the set's place in the queue,
    // and neither would count (`tests/keyed_order.rs`).
    assert_eq!(timers.len().await, 6);
    timers.remove(&0);
    timers.remove(&1);
    settle().await;
    drop(dropped);
    for job in &cancelled {
        assert!(job.cancel());
    }
    for job in jobs {
        job.await.unwrap();
    }
    for _ in 0..4 {
        expired.next().await.unwrap();
    }
    // Move one kept sleep later: absorbed lazily, no command.
    Pin::new(&mut kept[0]).reset(tokio::time::Instant::now() + Duration::from_secs(7_200));
    tokio::time::sleep(Duration::from_millis(20)).await;
    settle().await;

    let s = wheel.stats();
    assert_eq!(s.name, "mixed");
    assert_eq!(s.fired, 10 + 4 + 4, "{s:?}");
    assert_eq!(s.cancelled, 5 + 2 + 2, "{s:?}");
    assert_eq!(s.pending, 3, "{s:?}");
    assert_eq!(s.inserted, 10 + 5 + 3 + 4 + 2 + 6, "{s:?}");
    assert_eq!(s.inserted, s.fired + s.cancelled + s.pending);
    assert_eq!(s.actors, 2);
    assert!(s.commands >= s.inserted);
    assert!(s.max_lateness <= Duration::from_millis(1), "{s:?}");
}

#[tokio::test(start_paused = true)]
async fn far_timers_cascade_and_the_count_shows_it() {
    let wheel = Wheel::new();
    wheel.sleep(Duration::from_secs(2 * 3_600 + 61)).await;
    settle().await;
    let s = wheel.stats();
    // hours → minutes → seconds → milliseconds: at most one cascade per level.
    assert!((1..=4).contains(&s.cascades), "{s:?}");
}

#[tokio::test(start_paused = true)]
async fn an_idle_actor_does_not_wake_while_nothing_is_due() {
    let wheel = Wheel::new();
    let mut far: Vec<_> = (0..1_000)
        .map(|i| wheel.sleep(Duration::from_secs(86_400 + i)))
        .collect();
    for sleep in &mut far {
        assert!(poll_once(sleep).is_pending());
    }
    wheel.flush().await;
    // Let the actor finish the turn that answered the flush (a notification left over from
    // the registrations may give it one more, empty turn).
    settle().await;
    let before = wheel.stats().wakeups;
    tokio::time::sleep(Duration::from_secs(3_600)).await;
    assert_eq!(
        wheel.stats().wakeups,
        before,
        "the actor woke with nothing due"
    );
    assert_eq!(wheel.stats().pending, 1_000);
}

#[tokio::test(start_paused = true)]
async fn flush_waits_until_commands_are_applied_and_counted() {
    let wheel = Wheel::new();
    let mut sleeps: Vec<_> = (0..100)
        .map(|_| wheel.sleep(Duration::from_secs(5)))
        .collect();
    for sleep in &mut sleeps {
        assert!(poll_once(sleep).is_pending());
    }
    wheel.flush().await;
    assert_eq!(wheel.stats().pending, 100);
    drop(sleeps);
    wheel.flush().await;
    assert_eq!(wheel.stats().pending, 0);
    wheel.shutdown().await;
    wheel.flush().await; // returns at once on a stopped wheel
}

#[tokio::test(start_paused = true)]
async fn a_sleep_the_actor_fired_gives_its_slot_back_without_a_command() {
    let wheel = Wheel::new();
    let round = |n: u64| {
        let sleeps: Vec<_> = (0..n)
            .map(|i| wheel.sleep(Duration::from_millis(5 + i % 7)))
            .collect();
        futures::future::join_all(sleeps)
    };
    round(100).await;
    wheel.flush().await;
    let before = wheel.stats();
    // Each registration is one command; each drop after the actor fired its sleep is none
    // (it used to queue a release per timer).
    round(100).await;
    wheel.flush().await;
    let after = wheel.stats();
    assert_eq!(after.fired - before.fired, 100);
    assert_eq!(after.commands - before.commands, 100 + 1, "{after:?}");
    // A sleep re-armed after firing still releases through the actor.
    let mut sleep = wheel.sleep(Duration::from_millis(1));
    (&mut sleep).await;
    Pin::new(&mut sleep).reset(tokio::time::Instant::now() + Duration::from_millis(1));
    (&mut sleep).await;
    drop(sleep);
    wheel.flush().await;
    assert_eq!(wheel.stats().pending, 0);
}
