//! Recurring tasks on a durable queue: a cron expression with seconds and a fixed period,
//! each occurrence delivered once as an ordinary delivery, surviving restarts.
//!
//! Run: `cargo run -p tokio-wheel-durable --example recurring` (embedded store in a temporary
//! directory), or with a Redis URL to share the schedules with every process that runs it:
//! `cargo run -p tokio-wheel-durable --features redis --example recurring -- redis://127.0.0.1:6379/`.
//! `-- --quick` runs for 2.5 s instead of 10 s.

use std::time::{Duration, Instant, UNIX_EPOCH};

use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{CatchUp, DurableQueue, Error, Recurring};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let url = args.iter().find(|a| a.starts_with("redis"));
    let wheel = Wheel::new();
    let dir = std::env::temp_dir().join(format!("tokio-wheel-recurring-{}", std::process::id()));
    let queue = match url {
        #[cfg(feature = "redis")]
        Some(url) => {
            DurableQueue::builder()
                .redis(url, "recurring-example", &wheel)
                .await?
        }
        _ => {
            std::fs::create_dir_all(&dir).map_err(|e| Error::Io(e.to_string()))?;
            DurableQueue::open(dir.join("tasks.redb"), &wheel).await?
        }
    };

    // Declared at every start: the same definition again keeps the schedule as it is.
    queue
        .schedule_recurring(
            Recurring::cron("*/2 * * * * *")? // every second second, on the second
                .id("report")
                .payload(b"build the report".to_vec()),
        )
        .await?;
    queue
        .schedule_recurring(
            Recurring::every(Duration::from_millis(700))
                .id("sweep")
                .payload(b"sweep expired sessions".to_vec())
                .catch_up(CatchUp::Latest), // missed while down: one run stands for them
        )
        .await?;

    let run_for = if quick {
        Duration::from_millis(2_500)
    } else {
        Duration::from_secs(10)
    };
    let start = Instant::now();
    let mut deliveries = queue.deliveries();
    while let Ok(Some(delivery)) =
        tokio::time::timeout(run_for.saturating_sub(start.elapsed()), deliveries.next()).await
    {
        let due = delivery
            .due()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        println!(
            "{:>6} ms  {:<28} due {due}  {}",
            start.elapsed().as_millis(),
            delivery.id(),
            String::from_utf8_lossy(delivery.payload())
        );
        delivery.ack().await?;
    }
    let stats = queue.stats().await?;
    println!(
        "delivered {} occurrences; late p50 {:?}, p99 {:?}",
        stats.delivered, stats.lateness_p50, stats.lateness_p99
    );
    drop(deliveries);
    queue.close().await;
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
