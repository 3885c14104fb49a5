//! The idle connections of one wheel and timeout, filed by deadline tick, and the one task
//! that sweeps them: a connection costs a pointer in a bucket instead of a wheel timer.
//!
//! A connection is filed when its IO first waits, under the tick its idle deadline rounds up
//! to — or, when that is far off, under an earlier coarse tick (a sixteenth of the timeout
//! apart), so a group's buckets stay few and full. The sweeper sleeps on one wheel timer
//! until the first bucket's tick, then judges each connection in it by its own last traffic:
//! traffic since → filed again under its new deadline (no wake-up, no message: a busy
//! connection costs one look per timeout period); a request in progress → parked, the last
//! guard's drop wakes the IO; idle past its deadline → unfiled and woken, and the IO decides.
//! The IO always decides the close itself, from its own reading of the clock and the traffic,
//! so nothing the sweeper saw late can close a connection early.
//!
//! A dropped connection stays in its bucket, marked, until the sweeper or a compaction meets
//! it; a compaction runs once the marked outnumber half the filed, so memory stays within
//! twice the live connections' at amortised constant cost per drop. When the group's last
//! connection is dropped, the buckets are emptied at once and the sweeper ends, so nothing
//! keeps the wheel's actor running for connections that are gone.

use std::collections::BTreeMap;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures::future::{Either, select};
use tokio::sync::Notify;

use super::state::{DROPPED, Idle, Look};
use crate::Wheel;
use crate::timer::clock::{Clock, NEVER, NEVER_TICK};

/// How many coarse buckets a timeout spans: connections far from their deadline share
/// buckets this wide, and are looked at once more when it comes.
const COARSE_PER_TIMEOUT: u64 = 16;
/// Connections the sweeper judges between yields to its runtime.
const TURN: usize = 1024;
/// Below this many dropped connections in buckets, no compaction.
const COMPACT_AT: usize = 1024;

/// Every live group, to share one per wheel and timeout: looked at once per `IdleIo::new`.
static GROUPS: Mutex<Vec<Weak<Group>>> = Mutex::new(Vec::new());

/// The idle connections of one wheel with one timeout.
pub(crate) struct Group {
    wheel: Wheel,
    clock: Clock,
    timeout: Duration,
    /// The timeout in nanoseconds, saturating at [`NEVER`].
    timeout_nanos: u64,
    /// Ticks between coarse buckets.
    coarse: u64,
    filed: Mutex<Filed>,
    /// An earlier bucket was made than the one the sweeper sleeps until.
    earlier: Notify,
    /// Dropped connections still in a bucket or the sweeper's hands.
    dropped: AtomicUsize,
    /// Connections (`IdleIo`s) alive.
    live: AtomicUsize,
}

struct Filed {
    /// Tick → the connections to look at once it comes ([`NEVER_TICK`]: only at a stop).
    buckets: BTreeMap<u64, Vec<Arc<Idle>>>,
    /// Connections in `buckets`.
    len: usize,
    /// A sweeper task is running.
    sweeping: bool,
    /// The tick the sweeper sleeps until.
    waiting_for: u64,
    /// The sweeper stopped for good (the wheel stopped): nothing can be filed.
    stopped: bool,
}

/// What [`Group::file`] did.
pub(super) enum Filing {
    Filed,
    /// The status word moved before the connection was filed: look again.
    Raced,
    /// The wheel stopped.
    Stopped,
}

/// What the sweeper does with one connection.
enum Verdict {
    Discard,
    Refile(u64),
    Unfiled { wake: bool },
}

impl Group {
    /// The group of `wheel` and `timeout`, shared by every `IdleIo` made with both.
    pub(crate) fn of(wheel: &Wheel, timeout: Duration) -> Arc<Group> {
        let mut groups = GROUPS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        groups.retain(|group| group.strong_count() > 0);
        let found = groups.iter().filter_map(Weak::upgrade).find(|group| {
            Arc::ptr_eq(&group.wheel.inner, &wheel.inner) && group.timeout == timeout
        });
        if let Some(group) = found {
            return group;
        }
        let clock = wheel.shared().clock;
        let tick = u64::try_from(clock.tick().as_nanos()).unwrap_or(u64::MAX);
        let timeout_nanos = u64::try_from(timeout.as_nanos()).map_or(NEVER, |t| t.min(NEVER));
        let group = Arc::new(Group {
            wheel: wheel.clone(),
            clock,
            timeout,
            timeout_nanos,
            coarse: (timeout_nanos / tick / COARSE_PER_TIMEOUT).max(1),
            filed: Mutex::new(Filed {
                buckets: BTreeMap::new(),
                len: 0,
                sweeping: false,
                waiting_for: NEVER_TICK,
                stopped: false,
            }),
            earlier: Notify::new(),
            dropped: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
        });
        groups.push(Arc::downgrade(&group));
        group
    }

    pub(super) fn wheel(&self) -> &Wheel {
        &self.wheel
    }

    pub(super) fn clock(&self) -> Clock {
        self.clock
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// When a connection whose last traffic was at `activity` may close ([`NEVER`]: never).
    pub(super) fn deadline_after(&self, activity: u64) -> u64 {
        activity.saturating_add(self.timeout_nanos).min(NEVER)
    }

    fn lock(&self) -> MutexGuard<'_, Filed> {
        // Nothing in the critical sections panics midway; a poisoned lock is still sound.
        self.filed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The bucket for `deadline` seen at `now`: its tick, or a coarse tick before it (never
    /// now's) if the deadline is more than a coarse step away.
    fn bucket(&self, deadline: u64, now: u64) -> u64 {
        let tick = self.clock.tick_of(deadline);
        if tick != NEVER_TICK && tick > self.clock.tick_at(now) + self.coarse {
            tick - tick % self.coarse
        } else {
            tick
        }
    }

    /// Files `idle`, whose status the IO read as `status` (not filed), for `deadline`.
    pub(super) fn file(
        self: &Arc<Self>,
        idle: &Arc<Idle>,
        status: u32,
        deadline: u64,
        now: u64,
    ) -> Filing {
        let bucket = self.bucket(deadline, now);
        let mut filed = self.lock();
        if filed.stopped {
            return Filing::Stopped;
        }
        if !idle.mark_filed(status) {
            return Filing::Raced;
        }
        filed.buckets.entry(bucket).or_default().push(idle.clone());
        filed.len += 1;
        let spawn = !filed.sweeping;
        let earlier = filed.sweeping && bucket < filed.waiting_for;
        filed.sweeping = true;
        drop(filed);
        if spawn {
            tracing::debug!(wheel = %self.wheel.name(), timeout = ?self.timeout, "idle sweeper starts");
            self.wheel.shared().actors.spawn(sweep(self.clone()));
        } else if earlier {
            self.earlier.notify_one();
        }
        Filing::Filed
    }

    /// A connection (an `IdleIo`) of this group is made.
    pub(super) fn join(&self) {
        self.live.fetch_add(1, Ordering::Relaxed);
    }

    /// The IO owning `idle` is dropped.
    pub(super) fn forget(&self, idle: &Idle) {
        let filed = idle.drop_io();
        let dropped = if filed {
            self.dropped.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.dropped.load(Ordering::Relaxed)
        };
        // AcqRel: the last one out sees every other connection's mark.
        let last = self.live.fetch_sub(1, Ordering::AcqRel) == 1;
        if dropped > 0 && (last || (dropped >= COMPACT_AT && dropped * 2 > self.lock().len)) {
            self.compact();
            if last {
                // The sweeper looks again, finds nothing (unless a connection came
                // meanwhile), and ends.
                self.earlier.notify_one();
            }
        }
    }

    /// Takes every dropped connection out of the buckets.
    fn compact(&self) {
        let mut filed = self.lock();
        let mut removed = 0;
        filed.buckets.retain(|_, bucket| {
            let before = bucket.len();
            bucket.retain(|idle| idle.status() & DROPPED == 0);
            removed += before - bucket.len();
            if bucket.len() < bucket.capacity() / 4 {
                bucket.shrink_to_fit();
            }
            !bucket.is_empty()
        });
        filed.len -= removed;
        drop(filed);
        self.dropped.fetch_sub(removed, Ordering::Relaxed);
        tracing::trace!(removed, "idle connections compacted");
    }

    /// The tick to sleep until, or `None` once nothing is filed (the sweeper ends).
    fn next_tick(&self) -> Option<u64> {
        let mut filed = self.lock();
        match filed.buckets.keys().next() {
            Some(&tick) => {
                filed.waiting_for = tick;
                Some(tick)
            }
            None => {
                filed.sweeping = false;
                None
            }
        }
    }

    /// Takes the connections of every bucket due by `now`.
    fn take_due(&self, now: u64) -> Vec<Arc<Idle>> {
        let mut filed = self.lock();
        let later = filed.buckets.split_off(&(self.clock.tick_at(now) + 1));
        let due = std::mem::replace(&mut filed.buckets, later);
        let due: Vec<Arc<Idle>> = due.into_values().flatten().collect();
        filed.len -= due.len();
        filed.waiting_for = NEVER_TICK;
        due
    }

    /// Judges `idle`, filed and in the sweeper's hands, at `now` (`stopping`: the wheel
    /// stopped, so every connection is handed back to its IO).
    fn judge(&self, idle: &Idle, now: u64, stopping: bool) -> Verdict {
        match idle.look(now, stopping, |last| self.deadline_after(last)) {
            Look::Dropped => {
                self.dropped.fetch_sub(1, Ordering::Relaxed);
                Verdict::Discard
            }
            Look::Moved(deadline) => Verdict::Refile(self.bucket(deadline, now)),
            Look::Unfiled { wake } => Verdict::Unfiled { wake },
        }
    }

    /// Judges `due` at `now`: files again, parks or wakes each.
    async fn sweep_due(&self, due: Vec<Arc<Idle>>, now: u64) {
        let (mut refiled, mut woken) = (0usize, 0usize);
        let mut due = due.into_iter().peekable();
        while due.peek().is_some() {
            let mut again = Vec::new();
            let mut wake = Vec::new();
            for idle in due.by_ref().take(TURN) {
                match self.judge(&idle, now, false) {
                    Verdict::Discard => {}
                    Verdict::Refile(bucket) => again.push((bucket, idle)),
                    Verdict::Unfiled { wake: true } => wake.push(idle),
                    Verdict::Unfiled { wake: false } => {}
                }
            }
            refiled += again.len();
            woken += wake.len();
            if !again.is_empty() {
                let mut filed = self.lock();
                filed.len += again.len();
                for (bucket, idle) in again {
                    filed.buckets.entry(bucket).or_default().push(idle);
                }
            }
            for idle in wake {
                idle.wake();
            }
            tokio::task::yield_now().await;
        }
        tracing::trace!(refiled, woken, "idle sweep");
    }

    /// The wheel stopped (or the sweeper's runtime went away): nothing is filed from now on,
    /// and every filed connection is handed back to its IO, which closes.
    fn stop(&self) {
        let mut filed = self.lock();
        filed.stopped = true;
        filed.sweeping = false;
        filed.len = 0;
        let all = std::mem::take(&mut filed.buckets);
        drop(filed);
        for idle in all.into_values().flatten() {
            if let Verdict::Unfiled { wake: true } = self.judge(&idle, 0, true) {
                idle.wake();
            }
        }
        tracing::debug!(wheel = %self.wheel.name(), "idle sweeper stopped with its wheel");
    }
}

/// Stops the group if its sweeper is dropped before it finished (its runtime went away), so
/// no connection waits on a sweeper that is gone.
struct Sweeping<'a> {
    group: &'a Group,
    finished: bool,
}

impl Drop for Sweeping<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.group.stop();
        }
    }
}

/// The sweeper: runs while anything is filed.
async fn sweep(group: Arc<Group>) {
    let mut sweeping = Sweeping {
        group: &group,
        finished: false,
    };
    let mut sleep = pin!(group.wheel.sleep(Duration::MAX));
    while let Some(tick) = group.next_tick() {
        let at = group.clock.instant(group.clock.tick_start(tick));
        sleep.as_mut().reset(at);
        let earlier = pin!(group.earlier.notified());
        if let Either::Right(_) = select(sleep.as_mut(), earlier).await {
            continue;
        }
        if group.wheel.is_shutdown() {
            group.stop();
            break;
        }
        let now = group.clock.now();
        let due = group.take_due(now);
        group.sweep_due(due, now).await;
    }
    sweeping.finished = true;
    tracing::debug!(wheel = %group.wheel.name(), "idle sweeper ends: nothing filed");
}
