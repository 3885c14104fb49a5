//! The apalis-redis side of BENCHMARKS.md's durable queue comparison. Runs the same phases as
//! tokio-wheel's `examples/redis_bench.rs --peer-format` against the server at `REDIS_URL` and
//! prints `RESULT <metric> <value>` lines; `benches/peers/run-redis-peers.sh` runs both on one
//! `redis-server` and prints medians and ratios.
//!
//! apalis settings: its defaults except a `buffer_size` of 2000 (`APALIS_BUFFER`: apalis
//! fetches at most that many jobs per 100 ms poll, so its default of 10 caps a worker at 100
//! jobs/s), scheduled jobs moved every 100 ms (the default 30 s would make every delayed
//! job up to 30 s late), a 1 s keep-alive and orphans re-enqueued after 5 s (tokio-wheel runs
//! with a 5 s lease). Due times are given in whole seconds (`DateTime::timestamp()`), the
//! only resolution apalis's `schedule` takes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use apalis::prelude::*;
use apalis_redis::{Config, RedisStorage};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    due_ms: u64,
    pad: Vec<u8>,
}

/// Whether this worker plays the one that is killed: it takes jobs and never finishes them.
#[derive(Clone)]
struct Holds(bool);

#[derive(Clone)]
struct Done(mpsc::UnboundedSender<(bool, i64)>);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

async fn handle(job: Job, done: Data<Done>, holds: Data<Holds>) -> Result<(), Error> {
    let late = now_ms() as i64 - job.due_ms as i64;
    let _ = done.0.send((holds.0, late));
    if holds.0 {
        futures::future::pending::<()>().await;
    }
    Ok(())
}

fn config() -> Config {
    // apalis fetches at most `buffer_size` jobs per poll (every 100 ms): with 64, a worker
    // tops out near 640 jobs/s. 2000 lets it reach its measured best here.
    let buffer: usize = std::env::var("APALIS_BUFFER")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000);
    Config::default()
        .set_namespace("peer")
        .set_buffer_size(buffer)
        .set_enqueue_scheduled(Duration::from_millis(100))
        .set_keep_alive(Duration::from_secs(1))
        .set_reenqueue_orphaned_after(Duration::from_secs(5))
}

async fn storage(url: &str) -> RedisStorage<Job> {
    let connection = apalis_redis::connect(url).await.expect("connect");
    RedisStorage::new_with_config(connection, config())
}

async fn flush(url: &str) {
    let mut connection = apalis_redis::connect(url).await.unwrap();
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut connection)
        .await
        .unwrap();
}

/// CPU spent so far, in µs: redis-server's (`INFO cpu`, user + system) and this process's
/// (`getrusage`, user + system, every thread), as tokio-wheel's `redis_bench` reads them.
#[derive(Clone, Copy)]
struct Cpu {
    server_us: f64,
    client_us: f64,
}

async fn cpu(url: &str) -> Cpu {
    let mut connection = apalis_redis::connect(url).await.unwrap();
    let info: String = redis::cmd("INFO").arg("cpu").query_async(&mut connection).await.unwrap();
    let field = |name: &str| -> f64 {
        info.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
    };
    let server_us = (field("used_cpu_sys:") + field("used_cpu_user:")) * 1e6;
    // SAFETY: `usage` is a valid rusage for the call to write.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let micros = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    Cpu { server_us, client_us: micros(usage.ru_utime) + micros(usage.ru_stime) }
}

/// Prints `row`'s CPU per task since `before`: server, client and both.
async fn cpu_per_task(url: &str, row: &str, before: Cpu, tasks: usize) {
    let after = cpu(url).await;
    let server = (after.server_us - before.server_us) / tasks as f64;
    let client = (after.client_us - before.client_us) / tasks as f64;
    result(&format!("{row}_server_us"), format!("{server:.1}"));
    result(&format!("{row}_client_us"), format!("{client:.1}"));
    result(&format!("{row}_cpu_us"), format!("{:.1}", server + client));
}

async fn commands_processed(url: &str) -> u64 {
    let mut connection = apalis_redis::connect(url).await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut connection)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Workers of one phase, on a runtime of their own, so the phase can end them all at once.
struct Phase(tokio::runtime::Runtime);

impl Phase {
    fn new() -> Phase {
        Phase(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap(),
        )
    }

    /// Starts a worker; what it handles goes to `done`.
    fn worker(&self, url: &str, done: &mpsc::UnboundedSender<(bool, i64)>, holds: bool) {
        static WORKERS: AtomicUsize = AtomicUsize::new(0);
        let (url, done) = (url.to_owned(), done.clone());
        self.0.spawn(async move {
            let storage = storage(&url).await;
            let name = format!("w{}", WORKERS.fetch_add(1, Ordering::Relaxed));
            WorkerBuilder::new(name)
                .data(Done(done))
                .data(Holds(holds))
                .backend(storage)
                .build_fn(handle)
                .run()
                .await;
        });
    }

    /// Ends every worker at once, as a kill would.
    fn end(self) {
        self.0.shutdown_background();
    }
}

/// 16 producers push (or schedule at `due(i)`) `count` jobs; returns the elapsed time.
async fn produce(url: &str, count: usize, due: Option<Arc<dyn Fn(usize) -> u64 + Send + Sync>>) -> Duration {
    let storage = storage(url).await;
    let start = Instant::now();
    let producers: Vec<_> = (0..16)
        .map(|p| {
            let mut storage = storage.clone();
            let due = due.clone();
            tokio::spawn(async move {
                for i in (p..count).step_by(16) {
                    match &due {
                        None => {
                            let job = Job { due_ms: now_ms(), pad: vec![0; 64] };
                            storage.push(job).await.expect("push");
                        }
                        Some(due) => {
                            let due_ms = due(i);
                            let job = Job { due_ms, pad: vec![0; 64] };
                            // Whole seconds, as DateTime::timestamp() gives them.
                            storage.schedule(job, (due_ms / 1000) as i64).await.expect("schedule");
                        }
                    }
                }
            })
        })
        .collect();
    for producer in producers {
        producer.await.unwrap();
    }
    start.elapsed()
}

async fn receive(done: &mut mpsc::UnboundedReceiver<(bool, i64)>, count: usize, limit: Duration) -> Option<Vec<i64>> {
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

#[tokio::main]
async fn main() {
    let url = std::env::var("REDIS_URL").expect("REDIS_URL");
    let count: usize = std::env::var("TASKS").ok().and_then(|n| n.parse().ok()).unwrap_or(10_000);
    let at_once: usize = std::env::var("AT_ONCE").ok().and_then(|n| n.parse().ok()).unwrap_or(100_000);

    // Immediate throughput is measured at each of these sizes (`SIZES`, comma-separated).
    let sizes: Vec<usize> = std::env::var("SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_else(|| vec![count, 10 * count]);

    // Schedule rate: jobs an hour ahead.
    if wanted("schedule") {
        flush(&url).await;
        let far = now_ms() + 3_600_000;
        let before = cpu(&url).await;
        let elapsed = produce(&url, count, Some(Arc::new(move |_| far))).await;
        result("schedule_no_worker_per_s", rate(count, elapsed));
        cpu_per_task(&url, "schedule_no_worker", before, count).await;
    }

    for workers in [1, 4] {
        // Immediate: workers running, jobs pushed due now, for each size; the producers' own
        // rate in the first size is the schedule rate with W workers running.
        for (size_index, &n) in sizes.iter().enumerate() {
            if !wanted("immediate") {
                break;
            }
            flush(&url).await;
            let phase = Phase::new();
            let (sender, mut done) = mpsc::unbounded_channel();
            for _ in 0..workers {
                phase.worker(&url, &sender, false);
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            let before = cpu(&url).await;
            let start = Instant::now();
            let producing = tokio::spawn({
                let url = url.clone();
                async move { produce(&url, n, None).await }
            });
            let ok = receive(&mut done, n, Duration::from_secs(120)).await.is_some();
            let elapsed = start.elapsed();
            cpu_per_task(&url, &format!("immediate_{n}_w{workers}"), before, n).await;
            let produced = producing.await.unwrap();
            if size_index == 0 {
                result(&format!("schedule_w{workers}_per_s"), rate(n, produced));
            }
            result(&format!("immediate_{n}_w{workers}_per_s"), if ok { rate(n, elapsed) } else { "failed".into() });
            phase.end();
        }

        // Delayed: workers running, `count` jobs due over the next 2 s (job i at start +
        // 2 s · i/n, whole seconds as apalis takes them): the producers' rate, and CPU per
        // job from the first schedule to the last one done.
        if wanted("delayed") {
            flush(&url).await;
            let phase = Phase::new();
            let (sender, mut done) = mpsc::unbounded_channel();
            for _ in 0..workers {
                phase.worker(&url, &sender, false);
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            let before = cpu(&url).await;
            let now = now_ms();
            let spread = move |i: usize| now + (i as u64 * 2_000) / count as u64;
            let produced = produce(&url, count, Some(Arc::new(spread))).await;
            let row = format!("delayed_{count}_w{workers}");
            match receive(&mut done, count, Duration::from_secs(120)).await {
                Some(_) => {
                    cpu_per_task(&url, &row, before, count).await;
                    result(&format!("{row}_sched_per_s"), rate(count, produced));
                }
                None => result(&format!("{row}_sched_per_s"), "failed"),
            }
            phase.end();
        }

        if !wanted("backlog") {
            continue;
        }
        // Backlog: jobs waiting before the workers start.
        flush(&url).await;
        produce(&url, count, None).await;
        let phase = Phase::new();
        let (sender, mut done) = mpsc::unbounded_channel();
        let start = Instant::now();
        for _ in 0..workers {
            phase.worker(&url, &sender, false);
        }
        let ok = receive(&mut done, count, Duration::from_secs(120)).await.is_some();
        result(&format!("backlog_{workers}_per_s"), if ok { rate(count, start.elapsed()) } else { "failed".into() });
        phase.end();
    }

    if wanted("lateness") {
        lateness(&url).await;
    }
    if wanted("idle") {
        idle(&url).await;
    }
    if wanted("redelivery") {
        redelivery(&url).await;
    }
    if wanted("at_once") {
        due_within(&url, at_once).await;
    }
}

/// Lateness: 2000 jobs due over the next 0.5–2.5 s, one worker waiting.
async fn lateness(url: &str) {
    let url = url.to_owned();
    flush(&url).await;
    let phase = Phase::new();
    let (sender, mut done) = mpsc::unbounded_channel();
    phase.worker(&url, &sender, false);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let first = now_ms() + 500;
    let delayed = 2_000;
    produce(&url, delayed, Some(Arc::new(move |i| first + i as u64))).await;
    match receive(&mut done, delayed, Duration::from_secs(60)).await {
        Some(mut late) => {
            late.sort_unstable();
            let early = late.iter().filter(|&&l| l < 0).count();
            result("late_p50_ms", late[late.len() / 2]);
            result("late_p99_ms", late[late.len() * 99 / 100]);
            result("early_pct", format!("{:.1}", early as f64 * 100.0 / late.len() as f64));
        }
        None => result("late_p50_ms", "failed"),
    }
    phase.end();
}

/// Idle: one worker, nothing to do, for 5 s.
async fn idle(url: &str) {
    let url = url.to_owned();
    flush(&url).await;
    let phase = Phase::new();
    let (sender, _done) = mpsc::unbounded_channel();
    phase.worker(&url, &sender, false);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = commands_processed(&url).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = commands_processed(&url).await;
    // The INFO that read `before` counts as one.
    result("idle_cmds_per_s_per_worker", format!("{:.0}", (after - before - 1) as f64 / 5.0));
    phase.end();
}

/// Redelivery after a killed worker: it takes 100 jobs and never finishes them; its runtime
/// is dropped (every task gone at once, as in a kill); a second worker is waiting.
async fn redelivery(url: &str) {
    let url = url.to_owned();
    flush(&url).await;
    let (sender, mut done) = mpsc::unbounded_channel();
    let victim = Phase::new();
    victim.worker(&url, &sender, true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    produce(&url, 100, None).await;
    let mut taken = 0;
    while taken < 100 {
        if let Some((true, _)) = done.recv().await {
            taken += 1;
        }
    }
    let rescuer = Phase::new();
    rescuer.worker(&url, &sender, false);
    tokio::time::sleep(Duration::from_millis(300)).await;
    victim.end();
    let killed = Instant::now();
    match receive(&mut done, 100, Duration::from_secs(600)).await {
        Some(_) => result("redelivery_s", format!("{:.2}", killed.elapsed().as_secs_f64())),
        None => result("redelivery_s", "never"),
    }
    rescuer.end();
}

/// Due within 2 s: `at_once` jobs due over the next 2 s (job i at start + 2 s · i/n, in whole
/// seconds as apalis takes them), four workers; the time from the first schedule until the
/// last job is done.
async fn due_within(url: &str, at_once: usize) {
    let url = url.to_owned();
    flush(&url).await;
    let phase = Phase::new();
    let (sender, mut done) = mpsc::unbounded_channel();
    for _ in 0..4 {
        phase.worker(&url, &sender, false);
    }
    let now = now_ms();
    let start = Instant::now();
    let spread = move |i: usize| now + (i as u64 * 2_000) / at_once as u64;
    produce(&url, at_once, Some(Arc::new(spread))).await;
    let value = match receive(&mut done, at_once, Duration::from_secs(300)).await {
        Some(_) => format!("{:.2}", start.elapsed().as_secs_f64()),
        None => "failed".into(),
    };
    result(&format!("due_within_2s_{at_once}_done_s"), value);
    phase.end();
}
