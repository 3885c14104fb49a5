//! The Redis-shared durable queue, measured phase by phase: schedule rate; throughput with 1
//! and 4 workers, tasks arriving while they run ("immediate") and waiting before they start
//! ("backlog"), at `SIZES` (default `TASKS` and 10 × `TASKS`); the producers' schedule rate
//! while 1 or 4 workers run; `TASKS` tasks due within the next 2 s while 1 or 4 workers run
//! ("delayed"); `schedule_many` in batches of `MANY_BATCH` (default 50) from 16 producers;
//! CPU per task for the schedule, immediate, delayed and schedule_many rows (redis-server's
//! `INFO cpu` and this process's `getrusage`, `<row>_server_us`, `_client_us`, `_cpu_us`); delayed-delivery lateness (and how many deliveries were early); Redis commands
//! per second while a worker idles; redelivery time after a worker is killed; and 10^5 tasks
//! due within 2 s (the time until all are done). `benches/peers/run-redis-peers.sh` runs the same phases with apalis-redis on
//! the same server and prints medians and ratios.
//!
//! Starts its own `redis-server` (from PATH) on a loopback port, or uses `REDIS_URL`. Each
//! worker is its own `DurableQueue` handle (its own connection and engine, as separate
//! processes would be) with a prefetch of 64 and 64 deliveries in flight.
//!
//! Run: `cargo run --release -p tokio-wheel-durable --features redis --example redis_bench` (`-- --quick` for a
//! small run). Prints `RESULT <metric> <value>` lines.

#[path = "support/redis_server.rs"]
mod redis_server;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{Delivery, DurableQueue, Task};

const QUEUE: &str = "bench";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A 64-byte payload that starts with the task's intended due time, so lateness is measured
/// against what the producer asked for (as the apalis peer does).
fn payload(due_ms: u64) -> Vec<u8> {
    let mut bytes = due_ms.to_le_bytes().to_vec();
    bytes.resize(64, 0);
    bytes
}

fn due_of(delivery: &Delivery) -> u64 {
    u64::from_le_bytes(delivery.payload()[..8].try_into().unwrap())
}

fn result(metric: &str, value: impl std::fmt::Display) {
    println!("RESULT {metric} {value}");
}

/// Whether to run a phase: all of them, or those named in `ONLY` (comma-separated).
fn wanted(phase: &str) -> bool {
    std::env::var("ONLY").map_or(true, |only| only.split(',').any(|p| p == phase))
}

fn rate(count: usize, elapsed: Duration) -> String {
    format!("{:.0}", count as f64 / elapsed.as_secs_f64())
}

/// Waits (up to 2 minutes) for `count` acks and returns the rate since `start`, or "failed".
async fn throughput(
    done: &mut mpsc::UnboundedReceiver<(bool, i64)>,
    count: usize,
    start: Instant,
) -> String {
    match receive(done, count, Duration::from_secs(120)).await {
        Some(_) => rate(count, start.elapsed()),
        None => "failed".into(),
    }
}

fn redis_command<T: redis::FromRedisValue>(url: &str, command: &mut redis::Cmd) -> T {
    let mut connection = redis::Client::open(url).unwrap().get_connection().unwrap();
    command.query(&mut connection).unwrap()
}

fn flush(url: &str) {
    let () = redis_command(url, &mut redis::cmd("FLUSHALL"));
}

/// CPU spent so far, in µs: redis-server's (`INFO cpu`, user + system) and this process's
/// (`getrusage`, user + system, every thread).
#[derive(Clone, Copy)]
struct Cpu {
    server_us: f64,
    client_us: f64,
}

fn cpu(url: &str) -> Cpu {
    let info: String = redis_command(url, redis::cmd("INFO").arg("cpu"));
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let server_us = (field("used_cpu_sys:") + field("used_cpu_user:")) * 1e6;
    // SAFETY: `usage` is a valid rusage for the call to write.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let micros = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    Cpu {
        server_us,
        client_us: micros(usage.ru_utime) + micros(usage.ru_stime),
    }
}

/// Prints `row`'s CPU per task since `before`: server, client and both.
fn cpu_per_task(url: &str, row: &str, before: Cpu, tasks: usize) {
    let after = cpu(url);
    let server = (after.server_us - before.server_us) / tasks as f64;
    let client = (after.client_us - before.client_us) / tasks as f64;
    result(&format!("{row}_server_us"), format!("{server:.1}"));
    result(&format!("{row}_client_us"), format!("{client:.1}"));
    result(&format!("{row}_cpu_us"), format!("{:.1}", server + client));
}

fn commands_processed(url: &str) -> u64 {
    let info: String = redis_command(url, redis::cmd("INFO").arg("stats"));
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// 16 producers schedule `count` tasks through one handle; `due(i)` is the wall-clock due
/// time in ms, or `None` for due now. Returns the elapsed time.
async fn produce(
    queue: &DurableQueue,
    count: usize,
    due: Option<std::sync::Arc<dyn Fn(usize) -> u64 + Send + Sync>>,
) -> Duration {
    let start = Instant::now();
    let producers: Vec<_> = (0..16)
        .map(|p| {
            let (queue, due) = (queue.clone(), due.clone());
            tokio::spawn(async move {
                for i in (p..count).step_by(16) {
                    let task = match &due {
                        None => Task::new(payload(now_ms())),
                        Some(due) => {
                            let at = due(i);
                            Task::new(payload(at)).at(UNIX_EPOCH + Duration::from_millis(at))
                        }
                    };
                    queue.schedule(task).await.expect("schedule");
                }
            })
        })
        .collect();
    for producer in producers {
        producer.await.unwrap();
    }
    start.elapsed()
}

/// Starts a worker on `wheel`'s runtime: acks everything (sending its lateness in ms to
/// `done`), or, if `holds`, keeps every delivery unfinished, as a worker that is then killed.
async fn worker(
    url: &str,
    wheel: &Wheel,
    lease: Duration,
    done: &mpsc::UnboundedSender<(bool, i64)>,
    holds: bool,
) {
    let queue = DurableQueue::builder()
        .prefetch(64)
        .lease(lease)
        .redis(url, QUEUE, wheel)
        .await
        .unwrap();
    let done = done.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        let mut deliveries = queue.deliveries();
        if holds {
            while let Some(d) = deliveries.next().await {
                let _ = done.send((true, now_ms() as i64 - due_of(&d) as i64));
                held.push(d);
            }
        } else {
            deliveries
                .for_each_concurrent(64, |d| {
                    let done = done.clone();
                    async move {
                        let late = now_ms() as i64 - due_of(&d) as i64;
                        d.ack().await.unwrap();
                        let _ = done.send((false, late));
                    }
                })
                .await;
        }
    });
}

/// An emptied server, a wheel and a producer handle on it.
async fn fresh(url: &str) -> (Wheel, DurableQueue) {
    flush(url);
    let wheel = Wheel::new();
    let producer = DurableQueue::builder()
        .redis(url, QUEUE, &wheel)
        .await
        .unwrap();
    (wheel, producer)
}

/// [`fresh`], with `workers` workers running (given 300 ms to start), whose acks arrive on the
/// receiver.
async fn with_workers(
    url: &str,
    workers: usize,
    lease: Duration,
) -> (Wheel, DurableQueue, mpsc::UnboundedReceiver<(bool, i64)>) {
    let (wheel, producer) = fresh(url).await;
    let (sender, done) = mpsc::unbounded_channel();
    for _ in 0..workers {
        worker(url, &wheel, lease, &sender, false).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    (wheel, producer, done)
}

async fn receive(
    done: &mut mpsc::UnboundedReceiver<(bool, i64)>,
    count: usize,
    limit: Duration,
) -> Option<Vec<i64>> {
    let mut late = Vec::with_capacity(count);
    let deadline = tokio::time::Instant::now() + limit;
    while late.len() < count {
        match tokio::time::timeout_at(deadline, done.recv()).await {
            Ok(Some((false, l))) => late.push(l),
            Ok(Some((true, _))) => {}
            _ => return None,
        }
    }
    Some(late)
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(default)
    };
    let count = env("TASKS", if quick { 2_000 } else { 10_000 });
    let at_once = env("AT_ONCE", if quick { 5_000 } else { 100_000 });
    // Immediate throughput is measured at each of these sizes (`SIZES`, comma-separated).
    let sizes: Vec<usize> = std::env::var("SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_else(|| vec![count, 10 * count]);
    let lease = Duration::from_secs(if quick { 1 } else { 5 });
    let (_server, url) = redis_server::start();

    // Schedule rate: tasks an hour ahead.
    if wanted("schedule") {
        let (wheel, producer) = fresh(&url).await;
        let far = now_ms() + 3_600_000;
        let before = cpu(&url);
        let elapsed = produce(&producer, count, Some(std::sync::Arc::new(move |_| far))).await;
        result("schedule_no_worker_per_s", rate(count, elapsed));
        cpu_per_task(&url, "schedule_no_worker", before, count);
        wheel.shutdown().await;
    }

    for workers in [1, 4] {
        // Immediate: workers running, tasks scheduled due now, for each size; the producers'
        // own rate in the first size is the schedule rate with W workers running.
        for (size_index, &n) in sizes.iter().enumerate() {
            if !wanted("immediate") {
                break;
            }
            let (wheel, producer, mut done) = with_workers(&url, workers, lease).await;
            let before = cpu(&url);
            let start = Instant::now();
            let producing = {
                let producer = producer.clone();
                tokio::spawn(async move { produce(&producer, n, None).await })
            };
            let value = throughput(&mut done, n, start).await;
            cpu_per_task(&url, &format!("immediate_{n}_w{workers}"), before, n);
            let produced = producing.await.unwrap();
            if size_index == 0 {
                result(&format!("schedule_w{workers}_per_s"), rate(n, produced));
            }
            result(&format!("immediate_{n}_w{workers}_per_s"), value);
            wheel.shutdown().await;
        }

        // Delayed: workers running, `count` tasks due over the next 2 s (task i at start +
        // 2 s · i/n): the producers' rate, and CPU per task from the first schedule to the
        // last ack.
        if wanted("delayed") {
            let (wheel, producer, mut done) = with_workers(&url, workers, lease).await;
            let before = cpu(&url);
            let now = now_ms();
            let spread = move |i: usize| now + (i as u64 * 2_000) / count as u64;
            let produced = produce(&producer, count, Some(std::sync::Arc::new(spread))).await;
            let row = format!("delayed_{count}_w{workers}");
            match receive(&mut done, count, Duration::from_secs(120)).await {
                Some(_) => {
                    cpu_per_task(&url, &row, before, count);
                    result(&format!("{row}_sched_per_s"), rate(count, produced));
                }
                None => result(&format!("{row}_sched_per_s"), "failed"),
            }
            wheel.shutdown().await;
        }

        // Backlog: tasks waiting before the workers start.
        if wanted("backlog") {
            let (wheel, producer) = fresh(&url).await;
            produce(&producer, count, None).await;
            let (sender, mut done) = mpsc::unbounded_channel();
            let start = Instant::now();
            for _ in 0..workers {
                worker(&url, &wheel, lease, &sender, false).await;
            }
            let value = throughput(&mut done, count, start).await;
            result(&format!("backlog_{workers}_per_s"), value);
            wheel.shutdown().await;
        }
    }

    // Lateness: 2000 tasks due over the next 0.5–2.5 s, one worker waiting.
    if wanted("lateness") {
        let (wheel, producer, mut done) = with_workers(&url, 1, lease).await;
        let first = now_ms() + 500;
        let delayed = 2_000;
        produce(
            &producer,
            delayed,
            Some(std::sync::Arc::new(move |i| first + i as u64)),
        )
        .await;
        match receive(&mut done, delayed, Duration::from_secs(60)).await {
            Some(mut late) => {
                late.sort_unstable();
                let early = late.iter().filter(|&&l| l < 0).count();
                result("late_p50_ms", late[late.len() / 2]);
                result("late_p99_ms", late[late.len() * 99 / 100]);
                result(
                    "early_pct",
                    format!("{:.1}", early as f64 * 100.0 / late.len() as f64),
                );
            }
            None => result("late_p50_ms", "failed"),
        }
        wheel.shutdown().await;
    }

    // Idle: one worker, nothing to do, for 5 s (1 s in quick mode).
    if wanted("idle") {
        flush(&url);
        let wheel = Wheel::new();
        let (sender, _done) = mpsc::unbounded_channel();
        worker(&url, &wheel, lease, &sender, false).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let idle = Duration::from_secs(if quick { 1 } else { 5 });
        let before = commands_processed(&url);
        tokio::time::sleep(idle).await;
        let after = commands_processed(&url);
        // The INFO that read `before` counts as one.
        result(
            "idle_cmds_per_s_per_worker",
            format!("{:.0}", (after - before - 1) as f64 / idle.as_secs_f64()),
        );
        wheel.shutdown().await;
    }

    // Redelivery after a killed worker: it takes 100 tasks and never finishes them; its
    // runtime is dropped (every task gone at once, as in a kill); a second worker waits.
    if wanted("redelivery") {
        flush(&url);
        let (sender, mut done) = mpsc::unbounded_channel();
        let victim = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let victim_wheel = {
            let (url, sender) = (url.clone(), sender.clone());
            victim
                .spawn(async move {
                    let wheel = Wheel::new();
                    worker(&url, &wheel, lease, &sender, true).await;
                    wheel
                })
                .await
                .unwrap()
        };
        let wheel = Wheel::new();
        let producer = DurableQueue::builder()
            .redis(&url, QUEUE, &wheel)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        produce(&producer, 100, None).await;
        let mut taken = 0;
        while taken < 100 {
            if let Some((true, _)) = done.recv().await {
                taken += 1;
            }
        }
        worker(&url, &wheel, lease, &sender, false).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        victim.shutdown_background();
        drop(victim_wheel);
        let killed = Instant::now();
        match receive(&mut done, 100, Duration::from_secs(600)).await {
            Some(_) => result(
                "redelivery_s",
                format!("{:.2}", killed.elapsed().as_secs_f64()),
            ),
            None => result("redelivery_s", "never"),
        }
        wheel.shutdown().await;
    }

    // Due within 2 s: `at_once` tasks due over the next 2 s (task i at start + 2 s · i/n),
    // four workers; the time from the first schedule until the last ack.
    if wanted("at_once") {
        let (wheel, producer) = fresh(&url).await;
        let (sender, mut done) = mpsc::unbounded_channel();
        for _ in 0..4 {
            worker(&url, &wheel, lease, &sender, false).await;
        }
        let now = now_ms();
        let start = Instant::now();
        let spread = move |i: usize| now + (i as u64 * 2_000) / at_once as u64;
        produce(&producer, at_once, Some(std::sync::Arc::new(spread))).await;
        let value = match receive(&mut done, at_once, Duration::from_secs(300)).await {
            Some(_) => format!("{:.2}", start.elapsed().as_secs_f64()),
            None => "failed".into(),
        };
        result(&format!("due_within_2s_{at_once}_done_s"), value);
        wheel.shutdown().await;
    }

    // schedule_many: the same far-ahead tasks in batches of `MANY_BATCH` (default 50, as
    // issue 30's row) from 16 producers.
    if wanted("schedule_many") {
        let (wheel, producer) = fresh(&url).await;
        let batch = env("MANY_BATCH", 50).max(1);
        let far = now_ms() + 3_600_000;
        let before = cpu(&url);
        let start = Instant::now();
        let producers: Vec<_> = (0..16)
            .map(|p| {
                let producer = producer.clone();
                tokio::spawn(async move {
                    let mine: Vec<usize> = (p..count).step_by(16).collect();
                    for chunk in mine.chunks(batch) {
                        let tasks = chunk.iter().map(|_| {
                            Task::new(payload(far)).at(UNIX_EPOCH + Duration::from_millis(far))
                        });
                        for outcome in producer.schedule_many(tasks).await.expect("schedule_many") {
                            outcome.expect("scheduled");
                        }
                    }
                })
            })
            .collect();
        for producer in producers {
            producer.await.unwrap();
        }
        result(
            &format!("schedule_many_{batch}_per_s"),
            rate(count, start.elapsed()),
        );
        cpu_per_task(&url, &format!("schedule_many_{batch}"), before, count);
        wheel.shutdown().await;
    }
}
