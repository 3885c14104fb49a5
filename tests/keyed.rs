//! Keyed timers: set, reset, remove, take, drain, len, and the expirations stream.

mod support;

use std::time::Duration;

use futures::StreamExt;
use support::settle;
use tokio::time::Instant;
use tokio_wheel::{Expirations, Timers, Wheel};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[tokio::test(start_paused = true)]
async fn entries_expire_in_deadline_order_with_their_values() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u32, String>();
    timers.set(3, "c".into(), secs(30));
    timers.set(1, "a".into(), secs(10));
    timers.set(2, "b".into(), secs(20));
    for (key, value, due) in [(1, "a", 10), (2, "b", 20), (3, "c", 30)] {
        let e = expired.next().await.unwrap();
        assert_eq!((e.key(), e.value().as_str()), (&key, value));
        assert_eq!(e.deadline(), start + secs(due));
        assert!(!e.is_shutdown());
        let at = start.elapsed();
        assert!(
            at >= secs(due) && at <= secs(due) + Duration::from_millis(2),
            "{at:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn set_replaces_value_and_deadline() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<&str, u32>();
    timers.set("k", 1, secs(10));
    timers.set("k", 2, secs(40));
    assert_eq!(timers.len().await, 1);
    let e = expired.next().await.unwrap();
    assert_eq!(e.into_parts(), ("k", 2));
    assert!(start.elapsed() >= secs(40));
}

#[tokio::test(start_paused = true)]
async fn reset_postpones_and_advances() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<&str, ()>();
    timers.set("postponed", (), secs(10));
    timers.set("advanced", (), secs(100));
    timers.reset(&"postponed", secs(50));
    timers.reset_at(&"advanced", start + secs(5));
    timers.reset(&"absent", secs(1)); // no-op
    let first = expired.next().await.unwrap();
    assert_eq!(*first.key(), "advanced");
    assert_eq!(first.deadline(), start + secs(5));
    let second = expired.next().await.unwrap();
    assert_eq!(*second.key(), "postponed");
    assert!(start.elapsed() >= secs(50));
    assert_eq!(timers.len().await, 0);
}

#[tokio::test(start_paused = true)]
async fn removed_entries_never_expire() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    timers.set(1, 1, secs(1));
    timers.set(2, 2, secs(2));
    timers.remove(&1);
    timers.remove(&9); // absent: nothing happens
    assert_eq!(expired.next().await.unwrap().into_parts(), (2, 2));
    drop(timers);
    assert!(
        expired.next().await.is_none(),
        "stream ends: no handle and nothing pending"
    );
}

#[tokio::test(start_paused = true)]
async fn take_is_authoritative() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u8, &str>();
    timers.set(1, "kept", secs(1));
    timers.set(2, "taken", secs(1));
    assert_eq!(timers.take(&2).await, Some("taken"));
    assert_eq!(timers.take(&2).await, None);
    assert_eq!(expired.next().await.unwrap().into_parts(), (1, "kept"));
    assert_eq!(timers.take(&1).await, None, "already fired");
}

#[tokio::test(start_paused = true)]
async fn drain_removes_everything_now() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    for k in 0..100 {
        timers.set(k, k * 10, secs(u64::from(k) + 1));
    }
    assert_eq!(timers.len().await, 100);
    let mut drained = timers.drain().await;
    drained.sort_unstable();
    assert_eq!(drained, (0..100).map(|k| (k, k * 10)).collect::<Vec<_>>());
    assert!(timers.is_empty().await);
    drop(timers);
    assert!(expired.next().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn commands_from_one_handle_apply_in_order() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    // set → reset → remove → set: only the last set survives, at its own deadline.
    timers.set(1, 1, secs(5));
    timers.reset(&1, secs(1));
    timers.remove(&1);
    timers.set(1, 2, secs(3));
    let start = Instant::now();
    let e = expired.next().await.unwrap();
    assert_eq!(e.into_parts(), (1, 2));
    assert!(start.elapsed() >= secs(3));
}

#[tokio::test(start_paused = true)]
async fn the_stream_stays_open_while_entries_are_pending() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    timers.set(7, 7, secs(60));
    drop(timers);
    let e = expired.next().await.unwrap();
    assert_eq!(e.into_parts(), (7, 7));
    assert!(expired.next().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn clones_share_one_set() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    let other = timers.clone();
    timers.set(1, 1, secs(1));
    assert_eq!(other.take(&1).await, Some(1));
    other.set(2, 2, secs(1));
    drop((timers, other));
    assert_eq!(expired.next().await.unwrap().into_parts(), (2, 2));
    assert!(expired.next().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn unread_expirations_are_buffered_and_counted() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, ()>();
    for k in 0..10 {
        timers.set(k, (), Duration::from_millis(10));
    }
    tokio::time::sleep(secs(1)).await;
    assert_eq!(wheel.stats().expirations_backlog, 10);
    for _ in 0..3 {
        expired.next().await.unwrap();
    }
    assert_eq!(wheel.stats().expirations_backlog, 7);
    drop(expired);
    assert_eq!(wheel.stats().expirations_backlog, 0);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_stream_never_stalls_the_wheel() {
    let wheel = Wheel::new();
    let (timers, expired) = wheel.keyed::<u32, u32>();
    drop(expired);
    for k in 0..1_000 {
        timers.set(k, k, Duration::from_millis(u64::from(k % 50) + 1));
    }
    wheel.sleep(secs(1)).await;
    assert_eq!(timers.len().await, 0);
    let stats = wheel.stats();
    assert_eq!(stats.fired, 1_001);
    assert_eq!(stats.expirations_backlog, 0);
}

#[tokio::test(start_paused = true)]
async fn keyed_stats_add_up() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    for k in 0..50 {
        timers.set(k, k, secs(u64::from(k) + 1));
    }
    for k in 0..10 {
        timers.remove(&k);
    }
    for _ in 0..20 {
        expired.next().await.unwrap();
    }
    settle().await;
    let s = wheel.stats();
    assert_eq!(
        (s.inserted, s.cancelled, s.fired, s.pending),
        (50, 10, 20, 20)
    );
    assert_eq!(s.inserted, s.fired + s.cancelled + s.pending);
}

#[test]
fn keyed_handles_have_the_promised_traits() {
    support::assert_send::<Timers<String, Vec<u8>>>();
    support::assert_sync::<Timers<String, Vec<u8>>>();
    support::assert_send::<Expirations<String, Vec<u8>>>();
    support::assert_unpin::<Expirations<String, Vec<u8>>>();
}

#[tokio::test(start_paused = true)]
async fn a_key_postponed_past_another_expires_after_it_even_when_the_clock_jumps() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<&str, ()>();
    timers.set("a", (), Duration::from_millis(5));
    timers.set("b", (), Duration::from_millis(7));
    // "a" is postponed lazily: it stays filed for 5 ms and is re-filed when that tick comes.
    timers.reset(&"a", Duration::from_millis(9));
    assert_eq!(timers.len().await, 2);
    // The clock jumps past both before the actor runs again.
    tokio::time::advance(Duration::from_millis(20)).await;
    let first = expired.next().await.unwrap();
    let second = expired.next().await.unwrap();
    assert_eq!(
        (*first.key(), *second.key()),
        ("b", "a"),
        "deadline order across ticks"
    );
    assert!(first.deadline() < second.deadline());
}

#[tokio::test(start_paused = true)]
async fn a_set_no_one_can_observe_stops_and_drops_its_values() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let wheel = Wheel::new();
    let alive = std::sync::Arc::new(());
    let (timers, expired) = wheel.keyed::<u32, std::sync::Arc<()>>();
    for key in 0..100 {
        timers.set(key, alive.clone(), secs(3_600));
    }
    assert_eq!(timers.len().await, 100);
    let actors = metrics.num_alive_tasks();
    drop(expired);
    drop(timers);
    settle().await;
    assert_eq!(
        metrics.num_alive_tasks(),
        actors - 1,
        "the keyed actor stopped"
    );
    assert_eq!(
        std::sync::Arc::strong_count(&alive),
        1,
        "its values were dropped"
    );
}

#[tokio::test(start_paused = true)]
async fn a_drain_after_the_wheel_cascaded_keeps_the_set_working() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    timers.set(1, 1, Duration::from_millis(1_500));
    timers.set(2, 2, secs(3_600));
    // Key 1 has cascaded from the seconds level down by now (when its second began).
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert!(wheel.stats().cascades > 0);
    let mut drained = timers.drain().await;
    drained.sort_unstable();
    assert_eq!(drained, [(1, 1), (2, 2)]);
    timers.set(3, 3, secs(1));
    assert_eq!(expired.next().await.unwrap().into_parts(), (3, 3));
    settle().await;
    let stats = wheel.stats();
    assert_eq!(
        stats.inserted,
        stats.fired + stats.cancelled + stats.pending
    );
}

/// A `set` made while the actor works through a flood, just before the last `Timers` goes,
/// is applied in order and fires at its deadline; then the stream ends (API.md §3). The
/// actor's look for a last command before it stops took it into its batch and left it
/// there, and its next turn's take tripped over it (a panic that stopped the whole wheel, so
/// the entry came out flushed as by a shutdown; in a release build, commands sent meanwhile
/// could be applied ahead of it).
#[tokio::test(start_paused = true)]
async fn a_set_sent_as_the_last_timers_goes_during_a_flood_fires_then_the_stream_ends() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u64, u64>();
    // Removes of absent keys: nothing is filed, but applying them takes the actor more than
    // one slice, and it lets other tasks run in between.
    for key in 0..200_000 {
        timers.remove(&key);
    }
    let last = timers.clone();
    drop(timers);
    let sender = tokio::spawn(async move {
        last.set(u64::MAX, 7, secs(5));
    });
    let start = Instant::now();
    let e = expired.next().await.unwrap();
    assert!(!e.is_shutdown(), "flushed: the wheel stopped");
    assert_eq!(e.into_parts(), (u64::MAX, 7));
    assert_eq!(start.elapsed(), secs(5));
    assert!(expired.next().await.is_none());
    sender.await.unwrap();
    assert!(!wheel.is_shutdown());
}
