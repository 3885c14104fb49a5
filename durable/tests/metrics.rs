//! Feature `metrics`: a queue's `QueueStats` reach the application's `metrics` recorder with
//! the snapshot's values, labelled by queue.
#![cfg(feature = "metrics")]

use std::time::Duration;

#[path = "../../tests/support/last_recorder.rs"]
mod last_recorder;
use last_recorder::{read, values};
use tokio_wheel::Wheel;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queues_stats_are_exported_with_its_label() {
    use futures::StreamExt;
    use tokio_wheel_durable::{DurableQueue, Task};

    values();
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = DurableQueue::open(dir.path().join("q.redb"), &wheel)
        .await
        .unwrap();
    for i in 0..3 {
        queue.schedule(Task::new(vec![i])).await.unwrap();
    }
    queue
        .schedule(Task::new(vec![9]).after(Duration::from_secs(3600)))
        .await
        .unwrap();
    let mut deliveries = queue.deliveries();
    for _ in 0..3 {
        let d = tokio::time::timeout(Duration::from_secs(10), deliveries.next())
            .await
            .expect("a delivery")
            .unwrap();
        d.ack().await.unwrap();
    }
    let exporter = queue.export_metrics("metrics-orders", &wheel, Duration::from_millis(50));
    let queue_metric = |name: &str| read(name, "queue", "metrics-orders");
    let start = std::time::Instant::now();
    while queue_metric("tokio_wheel_queue_acked_total").is_none() {
        assert!(start.elapsed() < Duration::from_secs(10), "never exported");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = queue.stats().await.unwrap();
    assert_eq!(queue_metric("tokio_wheel_queue_acked_total"), Some(3.0));
    assert_eq!(queue_metric("tokio_wheel_queue_delivered_total"), Some(3.0));
    assert_eq!(queue_metric("tokio_wheel_queue_pending"), Some(1.0));
    assert_eq!(
        queue_metric("tokio_wheel_queue_in_flight"),
        Some(stats.in_flight as f64)
    );
    assert_eq!(queue_metric("tokio_wheel_queue_dead"), Some(0.0));
    exporter.cancel();
    let _ = exporter.await;
    queue.close().await;
}
