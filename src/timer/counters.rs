//! The counters behind [`Stats`](crate::Stats): what the actors add up, turn by turn.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What one actor adds to the totals since its last flush.
#[derive(Debug, Default)]
pub(crate) struct Delta {
    pub(crate) inserted: u64,
    pub(crate) fired: u64,
    pub(crate) cancelled: u64,
    pub(crate) commands: u64,
    pub(crate) rescheduled: u64,
    pub(crate) wakeups: u64,
    pub(crate) max_lateness: Duration,
}

impl Delta {
    /// Counts a timer that fired at offset `now` for a deadline at offset `deadline`.
    pub(crate) fn record_fire(&mut self, deadline: u64, now: u64) {
        let lateness = Duration::from_nanos(now.saturating_sub(deadline));
        self.max_lateness = self.max_lateness.max(lateness);
        self.fired += 1;
    }
}

/// The totals every actor of a wheel adds to.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Totals {
    pub(crate) pending: u64,
    pub(crate) inserted: u64,
    pub(crate) fired: u64,
    pub(crate) cancelled: u64,
    pub(crate) commands: u64,
    pub(crate) rescheduled: u64,
    pub(crate) cascades: u64,
    pub(crate) wakeups: u64,
    pub(crate) max_lateness: Duration,
    pub(crate) job_panics: u64,
    pub(crate) periodic_runs: u64,
    pub(crate) expirations_backlog: u64,
}

/// The shared totals: actors merge a [`Delta`] per loop turn under one short lock, so a
/// snapshot never shows half of a turn. Counters bumped outside the actors are atomics.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    totals: Mutex<Totals>,
    pub(crate) job_panics: AtomicU64,
    pub(crate) periodic_runs: AtomicU64,
    pub(crate) expirations_backlog: AtomicU64,
}

impl Counters {
    /// Adds an actor's delta; `pending_change` is how its number of filed timers moved, and
    /// `cascades` its wheel's cascades since the last flush.
    pub(crate) fn merge(&self, delta: &mut Delta, pending_change: i64, cascades: u64) {
        let mut totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        totals.inserted += delta.inserted;
        totals.fired += delta.fired;
        totals.cancelled += delta.cancelled;
        totals.commands += delta.commands;
        totals.rescheduled += delta.rescheduled;
        totals.wakeups += delta.wakeups;
        totals.cascades += cascades;
        totals.max_lateness = totals.max_lateness.max(delta.max_lateness);
        totals.pending = totals.pending.saturating_add_signed(pending_change);
        *delta = Delta::default();
    }

    pub(crate) fn snapshot(&self) -> Totals {
        let mut totals = self
            .totals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        totals.job_panics = self.job_panics.load(Ordering::Relaxed);
        totals.periodic_runs = self.periodic_runs.load(Ordering::Relaxed);
        totals.expirations_backlog = self.expirations_backlog.load(Ordering::Relaxed);
        totals
    }
}
