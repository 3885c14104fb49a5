//! Durable queue throughput on this machine's disk: schedule with 1 and 64 producers (group
//! commit), delivery with acks, and restart time with many pending tasks.
//!
//! Run: `cargo run --release --features durable --example durable_bench` (`-- --quick` for a
//! small run). Prints a markdown table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel::durable::{DurableQueue, Task};

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

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (single, many, deliver, restart) = if quick {
        (100, 2_000, 2_000, 10_000)
    } else {
        (500, 20_000, 20_000, 1_000_000)
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

    let path = dir.join("restart.redb");
    let queue = DurableQueue::open(&path, &wheel).await.expect("open");
    let fill = schedule_all(&queue, 64, restart / 64, Duration::from_secs(3_600)).await;
    queue.close().await;
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let start = Instant::now();
    let queue = DurableQueue::open(&path, &wheel).await.expect("reopen");
    let pending = queue.len().await.expect("len");
    let elapsed = start.elapsed();
    assert_eq!(pending, restart / 64 * 64);
    println!(
        "| restart: open + reload with pending tasks ({} MB file; filled at {} tasks/s) | {pending} | {:.2} s |",
        size / 1_000_000,
        per_second(pending, fill),
        elapsed.as_secs_f64()
    );
    queue.close().await;
    std::fs::remove_dir_all(&dir).ok();
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("tokio-wheel-durable-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}
