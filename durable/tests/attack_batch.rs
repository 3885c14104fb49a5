//! Attacks on `schedule_many` and on coalesced plain `schedule`, from the outside (written
//! against API.md §4/4a and the rustdoc, not the implementation), on both backends: per-task
//! answers in order, `InFlight` for one task alone, duplicates (the later replaces), ties in
//! batch order, batches over a chunk (500 tasks / 1 MiB), batches racing workers, cancels,
//! `close()` and wheel shutdown, and many concurrent `schedule` calls.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use support::backend::{Backend, Fixture, fixture};
use tokio_wheel_durable::{DurableQueue, Error, Page, Task, TaskFilter, TaskId, TaskState};

fn full() -> bool {
    std::env::var_os("TOKIO_WHEEL_FULL").is_some()
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Every pending task, through `list_page` from the start.
async fn all_pending(queue: &DurableQueue) -> Vec<TaskId> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page: Page = queue
            .list_page(TaskFilter::Pending, cursor.as_ref(), 1000)
            .await
            .unwrap();
        out.extend(page.items.into_iter().map(|t| t.id));
        match page.next {
            Some(next) => cursor = Some(next),
            None => return out,
        }
    }
}

/// `delivered == acked + retried + dead_lettered + expired + returned + in_flight` and the
/// levels agree with `len()`.
async fn stats_add_up(queue: &DurableQueue) {
    let s = queue.stats().await.unwrap();
    assert_eq!(
        s.delivered,
        s.acked + s.retried + s.dead_lettered + s.expired + s.returned + s.in_flight,
        "{s:?}"
    );
    assert_eq!(
        s.pending + s.in_flight,
        queue.len().await.unwrap() as u64,
        "{s:?}"
    );
}

/// The stream's next delivery, waiting at most 20 s. (These tests once nudged the store after
/// 500 ms of quiet to get around the stall that
/// `a_stream_holding_deliveries_keeps_yielding_due_tasks` checks is fixed.)
async fn next_delivery(
    stream: &mut tokio_wheel_durable::Deliveries,
) -> tokio_wheel_durable::Delivery {
    tokio::time::timeout(Duration::from_secs(20), stream.next())
        .await
        .expect("no delivery in 20 s")
        .expect("stream ended")
}

/// Reopens the same queue on a fresh handle (the embedded store after the old handle closed).
async fn reopen(fx: &Fixture, old: DurableQueue) -> DurableQueue {
    old.close().await;
    drop(old);
    fx.open().await
}

on_every_backend!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    answers_in_order_and_in_flight_fails_alone,
    duplicate_ids_in_one_batch_the_later_replaces,
    ties_in_due_time_go_in_batch_order,
    a_reserved_id_refuses_the_whole_batch_and_stores_nothing,
    empty_batch_and_closed_queue,
    batches_over_a_chunk_keep_every_payload_exactly,
    a_batch_racing_workers_delivers_each_once_never_early,
    a_batch_racing_cancel_and_reschedule_stays_consistent,
    a_batch_racing_close_keeps_every_ok_answer,
    concurrent_schedules_keep_their_own_errors_and_order,
    overlapping_batches_leave_one_task_per_id,
    a_batch_replacing_ids_workers_hold_never_doubles_a_lease,
    a_batch_racing_wheel_shutdown_keeps_every_ok_answer,
    duplicates_and_in_flight_across_chunks,
);

async fn answers_in_order_and_in_flight_fails_alone(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx.open().await;
    queue
        .schedule(Task::new(b"held".to_vec()).id("b"))
        .await
        .unwrap();
    let mut stream = queue.deliveries();
    let held = stream.next().await.unwrap();
    assert_eq!(held.id().as_str(), "b");
    let later = SystemTime::now() + Duration::from_secs(3600);
    let answers = queue
        .schedule_many(vec![
            Task::new(b"a".to_vec()).id("a").at(later),
            Task::new(b"b2".to_vec()).id("b").at(later),
            Task::new(b"c".to_vec()).id("c").at(later),
            Task::new(b"anon".to_vec()).at(later),
        ])
        .await
        .unwrap();
    assert_eq!(answers.len(), 4);
    assert_eq!(answers[0].as_ref().unwrap().as_str(), "a");
    assert!(matches!(answers[1], Err(Error::InFlight)), "{answers:?}");
    assert_eq!(answers[2].as_ref().unwrap().as_str(), "c");
    let anon = answers[3].as_ref().unwrap().clone();
    assert!(!["a", "b", "c"].contains(&anon.as_str()));
    // The in-flight task is untouched: its payload, its state, its lease.
    assert_eq!(queue.payload(&"b".into()).await.unwrap().unwrap(), b"held");
    assert!(matches!(
        queue.get(&"b".into()).await.unwrap().unwrap().state,
        TaskState::InFlight { .. }
    ));
    assert_eq!(queue.payload(&anon).await.unwrap().unwrap(), b"anon");
    assert_eq!(queue.len().await.unwrap(), 4);
    held.ack().await.unwrap();
    assert_eq!(queue.get(&"b".into()).await.unwrap(), None);
    assert_eq!(queue.len().await.unwrap(), 3);
    drop(stream);
    stats_add_up(&queue).await;
}

async fn duplicate_ids_in_one_batch_the_later_replaces(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx.open().await;
    let now = SystemTime::now();
    let t1 = now + Duration::from_secs(3600);
    let t2 = now + Duration::from_secs(7200);
    let past = now - Duration::from_secs(5);
    let answers = queue
        .schedule_many(vec![
            Task::new(b"first".to_vec()).id("x").at(t1),
            Task::new(b"y".to_vec()).id("y").at(t1),
            Task::new(b"second".to_vec()).id("x").at(t2),
            // The same id three times, the last due at once: delivered once, as the last.
            Task::new(b"z1".to_vec()).id("z").at(t2),
            Task::new(b"z2".to_vec()).id("z").at(t1),
            Task::new(b"z3".to_vec()).id("z").at(past),
        ])
        .await
        .unwrap();
    let ids: Vec<_> = answers.into_iter().map(|a| a.unwrap()).collect();
    assert_eq!(
        ids.iter().map(|i| i.as_str()).collect::<Vec<_>>(),
        ["x", "y", "x", "z", "z", "z"]
    );
    assert_eq!(queue.len().await.unwrap(), 3);
    let x = queue.get(&"x".into()).await.unwrap().unwrap();
    assert_eq!(ms(x.due), ms(t2));
    assert_eq!(
        queue.payload(&"x".into()).await.unwrap().unwrap(),
        b"second"
    );
    assert_eq!(all_pending(&queue).await.len(), 3);
    let mut stream = queue.deliveries();
    let d = stream.next().await.unwrap();
    assert_eq!((d.id().as_str(), d.payload()), ("z", &b"z3"[..]));
    assert_eq!(ms(d.due()), ms(past));
    d.ack().await.unwrap();
    // Nothing else is due: the replaced z1/z2 must not come back.
    let more = tokio::time::timeout(Duration::from_millis(300), stream.next()).await;
    assert!(more.is_err(), "a replaced copy was delivered: {more:?}");
    assert_eq!(queue.len().await.unwrap(), 2);
    drop(stream);
    stats_add_up(&queue).await;
}

async fn ties_in_due_time_go_in_batch_order(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx.open().await;
    let due = SystemTime::now() - Duration::from_secs(1);
    // Ids in an order that is neither sorted nor reverse sorted, across two chunks (> 500).
    let n = 700;
    let ids: Vec<String> = (0..n).map(|i| format!("t{:04}", (i * 37) % n)).collect();
    let answers = queue
        .schedule_many(
            ids.iter()
                .map(|id| Task::new(id.clone().into_bytes()).id(id.as_str()).at(due)),
        )
        .await
        .unwrap();
    assert!(answers.iter().all(|a| a.is_ok()));
    let listed: Vec<String> = all_pending(&queue)
        .await
        .into_iter()
        .map(|i| i.to_string())
        .collect();
    assert_eq!(listed, ids, "list order is not batch order");
    let mut stream = queue.deliveries();
    let mut delivered = Vec::new();
    while delivered.len() < n {
        let d = stream.next().await.unwrap();
        assert_eq!(d.payload(), d.id().as_str().as_bytes());
        delivered.push(d.id().to_string());
        d.ack().await.unwrap();
    }
    assert_eq!(delivered, ids, "delivery order is not batch order");
}

async fn a_reserved_id_refuses_the_whole_batch_and_stores_nothing(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx.open().await;
    let err = queue
        .schedule_many(vec![
            Task::new(b"ok".to_vec()).id("fine"),
            Task::new(b"bad".to_vec()).id("report@1767225600000"),
        ])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "{err:?}");
    assert_eq!(queue.len().await.unwrap(), 0);
    assert_eq!(queue.get(&"fine".into()).await.unwrap(), None);
    // A look-alike that is not the reserved form is fine.
    let answers = queue
        .schedule_many(vec![
            Task::new(b"".to_vec()).id("mail@example.com"),
            Task::new(b"".to_vec()).id("x@"),
            Task::new(b"".to_vec()).id("@12a"),
        ])
        .await
        .unwrap();
    assert!(answers.iter().all(|a| a.is_ok()), "{answers:?}");
    assert_eq!(queue.len().await.unwrap(), 3);
}

async fn empty_batch_and_closed_queue(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx.open().await;
    assert!(queue.schedule_many(Vec::new()).await.unwrap().is_empty());
    queue.close().await;
    let err = queue
        .schedule_many(vec![Task::new(b"late".to_vec()).id("late")])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Closed), "{err:?}");
    drop(queue);
    let queue = fx.open().await;
    assert_eq!(queue.len().await.unwrap(), 0);
}

async fn batches_over_a_chunk_keep_every_payload_exactly(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx.open().await;
    let later = SystemTime::now() + Duration::from_secs(3600);
    // 501 tasks: one over the 500-task chunk, payloads empty, small, and one of 2 MiB in the
    // middle (over the 1 MiB chunk budget on its own), then 5 KiB ones (3 MiB together).
    let mut rng = support::Rng(0x9e37_79b9_7f4a_7c15);
    let mut expect: Vec<(String, Vec<u8>)> = Vec::new();
    for i in 0..501usize {
        let payload: Vec<u8> = match i {
            0 | 1 | 499 | 500 => Vec::new(),
            250 => (0..2 * 1024 * 1024).map(|_| rng.below(256) as u8).collect(),
            i if i % 3 == 0 => (0..5 * 1024).map(|_| rng.below(256) as u8).collect(),
            i => format!("small {i}").into_bytes(),
        };
        expect.push((format!("big-{i}"), payload));
    }
    let answers = queue
        .schedule_many(
            expect
                .iter()
                .map(|(id, p)| Task::new(p.clone()).id(id.as_str()).at(later)),
        )
        .await
        .unwrap();
    assert_eq!(answers.len(), 501);
    for (a, (id, _)) in answers.iter().zip(&expect) {
        assert_eq!(a.as_ref().unwrap().as_str(), id);
    }
    assert_eq!(queue.len().await.unwrap(), 501);
    for (id, p) in &expect {
        let got = queue.payload(&id.as_str().into()).await.unwrap();
        assert_eq!(got.as_deref(), Some(&p[..]), "payload of {id}");
        let info = queue.get(&id.as_str().into()).await.unwrap().unwrap();
        assert_eq!(info.payload_len, p.len(), "{id}");
    }
    // The big ones again, due at once, and delivered with exactly their bytes.
    let now = SystemTime::now() - Duration::from_millis(1);
    let n = if full() { 10_000 } else { 2_000 };
    let answers = queue
        .schedule_many((0..n).map(|i| {
            let p = if i % 2 == 0 {
                Vec::new()
            } else {
                format!("n{i}").into_bytes()
            };
            Task::new(p).id(format!("n{i}")).at(now)
        }))
        .await
        .unwrap();
    assert_eq!(answers.len(), n);
    assert!(answers.iter().all(|a| a.is_ok()));
    assert_eq!(queue.len().await.unwrap(), 501 + n);
    let mut stream = queue.deliveries();
    let mut seen = HashSet::new();
    while seen.len() < n {
        let d = stream.next().await.unwrap();
        let i: usize = d.id().as_str()[1..].parse().unwrap();
        let want = if i % 2 == 0 {
            Vec::new()
        } else {
            format!("n{i}").into_bytes()
        };
        assert_eq!(d.payload(), &want[..], "{}", d.id());
        assert!(seen.insert(i), "{} twice", d.id());
        d.ack().await.unwrap();
    }
    drop(stream);
    assert_eq!(queue.len().await.unwrap(), 501);
    stats_add_up(&queue).await;
}

async fn a_batch_racing_workers_delivers_each_once_never_early(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx
        .open_named(
            DurableQueue::builder()
                .lease(Duration::from_secs(30))
                .prefetch(8),
            "queue",
        )
        .await;
    let n_batches = if full() { 40 } else { 8 };
    let per = 150;
    let total = n_batches * per;
    // (id, attempt) -> times seen; id -> scheduled due ms.
    let seen: Arc<Mutex<HashMap<(String, u32), u32>>> = Arc::default();
    let acked: Arc<Mutex<HashSet<String>>> = Arc::default();
    let early: Arc<Mutex<Vec<String>>> = Arc::default();
    let first_dues: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let mut workers = Vec::new();
    for w in 0..3 {
        let mut stream = queue.deliveries();
        let (seen, acked, early) = (seen.clone(), acked.clone(), early.clone());
        let first_dues = first_dues.clone();
        workers.push(tokio::spawn(async move {
            while let Some(d) = stream.next().await {
                // The store's clock is this machine's (a local server): hand-out never precedes due.
                if SystemTime::now() < d.due() {
                    early
                        .lock()
                        .unwrap()
                        .push(format!("{} {:?}", d.id(), d.due()));
                }
                if d.attempt() == 1 {
                    first_dues
                        .lock()
                        .unwrap()
                        .insert(d.id().to_string(), ms(d.due()));
                }
                let key = (d.id().to_string(), d.attempt());
                *seen.lock().unwrap().entry(key).or_default() += 1;
                let i: usize = d.id().as_str()[2..].parse().unwrap();
                if d.attempt() == 1 && (i + w) % 5 == 0 {
                    d.retry_after(Duration::from_millis(20)).await.unwrap();
                } else {
                    d.ack().await.unwrap();
                    acked.lock().unwrap().insert(d.id().to_string());
                }
            }
        }));
    }
    let mut dues = HashMap::new();
    for b in 0..n_batches {
        let base = SystemTime::now();
        let tasks: Vec<Task> = (0..per)
            .map(|k| {
                let i = b * per + k;
                let due = base + Duration::from_millis((k as u64 * 7) % 200);
                dues.insert(format!("w-{i}"), ms(due));
                Task::new(format!("{i}").into_bytes())
                    .id(format!("w-{i}"))
                    .at(due)
            })
            .collect();
        for a in queue.schedule_many(tasks).await.unwrap() {
            a.unwrap();
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while acked.lock().unwrap().len() < total {
        assert!(tokio::time::Instant::now() < deadline, "not all acked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    queue.close().await;
    for w in workers {
        w.await.unwrap();
    }
    assert!(
        early.lock().unwrap().is_empty(),
        "{:?}",
        early.lock().unwrap()
    );
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    for (id, due) in first_dues.lock().unwrap().iter() {
        assert_eq!(
            Some(due),
            dues.get(id),
            "{id}: a first delivery's due() is not its scheduled time"
        );
    }
    for ((id, attempt), count) in seen.iter() {
        assert_eq!(*count, 1, "{id} attempt {attempt} delivered {count} times");
    }
    let firsts = seen.keys().filter(|(_, a)| *a == 1).count();
    assert_eq!(firsts, total);
    assert!(seen.keys().all(|(_, a)| *a <= 2));
    let queue = fx.open().await;
    assert_eq!(queue.len().await.unwrap(), 0);
    stats_add_up(&queue).await;
}

async fn a_batch_racing_cancel_and_reschedule_stays_consistent(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx.open().await;
    let far = SystemTime::now() + Duration::from_secs(86_400);
    let n = 600;
    let ids: Vec<TaskId> = (0..n).map(|i| TaskId::from(format!("r{i}"))).collect();
    for a in queue
        .schedule_many(
            ids.iter()
                .map(|id| Task::new(b"v1".to_vec()).id(id.as_str()).at(far)),
        )
        .await
        .unwrap()
    {
        a.unwrap();
    }
    let batch = {
        let queue = queue.clone();
        let ids = ids.clone();
        tokio::spawn(async move {
            queue
                .schedule_many(ids.iter().map(|id| {
                    Task::new(b"v2".to_vec())
                        .id(id.as_str())
                        .at(far + Duration::from_secs(60))
                }))
                .await
                .unwrap()
        })
    };
    let racer = {
        let queue = queue.clone();
        let ids = ids.clone();
        tokio::spawn(async move {
            let mut cancelled = Vec::new();
            for (i, id) in ids.iter().enumerate().rev() {
                if i % 2 == 0 {
                    cancelled.push((id.clone(), queue.cancel(id).await.unwrap()));
                } else {
                    queue
                        .reschedule(id, far + Duration::from_secs(120))
                        .await
                        .unwrap();
                }
            }
            cancelled
        })
    };
    let answers = batch.await.unwrap();
    let cancelled = racer.await.unwrap();
    assert!(answers.iter().all(|a| a.is_ok()), "{answers:?}");
    // Whatever the interleaving, each id is either gone (cancelled after the batch) or there
    // with a coherent record: get, payload and the list agree, and len counts them.
    let mut present = 0;
    for id in &ids {
        let info = queue.get(id).await.unwrap();
        let payload = queue.payload(id).await.unwrap();
        assert_eq!(info.is_some(), payload.is_some(), "{id}");
        if let (Some(info), Some(p)) = (info, payload) {
            present += 1;
            assert_eq!(info.payload_len, p.len());
            assert!(p == b"v1" || p == b"v2", "{id}: {p:?}");
        }
    }
    // A cancel that said true removed a live task; an id the batch re-made after it is back.
    for (id, said) in &cancelled {
        if !said {
            // Cancel can only fail if the id was missing: never here (always pending).
            panic!("cancel of always-pending {id} said false");
        }
    }
    assert_eq!(queue.len().await.unwrap(), present);
    assert_eq!(all_pending(&queue).await.len(), present);
    let queue = reopen(&fx, queue).await;
    assert_eq!(queue.len().await.unwrap(), present);
}

async fn a_batch_racing_close_keeps_every_ok_answer(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx.open().await;
    let far = SystemTime::now() + Duration::from_secs(86_400);
    let n = if full() { 20_000 } else { 3_000 };
    let batch = {
        let queue = queue.clone();
        tokio::spawn(async move {
            queue
                .schedule_many(
                    (0..n).map(|i| Task::new(vec![b'x'; 100]).id(format!("c{i}")).at(far)),
                )
                .await
        })
    };
    tokio::task::yield_now().await;
    queue.close().await;
    let answers = batch.await.unwrap();
    drop(queue);
    let queue = fx.open().await;
    match answers {
        Err(e) => assert!(matches!(e, Error::Closed), "{e:?}"),
        Ok(answers) => {
            assert_eq!(answers.len(), n);
            let mut ok = 0;
            for (i, a) in answers.iter().enumerate() {
                if a.is_ok() {
                    ok += 1;
                    assert!(
                        queue.get(&format!("c{i}").into()).await.unwrap().is_some(),
                        "c{i} answered Ok but is not in the store"
                    );
                }
            }
            assert!(queue.len().await.unwrap() >= ok);
        }
    }
}

async fn concurrent_schedules_keep_their_own_errors_and_order(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx.open().await;
    // Two tasks in flight: schedules of their ids must fail alone.
    queue
        .schedule(Task::new(b"h1".to_vec()).id("held-1"))
        .await
        .unwrap();
    queue
        .schedule(Task::new(b"h2".to_vec()).id("held-2"))
        .await
        .unwrap();
    let mut stream = queue.deliveries();
    let h1 = next_delivery(&mut stream).await;
    let h2 = next_delivery(&mut stream).await;
    let tie = SystemTime::now() + Duration::from_secs(3600);
    let n = if full() { 2_000 } else { 300 };
    let mut calls = Vec::new();
    for i in 0..n {
        let queue = queue.clone();
        calls.push(tokio::spawn(async move {
            let id = match i % 50 {
                7 => "held-1".to_string(),
                8 => "held-2".to_string(),
                _ => format!("c{i}"),
            };
            let r = queue
                .schedule(Task::new(id.clone().into_bytes()).id(id.as_str()).at(tie))
                .await;
            (id, r)
        }));
    }
    // Meanwhile one caller schedules in sequence at the same due time: its order must hold.
    let ordered: Vec<String> = (0..40)
        .map(|i| format!("seq-{:02}", (i * 13) % 40))
        .collect();
    for id in &ordered {
        queue
            .schedule(Task::new(b"s".to_vec()).id(id.as_str()).at(tie))
            .await
            .unwrap();
    }
    let mut ok = 0;
    for call in calls {
        let (id, r) = call.await.unwrap();
        if id.starts_with("held-") {
            assert!(matches!(r, Err(Error::InFlight)), "{id}: {r:?}");
        } else {
            assert_eq!(r.unwrap().as_str(), id);
            ok += 1;
        }
    }
    assert_eq!(
        queue.payload(&"held-1".into()).await.unwrap().unwrap(),
        b"h1"
    );
    let listed: Vec<String> = all_pending(&queue)
        .await
        .into_iter()
        .map(|i| i.to_string())
        .filter(|i| i.starts_with("seq-"))
        .collect();
    assert_eq!(listed, ordered);
    h1.ack().await.unwrap();
    h2.ack().await.unwrap();
    drop(stream);
    assert_eq!(queue.len().await.unwrap(), ok + ordered.len());
    stats_add_up(&queue).await;
    // Each Ok was durable: a fresh handle sees them all.
    let queue = reopen(&fx, queue).await;
    assert_eq!(queue.len().await.unwrap(), ok + ordered.len());
}

async fn overlapping_batches_leave_one_task_per_id(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx.open().await;
    let far = SystemTime::now() + Duration::from_secs(86_400);
    let mut calls = Vec::new();
    for c in 0..6u64 {
        let q = queue.clone();
        calls.push(tokio::spawn(async move {
            let queue = q;
            let tasks: Vec<Task> = (0..400u64)
                .map(|i| {
                    let p = format!("{c}:{i}");
                    Task::new(p.into_bytes())
                        .id(format!("o{}", (i * (c + 1)) % 300))
                        .at(far + Duration::from_millis(i))
                })
                .collect();
            queue.schedule_many(tasks).await.unwrap()
        }));
        // Plain schedules of the same ids meanwhile, and a reserved id that fails alone.
        let q = queue.clone();
        calls.push(tokio::spawn(async move {
            let queue = q;
            let mut out = Vec::new();
            for i in 0..20u64 {
                out.push(
                    queue
                        .schedule(
                            Task::new(b"plain".to_vec())
                                .id(format!("o{}", i * 7))
                                .at(far),
                        )
                        .await,
                );
            }
            let bad = queue
                .schedule(Task::new(b"bad".to_vec()).id(format!("bad@{c}00")))
                .await;
            assert!(matches!(bad, Err(Error::Invalid(_))), "{bad:?}");
            out
        }));
    }
    for call in calls {
        for a in call.await.unwrap() {
            a.unwrap();
        }
    }
    assert_eq!(queue.len().await.unwrap(), 300);
    let listed = all_pending(&queue).await;
    assert_eq!(listed.len(), 300);
    assert_eq!(
        listed.iter().collect::<HashSet<_>>().len(),
        300,
        "an id listed twice"
    );
    for i in 0..300 {
        let id: TaskId = format!("o{i}").into();
        let info = queue.get(&id).await.unwrap().unwrap();
        let p = queue.payload(&id).await.unwrap().unwrap();
        assert_eq!(info.payload_len, p.len(), "{id}");
    }
    stats_add_up(&queue).await;
    let queue = reopen(&fx, queue).await;
    assert_eq!(queue.len().await.unwrap(), 300);
}

async fn a_batch_replacing_ids_workers_hold_never_doubles_a_lease(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx
        .open_named(
            DurableQueue::builder()
                .lease(Duration::from_secs(30))
                .prefetch(4),
            "queue",
        )
        .await;
    let ids = 200;
    let rounds = if full() { 30 } else { 6 };
    let held: Arc<Mutex<HashSet<String>>> = Arc::default();
    let problems: Arc<Mutex<Vec<String>>> = Arc::default();
    let deliveries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..3 {
        let mut stream = queue.deliveries();
        let (held, problems, deliveries) = (held.clone(), problems.clone(), deliveries.clone());
        workers.push(tokio::spawn(async move {
            while let Some(d) = stream.next().await {
                let id = d.id().to_string();
                if SystemTime::now() < d.due() {
                    problems.lock().unwrap().push(format!("{id} early"));
                }
                if !held.lock().unwrap().insert(id.clone()) {
                    problems
                        .lock()
                        .unwrap()
                        .push(format!("{id} handed out twice at once"));
                }
                tokio::task::yield_now().await;
                held.lock().unwrap().remove(&id);
                deliveries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Err(e) = d.ack().await {
                    problems.lock().unwrap().push(format!("{id} ack: {e:?}"));
                }
            }
        }));
    }
    let mut ok = 0;
    let mut in_flight = 0;
    for r in 0..rounds {
        let base = SystemTime::now();
        let tasks: Vec<Task> = (0..ids)
            .map(|i| {
                Task::new(format!("{r}").into_bytes())
                    .id(format!("h{i}"))
                    .at(base + Duration::from_millis((i % 10) as u64))
            })
            .collect();
        for a in queue.schedule_many(tasks).await.unwrap() {
            match a {
                Ok(_) => ok += 1,
                Err(Error::InFlight) => in_flight += 1,
                Err(e) => panic!("{e:?}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while queue.len().await.unwrap() > 0 {
        assert!(tokio::time::Instant::now() < deadline, "never drained");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    queue.close().await;
    for w in workers {
        w.await.unwrap();
    }
    assert!(
        problems.lock().unwrap().is_empty(),
        "{:?}",
        problems.lock().unwrap()
    );
    let delivered = deliveries.load(std::sync::atomic::Ordering::Relaxed);
    // Each accepted schedule is delivered at most once (a replaced pending one not at all).
    assert!(
        delivered <= ok,
        "{delivered} deliveries for {ok} accepted ({in_flight} in flight)"
    );
    assert!(delivered >= ids, "{delivered}");
    let queue = fx.open().await;
    stats_add_up(&queue).await;
}

async fn a_batch_racing_wheel_shutdown_keeps_every_ok_answer(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx.open().await;
    let far = SystemTime::now() + Duration::from_secs(86_400);
    let n = if full() { 20_000 } else { 3_000 };
    let batch = {
        let queue = queue.clone();
        tokio::spawn(async move {
            queue
                .schedule_many(
                    (0..n).map(|i| Task::new(vec![b'y'; 64]).id(format!("s{i}")).at(far)),
                )
                .await
        })
    };
    tokio::task::yield_now().await;
    fx.wheel.shutdown().await;
    let answers = tokio::time::timeout(Duration::from_secs(30), batch)
        .await
        .expect("a batch hung on a shut-down wheel")
        .unwrap();
    queue.close().await;
    drop(queue);
    let fresh = support::backend::Fixture {
        dir: tempfile::tempdir().unwrap(),
        wheel: tokio_wheel::Wheel::new(),
        backend,
        redis: None,
    };
    // Reopen the same store on a new wheel.
    let queue = match backend {
        // At once: `close()` returned only once the store was released (see
        // `close_after_wheel_shutdown_releases_the_lock_at_once`).
        Backend::Embedded => DurableQueue::open(fx.dir.path().join("queue.redb"), &fresh.wheel)
            .await
            .unwrap(),
        #[cfg(feature = "redis")]
        Backend::Redis => DurableQueue::builder()
            .redis(&fx.redis.as_ref().unwrap().url(), "queue", &fresh.wheel)
            .await
            .unwrap(),
        #[cfg(not(feature = "redis"))]
        Backend::Redis => unreachable!(),
    };
    if let Ok(answers) = answers {
        assert_eq!(answers.len(), n);
        for (i, a) in answers.iter().enumerate() {
            if a.is_ok() {
                assert!(
                    queue.get(&format!("s{i}").into()).await.unwrap().is_some(),
                    "s{i} Ok but lost"
                );
            }
        }
    }
}

async fn duplicates_and_in_flight_across_chunks(backend: Backend) {
    let Some(fx) = fixture(backend) else { return };
    let queue = fx.open().await;
    queue
        .schedule(Task::new(b"held".to_vec()).id("d-777"))
        .await
        .unwrap();
    let mut stream = queue.deliveries();
    let held = stream.next().await.unwrap();
    let far = SystemTime::now() + Duration::from_secs(86_400);
    // 1 200 tasks: "d-5" at 0, 499, 500 and 1 100 (every chunk), "d-777" in flight at 777.
    let names: Vec<String> = (0..1200)
        .map(|i| match i {
            0 | 499 | 500 | 1100 => "d-5".to_string(),
            777 => "d-777".to_string(),
            i => format!("e{i}"),
        })
        .collect();
    let answers = queue
        .schedule_many(names.iter().enumerate().map(|(i, id)| {
            Task::new(format!("{i}").into_bytes())
                .id(id.as_str())
                .at(far + Duration::from_millis(i as u64))
        }))
        .await
        .unwrap();
    for (i, a) in answers.iter().enumerate() {
        if i == 777 {
            assert!(matches!(a, Err(Error::InFlight)), "{a:?}");
        } else {
            assert_eq!(a.as_ref().unwrap().as_str(), names[i]);
        }
    }
    assert_eq!(
        queue.payload(&"d-5".into()).await.unwrap().unwrap(),
        b"1100"
    );
    assert_eq!(
        ms(queue.get(&"d-5".into()).await.unwrap().unwrap().due),
        ms(far + Duration::from_millis(1100))
    );
    assert_eq!(
        queue.payload(&"d-777".into()).await.unwrap().unwrap(),
        b"held"
    );
    // 1 200 names, 3 repeats of d-5, d-777 refused and held: 1 196 pending + 1 in flight.
    assert_eq!(queue.len().await.unwrap(), 1197);
    held.ack().await.unwrap();
    drop(stream);
    assert_eq!(all_pending(&queue).await.len(), 1196);
    stats_add_up(&queue).await;
}

/// Opens the embedded store at `path` once, straight after its last handle went away.
async fn reopen_at_once(path: &std::path::Path) -> Result<DurableQueue, Error> {
    DurableQueue::open(path, &tokio_wheel::Wheel::new()).await
}

async fn embedded_with_one_task() -> (tempfile::TempDir, tokio_wheel::Wheel, DurableQueue) {
    let dir = tempfile::tempdir().unwrap();
    let wheel = tokio_wheel::Wheel::new();
    let queue = DurableQueue::open(dir.path().join("q.redb"), &wheel)
        .await
        .unwrap();
    queue
        .schedule(Task::new(b"x".to_vec()).id("a"))
        .await
        .unwrap();
    (dir, wheel, queue)
}

/// API.md §4: "dropping every handle (or `close().await`) releases it".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_releases_the_lock_at_once() {
    let (dir, _wheel, queue) = embedded_with_one_task().await;
    queue.close().await;
    drop(queue);
    let queue = reopen_at_once(&dir.path().join("q.redb")).await.unwrap();
    assert_eq!(queue.len().await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_after_wheel_shutdown_releases_the_lock_at_once() {
    let (dir, wheel, queue) = embedded_with_one_task().await;
    wheel.shutdown().await;
    queue.close().await;
    drop(queue);
    let queue = reopen_at_once(&dir.path().join("q.redb")).await.unwrap();
    assert_eq!(queue.len().await.unwrap(), 1);
}

/// Was a finding: dropping the last handle released the lock only a moment later. That is
/// the documented behaviour now (a drop cannot wait; `close().await` is the call that does):
/// the lock is released without any further call, so a reopen soon succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_every_handle_releases_the_lock_by_itself() {
    let (dir, _wheel, queue) = embedded_with_one_task().await;
    drop(queue);
    let path = dir.path().join("q.redb");
    let mut attempts = 0;
    let queue = loop {
        match reopen_at_once(&path).await {
            Ok(queue) => break queue,
            Err(Error::Locked) if attempts < 1000 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(error) => panic!("still not released after {attempts} tries: {error}"),
        }
    };
    assert_eq!(queue.len().await.unwrap(), 1);
}

/// Holds every delivery of `n` due tasks (scheduled in one batch or one by one) from one
/// stream with prefetch 1 and a long lease: returns how many the stream yielded before it
/// went quiet for 3 s (with due tasks still pending), or `n`.
async fn yielded_before_a_stall(batch: bool, n: usize, prefetch: usize) -> (usize, String) {
    let dir = tempfile::tempdir().unwrap();
    let wheel = tokio_wheel::Wheel::new();
    let queue = DurableQueue::builder()
        .prefetch(prefetch)
        .lease(Duration::from_secs(30))
        .open(dir.path().join("q.redb"), &wheel)
        .await
        .unwrap();
    let due = SystemTime::now() - Duration::from_millis(5);
    let tasks = (0..n).map(|i| Task::new(Vec::new()).id(format!("l{i:02}")).at(due));
    if batch {
        for a in queue.schedule_many(tasks).await.unwrap() {
            a.unwrap();
        }
    } else {
        for t in tasks {
            queue.schedule(t).await.unwrap();
        }
    }
    let mut stream = queue.deliveries();
    let mut held = Vec::new();
    while held.len() < n {
        match tokio::time::timeout(Duration::from_secs(3), stream.next()).await {
            Ok(d) => held.push(d.unwrap()),
            Err(_) => return (held.len(), format!("{:?}", queue.stats().await.unwrap())),
        }
    }
    (n, String::new())
}

/// API.md §4: consumers wake when a task is due, "one tick plus one store round trip late
/// at most"; §4a: a lease starts at hand-out. Holding deliveries (not finished yet, well
/// within their lease) must not stop a polled stream from yielding the due tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_holding_deliveries_keeps_yielding_due_tasks() {
    let rounds = if full() { 20 } else { 3 };
    let mut stalls = Vec::new();
    for round in 0..rounds {
        for (batch, prefetch, n) in [(true, 1, 12), (false, 1, 12), (true, 16, 60)] {
            let (got, stats) = yielded_before_a_stall(batch, n, prefetch).await;
            if got < n {
                stalls.push(format!(
                    "round {round} batch {batch} prefetch {prefetch}: {got} of {n}, {stats}"
                ));
            }
        }
    }
    assert!(stalls.is_empty(), "{stalls:#?}");
}
