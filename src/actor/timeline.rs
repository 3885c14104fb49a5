//! When an actor wakes and which of its timers are due: the wheel, driven by exact deadlines.
//!
//! Every machine files timers by id at an exact deadline (nanoseconds since the wheel's origin);
//! the [`Timeline`] files each under its tick in the cascade and decides when the actor must
//! next wake. Rounding to ticks batches the actor's work; firing by exact deadline keeps a timer
//! from being rounded twice. The timeline wakes the actor when the next tick's window opens
//! ([`Clock::window_start`]), hands out the timers whose exact deadline has passed, and parks
//! the rest of that tick until they are due.

use crate::timer::clock::{Clock, NEVER, NEVER_TICK};
use crate::wheel::cascade::Cascade;

/// What a machine found when the timeline showed it a timer whose tick came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It is over (fired, completed or cancelled): the timeline forgets it.
    Done,
    /// It is still armed, for this exact deadline (postponed, or due later in its tick).
    Later(u64),
}

/// Cumulative counts of a timeline's moves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Moves {
    pub(crate) cascades: u64,
    pub(crate) refiled: u64,
}

/// The cascade plus the clock that maps exact deadlines to its ticks.
#[derive(Debug)]
pub(crate) struct Timeline {
    cascade: Cascade,
    clock: Clock,
    levels: Box<[u32]>,
    /// Timers filed again because their deadline had moved later than their tick.
    refiled: u64,
    /// Cascades made by cascades given back whole ([`forget_all`](Self::forget_all)): the
    /// count is cumulative, and the actor reports it as a difference.
    forgotten_cascades: u64,
    /// The earliest exact deadline among the parked timers (a lower bound: a parked timer
    /// that left early may have set it).
    parked_min: u64,
}

impl Timeline {
    pub(crate) fn new(levels: &[u32], clock: Clock) -> Self {
        Timeline {
            cascade: Cascade::new(levels),
            clock,
            levels: levels.into(),
            refiled: 0,
            forgotten_cascades: 0,
            parked_min: NEVER,
        }
    }

    /// Timers filed, parked ones included.
    pub(crate) fn len(&self) -> usize {
        self.cascade.len()
    }

    /// How often the wheel has moved a timer: cascades one level down, and timers filed again
    /// because their deadline had moved later.
    pub(crate) fn moves(&self) -> Moves {
        Moves {
            cascades: self.forgotten_cascades + self.cascade.cascades(),
            refiled: self.refiled,
        }
    }

    pub(crate) fn contains(&self, id: u32) -> bool {
        self.cascade.contains(id)
    }

    /// Room for ids below `ids`: an owner whose ids come from a pool grows this table with
    /// the pool, not by doubling.
    pub(crate) fn reserve_ids(&mut self, ids: usize) {
        self.cascade.reserve_ids(ids);
    }

    /// Files `id` for the exact deadline `deadline`, or moves it there if it is filed.
    pub(crate) fn file(&mut self, id: u32, deadline: u64) {
        let tick = self.clock.tick_of(deadline);
        if !self.cascade.reschedule(id, tick) {
            self.cascade.insert(id, tick);
        }
    }

    /// Moves a filed `id` earlier, to `deadline`, if that is before its tick; a later deadline
    /// needs nothing (the machine reports it as [`Verdict::Later`] when the tick comes).
    /// `false` if `id` is not filed.
    pub(crate) fn advance_to(&mut self, id: u32, deadline: u64) -> bool {
        let Some(filed) = self.cascade.tick(id) else {
            return false;
        };
        let tick = self.clock.tick_of(deadline);
        if tick < filed || self.cascade.is_parked(id) {
            self.cascade.reschedule(id, tick);
        }
        true
    }

    /// Takes `id` out; `false` if it was not filed.
    pub(crate) fn unfile(&mut self, id: u32) -> bool {
        self.cascade.remove(id)
    }

    /// Forgets every timer at once, in O(1): a fresh, empty cascade at the same tick, the old
    /// one given back whole. For an owner that hands all its timers away together.
    pub(crate) fn forget_all(&mut self) {
        let now = self.cascade.now();
        self.forgotten_cascades += self.cascade.cascades();
        self.cascade = Cascade::new(&self.levels);
        self.cascade.advance_to(now);
        self.parked_min = NEVER;
    }

    /// Unfiles every timer, handing out their ids.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = u32> + '_ {
        self.cascade.drain().map(|(id, _)| id)
    }

    /// Gives back the node storage of every range of ids with nothing filed.
    pub(crate) fn release_unfiled(&mut self) {
        self.cascade.release_unfiled();
    }

    /// Gives back the node storage of the ids in `ids`, which must all be unfiled.
    pub(crate) fn release_ids(&mut self, ids: std::ops::Range<usize>) {
        self.cascade.release(ids);
    }

    /// The offset the actor should next wake at, if anything is filed: the earliest exact
    /// deadline of the parked timers, or when the next tick's window opens. Waking at exact
    /// deadlines lets tokio's timer round each once, as it would its own `Sleep`.
    pub(crate) fn next_wake(&self) -> Option<u64> {
        let parked = self.cascade.first_parked().map(|_| self.parked_min);
        let next = self
            .cascade
            .next_expiration()
            .filter(|&tick| tick != NEVER_TICK)
            .map(|tick| self.clock.window_start(tick));
        let wake = match (parked, next) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        (wake < NEVER).then_some(wake)
    }

    /// Shows `judge` the timers due by `now` (an offset), up to `budget` of them: first the
    /// parked ones, then those whose tick has come (or whose tick's window is open). `judge`
    /// gets each id with a limit: it fires the timer if its exact deadline is at or before the
    /// limit, and says what became of it. Returns how many it was shown; fewer than `budget`
    /// means nothing due is left.
    ///
    /// The limit is `now`, but never past the end of the tick the timer was filed under: a
    /// timer postponed (lazily) past its tick goes back into the wheel for its new tick rather
    /// than firing at its old place, so even after the clock jumps far, timers fire in deadline
    /// order across ticks.
    pub(crate) fn expire(
        &mut self,
        now: u64,
        budget: usize,
        mut judge: impl FnMut(u32, u64) -> Verdict,
    ) -> usize {
        let mut target = self.clock.tick_at(now);
        if now >= self.clock.window_start(target + 1) {
            target += 1;
        }
        let mut shown = 0;

        let mut parked = self.cascade.first_parked();
        let mut parked_min = NEVER;
        while let Some(id) = parked {
            if shown == budget {
                // Not all seen: keep the old bound, which is no later than theirs.
                self.parked_min = self.parked_min.min(parked_min);
                return shown;
            }
            parked = self.cascade.next_parked(id);
            shown += 1;
            let filed = self.cascade.tick(id).expect("a parked id is filed");
            match judge(id, now.min(self.clock.tick_start(filed))) {
                Verdict::Done => {
                    self.cascade.remove(id);
                }
                Verdict::Later(deadline) => {
                    let tick = self.clock.tick_of(deadline);
                    if tick > filed {
                        self.cascade.reschedule(id, tick);
                        self.refiled += 1;
                    } else {
                        parked_min = parked_min.min(deadline);
                    }
                }
            }
        }
        self.parked_min = parked_min;

        while shown < budget {
            let Some((id, filed)) = self.cascade.poll_expired(target) else {
                break;
            };
            shown += 1;
            if let Verdict::Later(deadline) = judge(id, now.min(self.clock.tick_start(filed))) {
                let tick = self.clock.tick_of(deadline);
                self.cascade.insert(id, tick);
                if tick > filed {
                    // Postponed: filed again for its own tick (handed out in order, in this
                    // pass if that tick is due too).
                    self.refiled += 1;
                } else {
                    // Due within the open window, but not yet by its exact deadline.
                    self.cascade.park(id);
                    self.parked_min = self.parked_min.min(deadline);
                }
            }
        }
        shown
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    const MS: u64 = 1_000_000;

    fn timeline() -> Timeline {
        let clock = Clock::new(Instant::now(), Duration::from_millis(1));
        Timeline::new(&[1000, 60, 60], clock)
    }

    /// Expires at `now` with exact deadlines from `deadlines[id]`, returning what fired.
    fn fire(timeline: &mut Timeline, now: u64, deadlines: &[u64]) -> Vec<u32> {
        let mut fired = Vec::new();
        timeline.expire(now, usize::MAX, |id, limit| {
            if deadlines[id as usize] <= limit {
                fired.push(id);
                Verdict::Done
            } else {
                Verdict::Later(deadlines[id as usize])
            }
        });
        fired
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_fires_at_its_exact_deadline_not_its_tick() {
        let mut timeline = timeline();
        let deadlines = [5 * MS + 300, 5 * MS + 900];
        timeline.file(0, deadlines[0]);
        timeline.file(1, deadlines[1]);
        // The window of tick 6 opens just after 5 ms.
        assert_eq!(timeline.next_wake(), Some(5 * MS + 1));
        assert!(fire(&mut timeline, 5 * MS + 1, &deadlines).is_empty());
        // Both are parked; wake again at the earlier exact deadline.
        assert_eq!(timeline.next_wake(), Some(5 * MS + 300));
        assert_eq!(fire(&mut timeline, 5 * MS + 500, &deadlines), [0]);
        assert_eq!(fire(&mut timeline, 6 * MS, &deadlines), [1]);
        assert_eq!(timeline.len(), 0);
        assert_eq!(timeline.next_wake(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_postponed_timer_leaves_the_parked_list_for_its_new_tick() {
        let mut timeline = timeline();
        let mut deadlines = [2 * MS + 500];
        timeline.file(0, deadlines[0]);
        assert!(fire(&mut timeline, 2 * MS + 100, &deadlines).is_empty());
        deadlines[0] = 40 * MS;
        assert!(fire(&mut timeline, 3 * MS, &deadlines).is_empty());
        assert_eq!(timeline.next_wake(), Some(39 * MS + 1));
        assert!(timeline.advance_to(0, 10 * MS));
        assert_eq!(timeline.next_wake(), Some(9 * MS + 1));
        deadlines[0] = 10 * MS;
        assert_eq!(fire(&mut timeline, 10 * MS, &deadlines), [0]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_postponed_past_others_fires_after_them_even_after_a_jump() {
        let mut timeline = timeline();
        // 0 was filed at 2 ms and postponed to 9 ms; 1 is due at 5 ms.
        let deadlines = [9 * MS, 5 * MS];
        timeline.file(0, 2 * MS);
        timeline.file(1, deadlines[1]);
        // The clock jumps past both.
        assert_eq!(fire(&mut timeline, 20 * MS, &deadlines), [1, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn never_is_filed_but_never_woken_for() {
        let mut timeline = timeline();
        timeline.file(0, NEVER);
        assert_eq!(timeline.len(), 1);
        assert_eq!(timeline.next_wake(), None);
        assert!(fire(&mut timeline, NEVER - 1, &[NEVER]).is_empty());
        assert!(timeline.unfile(0));
    }
}
