//! Intervals: tick spacing, missed-tick behaviours, the stream.

mod support;

use std::time::Duration;

use futures::StreamExt;
use support::assert_unpin;
use tokio::time::Instant;
use tokio_wheel::{Interval, MissedTickBehavior, Wheel};

const PERIOD: Duration = Duration::from_millis(100);

#[tokio::test(start_paused = true)]
async fn first_tick_is_immediate_then_every_period() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let mut interval = wheel.interval(PERIOD);
    for k in 0..5u32 {
        let scheduled = interval.tick().await;
        assert_eq!(scheduled, start + PERIOD * k);
        let now = Instant::now();
        assert!(
            now >= scheduled && now <= scheduled + Duration::from_millis(2),
            "tick {k} at {:?}",
            now - start
        );
    }
}

#[tokio::test(start_paused = true)]
async fn interval_at_starts_at_the_given_instant() {
    let wheel = Wheel::new();
    let start = Instant::now() + Duration::from_secs(2);
    let mut interval = wheel.interval_at(start, PERIOD);
    assert_eq!(interval.tick().await, start);
    assert!(Instant::now() >= start);
    assert_eq!(interval.tick().await, start + PERIOD);
}

/// Ticks once, stalls for 3.5 periods, then records the next three ticks' scheduled instants
/// and completion times (relative to the start).
async fn after_a_stall(behavior: MissedTickBehavior) -> Vec<(Duration, Duration)> {
    let wheel = Wheel::new();
    let start = Instant::now();
    let mut interval = wheel.interval(PERIOD);
    interval.set_missed_tick_behavior(behavior);
    assert_eq!(interval.missed_tick_behavior(), behavior);
    interval.tick().await;
    tokio::time::sleep(PERIOD * 7 / 2).await;
    let mut ticks = Vec::new();
    for _ in 0..3 {
        let scheduled = interval.tick().await;
        ticks.push((scheduled - start, start.elapsed()));
    }
    ticks
}

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

#[tokio::test(start_paused = true)]
async fn burst_catches_up_on_missed_ticks() {
    let ticks = after_a_stall(MissedTickBehavior::Burst).await;
    assert_eq!(ticks[0], (ms(100), ms(350)));
    assert_eq!(ticks[1], (ms(200), ms(350)));
    assert_eq!(ticks[2], (ms(300), ms(350)));
}

#[tokio::test(start_paused = true)]
async fn delay_restarts_the_period_from_the_late_tick() {
    let ticks = after_a_stall(MissedTickBehavior::Delay).await;
    assert_eq!(ticks[0], (ms(100), ms(350)));
    assert_eq!(ticks[1].0, ms(450));
    assert_eq!(ticks[2].0, ms(550));
}

#[tokio::test(start_paused = true)]
async fn skip_keeps_the_phase() {
    let ticks = after_a_stall(MissedTickBehavior::Skip).await;
    assert_eq!(ticks[0], (ms(100), ms(350)));
    assert_eq!(ticks[1].0, ms(400));
    assert_eq!(ticks[2].0, ms(500));
}

#[tokio::test(start_paused = true)]
async fn an_interval_is_a_stream_of_ticks() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let ticks: Vec<Instant> = wheel.interval(PERIOD).take(4).collect().await;
    assert_eq!(
        ticks,
        (0..4).map(|k| start + PERIOD * k).collect::<Vec<_>>()
    );
}

#[tokio::test(start_paused = true)]
async fn reset_restarts_the_period() {
    let wheel = Wheel::new();
    let mut interval = wheel.interval(PERIOD);
    interval.tick().await;
    tokio::time::sleep(ms(30)).await;
    interval.reset();
    let resumed = Instant::now();
    assert_eq!(interval.tick().await, resumed + PERIOD);
    assert_eq!(interval.period(), PERIOD);
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "period must be non-zero")]
async fn a_zero_period_panics_with_a_clear_message() {
    let _ = Wheel::new().interval(Duration::ZERO);
}

#[test]
fn interval_is_unpin_and_send() {
    assert_unpin::<Interval>();
    support::assert_send::<Interval>();
}
