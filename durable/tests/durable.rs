//! Durable queues: scheduling, delivery, leases, retries, dead letters, restarts, locking.
//! Due times are wall-clock, so these tests run in real time with short delays.
//!
//! The behaviour both backends share runs twice: `embedded::*` on a redb file, `on_redis::*`
//! on a `redis-server` the test starts itself (feature `redis`).

mod support;

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel_durable::store::{MemoryStore, Store, Work};
use tokio_wheel_durable::{
    Builder, CatchUp, Delivery, DurableQueue, Error, Recurring, RetryPolicy, Task, TaskFilter,
    TaskId, TaskState,
};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Embedded,
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Redis,
}

struct Fixture {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    wheel: Wheel,
    backend: Backend,
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    redis: Option<support::redis_server::RedisServer>,
}

/// A fixture, or `None` when the backend cannot run here (Redis without `redis-server`,
/// outside CI: the test then passes after saying so).
fn fixture(backend: Backend) -> Option<Fixture> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.redb");
    let redis = match backend {
        Backend::Embedded => None,
        Backend::Redis => Some(support::redis_server::start()?),
    };
    Some(Fixture {
        _dir: dir,
        path,
        wheel: Wheel::new(),
        backend,
        redis,
    })
}

impl Fixture {
    async fn open_with(&self, builder: Builder) -> DurableQueue {
        match self.backend {
            Backend::Embedded => builder.open(&self.path, &self.wheel).await.unwrap(),
            #[cfg(feature = "redis")]
            Backend::Redis => {
                let url = self.redis.as_ref().expect("server").url();
                builder
                    .redis(&url, "test-queue", &self.wheel)
                    .await
                    .unwrap()
            }
            #[cfg(not(feature = "redis"))]
            Backend::Redis => unreachable!("Redis tests need the redis feature"),
        }
    }

    async fn open(&self) -> DurableQueue {
        self.open_with(DurableQueue::builder()).await
    }
}

/// Runs each listed test on every backend the features allow.
macro_rules! on_every_backend {
    ($($test:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test(super::Backend::Embedded).await;
                }
            )*
        }
        #[cfg(feature = "redis")]
        mod on_redis {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test(super::Backend::Redis).await;
                }
            )*
        }
    };
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
    stale_finishes_return_lease_lost_and_change_nothing,
    retry_after_counts_toward_max_attempts,
    a_lease_starts_at_hand_out_not_while_buffered,
    extend_keeps_a_long_job_and_fails_once_the_lease_is_gone,
    keep_alive_renews_held_deliveries_until_they_are_dropped,
    close_returns_buffered_tasks_at_once_and_waits_for_held_ones,
    close_gives_up_on_held_deliveries_after_its_timeout,
    a_zero_lease_is_a_clear_error,
    get_and_list_report_each_state_in_pages,
    purge_dead_removes_only_old_dead_letters,
    retention_purges_old_dead_letters_on_its_own,
    stats_add_up_after_every_kind_of_finish,
    inspection_pages_through_a_large_queue,
    a_recurring_period_delivers_each_occurrence_once,
    a_cron_expression_with_seconds_fires_on_whole_seconds,
    declaring_a_recurring_schedule_again_keeps_it_and_cancel_stops_it,
);

async fn next(deliveries: &mut tokio_wheel_durable::Deliveries) -> Delivery {
    tokio::time::timeout(Duration::from_secs(5), deliveries.next())
        .await
        .expect("a delivery within 5 s")
        .expect("the stream is open")
}

async fn nothing_within(deliveries: &mut tokio_wheel_durable::Deliveries, wait: Duration) {
    if let Ok(Some(d)) = tokio::time::timeout(wait, deliveries.next()).await {
        panic!("unexpected delivery {d:?}");
    }
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
    assert!(
        arrived.duration_since(due).unwrap() < ms(150),
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
    let second = DurableQueue::open(&f.path, &f.wheel).await;
    assert_eq!(second.unwrap_err(), Error::Locked);
    queue.close().await;
    let queue = DurableQueue::open(&f.path, &f.wheel)
        .await
        .expect("released by close");
    let stream = queue.deliveries();
    drop((queue, stream));
    // Dropping every handle releases it too (the engine exits asynchronously).
    let mut reopened = None;
    for _ in 0..100 {
        match DurableQueue::open(&f.path, &f.wheel).await {
            Ok(queue) => {
                reopened = Some(queue);
                break;
            }
            Err(Error::Locked) => tokio::time::sleep(ms(10)).await,
            Err(other) => panic!("{other}"),
        }
    }
    assert!(
        reopened.is_some(),
        "never released after every handle was dropped"
    );
}

#[tokio::test]
async fn a_file_that_is_not_a_store_is_reported_and_left_untouched() {
    let f = fixture(Backend::Embedded).unwrap();
    let garbage: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&f.path, &garbage).unwrap();
    let error = DurableQueue::open(&f.path, &f.wheel).await.unwrap_err();
    assert!(matches!(error, Error::Corrupt(_)), "{error:?}");
    assert!(error.to_string().contains("left untouched"));
    assert_eq!(
        std::fs::read(&f.path).unwrap(),
        garbage,
        "the file was modified"
    );

    std::fs::write(&f.path, b"").unwrap();
    let queue = DurableQueue::open(&f.path, &f.wheel)
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
            Backend::Embedded => builder.open(&f.path, &f.wheel).await,
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

/// Issue 12 item 2: after `retry_after` and a redelivery, the first delivery's finishes are
/// stale: each says `LeaseLost` and leaves the task as it is.
async fn stale_finishes_return_lease_lost_and_change_nothing(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    queue.schedule(Task::new("p").id("t")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let d1 = next(&mut deliveries).await;
    d1.retry_after(Duration::ZERO).await.unwrap();
    let d2 = next(&mut deliveries).await;
    assert_eq!(d2.attempt(), 2);
    assert_eq!(d1.ack().await, Err(Error::LeaseLost), "stale ack");
    assert_eq!(d1.fail("stale").await, Err(Error::LeaseLost), "stale fail");
    assert_eq!(d1.retry().await, Err(Error::LeaseLost), "stale retry");
    assert_eq!(d1.retry_after(ms(1)).await, Err(Error::LeaseLost));
    assert_eq!(d1.extend(ms(1)).await, Err(Error::LeaseLost));
    assert_eq!(queue.len().await.unwrap(), 1, "the task is still there");
    assert!(
        queue.dead_letters().await.unwrap().is_empty(),
        "no dead letter"
    );
    nothing_within(&mut deliveries, ms(100)).await;
    d2.ack().await.unwrap();
    assert_eq!(
        d2.ack().await,
        Err(Error::LeaseLost),
        "a second finish is stale too"
    );
    assert_eq!(queue.len().await.unwrap(), 0);
}

/// Issue 12 item 7: `retry_after` is a retry like any other: with `max_attempts(2)` the second
/// delivery goes to the dead letters however it is retried.
async fn retry_after_counts_toward_max_attempts(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let policy = RetryPolicy::exponential(ms(10), ms(10)).max_attempts(2);
    let queue = f.open_with(DurableQueue::builder().retry(policy)).await;
    queue.schedule(Task::new("p").id("t")).await.unwrap();
    let mut deliveries = queue.deliveries();
    for attempt in 1..=2 {
        let d = next(&mut deliveries).await;
        assert_eq!(d.attempt(), attempt);
        d.retry_after(Duration::ZERO).await.unwrap();
    }
    nothing_within(&mut deliveries, ms(200)).await;
    let dead = queue.dead_letters().await.unwrap();
    assert_eq!(dead.len(), 1, "delivered twice, then dead");
    assert_eq!(dead[0].attempts, 2);
    assert!(
        dead[0].reason.contains("last delivery"),
        "{}",
        dead[0].reason
    );
    assert_eq!(queue.len().await.unwrap(), 0);
}

/// Issue 12 item 4: 6 tasks, a 1 s lease, the default prefetch, a consumer taking 400 ms per
/// task: every job fits in its lease, so each task is delivered once and every ack holds.
async fn a_lease_starts_at_hand_out_not_while_buffered(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f
        .open_with(DurableQueue::builder().lease(Duration::from_secs(1)))
        .await;
    for i in 0..6 {
        queue
            .schedule(Task::new("p").id(format!("t{i}")))
            .await
            .unwrap();
    }
    let mut deliveries = queue.deliveries();
    let mut seen = Vec::new();
    for _ in 0..6 {
        let d = next(&mut deliveries).await;
        seen.push((d.id().to_string(), d.attempt()));
        tokio::time::sleep(ms(400)).await; // the job
        d.ack().await.expect("the job fit in its lease");
    }
    assert!(seen.iter().all(|(_, attempt)| *attempt == 1), "{seen:?}");
    nothing_within(&mut deliveries, ms(200)).await;
    assert_eq!(queue.len().await.unwrap(), 0);
}

async fn extend_keeps_a_long_job_and_fails_once_the_lease_is_gone(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open_with(DurableQueue::builder().lease(ms(300))).await;
    queue.schedule(Task::new("p").id("long")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let d = next(&mut deliveries).await;
    for _ in 0..4 {
        tokio::time::sleep(ms(200)).await;
        d.extend(ms(300)).await.expect("still held");
    }
    // 800 ms in, far past the 300 ms lease: nobody else got it.
    nothing_within(&mut deliveries, ms(100)).await;
    d.ack().await.unwrap();

    queue.schedule(Task::new("p").id("lost")).await.unwrap();
    let d = next(&mut deliveries).await;
    let again = next(&mut deliveries).await; // after the lease ran out
    assert_eq!(again.attempt(), 2);
    assert_eq!(d.extend(ms(300)).await, Err(Error::LeaseLost));
    again.ack().await.unwrap();
}

async fn keep_alive_renews_held_deliveries_until_they_are_dropped(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f
        .open_with(DurableQueue::builder().lease(ms(300)).keep_alive(true))
        .await;
    queue.schedule(Task::new("p").id("t")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let d = next(&mut deliveries).await;
    nothing_within(&mut deliveries, ms(1_000)).await; // more than three leases
    d.ack().await.expect("kept alive");

    queue.schedule(Task::new("p").id("dropped")).await.unwrap();
    let d = next(&mut deliveries).await;
    let dropped = std::time::Instant::now();
    drop(d); // no longer kept alive: back after its lease
    let again = next(&mut deliveries).await;
    assert!(dropped.elapsed() >= ms(250), "{:?}", dropped.elapsed());
    assert_eq!((again.id().as_str(), again.attempt()), ("dropped", 2));
    again.ack().await.unwrap();
}

async fn close_returns_buffered_tasks_at_once_and_waits_for_held_ones(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f
        .open_with(
            DurableQueue::builder()
                .prefetch(4)
                .lease(Duration::from_secs(60)),
        )
        .await;
    for i in 0..4 {
        queue
            .schedule(Task::new("p").id(format!("t{i}")))
            .await
            .unwrap();
    }
    let mut deliveries = queue.deliveries();
    let held = next(&mut deliveries).await;
    tokio::time::sleep(ms(100)).await; // the other three are claimed into the buffer
    let closing = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.close().await })
    };
    tokio::time::sleep(ms(200)).await;
    assert!(!closing.is_finished(), "close waits for the held delivery");
    assert!(
        tokio::time::timeout(ms(100), deliveries.next())
            .await
            .expect("the stream ended")
            .is_none(),
        "buffered tasks are not handed out once closing"
    );
    held.ack()
        .await
        .expect("a held delivery can still be acked while closing");
    tokio::time::timeout(Duration::from_secs(5), closing)
        .await
        .expect("close returns once nothing is held")
        .unwrap();
    drop((queue, deliveries));

    let queue = reopen(&f, DurableQueue::builder()).await;
    assert_eq!(queue.len().await.unwrap(), 3);
    let mut deliveries = queue.deliveries();
    for _ in 0..3 {
        let d = next(&mut deliveries).await;
        assert_eq!(
            d.attempt(),
            1,
            "a returned buffered claim was not a delivery"
        );
        d.ack().await.unwrap();
    }
}

async fn close_gives_up_on_held_deliveries_after_its_timeout(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f
        .open_with(DurableQueue::builder().close_timeout(ms(300)))
        .await;
    queue.schedule(Task::new("p").id("t")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let _held = next(&mut deliveries).await;
    let start = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(5), queue.close())
        .await
        .expect("close returns after its timeout");
    assert!(start.elapsed() >= ms(280), "{:?}", start.elapsed());
}

async fn a_zero_lease_is_a_clear_error(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let builder = DurableQueue::builder().lease(Duration::ZERO);
    let error = match f.backend {
        Backend::Embedded => builder.open(&f.path, &f.wheel).await.unwrap_err(),
        #[cfg(feature = "redis")]
        Backend::Redis => builder
            .redis(&f.redis.as_ref().unwrap().url(), "q", &f.wheel)
            .await
            .unwrap_err(),
        #[cfg(not(feature = "redis"))]
        Backend::Redis => unreachable!(),
    };
    assert!(matches!(error, Error::Invalid(_)), "{error:?}");
    assert!(error.to_string().contains("lease"), "{error}");
}

/// Opens the fixture's queue again, waiting for the embedded store's lock to be released.
async fn reopen(f: &Fixture, builder: Builder) -> DurableQueue {
    for _ in 0..200 {
        match f.backend {
            Backend::Embedded => match builder.clone().open(&f.path, &f.wheel).await {
                Ok(queue) => return queue,
                Err(Error::Locked) => tokio::time::sleep(ms(10)).await,
                Err(other) => panic!("{other}"),
            },
            Backend::Redis => return f.open_with(builder).await,
        }
    }
    panic!("the store was never released");
}

/// A [`Store`] that fails on demand: `fail_next(n)` makes the next `n` commits fail as a full
/// disk would (nothing applied).
#[derive(Clone, Default)]
struct FlakyStore {
    inner: MemoryStore,
    fail_next: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    failed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl FlakyStore {
    fn fail_next(&self, commits: usize) {
        self.fail_next
            .store(commits, std::sync::atomic::Ordering::SeqCst);
    }

    fn failed(&self) -> usize {
        self.failed.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Store for FlakyStore {
    fn transact(&mut self, work: &mut Work<'_>) -> Result<(), Error> {
        use std::sync::atomic::Ordering::SeqCst;
        // The work runs, then its commit fails as a full disk would: nothing applied.
        let (fail_next, failed) = (self.fail_next.clone(), self.failed.clone());
        self.inner.transact(&mut |tx| {
            work(tx)?;
            let failing = fail_next
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if failing {
                failed.fetch_add(1, SeqCst);
                return Err(Error::Io("injected: no space left on device".into()));
            }
            Ok(())
        })
    }
}

async fn flaky_queue(builder: Builder) -> (FlakyStore, DurableQueue, Wheel) {
    let wheel = Wheel::new();
    let store = FlakyStore::default();
    let queue = builder
        .open_with_store(store.clone(), &wheel)
        .await
        .unwrap();
    (store, queue, wheel)
}

/// Issue 12 item 5: the commit of a claim fails while a stream waits. The stream still gets
/// its delivery once the store works again, without being polled anew.
#[tokio::test]
async fn a_failed_claim_commit_does_not_strand_the_waiting_stream() {
    // A prefetch of one: the failed claim took the stream's only credit.
    let (store, queue, _wheel) = flaky_queue(DurableQueue::builder().prefetch(1)).await;
    let mut deliveries = queue.deliveries();
    // One poll, then the consumer just waits (a task blocked in `next().await`).
    let waiter = tokio::spawn(async move {
        let d = tokio::time::timeout(Duration::from_secs(5), deliveries.next())
            .await
            .expect("stranded: no delivery after the store recovered")
            .unwrap();
        (d, deliveries)
    });
    tokio::time::sleep(ms(50)).await;
    queue
        .schedule(Task::new("exact bytes").id("t").after(ms(200)))
        .await
        .unwrap();
    store.fail_next(2); // the claim at 200 ms fails, and its first retry too
    let (d, _deliveries) = waiter.await.unwrap();
    assert_eq!(store.failed(), 2, "the fault was injected");
    assert_eq!(
        (d.id().as_str(), d.payload(), d.attempt()),
        ("t", &b"exact bytes"[..], 1)
    );
    d.ack().await.unwrap();
    assert_eq!(queue.len().await.unwrap(), 0);
}

/// Issue 12 item 6: a failed commit must not redeliver a task whose lease is live here, and a
/// finish that failed can be tried again.
#[tokio::test]
async fn a_failed_commit_does_not_redeliver_live_leases() {
    let (store, queue, _wheel) =
        flaky_queue(DurableQueue::builder().lease(Duration::from_secs(30))).await;
    queue.schedule(Task::new("held").id("held")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let held = next(&mut deliveries).await;

    store.fail_next(1);
    let error = queue.schedule(Task::new("x").id("x")).await.unwrap_err();
    assert!(error.is_transient(), "{error:?}");
    nothing_within(&mut deliveries, ms(300)).await; // "held" is not handed out again

    store.fail_next(1);
    let error = held.ack().await.unwrap_err();
    assert!(matches!(error, Error::Io(_)), "{error:?}");
    nothing_within(&mut deliveries, ms(100)).await;
    held.ack().await.expect("the failed ack can be tried again");
    assert_eq!(store.failed(), 2);
    queue.schedule(Task::new("x").id("x")).await.unwrap();
    let x = next(&mut deliveries).await;
    assert_eq!((x.id().as_str(), x.attempt()), ("x", 1));
    x.ack().await.unwrap();
    assert_eq!(queue.len().await.unwrap(), 0);
}

/// Random commit failures under a steady load: everything is still delivered, and nothing
/// whose ack returned `Ok` comes back.
#[tokio::test]
async fn random_commit_failures_lose_nothing() {
    let (store, queue, _wheel) =
        flaky_queue(DurableQueue::builder().lease(Duration::from_secs(30))).await;
    let mut rng = support::Rng(42);
    let mut scheduled = HashSet::new();
    for i in 0..200 {
        if rng.below(5) == 0 {
            store.fail_next(1);
        }
        let id = format!("t{i}");
        // A failed schedule is not durable: the producer tries again, as a caller would.
        while queue
            .schedule(Task::new(id.clone()).id(id.clone()))
            .await
            .is_err()
        {}
        scheduled.insert(id);
    }
    let mut deliveries = queue.deliveries();
    let mut acked = HashSet::new();
    while acked.len() < scheduled.len() {
        let d = next(&mut deliveries).await;
        assert_eq!(d.payload(), d.id().as_str().as_bytes());
        assert!(
            !acked.contains(d.id().as_str()),
            "{} came back after its ack",
            d.id()
        );
        if rng.below(4) == 0 {
            store.fail_next(1);
        }
        loop {
            match d.ack().await {
                Ok(()) => break,
                Err(Error::Io(_)) => continue,
                Err(other) => panic!("{other}"),
            }
        }
        acked.insert(d.id().to_string());
    }
    assert!(store.failed() > 10, "only {} faults", store.failed());
    assert_eq!(queue.len().await.unwrap(), 0);
}

/// Issue 13: `get` and paged `list` show each state; a cursor that moved is a clear error.
async fn get_and_list_report_each_state_in_pages(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open_with(DurableQueue::builder().prefetch(1)).await;
    // Due times are kept in whole milliseconds.
    let now_ms = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let base = std::time::UNIX_EPOCH + ms(now_ms + 3_600_000);
    for i in 0..7u64 {
        // Due in reverse order of their names, so due order is not id order.
        let due = base + ms(1_000 * (7 - i));
        queue
            .schedule(Task::new(vec![0u8; i as usize]).id(format!("p{i}")).at(due))
            .await
            .unwrap();
    }
    queue.schedule(Task::new("run").id("run")).await.unwrap();
    queue.schedule(Task::new("die").id("die")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let (mut held, mut dead) = (None, false);
    while held.is_none() || !dead {
        let d = next(&mut deliveries).await;
        if d.id().as_str() == "die" {
            d.fail("bad input").await.unwrap();
            dead = true;
        } else {
            held = Some(d);
        }
    }
    let held = held.unwrap();

    let info = queue.get(&"p3".into()).await.unwrap().expect("p3 exists");
    assert_eq!(info.state, TaskState::Pending);
    assert_eq!((info.payload_len, info.attempts, info.reason), (3, 0, None));
    assert_eq!(info.due, base + ms(4_000));
    let info = queue.get(&"run".into()).await.unwrap().unwrap();
    match info.state {
        TaskState::InFlight {
            attempt,
            lease_until,
        } => {
            assert_eq!(attempt, 1);
            assert!(lease_until > SystemTime::now(), "{lease_until:?}");
        }
        other => panic!("{other:?}"),
    }
    let info = queue.get(&"die".into()).await.unwrap().unwrap();
    assert_eq!(
        info.state,
        TaskState::Dead {
            reason: "bad input".into()
        }
    );
    assert_eq!(info.reason.as_deref(), Some("bad input"));
    assert_eq!(queue.get(&"nothing".into()).await.unwrap(), None);

    // Pages of 3 in due order: p6 (earliest) … p0.
    let mut seen = Vec::new();
    let mut after: Option<TaskId> = None;
    loop {
        let page = queue
            .list(TaskFilter::Pending, after.as_ref(), 3)
            .await
            .unwrap();
        assert!(page.len() <= 3);
        let Some(last) = page.last() else { break };
        after = Some(last.id.clone());
        seen.extend(page.iter().map(|t| t.id.to_string()));
    }
    assert_eq!(seen, ["p6", "p5", "p4", "p3", "p2", "p1", "p0"]);
    let in_flight = queue.list(TaskFilter::InFlight, None, 10).await.unwrap();
    assert_eq!(in_flight.len(), 1);
    assert_eq!(in_flight[0].id.as_str(), "run");
    let dead = queue.list(TaskFilter::Dead, None, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id.as_str(), "die");
    let letters = queue.dead_letters_page(None, 10).await.unwrap();
    assert_eq!(
        (letters.len(), letters[0].payload.as_slice()),
        (1, &b"die"[..])
    );
    assert!(
        queue
            .list(TaskFilter::Dead, Some(&"die".into()), 10)
            .await
            .unwrap()
            .is_empty()
    );

    // The cursor task moved on: a clear error, not a wrong page.
    assert!(queue.cancel(&"p2".into()).await.unwrap());
    let error = queue
        .list(TaskFilter::Pending, Some(&"p2".into()), 3)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Invalid(_)), "{error:?}");
    assert!(error.to_string().contains("p2"), "{error}");
    assert!(
        queue
            .list(TaskFilter::Pending, None, 0)
            .await
            .unwrap()
            .is_empty()
    );
    held.ack().await.unwrap();
}

async fn dead_letter(
    queue: &DurableQueue,
    deliveries: &mut tokio_wheel_durable::Deliveries,
    id: &str,
) {
    queue.schedule(Task::new(id).id(id)).await.unwrap();
    let d = next(deliveries).await;
    assert_eq!(d.id().as_str(), id);
    d.fail("no").await.unwrap();
}

async fn purge_dead_removes_only_old_dead_letters(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    let mut deliveries = queue.deliveries();
    for id in ["old-1", "old-2", "old-3"] {
        dead_letter(&queue, &mut deliveries, id).await;
    }
    tokio::time::sleep(ms(600)).await;
    for id in ["new-1", "new-2"] {
        dead_letter(&queue, &mut deliveries, id).await;
    }
    assert_eq!(queue.purge_dead(ms(400)).await.unwrap(), 3);
    let left: Vec<String> = queue
        .dead_letters()
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.id.to_string())
        .collect();
    assert_eq!(left, ["new-1", "new-2"], "oldest death first");
    assert_eq!(queue.purge_dead(Duration::ZERO).await.unwrap(), 2);
    assert!(queue.dead_letters().await.unwrap().is_empty());
    assert_eq!(queue.stats().await.unwrap().dead, 0);
}

async fn retention_purges_old_dead_letters_on_its_own(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f
        .open_with(DurableQueue::builder().dead_letter_retention(ms(300)))
        .await;
    let mut deliveries = queue.deliveries();
    dead_letter(&queue, &mut deliveries, "doomed").await;
    assert_eq!(queue.stats().await.unwrap().dead, 1, "kept while young");
    let start = std::time::Instant::now();
    while queue.stats().await.unwrap().dead > 0 {
        assert!(start.elapsed() < Duration::from_secs(5), "never purged");
        tokio::time::sleep(ms(50)).await;
    }
    assert!(start.elapsed() >= ms(250), "{:?}", start.elapsed());
    assert_eq!(queue.get(&"doomed".into()).await.unwrap(), None);
}

/// Issue 13: every way a delivery can end is counted, and the counters add up.
async fn stats_add_up_after_every_kind_of_finish(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let policy = RetryPolicy::exponential(ms(10), ms(10)).max_attempts(2);
    let queue = f
        .open_with(
            DurableQueue::builder()
                .retry(policy)
                .lease(ms(300))
                .prefetch(4),
        )
        .await;
    for i in 0..12 {
        queue
            .schedule(Task::new("p").id(format!("t{i:02}")))
            .await
            .unwrap();
    }
    queue
        .schedule(Task::new("p").id("later").after(Duration::from_secs(3_600)))
        .await
        .unwrap();
    {
        // A stream that buffers four and is dropped after reading one: three go back.
        let mut deliveries = queue.deliveries();
        let d = next(&mut deliveries).await;
        tokio::time::sleep(ms(100)).await;
        d.ack().await.unwrap();
    }
    let mut deliveries = queue.deliveries();
    let mut kept = None;
    let mut finished = 0;
    while finished < 11 {
        let d = next(&mut deliveries).await;
        match (finished % 4, d.attempt()) {
            (0, _) => d.ack().await.unwrap(),
            (1, 1) => d.retry_after(Duration::ZERO).await.unwrap(),
            (1, _) => d.ack().await.unwrap(),
            (2, _) => d.fail("no").await.unwrap(),
            _ if kept.is_none() => {
                d.extend(Duration::from_secs(60)).await.unwrap();
                kept = Some(d); // held: in flight at the end
            }
            _ => drop(d), // its lease runs out
        }
        finished += 1;
    }
    tokio::time::sleep(ms(500)).await; // leases of dropped deliveries run out
    let mut drained = 0;
    while let Ok(Some(d)) = tokio::time::timeout(ms(300), deliveries.next()).await {
        d.ack().await.unwrap();
        drained += 1;
    }
    assert!(drained > 0, "expired leases came back");
    let stats = queue.stats().await.unwrap();
    assert_eq!(
        stats.delivered,
        stats.acked
            + stats.retried
            + stats.dead_lettered
            + stats.expired
            + stats.returned
            + stats.in_flight,
        "{stats:?}"
    );
    assert_eq!(stats.in_flight, 1, "{stats:?}");
    assert_eq!(stats.pending, 1, "{stats:?}");
    assert!(stats.returned >= 3, "{stats:?}");
    assert!(stats.retried >= 1 && stats.expired >= 1, "{stats:?}");
    assert_eq!(stats.dead, stats.dead_lettered, "{stats:?}");
    assert_eq!(
        stats.dead as usize,
        queue.dead_letters().await.unwrap().len()
    );
    assert_eq!(
        stats.pending + stats.in_flight,
        queue.len().await.unwrap() as u64
    );
    assert!(stats.lateness_p99 >= stats.lateness_p50);
    assert!(stats.lateness_p99 < Duration::from_secs(5), "{stats:?}");
    kept.unwrap().ack().await.unwrap();
}

/// How many entries the large inspection test uses: 10^5 with `TOKIO_WHEEL_FULL=1`.
fn large() -> usize {
    if std::env::var_os("TOKIO_WHEEL_FULL").is_some() {
        100_000
    } else {
        20_000
    }
}

/// Issue 13: paging through a large backlog and dead-letter set, and purging it, all in
/// bounded pages.
async fn inspection_pages_through_a_large_queue(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open_with(DurableQueue::builder().prefetch(256)).await;
    let count = large();
    let base = SystemTime::now() + Duration::from_secs(3_600);
    let producers: Vec<_> = (0..64)
        .map(|p| {
            let queue = queue.clone();
            tokio::spawn(async move {
                for i in (p..count).step_by(64) {
                    let task = Task::new(format!("{i}")).id(format!("t{i:06}"));
                    let task = if i % 2 == 0 {
                        task.at(base + ms(i as u64))
                    } else {
                        task // due now: to the dead letters below
                    };
                    queue.schedule(task).await.unwrap();
                }
            })
        })
        .collect();
    for producer in producers {
        producer.await.unwrap();
    }
    queue
        .deliveries()
        .take(count / 2)
        .for_each_concurrent(
            256,
            |d| async move { d.fail("for the test").await.unwrap() },
        )
        .await;
    let stats = queue.stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.dead),
        ((count / 2) as u64, (count / 2) as u64)
    );

    let start = std::time::Instant::now();
    let (mut pages, mut listed, mut after, mut last_due) = (0, 0, None::<TaskId>, None);
    loop {
        let page = queue
            .list(TaskFilter::Pending, after.as_ref(), 1_000)
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        for task in &page {
            assert!(last_due <= Some(task.due), "due order");
            last_due = Some(task.due);
        }
        pages += 1;
        listed += page.len();
        after = Some(last.id.clone());
    }
    assert_eq!((listed, pages), (count / 2, count.div_ceil(2_000)));
    let (mut letters, mut after) = (0, None::<TaskId>);
    loop {
        let page = queue
            .dead_letters_page(after.as_ref(), 1_000)
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        assert!(page.iter().all(|d| d.payload
            == d.id.as_str()[1..].trim_start_matches('0').as_bytes()
            || d.id.as_str() == "t000000"));
        letters += page.len();
        after = Some(last.id.clone());
    }
    assert_eq!(letters, count / 2);
    let id = TaskId::from(format!("t{:06}", count / 2 + 1));
    assert_eq!(queue.get(&id).await.unwrap().unwrap().attempts, 1);
    eprintln!(
        "{backend:?}: listed {listed} pending and {letters} dead in pages of 1000 in {:?}",
        start.elapsed()
    );
    assert_eq!(
        queue.purge_dead(Duration::ZERO).await.unwrap(),
        (count / 2) as u64
    );
    assert_eq!(queue.stats().await.unwrap().dead, 0);
}

/// Issue 13: a fixed period, each occurrence delivered once, never early, with its own id
/// and its occurrence time as `due()`.
async fn a_recurring_period_delivers_each_occurrence_once(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    let id = queue
        .schedule_recurring(
            Recurring::every(ms(200))
                .id("tick")
                .payload(b"beat".to_vec()),
        )
        .await
        .unwrap();
    assert_eq!(id.as_str(), "tick");
    let mut deliveries = queue.deliveries();
    let mut occurrences = Vec::new();
    let start = std::time::Instant::now();
    while start.elapsed() < ms(1_300) {
        let Ok(Some(d)) = tokio::time::timeout(ms(400), deliveries.next()).await else {
            continue;
        };
        assert!(SystemTime::now() >= d.due(), "delivered early");
        assert_eq!((d.payload(), d.attempt()), (&b"beat"[..], 1));
        let at = d
            .id()
            .as_str()
            .strip_prefix("tick@")
            .expect("occurrence id");
        let at: u64 = at.parse().unwrap();
        assert_eq!(
            d.due(),
            std::time::UNIX_EPOCH + ms(at),
            "due() is the occurrence's time"
        );
        occurrences.push(at);
        d.ack().await.unwrap();
    }
    assert!((4..=7).contains(&occurrences.len()), "{occurrences:?}");
    let distinct: HashSet<_> = occurrences.iter().collect();
    assert_eq!(
        distinct.len(),
        occurrences.len(),
        "once each: {occurrences:?}"
    );
    for pair in occurrences.windows(2) {
        assert_eq!((pair[1] - pair[0]) % 200, 0, "{occurrences:?}");
    }
    let info = queue.get(&id).await.unwrap().unwrap();
    assert_eq!(
        info.state,
        TaskState::Pending,
        "the schedule waits for its next"
    );
}

async fn a_cron_expression_with_seconds_fires_on_whole_seconds(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    queue
        .schedule_recurring(Recurring::cron("* * * * * *").unwrap().id("each-second"))
        .await
        .unwrap();
    let mut deliveries = queue.deliveries();
    for _ in 0..2 {
        let d = tokio::time::timeout(Duration::from_secs(3), deliveries.next())
            .await
            .expect("an occurrence each second")
            .unwrap();
        let ms = d
            .due()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        assert_eq!(ms % 1_000, 0, "on a whole second: {ms}");
        assert!(SystemTime::now() >= d.due(), "never early");
        d.ack().await.unwrap();
    }
    assert!(Recurring::cron("* * * * * * * *").is_err());
}

async fn declaring_a_recurring_schedule_again_keeps_it_and_cancel_stops_it(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    let every = || {
        Recurring::every(ms(300))
            .id("job")
            .catch_up(CatchUp::Latest)
    };
    queue.schedule_recurring(every()).await.unwrap();
    let mut deliveries = queue.deliveries();
    let first = next(&mut deliveries).await;
    first.ack().await.unwrap();
    let due_before = queue.get(&"job".into()).await.unwrap().unwrap().due;
    // Declared again (a restart): kept, not reset.
    queue.schedule_recurring(every()).await.unwrap();
    assert_eq!(
        queue.get(&"job".into()).await.unwrap().unwrap().due,
        due_before
    );
    let second = next(&mut deliveries).await;
    assert_ne!(second.id(), first.id());
    second.ack().await.unwrap();
    assert!(queue.cancel_recurring(&"job".into()).await.unwrap());
    assert!(!queue.cancel_recurring(&"job".into()).await.unwrap());
    assert_eq!(queue.get(&"job".into()).await.unwrap(), None);
    nothing_within(&mut deliveries, ms(700)).await;
    let error = queue
        .schedule_recurring(Recurring::every(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Invalid(_)), "{error:?}");
}

/// Issue 13: a recurring schedule survives a restart of the embedded store; occurrences
/// missed while it was closed collapse into one (or all come, with `CatchUp::All`).
#[tokio::test]
async fn missed_occurrences_collapse_after_a_restart_of_the_embedded_store() {
    for (catch_up, id) in [(CatchUp::Latest, "latest"), (CatchUp::All, "all")] {
        let f = fixture(Backend::Embedded).unwrap();
        let queue = f.open().await;
        queue
            .schedule_recurring(Recurring::every(ms(100)).id(id).catch_up(catch_up))
            .await
            .unwrap();
        let mut deliveries = queue.deliveries();
        let mut seen = HashSet::new();
        for _ in 0..2 {
            let d = next(&mut deliveries).await;
            seen.insert(d.id().to_string());
            d.ack().await.unwrap();
        }
        drop(deliveries);
        queue.close().await;
        tokio::time::sleep(ms(1_000)).await; // about ten occurrences missed
        let queue = reopen(&f, DurableQueue::builder()).await;
        let mut deliveries = queue.deliveries();
        let first = next(&mut deliveries).await;
        // Judged by due times, not by how fast they come: every occurrence due by the time the
        // first one arrived was missed while closed; the first one due after it is the
        // schedule running on again.
        let first_seen = std::time::SystemTime::now();
        assert!(first.due() <= first_seen);
        let mut caught_up = vec![first];
        let on_schedule = loop {
            let d = next(&mut deliveries).await;
            if d.due() > first_seen {
                break d;
            }
            caught_up.push(d);
        };
        let count = caught_up.len();
        for d in caught_up {
            assert!(seen.insert(d.id().to_string()), "{} twice", d.id());
            d.ack().await.unwrap();
        }
        match catch_up {
            CatchUp::Latest => assert_eq!(count, 1, "missed occurrences collapse into one"),
            _ => assert!(count >= 8, "each missed occurrence: {count}"),
        }
        assert!(seen.insert(on_schedule.id().to_string()));
        on_schedule.ack().await.unwrap();
        queue.close().await;
    }
}

/// Found by the independent attack: a stream polled while its claims waited for their commit
/// saw an empty buffer and no credits, and asked for a whole prefetch more (7 in flight with
/// prefetch 4 after reading 2, in some rounds). On two workers, so that the engine's commit
/// and the stream's poll race for real.
async fn a_stream_never_claims_more_than_its_prefetch_ahead(backend: Backend) {
    for round in 0..30 {
        let Some(fixture) = fixture(backend) else {
            return;
        };
        let queue = fixture
            .open_with(
                DurableQueue::builder()
                    .lease(Duration::from_secs(10))
                    .prefetch(4),
            )
            .await;
        for i in 0..100u64 {
            queue
                .schedule(Task::new(vec![1]).id(format!("t{i}")))
                .await
                .unwrap();
        }
        let mut deliveries = queue.deliveries();
        let first = next(&mut deliveries).await;
        let held = next(&mut deliveries).await;
        first.ack().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let stats = queue.stats().await.unwrap();
        // One held, at most four claimed ahead.
        assert!(stats.in_flight <= 5, "round {round}: {stats:?}");
        assert!(stats.delivered <= 6, "round {round}: {stats:?}");
        drop(held);
        drop(deliveries);
        queue.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_a_stream_never_claims_more_than_its_prefetch_ahead() {
    a_stream_never_claims_more_than_its_prefetch_ahead(Backend::Embedded).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_stream_never_claims_more_than_its_prefetch_ahead() {
    a_stream_never_claims_more_than_its_prefetch_ahead(Backend::Redis).await;
}

/// Found by the independent attack: paging through the in-flight tasks of an embedded store
/// skipped a held delivery whose lease never changed, because the claims still buffered were
/// ordered by a lease end that slides with the clock ("as if handed out now") and passed it.
/// Buffered claims now come after every delivery handed out, in id order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_in_flight_tasks_lists_a_held_delivery_once_while_others_wait_in_a_buffer() {
    let fixture = fixture(Backend::Embedded).unwrap();
    let queue = fixture
        .open_with(
            DurableQueue::builder()
                .lease(Duration::from_secs(1))
                .prefetch(4),
        )
        .await;
    for i in 0..5 {
        queue
            .schedule(Task::new(vec![]).id(format!("t{i}")))
            .await
            .unwrap();
    }
    let mut deliveries = queue.deliveries();
    let held = next(&mut deliveries).await; // t0; t1..t3 wait in the buffer
    held.extend(Duration::from_secs(3)).await.unwrap();
    let ids = |page: &[tokio_wheel_durable::TaskInfo]| -> Vec<String> {
        page.iter().map(|t| t.id.to_string()).collect()
    };
    let first = queue.list(TaskFilter::InFlight, None, 2).await.unwrap();
    assert_eq!(ids(&first), ["t0", "t1"], "the held delivery first");
    // Time passes; the held lease is unchanged and live.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut seen = ids(&first);
    let mut after = first.last().map(|t| t.id.clone());
    loop {
        let page = queue
            .list(TaskFilter::InFlight, after.as_ref(), 2)
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        after = page.last().map(|t| t.id.clone());
        seen.extend(ids(&page));
    }
    // t0 held, t1..t3 buffered (the prefetch of 4), each once.
    assert_eq!(seen, ["t0", "t1", "t2", "t3"]);
    assert_eq!(queue.stats().await.unwrap().in_flight, 4);
    drop(held);
    drop(deliveries);
    queue.close().await;
}
