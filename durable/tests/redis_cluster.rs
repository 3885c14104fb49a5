//! Issue 13: the queue on a real Redis Cluster started by the test itself (six nodes on
//! loopback: three masters with a replica each). A queue works through any node; a
//! `CLUSTER FAILOVER` and then a killed master under running workers lose no scheduled or
//! acked task; `partitions(n)` spreads one queue over every master, delivers each task once
//! and drains every partition fairly. Each test starts its own cluster; they run one at a
//! time (a cluster is six servers on a 2-core machine).
#![cfg(feature = "redis")]

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use support::redis_cluster::Cluster;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{Builder, DurableQueue, Error, Task};

/// One cluster at a time (the tests run on runtimes of their own, so an async lock).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn open(cluster: &Cluster, builder: Builder, name: &str, wheel: &Wheel) -> DurableQueue {
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    builder.redis_cluster(&urls, name, wheel).await.unwrap()
}

/// The partition a task id lives in (the queue's FNV-1a, repeated here).
fn partition_of(id: &str, partitions: u64) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in id.as_bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash % partitions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_works_through_any_node() {
    let _serial = SERIAL.lock().await;
    let Some(cluster) = support::redis_cluster::start() else {
        return;
    };
    let wheel = Wheel::new();
    // Each node alone as the seed, masters and replicas alike: the client finds the masters.
    for node in &cluster.nodes {
        let queue = DurableQueue::builder()
            .redis_cluster(&[&node.url()], "anynode", &wheel)
            .await
            .unwrap();
        let id = format!("via-{}", node.port);
        queue
            .schedule(Task::new(id.clone()).id(id.clone()))
            .await
            .unwrap();
        let mut deliveries = queue.deliveries();
        let d = tokio::time::timeout(Duration::from_secs(10), deliveries.next())
            .await
            .expect("a delivery through this node")
            .unwrap();
        assert_eq!((d.id().as_str(), d.payload()), (id.as_str(), id.as_bytes()));
        d.ack().await.unwrap();
        assert_eq!(queue.get(&id.as_str().into()).await.unwrap(), None);
        queue.close().await;
    }
    // The queue's keys live on the master that owns its slot.
    let slot = cluster.slot_of("tw:{anynode}:due");
    let master = cluster.master_of(slot);
    let mut connection = cluster.node(master).connection();
    let exists: bool = redis::cmd("EXISTS")
        .arg("tw:{anynode}:config")
        .query(&mut connection)
        .unwrap_or(false);
    let _ = exists; // the config key's slot is the same tag's
    let seq: Option<u64> = redis::cmd("GET")
        .arg("tw:{anynode}:seq")
        .query(&mut connection)
        .unwrap();
    assert_eq!(seq, Some(6), "six schedules on the master of slot {slot}");
}

/// What the workers saw.
#[derive(Default)]
struct Log {
    delivered: Vec<(String, u32)>,
    acked: HashSet<String>,
    /// Acks that answered `Unreachable`: with `replicas(1)` that is a write on the master that
    /// no replica confirmed within 4 s (`Builder::replicas`), so the task may be gone (and
    /// never delivered again) or come back after its lease and be acked then.
    unconfirmed: HashSet<String>,
    came_back_after_ack: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_and_a_killed_master_lose_no_scheduled_or_acked_task() {
    let _serial = SERIAL.lock().await;
    let Some(mut cluster) = support::redis_cluster::start() else {
        return;
    };
    let wheel = Wheel::new();
    let builder = || {
        DurableQueue::builder()
            .lease(Duration::from_secs(3))
            .replicas(1)
            .prefetch(16)
    };
    let producer = open(&cluster, builder(), "failover", &wheel).await;
    let log = Arc::new(Mutex::new(Log::default()));
    let mut workers = Vec::new();
    for _ in 0..3 {
        let queue = open(&cluster, builder(), "failover", &wheel).await;
        let log = log.clone();
        workers.push(tokio::spawn(async move {
            queue
                .deliveries()
                .for_each_concurrent(16, |d| {
                    let log = log.clone();
                    async move {
                        let id = d.id().to_string();
                        {
                            let mut log = log.lock().unwrap();
                            if log.acked.contains(&id) {
                                log.came_back_after_ack.push(id.clone());
                            }
                            log.delivered.push((id.clone(), d.attempt()));
                        }
                        match d.ack().await {
                            Ok(()) => {
                                log.lock().unwrap().acked.insert(id);
                            }
                            Err(Error::Unreachable(_)) => {
                                log.lock().unwrap().unconfirmed.insert(id);
                            }
                            Err(_) => {}
                        }
                    }
                })
                .await;
        }));
    }
    let total = 1_500;
    let scheduled = Arc::new(Mutex::new(HashSet::new()));
    let producing = {
        let (producer, scheduled) = (producer.clone(), scheduled.clone());
        tokio::spawn(async move {
            for i in 0..total {
                let id = format!("t{i:05}");
                // A failed schedule is not durable: try again, as a caller would.
                while producer
                    .schedule(Task::new(id.clone()).id(id.clone()))
                    .await
                    .is_err()
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                scheduled.lock().unwrap().insert(id);
                tokio::time::sleep(Duration::from_millis(4)).await;
            }
        })
    };
    let slot = cluster.slot_of("tw:{failover}:due");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let master = cluster.master_of(slot);
    let promoted = tokio::task::block_in_place(|| cluster.failover(master));
    eprintln!("CLUSTER FAILOVER: {master} → {promoted}");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // Now kill the queue's master outright: its replica (the old master) takes over.
    tokio::task::block_in_place(|| {
        cluster.node_mut(promoted).kill();
        let start = Instant::now();
        while cluster.master_of(slot) == promoted {
            assert!(start.elapsed() < Duration::from_secs(30), "no failover");
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("killed {promoted}; {} took over", cluster.master_of(slot));
        // Back as a replica, so writes waiting for one replica go on.
        cluster.node_mut(promoted).restart();
        cluster.wait_until_healthy(Duration::from_secs(30));
    });
    tokio::time::timeout(Duration::from_secs(120), producing)
        .await
        .expect("the producer finishes")
        .unwrap();
    // Done once every scheduled task was acked (or its ack reached the master unconfirmed)
    // and the queue is empty: an unconfirmed ack that did not take effect comes back.
    let scheduled = scheduled.lock().unwrap().clone();
    assert_eq!(scheduled.len(), total);
    let start = Instant::now();
    loop {
        let missing = {
            let log = log.lock().unwrap();
            scheduled
                .iter()
                .filter(|id| !log.acked.contains(*id) && !log.unconfirmed.contains(*id))
                .count()
        };
        if missing == 0 && producer.len().await.unwrap() == 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{missing} of {total} never acked"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for worker in workers {
        worker.abort();
    }
    let log = log.lock().unwrap();
    let missing: Vec<_> = scheduled
        .iter()
        .filter(|id| !log.acked.contains(*id) && !log.unconfirmed.contains(*id))
        .collect();
    assert!(missing.is_empty(), "scheduled but never acked: {missing:?}");
    assert!(
        log.came_back_after_ack.is_empty(),
        "delivered again after an ack returned: {:?}",
        log.came_back_after_ack
    );
    let redelivered = log.delivered.len() - log.acked.len();
    eprintln!(
        "{total} tasks through a failover and a killed master: {} deliveries ({redelivered} again after a lost claim or ack), {} acks unconfirmed by the replica",
        log.delivered.len(),
        log.unconfirmed.len()
    );
}

/// A handle opened before a `CLUSTER FAILOVER` goes on writing through it without a retry
/// of the caller's: its old master answers `READONLY` now, and the handle reads the slot map
/// afresh (outside attack: every later write failed with `Io("ReadOnly ...")` for good, and
/// a task scheduled before the failover was never delivered by that handle).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_opened_before_a_failover_writes_and_delivers_after_it() {
    let _serial = SERIAL.lock().await;
    let Some(cluster) = support::redis_cluster::start() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = open(&cluster, Builder::default(), "demoted", &wheel).await;
    let soon = Task::new("before")
        .id("before")
        .after(Duration::from_secs(2));
    queue.schedule(soon).await.unwrap();
    let master = cluster.master_of(cluster.slot_of("tw:{demoted}:due"));
    tokio::task::block_in_place(|| cluster.failover(master));
    queue
        .schedule(Task::new("after").id("after"))
        .await
        .expect("a write after the failover, through the same handle");
    let mut deliveries = queue.deliveries();
    let mut acked = HashSet::new();
    while acked.len() < 2 {
        let delivery = tokio::time::timeout(Duration::from_secs(30), deliveries.next())
            .await
            .expect("both tasks are delivered by the handle")
            .unwrap();
        delivery.ack().await.expect("an ack after the failover");
        acked.insert(delivery.id().to_string());
    }
    assert_eq!(acked, HashSet::from(["before".into(), "after".into()]));
    assert_eq!(queue.len().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_spread_over_the_masters_and_deliver_each_task_once_fairly() {
    let _serial = SERIAL.lock().await;
    let Some(cluster) = support::redis_cluster::start() else {
        return;
    };
    let wheel = Wheel::new();
    let partitions = 6;
    let builder = || DurableQueue::builder().partitions(partitions).prefetch(8);
    let queue = open(&cluster, builder(), "spread", &wheel).await;
    let error = open_error(
        &cluster,
        DurableQueue::builder().partitions(3),
        "spread",
        &wheel,
    )
    .await;
    assert!(
        matches!(&error, Error::Invalid(why) if why.contains("6 partitions")),
        "{error:?}"
    );

    // A backlog of 200 tasks per partition, all due.
    let per_partition = 200;
    let mut ids: Vec<Vec<String>> = vec![Vec::new(); partitions];
    let mut i = 0;
    while ids.iter().any(|p| p.len() < per_partition) {
        let id = format!("t{i}");
        let p = partition_of(&id, partitions as u64) as usize;
        if ids[p].len() < per_partition {
            ids[p].push(id);
        }
        i += 1;
    }
    let all: Vec<String> = ids.concat();
    futures::stream::iter(all.iter().cloned())
        .for_each_concurrent(64, |id| {
            let queue = queue.clone();
            async move {
                queue.schedule(Task::new(id.clone()).id(id)).await.unwrap();
            }
        })
        .await;
    assert_eq!(queue.stats().await.unwrap().pending, all.len() as u64);
    // Every master holds part of the queue.
    for master in cluster.masters() {
        let keys: u64 = redis::cmd("DBSIZE")
            .query(&mut cluster.node(master).connection())
            .unwrap();
        assert!(keys > 0, "master {master} holds none of the queue");
    }

    // One consumer: its first sixth of the deliveries come from every partition.
    let mut first = vec![0; partitions];
    let mut deliveries = queue.deliveries();
    for _ in 0..all.len() / 6 {
        let d = tokio::time::timeout(Duration::from_secs(10), deliveries.next())
            .await
            .expect("a delivery")
            .unwrap();
        first[partition_of(d.id().as_str(), partitions as u64) as usize] += 1;
        d.ack().await.unwrap();
    }
    drop(deliveries);
    let fair = all.len() / 6 / partitions;
    eprintln!("first {} deliveries by partition: {first:?}", all.len() / 6);
    assert!(
        first.iter().all(|&n| n >= fair / 2),
        "unfair draining: {first:?}"
    );

    // Three workers drain the rest: each task exactly once.
    let seen = Arc::new(Mutex::new(HashMap::<String, (usize, u32)>::new()));
    let mut workers = Vec::new();
    for w in 0..3 {
        let queue = open(&cluster, builder(), "spread", &wheel).await;
        let seen = seen.clone();
        workers.push(tokio::spawn(async move {
            queue
                .deliveries()
                .for_each_concurrent(16, |d| {
                    let seen = seen.clone();
                    async move {
                        let previous = seen
                            .lock()
                            .unwrap()
                            .insert(d.id().to_string(), (w, d.attempt()));
                        assert!(previous.is_none(), "{} delivered twice", d.id());
                        d.ack().await.unwrap();
                    }
                })
                .await;
        }));
    }
    let start = Instant::now();
    while queue.len().await.unwrap() > 0 {
        assert!(start.elapsed() < Duration::from_secs(60), "not drained");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for worker in workers {
        worker.abort();
    }
    let stats = queue.stats().await.unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), all.len() - all.len() / 6);
    assert!(seen.values().all(|&(_, attempt)| attempt == 1));
    let used: HashSet<usize> = seen.values().map(|&(w, _)| w).collect();
    // Three in-process workers; one may find nothing left on a loaded 2-core machine.
    assert!(used.len() >= 2, "only {used:?} of three workers took part");
    assert_eq!(
        (stats.delivered, stats.acked),
        (all.len() as u64, all.len() as u64)
    );
}

async fn open_error(cluster: &Cluster, builder: Builder, name: &str, wheel: &Wheel) -> Error {
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    builder.redis_cluster(&urls, name, wheel).await.unwrap_err()
}

/// Throughput of one queue on one shard (`partitions(1)`) and over three (`partitions(3)`):
/// 16 producers, then three workers acking. A measurement, not a check:
/// `cargo test --release -p tokio-wheel-durable --features redis --test redis_cluster -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run it with --ignored --nocapture"]
async fn cluster_throughput_one_vs_three_shards() {
    let _serial = SERIAL.lock().await;
    let Some(cluster) = support::redis_cluster::start() else {
        return;
    };
    let wheel = Wheel::new();
    let tasks = 30_000;
    for partitions in [1, 3] {
        let name = format!("bench{partitions}");
        let builder = || DurableQueue::builder().partitions(partitions).prefetch(64);
        let queue = open(&cluster, builder(), &name, &wheel).await;
        let start = Instant::now();
        futures::stream::iter(0..tasks)
            .for_each_concurrent(16, |i| {
                let queue = queue.clone();
                async move {
                    queue
                        .schedule(Task::new(vec![0u8; 64]).id(format!("t{i}")))
                        .await
                        .unwrap();
                }
            })
            .await;
        let scheduled = start.elapsed();
        let start = Instant::now();
        let mut workers = Vec::new();
        for _ in 0..3 {
            let queue = open(&cluster, builder(), &name, &wheel).await;
            workers.push(tokio::spawn(async move {
                queue
                    .deliveries()
                    .for_each_concurrent(64, |d| async move { d.ack().await.unwrap() })
                    .await;
            }));
        }
        while queue.len().await.unwrap() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let drained = start.elapsed();
        for worker in workers {
            worker.abort();
        }
        println!(
            "partitions({partitions}): schedule {:.0} tasks/s, deliver+ack with 3 workers {:.0} tasks/s",
            tasks as f64 / scheduled.as_secs_f64(),
            tasks as f64 / drained.as_secs_f64()
        );
    }
}

/// A cluster master whose `maxmemory-policy` evicts keys is refused at connect, named with
/// its policy — the one that holds the queue, and another (a partition may live there).
/// With every node at `noeviction` again the queue opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_that_evicts_keys_is_refused_at_connect() {
    let _serial = SERIAL.lock().await;
    let Some(cluster) = support::redis_cluster::start() else {
        return;
    };
    let set_policy = |port: u16, policy: &str| {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg(policy)
            .query(&mut cluster.node(port).connection())
            .unwrap();
    };
    let master = cluster.master_of(cluster.slot_of("tw:{evicting}:config"));
    let other = *cluster.masters().iter().find(|&&m| m != master).unwrap();
    let wheel = Wheel::new();
    for (port, policy) in [(master, "allkeys-lru"), (other, "allkeys-lfu")] {
        set_policy(port, policy);
        let error = open_error(&cluster, Builder::default(), "evicting", &wheel).await;
        let Error::Invalid(why) = &error else {
            panic!("refused, but not as Invalid: {error:?}");
        };
        assert!(why.contains(policy), "{why}");
        assert!(
            why.contains(&format!("127.0.0.1:{port}")),
            "names the node: {why}"
        );
        set_policy(port, "noeviction");
    }
    let queue = open(&cluster, Builder::default(), "evicting", &wheel).await;
    queue.schedule(Task::new("x")).await.unwrap();
}
