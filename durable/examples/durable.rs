//! Durable tasks survive a restart: one process schedules them and exits; a second process
//! opens the same store and delivers them when they come due.
//!
//! Run: `cargo run --release -p tokio-wheel-durable --example durable` (`-- --quick` for shorter
//! delays). The example starts its first process itself (`durable schedule <dir>`), waits for
//! it to exit, then plays the second.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{DurableQueue, RetryPolicy, Task};

const ORDERS: [(&str, u64); 4] = [
    ("order-17: auto-accept (no review in time)", 3),
    ("order-18: send the review reminder", 1),
    ("ticket-9: close after 48 h of silence", 2),
    ("webhook-3: retry delivery", 2),
];

fn store_path(dir: &Path) -> PathBuf {
    dir.join("tasks.redb")
}

/// The first process: schedules the tasks, then exits without delivering anything.
async fn schedule(dir: &Path, unit: Duration) {
    let wheel = Wheel::new();
    let queue = DurableQueue::open(store_path(dir), &wheel)
        .await
        .expect("open the store");
    for (i, (what, units)) in ORDERS.iter().enumerate() {
        let due = SystemTime::now() + unit * *units as u32;
        let id = queue
            .schedule(
                Task::new(what.as_bytes().to_vec())
                    .id(format!("task-{i}"))
                    .at(due),
            )
            .await
            .expect("schedule");
        println!(
            "[process 1] scheduled {id}: {what} (due in {:?})",
            unit * *units as u32
        );
    }
    println!(
        "[process 1] {} tasks are durable; exiting without delivering any",
        queue.len().await.unwrap()
    );
}

/// The second process: reopens the store and delivers the tasks as they come due.
async fn deliver(dir: &Path, unit: Duration) {
    let wheel = Wheel::new();
    let start = Instant::now();
    let queue = DurableQueue::builder()
        .retry(RetryPolicy::exponential(unit / 4, unit))
        .open(store_path(dir), &wheel)
        .await
        .expect("reopen the store");
    let pending = queue.len().await.unwrap();
    println!("[process 2] reopened the store: {pending} tasks pending");
    let mut deliveries = queue.deliveries();
    let mut done = 0;
    while done < pending {
        let delivery = deliveries.next().await.expect("deliveries");
        let what = String::from_utf8_lossy(delivery.payload()).into_owned();
        let late = SystemTime::now()
            .duration_since(delivery.due())
            .unwrap_or_default();
        print!(
            "[process 2] +{:>5.2} s  {} (attempt {}, {:?} after its due time): {what}",
            start.elapsed().as_secs_f64(),
            delivery.id(),
            delivery.attempt(),
            late
        );
        if what.starts_with("webhook") && delivery.attempt() == 1 {
            println!(" → endpoint down, retry with backoff");
            delivery.retry().await.expect("retry");
        } else {
            println!(" → done, ack");
            delivery.ack().await.expect("ack");
            done += 1;
        }
    }
    assert!(queue.is_empty().await.unwrap());
    println!("[process 2] every task delivered and acked; the store is empty");
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let unit = if quick {
        Duration::from_millis(200)
    } else {
        Duration::from_secs(1)
    };
    if args.get(1).map(String::as_str) == Some("schedule") {
        schedule(Path::new(&args[2]), unit).await;
        return;
    }

    let dir = std::env::temp_dir().join(format!("tokio-wheel-durable-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the demo directory");
    let mut first = std::process::Command::new(std::env::current_exe().expect("own path"));
    first.arg("schedule").arg(&dir);
    if quick {
        first.arg("--quick");
    }
    let status = first.status().expect("run the first process");
    assert!(status.success(), "the first process failed");
    println!("(process 1 exited: {status})");
    deliver(&dir, unit).await;
    std::fs::remove_dir_all(&dir).expect("clean up the demo directory");
}
