//! An outside attack on the Redis backend's pipelined schedules (API.md §4, §4a, §4b): up to
//! four `schedule` script invocations in flight on one connection, another one sent once
//! eight calls wait. Written against the public API only: many producers on a multi-thread
//! runtime scheduling, replacing and cancelling the same and different ids; visibility from
//! another handle the moment a call returns; ties in one producer's order while others
//! flood; connections cut, replies lost and the server frozen with several invocations in
//! flight; `InFlight` inside a shared invocation; `schedule_many` racing single schedules;
//! `close()`, wheel shutdown and the wheel's runtime ending mid-flood; payloads of 1–8 MiB
//! in the same burst as small ones; and a partition that holds a schedule invocation's
//! retries past its kept reply's 15 s (found here: the late retry acted again; now each
//! invocation carries a `not after` in server time and a later copy does nothing).
//!
//! Every call is bounded by a generous 30 s guard that only turns a hang into a failure: the
//! checks are outcomes (answers, states, counts, payload bytes, order), never durations.
#![cfg(feature = "redis")]

mod support;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use support::Rng;
use support::backend::{all_pending, stats_add_up};
use support::proxy::{Fault, Proxy};
use tokio_wheel::Wheel;
use tokio_wheel_durable::{Deliveries, Delivery, DurableQueue, Error, Task, TaskId, TaskState};

/// Only a hang guard: a call that does not return within it is a failure.
const GUARD: Duration = Duration::from_secs(30);

async fn bounded<T>(what: &str, call: impl Future<Output = T>) -> T {
    match tokio::time::timeout(GUARD, call).await {
        Ok(value) => value,
        Err(_) => panic!("{what}: no answer within {GUARD:?} (hung)"),
    }
}

/// The stream's next delivery (hang guard only).
async fn next(deliveries: &mut Deliveries) -> Delivery {
    bounded("next delivery", deliveries.next())
        .await
        .expect("the stream is open")
}

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A due time on a whole millisecond, `ahead` from now.
fn whole_ms(ahead: Duration) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(epoch_ms(SystemTime::now() + ahead))
}

async fn open(url: &str, name: &str, wheel: &Wheel) -> DurableQueue {
    DurableQueue::builder()
        .redis(url, name, wheel)
        .await
        .unwrap()
}

/// Payload (as text) → ids holding it, over every pending task.
async fn ids_by_payload(queue: &DurableQueue) -> HashMap<Vec<u8>, Vec<TaskId>> {
    let mut map: HashMap<Vec<u8>, Vec<TaskId>> = HashMap::new();
    for id in all_pending(queue).await {
        let payload = queue.payload(&id).await.unwrap().expect("listed");
        map.entry(payload).or_default().push(id);
    }
    map
}

/// A payload that shows which task it belongs to at every byte.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next().to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Per id: each delivery's payload and attempt.
type Seen = HashMap<String, Vec<(Vec<u8>, u32)>>;
/// Each delivery's id and payload, in order.
type Log = Vec<(String, Vec<u8>)>;
/// A flooding producer: each of its calls' id and answer.
type Producer = tokio::task::JoinHandle<Vec<(String, Result<TaskId, Error>)>>;

/// Whether an error is one a caller can act on: not a panic, not a silent success.
fn clear(error: &Error) -> bool {
    matches!(
        error,
        Error::Unreachable(_) | Error::Io(_) | Error::Closed | Error::InFlight
    )
}

/// SIGCONT on drop, so a failing check never leaves the server frozen.
struct Thaw(u32);

impl Drop for Thaw {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

/// One call on a contended id: its payload and its place in real time (a counter taken
/// before it was made and after it returned).
struct Timed {
    id: String,
    payload: Vec<u8>,
    start: u64,
    end: u64,
}

/// 64 producers at once, no warm-up (the first invocations find the script not loaded):
/// each owns four ids it schedules, replaces, cancels and reschedules in sequence (so its
/// own answers and the ids' final states are known exactly), and also replaces eight ids
/// every producer shares. Afterwards each owned id is as its producer's last call left it,
/// `cancel`/`reschedule` answered `true` exactly when the id was there, each shared id is
/// one task holding the payload of a call no other call followed in real time, and `len()`
/// adds up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_producers_leave_each_id_as_its_last_completed_call() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = open(&server.url(), "last-call", &wheel).await;
    let base = whole_ms(Duration::from_secs(86_400));
    let clock = Arc::new(AtomicU64::new(0));
    let mut producers = Vec::new();
    for p in 0..64u64 {
        let queue = queue.clone();
        let clock = clock.clone();
        producers.push(tokio::spawn(async move {
            let mut rng = Rng(0x5EED ^ ((p + 1) * 7919));
            let mut model: HashMap<String, Option<(Vec<u8>, u64)>> = HashMap::new();
            let mut shared = Vec::new();
            for i in 0..40u64 {
                let roll = rng.below(10);
                if roll < 3 {
                    let id = format!("shared-{}", rng.below(8));
                    let payload = format!("shared-{p}-{i}").into_bytes();
                    let start = clock.fetch_add(1, Ordering::SeqCst);
                    let answer = bounded(
                        "schedule",
                        queue.schedule(Task::new(payload.clone()).id(id.as_str()).at(base)),
                    )
                    .await;
                    let end = clock.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(answer.unwrap().as_str(), id);
                    shared.push(Timed {
                        id,
                        payload,
                        start,
                        end,
                    });
                    continue;
                }
                let id = format!("own-{p}-{}", rng.below(4));
                let state = model.entry(id.clone()).or_insert(None);
                let due = base + Duration::from_millis(rng.below(3_600_000));
                match roll {
                    3..=6 => {
                        let payload = format!("own-{p}-{i}").into_bytes();
                        let answer = bounded(
                            "schedule",
                            queue.schedule(Task::new(payload.clone()).id(id.as_str()).at(due)),
                        )
                        .await;
                        assert_eq!(answer.unwrap().as_str(), id);
                        *state = Some((payload, epoch_ms(due)));
                    }
                    7 | 8 => {
                        let answer = bounded("cancel", queue.cancel(&id.as_str().into())).await;
                        assert_eq!(answer.unwrap(), state.is_some(), "cancel({id})");
                        *state = None;
                    }
                    _ => {
                        let answer =
                            bounded("reschedule", queue.reschedule(&id.as_str().into(), due)).await;
                        assert_eq!(answer.unwrap(), state.is_some(), "reschedule({id})");
                        if let Some((_, at)) = state {
                            *at = epoch_ms(due);
                        }
                    }
                }
            }
            (model, shared)
        }));
    }
    let mut owned = HashMap::new();
    let mut shared: Vec<Timed> = Vec::new();
    for producer in producers {
        let (model, calls) = producer.await.unwrap();
        owned.extend(model);
        shared.extend(calls);
    }
    let mut present = 0;
    for (id, expected) in &owned {
        let info = queue.get(&id.as_str().into()).await.unwrap();
        match expected {
            None => assert_eq!(info, None, "{id} was cancelled last"),
            Some((payload, due)) => {
                present += 1;
                let info = info.unwrap_or_else(|| panic!("{id} lost"));
                assert!(matches!(info.state, TaskState::Pending), "{id}: {info:?}");
                assert_eq!(epoch_ms(info.due), *due, "{id}: due of its last call");
                assert_eq!(
                    queue.payload(&id.as_str().into()).await.unwrap().as_ref(),
                    Some(payload),
                    "{id}: payload of its last schedule"
                );
            }
        }
    }
    let mut by_id: HashMap<&str, Vec<&Timed>> = HashMap::new();
    for call in &shared {
        by_id.entry(call.id.as_str()).or_default().push(call);
    }
    for (id, calls) in &by_id {
        let payload = queue.payload(&(*id).into()).await.unwrap().expect(id);
        let winner = calls
            .iter()
            .find(|c| c.payload == payload)
            .unwrap_or_else(|| panic!("{id} holds a payload no call scheduled"));
        let later: Vec<_> = calls.iter().filter(|c| c.start > winner.end).collect();
        assert!(
            later.is_empty(),
            "{id} holds {:?}, but {} call(s) started after that call returned (first: {:?})",
            String::from_utf8_lossy(&payload),
            later.len(),
            String::from_utf8_lossy(&later[0].payload)
        );
    }
    assert_eq!(queue.len().await.unwrap(), present + by_id.len());
    assert_eq!(all_pending(&queue).await.len(), present + by_id.len());
    stats_add_up(&queue).await;
}

/// 64 producers flood due-now tasks while two other handles consume and ack; every fifth
/// task is first scheduled far ahead with an old payload and then replaced (by the same
/// producer, in sequence) with a due-now one. Every task is delivered exactly once, on its
/// first attempt, with its payload — never the replaced one — and the queue ends empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_with_workers_delivers_each_task_once_with_its_payload() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let url = server.url();
    let wheel = Wheel::new();
    let producer = open(&url, "flood", &wheel).await;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let total = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..2 {
        let worker = open(&url, "flood", &wheel).await;
        let (seen, total, stop) = (seen.clone(), total.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut stream = worker.deliveries();
            while !stop.load(Ordering::SeqCst) {
                let Ok(Some(d)) =
                    tokio::time::timeout(Duration::from_millis(200), stream.next()).await
                else {
                    continue;
                };
                seen.lock()
                    .unwrap()
                    .entry(d.id().to_string())
                    .or_default()
                    .push((d.payload().to_vec(), d.attempt()));
                d.ack().await.unwrap();
                total.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let far = SystemTime::now() + Duration::from_secs(86_400);
    let mut producers = Vec::new();
    for p in 0..64 {
        let queue = producer.clone();
        producers.push(tokio::spawn(async move {
            let mut expected = Vec::new();
            for i in 0..25 {
                let id = format!("d-{p}-{i}");
                let payload = format!("payload-{p}-{i}").into_bytes();
                if i % 5 == 0 {
                    bounded(
                        "schedule old",
                        queue.schedule(Task::new(b"old".to_vec()).id(id.as_str()).at(far)),
                    )
                    .await
                    .unwrap();
                }
                bounded(
                    "schedule",
                    queue.schedule(Task::new(payload.clone()).id(id.as_str())),
                )
                .await
                .unwrap();
                expected.push((id, payload));
            }
            expected
        }));
    }
    let mut expected = HashMap::new();
    for p in producers {
        expected.extend(p.await.unwrap());
    }
    bounded("every delivery", async {
        while total.load(Ordering::SeqCst) < expected.len() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // Past the last expected delivery: nothing more comes (no duplicate, no old copy).
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(seen.len(), expected.len(), "ids delivered");
    for (id, payload) in &expected {
        let got = &seen[id];
        assert_eq!(got.len(), 1, "{id} delivered {} times", got.len());
        assert_eq!(&got[0].0, payload, "{id}'s payload");
        assert_eq!(got[0].1, 1, "{id}'s attempt");
    }
    assert_eq!(producer.len().await.unwrap(), 0);
    let stats = producer.stats().await.unwrap();
    assert_eq!(stats.acked, expected.len() as u64);
    assert_eq!(stats.delivered, expected.len() as u64);
    stats_add_up(&producer).await;
}

/// 48 producers on a queue of three partitions: the moment each `schedule` returns,
/// another handle (its own connection) sees the task with its due time and payload — a
/// replacement too — and at the end its `len()` counts every task.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schedule_returns_only_once_another_handle_sees_it() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let url = server.url();
    let wheel = Wheel::new();
    let open3 = |name: &'static str| {
        let url = url.clone();
        let wheel = wheel.clone();
        async move {
            DurableQueue::builder()
                .partitions(3)
                .redis(&url, name, &wheel)
                .await
                .unwrap()
        }
    };
    let writer = open3("visible").await;
    let reader = open3("visible").await;
    let base = whole_ms(Duration::from_secs(86_400));
    let mut producers = Vec::new();
    for p in 0..48u64 {
        let (writer, reader) = (writer.clone(), reader.clone());
        producers.push(tokio::spawn(async move {
            for i in 0..20u64 {
                let id = TaskId::from(format!("v-{p}-{i}"));
                let due = base + Duration::from_millis(p * 1000 + i);
                let payload = pattern(p * 100 + i, 10 + (i as usize % 7) * 50);
                bounded(
                    "schedule",
                    writer.schedule(Task::new(payload.clone()).id(id.as_str()).at(due)),
                )
                .await
                .unwrap();
                let info = reader.get(&id).await.unwrap();
                let info =
                    info.unwrap_or_else(|| panic!("{id}: Ok, but another handle sees nothing"));
                assert_eq!(epoch_ms(info.due), epoch_ms(due), "{id}");
                assert_eq!(info.payload_len, payload.len(), "{id}");
                if i % 4 == 0 {
                    let replaced = pattern(p * 100 + i + 50_000, 33);
                    bounded(
                        "replace",
                        writer.schedule(Task::new(replaced.clone()).id(id.as_str()).at(due)),
                    )
                    .await
                    .unwrap();
                    assert_eq!(
                        reader.payload(&id).await.unwrap().as_ref(),
                        Some(&replaced),
                        "{id}: the replacement, seen at once"
                    );
                } else {
                    assert_eq!(reader.payload(&id).await.unwrap().as_ref(), Some(&payload));
                }
            }
        }));
    }
    for p in producers {
        p.await.unwrap();
    }
    assert_eq!(reader.len().await.unwrap(), 48 * 20);
    assert_eq!(all_pending(&reader).await.len(), 48 * 20);
}

/// Sixteen producers schedule at the same instant, each in sequence (120 calls, ids in a
/// scrambled order): ties go in schedule order, so each producer's own tasks are listed, and
/// delivered to one consumer, in the order it scheduled them, however the 16 interleave.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ties_keep_each_producers_order_while_fifteen_others_flood() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = open(&server.url(), "ties", &wheel).await;
    // Overdue already, so the delivery order below is the tie order.
    let tie = whole_ms(Duration::ZERO) - Duration::from_secs(1);
    let per = 120;
    let mut producers = Vec::new();
    for p in 0..16 {
        let queue = queue.clone();
        producers.push(tokio::spawn(async move {
            let ids: Vec<String> = (0..per)
                .map(|i| format!("p{p:02}-{:03}", (i * 37 + p * 11) % per))
                .collect();
            for id in &ids {
                bounded(
                    "schedule",
                    queue.schedule(Task::new(id.clone().into_bytes()).id(id.as_str()).at(tie)),
                )
                .await
                .unwrap();
            }
            ids
        }));
    }
    let mut orders = Vec::new();
    for p in producers {
        orders.push(p.await.unwrap());
    }
    let listed: Vec<String> = all_pending(&queue)
        .await
        .into_iter()
        .map(|id| id.to_string())
        .collect();
    assert_eq!(listed.len(), 16 * per);
    for (p, order) in orders.iter().enumerate() {
        let mine: Vec<&String> = listed
            .iter()
            .filter(|id| id.starts_with(&format!("p{p:02}-")))
            .collect();
        let order: Vec<&String> = order.iter().collect();
        assert_eq!(
            mine, order,
            "producer {p}'s ties are not in its schedule order"
        );
    }
    let mut stream = queue.deliveries();
    let mut delivered = Vec::new();
    while delivered.len() < listed.len() {
        let d = next(&mut stream).await;
        assert_eq!(d.payload(), d.id().as_str().as_bytes());
        delivered.push(d.id().to_string());
        d.ack().await.unwrap();
    }
    assert_eq!(
        delivered, listed,
        "delivery order is not tie (schedule) order"
    );
}

/// A flood of anonymous schedules (generated ids, a unique payload each) through a proxy
/// that cuts the connection six times while invocations are in flight: thrice losing the
/// replies of commands that ran, thrice dropping requests before they reach the server.
/// Every call returns; each Ok is exactly one task with its payload; each Err is a clear
/// error and left at most one task; no payload is ever stored twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cut_connections_mid_flood_leave_each_call_at_most_once() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let proxy = Arc::new(Proxy::start(server.addr()).await);
    let wheel = Wheel::new();
    let queue = open(&proxy.url(), "cut", &wheel).await;
    let far = SystemTime::now() + Duration::from_secs(86_400);
    let started = Arc::new(AtomicUsize::new(0));
    let faults = {
        let (proxy, started) = (proxy.clone(), started.clone());
        tokio::spawn(async move {
            for k in 0..6 {
                // Each fault armed only while the flood is under way.
                while started.load(Ordering::SeqCst) < 150 * (k + 1) {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                let fault = if k % 2 == 0 {
                    Fault::LoseReply
                } else {
                    Fault::DropRequest
                };
                proxy.inject("tw-schedule", fault, 1);
            }
        })
    };
    let mut producers = Vec::new();
    for p in 0..32 {
        let queue = queue.clone();
        let started = started.clone();
        producers.push(tokio::spawn(async move {
            let mut calls = Vec::new();
            for i in 0..40 {
                started.fetch_add(1, Ordering::SeqCst);
                let payload = format!("cut-{p}-{i}").into_bytes();
                let answer = bounded(
                    "schedule",
                    queue.schedule(Task::new(payload.clone()).at(far)),
                )
                .await;
                calls.push((payload, answer));
            }
            calls
        }));
    }
    let mut calls = Vec::new();
    for p in producers {
        calls.extend(p.await.unwrap());
    }
    faults.await.unwrap();
    proxy.disarm();
    assert!(proxy.injected() >= 4, "faults met: {}", proxy.injected());
    let stored = ids_by_payload(&queue).await;
    let mut ok = 0;
    for (payload, answer) in &calls {
        let holders = stored.get(payload).map_or(0, Vec::len);
        let name = String::from_utf8_lossy(payload);
        assert!(holders <= 1, "{name} stored {holders} times");
        match answer {
            Ok(id) => {
                ok += 1;
                assert_eq!(holders, 1, "{name} answered Ok but is not stored");
                assert_eq!(&stored[payload][0], id, "{name} stored under another id");
            }
            Err(e) => assert!(clear(e), "{name}: {e:?}"),
        }
    }
    assert!(ok > 0);
    let total: usize = stored.values().map(Vec::len).sum();
    assert_eq!(total, queue.len().await.unwrap());
    assert!(total <= calls.len());
}

/// Eight tasks held by a consumer; 64 producers then schedule 10 tasks each at once, some of
/// them naming the held ids: exactly those calls answer `InFlight`, every other call of the
/// same invocations succeeds, the held tasks keep their payload and lease (their acks
/// succeed), and nothing of a refused call is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_flight_ids_fail_alone_inside_shared_invocations() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = open(&server.url(), "held", &wheel).await;
    for h in 0..8 {
        queue
            .schedule(Task::new(format!("held-{h}")).id(format!("held-{h}")))
            .await
            .unwrap();
    }
    let mut stream = queue.deliveries();
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(next(&mut stream).await);
    }
    drop(stream);
    let far = SystemTime::now() + Duration::from_secs(86_400);
    let mut producers = Vec::new();
    for p in 0..64 {
        let queue = queue.clone();
        producers.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            let calls = (0..10).map(|i| {
                let id = if (p + i) % 9 == 0 {
                    format!("held-{}", (p + i) % 8)
                } else {
                    format!("new-{p}-{i}")
                };
                let queue = queue.clone();
                async move {
                    let answer = bounded(
                        "schedule",
                        queue.schedule(Task::new(b"replacement".to_vec()).id(id.as_str()).at(far)),
                    )
                    .await;
                    (id, answer)
                }
            });
            // Each producer's ten at once, so invocations mix refused and accepted calls.
            answers.extend(futures::future::join_all(calls).await);
            answers
        }));
    }
    let mut accepted = 0;
    let mut refused = 0;
    for p in producers {
        for (id, answer) in p.await.unwrap() {
            if id.starts_with("held-") {
                refused += 1;
                assert_eq!(answer, Err(Error::InFlight), "{id}");
            } else {
                accepted += 1;
                assert_eq!(answer.unwrap().as_str(), id);
            }
        }
    }
    assert!(refused > 0);
    for d in &held {
        assert_eq!(
            queue.payload(d.id()).await.unwrap().unwrap(),
            d.id().as_str().as_bytes(),
            "{} was replaced while in flight",
            d.id()
        );
        assert!(matches!(
            queue.get(d.id()).await.unwrap().unwrap().state,
            TaskState::InFlight { .. }
        ));
    }
    assert_eq!(queue.len().await.unwrap(), accepted + 8);
    for d in held {
        d.ack().await.expect("the held task's lease survived");
    }
    assert_eq!(queue.len().await.unwrap(), accepted);
    stats_add_up(&queue).await;
}

/// Four `schedule_many` batches of 700 tasks (two chunks each) race 32 producers of single
/// schedules, all at the same instant, and two of the batches overlap ids the producers
/// also schedule: every answer is Ok, each batch's and each producer's tasks keep their own
/// order among the ties, and every id is one task.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schedule_many_racing_single_schedules_keeps_every_order() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = open(&server.url(), "many", &wheel).await;
    let tie = whole_ms(Duration::from_secs(86_400));
    let mut batches = Vec::new();
    for b in 0..4usize {
        let queue = queue.clone();
        batches.push(tokio::spawn(async move {
            let ids: Vec<String> = (0..700usize)
                .map(|i| format!("m{b}-{:03}", (i * 53 + b) % 700))
                .collect();
            let answers = bounded(
                "schedule_many",
                queue.schedule_many(
                    ids.iter()
                        .map(|id| Task::new(id.clone().into_bytes()).id(id.as_str()).at(tie)),
                ),
            )
            .await
            .unwrap();
            assert_eq!(answers.len(), ids.len());
            for (id, answer) in ids.iter().zip(answers) {
                assert_eq!(answer.unwrap().as_str(), id);
            }
            ids
        }));
    }
    let mut singles = Vec::new();
    for p in 0..32usize {
        let queue = queue.clone();
        singles.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..40usize {
                // Producers 0..8 also schedule ids that batches 0 and 1 carry.
                let id = if p < 8 && i % 4 == 0 {
                    format!("m{}-{:03}", p % 2, p * 40 + i)
                } else {
                    format!("s{p:02}-{:02}", (i * 7) % 40)
                };
                bounded(
                    "schedule",
                    queue.schedule(Task::new(id.clone().into_bytes()).id(id.as_str()).at(tie)),
                )
                .await
                .unwrap();
                ids.push(id);
            }
            ids
        }));
    }
    let mut all = HashSet::new();
    let mut batch_orders = Vec::new();
    for b in batches {
        let ids = b.await.unwrap();
        all.extend(ids.iter().cloned());
        batch_orders.push(ids);
    }
    let mut single_orders = Vec::new();
    for s in singles {
        let ids = s.await.unwrap();
        all.extend(ids.iter().cloned());
        single_orders.push(ids);
    }
    let listed: Vec<String> = all_pending(&queue)
        .await
        .into_iter()
        .map(|id| id.to_string())
        .collect();
    assert_eq!(listed.len(), all.len(), "one task per id");
    assert_eq!(queue.len().await.unwrap(), all.len());
    let position: HashMap<&str, usize> = listed
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    // A producer's ids that no batch carries keep the producer's order. (One a batch also
    // carries takes the place of whichever schedule of it came last, the producer's or the
    // batch's: the two race, so either may.)
    let batched: HashSet<&String> = batch_orders.iter().flatten().collect();
    for order in &single_orders {
        let places: Vec<usize> = order
            .iter()
            .filter(|id| !batched.contains(id))
            .map(|id| position[id.as_str()])
            .collect();
        assert!(
            places.windows(2).all(|w| w[0] < w[1]),
            "a producer's sequential ties are out of order: {order:?}"
        );
    }
    // A batch's ids that no single producer touched keep the batch's order.
    let touched: HashSet<&String> = single_orders.iter().flatten().collect();
    for order in &batch_orders {
        let places: Vec<usize> = order
            .iter()
            .filter(|id| !touched.contains(id))
            .map(|id| position[id.as_str()])
            .collect();
        assert!(
            places.windows(2).all(|w| w[0] < w[1]),
            "a batch's ties are out of order"
        );
    }
}

/// What a flood run against a queue that goes away mid-flood: every call's answer (each
/// call bounded), by producer.
async fn flood_until_gone(
    queue: &DurableQueue,
    prefix: &'static str,
    producers: usize,
    go: Arc<AtomicUsize>,
) -> Vec<Producer> {
    let far = SystemTime::now() + Duration::from_secs(86_400);
    (0..producers)
        .map(|p| {
            let queue = queue.clone();
            let go = go.clone();
            tokio::spawn(async move {
                let mut calls = Vec::new();
                for i in 0.. {
                    let id = format!("{prefix}-{p}-{i}");
                    let answer = bounded(
                        "schedule",
                        queue.schedule(Task::new(id.clone().into_bytes()).id(id.as_str()).at(far)),
                    )
                    .await;
                    go.fetch_add(1, Ordering::SeqCst);
                    let done = answer.is_err();
                    calls.push((id, answer));
                    // A few calls past the first refusal, each of which must also return.
                    if done && calls.iter().filter(|(_, a)| a.is_err()).count() >= 3 {
                        break;
                    }
                }
                calls
            })
        })
        .collect()
}

/// Checks a flood's answers against a fresh handle: every Ok is stored (with its payload),
/// every Err is `Closed` (or another clear error); returns how many were Ok.
async fn check_flood(fresh: &DurableQueue, producers: Vec<Producer>) -> usize {
    let mut ok = 0;
    let mut all = 0;
    for p in producers {
        for (id, answer) in bounded("producer", p).await.unwrap() {
            all += 1;
            match answer {
                Ok(got) => {
                    ok += 1;
                    assert_eq!(got.as_str(), id);
                    assert_eq!(
                        fresh.payload(&got).await.unwrap().as_deref(),
                        Some(id.as_bytes()),
                        "{id} answered Ok but is not stored"
                    );
                }
                Err(e) => assert!(clear(&e), "{id}: {e:?}"),
            }
        }
    }
    let stored = fresh.len().await.unwrap();
    assert!(
        stored >= ok && stored <= all,
        "{ok} Ok, {all} calls, {stored} stored"
    );
    ok
}

/// `close()` while 64 producers flood: every queued and in-flight call returns (Ok or
/// `Closed`), calls made after it return `Closed`, and every Ok is in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn close_mid_flood_answers_every_call() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = open(&server.url(), "close", &wheel).await;
    let go = Arc::new(AtomicUsize::new(0));
    let producers = flood_until_gone(&queue, "c", 64, go.clone()).await;
    while go.load(Ordering::SeqCst) < 400 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    bounded("close", queue.close()).await;
    let after = bounded(
        "schedule after close",
        queue.schedule(Task::new(b"late".to_vec()).id("late")),
    )
    .await;
    assert_eq!(after, Err(Error::Closed));
    let fresh = open(&server.url(), "close", &Wheel::new()).await;
    let ok = check_flood(&fresh, producers).await;
    assert!(ok >= 400);
    assert_eq!(fresh.get(&"late".into()).await.unwrap(), None);
}

/// `wheel.shutdown()` while 64 producers flood: every call returns (Ok or `Closed`), and
/// every Ok is in the store as a fresh handle on a new wheel sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wheel_shutdown_mid_flood_answers_every_call() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = open(&server.url(), "shut", &wheel).await;
    let go = Arc::new(AtomicUsize::new(0));
    let producers = flood_until_gone(&queue, "w", 64, go.clone()).await;
    while go.load(Ordering::SeqCst) < 400 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    bounded("wheel shutdown", wheel.shutdown()).await;
    let fresh = open(&server.url(), "shut", &Wheel::new()).await;
    let ok = check_flood(&fresh, producers).await;
    assert!(ok >= 400);
}

/// The wheel's own runtime (where the queue's background work runs) ends mid-flood, the
/// producers being on another runtime: every call returns (Ok or a clear error), and every
/// Ok is in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_wheels_runtime_ending_mid_flood_answers_every_call() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let wheel = Wheel::builder().runtime(runtime.handle().clone()).build();
    let queue = open(&server.url(), "rt", &wheel).await;
    let go = Arc::new(AtomicUsize::new(0));
    let producers = flood_until_gone(&queue, "r", 64, go.clone()).await;
    while go.load(Ordering::SeqCst) < 400 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    runtime.shutdown_background();
    let fresh = open(&server.url(), "rt", &Wheel::new()).await;
    let ok = check_flood(&fresh, producers).await;
    assert!(ok >= 400);
    let late = bounded(
        "schedule after the runtime ended",
        queue.schedule(Task::new(b"late".to_vec()).id("late")),
    )
    .await;
    if let Err(e) = &late {
        assert!(clear(e), "{e:?}");
    }
}

/// Five payloads of 1–8 MiB scheduled in the same burst as 400 small ones from 40
/// producers (and, in sequence, a big task replaced by a small one and a small by a big
/// one): every delivery carries exactly the bytes of the last schedule of its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn huge_and_small_payloads_in_one_burst_arrive_exactly() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .prefetch(4)
        .redis(&server.url(), "huge", &wheel)
        .await
        .unwrap();
    const MIB: usize = 1 << 20;
    let mut calls = Vec::new();
    for (k, size) in [MIB, 2 * MIB, 3 * MIB + 7, 5 * MIB, 8 * MIB]
        .into_iter()
        .enumerate()
    {
        let queue = queue.clone();
        calls.push(tokio::spawn(async move {
            let id = format!("big-{k}");
            let payload = pattern(1000 + k as u64, size);
            bounded(
                "big schedule",
                queue.schedule(Task::new(payload.clone()).id(id.as_str())),
            )
            .await
            .unwrap();
            vec![(id, payload)]
        }));
    }
    for p in 0..40u64 {
        let queue = queue.clone();
        calls.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..10u64 {
                let id = format!("small-{p}-{i}");
                let payload = pattern(p * 100 + i, (p * 13 + i * 7) as usize % 300);
                bounded(
                    "small schedule",
                    queue.schedule(Task::new(payload.clone()).id(id.as_str())),
                )
                .await
                .unwrap();
                out.push((id, payload));
            }
            out
        }));
    }
    {
        let queue = queue.clone();
        calls.push(tokio::spawn(async move {
            let far = SystemTime::now() + Duration::from_secs(86_400);
            let shrink = pattern(7, 12);
            let grow = pattern(8, 6 * MIB + 1);
            queue
                .schedule(Task::new(pattern(9, 4 * MIB)).id("shrink").at(far))
                .await
                .unwrap();
            queue
                .schedule(Task::new(b"tiny".to_vec()).id("grow").at(far))
                .await
                .unwrap();
            queue
                .schedule(Task::new(shrink.clone()).id("shrink"))
                .await
                .unwrap();
            queue
                .schedule(Task::new(grow.clone()).id("grow"))
                .await
                .unwrap();
            vec![("shrink".to_string(), shrink), ("grow".to_string(), grow)]
        }));
    }
    let mut expected = HashMap::new();
    for c in calls {
        expected.extend(c.await.unwrap());
    }
    let mut stream = queue.deliveries();
    let mut seen = HashSet::new();
    while seen.len() < expected.len() {
        let d = next(&mut stream).await;
        let id = d.id().to_string();
        let want = expected
            .get(&id)
            .unwrap_or_else(|| panic!("unexpected delivery {id}"));
        assert!(
            d.payload() == want.as_slice(),
            "{id}: {} bytes delivered, {} scheduled (or different bytes)",
            d.payload().len(),
            want.len()
        );
        assert!(seen.insert(id.clone()), "{id} delivered twice");
        d.ack().await.unwrap();
    }
    assert_eq!(queue.len().await.unwrap(), 0);
}

/// The server frozen (SIGSTOP) for 11 s while 24 producers flood anonymous schedules, four
/// invocations in flight: longer than a call's whole retry span, so calls in flight fail;
/// then it resumes and runs everything that was sent. Every call returns; each Ok is
/// exactly one task with its payload; each Err is a clear error and left at most one task;
/// no payload is stored twice — though the server ran every retry it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_server_mid_flood_leaves_each_call_at_most_once() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = open(&server.url(), "frozen", &wheel).await;
    let far = SystemTime::now() + Duration::from_secs(86_400);
    let go = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut producers = Vec::new();
    for p in 0..24 {
        let (queue, go, stop) = (queue.clone(), go.clone(), stop.clone());
        producers.push(tokio::spawn(async move {
            let mut calls = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let payload = format!("frozen-{p}-{i}").into_bytes();
                i += 1;
                let answer = bounded(
                    "schedule",
                    queue.schedule(Task::new(payload.clone()).at(far)),
                )
                .await;
                go.fetch_add(1, Ordering::SeqCst);
                calls.push((payload, answer));
            }
            calls
        }));
    }
    while go.load(Ordering::SeqCst) < 300 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    {
        let _thaw = Thaw(server.pid());
        unsafe { libc::kill(server.pid() as i32, libc::SIGSTOP) };
        tokio::time::sleep(Duration::from_secs(11)).await;
    }
    // Let the flood run on after the thaw, then stop it.
    let resumed = go.load(Ordering::SeqCst);
    bounded("flood after the thaw", async {
        while go.load(Ordering::SeqCst) < resumed + 300 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let mut calls = Vec::new();
    for p in producers {
        calls.extend(bounded("producer", p).await.unwrap());
    }
    let stored = ids_by_payload(&queue).await;
    let (mut ok, mut failed) = (0, 0);
    for (payload, answer) in &calls {
        let holders = stored.get(payload).map_or(0, Vec::len);
        let name = String::from_utf8_lossy(payload);
        assert!(holders <= 1, "{name} stored {holders} times");
        match answer {
            Ok(id) => {
                ok += 1;
                assert_eq!(holders, 1, "{name} answered Ok but is not stored");
                assert_eq!(&stored[payload][0], id);
            }
            Err(e) => {
                failed += 1;
                assert!(clear(e), "{name}: {e:?}");
            }
        }
    }
    eprintln!(
        "frozen flood: {ok} Ok, {failed} Err of {} calls",
        calls.len()
    );
    let total: usize = stored.values().map(Vec::len).sum();
    assert_eq!(total, queue.len().await.unwrap());
}

/// A loopback TCP proxy that, once a client chunk contains an armed pattern, forwards that
/// chunk and then holds every byte in both directions for a while before relaying them in
/// order: a network partition that begins just after a request got through (TCP keeps the
/// bytes and delivers them when it heals).
struct Stall {
    port: u16,
    gate: Arc<Gate>,
    task: tokio::task::JoinHandle<()>,
}

struct Gate {
    armed: Mutex<Option<(Vec<u8>, Duration)>>,
    open: tokio::sync::watch::Sender<bool>,
    stalled: AtomicUsize,
}

impl Gate {
    async fn wait_open(&self) {
        let mut open = self.open.subscribe();
        let _ = open.wait_for(|open| *open).await;
    }
}

impl Stall {
    async fn start(upstream: std::net::SocketAddr) -> Stall {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let gate = Arc::new(Gate {
            armed: Mutex::new(None),
            open: tokio::sync::watch::channel(true).0,
            stalled: AtomicUsize::new(0),
        });
        let task = tokio::spawn({
            let gate = gate.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                        continue;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::spawn(pump(client_read, server_write, gate.clone(), true));
                    tokio::spawn(pump(server_read, client_write, gate.clone(), false));
                }
            }
        });
        Stall { port, gate, task }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The next client chunk containing `pattern` goes through, then everything waits `hold`.
    fn arm(&self, pattern: &str, hold: Duration) {
        *self.gate.armed.lock().unwrap() = Some((pattern.as_bytes().to_vec(), hold));
    }

    fn stalled(&self) -> usize {
        self.gate.stalled.load(Ordering::SeqCst)
    }
}

impl Drop for Stall {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    gate: Arc<Gate>,
    upstream: bool,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let chunk = &buffer[..n];
        gate.wait_open().await;
        let hold = upstream
            .then(|| {
                let mut armed = gate.armed.lock().unwrap();
                let hit = armed
                    .as_ref()
                    .is_some_and(|(p, _)| chunk.windows(p.len()).any(|w| w == p.as_slice()));
                hit.then(|| armed.take().unwrap().1)
            })
            .flatten();
        if let Some(hold) = hold {
            // Closed before the chunk goes, so its reply is held too.
            gate.open.send_replace(false);
            gate.stalled.fetch_add(1, Ordering::SeqCst);
            let gate = gate.clone();
            tokio::spawn(async move {
                tokio::time::sleep(hold).await;
                gate.open.send_replace(true);
            });
        }
        if to.write_all(chunk).await.is_err() {
            return;
        }
    }
}

/// A schedule invocation that ran, whose connection then stalls (a partition) for longer
/// than its kept reply lives (15 s with a short lease): the callers' retries, sent within
/// their 10 s retry span, reach the server only once the partition heals. Meanwhile a
/// worker on another connection was handed the due-now tasks and acked them, and another
/// handle replaced the far-off ones once their calls had returned. A retry must be
/// recognised, so a call that answered Err leaves at most one task: each due-now task is
/// delivered exactly once, and each far-off id keeps the replacement (the last completed
/// call), not the stale retry's payload.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retries_delivered_after_a_stall_act_only_once() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let stall = Stall::start(server.addr()).await;
    let wheel = Wheel::new();
    let producer = DurableQueue::builder()
        .lease(Duration::from_secs(1))
        .redis(&stall.url(), "stall", &wheel)
        .await
        .unwrap();
    let direct = open(&server.url(), "stall", &wheel).await;
    let worker = open(&server.url(), "stall", &wheel).await;
    let seen: Arc<Mutex<Log>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let consumer = {
        let (seen, stop) = (seen.clone(), stop.clone());
        tokio::spawn(async move {
            let mut stream = worker.deliveries();
            while !stop.load(Ordering::SeqCst) {
                let Ok(Some(d)) =
                    tokio::time::timeout(Duration::from_millis(200), stream.next()).await
                else {
                    continue;
                };
                seen.lock()
                    .unwrap()
                    .push((d.id().to_string(), d.payload().to_vec()));
                d.ack().await.unwrap();
            }
        })
    };
    // Warm-up: the script loaded, the connection up.
    producer
        .schedule(Task::new(b"warm".to_vec()).id("warm"))
        .await
        .unwrap();
    let hold = Duration::from_secs(16);
    let healed = tokio::time::Instant::now() + hold;
    stall.arm("tw-schedule", hold);
    let far = SystemTime::now() + Duration::from_secs(86_400);
    // Sixteen producers at once (one or more invocations, the first of which runs): even
    // ones a due-now task, odd ones a far-off task "A" that another handle replaces with "B"
    // as soon as the call has returned — noting first whether "A" was already stored (its
    // invocation ran before the stall).
    let calls: Vec<_> = (0..16)
        .map(|p| {
            let (producer, direct) = (producer.clone(), direct.clone());
            tokio::spawn(async move {
                if p % 2 == 0 {
                    let id = format!("s-{p}");
                    let task = Task::new(id.clone().into_bytes()).id(id.as_str());
                    return (
                        id,
                        bounded("schedule", producer.schedule(task)).await,
                        false,
                    );
                }
                let id = format!("r-{p}");
                let task = Task::new(b"A".to_vec()).id(id.as_str()).at(far);
                let answer = bounded("schedule", producer.schedule(task)).await;
                let ran = direct.payload(&id.as_str().into()).await.unwrap();
                bounded(
                    "replace",
                    direct.schedule(Task::new(b"B".to_vec()).id(id.as_str()).at(far)),
                )
                .await
                .unwrap();
                (id, answer, ran.as_deref() == Some(b"A".as_slice()))
            })
        })
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    assert_eq!(stall.stalled(), 1, "the stall met a schedule");
    // Let whatever was held run, and be delivered.
    tokio::time::sleep_until(healed + Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    consumer.await.unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let mut count: HashMap<&str, usize> = HashMap::new();
    for (id, payload) in seen.iter() {
        assert_eq!(payload, id.as_bytes());
        *count.entry(id.as_str()).or_default() += 1;
    }
    assert_eq!(count.get("warm"), Some(&1));
    let mut twice = Vec::new();
    let mut late = Vec::new();
    for (id, answer, ran) in &answers {
        if let Err(e) = answer {
            assert!(clear(e), "{id}: {e:?}");
        }
        if id.starts_with("s-") {
            let n = count.get(id.as_str()).copied().unwrap_or(0);
            let fine = if answer.is_ok() { n == 1 } else { n <= 1 };
            if !fine {
                twice.push(format!(
                    "{id}: answered {answer:?}, delivered and acked {n} times"
                ));
            }
            continue;
        }
        let payload = direct.payload(&id.as_str().into()).await.unwrap();
        if payload.as_deref() != Some(b"B".as_slice()) {
            let text = format!(
                "{id}: answered {answer:?}, \"A\" stored before: {ran}; replaced with \"B\" \
                 (Ok) after that answer; now holds {:?}",
                payload.map(|p| String::from_utf8_lossy(&p).into_owned())
            );
            // Stored before the replacement and again after it: its invocation ran twice.
            if *ran {
                twice.push(text)
            } else {
                late.push(text)
            }
        }
    }
    // Not asserted (an Err promises nothing about when a call that was sent takes effect),
    // only shown: calls whose first and only run came after they answered Err.
    for text in &late {
        eprintln!("took effect after answering Err: {text}");
    }
    assert!(
        twice.is_empty(),
        "{} calls acted twice:\n{}",
        twice.len(),
        twice.join("\n")
    );
    assert_eq!(
        direct.len().await.unwrap(),
        8,
        "the eight far-off tasks, once each"
    );
}
