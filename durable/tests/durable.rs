//! Durable queues: scheduling, delivery, leases, retries, dead letters, restarts, locking.
//! Due times are wall-clock, so these tests run in real time with short delays.
//!
//! The behaviour both backends share runs twice: `embedded::*` on a redb file, `on_redis::*`
//! on a `redis-server` the test starts itself (feature `redis`). Leases and failing commits
//! are in `durable_leases.rs`; inspection, statistics and recurring tasks in
//! `durable_inspect.rs`.

mod support;

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{Delivery, DurableQueue, Error, RetryPolicy, Task, TaskId};

use support::backend::{Backend, Fixture, fixture, next, nothing_within};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

on_every_backend!(
    a_task_is_delivered_at_its_due_time_and_ack_deletes_it,
    generated_ids_are_unique_and_ties_go_in_schedule_order,
    cancel_and_reschedule_act_only_on_pending_tasks,
    retry_backs_off_and_the_last_attempt_goes_to_the_dead_letters,
    retry_after_uses_the_given_delay,
    an_unfinished_delivery_comes_back_after_its_lease_and_loses_it,
    scheduling_an_existing_id_replaces_it_unless_in_flight,
    a_stream_claims_at_most_its_prefetch_and_dropped_deliveries_come_back,
    tasks_survive_closing_and_reopening,
    wheel_shutdown_ends_the_streams_and_keeps_the_tasks,
    concurrent_schedules_all_become_durable,
    a_finish_made_again_is_recognised_and_another_is_lease_lost,
);

/// An `ack` is recognised by its delivery: made again it answers `Ok` (it may be repeated
/// because its first answer was lost to the caller); any other finish of the same delivery
/// answers `LeaseLost`, and none changes anything.
async fn a_finish_made_again_is_recognised_and_another_is_lease_lost(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    queue.schedule(Task::new("a").id("acked")).await.unwrap();
    queue.schedule(Task::new("f").id("failed")).await.unwrap();
    let mut deliveries = queue.deliveries();
    for _ in 0..2 {
        let d = next(&mut deliveries).await;
        if d.id().as_str() == "acked" {
            d.ack().await.unwrap();
            d.ack().await.expect("the same ack again");
            assert!(matches!(d.fail("late").await, Err(Error::LeaseLost)));
        } else {
            d.fail("bad").await.unwrap();
            assert!(matches!(d.fail("bad").await, Err(Error::LeaseLost)));
            assert!(matches!(d.ack().await, Err(Error::LeaseLost)));
        }
    }
    assert_eq!(queue.len().await.unwrap(), 0);
    let dead = queue.dead_letters().await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].id.as_str(), dead[0].reason.as_str()),
        ("failed", "bad")
    );
}

async fn a_task_is_delivered_at_its_due_time_and_ack_deletes_it(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    let due = SystemTime::now() + ms(200);
    let id = queue
        .schedule(Task::new(b"hello".to_vec()).at(due).id("greet"))
        .await
        .unwrap();
    assert_eq!(id, TaskId::from("greet"));
    assert_eq!(queue.len().await.unwrap(), 1);
    let mut deliveries = queue.deliveries();
    let d = next(&mut deliveries).await;
    let arrived = SystemTime::now();
    assert!(arrived >= due, "delivered early");
    // Generous for a loaded machine (a claim commits to the store), still short of what a
    // 1-second poller would show half the time.
    assert!(
        arrived.duration_since(due).unwrap() < ms(500),
        "delivered late: idle consumers must be woken, not poll"
    );
    assert_eq!((d.id(), d.payload(), d.attempt()), (&id, &b"hello"[..], 1));
    assert!(d.due() <= arrived && due.duration_since(d.due()).unwrap_or_default() < ms(2));
    d.ack().await.unwrap();
    assert_eq!(queue.len().await.unwrap(), 0);
    nothing_within(&mut deliveries, ms(100)).await;
}

async fn generated_ids_are_unique_and_ties_go_in_schedule_order(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    let due = SystemTime::now() + ms(50);
    let mut ids = Vec::new();
    for i in 0..20u8 {
        ids.push(queue.schedule(Task::new(vec![i]).at(due)).await.unwrap());
    }
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 20);
    let mut deliveries = queue.deliveries();
    for (i, id) in ids.iter().enumerate() {
        let d = next(&mut deliveries).await;
        assert_eq!((d.id(), d.payload()), (id, &[i as u8][..]));
        d.ack().await.unwrap();
    }
}

async fn cancel_and_reschedule_act_only_on_pending_tasks(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    let gone = queue.schedule(Task::new("x").after(ms(50))).await.unwrap();
    let moved = queue
        .schedule(Task::new("y").after(Duration::from_secs(3_600)))
        .await
        .unwrap();
    assert!(queue.cancel(&gone).await.unwrap());
    assert!(!queue.cancel(&gone).await.unwrap(), "already cancelled");
    assert!(!queue.cancel(&"unknown".into()).await.unwrap());
    assert!(
        queue
            .reschedule(&moved, SystemTime::now() + ms(100))
            .await
            .unwrap()
    );
    assert!(
        !queue
            .reschedule(&"unknown".into(), SystemTime::now())
            .await
            .unwrap()
    );
    let mut deliveries = queue.deliveries();
    let d = next(&mut deliveries).await;
    assert_eq!(d.id(), &moved, "the cancelled task never comes");
    assert!(!queue.cancel(&moved).await.unwrap(), "in flight");
    assert!(
        !queue.reschedule(&moved, SystemTime::now()).await.unwrap(),
        "in flight"
    );
    d.ack().await.unwrap();
}

async fn retry_backs_off_and_the_last_attempt_goes_to_the_dead_letters(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let policy = RetryPolicy::exponential(ms(50), ms(80)).max_attempts(3);
    let queue = f.open_with(DurableQueue::builder().retry(policy)).await;
    let id = queue.schedule(Task::new("job").id("flaky")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let mut last = std::time::Instant::now();
    for (attempt, backoff) in [(1, 0), (2, 50), (3, 80)] {
        let d = next(&mut deliveries).await;
        assert_eq!(d.attempt(), attempt);
        assert!(
            last.elapsed() >= ms(backoff),
            "attempt {attempt} came before its backoff"
        );
        last = std::time::Instant::now();
        d.retry().await.unwrap();
    }
    nothing_within(&mut deliveries, ms(200)).await;
    assert_eq!(queue.len().await.unwrap(), 0);
    let dead = queue.dead_letters().await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (&dead[0].id, dead[0].attempts, dead[0].payload.as_slice()),
        (&id, 3, &b"job"[..])
    );
    assert!(
        dead[0].reason.contains("last delivery"),
        "{}",
        dead[0].reason
    );

    // Redrive resets the attempt count.
    assert!(queue.redrive(&id).await.unwrap());
    assert!(!queue.redrive(&id).await.unwrap(), "no longer dead");
    let d = next(&mut deliveries).await;
    assert_eq!((d.id(), d.attempt()), (&id, 1));
    d.fail("bad payload").await.unwrap();
    let dead = queue.dead_letters().await.unwrap();
    assert_eq!(dead[0].reason, "bad payload");
    assert!(
        !queue.cancel(&id).await.unwrap(),
        "dead tasks cannot be cancelled"
    );
}

async fn retry_after_uses_the_given_delay(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    queue.schedule(Task::new("p").id("later")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let d = next(&mut deliveries).await;
    let start = std::time::Instant::now();
    d.retry_after(ms(150)).await.unwrap();
    let again = next(&mut deliveries).await;
    assert!(start.elapsed() >= ms(150));
    assert_eq!(again.attempt(), 2);
    again.ack().await.unwrap();
}

async fn an_unfinished_delivery_comes_back_after_its_lease_and_loses_it(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open_with(DurableQueue::builder().lease(ms(150))).await;
    queue.schedule(Task::new("p").id("slow")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let first = next(&mut deliveries).await;
    let start = std::time::Instant::now();
    let second = next(&mut deliveries).await;
    assert!(
        start.elapsed() >= ms(140),
        "redelivered before the lease ended"
    );
    assert_eq!(second.attempt(), 2);
    assert_eq!(
        first.ack().await,
        Err(Error::LeaseLost),
        "the old delivery lost its lease"
    );
    assert_eq!(first.retry().await, Err(Error::LeaseLost));
    second.ack().await.unwrap();
    assert_eq!(queue.len().await.unwrap(), 0);
}

async fn scheduling_an_existing_id_replaces_it_unless_in_flight(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    queue
        .schedule(Task::new("old").id("k").after(ms(100)))
        .await
        .unwrap();
    queue
        .schedule(Task::new("new").id("k").after(ms(50)))
        .await
        .unwrap();
    assert_eq!(queue.len().await.unwrap(), 1);
    let mut deliveries = queue.deliveries();
    let d = next(&mut deliveries).await;
    assert_eq!(d.payload(), b"new");
    assert_eq!(
        queue.schedule(Task::new("x").id("k")).await,
        Err(Error::InFlight)
    );
    d.fail("give up").await.unwrap();
    queue.schedule(Task::new("revived").id("k")).await.unwrap();
    assert!(
        queue.dead_letters().await.unwrap().is_empty(),
        "a dead id is replaced"
    );
    assert_eq!(next(&mut deliveries).await.payload(), b"revived");
}

async fn a_stream_claims_at_most_its_prefetch_and_dropped_deliveries_come_back(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f
        .open_with(
            DurableQueue::builder()
                .prefetch(3)
                .lease(Duration::from_secs(60)),
        )
        .await;
    for i in 0..10 {
        queue
            .schedule(Task::new("p").id(format!("t{i}")))
            .await
            .unwrap();
    }
    let producer_only = queue.clone(); // never calls deliveries(): claims nothing
    let mut greedy = queue.deliveries();
    let first = next(&mut greedy).await;
    tokio::time::sleep(ms(50)).await;
    let mut other = queue.deliveries();
    let mut seen = HashSet::new();
    for _ in 0..7 {
        let d = next(&mut other).await;
        assert!(seen.insert(d.id().clone()));
        d.ack().await.unwrap();
    }
    nothing_within(&mut other, ms(100)).await;
    assert_eq!(
        producer_only.len().await.unwrap(),
        3,
        "the greedy stream holds 3 claimed"
    );
    first.ack().await.unwrap();
    // Two claimed, never read: back at once (within `next`'s 5 s, not after the 60 s
    // lease), not counted as deliveries.
    drop(greedy);
    for _ in 0..2 {
        let d = next(&mut other).await;
        assert_eq!(d.attempt(), 1);
        assert!(seen.insert(d.id().clone()));
        d.ack().await.unwrap();
    }
    assert_eq!(queue.len().await.unwrap(), 0);
}

/// Schedules a, b, c (overdue by reopening), a far task and one held in flight, then closes.
/// Opens with a prefetch of 1, so only "held" is ever claimed, however slow the machine.
async fn leave_tasks_behind(f: &Fixture, lease: Duration) -> Delivery {
    let queue = f
        .open_with(DurableQueue::builder().lease(lease).prefetch(1))
        .await;
    let now = SystemTime::now();
    for (id, offset) in [("c", 30), ("a", 10), ("b", 20)] {
        queue
            .schedule(Task::new(id).id(id).at(now + ms(offset)))
            .await
            .unwrap();
    }
    queue
        .schedule(
            Task::new("later")
                .id("later")
                .after(Duration::from_secs(3_600)),
        )
        .await
        .unwrap();
    queue
        .schedule(Task::new("held").id("held").at(now))
        .await
        .unwrap();
    let mut deliveries = queue.deliveries();
    let held = next(&mut deliveries).await;
    assert_eq!(held.id().as_str(), "held");
    drop(deliveries);
    queue.close().await;
    assert_eq!(held.ack().await, Err(Error::Closed));
    tokio::time::sleep(ms(50)).await; // everything is overdue now
    held
}

async fn tasks_survive_closing_and_reopening(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let lease = ms(300);
    leave_tasks_behind(&f, lease).await;
    let queue = f
        .open_with(DurableQueue::builder().lease(lease).prefetch(1))
        .await;
    assert_eq!(queue.len().await.unwrap(), 5);
    let mut deliveries = queue.deliveries();
    let mut order = Vec::new();
    for _ in 0..4 {
        let d = next(&mut deliveries).await;
        order.push((d.id().to_string(), d.attempt()));
        d.ack().await.unwrap();
    }
    // Overdue ones come in due order; the one in flight at the close comes back with its
    // attempt counted (at once on the embedded store, after its lease on Redis).
    let overdue: Vec<_> = order
        .iter()
        .filter(|(id, _)| id != "held")
        .cloned()
        .collect();
    assert_eq!(
        overdue,
        [("a".into(), 1), ("b".into(), 1), ("c".into(), 1)] as [(String, u32); 3]
    );
    assert!(order.contains(&("held".into(), 2)), "{order:?}");
    assert_eq!(queue.len().await.unwrap(), 1, "the far task waits");
}

#[tokio::test]
async fn on_the_embedded_store_in_flight_tasks_come_back_at_once_after_a_restart() {
    let f = fixture(Backend::Embedded).unwrap();
    let lease = Duration::from_secs(3_600);
    leave_tasks_behind(&f, lease).await;
    let queue = f
        .open_with(DurableQueue::builder().lease(lease).prefetch(1))
        .await;
    let mut deliveries = queue.deliveries();
    let mut ids = Vec::new();
    for _ in 0..4 {
        let d = next(&mut deliveries).await;
        ids.push(d.id().to_string());
        d.ack().await.unwrap();
    }
    // The holder is gone (the lock proves it), so "held" is due at the reopen: after the three
    // that were due before it, and long before its hour-long lease would end.
    assert_eq!(ids, ["a", "b", "c", "held"]);
}

#[tokio::test]
async fn a_held_store_is_locked_until_released() {
    let f = fixture(Backend::Embedded).unwrap();
    let queue = f.open().await;
    let second = DurableQueue::open(f.path(), &f.wheel).await;
    assert_eq!(second.unwrap_err(), Error::Locked);
    queue.close().await;
    let queue = DurableQueue::open(f.path(), &f.wheel)
        .await
        .expect("released by close");
    // Dropping every handle releases it too: the very next open gets it, although the
    // engine lets go of the file a few milliseconds later (an outside attack saw `Locked`
    // for 4-28 ms after the drop; an open now waits for a store whose handles are gone,
    // whether or not its engine has noticed yet).
    let mut queue = queue;
    for round in 0..20 {
        let id = format!("r{round}");
        queue
            .schedule(Task::new("x").id(id.as_str()))
            .await
            .unwrap();
        let stream = queue.deliveries();
        drop((queue, stream));
        queue = DurableQueue::open(f.path(), &f.wheel)
            .await
            .unwrap_or_else(|error| panic!("round {round}: not released by the drop: {error}"));
        assert_eq!(queue.len().await.unwrap(), round + 1, "nothing lost");
    }
    // A handle still alive holds it: refused at once, not waited for.
    let second = DurableQueue::open(f.path(), &f.wheel).await;
    assert_eq!(second.unwrap_err(), Error::Locked);
}

#[tokio::test]
async fn a_file_that_is_not_a_store_is_reported_and_left_untouched() {
    let f = fixture(Backend::Embedded).unwrap();
    let garbage: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(f.path(), &garbage).unwrap();
    let error = DurableQueue::open(f.path(), &f.wheel).await.unwrap_err();
    assert!(matches!(error, Error::Corrupt(_)), "{error:?}");
    assert!(error.to_string().contains("left untouched"));
    assert_eq!(
        std::fs::read(f.path()).unwrap(),
        garbage,
        "the file was modified"
    );

    std::fs::write(f.path(), b"").unwrap();
    let queue = DurableQueue::open(f.path(), &f.wheel)
        .await
        .expect("an empty file is a new store");
    assert_eq!(queue.len().await.unwrap(), 0);
}

async fn wheel_shutdown_ends_the_streams_and_keeps_the_tasks(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    queue
        .schedule(Task::new("p").id("kept").after(Duration::from_secs(3_600)))
        .await
        .unwrap();
    let mut deliveries = queue.deliveries();
    f.wheel.shutdown().await;
    let ended = tokio::time::timeout(Duration::from_secs(5), deliveries.next())
        .await
        .unwrap();
    assert!(ended.is_none());
    assert_eq!(queue.len().await, Err(Error::Closed));
    drop((queue, deliveries));

    let f = Fixture {
        wheel: Wheel::new(),
        ..f
    };
    let mut reopened = None;
    for _ in 0..100 {
        // The embedded store is released asynchronously once the engine stops.
        let builder = DurableQueue::builder();
        let attempt = match f.backend {
            Backend::Embedded => builder.open(f.path(), &f.wheel).await,
            Backend::Redis => Ok(f.open_with(builder).await),
        };
        if let Ok(queue) = attempt {
            reopened = Some(queue);
            break;
        }
        tokio::time::sleep(ms(10)).await;
    }
    assert_eq!(reopened.expect("released").len().await.unwrap(), 1);
}

async fn concurrent_schedules_all_become_durable(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    let producers: Vec<_> = (0..64)
        .map(|p| {
            let queue = queue.clone();
            tokio::spawn(async move {
                for i in 0..20 {
                    queue
                        .schedule(
                            Task::new("x")
                                .id(format!("{p}-{i}"))
                                .after(Duration::from_secs(60)),
                        )
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for producer in producers {
        producer.await.unwrap();
    }
    queue.close().await;
    let queue = f.open().await;
    assert_eq!(queue.len().await.unwrap(), 64 * 20);
}

#[tokio::test]
async fn the_in_memory_store_behaves_like_a_store_across_reopens() {
    use tokio_wheel_durable::store::MemoryStore;
    let wheel = Wheel::new();
    let store = MemoryStore::new();
    let queue = DurableQueue::builder()
        .open_with_store(store.clone(), &wheel)
        .await
        .unwrap();
    queue
        .schedule(Task::new("kept").id("k").after(ms(30)))
        .await
        .unwrap();
    queue.schedule(Task::new("gone").id("g")).await.unwrap();
    assert!(queue.cancel(&"g".into()).await.unwrap());
    queue.close().await;
    // A second queue on the same store sees what the first made durable.
    let queue = DurableQueue::builder()
        .open_with_store(store, &wheel)
        .await
        .unwrap();
    assert_eq!(queue.len().await.unwrap(), 1);
    let mut deliveries = queue.deliveries();
    let d = next(&mut deliveries).await;
    assert_eq!((d.id().as_str(), d.payload()), ("k", &b"kept"[..]));
    d.ack().await.unwrap();
    assert_eq!(queue.len().await.unwrap(), 0);
}

#[cfg(feature = "serde")]
#[tokio::test]
async fn json_payloads_round_trip() {
    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Reminder {
        order: u64,
        email: String,
    }
    let f = fixture(Backend::Embedded).unwrap();
    let queue = f.open().await;
    let reminder = Reminder {
        order: 42,
        email: "a@example.com".into(),
    };
    queue
        .schedule(Task::json(&reminder).unwrap().id("r"))
        .await
        .unwrap();
    let mut deliveries = queue.deliveries();
    let d = next(&mut deliveries).await;
    assert_eq!(d.json::<Reminder>().unwrap(), reminder);
    assert!(
        d.json::<Vec<u8>>().is_err(),
        "a payload of another shape is an error, not a panic"
    );
    d.ack().await.unwrap();
}
