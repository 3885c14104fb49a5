//! The Redis-shared durable queue: claims per second with 1, 2 and 4 workers, and delivery
//! lateness. Starts its own `redis-server` (from PATH) on a loopback port, or uses `REDIS_URL`.
//!
//! Run: `cargo run --release --features redis --example redis_bench` (`-- --quick`).

#[path = "support/redis_server.rs"]
mod redis_server;

use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel::durable::{DurableQueue, Task};

async fn fill(queue: &DurableQueue, prefix: &str, count: usize, spread: Duration) {
    let start = SystemTime::now();
    let producers: Vec<_> = (0..16)
        .map(|p| {
            let (queue, prefix) = (queue.clone(), prefix.to_owned());
            tokio::spawn(async move {
                for i in (p..count).step_by(16) {
                    let due = start + spread.mul_f64(i as f64 / count as f64);
                    queue
                        .schedule(Task::new(vec![0u8; 64]).id(format!("{prefix}-{i}")).at(due))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for producer in producers {
        producer.await.unwrap();
    }
}

/// Consumes `count` tasks with `workers` handles (each its own connection and engine, as
/// separate processes would be) and returns (elapsed, lateness of each delivery).
async fn consume(
    url: &str,
    wheel: &Wheel,
    name: &str,
    workers: usize,
    count: usize,
) -> (Duration, Vec<Duration>) {
    let start = Instant::now();
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let queue = DurableQueue::builder()
            .prefetch(64)
            .redis(url, name, wheel)
            .await
            .unwrap();
        let sender = sender.clone();
        tasks.push(tokio::spawn(async move {
            queue
                .deliveries()
                .for_each_concurrent(64, |d| {
                    let sender = sender.clone();
                    async move {
                        let late = SystemTime::now()
                            .duration_since(d.due())
                            .unwrap_or_default();
                        d.ack().await.unwrap();
                        let _ = sender.send(late);
                    }
                })
                .await;
        }));
    }
    let mut lateness = Vec::with_capacity(count);
    while lateness.len() < count {
        lateness.push(receiver.recv().await.unwrap());
    }
    let elapsed = start.elapsed();
    for task in tasks {
        task.abort();
    }
    lateness.sort_unstable();
    (elapsed, lateness)
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let count = if quick { 2_000 } else { 20_000 };
    let (_server, url) = redis_server::start();
    let wheel = Wheel::new();
    println!("| workers | tasks | claims + acks per second | lateness p50 | lateness p99 |");
    println!("|---|---|---|---|---|");
    for workers in [1, 2, 4] {
        let name = format!("bench-{workers}");
        let producer = DurableQueue::builder()
            .redis(&url, &name, &wheel)
            .await
            .unwrap();
        // Throughput: everything due at once.
        fill(&producer, "now", count, Duration::ZERO).await;
        let (elapsed, _) = consume(&url, &wheel, &name, workers, count).await;
        // Lateness: due times spread over two seconds while the workers wait.
        let spread = Duration::from_secs(2);
        let lateness_run = {
            let url = url.clone();
            let wheel = wheel.clone();
            let name = name.clone();
            tokio::spawn(async move { consume(&url, &wheel, &name, workers, count / 4).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        fill(&producer, "spread", count / 4, spread).await;
        let (_, lateness) = lateness_run.await.unwrap();
        println!(
            "| {workers} | {count} | {:.0} | {:.1} ms | {:.1} ms |",
            count as f64 / elapsed.as_secs_f64(),
            lateness[lateness.len() / 2].as_secs_f64() * 1e3,
            lateness[lateness.len() * 99 / 100].as_secs_f64() * 1e3
        );
    }
}
