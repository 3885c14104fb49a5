//! The Redis-shared durable queue under faults, each injected for real: a loopback proxy that
//! drops connections at chosen scripts (a worker whose clock runs a minute ahead:
//! `redis_clock_skew.rs`), a backlog of expired leases with another client measuring `PING`,
//! idle workers counted in script calls, and store memory after acks.
//!
//! `TOKIO_WHEEL_FULL=1` runs the lease backlog at its full 200 000 (default 20 000).
#![cfg(feature = "redis")]

mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use support::proxy::{Fault, Proxy};
use support::redis_server::RedisServer;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{Builder, Deliveries, Delivery, DurableQueue, Error, Task};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

async fn next(deliveries: &mut Deliveries) -> Delivery {
    tokio::time::timeout(Duration::from_secs(5), deliveries.next())
        .await
        .expect("a delivery within 5 s")
        .expect("the stream is open")
}

async fn nothing_within(deliveries: &mut Deliveries, wait: Duration) {
    if let Ok(Some(d)) = tokio::time::timeout(wait, deliveries.next()).await {
        panic!("unexpected delivery {d:?}");
    }
}

/// A plain connection to the test's server, for looking at it from outside the queue.
fn raw(server: &RedisServer) -> redis::Connection {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

/// A numeric field of `INFO <section>`.
fn info(connection: &mut redis::Connection, section: &str, field: &str) -> u64 {
    let text: String = redis::cmd("INFO").arg(section).query(connection).unwrap();
    let prefix = format!("{field}:");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |value| value.trim().parse().unwrap_or(0))
}

/// Lua script calls the server has run (EVAL and EVALSHA).
fn script_calls(connection: &mut redis::Connection) -> u64 {
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(connection)
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

fn zcard(connection: &mut redis::Connection, key: &str) -> u64 {
    redis::cmd("ZCARD").arg(key).query(connection).unwrap()
}

fn payload_of(id: &str) -> Vec<u8> {
    // Binary, with a zero byte and a size that differs per task.
    let mut bytes = vec![0u8, 0xff];
    bytes.extend(id.as_bytes().iter().cycle().take(100 + id.len() * 7));
    bytes
}

/// Runs every script once, so a fault injected next hits the script itself, not the first
/// `EVALSHA` that finds it not yet loaded.
async fn warm_up(queue: &DurableQueue, deliveries: &mut Deliveries) {
    queue.schedule(Task::new("w").id("warm-up")).await.unwrap();
    let d = next(deliveries).await;
    d.retry_after(Duration::ZERO).await.unwrap();
    let d = next(deliveries).await;
    d.ack().await.unwrap();
}

/// Issue 12 item 1: the reply of the claim that hands a task out is lost with the
/// connection. The task is handed out once, promptly, with exactly its payload — never empty,
/// never after waiting out a lease.
#[tokio::test]
async fn a_claim_whose_reply_is_lost_hands_out_the_exact_payload_once() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let proxy = Proxy::start(server.addr()).await;
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .lease(Duration::from_secs(30))
        .redis(&proxy.url(), "lost-claim", &wheel)
        .await
        .unwrap();
    warm_up(&queue, &mut queue.deliveries()).await;
    for (fault, id) in [
        (Fault::LoseReply, "lost-reply"),
        (Fault::DropRequest, "dropped"),
    ] {
        queue
            .schedule(Task::new(payload_of(id)).id(id))
            .await
            .unwrap();
        tokio::time::sleep(ms(100)).await; // nobody claims: no stream is polled yet
        proxy.inject("tw-claim", fault, 1);
        let mut deliveries = queue.deliveries();
        let start = Instant::now();
        let d = next(&mut deliveries).await;
        // Redelivery after the lost reply would take the whole 30 s lease.
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{fault:?}: waited out the lease"
        );
        assert_eq!(d.id().as_str(), id);
        assert_eq!(
            d.payload(),
            payload_of(id),
            "{fault:?}: the payload is exact"
        );
        assert_eq!(d.attempt(), 1, "{fault:?}: handed out once");
        d.ack().await.unwrap();
        nothing_within(&mut deliveries, ms(200)).await;
    }
    assert_eq!(proxy.injected(), 2, "both faults were injected");
    assert_eq!(queue.len().await.unwrap(), 0);

    // A schedule whose reply is lost is retried and recognised, even once its task is in
    // flight: `Ok`, not `InFlight`, and one task.
    proxy.inject("tw-schedule", Fault::LoseReply, 1);
    queue
        .schedule(Task::new(payload_of("s")).id("s").after(ms(200)))
        .await
        .expect("the retried schedule is recognised");
    assert_eq!(proxy.injected(), 3);
    assert_eq!(queue.len().await.unwrap(), 1);
    let mut deliveries = queue.deliveries();
    let d = next(&mut deliveries).await;
    assert_eq!((d.payload(), d.attempt()), (&payload_of("s")[..], 1));
    d.ack().await.unwrap();
    nothing_within(&mut deliveries, ms(200)).await;
}

/// A schedule whose reply is lost, and whose task is delivered and acked (by a worker on
/// another connection) before the client's retry arrives: the retry is recognised from the
/// ack's mark and does not make the task again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_retried_after_its_task_was_acked_does_not_make_it_again() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let proxy = Proxy::start(server.addr()).await;
    let wheel = Wheel::new();
    let producer = DurableQueue::builder()
        .redis(&proxy.url(), "acked-first", &wheel)
        .await
        .unwrap();
    let worker = DurableQueue::builder()
        .redis(&server.url(), "acked-first", &wheel)
        .await
        .unwrap();
    let mut deliveries = worker.deliveries();
    warm_up(&producer, &mut deliveries).await;
    let waiting = tokio::spawn(async move {
        let d = next(&mut deliveries).await;
        d.ack().await.unwrap();
        (d.id().to_string(), deliveries)
    });
    tokio::time::sleep(ms(200)).await;
    proxy.inject("tw-schedule", Fault::LoseReply, 1);
    producer
        .schedule(Task::new("once").id("once"))
        .await
        .expect("the retried schedule is recognised");
    assert_eq!(proxy.injected(), 1);
    let (id, mut deliveries) = waiting.await.unwrap();
    assert_eq!(id, "once");
    nothing_within(&mut deliveries, ms(300)).await; // not made again by the retry
    assert_eq!(producer.len().await.unwrap(), 0);
}

/// Issue 12 item 2: a finish whose reply is lost is retried by the client and recognised:
/// `Ok`, applied once.
#[tokio::test]
async fn a_finish_whose_reply_is_lost_answers_ok_and_acts_once() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let proxy = Proxy::start(server.addr()).await;
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .redis(&proxy.url(), "lost-finish", &wheel)
        .await
        .unwrap();
    let mut deliveries = queue.deliveries();
    warm_up(&queue, &mut deliveries).await;

    queue.schedule(Task::new("a").id("acked")).await.unwrap();
    let d = next(&mut deliveries).await;
    let acked_before = queue.stats().await.unwrap().acked;
    proxy.inject("tw-finish", Fault::LoseReply, 1);
    d.ack().await.expect("the retried ack is recognised");
    assert_eq!(proxy.injected(), 1);
    assert_eq!(queue.len().await.unwrap(), 0);
    // An ack made again is recognised by its delivery (issue 29): `Ok`, nothing acted twice.
    assert_eq!(d.ack().await, Ok(()), "the same ack again");
    assert_eq!(
        d.retry().await,
        Err(Error::LeaseLost),
        "another finish after it"
    );
    assert_eq!(
        queue.stats().await.unwrap().acked,
        acked_before + 1,
        "acted once"
    );

    queue.schedule(Task::new("r").id("retried")).await.unwrap();
    let d = next(&mut deliveries).await;
    proxy.inject("tw-finish", Fault::LoseReply, 1);
    d.retry_after(Duration::ZERO).await.expect("recognised");
    assert_eq!(proxy.injected(), 2);
    let again = next(&mut deliveries).await;
    assert_eq!(again.attempt(), 2, "retried once, not twice");
    nothing_within(&mut deliveries, ms(300)).await;
    again.ack().await.unwrap();
    assert!(queue.dead_letters().await.unwrap().is_empty());
}

/// Connections dropped at random scripts under a steady load: every payload exact, every
/// task acked, none handed out twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_dropped_connections_never_tear_a_delivery() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let proxy = Arc::new(Proxy::start(server.addr()).await);
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .lease(Duration::from_secs(30))
        .prefetch(8)
        .redis(&proxy.url(), "chaos", &wheel)
        .await
        .unwrap();
    let tasks = 500;
    let chaos = {
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let mut rng = support::Rng(7);
            loop {
                tokio::time::sleep(ms(50 + rng.below(100))).await;
                // One fault at a time, disarmed if nothing meets it soon: armed faults that
                // pile up would fail every retry of the one call that finally meets them.
                if proxy.pending() > 0 {
                    proxy.disarm();
                    continue;
                }
                let script = ["tw-claim", "tw-finish", "tw-schedule"][rng.below(3) as usize];
                let fault = if rng.below(2) == 0 {
                    Fault::LoseReply
                } else {
                    Fault::DropRequest
                };
                proxy.inject(script, fault, 1);
            }
        })
    };
    let producer = {
        let queue = queue.clone();
        tokio::spawn(async move {
            for i in 0..tasks {
                let id = format!("c{i}");
                queue
                    .schedule(Task::new(payload_of(&id)).id(id).after(ms(i % 50)))
                    .await
                    .unwrap();
                tokio::time::sleep(ms(5)).await; // a steady load for a few seconds
            }
        })
    };
    let mut deliveries = queue.deliveries();
    let mut acked = HashSet::new();
    while acked.len() < tasks as usize {
        let d = tokio::time::timeout(Duration::from_secs(20), deliveries.next())
            .await
            .expect("deliveries keep coming")
            .unwrap();
        assert_eq!(d.payload(), payload_of(d.id().as_str()), "torn payload");
        assert_eq!(d.attempt(), 1, "{} handed out twice", d.id());
        d.ack()
            .await
            .expect("acks retry through dropped connections");
        assert!(acked.insert(d.id().to_string()));
    }
    chaos.abort();
    producer.await.unwrap();
    assert!(
        proxy.injected() > 10,
        "only {} faults injected",
        proxy.injected()
    );
    assert_eq!(queue.len().await.unwrap(), 0);
    eprintln!(
        "{tasks} tasks through {} injected faults ({} connections)",
        proxy.injected(),
        proxy.connections()
    );
}

/// Issue 12 item 8: many leases expire at once (their holder is gone). Another worker moves
/// them back in bounded batches — each script call moves at most 500, counted by the server
/// (`INFO commandstats`), so no call blocks other clients for long. The worst `PING` another
/// client saw meanwhile is printed, not asserted: a loaded 2-core machine can deschedule that
/// client for longer than any bound (200 ms was seen in CI-like runs).
#[test]
fn expired_leases_come_back_in_bounded_batches() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let count: usize = if std::env::var_os("TOKIO_WHEEL_FULL").is_some() {
        200_000
    } else {
        20_000
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Long enough that no lease ends while the holder is still claiming (the holder would
    // move it back itself): then they all have ended when the next worker looks.
    let lease = Duration::from_millis(2_000 + count as u64 / 10);
    let url = server.url();
    // The holder: claims everything and is gone (its wheel stops: nothing renews).
    runtime.block_on(async {
        let wheel = Wheel::new();
        let queue = DurableQueue::builder()
            .lease(lease)
            .prefetch(count)
            .redis(&url, "backlog", &wheel)
            .await
            .unwrap();
        let producers: Vec<_> = (0..32)
            .map(|p| {
                let queue = queue.clone();
                tokio::spawn(async move {
                    for i in (p..count).step_by(32) {
                        queue
                            .schedule(Task::new(vec![1u8; 16]).id(format!("b{i}")))
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for producer in producers {
            producer.await.unwrap();
        }
        let mut deliveries = queue.deliveries();
        let mut held = Vec::with_capacity(count);
        while held.len() < count {
            held.push(next(&mut deliveries).await);
        }
        wheel.shutdown().await;
        std::mem::forget(held); // a killed holder finishes nothing
    });
    let mut connection = raw(&server);
    let inflight = "tw:{backlog}:inflight";
    assert_eq!(zcard(&mut connection, inflight), count as u64);
    // Wait until every lease has ended by the server's clock.
    loop {
        let (last, now): (Vec<(String, f64)>, (String, String)) = redis::pipe()
            .cmd("ZRANGE")
            .arg(inflight)
            .arg(-1)
            .arg(-1)
            .arg("WITHSCORES")
            .cmd("TIME")
            .query(&mut connection)
            .unwrap();
        let now_ms = now.0.parse::<u64>().unwrap() * 1000 + now.1.parse::<u64>().unwrap() / 1000;
        if last.first().is_none_or(|(_, end)| (*end as u64) < now_ms) {
            break;
        }
        std::thread::sleep(ms(50));
    }

    // Count the script calls of the takeover from here.
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut connection)
        .unwrap();
    // Another client measures PING while a new worker takes the backlog over.
    let stop = Arc::new(AtomicBool::new(false));
    let worst_us = Arc::new(AtomicU64::new(0));
    let pinger = {
        let (stop, worst_us) = (stop.clone(), worst_us.clone());
        let mut connection = raw(&server);
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let start = Instant::now();
                let _: String = redis::cmd("PING").query(&mut connection).unwrap();
                worst_us.fetch_max(start.elapsed().as_micros() as u64, Ordering::SeqCst);
                std::thread::sleep(ms(2));
            }
        })
    };
    let start = Instant::now();
    let (_wheel, _queue) = runtime.block_on(async {
        let wheel = Wheel::new();
        let queue = DurableQueue::builder()
            .lease(lease)
            .redis(&url, "backlog", &wheel)
            .await
            .unwrap();
        (wheel, queue)
    });
    while zcard(&mut connection, inflight) > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "expired leases still in flight"
        );
        std::thread::sleep(ms(10));
    }
    let took = start.elapsed();
    stop.store(true, Ordering::SeqCst);
    pinger.join().unwrap();
    let worst = Duration::from_micros(worst_us.load(Ordering::SeqCst));
    assert_eq!(zcard(&mut connection, "tw:{backlog}:due"), count as u64);
    let scripts = script_calls(&mut connection);
    eprintln!(
        "{count} expired leases back in {took:?} over {scripts} script calls; worst PING {worst:?}"
    );
    // At most 500 leases per call: at least count / 500 calls.
    assert!(
        scripts as usize >= count / 500,
        "{count} expired leases moved in only {scripts} script calls: batches over 500"
    );
}

/// Issue 12 item 9: eight idle workers, a thousand far-future schedules: one script call per
/// schedule, not one per worker. Idle workers make no call at all (they do not poll), and an
/// earlier task still reaches one: it was woken, not found by a poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_wakes_only_workers_it_is_earlier_for() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let url = server.url();
    let wheel = Wheel::new();
    let (sender, mut received) = tokio::sync::mpsc::unbounded_channel();
    let mut workers = Vec::new();
    for _ in 0..8 {
        let queue = Builder::default()
            .redis(&url, "idle", &wheel)
            .await
            .unwrap();
        let sender = sender.clone();
        workers.push(tokio::spawn(async move {
            let mut deliveries = queue.deliveries();
            while let Some(d) = deliveries.next().await {
                let _ = sender.send((SystemTime::now(), d.id().to_string()));
                d.ack().await.unwrap();
            }
        }));
    }
    let producer = Builder::default()
        .redis(&url, "idle", &wheel)
        .await
        .unwrap();
    tokio::time::sleep(ms(500)).await; // every worker has asked once and is idle
    let mut connection = raw(&server);
    let before = script_calls(&mut connection);
    for i in 0..1_000u64 {
        producer
            .schedule(
                Task::new("x")
                    .id(format!("far-{i}"))
                    .after(Duration::from_secs(3_600 + i)),
            )
            .await
            .unwrap();
    }
    tokio::time::sleep(ms(300)).await;
    let calls = script_calls(&mut connection) - before;
    eprintln!("1000 far-future schedules with 8 idle workers: {calls} script calls");
    assert!(
        calls <= 1_000 + 16,
        "{calls} script calls for 1000 schedules"
    );

    // Idle: a worker that polled (a 1-second poller is a bug) would call the store here.
    let quiet = script_calls(&mut connection);
    tokio::time::sleep(ms(1_200)).await;
    let polled = script_calls(&mut connection) - quiet;
    assert_eq!(
        polled, 0,
        "idle workers made {polled} script calls in 1.2 s"
    );

    let due = SystemTime::now() + ms(300);
    producer
        .schedule(Task::new("x").id("soon").at(due))
        .await
        .unwrap();
    let (arrived, id) = tokio::time::timeout(Duration::from_secs(5), received.recv())
        .await
        .expect("the earlier task woke a worker")
        .unwrap();
    assert_eq!(id, "soon");
    assert!(arrived >= due - ms(2), "early");
    // How late is a benchmark's figure (BENCHMARKS.md), not this test's.
    eprintln!(
        "the earlier task arrived {:?} after its due time",
        arrived.duration_since(due).unwrap_or_default()
    );

    // A task due now wakes one idle worker, not all eight: about three calls per task
    // (schedule, claim, ack) rather than one claim per idle worker.
    tokio::time::sleep(ms(200)).await;
    let before = script_calls(&mut connection);
    for i in 0..100 {
        producer
            .schedule(Task::new("x").id(format!("now-{i}")))
            .await
            .unwrap();
        let (_, id) = tokio::time::timeout(Duration::from_secs(5), received.recv())
            .await
            .expect("a due task wakes a worker at once")
            .unwrap();
        assert_eq!(id, format!("now-{i}"));
    }
    tokio::time::sleep(ms(200)).await;
    let calls = script_calls(&mut connection) - before;
    eprintln!("100 due-now schedules with 8 idle workers: {calls} script calls");
    assert!(
        calls <= 100 * 4,
        "{calls} script calls for 100 due-now tasks"
    );
    for worker in workers {
        worker.abort();
    }
}

/// Issue 12 item 10: what makes a retried ack safe is kept for a bounded window (a lease, at
/// least the client's 15 s retry span), then the store's memory is back to its baseline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_replies_expire_and_memory_returns_to_baseline() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let wheel = Wheel::new();
    // Long enough for the kept replies to outlive the run (which a slow machine stretches).
    let lease = Duration::from_secs(3);
    let queue = DurableQueue::builder()
        .lease(lease)
        .prefetch(256)
        .redis(&server.url(), "replies", &wheel)
        .await
        .unwrap();
    let mut connection = raw(&server);
    let mut deliveries = queue.deliveries();
    // Warm up (counters, scripts), then let every kept reply expire.
    queue.schedule(Task::new("w").id("warm")).await.unwrap();
    next(&mut deliveries).await.ack().await.unwrap();
    let dbsize = |c: &mut redis::Connection| -> u64 { redis::cmd("DBSIZE").query(c).unwrap() };
    let settle = |c: &mut redis::Connection, baseline: u64| {
        let start = Instant::now();
        while dbsize(c) > baseline {
            assert!(
                start.elapsed() < Duration::from_secs(40),
                "{} keys left, baseline {baseline}",
                dbsize(c)
            );
            std::thread::sleep(ms(50));
        }
    };
    tokio::time::sleep(lease * 2).await;
    // The seq and token counters, the idle-worker set, the stats counters, the lateness
    // window (capped at 1000 entries) and the queue's config (its partition count).
    settle(&mut connection, 6);
    let keys = dbsize(&mut connection);
    let memory = info(&mut connection, "memory", "used_memory");

    let tasks = 10_000;
    let producers: Vec<_> = (0..16)
        .map(|p| {
            let queue = queue.clone();
            tokio::spawn(async move {
                for i in (p..tasks).step_by(16) {
                    queue
                        .schedule(Task::new(vec![7u8; 64]).id(format!("m{i}")))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    deliveries
        .by_ref()
        .take(tasks)
        .for_each_concurrent(64, |d| async move { d.ack().await.unwrap() })
        .await;
    for producer in producers {
        producer.await.unwrap();
    }
    // One kept reply per schedule or finish invocation (a batch of calls), not one per task.
    let replies = dbsize(&mut connection) - keys;
    assert!(
        replies > 0,
        "no kept replies: are retried calls recognised?"
    );
    settle(&mut connection, keys);
    let after = info(&mut connection, "memory", "used_memory");
    eprintln!(
        "{tasks} acks: {replies} kept replies at the peak, gone after the lease; used_memory {memory} → {after}"
    );
    assert!(
        after < memory + 256 * 1024,
        "memory {memory} → {after} after {tasks} acks"
    );
}
