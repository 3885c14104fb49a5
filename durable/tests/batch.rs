//! Batched writes: `schedule_many` (order, ties, replacement, an id in flight, empty and
//! oversized batches, a reserved id), a batch racing workers (each task delivered exactly
//! once, never early), and finishes that share one script on Redis (a stale ack still answers
//! `LeaseLost` and changes nothing; an `Ok` ack always deleted its task), and claims that trim
//! the lateness window in steps (it stays bounded). Both backends where the API applies.

mod support;

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use support::backend::{Backend, fixture};
use tokio_wheel_durable::{DurableQueue, Error, Task, TaskId};

on_every_backend!(
    a_batch_is_delivered_in_its_order_with_ties_and_replacements,
    an_id_in_flight_fails_alone_and_the_rest_is_stored,
    empty_and_refused_batches_store_nothing,
    batches_and_single_calls_racing_workers_deliver_each_task_once_never_early,
    a_first_call_from_a_short_lived_runtime_leaves_later_calls_working,
);

fn full() -> bool {
    std::env::var("TOKIO_WHEEL_FULL").is_ok_and(|v| v == "1")
}

fn ms_since_epoch(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Takes `n` deliveries from `queue`, acking each; returns (id, payload) in delivery order.
async fn drain(queue: &DurableQueue, n: usize) -> Vec<(String, Vec<u8>)> {
    let mut deliveries = queue.deliveries();
    let mut got = Vec::new();
    while got.len() < n {
        let d = tokio::time::timeout(Duration::from_secs(30), deliveries.next())
            .await
            .expect("a delivery within 30 s")
            .expect("the stream goes on");
        assert!(SystemTime::now() >= d.due(), "{} delivered early", d.id());
        got.push((d.id().as_str().to_owned(), d.payload().to_vec()));
        d.ack().await.unwrap();
    }
    got
}

/// The calls that share script invocations go through a flusher started by the first call:
/// it must run on the wheel's runtime, not on that caller's. A first `schedule` made from a
/// runtime of its own that then ends must leave every later call working (it took the
/// flusher along and every later call of the partition answered `Closed`).
async fn a_first_call_from_a_short_lived_runtime_leaves_later_calls_working(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    let elsewhere = queue.clone();
    let first = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let answer = runtime.block_on(elsewhere.schedule(Task::new("a").id("from-elsewhere")));
        drop(runtime);
        answer
    })
    .await
    .unwrap();
    assert_eq!(first.unwrap().as_str(), "from-elsewhere");
    let later = queue.schedule(Task::new("b").id("from-here")).await;
    assert_eq!(later.unwrap().as_str(), "from-here");
    let many = queue
        .schedule_many([Task::new("c").id("many")])
        .await
        .unwrap();
    assert_eq!(many[0].as_ref().unwrap().as_str(), "many");
    assert_eq!(queue.len().await.unwrap(), 3);
    let mut got: Vec<String> = drain(&queue, 3)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    got.sort();
    assert_eq!(got, ["from-elsewhere", "from-here", "many"]);
}

/// 1200 tasks (more than one script's chunk) due at the same instant, one id given twice: they
/// arrive in the batch's order, the repeated id once, with the later payload, at its later place.
async fn a_batch_is_delivered_in_its_order_with_ties_and_replacements(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    let due = SystemTime::now() + Duration::from_millis(300);
    let mut tasks: Vec<Task> = (0..1200)
        .map(|i| Task::new(format!("p{i}")).id(format!("t{i:04}")).at(due))
        .collect();
    tasks[10] = Task::new("first").id("dup").at(due);
    tasks[1100] = Task::new("second").id("dup").at(due);
    let answers = queue.schedule_many(tasks).await.unwrap();
    assert_eq!(answers.len(), 1200);
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(answers[10].as_ref().unwrap(), &TaskId::from("dup"));
    assert_eq!(queue.len().await.unwrap(), 1199);

    let got = drain(&queue, 1199).await;
    let expected: Vec<String> = (0..1200)
        .filter(|&i| i != 10)
        .map(|i| match i {
            1100 => "dup".to_owned(),
            _ => format!("t{i:04}"),
        })
        .collect();
    let order: Vec<String> = got.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(order, expected, "ties go in the batch's order");
    let dup = got.iter().find(|(id, _)| id == "dup").unwrap();
    assert_eq!(dup.1, b"second");
    assert_eq!(queue.len().await.unwrap(), 0);
}

/// A batch naming an id whose delivery is held: that task answers `InFlight` and is left as it
/// was (its delivery still acks), every other task of the batch is stored.
async fn an_id_in_flight_fails_alone_and_the_rest_is_stored(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    queue.schedule(Task::new("held").id("held")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let held = deliveries.next().await.unwrap();
    assert_eq!(held.id().as_str(), "held");

    let later = SystemTime::now() + Duration::from_secs(3600);
    let answers = queue
        .schedule_many([
            Task::new("a").id("a").at(later),
            Task::new("replacement").id("held").at(later),
            Task::new("b").id("b").at(later),
        ])
        .await
        .unwrap();
    assert_eq!(answers[0], Ok(TaskId::from("a")));
    assert_eq!(answers[1], Err(Error::InFlight));
    assert_eq!(answers[2], Ok(TaskId::from("b")));
    assert_eq!(queue.len().await.unwrap(), 3);
    // The held delivery was not replaced: its ack deletes it.
    held.ack().await.unwrap();
    assert!(queue.get(&TaskId::from("held")).await.unwrap().is_none());
    assert_eq!(queue.len().await.unwrap(), 2);
}

async fn empty_and_refused_batches_store_nothing(backend: Backend) {
    let Some(f) = fixture(backend) else { return };
    let queue = f.open().await;
    assert_eq!(queue.schedule_many(Vec::new()).await.unwrap(), Vec::new());
    // An id reserved for recurring occurrences refuses the whole batch before anything is stored.
    let refused = queue
        .schedule_many([
            Task::new("ok").id("ok"),
            Task::new("bad").id("report@1767225600000"),
        ])
        .await;
    assert!(matches!(refused, Err(Error::Invalid(_))), "{refused:?}");
    assert_eq!(queue.len().await.unwrap(), 0);
}

/// Producers scheduling in batches and one task at a time, due over the next half second,
/// while four consumers take and ack: every task is delivered exactly once, none before its
/// due time. (On Redis the consumers are separate handles, as separate processes would be.)
async fn batches_and_single_calls_racing_workers_deliver_each_task_once_never_early(
    backend: Backend,
) {
    let Some(f) = fixture(backend) else { return };
    let per_producer = if full() { 5_000 } else { 500 };
    let producers = 8;
    let total = per_producer * producers;
    let queue = f.open().await;
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    let mut consumers = Vec::new();
    for _ in 0..4 {
        let consumer = match backend {
            Backend::Embedded => queue.clone(),
            Backend::Redis => f.open().await,
        };
        let sender = sender.clone();
        consumers.push(tokio::spawn(async move {
            consumer
                .deliveries()
                .for_each_concurrent(32, |d| {
                    let sender = sender.clone();
                    async move {
                        let due = u64::from_le_bytes(d.payload()[..8].try_into().unwrap());
                        let early = ms_since_epoch(SystemTime::now()) < due;
                        let id = d.id().as_str().to_owned();
                        d.ack().await.unwrap();
                        let _ = sender.send((id, early));
                    }
                })
                .await;
        }));
    }
    let start = ms_since_epoch(SystemTime::now());
    let task = move |p: usize, i: usize| {
        let due = start + ((p * per_producer + i) as u64 * 500) / total as u64;
        let mut payload = due.to_le_bytes().to_vec();
        payload.resize(32, 0);
        Task::new(payload)
            .id(format!("p{p}-{i}"))
            .at(SystemTime::UNIX_EPOCH + Duration::from_millis(due))
    };
    let mut producing = Vec::new();
    for p in 0..producers {
        let queue = queue.clone();
        producing.push(tokio::spawn(async move {
            if p % 2 == 0 {
                for chunk in (0..per_producer).collect::<Vec<_>>().chunks(700) {
                    let answers = queue
                        .schedule_many(chunk.iter().map(|&i| task(p, i)))
                        .await
                        .unwrap();
                    assert!(answers.iter().all(Result::is_ok));
                }
            } else {
                for i in 0..per_producer {
                    queue.schedule(task(p, i)).await.unwrap();
                }
            }
        }));
    }
    for producer in producing {
        producer.await.unwrap();
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    while seen.values().sum::<usize>() < total {
        let (id, early) = tokio::time::timeout(Duration::from_secs(60), receiver.recv())
            .await
            .expect("every task within 60 s")
            .unwrap();
        assert!(!early, "{id} delivered before its due time");
        *seen.entry(id).or_default() += 1;
    }
    // Nothing more comes: no task is delivered twice.
    tokio::time::sleep(Duration::from_millis(300)).await;
    while let Ok((id, _)) = receiver.try_recv() {
        *seen.entry(id).or_default() += 1;
    }
    assert_eq!(seen.len(), total);
    assert!(seen.values().all(|&n| n == 1), "a task was delivered twice");
    assert_eq!(queue.len().await.unwrap(), 0);
    for consumer in consumers {
        consumer.abort();
    }
}

/// Finishes that share one script on Redis: many acks at once, one of them by a delivery
/// whose lease expired and whose task went to another worker. The stale ack answers
/// `LeaseLost` and changes nothing (the new holder's ack deletes the task); every `Ok` ack
/// deleted its task.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_stale_ack_among_batched_acks_is_lease_lost_and_every_ok_deleted() {
    let Some(f) = fixture(Backend::Redis) else {
        return;
    };
    let lease = Duration::from_millis(2000);
    let builder = || DurableQueue::builder().lease(lease).prefetch(64);
    let first = f.open_named(builder(), "acks").await;
    first
        .schedule(Task::new("stale").id("stale"))
        .await
        .unwrap();
    let mut stream = first.deliveries();
    let stale = stream.next().await.unwrap();
    assert_eq!(stale.id().as_str(), "stale");
    drop(stream);
    // Its lease runs out; a second worker takes the task again.
    tokio::time::sleep(lease + Duration::from_millis(700)).await;
    let second = f.open_named(builder(), "acks").await;
    let mut taken = second.deliveries();
    let fresh = taken.next().await.unwrap();
    assert_eq!(fresh.id().as_str(), "stale");
    assert_eq!(fresh.attempt(), 2);
    // Its stream ends, returning what it buffered: the first handle takes the next tasks.
    drop(taken);

    // 200 more tasks, taken and held by the first handle, acked all at once with the stale one.
    let answers = first
        .schedule_many((0..200).map(|i| Task::new("x").id(format!("t{i}"))))
        .await
        .unwrap();
    assert!(answers.iter().all(Result::is_ok));
    let mut stream = first.deliveries();
    let mut held = Vec::new();
    while held.len() < 200 {
        held.push(stream.next().await.unwrap());
    }
    let acks =
        futures::future::join_all(std::iter::once(&stale).chain(held.iter()).map(|d| d.ack()))
            .await;
    assert_eq!(acks[0], Err(Error::LeaseLost), "the stale ack");
    assert!(acks[1..].iter().all(Result::is_ok), "{acks:?}");
    // Every Ok deleted; the stale one changed nothing: the task is still in flight.
    assert_eq!(first.len().await.unwrap(), 1);
    for d in &held {
        assert!(first.get(d.id()).await.unwrap().is_none());
    }
    fresh.ack().await.unwrap();
    assert_eq!(first.len().await.unwrap(), 0);
    // A second, different finish of an acked delivery is refused too.
    assert_eq!(held[0].retry().await, Err(Error::LeaseLost));
}

/// A partitioned queue: `schedule_many` splits the batch by partition; every task is stored
/// and delivered once, and an in-flight id fails alone whichever partition it is in.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_batch_over_partitions_stores_every_task_once() {
    let Some(f) = fixture(Backend::Redis) else {
        return;
    };
    let queue = f
        .open_named(DurableQueue::builder().partitions(4), "parts")
        .await;
    queue.schedule(Task::new("held").id("held")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let held = deliveries.next().await.unwrap();
    let mut tasks: Vec<Task> = (0..1000)
        .map(|i| Task::new("x").id(format!("t{i}")))
        .collect();
    tasks.insert(500, Task::new("again").id("held"));
    let answers = queue.schedule_many(tasks).await.unwrap();
    assert_eq!(answers.len(), 1001);
    assert_eq!(answers[500], Err(Error::InFlight));
    assert_eq!(answers.iter().filter(|a| a.is_ok()).count(), 1000);
    assert_eq!(answers[0], Ok(TaskId::from("t0")));
    assert_eq!(answers[1000], Ok(TaskId::from("t999")));
    held.ack().await.unwrap();
    let mut seen = HashMap::new();
    while seen.len() < 1000 {
        let d = tokio::time::timeout(Duration::from_secs(30), deliveries.next())
            .await
            .expect("a delivery within 30 s")
            .unwrap();
        *seen.entry(d.id().as_str().to_owned()).or_insert(0) += 1;
        d.ack().await.unwrap();
    }
    assert!(seen.values().all(|&n| n == 1));
    assert_eq!(queue.len().await.unwrap(), 0);
}

/// Claims keep the lateness window bounded although they trim it only now and then (once it
/// passes 1100 entries, back to 1000): after 1500 deliveries it holds 1000 to 1100 entries,
/// and `stats` still counts every delivery.
#[cfg(feature = "redis")]
#[tokio::test]
async fn the_lateness_window_stays_bounded_while_claims_trim_it_in_steps() {
    let Some(f) = fixture(Backend::Redis) else {
        return;
    };
    let queue = f.open_named(DurableQueue::builder(), "late").await;
    let tasks = 1500;
    let answers = queue
        .schedule_many((0..tasks).map(|i| Task::new("x").id(format!("t{i}"))))
        .await
        .unwrap();
    assert!(answers.iter().all(Result::is_ok));
    assert_eq!(drain(&queue, tasks).await.len(), tasks);
    let url = f.redis.as_ref().expect("server").url();
    let mut connection = redis::Client::open(url).unwrap().get_connection().unwrap();
    let window: u64 = redis::cmd("LLEN")
        .arg("tw:{late}:lateness")
        .query(&mut connection)
        .unwrap();
    assert!(
        (1000..=1100).contains(&window),
        "{window} lateness entries after {tasks} deliveries"
    );
    assert_eq!(queue.stats().await.unwrap().delivered, tasks as u64);
}
