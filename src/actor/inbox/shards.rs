//! The inbox's state: its shards, each a command queue and a free list behind a lock, padded
//! to its own cache lines; and how urgently a command must be seen.

#[cfg(loom)]
use loom::sync::atomic::{AtomicBool, AtomicU64};
#[cfg(loom)]
use loom::sync::{Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicBool, AtomicU64};
#[cfg(not(loom))]
use std::sync::{Condvar, Mutex, MutexGuard};

use std::collections::VecDeque;

use tokio::sync::Notify;

/// Keeps each shard on its own cache lines.
#[repr(align(128))]
#[derive(Debug)]
pub(super) struct Padded<T>(pub(super) T);

#[derive(Debug)]
pub(super) struct Shard<C> {
    pub(super) commands: VecDeque<C>,
    /// A send since the actor last took this shard has notified it.
    pub(super) notified: bool,
    /// A send since the actor last took this shard has set the inbox's `pending` flag: later
    /// sends into it skip that store and its fence (the flag is one line all shards share).
    pub(super) flagged: bool,
    /// Pool slots this shard may hand out.
    pub(super) free: Vec<u32>,
    /// The actor stopped: sends are refused.
    pub(super) stopped: bool,
    /// Senders waiting for room in this shard (a full shard).
    pub(super) waiting: usize,
    /// A sender waited [`STALL`] for the actor to take this full shard in vain (the actor's
    /// runtime is not being driven): until the actor takes it, sends no longer wait.
    pub(super) stalled: bool,
}

/// A shard behind its lock, and where senders wait for the actor to take it.
pub(super) type Room<C> = (Mutex<Shard<C>>, Condvar);

/// How soon the actor must see a command. A send wakes the actor only if it would not
/// otherwise look at its inbox in time: most commands cost no wake-up at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Urgency {
    /// At once: a barrier, or a question someone awaits.
    Now,
    /// By this deadline (a clock offset): a wake-up only if the actor sleeps past it.
    By(u64),
    /// Soon, within [`LAZY_BOUND`]: releases and cancellations, which only give memory back.
    /// While commands flow the actor keeps a look armed within that bound (see `actor`'s
    /// "lazy look"), so these wake it only after a quiet spell.
    Lazy,
}

/// The command queue of one actor.
#[derive(Debug)]
pub(crate) struct Inbox<C> {
    /// Each shard, and where its senders wait for room.
    pub(super) shards: Box<[Padded<Room<C>>]>,
    /// Commands a shard holds before a send waits for the actor to take them.
    pub(super) bound: usize,
    /// Commands a shard holds when a send wakes the actor whatever their urgency
    /// ([`taking_early`](Self::taking_early)); `usize::MAX`: never.
    pub(super) early_take: usize,
    /// The runtime the actor runs on, when it is a current-thread one: a send made on that
    /// runtime's thread must not wait (it may be the thread the actor needs). `None` and
    /// [`actor_known`](Self::actor_known) false: not said, so no current-thread runtime
    /// waits.
    pub(super) actor_current_thread: Option<tokio::runtime::Id>,
    pub(super) actor_known: bool,
    pub(super) wake: Notify,
    /// Every handle that can send is gone.
    pub(super) senders_gone: AtomicBool,
    /// The clock offset the actor will next look at its inbox by itself (`u64::MAX`: not
    /// before a command wakes it). Stored before the actor's last look at the shards, read
    /// under a shard's lock: a sender either sees it or the actor sees the sender's command.
    pub(super) next_look: AtomicU64,
    /// Whether that next look comes within [`LAZY_BOUND`].
    pub(super) looks_soon: AtomicBool,
    /// Set by a send into an empty shard, cleared when the actor takes: lets the actor see
    /// whether anything came in without taking every shard's lock.
    pub(super) pending: AtomicBool,
    /// Set while the actor waits for pool slots to come back (a memory release found
    /// segments still in use): handles then release fired timers' slots through the actor,
    /// which counts them, rather than straight into a free list ([`give_back`]).
    ///
    /// [`give_back`]: Self::give_back
    pub(super) watch_returns: AtomicBool,
}

impl<C> Inbox<C> {
    pub(super) fn lock(&self, shard: usize) -> MutexGuard<'_, Shard<C>> {
        // No code panics while holding these locks; recover the data if it ever happens.
        self.shards[shard]
            .0
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
