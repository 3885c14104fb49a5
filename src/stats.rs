//! A snapshot of what a wheel has done, and the counters behind it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A snapshot of a wheel's counters, from [`Wheel::stats`](crate::Wheel::stats).
///
/// The counters cover sleeps, jobs and keyed timers together. They add up: once the actor has
/// applied every command sent so far, `inserted == fired + cancelled + pending`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let wheel = tokio_wheel::Wheel::new();
/// wheel.sleep(std::time::Duration::from_millis(5)).await;
/// let stats = wheel.stats();
/// assert_eq!(stats.fired, 1);
/// assert_eq!(stats.inserted, stats.fired + stats.cancelled + stats.pending);
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// The wheel's name (from [`Builder::name`](crate::Builder::name)).
    pub name: String,
    /// Timers registered with the actor and not yet fired or cancelled.
    pub pending: u64,
    /// Timers registered with the actor so far (a re-armed `Sleep` counts again).
    pub inserted: u64,
    /// Timers that fired: sleeps woken, jobs started, keyed entries delivered.
    pub fired: u64,
    /// Timers removed before firing (cancelled, dropped, taken, drained).
    pub cancelled: u64,
    /// Commands the actors applied.
    pub commands: u64,
    /// Timers moved to a new deadline (by command, or lazily when a postponed slot came due).
    pub rescheduled: u64,
    /// Entries moved one wheel level down.
    pub cascades: u64,
    /// Turns of the actors' loops: each wake-up (commands, a due slot, shutdown) is one. It
    /// stays still while nothing is due and no command arrives.
    pub wakeups: u64,
    /// The latest any timer fired after the start of its deadline tick.
    pub max_lateness: Duration,
    /// Jobs that panicked (one-shot jobs and runs of periodic jobs).
    pub job_panics: u64,
    /// Runs of periodic jobs started.
    pub periodic_runs: u64,
    /// Keyed expirations sent but not yet read from their `Expirations` streams. Each costs
    /// its key, value and deadline in memory until read.
    pub expirations_backlog: u64,
    /// Actor tasks running (one for sleeps and jobs, one per keyed timer set).
    pub actors: u64,
}

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
    /// Counts a timer due at `due` that fired at `now`.
    pub(crate) fn record_fire(&mut self, due: tokio::time::Instant, now: tokio::time::Instant) {
        self.max_lateness = self.max_lateness.max(now.saturating_duration_since(due));
        self.fired += 1;
    }
}

/// The shared totals: actors merge a [`Delta`] per loop turn under one short lock, so a
/// snapshot never shows half of a turn.
#[derive(Debug, Default)]
pub(crate) struct StatsCell {
    totals: Mutex<Stats>,
    pub(crate) job_panics: AtomicU64,
    pub(crate) periodic_runs: AtomicU64,
    pub(crate) expirations_backlog: AtomicU64,
}

impl StatsCell {
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

    pub(crate) fn snapshot(&self, name: &str, actors: usize) -> Stats {
        let mut stats = self
            .totals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        stats.name = name.to_owned();
        stats.actors = actors as u64;
        stats.job_panics = self.job_panics.load(Ordering::Relaxed);
        stats.periodic_runs = self.periodic_runs.load(Ordering::Relaxed);
        stats.expirations_backlog = self.expirations_backlog.load(Ordering::Relaxed);
        stats
    }
}
