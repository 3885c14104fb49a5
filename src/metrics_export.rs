//! Feature `metrics`: [`Stats`] published through the [`metrics`] crate's facade, so an application's own exporter (Prometheus,
//! StatsD, OpenTelemetry …) serves them. Nothing is recorded unless the application installed
//! a recorder.
//!
//! Names, all prefixed `tokio_wheel_`: the running totals of a snapshot are counters (set to
//! the snapshot's value with `absolute`, so they only grow) with the suffix `_total`; the levels
//! are gauges. Every metric carries the label `wheel` (the wheel's
//! [`name`](crate::Builder::name)). The queue crate (`tokio-wheel-durable`, feature `metrics`)
//! publishes its `QueueStats` the same way, prefixed `tokio_wheel_queue_`.

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
