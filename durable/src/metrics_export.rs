//! Feature `metrics`: [`QueueStats`] published through the [`metrics`](::metrics) crate's
//! facade, so an application's own exporter (Prometheus, StatsD, OpenTelemetry …) serves them.
//! Nothing is recorded unless the application installed a recorder.
//!
//! Names, all prefixed `tokio_wheel_queue_`: running totals are counters (set with `absolute`,
//! so they only grow) with the suffix `_total`; the levels are gauges. Every metric carries the
//! label `queue` (the label the caller gives the queue). The wheel's own `Stats` are exported by
//! `tokio-wheel`'s feature `metrics`.

use std::time::Duration;

use ::metrics::{counter, gauge};

use tokio_wheel::{JobHandle, Schedule, Wheel};

use crate::{DurableQueue, QueueStats};

impl QueueStats {
    /// Publishes this snapshot through the `metrics` facade, labelled `queue = queue`.
    ///
    /// Gauges: `tokio_wheel_queue_{pending,in_flight,dead}` and
    /// `tokio_wheel_queue_lateness_{p50,p99}_seconds`. Counters:
    /// `tokio_wheel_queue_{delivered,acked,retried,dead_lettered,expired,returned}_total`.
    pub fn record_metrics(&self, queue: &str) {
        let label = queue.to_owned();
        let gauges = [
            ("tokio_wheel_queue_pending", self.pending as f64),
            ("tokio_wheel_queue_in_flight", self.in_flight as f64),
            ("tokio_wheel_queue_dead", self.dead as f64),
            (
                "tokio_wheel_queue_lateness_p50_seconds",
                self.lateness_p50.as_secs_f64(),
            ),
            (
                "tokio_wheel_queue_lateness_p99_seconds",
                self.lateness_p99.as_secs_f64(),
            ),
        ];
        for (name, value) in gauges {
            gauge!(name, "queue" => label.clone()).set(value);
        }
        let counters = [
            ("tokio_wheel_queue_delivered_total", self.delivered),
            ("tokio_wheel_queue_acked_total", self.acked),
            ("tokio_wheel_queue_retried_total", self.retried),
            ("tokio_wheel_queue_dead_lettered_total", self.dead_lettered),
            ("tokio_wheel_queue_expired_total", self.expired),
            ("tokio_wheel_queue_returned_total", self.returned),
        ];
        for (name, value) in counters {
            counter!(name, "queue" => label.clone()).absolute(value);
        }
    }
}

impl DurableQueue {
    /// Publishes [`stats`](DurableQueue::stats) through the `metrics` facade every
    /// `every`, labelled `queue = label` (see [`QueueStats::record_metrics`]), as a job on
    /// `wheel` on a fixed delay, until the returned handle is cancelled, the wheel shuts
    /// down or the queue is closed. A failed read (the store unreachable for a moment)
    /// skips that round and is logged at `debug`.
    ///
    /// # Panics
    ///
    /// If `every` is zero.
    pub fn export_metrics(&self, label: &str, wheel: &Wheel, every: Duration) -> JobHandle<()> {
        assert!(
            !every.is_zero(),
            "export_metrics: the period must not be zero"
        );
        let (queue, label) = (self.clone(), label.to_owned());
        wheel.spawn_every(every, Schedule::FixedDelay, move || {
            let (queue, label) = (queue.clone(), label.clone());
            async move {
                match queue.stats().await {
                    Ok(stats) => stats.record_metrics(&label),
                    Err(error) => {
                        tracing::debug!(queue = %label, %error, "metrics: stats not read");
                    }
                }
            }
        })
    }
}
