//! The state a timer shares between its handle and the actor: one atomic word.
//!
//! The word packs a 3-bit state and the 61-bit exact deadline (nanoseconds since the wheel's
//! origin), so a handle that moves a deadline and an actor that fires it agree on one
//! compare-and-swap: either the actor sees the new deadline (and files the timer again), or
//! the handle sees that the timer fired (and re-arms it). That is what lets a postpone cost one
//! atomic operation and no message.
//!
//! ```text
//!                 handle: cancel                          actor: due, deadline ≤ now
//!    CANCELLED ◄───────────────── ARMED ─────────────────────────────────────► FIRED
//!                                  ▲  │ handle: polled at or after its deadline  │
//!                                  │  └──────────────────────────────────────────┤
//!                                  └────────── handle: reset (re-arm) ───────────┘
//!    actor: the wheel stops takes ARMED to SHUTDOWN.
//! ```
//!
//! The actor learns a timer's deadline from the command that files it, so filing never
//! touches the word: the word's cache line stays with the handle until the timer is due.

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

use super::clock::NEVER;

const DEADLINE_BITS: u32 = 61;
const DEADLINE_MASK: u64 = NEVER;

/// Where a timer is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Waiting for its deadline.
    Armed = 0,
    /// Fired (for a job: started).
    Fired = 1,
    /// Cancelled by its handle.
    Cancelled = 2,
    /// The wheel stopped before it fired.
    Shutdown = 3,
    /// Not in use (a pooled word between timers).
    Idle = 4,
}

impl State {
    fn from_bits(bits: u64) -> State {
        match bits {
            0 => State::Armed,
            1 => State::Fired,
            2 => State::Cancelled,
            3 => State::Shutdown,
            _ => State::Idle,
        }
    }
}

fn pack(state: State, deadline: u64) -> u64 {
    ((state as u64) << DEADLINE_BITS) | deadline.min(NEVER)
}

fn unpack(word: u64) -> (State, u64) {
    (
        State::from_bits(word >> DEADLINE_BITS),
        word & DEADLINE_MASK,
    )
}

/// What happened to a timer whose deadline a handle moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Moved {
    /// It was armed and now waits for the new deadline. If that is earlier than the deadline
    /// it had (`earlier`), the actor may have it filed too late: the handle must tell it.
    Armed { earlier: bool },
    /// It had fired and is armed again: the handle must file it anew.
    Rearmed,
    /// It is past moving (fired and not re-armable, cancelled, or shut down).
    Refused,
}

/// What the actor does with a timer whose tick came due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// It fired now; its deadline was this.
    Fire(u64),
    /// It is armed for a deadline still ahead (postponed, or due later within the tick).
    Later(u64),
    /// Its handle completed it (polled at or after its deadline).
    Completed,
    /// It was cancelled.
    Cancelled,
}

/// A timer's shared word.
#[derive(Debug)]
pub(crate) struct TimerWord(AtomicU64);

impl Default for TimerWord {
    fn default() -> Self {
        TimerWord::idle()
    }
}

impl TimerWord {
    /// A word not in use.
    pub(crate) fn idle() -> Self {
        TimerWord(AtomicU64::new(pack(State::Idle, 0)))
    }

    /// A word armed for `deadline`.
    #[cfg(any(test, loom))]
    pub(crate) fn armed(deadline: u64) -> Self {
        TimerWord(AtomicU64::new(pack(State::Armed, deadline)))
    }

    pub(crate) fn state(&self) -> State {
        unpack(self.0.load(Ordering::Acquire)).0
    }

    /// Applies `step` to the word until a compare-and-swap succeeds; `step` returns the new
    /// word (or `None` to leave it) and the outcome.
    fn update<R>(&self, mut step: impl FnMut(State, u64) -> (Option<(State, u64)>, R)) -> R {
        let mut current = self.0.load(Ordering::Acquire);
        loop {
            let (state, deadline) = unpack(current);
            let (next, outcome) = step(state, deadline);
            let Some((next_state, next_deadline)) = next else {
                return outcome;
            };
            match self.0.compare_exchange_weak(
                current,
                pack(next_state, next_deadline),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return outcome,
                Err(actual) => current = actual,
            }
        }
    }

    // ---- handle side ----

    /// Arms a word nobody else uses yet (a fresh timer): the command that files it publishes
    /// the store to the actor.
    pub(crate) fn arm(&self, deadline: u64) {
        self.0
            .store(pack(State::Armed, deadline), Ordering::Release);
    }

    /// Moves the deadline. With `rearm`, a fired timer is armed again (a `Sleep`); without,
    /// moving a fired timer is refused (a job that started).
    pub(crate) fn move_to(&self, deadline: u64, rearm: bool) -> Moved {
        self.update(|state, old| match state {
            State::Armed => (
                Some((State::Armed, deadline)),
                Moved::Armed {
                    earlier: deadline < old,
                },
            ),
            State::Fired if rearm => (Some((State::Armed, deadline)), Moved::Rearmed),
            _ => (None, Moved::Refused),
        })
    }

    /// Cancels an armed timer: `true` if this call did.
    pub(crate) fn cancel(&self) -> bool {
        self.update(|state, deadline| match state {
            State::Armed => (Some((State::Cancelled, deadline)), true),
            _ => (None, false),
        })
    }

    /// The handle saw its deadline pass before the actor fired it: marks it fired so the actor
    /// does not wake it again. `true` if this call did.
    pub(crate) fn complete(&self) -> bool {
        self.update(|state, deadline| match state {
            State::Armed => (Some((State::Fired, deadline)), true),
            _ => (None, false),
        })
    }

    // ---- actor side ----

    /// The deadline, whatever the state.
    #[cfg(any(test, loom))]
    pub(crate) fn deadline(&self) -> u64 {
        unpack(self.0.load(Ordering::Acquire)).1
    }

    /// The actor's tick for this timer came: fire it if its exact deadline is at or before
    /// `now`.
    pub(crate) fn on_due(&self, now: u64) -> Due {
        self.update(|state, deadline| match state {
            State::Armed if deadline <= now => {
                (Some((State::Fired, deadline)), Due::Fire(deadline))
            }
            State::Armed => (None, Due::Later(deadline)),
            State::Fired => (None, Due::Completed),
            _ => (None, Due::Cancelled),
        })
    }

    /// The wheel stops: `true` if the timer was armed and is now `Shutdown`.
    pub(crate) fn shut_down(&self) -> bool {
        self.update(|state, deadline| match state {
            State::Armed => (Some((State::Shutdown, deadline)), true),
            _ => (None, false),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postponing_needs_no_message_and_the_actor_sees_it() {
        let timer = TimerWord::armed(10);
        assert_eq!(timer.move_to(50, true), Moved::Armed { earlier: false });
        assert_eq!(timer.on_due(10), Due::Later(50));
        assert_eq!(timer.move_to(20, true), Moved::Armed { earlier: true });
        assert_eq!(timer.on_due(20), Due::Fire(20));
        assert_eq!(timer.state(), State::Fired);
    }

    #[test]
    fn moving_a_fired_timer_rearms_only_when_asked() {
        let timer = TimerWord::armed(1);
        assert_eq!(timer.on_due(1), Due::Fire(1));
        assert_eq!(timer.move_to(9, false), Moved::Refused);
        assert_eq!(timer.move_to(9, true), Moved::Rearmed);
        assert_eq!(timer.deadline(), 9);
    }

    #[test]
    fn cancel_and_fire_exclude_each_other() {
        let timer = TimerWord::armed(5);
        assert!(timer.cancel());
        assert_eq!(timer.on_due(5), Due::Cancelled);
        let timer = TimerWord::armed(5);
        assert_eq!(timer.on_due(5), Due::Fire(5));
        assert!(!timer.cancel());
    }

    #[test]
    fn a_timer_its_handle_completed_is_not_fired_again() {
        let timer = TimerWord::armed(5);
        assert!(timer.complete());
        assert_eq!(timer.on_due(9), Due::Completed);
        assert!(!timer.shut_down());
    }

    #[test]
    fn shutdown_takes_only_armed_timers() {
        let live = TimerWord::armed(5);
        assert!(live.shut_down());
        assert_eq!(live.state(), State::Shutdown);
        assert_eq!(live.move_to(9, true), Moved::Refused);
        let fired = TimerWord::armed(5);
        fired.on_due(5);
        assert!(!fired.shut_down());
    }

    #[test]
    fn deadlines_saturate_into_61_bits() {
        let timer = TimerWord::armed(u64::MAX);
        assert_eq!(timer.deadline(), NEVER);
        assert_eq!(timer.on_due(NEVER - 1), Due::Later(NEVER));
    }
}

/// Model checks of every race a timer's word can see: loom explores all interleavings of the
/// handle's and the actor's operations. Run with
/// `RUSTFLAGS="--cfg loom" cargo test --release --lib loom_model`.
#[cfg(all(test, loom))]
mod loom_model {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    #[test]
    fn cancel_racing_fire_has_exactly_one_winner() {
        loom::model(|| {
            let timer = Arc::new(TimerWord::armed(5));
            let handle = {
                let timer = timer.clone();
                thread::spawn(move || timer.cancel())
            };
            let due = timer.on_due(5);
            let cancelled = handle.join().unwrap();
            assert_eq!(due == Due::Fire(5), !cancelled);
            assert_eq!(due == Due::Cancelled, cancelled);
        });
    }

    #[test]
    fn a_postpone_racing_fire_is_never_lost() {
        loom::model(|| {
            let timer = Arc::new(TimerWord::armed(5));
            let handle = {
                let timer = timer.clone();
                thread::spawn(move || timer.move_to(50, true))
            };
            let due = timer.on_due(5);
            let moved = handle.join().unwrap();
            match due {
                // Fired at the old deadline: the handle must have seen it and re-armed.
                Due::Fire(5) => assert_eq!(moved, Moved::Rearmed),
                // The actor saw the new deadline and files the timer again.
                Due::Later(50) => assert_eq!(moved, Moved::Armed { earlier: false }),
                other => panic!("unexpected {other:?}"),
            }
            assert_eq!(timer.deadline(), 50);
        });
    }

    #[test]
    fn an_earlier_move_racing_fire_is_never_lost() {
        loom::model(|| {
            let timer = Arc::new(TimerWord::armed(50));
            let handle = {
                let timer = timer.clone();
                thread::spawn(move || timer.move_to(5, true))
            };
            // The actor looks at the timer at time 50.
            let due = timer.on_due(50);
            let moved = handle.join().unwrap();
            match (due, moved) {
                // Moved first: it fires at once, for the new deadline.
                (Due::Fire(5), Moved::Armed { earlier: true }) => {}
                // Fired first: the handle re-armed it for the new deadline.
                (Due::Fire(50), Moved::Rearmed) => assert_eq!(timer.state(), State::Armed),
                other => panic!("unexpected {other:?}"),
            }
        });
    }

    #[test]
    fn completion_by_the_handle_racing_fire_fires_once() {
        loom::model(|| {
            let timer = Arc::new(TimerWord::armed(5));
            let handle = {
                let timer = timer.clone();
                thread::spawn(move || timer.complete())
            };
            let due = timer.on_due(5);
            let completed = handle.join().unwrap();
            assert_eq!(completed, due == Due::Completed);
            assert_eq!(!completed, due == Due::Fire(5));
        });
    }

    #[test]
    fn shutdown_racing_cancel_resolves_once() {
        loom::model(|| {
            let timer = Arc::new(TimerWord::armed(5));
            let handle = {
                let timer = timer.clone();
                thread::spawn(move || timer.cancel())
            };
            let shut = timer.shut_down();
            let cancelled = handle.join().unwrap();
            assert_ne!(shut, cancelled);
        });
    }
}
