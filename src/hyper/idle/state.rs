//! What an `IdleIo` and its handles share: one small block per connection, whose status word
//! orders a request's end, the sweeper's look and the IO's decision to close.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::task::Waker;

use futures::task::AtomicWaker;
use once_cell::race::OnceBox;

/// Live [`Busy`](super::Busy) guards: the low bits of the status word.
pub(super) const BUSY: u32 = (1 << 27) - 1;
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
/// sweeper share. Kept to 48 bytes (64 with the `Arc`'s counts): it is most of what an idle
/// connection costs.
pub(super) struct Idle {
    /// The last traffic, as the wheel clock's offset (nanoseconds since its origin): only
    /// ever moves forward.
    activity: AtomicU64,
    /// Live guards and the flags above.
    status: AtomicU32,
    /// The task waiting on a read.
    read: AtomicWaker,
    /// The task waiting on a write or flush, if one ever did: made then, since most
    /// connections' writes never wait (a split IO has two tasks to wake; hyper has one).
    write: OnceBox<AtomicWaker>,
}

impl Idle {
    pub(super) fn new(activity: u64, status: u32) -> Idle {
        Idle {
            activity: AtomicU64::new(activity),
            status: AtomicU32::new(status),
            read: AtomicWaker::new(),
            write: OnceBox::new(),
        }
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

    /// One more guard. Panics past 2^27 − 1 live guards on one connection (no HTTP stack
    /// allows that many requests on a connection at once).
    pub(super) fn acquire(&self) {
        let before = self.status.fetch_add(1, Ordering::AcqRel);
        if before & BUSY == BUSY {
            self.status.fetch_sub(1, Ordering::AcqRel);
            panic!("tokio-wheel: over 2^27 Busy guards alive on one connection");
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
