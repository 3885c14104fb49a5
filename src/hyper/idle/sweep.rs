//! The idle connections of one wheel, filed by deadline tick, and the one task that sweeps
//! them: a connection costs a pointer in a bucket instead of a wheel timer.
//!
//! A connection is filed when its IO first waits, under the tick its idle deadline rounds up
//! to — or, when that is far off, under an earlier coarse tick (a sixteenth of its timeout
//! apart), so the buckets stay few and full. Each bucket knows when it is due: the earliest
//! exact deadline among its connections, or its coarse tick's start. The sweeper sleeps on
//! one wheel timer until the first bucket is due (so the deadline is rounded once, as a
//! `Sleep`'s is), then judges each connection in it by its own last traffic:
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

use std::any::Any;
use std::collections::BTreeMap;
use std::pin::pin;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::{Either, select};
use tokio::sync::Notify;

use super::state::{DROPPED, Idle, IdleClock, Look, NEVER};
use crate::Wheel;

/// How many coarse buckets a timeout spans: connections far from their deadline share
/// buckets this wide, and are looked at once more when it comes.
const COARSE_PER_TIMEOUT: u64 = 16;
/// Connections the sweeper judges between yields to its runtime.
const TURN: usize = 1024;
/// Below this many dropped connections in buckets, no compaction.
const COMPACT_AT: usize = 1024;

/// The idle connections of one wheel, whatever their timeouts.
pub(crate) struct Group {
    wheel: Wheel,
    clock: IdleClock,
    filed: Mutex<Filed>,
    /// An earlier bucket was made than the one the sweeper sleeps until.
    earlier: Notify,
    /// Dropped connections still in a bucket or the sweeper's hands. Signed: the sweeper may
    /// take one out before its drop has counted it.
    dropped: AtomicIsize,
    /// Connections (`IdleIo`s) alive.
    live: AtomicUsize,
}

struct Filed {
    /// Tick → the connections to look at once it is due ([`NEVER`]: only at a stop).
    /// Buckets in tick order are due in order too: a coarse bucket is due at its tick's
    /// start, a fine one at its earliest deadline, which is after the previous tick's start.
    buckets: BTreeMap<u64, Bucket>,
    /// Connections in `buckets`.
    len: usize,
    /// A sweeper task is running.
    sweeping: bool,
    /// When the sweeper wakes (a clock offset; [`NEVER`]: only at a stop).
    waiting_for: u64,
    /// The sweeper stopped for good (the wheel stopped): nothing can be filed.
    stopped: bool,
}

struct Bucket {
    /// When to look (a clock offset): no connection in it is due before.
    due: u64,
    idle: Vec<Arc<Idle>>,
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
    /// Into this bucket, due then.
    Refile((u64, u64)),
    Unfiled {
        wake: bool,
    },
}

impl Group {
    /// The group of `wheel`'s idle connections, made on first use.
    pub(crate) fn of(wheel: &Wheel) -> Arc<Group> {
        let mut layer = wheel
            .inner
            .layer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(group) = layer.upgrade().and_then(|any| any.downcast::<Group>().ok()) {
            return group;
        }
        let group = Arc::new(Group {
            wheel: wheel.clone(),
            clock: IdleClock::new(wheel.tick()),
            filed: Mutex::new(Filed {
                buckets: BTreeMap::new(),
                len: 0,
                sweeping: false,
                waiting_for: NEVER,
                stopped: false,
            }),
            earlier: Notify::new(),
            dropped: AtomicIsize::new(0),
            live: AtomicUsize::new(0),
        });
        let any: Arc<dyn Any + Send + Sync> = group.clone();
        *layer = Arc::downgrade(&any);
        group
    }

    pub(super) fn wheel(&self) -> &Wheel {
        &self.wheel
    }

    pub(super) fn clock(&self) -> IdleClock {
        self.clock
    }

    fn lock(&self) -> MutexGuard<'_, Filed> {
        // Nothing in the critical sections panics midway; a poisoned lock is still sound.
        self.filed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The bucket for `deadline` of a connection with `timeout` (nanoseconds), seen at
    /// `now`, and when it is due: its tick and the deadline itself, or, if the deadline is
    /// more than a coarse step (a sixteenth of the timeout) away, a coarse tick before it
    /// (never now's) and that tick's start.
    fn bucket(&self, deadline: u64, timeout: u64, now: u64) -> (u64, u64) {
        let tick = self.clock.tick_of(deadline);
        if tick == NEVER {
            return (NEVER, NEVER);
        }
        let coarse = (timeout / self.clock.tick_nanos() / COARSE_PER_TIMEOUT).max(1);
        let start = tick - tick % coarse;
        if start < tick && tick > self.clock.tick_at(now) + coarse {
            (start, self.clock.tick_start(start))
        } else {
            (tick, deadline)
        }
    }

    /// Puts `idle` in `bucket`, due at `due`.
    fn insert(filed: &mut Filed, (bucket, due): (u64, u64), idle: Arc<Idle>) {
        let bucket = filed.buckets.entry(bucket).or_insert_with(|| Bucket {
            due,
            idle: Vec::new(),
        });
        bucket.due = bucket.due.min(due);
        bucket.idle.push(idle);
        filed.len += 1;
    }

    /// Files `idle`, whose status the IO read as `status` (not filed), for `deadline`.
    pub(super) fn file(
        self: &Arc<Self>,
        idle: &Arc<Idle>,
        status: u32,
        deadline: u64,
        now: u64,
    ) -> Filing {
        let (bucket, due) = self.bucket(deadline, idle.timeout_nanos(), now);
        let mut filed = self.lock();
        if filed.stopped {
            return Filing::Stopped;
        }
        if !idle.mark_filed(status) {
            return Filing::Raced;
        }
        Group::insert(&mut filed, (bucket, due), idle.clone());
        let spawn = !filed.sweeping;
        let earlier = filed.sweeping && due < filed.waiting_for;
        filed.sweeping = true;
        drop(filed);
        if spawn {
            tracing::debug!(wheel = %self.wheel.name(), "idle sweeper starts");
            self.wheel.runtime().spawn(sweep(self.clone()));
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
        let dropped = usize::try_from(dropped).unwrap_or(0);
        // AcqRel: the last one out sees every other connection's mark.
        let last = self.live.fetch_sub(1, Ordering::AcqRel) == 1;
        if dropped > 0 && (last || (dropped >= COMPACT_AT && dropped > self.lock().len / 2)) {
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
            let before = bucket.idle.len();
            bucket.idle.retain(|idle| idle.status() & DROPPED == 0);
            removed += before - bucket.idle.len();
            if bucket.idle.len() < bucket.idle.capacity() / 4 {
                bucket.idle.shrink_to_fit();
            }
            !bucket.idle.is_empty()
        });
        filed.len -= removed;
        drop(filed);
        self.dropped.fetch_sub(removed as isize, Ordering::Relaxed);
        tracing::trace!(removed, "idle connections compacted");
    }

    /// When to wake next (a clock offset), or `None` once nothing is filed (the sweeper
    /// ends).
    fn next_due(&self) -> Option<u64> {
        let mut filed = self.lock();
        match filed.buckets.values().next() {
            Some(bucket) => {
                let due = bucket.due;
                filed.waiting_for = due;
                Some(due)
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
        let mut due = Vec::new();
        while let Some(entry) = filed.buckets.first_entry() {
            if entry.get().due > now {
                break;
            }
            due.append(&mut entry.remove().idle);
        }
        filed.len -= due.len();
        filed.waiting_for = NEVER;
        due
    }

    /// Judges `idle`, filed and in the sweeper's hands, at `now` (`stopping`: the wheel
    /// stopped, so every connection is handed back to its IO).
    fn judge(&self, idle: &Idle, now: u64, stopping: bool) -> Verdict {
        match idle.look(now, stopping) {
            Look::Dropped => {
                self.dropped.fetch_sub(1, Ordering::Relaxed);
                Verdict::Discard
            }
            Look::Moved(deadline) => {
                Verdict::Refile(self.bucket(deadline, idle.timeout_nanos(), now))
            }
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
                for (bucket, idle) in again {
                    Group::insert(&mut filed, bucket, idle);
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
        for idle in all.into_values().flat_map(|bucket| bucket.idle) {
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
    // Beyond the wheel's range: a sleep until then ends only when the wheel stops.
    let never = sleep.deadline();
    while let Some(due) = group.next_due() {
        sleep
            .as_mut()
            .reset(group.clock.instant(due).unwrap_or(never));
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
