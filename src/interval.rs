//! [`Interval`]: ticks at a fixed period.
//!
//! ```
//! use std::time::Duration;
//! use tokio::time::Instant;
//! use tokio_wheel::Wheel;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let wheel = Wheel::new();
//! let start = Instant::now();
//! let mut interval = wheel.interval(Duration::from_millis(10));
//! interval.tick().await; // the first tick completes at once
//! interval.tick().await;
//! interval.tick().await;
//! assert!(start.elapsed() >= Duration::from_millis(20));
//! # }
//! ```

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures::Stream;
use tokio::time::{Instant, MissedTickBehavior};

use crate::sleep::{Sleep, Woke};
use crate::timer::clock::saturating_add;

/// Lateness below which a tick counts as on time, as in tokio.
const MISSED_TICK_GRACE: Duration = Duration::from_millis(5);

/// The grace on a wheel with ticks of `tick`: tokio's, raised to the tick when that is longer,
/// so rounding alone never counts as a missed tick.
fn missed_tick_grace(tick: Duration) -> Duration {
    MISSED_TICK_GRACE.max(tick)
}

/// When the tick after the one scheduled at `scheduled` is due, for a tick taken at `now`:
/// tokio's `Interval` rules. A tick taken within `grace` of its schedule is on time, and the
/// next follows one period later; otherwise `behavior` decides.
pub(crate) fn next_tick(
    scheduled: Instant,
    now: Instant,
    period: Duration,
    grace: Duration,
    behavior: MissedTickBehavior,
) -> Instant {
    if now <= saturating_add(scheduled, grace) {
        return saturating_add(scheduled, period);
    }
    match behavior {
        MissedTickBehavior::Delay => saturating_add(now, period),
        MissedTickBehavior::Skip => {
            let behind = (now - scheduled).as_nanos() % period.as_nanos();
            saturating_add(now, period - Duration::from_nanos(behind as u64))
        }
        _ => saturating_add(scheduled, period),
    }
}

/// Ticks every period; made by [`Wheel::interval`](crate::Wheel::interval) and
/// [`Wheel::interval_at`](crate::Wheel::interval_at).
///
/// It behaves as tokio's `Interval`, including [`MissedTickBehavior`] (default `Burst`), and is
/// also a [`Stream`] of tick instants. It is [`Unpin`]. Once the wheel shuts down, `tick()`
/// completes at once and the stream ends.
#[derive(Debug)]
pub struct Interval {
    sleep: Sleep,
    period: Duration,
    missed_tick_behavior: MissedTickBehavior,
    grace: Duration,
    ended: bool,
}

impl Interval {
    pub(crate) fn new(sleep: Sleep, period: Duration) -> Interval {
        assert!(
            !period.is_zero(),
            "tokio-wheel: an interval's period must be non-zero"
        );
        let grace = missed_tick_grace(sleep.wheel().shared.clock.tick());
        Interval {
            sleep,
            period,
            missed_tick_behavior: MissedTickBehavior::default(),
            grace,
            ended: false,
        }
    }

    /// Completes at the next tick and returns the instant it was scheduled for.
    pub async fn tick(&mut self) -> Instant {
        poll_fn(|cx| self.poll_tick(cx)).await
    }

    /// Polls for the next tick, returning its scheduled instant.
    pub fn poll_tick(&mut self, cx: &mut Context<'_>) -> Poll<Instant> {
        self.poll_tick_woke(cx).map(|(scheduled, _)| scheduled)
    }

    /// Polls for the next tick: its scheduled instant, and whether it came because the wheel
    /// stopped.
    pub(crate) fn poll_tick_woke(&mut self, cx: &mut Context<'_>) -> Poll<(Instant, Woke)> {
        let woke = ready!(self.sleep.poll_woke(cx));
        let scheduled = self.sleep.deadline();
        let next = next_tick(
            scheduled,
            Instant::now(),
            self.period,
            self.grace,
            self.missed_tick_behavior,
        );
        Pin::new(&mut self.sleep).reset(next);
        Poll::Ready((scheduled, woke))
    }

    /// Restarts the interval: the next tick is one period from now.
    pub fn reset(&mut self) {
        self.reset_at(saturating_add(Instant::now(), self.period));
    }

    /// Restarts the interval with a tick at once: the next tick completes now, and later
    /// ticks follow from it (tokio's `Interval::reset_immediately`).
    pub fn reset_immediately(&mut self) {
        self.reset_at(Instant::now());
    }

    /// Restarts the interval: the next tick is `after` from now, and later ticks follow from
    /// it (tokio's `Interval::reset_after`). Saturates, as every deadline here does.
    pub fn reset_after(&mut self, after: Duration) {
        self.reset_at(saturating_add(Instant::now(), after));
    }

    /// Moves the next tick to `deadline`; later ticks follow from it.
    pub fn reset_at(&mut self, deadline: Instant) {
        Pin::new(&mut self.sleep).reset(deadline);
    }

    /// When the next tick is scheduled.
    pub(crate) fn next_deadline(&self) -> Instant {
        self.sleep.deadline()
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// What happens when ticks are missed.
    pub fn missed_tick_behavior(&self) -> MissedTickBehavior {
        self.missed_tick_behavior
    }

    /// Sets what happens when ticks are missed.
    pub fn set_missed_tick_behavior(&mut self, behavior: MissedTickBehavior) {
        self.missed_tick_behavior = behavior;
    }
}

impl Stream for Interval {
    type Item = Instant;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Instant>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let (scheduled, woke) = ready!(this.poll_tick_woke(cx));
        if woke == Woke::Shutdown {
            this.ended = true;
            return Poll::Ready(None);
        }
        Poll::Ready(Some(scheduled))
    }
}
