//! What an `IdleIo` and its handles share: one small block per connection, whose status word
//! orders a request's end, the sweeper's look and the IO's decision to close.

#[cfg(loom)]
use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::task::Waker;
use std::time::Duration;

use futures::task::AtomicWaker;
use once_cell::race::OnceBox;
use tokio::time::Instant;

/// The offset that means "never".
pub(super) const NEVER: u64 = u64::MAX;

/// Time as a wheel's idle connections count it: nanoseconds since their group was made, and
/// the wheel's tick — from the public clock (tokio's `Instant`, paused or not) and
/// [`Wheel::tick`](crate::Wheel::tick), nothing of the wheel's insides.
#[derive(Debug, Clone, Copy)]
pub(super) struct IdleClock {
    origin: Instant,
    tick: u64,
}

impl IdleClock {
    pub(super) fn new(tick: Duration) -> IdleClock {
        IdleClock {
            origin: Instant::now(),
            tick: u64::try_from(tick.as_nanos()).unwrap_or(u64::MAX).max(1),
        }
    }

    /// The offset of now; always short of [`NEVER`].
    pub(super) fn now(&self) -> u64 {
        let since = Instant::now().saturating_duration_since(self.origin);
        u64::try_from(since.as_nanos()).map_or(NEVER - 1, |nanos| nanos.min(NEVER - 1))
    }

    pub(super) fn tick_nanos(&self) -> u64 {
        self.tick
    }

    /// The tick an offset rounds up to ([`NEVER`] for never).
    pub(super) fn tick_of(&self, offset: u64) -> u64 {
        if offset == NEVER {
            NEVER
        } else {
            offset.div_ceil(self.tick)
        }
    }

    /// The last tick that has begun at `offset`.
    pub(super) fn tick_at(&self, offset: u64) -> u64 {
        offset / self.tick
    }

    /// Where tick `tick` begins.
    pub(super) fn tick_start(&self, tick: u64) -> u64 {
        tick.saturating_mul(self.tick)
    }

    /// The instant at `offset`; `None` for never (or past what an `Instant` holds).
    pub(super) fn instant(&self, offset: u64) -> Option<Instant> {
        if offset == NEVER {
            return None;
        }
        self.origin.checked_add(Duration::from_nanos(offset))
    }
}

/// Live [`Busy`](super::Busy) guards: the low bits of the status word.
pub(super) const BUSY: u32 = (1 << 26) - 1;
/// The IO found the connection closable and looks once more before closing: a read or write
/// that moves bytes meanwhile takes it back.
pub(super) const QUIET: u32 = 1 << 26;
/// The IdleIo is gone: the sweeper drops the block when it meets it.
pub(super) const DROPPED: u32 = 1 << 27;
/// Closed because the wheel stopped (with [`CLOSED`]).
pub(super) const SHUT: u32 = 1 << 28;
/// The IO closed the connection.
pub(super) const CLOSED: u32 = 1 << 29;
/// Found busy with nothing filed: the last guard's drop wakes the IO, which files again.
pub(super) const PARKED: u32 = 1 << 30;
/// Filed with the group's sweeper (in a bucket, or in the sweeper's hands): only the IO
/// sets it, only the sweeper (or its stop) clears it, so the block is in at most one bucket.
pub(super) const FILED: u32 = 1 << 31;

/// One per connection, behind an `Arc` the IO, its handles, its guards and (while filed) the
/// sweeper share. Kept to 56 bytes (72 with the `Arc`'s counts): it is most of what an idle
/// connection costs.
pub(super) struct Idle {
    /// The last traffic, as an [`IdleClock`] offset: only ever moves forward.
    activity: AtomicU64,
    /// The idle timeout in nanoseconds ([`u64::MAX`]: longer than `u64` nanoseconds hold,
    /// never).
    timeout: u64,
    /// Live guards and the flags above.
    status: AtomicU32,
    /// Guards whose release waits for the IO's next completed flush (a response handed to
    /// the connection but perhaps not yet written: [`hold_until_flushed`](Idle::hold_until_flushed)).
    /// Each still counts in `status`.
    unflushed: AtomicU32,
    /// The task waiting on a read.
    read: AtomicWaker,
    /// The task waiting on a write or flush, if one ever did: made then, since most
    /// connections' writes never wait (a split IO has two tasks to wake; hyper has one).
    write: OnceBox<AtomicWaker>,
}

/// What the IO's look at an unfiled block found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Parking {
    /// A request is in progress: the IO waits, and the last guard's drop wakes it.
    Parked,
    /// No request in progress: the IO judges the traffic itself.
    Free,
    /// The word moved meanwhile: look again.
    Raced,
}

/// What the sweeper's look at a filed block found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Look {
    /// The IO is gone: drop the block.
    Dropped,
    /// Traffic since: file it again for this deadline.
    Moved(u64),
    /// Taken out of the group; `wake`: the IO must look (idle, or the wheel stopped), else a
    /// request is in progress and its last guard wakes the IO.
    Unfiled { wake: bool },
}

impl Idle {
    pub(super) fn new(activity: u64, status: u32, timeout: Duration) -> Idle {
        Idle {
            activity: AtomicU64::new(activity),
            timeout: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
            status: AtomicU32::new(status),
            unflushed: AtomicU32::new(0),
            read: AtomicWaker::new(),
            write: OnceBox::new(),
        }
    }

    pub(super) fn timeout(&self) -> Duration {
        match self.timeout {
            u64::MAX => Duration::MAX,
            nanos => Duration::from_nanos(nanos),
        }
    }

    pub(super) fn timeout_nanos(&self) -> u64 {
        self.timeout
    }

    /// When the connection may close if no traffic comes after the last ([`NEVER`]: never).
    pub(super) fn deadline(&self) -> u64 {
        self.last_activity().saturating_add(self.timeout)
    }

    /// Traffic at `now` (a clock offset).
    pub(super) fn touch(&self, now: u64) {
        // `fetch_max`, not `store`: a touch racing a read must not move the mark back.
        self.activity.fetch_max(now, Ordering::Relaxed);
    }

    /// The last traffic. Read after [`status`](Self::status) (acquire), it includes the
    /// touch of every guard whose release that status shows.
    pub(super) fn last_activity(&self) -> u64 {
        self.activity.load(Ordering::Relaxed)
    }

    pub(super) fn status(&self) -> u32 {
        self.status.load(Ordering::Acquire)
    }

    /// Replaces `current` with `new`; false if the word moved meanwhile (look again).
    pub(super) fn swap_status(&self, current: u32, new: u32) -> bool {
        self.status
            .compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Sets `flags`, returning the word before.
    pub(super) fn set(&self, flags: u32) -> u32 {
        self.status.fetch_or(flags, Ordering::AcqRel)
    }

    /// One more guard. Panics past 2^26 − 1 live guards on one connection (no HTTP stack
    /// allows that many requests on a connection at once).
    pub(super) fn acquire(&self) {
        let before = self.status.fetch_add(1, Ordering::AcqRel);
        if before & BUSY == BUSY {
            self.status.fetch_sub(1, Ordering::AcqRel);
            panic!("tokio-wheel: over 2^26 Busy guards alive on one connection");
        }
    }

    /// One guard fewer, after the traffic at `now`: true if it was the last and the IO
    /// parked on it (so the caller wakes the IO).
    pub(super) fn release(&self, now: u64) -> bool {
        // Before the release: the IO or sweeper that sees the count reach zero sees this
        // traffic.
        self.touch(now);
        let before = self.status.fetch_sub(1, Ordering::AcqRel);
        before & BUSY == 1
            && before & PARKED != 0
            && self.status.fetch_and(!PARKED, Ordering::AcqRel) & PARKED != 0
    }

    /// A guard whose release waits for the IO's next completed flush: it stays counted.
    pub(super) fn hold_until_flushed(&self) {
        self.unflushed.fetch_add(1, Ordering::AcqRel);
    }

    /// The IO completed a flush (at `now()`, read only if needed): releases the guards that
    /// waited for it. True if the last one went and the IO had parked on it (so the caller
    /// wakes the IO).
    pub(super) fn flushed(&self, now: impl FnOnce() -> u64) -> bool {
        // A load first: most flushes find nothing held, and then read no clock and write no
        // shared line.
        if self.unflushed.load(Ordering::Acquire) == 0 {
            return false;
        }
        let held = self.unflushed.swap(0, Ordering::AcqRel);
        let now = now();
        let mut wake = false;
        for _ in 0..held {
            wake |= self.release(now);
        }
        wake
    }

    /// The IO, finding the block unfiled with `status`, parks it if a request is in progress.
    pub(super) fn park_if_busy(&self, status: u32) -> Parking {
        if status & BUSY == 0 {
            Parking::Free
        } else if status & PARKED != 0 || self.swap_status(status, (status | PARKED) & !QUIET) {
            Parking::Parked
        } else {
            Parking::Raced
        }
    }

    /// The sweeper's look at a block it holds (filed) at `now`; `stopping` hands every block
    /// back.
    pub(super) fn look(&self, now: u64, stopping: bool) -> Look {
        loop {
            let status = self.status();
            if status & DROPPED != 0 {
                return Look::Dropped;
            }
            let busy = status & BUSY != 0;
            if !stopping && !busy {
                // Read after the status (acquire): a guard's last touch is visible.
                let deadline = self.deadline();
                if deadline > now {
                    return Look::Moved(deadline);
                }
            }
            let parked = busy && !stopping;
            let unfiled = if parked {
                (status & !FILED) | PARKED
            } else {
                status & !FILED
            };
            if self.swap_status(status, unfiled) {
                return Look::Unfiled { wake: !parked };
            }
        }
    }

    /// The IO files the block it found unfiled with `status`; false if the word moved
    /// meanwhile (a guard came or went: look again).
    pub(super) fn mark_filed(&self, status: u32) -> bool {
        self.swap_status(status, (status | FILED) & !(PARKED | QUIET))
    }

    /// The IO moved bytes: whatever it found closable before is not any more.
    pub(super) fn moved(&self, now: u64) {
        self.touch(now);
        if self.status.load(Ordering::Relaxed) & QUIET != 0 {
            self.status.fetch_and(!QUIET, Ordering::Relaxed);
        }
    }

    /// The IO is dropped: true if the block was filed (so a group holds it, to be swept out).
    pub(super) fn drop_io(&self) -> bool {
        self.set(DROPPED) & FILED != 0
    }

    pub(super) fn busy_count(&self) -> usize {
        (self.status.load(Ordering::Relaxed) & BUSY) as usize
    }

    pub(super) fn register_read(&self, waker: &Waker) {
        self.read.register(waker);
    }

    pub(super) fn register_write(&self, waker: &Waker) {
        self.write
            .get_or_init(|| Box::new(AtomicWaker::new()))
            .register(waker);
    }

    /// Wakes the tasks waiting on the connection, to look at it again.
    pub(super) fn wake(&self) {
        self.read.wake();
        if let Some(write) = self.write.get() {
            write.wake();
        }
    }
}

#[cfg(all(test, loom))]
mod loom_model {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    fn park(idle: &Idle) -> bool {
        loop {
            match idle.park_if_busy(idle.status()) {
                Parking::Parked => return true,
                Parking::Free => return false,
                Parking::Raced => continue,
            }
        }
    }

    /// The last request ends while the IO decides to wait on it: if the IO parked, the last
    /// guard's drop wakes it; if the drop came first, the IO finds no request and sees its
    /// touch.
    #[test]
    fn loom_model_a_parked_io_is_woken_by_the_last_guard() {
        loom::model(|| {
            let idle = Arc::new(Idle::new(0, 0, Duration::from_nanos(100)));
            idle.acquire();
            idle.acquire();
            let guards: Vec<_> = [10, 20]
                .into_iter()
                .map(|now| {
                    let idle = idle.clone();
                    thread::spawn(move || idle.release(now))
                })
                .collect();
            let parked = park(&idle);
            if !parked {
                // Both releases came before the IO's look: it sees both touches.
                assert_eq!(idle.last_activity(), 20);
            }
            let woken = guards
                .into_iter()
                .map(|guard| guard.join().unwrap())
                .filter(|&woke| woke)
                .count();
            assert_eq!(woken, usize::from(parked));
        });
    }

    /// The sweeper looks at a filed connection while its last request ends (timeout zero):
    /// set aside as busy, the release wakes the IO; released first, the sweeper wakes it.
    /// Never both, never neither, never filed again.
    #[test]
    fn loom_model_a_connection_the_sweeper_sets_aside_is_woken_by_its_last_guard() {
        loom::model(|| {
            let idle = Arc::new(Idle::new(0, FILED, Duration::ZERO));
            idle.acquire();
            let guard = {
                let idle = idle.clone();
                thread::spawn(move || idle.release(10))
            };
            let look = idle.look(10, false);
            let released_wake = guard.join().unwrap();
            match look {
                Look::Unfiled { wake } => assert_ne!(wake, released_wake),
                other => panic!("{other:?}"),
            }
            assert_eq!(idle.status() & (FILED | PARKED | BUSY), 0);
        });
    }

    /// A response's guard handed to the next flush while the IO flushes and then parks:
    /// the guard is released by this flush or by the next one, never lost, never twice;
    /// and an IO parked on it is woken by the flush that lets it go.
    #[test]
    fn loom_model_a_guard_waiting_for_a_flush_is_released_by_one_flush() {
        loom::model(|| {
            let idle = Arc::new(Idle::new(0, 0, Duration::from_nanos(100)));
            idle.acquire();
            let body = {
                let idle = idle.clone();
                thread::spawn(move || idle.hold_until_flushed())
            };
            let first = idle.flushed(|| 10);
            let parked = park(&idle);
            body.join().unwrap();
            // The write that the held response needs flushes again.
            let second = idle.flushed(|| 20);
            assert_eq!(idle.busy_count(), 0, "the guard outlived two flushes");
            // A wake is owed exactly when the IO parked on the guard and a flush let it go.
            assert_eq!(
                usize::from(first) + usize::from(second),
                usize::from(parked)
            );
        });
    }

    /// The IO is dropped while the sweeper looks: the group counts the block as dropped
    /// exactly when the sweeper (now or at a later look) finds it so, never otherwise.
    #[test]
    fn loom_model_a_drop_racing_the_sweeper_is_counted_once() {
        loom::model(|| {
            let idle = Arc::new(Idle::new(0, FILED, Duration::from_nanos(100)));
            let dropper = {
                let idle = idle.clone();
                thread::spawn(move || idle.drop_io())
            };
            let look = idle.look(200, false);
            let counted = dropper.join().unwrap();
            assert_eq!(counted, look == Look::Dropped, "{look:?}");
        });
    }
}
