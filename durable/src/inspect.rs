//! What a queue can tell about itself: one task ([`TaskInfo`]), pages of tasks by state
//! ([`TaskFilter`]), and counters ([`QueueStats`]).

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use super::TaskId;

/// Where a task is in its life, as [`DurableQueue::get`](super::DurableQueue::get) and
/// [`DurableQueue::list`](super::DurableQueue::list) report it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TaskState {
    /// Waiting for its due time (a recurring schedule waits for its next occurrence).
    Pending,
    /// Handed to a consumer under a lease.
    InFlight {
        /// Which delivery this is (1 for the first).
        attempt: u32,
        /// When the lease ends unless the delivery is finished or extended (by the store's
        /// clock). A claim still waiting in a stream's buffer is kept alive until it is
        /// handed out; its lease end is reported as if it were handed out now.
        lease_until: SystemTime,
    },
    /// In the dead letters.
    Dead {
        /// Why it was given up on.
        reason: String,
    },
}

/// Which tasks [`DurableQueue::list`](super::DurableQueue::list) pages through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TaskFilter {
    /// Pending tasks (and recurring schedules), in due order (ties in schedule order).
    Pending,
    /// Tasks in flight, in order of lease end (ties by id).
    InFlight,
    /// Dead letters, in the order they died.
    Dead,
}

impl TaskFilter {
    pub(crate) fn name(self) -> &'static str {
        match self {
            TaskFilter::Pending => "pending",
            TaskFilter::InFlight => "in flight",
            TaskFilter::Dead => "dead",
        }
    }
}

/// One task as the store holds it, without its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskInfo {
    /// The task's id.
    pub id: TaskId,
    /// Pending, in flight or dead.
    pub state: TaskState,
    /// When it is (or was) due, by the store's clock: for a recurring schedule, its next
    /// occurrence.
    pub due: SystemTime,
    /// How many times it was delivered (the current delivery included).
    pub attempts: u32,
    /// Its payload's length in bytes.
    pub payload_len: usize,
    /// Why it is dead, for a dead letter.
    pub reason: Option<String>,
}

/// A queue's counts and counters, from [`DurableQueue::stats`](super::DurableQueue::stats).
///
/// The counts (`pending`, `in_flight`, `dead`) are what the store holds now. The counters
/// (`delivered` … `returned`) count since the queue was created, across every process and
/// restart, and only grow. They add up: every delivery is finished one way or another, so
///
/// `delivered == acked + retried + dead_lettered + expired + returned + in_flight`
///
/// (on a Redis queue with several `partitions` (`Builder::partitions`, feature `redis`), each read is a
/// consistent snapshot of one partition; the sum holds exactly while nothing moves).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueStats {
    /// Tasks waiting for their due time (a recurring schedule counts as one).
    pub pending: u64,
    /// Tasks handed out (or claimed into a stream's buffer) and not finished.
    pub in_flight: u64,
    /// Dead letters.
    pub dead: u64,
    /// Tasks handed to a stream: each attempt counts.
    pub delivered: u64,
    /// Deliveries acknowledged.
    pub acked: u64,
    /// Deliveries retried (`retry` or `retry_after` that left the task pending).
    pub retried: u64,
    /// Deliveries that moved their task to the dead letters: `fail`, a retry of the last
    /// attempt, or the last lease running out.
    pub dead_lettered: u64,
    /// Deliveries whose lease ran out, their task pending again.
    pub expired: u64,
    /// Claims returned unread (a stream dropped or a queue closed with tasks in its buffer):
    /// not counted as attempts.
    pub returned: u64,
    /// Median lateness (delivery time minus due time) over the recent window: the last
    /// 1000 claims (on Redis, across all workers of a partition; else of this handle).
    pub lateness_p50: Duration,
    /// 99th percentile of the same window.
    pub lateness_p99: Duration,
    /// Redis: the server's `maxmemory-policy` could not be read (a least-privilege ACL user
    /// may run neither `CONFIG GET` nor `INFO`), so nothing checks that it does not evict the
    /// queue's keys; make sure it is `noeviction`. Always `false` on the embedded store.
    pub eviction_policy_unknown: bool,
    /// Claiming is paused ([`DurableQueue::pause`](super::DurableQueue::pause)): no worker
    /// of the queue, in any process, is handed a task until it is resumed.
    pub paused: bool,
}

/// How many recent claims the lateness percentiles cover.
pub(crate) const LATENESS_WINDOW: usize = 1000;

/// The lateness of the most recent claims, in milliseconds.
#[derive(Debug, Default)]
pub(crate) struct LatenessWindow(VecDeque<u64>);

impl LatenessWindow {
    pub(crate) fn record(&mut self, late_ms: u64) {
        if self.0.len() == LATENESS_WINDOW {
            self.0.pop_front();
        }
        self.0.push_back(late_ms);
    }

    pub(crate) fn samples(&self) -> Vec<u64> {
        self.0.iter().copied().collect()
    }
}

/// The `p`-th percentile (0–100, nearest rank) of `samples` in milliseconds.
pub(crate) fn percentile(samples: &mut [u64], p: u64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort_unstable();
    let rank = (samples.len() as u64 * p).div_ceil(100).max(1) as usize - 1;
    Duration::from_millis(samples[rank.min(samples.len() - 1)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let mut samples: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&mut samples, 50), Duration::from_millis(50));
        assert_eq!(percentile(&mut samples, 99), Duration::from_millis(99));
        assert_eq!(percentile(&mut [], 99), Duration::ZERO);
        assert_eq!(percentile(&mut [7], 50), Duration::from_millis(7));
    }

    #[test]
    fn the_window_keeps_the_latest() {
        let mut window = LatenessWindow::default();
        for i in 0..(LATENESS_WINDOW as u64 + 10) {
            window.record(i);
        }
        let samples = window.samples();
        assert_eq!(samples.len(), LATENESS_WINDOW);
        assert_eq!(samples[0], 10);
    }
}
