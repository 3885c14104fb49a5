//! The state a timer shares between its handle and the actor: one atomic word.
//!
//! The word packs a 3-bit state and a 61-bit deadline tick, so a handle that moves a deadline
//! and an actor that fires it agree on one compare-and-swap: either the actor sees the new
//! deadline (and re-files the timer), or the handle sees that the timer fired (and re-arms it).
//! That is what lets a postpone cost one atomic operation and no message.
//!
//! ```text
//!            handle: cancel           actor: insert            actor: due, tick ≤ now
//!  CANCELLED ◄────────────── PENDING ──────────────► REGISTERED ───────────────────► FIRED
//!      ▲                       ▲  handle: reset (re-arm)  │ handle: cancel              │
//!      └───────────────────────┼──────────────────────────┘                             │
//!                              └────────────────────────────────────────────────────────┘
//!  actor: shutdown takes PENDING and REGISTERED to SHUTDOWN.
//! ```

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::MAX_TICK;
use crate::wheel::Key;

const TICK_BITS: u32 = 61;
const TICK_MASK: u64 = MAX_TICK;

/// Where a timer is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Sent to the actor, not yet seen by it.
    Pending = 0,
    /// In the actor's wheel.
    Registered = 1,
    /// Fired (for a job: started).
    Fired = 2,
    /// Cancelled by its handle.
    Cancelled = 3,
    /// The wheel stopped before it fired.
    Shutdown = 4,
}

impl State {
    fn from_bits(bits: u64) -> State {
        match bits {
            0 => State::Pending,
            1 => State::Registered,
            2 => State::Fired,
            3 => State::Cancelled,
            _ => State::Shutdown,
        }
    }
}

fn pack(state: State, tick: u64) -> u64 {
    ((state as u64) << TICK_BITS) | tick.min(MAX_TICK)
}

fn unpack(word: u64) -> (State, u64) {
    (State::from_bits(word >> TICK_BITS), word & TICK_MASK)
}

/// What a handle must tell the actor after moving a deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Moved {
    /// Nothing: the actor will read the new deadline when it next looks at the timer.
    Quietly,
    /// The deadline moved earlier than where the wheel holds it: send a reschedule.
    Earlier,
    /// The timer had fired and is armed again: send it as a new insert.
    Rearmed,
    /// The timer is past moving (fired and not re-armable, cancelled, or shut down).
    Refused,
}

/// What a handle must tell the actor after cancelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cancelled {
    /// The actor had not seen the timer; it will drop it when it does. No message needed.
    BeforeSeen,
    /// The timer is in the wheel: send a cancel so its memory is reclaimed now.
    InWheel,
    /// Too late: it fired, was cancelled already, or the wheel stopped.
    TooLate,
}

/// What the actor does with a timer whose wheel slot came due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// It fired: wake or start it.
    Fire,
    /// Its deadline was postponed to this tick: file it again.
    Refile(u64),
    /// It was cancelled: drop it.
    Drop,
}

/// The atomic word plus the wheel key the actor filed the timer under.
#[derive(Debug)]
pub(crate) struct TimerState {
    word: AtomicU64,
    /// Written and read only by the actor; atomic so the state can be shared without `unsafe`.
    key: AtomicU64,
}

impl TimerState {
    /// A timer about to be sent to the actor, due at `tick`.
    pub(crate) fn pending(tick: u64) -> Self {
        TimerState {
            word: AtomicU64::new(pack(State::Pending, tick)),
            key: AtomicU64::new(u64::MAX),
        }
    }

    pub(crate) fn state(&self) -> State {
        unpack(self.word.load(Ordering::Acquire)).0
    }

    /// Applies `step` to the word until a compare-and-swap succeeds; `step` returns the new
    /// word (or `None` to leave it) and the outcome.
    fn update<R>(&self, mut step: impl FnMut(State, u64) -> (Option<(State, u64)>, R)) -> R {
        let mut current = self.word.load(Ordering::Acquire);
        loop {
            let (state, tick) = unpack(current);
            let (next, outcome) = step(state, tick);
            let Some((next_state, next_tick)) = next else {
                return outcome;
            };
            match self.word.compare_exchange_weak(
                current,
                pack(next_state, next_tick),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return outcome,
                Err(actual) => current = actual,
            }
        }
    }

    // ---- handle side ----

    /// Moves the deadline to `tick`. With `rearm`, a fired timer is armed again (a `Sleep`);
    /// without, moving a fired timer is refused (a job that started).
    pub(crate) fn move_to(&self, tick: u64, rearm: bool) -> Moved {
        self.update(|state, old| match state {
            State::Pending => (Some((State::Pending, tick)), Moved::Quietly),
            State::Registered if tick >= old => (Some((State::Registered, tick)), Moved::Quietly),
            State::Registered => (Some((State::Registered, tick)), Moved::Earlier),
            State::Fired if rearm => (Some((State::Pending, tick)), Moved::Rearmed),
            _ => (None, Moved::Refused),
        })
    }

    pub(crate) fn cancel(&self) -> Cancelled {
        self.update(|state, tick| match state {
            State::Pending => (Some((State::Cancelled, tick)), Cancelled::BeforeSeen),
            State::Registered => (Some((State::Cancelled, tick)), Cancelled::InWheel),
            _ => (None, Cancelled::TooLate),
        })
    }

    // ---- actor side ----

    /// The actor takes the timer in: `Some(tick)` to file it (then [`set_key`](Self::set_key)),
    /// `None` if it was cancelled before the actor saw it.
    pub(crate) fn claim(&self) -> Option<u64> {
        self.update(|state, tick| match state {
            State::Pending => (Some((State::Registered, tick)), Some(tick)),
            _ => (None, None),
        })
    }

    /// Records the wheel key the actor filed the timer under.
    pub(crate) fn set_key(&self, key: Key) {
        self.key.store(key.into_raw(), Ordering::Relaxed);
    }

    pub(crate) fn key(&self) -> Key {
        Key::from_raw(self.key.load(Ordering::Relaxed))
    }

    /// The deadline the handle wants now, if the timer is still registered.
    pub(crate) fn registered_tick(&self) -> Option<u64> {
        match unpack(self.word.load(Ordering::Acquire)) {
            (State::Registered, tick) => Some(tick),
            _ => None,
        }
    }

    /// The wheel says the timer is due at `now`.
    pub(crate) fn on_due(&self, now: u64) -> Due {
        self.update(|state, tick| match state {
            State::Registered if tick > now => (None, Due::Refile(tick)),
            State::Registered => (Some((State::Fired, tick)), Due::Fire),
            _ => (None, Due::Drop),
        })
    }

    /// The wheel stops: returns `true` if the timer was live and is now `Shutdown`.
    pub(crate) fn shut_down(&self) -> bool {
        self.update(|state, tick| match state {
            State::Pending | State::Registered => (Some((State::Shutdown, tick)), true),
            _ => (None, false),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postponing_a_registered_timer_needs_no_message() {
        let timer = TimerState::pending(10);
        assert_eq!(timer.claim(), Some(10));
        assert_eq!(timer.move_to(50, true), Moved::Quietly);
        assert_eq!(timer.on_due(10), Due::Refile(50));
        assert_eq!(timer.move_to(20, true), Moved::Earlier);
        assert_eq!(timer.on_due(20), Due::Fire);
        assert_eq!(timer.state(), State::Fired);
    }

    #[test]
    fn moving_a_fired_timer_rearms_only_when_asked() {
        let timer = TimerState::pending(1);
        timer.claim();
        assert_eq!(timer.on_due(1), Due::Fire);
        assert_eq!(timer.move_to(9, false), Moved::Refused);
        assert_eq!(timer.move_to(9, true), Moved::Rearmed);
        assert_eq!(timer.claim(), Some(9));
        timer.set_key(Key::from_raw(9));
        assert_eq!(timer.key(), Key::from_raw(9));
    }

    #[test]
    fn cancel_before_the_actor_sees_it_drops_it_on_arrival() {
        let timer = TimerState::pending(5);
        assert_eq!(timer.cancel(), Cancelled::BeforeSeen);
        assert_eq!(timer.claim(), None);
        assert_eq!(timer.cancel(), Cancelled::TooLate);
    }

    #[test]
    fn cancel_and_fire_exclude_each_other() {
        let timer = TimerState::pending(5);
        timer.claim();
        assert_eq!(timer.cancel(), Cancelled::InWheel);
        assert_eq!(timer.on_due(5), Due::Drop);

        let timer = TimerState::pending(5);
        timer.claim();
        assert_eq!(timer.on_due(5), Due::Fire);
        assert_eq!(timer.cancel(), Cancelled::TooLate);
    }

    #[test]
    fn shutdown_takes_only_live_timers() {
        let live = TimerState::pending(5);
        assert!(live.shut_down());
        assert_eq!(live.state(), State::Shutdown);
        assert_eq!(live.move_to(9, true), Moved::Refused);
        let fired = TimerState::pending(5);
        fired.claim();
        fired.on_due(5);
        assert!(!fired.shut_down());
    }

    #[test]
    fn ticks_saturate_into_61_bits() {
        let timer = TimerState::pending(u64::MAX);
        assert_eq!(timer.claim(), Some(MAX_TICK));
    }
}

/// Model checks of every race a timer's word can see: loom explores all interleavings of the
/// handle's and the actor's operations. Run with
/// `RUSTFLAGS="--cfg loom" cargo test --release --lib state::loom_model`.
#[cfg(all(test, loom))]
mod loom_model {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    fn registered(tick: u64) -> Arc<TimerState> {
        let timer = Arc::new(TimerState::pending(tick));
        assert_eq!(timer.claim(), Some(tick));
        timer
    }

    #[test]
    fn cancel_racing_fire_has_exactly_one_winner() {
        loom::model(|| {
            let timer = registered(5);
            let handle = {
                let timer = timer.clone();
                thread::spawn(move || timer.cancel())
            };
            let due = timer.on_due(5);
            let cancelled = handle.join().unwrap();
            assert_eq!(due == Due::Fire, cancelled == Cancelled::TooLate);
            assert_eq!(due == Due::Drop, cancelled == Cancelled::InWheel);
        });
    }

    #[test]
    fn a_postpone_racing_fire_is_never_lost() {
        loom::model(|| {
            let timer = registered(5);
            let handle = {
                let timer = timer.clone();
                thread::spawn(move || timer.move_to(50, true))
            };
            let due = timer.on_due(5);
            let moved = handle.join().unwrap();
            match due {
                // Fired at the old deadline: the handle must have seen it and re-armed.
                Due::Fire => assert_eq!(moved, Moved::Rearmed),
                // The actor saw the new deadline and files the timer again.
                Due::Refile(tick) => {
                    assert_eq!(tick, 50);
                    assert_eq!(moved, Moved::Quietly);
                }
                Due::Drop => panic!("a live timer was dropped"),
            }
        });
    }

    #[test]
    fn an_earlier_move_racing_fire_is_never_lost() {
        loom::model(|| {
            let timer = registered(50);
            let handle = {
                let timer = timer.clone();
                thread::spawn(move || timer.move_to(5, true))
            };
            // The wheel holds the timer at 50 and pops it there.
            let due = timer.on_due(50);
            let moved = handle.join().unwrap();
            assert_eq!(due, Due::Fire, "due at 50 or at 5, it fires at 50");
            match moved {
                // Moved while registered: the reschedule message will find it gone; it fired.
                Moved::Earlier => assert_eq!(timer.state(), State::Fired),
                // It had fired already: the handle re-armed it for the new deadline.
                Moved::Rearmed => assert_eq!(timer.claim(), Some(5)),
                other => panic!("unexpected {other:?}"),
            }
        });
    }

    #[test]
    fn cancel_racing_the_actor_taking_it_in_needs_a_message_only_when_filed() {
        loom::model(|| {
            let timer = Arc::new(TimerState::pending(5));
            let handle = {
                let timer = timer.clone();
                thread::spawn(move || timer.cancel())
            };
            let claimed = timer.claim();
            let cancelled = handle.join().unwrap();
            // Either the actor never files it (no message needed), or it did and the cancel
            // must tell it.
            assert_eq!(claimed.is_none(), cancelled == Cancelled::BeforeSeen);
            assert_eq!(claimed.is_some(), cancelled == Cancelled::InWheel);
        });
    }

    #[test]
    fn shutdown_racing_cancel_resolves_once() {
        loom::model(|| {
            let timer = registered(5);
            let handle = {
                let timer = timer.clone();
                thread::spawn(move || timer.cancel())
            };
            let shut = timer.shut_down();
            let cancelled = handle.join().unwrap();
            assert_ne!(shut, cancelled == Cancelled::InWheel);
        });
    }
}
