//! Feature `metrics`: the wheel's `Stats` reach the application's
//! `metrics` recorder with the snapshot's values, once at once and then on every period, and
//! stop when the exporter is cancelled.
#![cfg(feature = "metrics")]

use std::time::Duration;

use tokio_wheel::Wheel;

#[path = "support/last_recorder.rs"]
mod last_recorder;
use last_recorder::{read, values};

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
