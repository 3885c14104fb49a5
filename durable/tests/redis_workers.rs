//! Many processes, one Redis queue: four worker processes share 10^4 tasks and each is
//! delivered exactly once while every worker is healthy; then a worker holding deliveries is
//! killed with SIGKILL, and its tasks are delivered again after their lease, none lost. A
//! second test restarts the Redis server under running workers.
#![cfg(feature = "redis")]

mod support;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{DurableQueue, Task};

const WORKER_URL: &str = "TOKIO_WHEEL_WORKER_URL";
const WORKER_LOG: &str = "TOKIO_WHEEL_WORKER_LOG";
const WORKER_INDEX: &str = "TOKIO_WHEEL_WORKER_INDEX";
const QUEUE: &str = "workers";
const LEASE: Duration = Duration::from_secs(2);

/// A worker process: consumes and acks, logging each delivery and each returned ack. Worker 0
/// sits on "slow-" tasks for a while before acking, so it holds leases when it is killed.
#[test]
#[ignore = "run by a_killed_worker_loses_nothing as its child process"]
fn redis_worker() {
    let url = std::env::var(WORKER_URL).expect("started by the workers test");
    let index: usize = std::env::var(WORKER_INDEX).unwrap().parse().unwrap();
    let log = support::LineLog::open(std::env::var(WORKER_LOG).unwrap());
    let line = move |text: String| log.line(text);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let wheel = Wheel::new();
        let queue = DurableQueue::builder()
            .lease(LEASE)
            .redis(&url, QUEUE, &wheel)
            .await
            .unwrap();
        line(format!("R {index}"));
        queue
            .deliveries()
            .for_each_concurrent(64, |delivery| {
                let line = line.clone();
                async move {
                    let id = delivery.id().to_string();
                    line(format!("D {index} {id} {}", delivery.attempt()));
                    if index == 0 && id.starts_with("slow-") {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                    if delivery.ack().await.is_ok() {
                        line(format!("A {index} {id}"));
                    }
                }
            })
            .await;
    });
}

/// Worker processes, killed when the test ends however it ends (a failed assertion must not
/// leave them running).
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for worker in &mut self.0 {
            let _ = worker.kill();
            let _ = worker.wait();
        }
    }
}

fn spawn_worker(url: &str, log: &Path, index: usize) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "redis_worker",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(WORKER_URL, url)
        .env(WORKER_LOG, log)
        .env(WORKER_INDEX, index.to_string())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn a worker")
}

/// A delivery seen by a worker: (worker, id, attempt).
type Seen = (usize, String, u32);

/// Parsed worker log: deliveries and returned acks (worker, id).
fn read_log(log: &Path) -> (Vec<Seen>, Vec<(usize, String)>) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let (mut delivered, mut acked) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.as_slice() {
            ["D", worker, id, attempt] => delivered.push((
                worker.parse().unwrap(),
                id.to_string(),
                attempt.parse().unwrap(),
            )),
            ["A", worker, id] => acked.push((worker.parse().unwrap(), id.to_string())),
            _ => {}
        }
    }
    (delivered, acked)
}

/// The log once `done` says it holds what the test waits for, or after `limit`: a worker
/// process writes its ack line only once its `ack` has returned, a moment after the queue
/// (whose `len` counts it gone as soon as the ack is applied) looks empty.
fn read_log_once(
    log: &Path,
    limit: Duration,
    done: impl Fn(&[(usize, String)]) -> bool,
) -> (Vec<Seen>, Vec<(usize, String)>) {
    let start = Instant::now();
    loop {
        let (delivered, acked) = read_log(log);
        if done(&acked) || start.elapsed() >= limit {
            return (delivered, acked);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

async fn wait_until_empty(queue: &DurableQueue, limit: Duration) {
    let start = Instant::now();
    while queue.len().await.unwrap() > 0 {
        assert!(
            start.elapsed() < limit,
            "tasks left after {limit:?}: {}",
            queue.len().await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `workers` worker processes have written their ready line (`R …`) to `log`.
fn wait_until_ready(log: &Path, workers: usize, limit: Duration) {
    let start = Instant::now();
    while std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("R "))
        .count()
        < workers
    {
        assert!(start.elapsed() < limit, "workers did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_killed_worker_loses_nothing() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let url = server.url();
    let mut workers = Workers((0..4).map(|i| spawn_worker(&url, &log, i)).collect());
    wait_until_ready(&log, 4, Duration::from_secs(20));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let wheel = runtime.block_on(async { Wheel::new() });
    let queue = runtime
        .block_on(
            DurableQueue::builder()
                .lease(LEASE)
                .redis(&url, QUEUE, &wheel),
        )
        .unwrap();

    // Phase 1: all healthy. 10^4 tasks, due over half a second.
    runtime.block_on(async {
        let now = SystemTime::now();
        let producers: Vec<_> = (0..16)
            .map(|p| {
                let queue = queue.clone();
                tokio::spawn(async move {
                    for i in (p..10_000).step_by(16) {
                        let due = now + Duration::from_micros((i as u64 * 50) % 500_000);
                        queue
                            .schedule(Task::new("x").id(format!("t-{i}")).at(due))
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for producer in producers {
            producer.await.unwrap();
        }
        wait_until_empty(&queue, Duration::from_secs(60)).await;
    });
    let (delivered, acked) =
        read_log_once(&log, Duration::from_secs(20), |acked| acked.len() >= 10_000);
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for (_, id, _) in &delivered {
        *counts.entry(id.as_str()).or_default() += 1;
    }
    assert_eq!(counts.len(), 10_000, "every task was delivered");
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "delivered more than once while healthy: {twice:?}"
    );
    assert_eq!(acked.len(), 10_000);
    let per_worker: Vec<usize> = (0..4)
        .map(|w| delivered.iter().filter(|(x, _, _)| *x == w).count())
        .collect();
    // Shared, not all taken by one process. (Not "every worker": on a loaded 2-core machine
    // one of four processes can sit unscheduled for the whole half second.)
    assert!(
        per_worker.iter().filter(|&&n| n > 0).count() >= 2,
        "the work was shared: {per_worker:?}"
    );

    // Phase 2: worker 0 holds "slow-" deliveries; kill it while it holds some.
    runtime.block_on(async {
        for i in 0..400 {
            queue
                .schedule(Task::new("x").id(format!("slow-{i}")))
                .await
                .unwrap();
        }
    });
    let start = Instant::now();
    loop {
        let (delivered, _) = read_log(&log);
        if delivered
            .iter()
            .filter(|(w, id, _)| *w == 0 && id.starts_with("slow-"))
            .count()
            >= 10
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "worker 0 never took a slow task"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    workers.0[0].kill().unwrap(); // SIGKILL, mid-lease
    workers.0[0].wait().unwrap();
    runtime.block_on(wait_until_empty(&queue, Duration::from_secs(60)));
    let (delivered, acked) = read_log_once(&log, Duration::from_secs(20), |acked| {
        let slow: HashSet<&str> = acked
            .iter()
            .map(|(_, id)| id.as_str())
            .filter(|id| id.starts_with("slow-"))
            .collect();
        slow.len() >= 400
    });
    let held_by_killed: Vec<(&str, u32)> = delivered
        .iter()
        .filter(|(w, id, _)| *w == 0 && id.starts_with("slow-"))
        .map(|(_, id, attempt)| (id.as_str(), *attempt))
        .collect();
    let acked_ids: HashSet<&str> = acked.iter().map(|(_, id)| id.as_str()).collect();
    for i in 0..400 {
        assert!(
            acked_ids.contains(format!("slow-{i}").as_str()),
            "slow-{i} was lost"
        );
    }
    for (id, held_attempt) in &held_by_killed {
        assert!(
            delivered
                .iter()
                .any(|(w, again, attempt)| *w != 0 && again == id && attempt > held_attempt),
            "{id}, held by the killed worker, was not delivered again"
        );
    }
    eprintln!(
        "healthy: 10000 tasks over workers {per_worker:?}, each once; killed worker held {} and all came back",
        held_by_killed.len()
    );
    drop(workers);
    drop(server);
}

#[test]
fn workers_recover_when_the_redis_server_restarts() {
    let Some(mut server) = support::redis_server::start() else {
        return;
    };
    let url = server.url();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let wheel = runtime.block_on(async { Wheel::new() });
    let queue = runtime
        .block_on(
            DurableQueue::builder()
                .lease(Duration::from_secs(2))
                .redis(&url, "restart", &wheel),
        )
        .unwrap();
    let acked = Arc::new(Mutex::new(HashSet::new()));
    let consumers: Vec<_> = (0..2)
        .map(|_| {
            let (queue, acked) = (queue.clone(), acked.clone());
            runtime.spawn(async move {
                let mut deliveries = queue.deliveries();
                while let Some(delivery) = deliveries.next().await {
                    if delivery.ack().await.is_ok() {
                        acked.lock().unwrap().insert(delivery.id().to_string());
                    }
                }
            })
        })
        .collect();
    let producer = {
        let queue = queue.clone();
        runtime.spawn(async move {
            for i in 0..300 {
                queue
                    .schedule(Task::new("x").id(format!("r-{i}")))
                    .await
                    .expect("schedule retries through the restart");
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    server.restart();
    runtime.block_on(async {
        producer.await.unwrap();
        let start = Instant::now();
        while acked.lock().unwrap().len() < 300 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "only {} acked",
                acked.lock().unwrap().len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(queue.len().await.unwrap(), 0);
    });
    for consumer in consumers {
        consumer.abort();
    }
}

/// Issue 13: three worker processes share recurring schedules (a 100 ms period and a cron
/// expression with seconds). Each occurrence is made once and first delivered to one worker
/// only; a worker killed with SIGKILL mid-way does not stop the schedules (its claim on a
/// schedule runs out with its lease and another worker advances it).
#[test]
fn three_workers_deliver_each_recurring_occurrence_once() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let url = server.url();
    let mut workers = Workers((0..3).map(|i| spawn_worker(&url, &log, i)).collect());
    wait_until_ready(&log, 3, Duration::from_secs(30));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let wheel = Wheel::new();
        let queue = DurableQueue::builder()
            .lease(LEASE)
            .redis(&url, QUEUE, &wheel)
            .await
            .unwrap();
        queue
            .schedule_recurring(
                tokio_wheel_durable::Recurring::every(Duration::from_millis(100)).id("beat"),
            )
            .await
            .unwrap();
        queue
            .schedule_recurring(
                tokio_wheel_durable::Recurring::cron("* * * * * *")
                    .unwrap()
                    .id("sec"),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let _ = workers.0[2].kill();
        let _ = workers.0[2].wait();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(queue.cancel_recurring(&"beat".into()).await.unwrap());
        assert!(queue.cancel_recurring(&"sec".into()).await.unwrap());
        // Occurrences already made drain.
        wait_until_empty(&queue, Duration::from_secs(10)).await;
    });
    drop(workers);
    let (delivered, _) = read_log(&log);
    let mut first = HashMap::new();
    for (worker, id, attempt) in &delivered {
        if *attempt == 1 {
            assert!(
                first.insert(id.clone(), *worker).is_none(),
                "{id} first delivered twice"
            );
        }
    }
    let times = |schedule: &str| -> Vec<u64> {
        let mut times: Vec<u64> = first
            .keys()
            .filter_map(|id| id.strip_prefix(schedule)?.parse().ok())
            .collect();
        times.sort_unstable();
        times
    };
    let beats = times("beat@");
    let seconds = times("sec@");
    let workers_used: HashSet<usize> = first.values().copied().collect();
    eprintln!(
        "{} beats, {} seconds, delivered by workers {workers_used:?}",
        beats.len(),
        seconds.len()
    );
    assert!(beats.len() >= 25, "{beats:?}");
    assert!(
        beats.windows(2).all(|w| (w[1] - w[0]) % 100 == 0),
        "{beats:?}"
    );
    assert!(seconds.len() >= 4, "{seconds:?}");
    assert!(seconds.iter().all(|t| t % 1_000 == 0), "{seconds:?}");
    assert!(workers_used.len() >= 2, "{workers_used:?}");
}
