//! Feature `metrics`: the wheel's `Stats` and a queue's `QueueStats` reach the application's
//! `metrics` recorder with the snapshot's values, once at once and then on every period, and
//! stop when the exporter is cancelled.
#![cfg(feature = "metrics")]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString,
    Unit,
};
use tokio_wheel::Wheel;

/// The last value of each metric, by `name{label=value,…}`.
type Values = Arc<Mutex<HashMap<String, f64>>>;

/// A recorder keeping the last value each metric was given: what a scrape would read.
struct Last(Values);

/// One metric's place in [`Last`].
struct Cell {
    key: String,
    values: Values,
}

impl Cell {
    fn update(&self, f: impl FnOnce(f64) -> f64) {
        let mut values = self.values.lock().unwrap();
        let value = values.entry(self.key.clone()).or_insert(0.0);
        *value = f(*value);
    }
}

impl CounterFn for Cell {
    fn increment(&self, n: u64) {
        self.update(|v| v + n as f64);
    }
    fn absolute(&self, n: u64) {
        self.update(|v| v.max(n as f64));
    }
}

impl GaugeFn for Cell {
    fn increment(&self, n: f64) {
        self.update(|v| v + n);
    }
    fn decrement(&self, n: f64) {
        self.update(|v| v - n);
    }
    fn set(&self, n: f64) {
        self.update(|_| n);
    }
}

impl Last {
    fn cell(&self, key: &Key) -> Arc<Cell> {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        Arc::new(Cell {
            key: format!("{}{{{}}}", key.name(), labels.join(",")),
            values: self.0.clone(),
        })
    }
}

impl Recorder for Last {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.cell(key))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// One recorder for the whole test binary (a global recorder can be set once); each test
/// uses labels of its own.
fn values() -> &'static Values {
    static VALUES: OnceLock<Values> = OnceLock::new();
    VALUES.get_or_init(|| {
        let values = Values::default();
        metrics::set_global_recorder(Last(values.clone())).expect("the only recorder");
        values
    })
}

/// The value of metric `name` labelled `label = value`.
fn read(name: &str, label: &str, value: &str) -> Option<f64> {
    values()
        .lock()
        .unwrap()
        .get(&format!("{name}{{{label}={value}}}"))
        .copied()
}

fn wheel_metric(name: &str) -> f64 {
    read(name, "wheel", "metrics-wheel").unwrap_or_else(|| panic!("{name} not recorded"))
}

#[tokio::test(start_paused = true)]
async fn the_wheels_stats_are_exported_every_period_and_add_up() {
    values();
    let wheel = Wheel::builder().name("metrics-wheel").build();
    for _ in 0..10 {
        wheel.sleep(Duration::from_millis(5)).await;
    }
    let far: Vec<_> = (0..3)
        .map(|_| Box::pin(wheel.sleep(Duration::from_secs(3600))))
        .collect();
    let mut polled = far;
    for sleep in &mut polled {
        // Register them with the actor.
        assert!(futures::poll!(sleep.as_mut()).is_pending());
    }
    for _ in 0..5 {
        let mut cancelled = Box::pin(wheel.sleep(Duration::from_secs(60)));
        assert!(futures::poll!(cancelled.as_mut()).is_pending());
    }
    wheel.flush().await;
    let stats = wheel.stats();
    assert_eq!((stats.fired, stats.pending), (10, 3));

    let exporter = wheel.export_metrics(Duration::from_secs(1));
    // Recorded at once, with the snapshot's values.
    let inserted = wheel_metric("tokio_wheel_inserted_total");
    let fired = wheel_metric("tokio_wheel_fired_total");
    let cancelled = wheel_metric("tokio_wheel_cancelled_total");
    let pending = wheel_metric("tokio_wheel_pending");
    assert_eq!((fired, pending), (10.0, 3.0));
    assert_eq!(cancelled, stats.cancelled as f64);
    assert_eq!(inserted, fired + cancelled + pending);
    assert_eq!(wheel_metric("tokio_wheel_actors"), stats.actors as f64);

    // More work: the next period's export shows it.
    for _ in 0..7 {
        wheel.sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        wheel_metric("tokio_wheel_fired_total"),
        10.0,
        "not yet exported"
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let fired = wheel_metric("tokio_wheel_fired_total");
    // The exporter's own run is a fired timer too.
    assert!(fired >= 17.0, "{fired}");
    assert_eq!(
        wheel_metric("tokio_wheel_periodic_runs_total"),
        wheel.stats().periodic_runs as f64
    );

    // Cancelled: nothing more is exported.
    exporter.cancel();
    let _ = exporter.await;
    for _ in 0..4 {
        wheel.sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(wheel_metric("tokio_wheel_fired_total"), fired);
    drop(polled);
}

#[tokio::test]
#[should_panic(expected = "must not be zero")]
async fn a_zero_export_period_is_refused() {
    let wheel = Wheel::new();
    drop(wheel.export_metrics(Duration::ZERO));
}

#[cfg(feature = "durable")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queues_stats_are_exported_with_its_label() {
    use futures::StreamExt;
    use tokio_wheel::durable::{DurableQueue, Task};

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
