//! Time as the actor and the handles see it: nanoseconds since the wheel's origin, and ticks.
//!
//! A deadline is kept exact, as a `u64` count of nanoseconds since the origin (an
//! [`Instant`] taken when the wheel was built, from the runtime's clock, which may be paused).
//! The wheel files it under its tick, rounded up; the actor fires it once the clock reaches
//! the exact deadline. Deadlines past [`NEVER`] (73 years after the origin) are beyond the
//! range: they never fire, rather than firing at the range's end.

use std::time::Duration;

use tokio::time::Instant;

/// The offset that means "never": 2^61 − 1 ns, about 73 years. Every later deadline maps to it,
/// and the clock never reaches it.
pub(crate) const NEVER: u64 = (1 << 61) - 1;

/// The tick of a deadline that never comes: the wheel parks it beyond every real tick.
pub(crate) const NEVER_TICK: u64 = u64::MAX;

/// How far ahead an unrepresentable `Instant` (e.g. `now + Duration::MAX`) is placed: about
/// 1 000 years — past the wheel's range ([`NEVER`], 73 years), so such a deadline never fires.
/// (tokio places it 30 years ahead, and fires it then: a `Duration::MAX` sleep is not meant to
/// end.)
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 1_000);
const _: () = assert!(FAR_FUTURE.as_nanos() > NEVER as u128);

/// The longest tokio's own timer rounds a wake-up up: its millisecond grid.
const DRIVER_GRID: u64 = 1_000_000;

/// Maps instants to nanosecond offsets and ticks of fixed length, counted from an origin.
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

    /// Nanoseconds from the origin to `at`: 0 for instants before the origin, [`NEVER`] for
    /// instants at or past the range.
    pub(crate) fn offset(&self, at: Instant) -> u64 {
        let nanos = at.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(nanos).map_or(NEVER, |nanos| nanos.min(NEVER))
    }

    /// Like [`offset`](Self::offset), but negative for instants before the origin, so the
    /// instant can be given back exactly ([`instant_at`](Self::instant_at)).
    pub(crate) fn signed_offset(&self, at: Instant) -> i64 {
        if at >= self.origin {
            self.offset(at) as i64
        } else {
            let before = (self.origin - at).as_nanos();
            i64::try_from(before).map_or(i64::MIN, |before| -before)
        }
    }

    /// The instant at a signed offset.
    pub(crate) fn instant_at(&self, offset: i64) -> Instant {
        match u64::try_from(offset) {
            Ok(offset) => self.instant(offset),
            Err(_) => self
                .origin
                .checked_sub(Duration::from_nanos(offset.unsigned_abs()))
                .unwrap_or(self.origin),
        }
    }

    /// The signed offset of `after` from now: [`signed_offset`](Self::signed_offset) of
    /// `now + after`, saturating at [`NEVER`] as a far-future instant does, in integer
    /// arithmetic (one clock read; no `Instant` sum to build and take apart again).
    pub(crate) fn signed_offset_after(&self, after: Duration) -> i64 {
        let now = i128::from(self.signed_offset(Instant::now()));
        (now + after.as_nanos().min(u128::from(NEVER)) as i128).min(i128::from(NEVER)) as i64
    }

    /// The offset of now; always short of [`NEVER`].
    pub(crate) fn now(&self) -> u64 {
        self.offset(Instant::now()).min(NEVER - 1)
    }

    /// The tick a deadline is filed under: rounded up, so a tick never starts before any
    /// deadline filed in it. [`NEVER`] maps to [`NEVER_TICK`].
    pub(crate) fn tick_of(&self, offset: u64) -> u64 {
        if offset >= NEVER {
            NEVER_TICK
        } else {
            offset.div_ceil(self.tick_nanos)
        }
    }

    /// The last tick that has fully begun at `offset`.
    pub(crate) fn tick_at(&self, offset: u64) -> u64 {
        offset / self.tick_nanos
    }

    /// The offset at which tick `tick` begins (saturating at [`NEVER`]).
    pub(crate) fn tick_start(&self, tick: u64) -> u64 {
        tick.checked_mul(self.tick_nanos)
            .map_or(NEVER, |start| start.min(NEVER))
    }

    /// Where the actor may start looking at tick `tick`'s timers by their exact deadlines.
    ///
    /// Tokio's timer rounds every wake-up up to its own millisecond grid, whose phase the wheel
    /// cannot know. Waking at the tick's start would round a deadline twice (up to the tick,
    /// then up to tokio's grid); waking up to one grid step (or one tick, if shorter) earlier
    /// and firing each timer once the clock passes its exact deadline rounds it once, as a
    /// tokio `Sleep` for the same deadline would be.
    pub(crate) fn window_start(&self, tick: u64) -> u64 {
        let start = self.tick_start(tick);
        if start >= NEVER {
            return NEVER;
        }
        let lead = self.tick_nanos.min(DRIVER_GRID);
        (start + 1).saturating_sub(lead)
    }

    /// The instant at `offset` (saturating far in the future).
    pub(crate) fn instant(&self, offset: u64) -> Instant {
        self.origin
            .checked_add(Duration::from_nanos(offset))
            .unwrap_or_else(|| far_future(self.origin))
    }

    pub(crate) fn tick(&self) -> Duration {
        Duration::from_nanos(self.tick_nanos)
    }
}

/// `now + duration`, saturating to about 1 000 years ahead (never, for the wheel) instead of
/// overflowing.
pub(crate) fn deadline_after(duration: Duration) -> Instant {
    saturating_add(Instant::now(), duration)
}

/// `at + duration`, saturating to about 1 000 years after `at` instead of overflowing.
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
    async fn an_offset_after_now_is_the_offset_of_the_instant() {
        let origin = Instant::now();
        let clock = Clock::new(origin, Duration::from_millis(1));
        tokio::time::advance(Duration::from_millis(3)).await;
        for after in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_secs(30),
            Duration::from_secs(86_400 * 365 * 80),
            Duration::MAX,
        ] {
            let via_instant = clock.signed_offset(deadline_after(after));
            assert_eq!(clock.signed_offset_after(after), via_instant, "{after:?}");
        }
        // Before the origin (a clock behind the wheel's): exact and negative.
        let early = Clock::new(origin + Duration::from_secs(10), Duration::from_millis(1));
        assert_eq!(
            early.signed_offset_after(Duration::from_secs(1)),
            early.signed_offset(deadline_after(Duration::from_secs(1)))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn deadlines_round_up_and_now_rounds_down() {
        let origin = Instant::now();
        let clock = Clock::new(origin, Duration::from_millis(10));
        let ms = |n| clock.offset(origin + Duration::from_millis(n));
        assert_eq!(clock.tick_of(ms(0)), 0);
        assert_eq!(clock.tick_of(ms(1)), 1);
        assert_eq!(clock.tick_of(ms(10)), 1);
        assert_eq!(clock.tick_of(ms(11)), 2);
        assert_eq!(clock.tick_at(ms(19)), 1);
        assert_eq!(
            clock.instant(clock.tick_start(3)),
            origin + Duration::from_millis(30)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn uneven_ticks_never_round_a_deadline_early() {
        let origin = Instant::now();
        let clock = Clock::new(origin, Duration::from_nanos(7_777));
        for nanos in [1u64, 7_776, 7_777, 7_778, 1_000_000, 123_456_789] {
            let offset = clock.offset(origin + Duration::from_nanos(nanos));
            assert!(clock.tick_start(clock.tick_of(offset)) >= offset);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_range_is_never() {
        let origin = Instant::now();
        let clock = Clock::new(origin, Duration::from_nanos(1));
        let century = origin + Duration::from_secs(100 * 365 * 86_400);
        assert_eq!(clock.offset(century), NEVER);
        assert_eq!(clock.tick_of(NEVER), NEVER_TICK);
        assert!(clock.now() < NEVER);
        let far = deadline_after(Duration::MAX);
        assert!(far > origin + Duration::from_secs(86_400 * 365 * 999));
        assert_eq!(
            clock.offset(far),
            NEVER,
            "Duration::MAX is past the range: never"
        );
        assert_eq!(clock.offset(origin - Duration::from_secs(5)), 0);
        let past = origin - Duration::from_secs(5);
        assert_eq!(clock.instant_at(clock.signed_offset(past)), past);
        assert_eq!(clock.signed_offset(century), NEVER as i64);
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_opens_one_grid_step_or_one_tick_before_a_tick() {
        let origin = Instant::now();
        let ms = Clock::new(origin, Duration::from_millis(1));
        assert_eq!(ms.window_start(5), 4_000_001);
        let coarse = Clock::new(origin, Duration::from_millis(10));
        assert_eq!(coarse.window_start(2), 19_000_001);
        let fine = Clock::new(origin, Duration::from_micros(100));
        assert_eq!(fine.window_start(10), 900_001);
        assert_eq!(ms.window_start(NEVER_TICK), NEVER);
    }
}
