//! One durable queue shared by several workers through Redis: a producer schedules tasks with
//! delays; three workers (each its own connection, as separate processes would be) take them
//! as they come due; no worker polls — each sleeps on its wheel until the next task is due,
//! and hears at once when an earlier one is scheduled.
//!
//! Run: `cargo run --release -p tokio-wheel-durable --features redis --example redis_queue` — starts its own
//! `redis-server` from PATH, or uses `REDIS_URL=redis://host:port/`.

#[path = "support/redis_server.rs"]
mod redis_server;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{DurableQueue, Task};

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let step = Duration::from_millis(if quick { 50 } else { 250 });
    let (_server, url) = redis_server::start();
    let queue_name = format!("demo-{}", std::process::id());
    let wheel = Wheel::new();
    let start = Instant::now();
    println!("queue {queue_name:?} on {url}");

    let (done, mut finished) = mpsc::unbounded_channel();
    for worker in 1..=3 {
        let queue = DurableQueue::builder()
            .lease(Duration::from_secs(10))
            .redis(&url, &queue_name, &wheel)
            .await
            .expect("connect to redis");
        let done = done.clone();
        tokio::spawn(async move {
            let mut deliveries = queue.deliveries();
            while let Some(delivery) = deliveries.next().await {
                let late = std::time::SystemTime::now()
                    .duration_since(delivery.due())
                    .unwrap_or_default();
                println!(
                    "[{:>6.3} s] worker {worker} got {} ({:?} after due): {}",
                    start.elapsed().as_secs_f64(),
                    delivery.id(),
                    late,
                    String::from_utf8_lossy(delivery.payload())
                );
                delivery.ack().await.expect("ack");
                let _ = done.send(delivery.id().to_string());
            }
        });
    }

    let producer = DurableQueue::builder()
        .redis(&url, &queue_name, &wheel)
        .await
        .expect("connect");
    let tasks = 12u32;
    // Scheduled latest first: each new task is earlier than everything pending, and the idle
    // workers hear about it through the wake channel.
    for i in (0..tasks).rev() {
        let delay = step * (i + 2);
        producer
            .schedule(
                Task::new(format!("email #{i}"))
                    .id(format!("email-{i}"))
                    .after(delay),
            )
            .await
            .expect("schedule");
    }
    println!(
        "[{:>6.3} s] scheduled {tasks} tasks, due every {step:?}",
        start.elapsed().as_secs_f64()
    );

    let mut seen = HashSet::new();
    while seen.len() < tasks as usize {
        let id = finished.recv().await.expect("workers run");
        assert!(seen.insert(id.clone()), "{id} was delivered twice");
    }
    assert_eq!(producer.len().await.unwrap(), 0);
    println!("every task delivered exactly once; the queue is empty");
}
