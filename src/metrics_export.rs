//! Feature `metrics`: [`Stats`] and (with `durable`) [`QueueStats`] published through the
//! [`metrics`](::metrics) crate's facade, so an application's own exporter (Prometheus,
//! StatsD, OpenTelemetry …) serves them. Nothing is recorded unless the application installed
//! a recorder.
//!
//! Names, all prefixed `tokio_wheel_`: the running totals of a snapshot are counters (set to
//! the snapshot's value with `absolute`, so they only grow) with the suffix `_total`; the levels
//! are gauges. Every metric carries the label `wheel` (the wheel's
//! [`name`](crate::Builder::name)) or `queue` (the label the caller gives a queue).

use std::time::Duration;

use ::metrics::{counter, gauge};

use crate::job::{JobHandle, Schedule};
use crate::{Stats, Wheel};

impl Stats {
    /// Publishes this snapshot through the `metrics` facade, labelled `wheel = name`.
    ///
    /// Gauges: `tokio_wheel_pending`, `tokio_wheel_expirations_backlog`,
    /// `tokio_wheel_actors`, `tokio_wheel_max_lateness_seconds`. Counters:
    /// `tokio_wheel_{inserted,fired,cancelled,commands,rescheduled,cascades,wakeups,job_panics,periodic_runs}_total`.
    pub fn record_metrics(&self) {
        let wheel = self.name.clone();
        let gauges = [
            ("tokio_wheel_pending", self.pending as f64),
            (
                "tokio_wheel_expirations_backlog",
                self.expirations_backlog as f64,
            ),
            ("tokio_wheel_actors", self.actors as f64),
            (
                "tokio_wheel_max_lateness_seconds",
                self.max_lateness.as_secs_f64(),
            ),
        ];
        for (name, value) in gauges {
            gauge!(name, "wheel" => wheel.clone()).set(value);
        }
        let counters = [
            ("tokio_wheel_inserted_total", self.inserted),
            ("tokio_wheel_fired_total", self.fired),
            ("tokio_wheel_cancelled_total", self.cancelled),
            ("tokio_wheel_commands_total", self.commands),
            ("tokio_wheel_rescheduled_total", self.rescheduled),
            ("tokio_wheel_cascades_total", self.cascades),
            ("tokio_wheel_wakeups_total", self.wakeups),
            ("tokio_wheel_job_panics_total", self.job_panics),
            ("tokio_wheel_periodic_runs_total", self.periodic_runs),
        ];
        for (name, value) in counters {
            counter!(name, "wheel" => wheel.clone()).absolute(value);
        }
    }
}

impl Wheel {
    /// Publishes [`stats`](Wheel::stats) through the `metrics` facade every `every` (see
    /// [`Stats::record_metrics`]), once at once and then on a fixed delay, until the returned
    /// handle is cancelled or the wheel shuts down. The exporter is a job on this wheel: it
    /// costs one timer.
    ///
    /// # Panics
    ///
    /// If `every` is zero.
    pub fn export_metrics(&self, every: Duration) -> JobHandle<()> {
        assert!(
            !every.is_zero(),
            "export_metrics: the period must not be zero"
        );
        self.stats().record_metrics();
        let shared = self.inner.shared.clone();
        self.spawn_every(every, Schedule::FixedDelay, move || {
            let stats = Stats::from_shared(&shared);
            async move { stats.record_metrics() }
        })
    }
}

#[cfg(feature = "durable")]
mod queue {
    use std::time::Duration;

    use ::metrics::{counter, gauge};

    use crate::Wheel;
    use crate::durable::{DurableQueue, QueueStats};
    use crate::job::{JobHandle, Schedule};

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
}
