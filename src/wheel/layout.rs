//! The shape of a wheel: how many slots each level has.

use std::time::Duration;

use super::bitmap::MAX_BITS;
use crate::error::BuildError;

/// The most slots one level may have (the width of its occupancy bitmap).
pub const MAX_SLOTS_PER_LEVEL: u32 = MAX_BITS as u32;
/// The most levels a wheel may have.
pub const MAX_LEVELS: usize = 16;

/// The shape of a wheel's cascade: the number of slots on each level, lowest first.
///
/// A deadline lands on the lowest level whose span still reaches it; when a higher slot comes
/// due, its entries cascade one level down. Deadlines beyond the top level wait in an overflow
/// list and re-enter when the top level wraps, so every layout accepts every deadline.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio_wheel::Layout;
///
/// // With a 1 ms tick the clock layout is 1000 ms → 60 s → 60 min → 24 h → 365 days.
/// let levels = Layout::clock().slots_per_level(Duration::from_millis(1)).unwrap();
/// assert_eq!(levels, vec![1000, 60, 60, 24, 365]);
///
/// assert_eq!(Layout::binary().slots_per_level(Duration::from_millis(1)).unwrap(), vec![64; 6]);
///
/// assert!(Layout::custom(&[256, 0]).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Clock,
    Binary,
    Custom(Vec<u32>),
}

/// Calendar units of the clock layout, in nanoseconds. Sub-second units are used only when a
/// second holds more ticks than one level can.
const MICROSECOND: u128 = 1_000;
const MILLISECOND: u128 = 1_000_000;
const SECOND: u128 = 1_000_000_000;
const CLOCK_UNITS: [u128; 5] = [
    SECOND,
    60 * SECOND,
    3_600 * SECOND,
    86_400 * SECOND,
    365 * 86_400 * SECOND,
];

impl Layout {
    /// The default: tick → seconds → minutes → hours → days (a year of days on the top level).
    ///
    /// Level 0 spans one second of ticks (with ticks shorter than 1/4096 s, extra millisecond
    /// or microsecond levels come first); then 60 seconds, 60 minutes, 24 hours and 365 days.
    /// Levels a tick longer than their unit makes pointless are left out.
    pub fn clock() -> Self {
        Layout { kind: Kind::Clock }
    }

    /// Six levels of 64 slots each, as in tokio's and Linux's wheels (2^36 ticks before
    /// overflow: about 2.2 years at 1 ms).
    pub fn binary() -> Self {
        Layout { kind: Kind::Binary }
    }

    /// A layout with the given slots per level, lowest level first.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidLayout`] when there are no levels or more than [`MAX_LEVELS`], when
    /// a level has fewer than 2 or more than [`MAX_SLOTS_PER_LEVEL`] slots, or when the levels
    /// together span more than `u64::MAX` ticks.
    pub fn custom(slots_per_level: &[u32]) -> Result<Self, BuildError> {
        validate(slots_per_level)?;
        Ok(Layout {
            kind: Kind::Custom(slots_per_level.to_vec()),
        })
    }

    /// The slots per level this layout has with ticks of length `tick`.
    ///
    /// # Errors
    ///
    /// [`BuildError::ZeroTick`] for a zero tick, and [`BuildError::InvalidLayout`] when the
    /// clock layout has no level left for so long a tick (longer than a year).
    pub fn slots_per_level(&self, tick: Duration) -> Result<Vec<u32>, BuildError> {
        if tick.is_zero() {
            return Err(BuildError::ZeroTick);
        }
        let levels = match &self.kind {
            Kind::Clock => clock_levels(tick.as_nanos()),
            Kind::Binary => vec![64; 6],
            Kind::Custom(levels) => levels.clone(),
        };
        validate(&levels)?;
        Ok(levels)
    }
}

impl Default for Layout {
    fn default() -> Self {
        Layout::clock()
    }
}

fn clock_levels(tick_nanos: u128) -> Vec<u32> {
    let max = u128::from(MAX_SLOTS_PER_LEVEL);
    let mut units = Vec::with_capacity(7);
    if SECOND.div_ceil(tick_nanos) > max {
        if MILLISECOND.div_ceil(tick_nanos) > max {
            units.push(MICROSECOND);
        }
        units.push(MILLISECOND);
    }
    units.extend_from_slice(&CLOCK_UNITS);

    let mut levels = Vec::with_capacity(units.len());
    let mut span = tick_nanos;
    for unit in units {
        let slots = unit.div_ceil(span);
        if slots >= 2 {
            // `slots` fits: each unit is at most 1000× (or 365×) the span below it.
            levels.push(slots as u32);
            span *= slots;
        }
    }
    levels
}

fn validate(levels: &[u32]) -> Result<(), BuildError> {
    if levels.is_empty() {
        return Err(BuildError::InvalidLayout(
            "a layout needs at least one level: give `Layout::custom` one or more, or, with \
             `Layout::clock()`, use a tick under a year (or another layout)"
                .into(),
        ));
    }
    if levels.len() > MAX_LEVELS {
        return Err(BuildError::InvalidLayout(format!(
            "{} levels; at most {MAX_LEVELS} are supported",
            levels.len()
        )));
    }
    let mut span: u64 = 1;
    for (level, &slots) in levels.iter().enumerate() {
        if !(2..=MAX_SLOTS_PER_LEVEL).contains(&slots) {
            return Err(BuildError::InvalidLayout(format!(
                "level {level} has {slots} slots; each level needs 2 to {MAX_SLOTS_PER_LEVEL}"
            )));
        }
        span = span.checked_mul(u64::from(slots)).ok_or_else(|| {
            BuildError::InvalidLayout(
                "the levels together span more than u64::MAX ticks: use fewer levels or \
                 fewer slots per level"
                    .into(),
            )
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_layout_follows_calendar_units() {
        let ms = Duration::from_millis(1);
        assert_eq!(
            Layout::clock().slots_per_level(ms).unwrap(),
            [1000, 60, 60, 24, 365]
        );
        let ten_ms = Duration::from_millis(10);
        assert_eq!(
            Layout::clock().slots_per_level(ten_ms).unwrap(),
            [100, 60, 60, 24, 365]
        );
        let minute = Duration::from_secs(60);
        assert_eq!(
            Layout::clock().slots_per_level(minute).unwrap(),
            [60, 24, 365]
        );
    }

    #[test]
    fn clock_layout_adds_sub_second_levels_for_fine_ticks() {
        let us = Duration::from_micros(1);
        assert_eq!(
            Layout::clock().slots_per_level(us).unwrap(),
            [1000, 1000, 60, 60, 24, 365]
        );
        let ns = Duration::from_nanos(1);
        assert_eq!(
            Layout::clock().slots_per_level(ns).unwrap(),
            [1000, 1000, 1000, 60, 60, 24, 365]
        );
    }

    #[test]
    fn clock_layout_rounds_uneven_ticks_up() {
        // 7 ms does not divide a second: 143 slots cover 1.001 s, never less than the unit.
        let levels = Layout::clock()
            .slots_per_level(Duration::from_millis(7))
            .unwrap();
        assert_eq!(levels[0], 143);
    }

    #[test]
    fn invalid_layouts_say_why() {
        let err = |levels: &[u32]| Layout::custom(levels).unwrap_err().to_string();
        assert!(err(&[]).contains("at least one level"));
        assert!(err(&[64, 1]).contains("level 1 has 1 slots"));
        assert!(err(&[64, 5000]).contains("level 1 has 5000 slots"));
        assert!(err(&[2; 17]).contains("17 levels"));
        assert!(err(&[4096; 6]).contains("u64::MAX"));
        assert_eq!(
            Layout::clock().slots_per_level(Duration::ZERO),
            Err(BuildError::ZeroTick)
        );
        let two_years = Duration::from_secs(2 * 365 * 86_400);
        assert!(matches!(
            Layout::clock().slots_per_level(two_years),
            Err(BuildError::InvalidLayout(_))
        ));
    }
}
