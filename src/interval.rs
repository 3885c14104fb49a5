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

use crate::clock::saturating_add;
use crate::sleep::{Sleep, Woke};

/// Lateness below which a tick counts as on time, as in tokio (raised to the wheel's tick when
/// that is longer, so rounding alone never counts as a missed tick).
const MISSED_TICK_GRACE: Duration = Duration::from_millis(5);

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
        let grace = MISSED_TICK_GRACE.max(sleep.wheel_tick());
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

    fn poll_tick_woke(&mut self, cx: &mut Context<'_>) -> Poll<(Instant, Woke)> {
        let woke = ready!(self.sleep.poll_woke(cx));
        let scheduled = self.sleep.deadline();
        let now = Instant::now();
        let next = if now > saturating_add(scheduled, self.grace) {
            match self.missed_tick_behavior {
                MissedTickBehavior::Delay => saturating_add(now, self.period),
                MissedTickBehavior::Skip => {
                    let behind = (now - scheduled).as_nanos() % self.period.as_nanos();
                    saturating_add(now, self.period - Duration::from_nanos(behind as u64))
                }
                _ => saturating_add(scheduled, self.period),
            }
        } else {
            saturating_add(scheduled, self.period)
        };
        Pin::new(&mut self.sleep).reset(next);
        Poll::Ready((scheduled, woke))
    }

    /// Restarts the interval: the next tick is one period from now.
    pub fn reset(&mut self) {
        self.reset_at(saturating_add(Instant::now(), self.period));
    }

    /// Moves the next tick to `deadline`; later ticks follow from it.
    pub fn reset_at(&mut self, deadline: Instant) {
        Pin::new(&mut self.sleep).reset(deadline);
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
