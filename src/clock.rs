//! Conversion between `tokio::time::Instant` and wheel ticks.

use std::time::Duration;

use tokio::time::Instant;

/// The largest tick the shared timer state can hold (61 bits); ticks saturate to it.
pub(crate) const MAX_TICK: u64 = (1 << 61) - 1;

/// How far ahead an unrepresentable deadline (e.g. `now + Duration::MAX`) is placed: about 30
/// years, as tokio does. Nothing fires early in any process that lives less than that.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// Maps instants to ticks of fixed length counted from an origin.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    origin: Instant,
    tick_nanos: u64,
}

impl Clock {
    pub(crate) fn new(origin: Instant, tick: Duration) -> Self {
        let tick_nanos = u64::try_from(tick.as_nanos()).unwrap_or(u64::MAX).max(1);
        Clock { origin, tick_nanos }
    }

    /// The tick at or after `deadline`: rounding up is what makes timers never fire early.
    pub(crate) fn deadline_tick(&self, deadline: Instant) -> u64 {
        let nanos = deadline.saturating_duration_since(self.origin).as_nanos();
        // 64-bit division when it fits (584 years of nanoseconds): 128-bit is far slower.
        let ticks = match u64::try_from(nanos) {
            Ok(nanos) => nanos.div_ceil(self.tick_nanos),
            Err(_) => {
                u64::try_from(nanos.div_ceil(u128::from(self.tick_nanos))).unwrap_or(u64::MAX)
            }
        };
        ticks.min(MAX_TICK)
    }

    /// The last tick that has fully begun at `now`.
    pub(crate) fn tick_at(&self, now: Instant) -> u64 {
        let nanos = now.saturating_duration_since(self.origin).as_nanos();
        let ticks = match u64::try_from(nanos) {
            Ok(nanos) => nanos / self.tick_nanos,
            Err(_) => u64::try_from(nanos / u128::from(self.tick_nanos)).unwrap_or(u64::MAX),
        };
        ticks.min(MAX_TICK)
    }

    pub(crate) fn now_tick(&self) -> u64 {
        self.tick_at(Instant::now())
    }

    /// The instant tick `tick` begins (saturating far in the future).
    pub(crate) fn instant_of(&self, tick: u64) -> Instant {
        let nanos = u128::from(tick) * u128::from(self.tick_nanos);
        let offset = Duration::from_secs(u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX))
            + Duration::from_nanos((nanos % 1_000_000_000) as u64);
        self.origin
            .checked_add(offset)
            .unwrap_or_else(|| far_future(self.origin))
    }

    pub(crate) fn tick(&self) -> Duration {
        Duration::from_nanos(self.tick_nanos)
    }
}

/// `now + duration`, saturating to about 30 years ahead instead of overflowing.
pub(crate) fn deadline_after(duration: Duration) -> Instant {
    saturating_add(Instant::now(), duration)
}

/// `at + duration`, saturating to about 30 years after `at` instead of overflowing.
pub(crate) fn saturating_add(at: Instant, duration: Duration) -> Instant {
    at.checked_add(duration).unwrap_or_else(|| far_future(at))
}

fn far_future(from: Instant) -> Instant {
    from.checked_add(FAR_FUTURE).unwrap_or(from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn deadlines_round_up_and_now_rounds_down() {
        let origin = Instant::now();
        let clock = Clock::new(origin, Duration::from_millis(10));
        assert_eq!(clock.deadline_tick(origin), 0);
        assert_eq!(clock.deadline_tick(origin + Duration::from_millis(1)), 1);
        assert_eq!(clock.deadline_tick(origin + Duration::from_millis(10)), 1);
        assert_eq!(clock.deadline_tick(origin + Duration::from_millis(11)), 2);
        assert_eq!(clock.tick_at(origin + Duration::from_millis(19)), 1);
        assert_eq!(clock.instant_of(3), origin + Duration::from_millis(30));
    }

    #[tokio::test(start_paused = true)]
    async fn uneven_ticks_never_round_a_deadline_early() {
        let origin = Instant::now();
        let clock = Clock::new(origin, Duration::from_nanos(7_777));
        for nanos in [1u64, 7_776, 7_777, 7_778, 1_000_000, 123_456_789] {
            let deadline = origin + Duration::from_nanos(nanos);
            assert!(clock.instant_of(clock.deadline_tick(deadline)) >= deadline);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn extremes_saturate() {
        let origin = Instant::now();
        let clock = Clock::new(origin, Duration::from_nanos(1));
        let far = deadline_after(Duration::MAX);
        assert!(far > origin + Duration::from_secs(86_400 * 365 * 29));
        assert!(clock.deadline_tick(far) <= MAX_TICK);
        assert!(clock.instant_of(u64::MAX) > origin);
        assert_eq!(clock.deadline_tick(origin - Duration::from_secs(5)), 0);
    }
}
