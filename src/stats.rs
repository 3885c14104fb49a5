//! [`Stats`]: a snapshot of what a wheel has done.

use std::time::Duration;

use crate::timer::shared::Shared;

/// A snapshot of a wheel's counters, from [`Wheel::stats`](crate::Wheel::stats).
///
/// The counters cover sleeps, jobs and keyed timers together. They add up: once the actors
/// have applied every command sent so far, `inserted == fired + cancelled + pending`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let wheel = tokio_wheel::Wheel::new();
/// wheel.sleep(std::time::Duration::from_millis(5)).await;
/// wheel.flush().await;
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
    /// Timers registered with the actors and not yet fired or cancelled.
    pub pending: u64,
    /// Timers registered with the actors so far (a re-armed `Sleep` counts again).
    pub inserted: u64,
    /// Timers that fired: sleeps completed (by the actor, or by a poll at or after their
    /// deadline), jobs started, keyed entries delivered.
    pub fired: u64,
    /// Timers removed before firing (cancelled, dropped, taken, drained, replaced, or resolved
    /// by shutdown).
    pub cancelled: u64,
    /// Commands the actors applied.
    pub commands: u64,
    /// Timers moved to a new deadline: earlier, by a command; later, lazily when their old
    /// tick came.
    pub rescheduled: u64,
    /// Entries moved one wheel level down.
    pub cascades: u64,
    /// Turns of the actors' loops: each wake-up (commands, a due timer, shutdown) is one. It
    /// stays still while nothing is due and no command arrives.
    pub wakeups: u64,
    /// The latest any timer fired after its exact deadline.
    pub max_lateness: Duration,
    /// Jobs that panicked (one-shot jobs and runs of periodic jobs).
    pub job_panics: u64,
    /// Runs of periodic jobs started.
    pub periodic_runs: u64,
    /// Keyed expirations sent but not yet read from their `Expirations` streams. Each costs
    /// its key, value and deadline in memory until read.
    pub expirations_backlog: u64,
    /// Actor tasks running: one per timer shard for sleeps and jobs
    /// ([`Builder::timer_shards`](crate::Builder::timer_shards)), and one per shard of each
    /// keyed timer set ([`Builder::shards`](crate::Builder::shards)).
    pub actors: u64,
}

impl Stats {
    pub(crate) fn from_shared(shared: &Shared) -> Stats {
        let totals = shared.counters.snapshot();
        Stats {
            name: shared.name.clone(),
            pending: totals.pending,
            inserted: totals.inserted,
            fired: totals.fired,
            cancelled: totals.cancelled,
            commands: totals.commands,
            rescheduled: totals.rescheduled,
            cascades: totals.cascades,
            wakeups: totals.wakeups,
            max_lateness: totals.max_lateness,
            job_panics: totals.job_panics,
            periodic_runs: totals.periodic_runs,
            expirations_backlog: totals.expirations_backlog,
            actors: shared.live_actors() as u64,
        }
    }
}
