//! Durable queue throughput on this machine's disk: schedule with 1 and 64 producers (group
//! commit), delivery with acks, and restart time and memory with big backlogs: a fresh process
//! opens the store, reads its length and stats, pages through it and takes deliveries, and
//! reports its open time and peak resident memory.
//!
//! Run: `cargo run --release -p tokio-wheel-durable --example durable_bench` (`-- --quick` for a
//! small run; `-- --huge` adds 10^7 small tasks, a few minutes to fill). Prints a markdown
//! table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{DurableQueue, Task};

fn per_second(count: usize, elapsed: Duration) -> String {
    format!("{:.0}", count as f64 / elapsed.as_secs_f64())
}

async fn schedule_all(
    queue: &DurableQueue,
    producers: usize,
    per_producer: usize,
    delay: Duration,
) -> Duration {
    let start = Instant::now();
    let tasks: Vec<_> = (0..producers)
        .map(|p| {
            let queue = queue.clone();
            tokio::spawn(async move {
                for i in 0..per_producer {
                    let task = Task::new(vec![0u8; 64]).id(format!("{p}-{i}")).after(delay);
                    queue.schedule(task).await.expect("schedule");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("producer");
    }
    start.elapsed()
}

/// Peak resident memory of this process (Linux `VmHWM`), in MiB.
fn peak_rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb >> 10)
}

/// In a fresh process: opens the store, uses it, prints `open_ms rss_mib`.
async fn open_and_measure(path: &str) {
    let wheel = Wheel::new();
    let start = Instant::now();
    let queue = DurableQueue::open(path, &wheel).await.expect("open");
    let pending = queue.len().await.expect("len");
    let open = start.elapsed();
    let stats = queue.stats().await.expect("stats");
    assert_eq!(stats.pending as usize, pending);
    let mut after = None;
    for _ in 0..20 {
        let page = queue
            .list(
                tokio_wheel_durable::TaskFilter::Pending,
                after.as_ref(),
                1_000,
            )
            .await
            .expect("list");
        after = page.last().map(|t| t.id.clone());
    }
    queue.close().await;
    println!("{} {}", open.as_millis(), peak_rss_mib());
}

/// Fills a store with `count` tasks of `payload` bytes due in an hour, then measures its
/// reopening in a child process.
async fn restart_row(dir: &std::path::Path, wheel: &Wheel, count: usize, payload: usize) {
    let path = dir.join(format!("restart-{count}-{payload}.redb"));
    let queue = DurableQueue::open(&path, wheel).await.expect("open");
    let start = Instant::now();
    let tasks: Vec<_> = (0..256)
        .map(|p| {
            let queue = queue.clone();
            tokio::spawn(async move {
                for i in (p..count).step_by(256) {
                    let task = Task::new(vec![0u8; payload]).after(Duration::from_secs(3_600));
                    queue
                        .schedule(task.id(format!("{i}")))
                        .await
                        .expect("schedule");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("producer");
    }
    let fill = start.elapsed();
    queue.close().await;
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let output = std::process::Command::new(std::env::current_exe().expect("exe"))
        .arg("--open")
        .arg(&path)
        .output()
        .expect("child");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut fields = text.split_whitespace();
    let open_ms = fields.next().unwrap_or("?");
    let rss = fields.next().unwrap_or("?");
    println!(
        "| restart: fresh process opens {count} pending tasks of {payload} B ({} MB file; filled at {} tasks/s) | {count} | open {open_ms} ms, peak RSS {rss} MiB |",
        size / 1_000_000,
        per_second(count, fill),
    );
    std::fs::remove_file(&path).ok();
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--open") {
        return open_and_measure(&args[at + 1]).await;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let huge = args.iter().any(|a| a == "--huge");
    let (single, many, deliver) = if quick {
        (100, 2_000, 2_000)
    } else {
        (500, 20_000, 20_000)
    };
    let restarts: &[(usize, usize)] = if quick {
        &[(10_000, 64)]
    } else if huge {
        &[(1_000_000, 64), (250_000, 4_096), (10_000_000, 16)]
    } else {
        &[(1_000_000, 64), (250_000, 4_096)]
    };
    let dir = tempfile_dir();
    let wheel = Wheel::new();
    println!("| measurement | count | result |");
    println!("|---|---|---|");

    let queue = DurableQueue::open(dir.join("one.redb"), &wheel)
        .await
        .expect("open");
    let elapsed = schedule_all(&queue, 1, single, Duration::from_secs(3_600)).await;
    println!(
        "| schedule, 1 producer (one commit each) | {single} | {} tasks/s |",
        per_second(single, elapsed)
    );
    queue.close().await;

    let queue = DurableQueue::open(dir.join("many.redb"), &wheel)
        .await
        .expect("open");
    let elapsed = schedule_all(&queue, 64, many / 64, Duration::from_secs(3_600)).await;
    println!(
        "| schedule, 64 producers (group commit) | {} | {} tasks/s |",
        many / 64 * 64,
        per_second(many / 64 * 64, elapsed)
    );
    queue.close().await;

    let queue = DurableQueue::builder()
        .prefetch(256)
        .open(dir.join("deliver.redb"), &wheel)
        .await
        .expect("open");
    schedule_all(&queue, 64, deliver / 64, Duration::ZERO).await;
    let total = deliver / 64 * 64;
    let start = Instant::now();
    let acked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    queue
        .deliveries()
        .take(total)
        .for_each_concurrent(256, |delivery| {
            let acked = acked.clone();
            async move {
                delivery.ack().await.expect("ack");
                acked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        })
        .await;
    let elapsed = start.elapsed();
    assert_eq!(acked.load(std::sync::atomic::Ordering::Relaxed), total);
    println!(
        "| deliver + ack, 256 in flight | {total} | {} tasks/s |",
        per_second(total, elapsed)
    );
    queue.close().await;

    for &(count, payload) in restarts {
        restart_row(&dir, &wheel, count, payload).await;
    }
    std::fs::remove_dir_all(&dir).ok();
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("tokio-wheel-durable-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}
