//! The machine of the main actor: sleeps (and the timeouts and intervals built on them) and
//! one-shot jobs.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::Machine;
use crate::handle::Shared;
use crate::job::JobEntry;
use crate::sleep::SleepShared;
use crate::state::{Due, TimerState};
use crate::stats::Delta;
use crate::wheel::TimerWheel;

/// Entry capacity an empty wheel keeps; more is given back after a burst.
pub(crate) const RETAINED_ENTRIES: usize = 4096;

/// A timer filed in the main actor's wheel.
pub(crate) enum Timer {
    Sleep(Arc<SleepShared>),
    Job(Arc<dyn JobEntry>),
}

impl Timer {
    fn state(&self) -> &TimerState {
        match self {
            Timer::Sleep(sleep) => &sleep.state,
            Timer::Job(job) => job.state(),
        }
    }

    /// Whether both name the same timer (a wheel key alone could be stale).
    fn same(&self, other: &Timer) -> bool {
        std::ptr::addr_eq(self.state(), other.state())
    }

    fn fire(self, shared: &Arc<Shared>) {
        match self {
            Timer::Sleep(sleep) => sleep.waker.wake(),
            Timer::Job(job) => job.start(shared),
        }
    }

    /// Resolves a timer the wheel will never fire because it stopped.
    fn shut_down(self) {
        if self.state().shut_down() {
            match self {
                Timer::Sleep(sleep) => sleep.waker.wake(),
                Timer::Job(job) => job.refuse(),
            }
        }
    }
}

/// What handles ask of the main actor.
pub(crate) enum Command {
    /// File a timer (its deadline is in its state word).
    Insert(Timer),
    /// Take a timer out of the wheel now (its state already says cancelled).
    Cancel(Timer),
    /// Move a timer earlier, to the deadline in its state word.
    Reschedule(Timer),
    /// Answer once every command sent before this one is applied and counted in the stats.
    Flush(oneshot::Sender<()>),
}

pub(crate) struct TimerMachine {
    wheel: TimerWheel<Timer>,
    flushes: Vec<oneshot::Sender<()>>,
}

impl TimerMachine {
    pub(crate) fn new(wheel: TimerWheel<Timer>) -> Self {
        TimerMachine {
            wheel,
            flushes: Vec::new(),
        }
    }

    /// The timer's current wheel key, if `timer` is the entry filed under it.
    fn filed_key(&self, timer: &Timer) -> Option<crate::wheel::Key> {
        let key = timer.state().key();
        self.wheel
            .get(key)
            .is_some_and(|filed| filed.same(timer))
            .then_some(key)
    }

    fn file(&mut self, tick: u64, timer: Timer) {
        let key = self.wheel.insert(tick, timer);
        if let Some(timer) = self.wheel.get(key) {
            timer.state().set_key(key);
        }
    }
}

impl Machine for TimerMachine {
    type Command = Command;
    type Item = Timer;

    fn apply(&mut self, command: Command, _shared: &Arc<Shared>, delta: &mut Delta) {
        match command {
            Command::Insert(timer) => {
                delta.inserted += 1;
                match timer.state().claim() {
                    Some(tick) => self.file(tick, timer),
                    None => delta.cancelled += 1,
                }
            }
            Command::Cancel(timer) => {
                if let Some(key) = self.filed_key(&timer) {
                    self.wheel.remove(key);
                    delta.cancelled += 1;
                }
            }
            Command::Reschedule(timer) => {
                if let (Some(key), Some(tick)) =
                    (self.filed_key(&timer), timer.state().registered_tick())
                {
                    self.wheel.reschedule(key, tick);
                    delta.rescheduled += 1;
                }
            }
            Command::Flush(reply) => self.flushes.push(reply),
        }
    }

    fn turn_done(&mut self) {
        self.wheel.shrink_if_empty(RETAINED_ENTRIES);
        for reply in self.flushes.drain(..) {
            let _ = reply.send(());
        }
    }

    fn fire(&mut self, now: u64, budget: usize, shared: &Arc<Shared>, delta: &mut Delta) -> usize {
        let mut processed = 0;
        let mut read_at: Option<Instant> = None;
        while processed < budget {
            let Some(expired) = self.wheel.poll_expired(now) else {
                break;
            };
            processed += 1;
            match expired.item.state().on_due(now) {
                Due::Fire => {
                    let at = *read_at.get_or_insert_with(Instant::now);
                    let lateness =
                        at.saturating_duration_since(shared.clock.instant_of(expired.deadline));
                    delta.max_lateness = delta.max_lateness.max(lateness);
                    delta.fired += 1;
                    expired.item.fire(shared);
                }
                Due::Refile(tick) => {
                    delta.rescheduled += 1;
                    self.file(tick, expired.item);
                }
                Due::Drop => delta.cancelled += 1,
            }
        }
        processed
    }

    fn wheel(&self) -> &TimerWheel<Timer> {
        &self.wheel
    }

    fn refuse(&mut self, command: Command) {
        if let Command::Insert(timer) = command {
            timer.shut_down();
        }
    }

    fn shut_down(&mut self, shared: &Arc<Shared>, delta: &mut Delta) {
        shared.closed.store(true, Ordering::Release);
        let timers: Vec<Timer> = self.wheel.drain().map(|(_, timer)| timer).collect();
        delta.cancelled += timers.len() as u64;
        for timer in timers {
            timer.shut_down();
        }
    }
}
