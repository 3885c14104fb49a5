//! Attacks on `schedule_many` and coalesced `schedule` racing the rest of the queue, from the
//! outside (written against API.md §4/4a), on both backends: batches racing workers (each task
//! once, never early), cancels and reschedules, `close()`, wheel shutdown, overlapping batches
//! and many concurrent `schedule` calls.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use support::backend::{Backend, Fixture, all_pending, fixture, next_delivery, stats_add_up};
use tokio_wheel_durable::{DurableQueue, Error, Task, TaskId};

fn full() -> bool {
    std::env::var_os("TOKIO_WHEEL_FULL").is_some()
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Reopens the same queue on a fresh handle (the embedded store after the old handle closed).
async fn reopen(fx: &Fixture, old: DurableQueue) -> DurableQueue {
    old.close().await;
    drop(old);
    fx.open().await
}

on_every_backend!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_batch_racing_workers_delivers_each_once_never_early,
    a_batch_racing_cancel_and_reschedule_stays_consistent,
    a_batch_racing_close_keeps_every_ok_answer,
    concurrent_schedules_keep_their_own_errors_and_order,
    overlapping_batches_leave_one_task_per_id,
    a_batch_replacing_ids_workers_hold_never_doubles_a_lease,
    a_batch_racing_wheel_shutdown_keeps_every_ok_answer,
);

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
                if d.attempt() == 1 && (i + w).is_multiple_of(5) {
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
