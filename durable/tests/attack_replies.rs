//! An outside attack on retry recognition on Redis (API.md §4/§4a): a schedule or finish
//! *invocation* (one script call carrying a batch of concurrent calls) whose reply is lost,
//! or whose request is dropped, is retried by the client; every call must answer as it
//! would have, and the store must show each effect exactly once. Faults are injected for
//! real by a loopback proxy matched on the script labels `tw-schedule` and `tw-finish`.
//!
//! What `redis_faults.rs` already covers (one ack, one retry_after, one schedule, a schedule
//! retried after an ack on one partition) is not repeated; these attack batches that mix
//! outcomes, duplicate ids, in-flight ids, chunked `schedule_many`, partitions, several
//! handles, faults met twice in a row, and a retry that outlives the kept reply.
#![cfg(feature = "redis")]

mod support;

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use support::proxy::{Fault, Proxy};
use support::redis_server::RedisServer;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{Deliveries, Delivery, DurableQueue, Error, RetryPolicy, Task};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// A failure guard only: generous, since the machine is loaded.
async fn next(deliveries: &mut Deliveries) -> Delivery {
    tokio::time::timeout(Duration::from_secs(20), deliveries.next())
        .await
        .expect("a delivery within 20 s")
        .expect("the stream is open")
}

async fn nothing_within(deliveries: &mut Deliveries, wait: Duration) {
    if let Ok(Some(d)) = tokio::time::timeout(wait, deliveries.next()).await {
        panic!("unexpected delivery {d:?} (attempt {})", d.attempt());
    }
}

fn raw(server: &RedisServer) -> redis::Connection {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

fn keys(connection: &mut redis::Connection, pattern: &str) -> Vec<String> {
    redis::cmd("KEYS").arg(pattern).query(connection).unwrap()
}

/// Kept invocation replies of queue `q` right now: one per schedule or finish invocation
/// that ran within the window, so a delta counts invocations.
fn kept_replies(connection: &mut redis::Connection, q: &str) -> usize {
    keys(connection, &format!("tw:{{{q}*:call:*")).len()
}

/// Which partition (its meta key) holds each pending or in-flight id, read from outside.
fn partition_of_ids(connection: &mut redis::Connection, q: &str) -> HashMap<String, String> {
    let mut map = HashMap::new();
    for meta in keys(connection, &format!("tw:{{{q}*:meta")) {
        let ids: Vec<String> = redis::cmd("HKEYS").arg(&meta).query(connection).unwrap();
        for id in ids {
            map.insert(id, meta.clone());
        }
    }
    map
}

async fn open(url: &str, q: &str, wheel: &Wheel, partitions: usize) -> DurableQueue {
    DurableQueue::builder()
        .lease(Duration::from_secs(30))
        .prefetch(64)
        .partitions(partitions)
        .retry(RetryPolicy::exponential(ms(300), ms(300)).max_attempts(2))
        .redis(url, q, wheel)
        .await
        .unwrap()
}

/// Runs both scripts once on every partition, so a fault injected next meets the script
/// itself and not a first `EVALSHA` that finds it not loaded.
async fn warm_up(queue: &DurableQueue, deliveries: &mut Deliveries) {
    let ids: Vec<String> = (0..12).map(|i| format!("warm-{i}")).collect();
    for id in &ids {
        queue
            .schedule(Task::new("w").id(id.as_str()))
            .await
            .unwrap();
    }
    for _ in &ids {
        next(deliveries).await.ack().await.unwrap();
    }
}

/// One finish invocation mixing every outcome (two acks, retry, retry_after, fail, a retry
/// of a last attempt, and a second finish of one delivery in the same batch), its reply
/// lost (`lost = 1`) or lost twice in a row (`lost = 2`), or its request dropped before it
/// reached the server: each call answers as it would have, each effect is there once.
async fn mixed_finish_batch(fault: Fault, times: usize, q: &str) {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let proxy = Proxy::start(server.addr()).await;
    let wheel = Wheel::new();
    let queue = open(&proxy.url(), q, &wheel, 1).await;
    let mut deliveries = queue.deliveries();
    warm_up(&queue, &mut deliveries).await;
    // `last` is on its second (and last) attempt when the batch retries it.
    queue.schedule(Task::new("last").id("last")).await.unwrap();
    let first = next(&mut deliveries).await;
    first.retry_after(Duration::ZERO).await.unwrap();
    let last = next(&mut deliveries).await;
    assert_eq!((last.id().as_str(), last.attempt()), ("last", 2));
    let ids = ["a1", "a2", "r", "ra", "f", "x"];
    for id in ids {
        queue.schedule(Task::new(id).id(id)).await.unwrap();
    }
    let mut held = HashMap::new();
    for _ in ids {
        let d = next(&mut deliveries).await;
        held.insert(d.id().to_string(), d);
    }
    let mut store = raw(&server);
    let before = queue.stats().await.unwrap();
    let replies_before = kept_replies(&mut store, q);
    proxy.inject("tw-finish", fault, times);
    // Polled together on this one thread: every entry is queued before the flusher runs.
    let (a1, a2, r, ra, f, x_ack, x_fail, l) = tokio::join!(
        held["a1"].ack(),
        held["a2"].ack(),
        held["r"].retry(),
        held["ra"].retry_after(Duration::ZERO),
        held["f"].fail("boom"),
        held["x"].ack(),
        held["x"].fail("second finish of one delivery"),
        last.retry(),
    );
    assert_eq!(proxy.injected(), times, "the fault met the finish");
    assert_eq!(
        kept_replies(&mut store, q) - replies_before,
        2,
        "the seven deliveries' finishes went out as one invocation, and x's second finish \
         (which waits for its delivery's first) as another"
    );
    assert_eq!(
        (a1, a2, r, ra, f, x_ack, l),
        (Ok(()), Ok(()), Ok(()), Ok(()), Ok(()), Ok(()), Ok(()))
    );
    assert_eq!(x_fail, Err(Error::LeaseLost), "the second finish of x");
    // Retried tasks come back once each, on their second attempt; nothing else comes back.
    let mut again = Vec::new();
    for _ in 0..2 {
        let d = next(&mut deliveries).await;
        assert_eq!(d.attempt(), 2, "{} retried once, not twice", d.id());
        assert_eq!(d.payload(), d.id().as_str().as_bytes());
        again.push(d.id().to_string());
        d.ack().await.unwrap();
    }
    again.sort();
    assert_eq!(again, ["r", "ra"]);
    nothing_within(&mut deliveries, ms(800)).await; // past the 300 ms backoff
    assert_eq!(queue.len().await.unwrap(), 0);
    let mut dead: Vec<_> = queue
        .dead_letters()
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.id.to_string(), d.attempts, d.payload))
        .collect();
    dead.sort();
    assert_eq!(
        dead,
        [
            ("f".to_string(), 1, b"f".to_vec()),
            ("last".to_string(), 2, b"last".to_vec())
        ]
    );
    let reasons: HashMap<_, _> = queue
        .dead_letters()
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.id.to_string(), d.reason))
        .collect();
    assert_eq!(reasons["f"], "boom");
    let after = queue.stats().await.unwrap();
    // a1, a2, x in the batch, then r and ra on their redelivery.
    assert_eq!(after.acked - before.acked, 5, "acked counted once each");
    assert_eq!(
        after.retried - before.retried,
        2,
        "retried counted once each"
    );
    assert_eq!(after.dead_lettered - before.dead_lettered, 2);
    assert_eq!((after.pending, after.in_flight, after.dead), (0, 0, 2));
}

#[tokio::test]
async fn a_mixed_finish_batch_whose_reply_is_lost_acts_once() {
    mixed_finish_batch(Fault::LoseReply, 1, "mix-lost").await;
}

#[tokio::test]
async fn a_mixed_finish_batch_whose_reply_is_lost_twice_acts_once() {
    mixed_finish_batch(Fault::LoseReply, 2, "mix-lost-twice").await;
}

#[tokio::test]
async fn a_mixed_finish_batch_whose_request_is_dropped_acts_once() {
    mixed_finish_batch(Fault::DropRequest, 1, "mix-dropped").await;
}

/// Sixteen concurrent schedules, one invocation, its reply lost (or its request dropped):
/// an id scheduled twice in the batch ends as its later task, an id in flight answers
/// `InFlight` (only it), every other task is made once, and ties go in schedule order.
async fn schedule_batch(fault: Fault, q: &str) {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let proxy = Proxy::start(server.addr()).await;
    let wheel = Wheel::new();
    let queue = open(&proxy.url(), q, &wheel, 1).await;
    let mut deliveries = queue.deliveries();
    warm_up(&queue, &mut deliveries).await;
    queue.schedule(Task::new("held").id("busy")).await.unwrap();
    let busy = next(&mut deliveries).await;
    // Entry 3 and 10 name `dup`; entry 7 names `busy`.
    let calls: Vec<(String, String)> = (0..16)
        .map(|i| match i {
            3 => ("dup".into(), "dup-first".into()),
            10 => ("dup".into(), "dup-second".into()),
            7 => ("busy".into(), "busy-replaced".into()),
            _ => (format!("t{i:02}"), format!("payload-{i}")),
        })
        .collect();
    let mut store = raw(&server);
    let replies_before = kept_replies(&mut store, q);
    proxy.inject("tw-schedule", fault, 1);
    let answers = futures::future::join_all(
        calls
            .iter()
            .map(|(id, payload)| queue.schedule(Task::new(payload.as_str()).id(id.as_str()))),
    )
    .await;
    assert_eq!(proxy.injected(), 1);
    assert_eq!(
        kept_replies(&mut store, q) - replies_before,
        1,
        "one invocation"
    );
    for ((id, _), answer) in calls.iter().zip(&answers) {
        if id == "busy" {
            assert_eq!(answer, &Err(Error::InFlight), "busy is in flight");
        } else {
            assert_eq!(answer.as_ref().map(|t| t.as_str()), Ok(id.as_str()), "{id}");
        }
    }
    assert_eq!(queue.len().await.unwrap(), 15, "14 new tasks and busy");
    // Same due time (now, by the server): schedule order, the dup at its later place.
    let expected: Vec<(String, String)> = calls
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 7)
        .map(|(_, c)| c.clone())
        .collect();
    let mut got = Vec::new();
    for _ in 0..expected.len() {
        let d = next(&mut deliveries).await;
        assert_eq!(d.attempt(), 1, "{} made once", d.id());
        got.push((
            d.id().to_string(),
            String::from_utf8(d.payload().to_vec()).unwrap(),
        ));
        d.ack().await.unwrap();
    }
    assert_eq!(got, expected);
    nothing_within(&mut deliveries, ms(300)).await;
    busy.ack()
        .await
        .expect("the in-flight task was not touched");
    assert_eq!(queue.len().await.unwrap(), 0);
}

#[tokio::test]
async fn a_schedule_batch_whose_reply_is_lost_answers_each_call_once() {
    schedule_batch(Fault::LoseReply, "sched-lost").await;
}

#[tokio::test]
async fn a_schedule_batch_whose_request_is_dropped_runs_once() {
    schedule_batch(Fault::DropRequest, "sched-dropped").await;
}

/// `schedule_many` of more than one chunk per partition, one chunk's reply lost: every task
/// once, with its payload, in due then schedule order within its partition.
async fn schedule_many_lost_chunk(partitions: usize, count: usize, q: &str) {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let proxy = Proxy::start(server.addr()).await;
    let wheel = Wheel::new();
    let queue = open(&proxy.url(), q, &wheel, partitions).await;
    {
        let mut warm = queue.deliveries();
        warm_up(&queue, &mut warm).await;
    }
    // Overdue, ten distinct due times: many ties, decided by schedule order. Every 97th
    // entry schedules again the id of the entry 40 before it (a later task of one id
    // replaces the earlier one, and takes its own place in the order): a retry that acted
    // again would give that id a fresh place after its chunk.
    let base = SystemTime::now() - Duration::from_secs(60);
    let due_of = |i: usize| base + ms(((i * 7) % 10) as u64);
    let id_of = |i: usize| {
        let j = if i % 97 == 50 { i - 40 } else { i };
        format!("m{j:05}")
    };
    let tasks = (0..count).map(|i| Task::new(format!("p{i}")).id(id_of(i)).at(due_of(i)));
    // The entry whose task each id ends as: its last.
    let mut last: HashMap<String, usize> = HashMap::new();
    for i in 0..count {
        last.insert(id_of(i), i);
    }
    let mut store = raw(&server);
    let replies_before = kept_replies(&mut store, q);
    proxy.inject("tw-schedule", Fault::LoseReply, 1);
    let answers = queue.schedule_many(tasks).await.unwrap();
    assert_eq!(proxy.injected(), 1);
    for (i, answer) in answers.iter().enumerate() {
        assert_eq!(answer.as_ref().map(|t| t.to_string()), Ok(id_of(i)));
    }
    let invocations = kept_replies(&mut store, q) - replies_before;
    assert!(
        invocations > partitions,
        "more than one chunk per partition ({invocations} invocations)"
    );
    assert_eq!(queue.len().await.unwrap(), last.len());
    let partition = partition_of_ids(&mut store, q);
    assert_eq!(partition.len(), last.len());
    let mut deliveries = queue.deliveries();
    let mut seen: HashMap<String, Vec<usize>> = HashMap::new();
    for _ in 0..last.len() {
        let d = next(&mut deliveries).await;
        let payload = std::str::from_utf8(d.payload()).unwrap();
        let i: usize = payload[1..].parse().unwrap();
        assert_eq!(
            i,
            last[d.id().as_str()],
            "{} carries its last payload",
            d.id()
        );
        assert_eq!(d.attempt(), 1, "{} made once", d.id());
        seen.entry(partition[d.id().as_str()].clone())
            .or_default()
            .push(i);
        d.ack().await.unwrap();
    }
    nothing_within(&mut deliveries, ms(300)).await;
    let mut total = 0;
    for (part, order) in &seen {
        let mut expected = order.clone();
        expected.sort_by_key(|&i| (due_of(i), i));
        let first_out = order.iter().zip(&expected).position(|(a, b)| a != b);
        assert_eq!(
            first_out,
            None,
            "due/tie order in {part}: entry {:?} delivered where {:?} belongs",
            first_out.map(|k| order[k]),
            first_out.map(|k| expected[k])
        );
        total += order.len();
    }
    assert_eq!(total, last.len());
    assert_eq!(queue.len().await.unwrap(), 0);
}

#[tokio::test]
async fn schedule_many_with_a_lost_chunk_makes_every_task_once_in_order() {
    schedule_many_lost_chunk(1, 1200, "many-1").await;
}

#[tokio::test]
async fn schedule_many_with_a_lost_chunk_on_three_partitions() {
    // 1800 tasks: about 600 per partition, so each partition sends two chunks.
    schedule_many_lost_chunk(3, 1800, "many-3").await;
}

/// Holds a schedule's retry back until a worker (on a direct connection) has acked its task,
/// then lets it through after `hold`: the reply is lost, every retry is dropped until then.
/// Returns how many times the task was delivered and what the schedule answered.
async fn schedule_retried_after_ack(
    lease: Duration,
    hold: Duration,
    q: &str,
) -> Option<(usize, bool)> {
    let server = support::redis_server::start()?;
    let proxy = Proxy::start(server.addr()).await;
    let wheel = Wheel::new();
    let builder = || DurableQueue::builder().lease(lease).partitions(3);
    let producer = builder().redis(&proxy.url(), q, &wheel).await.unwrap();
    let worker = builder().redis(&server.url(), q, &wheel).await.unwrap();
    let mut deliveries = worker.deliveries();
    warm_up(&producer, &mut deliveries).await;
    proxy.inject("tw-schedule", Fault::LoseReply, 1);
    proxy.inject("tw-schedule", Fault::DropRequest, 100_000);
    let scheduling = tokio::spawn({
        let producer = producer.clone();
        async move { producer.schedule(Task::new("once").id("once")).await }
    });
    let d = next(&mut deliveries).await;
    assert_eq!((d.id().as_str(), d.attempt()), ("once", 1));
    d.ack().await.unwrap();
    tokio::time::sleep(hold).await;
    assert!(proxy.injected() >= 2, "the retry was held back");
    proxy.disarm();
    let answer = tokio::time::timeout(Duration::from_secs(20), scheduling)
        .await
        .expect("the schedule returns")
        .unwrap();
    let mut delivered = 1;
    while let Ok(Some(d)) = tokio::time::timeout(ms(500), deliveries.next()).await {
        delivered += 1;
        d.ack().await.unwrap();
    }
    Some((delivered, answer.is_ok()))
}

/// The retry arrives after the ack, within the kept reply's window, on a partitioned queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_retried_after_an_ack_on_a_partitioned_queue_makes_nothing() {
    let Some((delivered, ok)) =
        schedule_retried_after_ack(Duration::from_secs(30), ms(300), "acked-part").await
    else {
        return;
    };
    assert!(ok, "the retried schedule answers Ok");
    assert_eq!(delivered, 1, "the retry did not make the task again");
}

/// The client retries for up to its retry budget (10 s); the kept reply used to live one
/// lease (at least 1 s). With a 1 s lease and a connection that flapped for 2.5 s, the retry
/// found no kept reply and no record (acked) and made the task again. The reply now lives at
/// least the client's whole retry span, whatever the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_retried_after_a_short_lease_still_makes_nothing() {
    let Some((delivered, ok)) =
        schedule_retried_after_ack(Duration::from_secs(1), ms(2500), "acked-late").await
    else {
        return;
    };
    assert!(ok);
    assert_eq!(delivered, 1, "the task ran twice");
}

/// Same gap for a finish: an ack that took effect, whose retries were held past one short
/// lease, used to answer `LeaseLost` although it had deleted the task (the worker then
/// believed the task would run again; it never did).
#[tokio::test]
async fn an_ack_retried_after_a_short_lease_answers_ok() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let proxy = Proxy::start(server.addr()).await;
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .lease(Duration::from_secs(1))
        .redis(&proxy.url(), "ack-late", &wheel)
        .await
        .unwrap();
    let mut deliveries = queue.deliveries();
    warm_up(&queue, &mut deliveries).await;
    queue.schedule(Task::new("a").id("a")).await.unwrap();
    let d = next(&mut deliveries).await;
    proxy.inject("tw-finish", Fault::LoseReply, 1);
    proxy.inject("tw-finish", Fault::DropRequest, 100_000);
    let acking = tokio::spawn(async move { d.ack().await });
    tokio::time::sleep(ms(2500)).await;
    proxy.disarm();
    let answer = acking.await.unwrap();
    nothing_within(&mut deliveries, ms(1500)).await; // deleted: never delivered again
    assert_eq!(queue.len().await.unwrap(), 0);
    assert_eq!(answer, Ok(()), "the ack took effect once");
}

/// Two handles of one queue in one process, each with a finish batch and a schedule batch in
/// flight at once, every reply lost: invocation names never collide, so neither handle is
/// answered with the other's kept reply.
#[tokio::test]
async fn two_handles_in_one_process_losing_replies_at_once_stay_apart() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let proxy = Proxy::start(server.addr()).await;
    let wheel = Wheel::new();
    let q = "two-handles";
    let one = open(&proxy.url(), q, &wheel, 1).await;
    let two = open(&proxy.url(), q, &wheel, 1).await;
    let mut d1 = one.deliveries();
    warm_up(&one, &mut d1).await;
    // Two deliveries held by each handle: the first stream is dropped (its buffer returned)
    // before the second handle claims.
    for i in 0..2 {
        one.schedule(Task::new(format!("h{i}")).id(format!("h{i}")))
            .await
            .unwrap();
    }
    let (x, y) = (next(&mut d1).await, next(&mut d1).await);
    drop(d1);
    for i in 2..4 {
        two.schedule(Task::new(format!("h{i}")).id(format!("h{i}")))
            .await
            .unwrap();
    }
    let mut d2 = two.deliveries();
    let (z, w) = (next(&mut d2).await, next(&mut d2).await);
    let mut d1 = one.deliveries();
    proxy.inject("tw-finish", Fault::LoseReply, 2);
    proxy.inject("tw-schedule", Fault::LoseReply, 2);
    let (fx, fy, fz, fw, s1, s2) = tokio::join!(
        x.ack(),
        y.retry_after(Duration::ZERO),
        z.fail("two"),
        w.ack(),
        one.schedule(Task::new("from-one").id("n1")),
        two.schedule(Task::new("from-two").id("n2")),
    );
    assert_eq!((fx, fy, fz, fw), (Ok(()), Ok(()), Ok(()), Ok(())));
    assert_eq!((s1.unwrap().as_str(), s2.unwrap().as_str()), ("n1", "n2"));
    assert_eq!(proxy.injected(), 4);
    // y again (attempt 2), n1 and n2 once each; z dead; x and w gone.
    let mut got = Vec::new();
    for _ in 0..3 {
        let d = tokio::select! {
            d = next(&mut d1) => d,
            d = next(&mut d2) => d,
        };
        got.push((d.id().to_string(), d.attempt(), d.payload().to_vec()));
        d.ack().await.unwrap();
    }
    got.sort();
    let y_id = y.id().to_string();
    let mut expected = vec![
        ("n1".to_string(), 1, b"from-one".to_vec()),
        ("n2".to_string(), 1, b"from-two".to_vec()),
        (y_id.clone(), 2, y_id.as_bytes().to_vec()),
    ];
    expected.sort();
    assert_eq!(got, expected);
    nothing_within(&mut d1, ms(300)).await;
    nothing_within(&mut d2, ms(100)).await;
    let dead = one.dead_letters().await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].id.as_str(), dead[0].attempts),
        (z.id().as_str(), 1)
    );
    assert_eq!(one.len().await.unwrap(), 0);
}
