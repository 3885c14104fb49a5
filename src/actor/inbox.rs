//! The command queue from handles to an actor.
//!
//! Per-thread shards, each a mutex-guarded `VecDeque` that the actor swaps out whole, rather
//! than a channel: a send is one uncontended lock and a push (no per-message allocation), the
//! actor takes every queued command with one swap per shard, and it is woken only by the send
//! that finds a shard empty — while it is busy, senders never touch its waker. A thread always
//! sends to the same shard, so producers on different threads do not contend, and a shard's
//! lock and buffers stay in its thread's cache.
//!
//! The timer actor's shards also keep free lists of timer-pool slots: registering a timer takes
//! a slot and queues its command under the one lock, and the actor gives released slots back to
//! the shard that released them.
//!
//! Order: commands sent to one shard apply in the order they were sent. A timer's handle sends
//! all its commands to the shard it registered in. A keyed set's handles send to their
//! thread's shard, each command counted under the shard's lock ([`Inbox::send_made`]), and
//! its actor takes the shards apart ([`Inbox::take_each`]) and merges them back in the order
//! the commands were made (`actor::keyed::order`). [`Inbox::take_all`] takes the shards one
//! after another, so a command sent to another shard just before may wait for the next turn:
//! barriers ([`Wheel::flush`](crate::Wheel::flush)) take everything once more before
//! answering.
//!
//! Bounded under any flood: a shard holds at most [`Inbox::bound`] commands (a share of
//! [`BOUND_COMMANDS`] for the whole inbox). A send that fills its shard waits until the actor
//! takes it — through `tokio::task::block_in_place` on a multi-thread runtime (the worker's
//! other tasks, the actor among them, move to another thread), blocking a thread outside any
//! runtime — so commands waiting for the actor take at most twice the bound (in the shards and
//! in the actor's batch), and an authoritative call queued behind them is answered within that
//! many applies. A sender waits at most [`STALL`] (1 s) for an actor that takes nothing (its
//! current-thread runtime not driven, say: waiting longer could deadlock a program whose
//! driver waits for that sender); until the actor takes the shard, its sends then go on
//! without waiting. Never on the thread of the current-thread runtime the actor runs on (the
//! actor needs that very thread) nor from inside the actor (a value's `Drop` it runs): there a
//! flood stays unbounded, as a task that never yields would starve that runtime anyway. (Other
//! current-thread runtimes' threads wait like any thread.) The actor applies
//! what it takes in slices, bounded in time, firing and yielding to the runtime in between
//! (see `actor::run`).
//!
//! Here: the senders' paths. `shards`: the state behind each lock; `room`: the bound, and
//! where a sender waits; `slots`: the timer pool's free lists; `take`: the actor's side
//! (taking, trimming, stopping). Imports run one way: this file uses its parts, they use
//! only `shards`.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;

#[cfg(loom)]
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
#[cfg(loom)]
use loom::sync::{Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
#[cfg(not(loom))]
use std::sync::{Condvar, Mutex, MutexGuard};

use tokio::sync::Notify;

mod room;
mod shards;
mod slots;
mod take;

use room::MIN_SHARD_BOUND;
pub(crate) use room::{BOUND_COMMANDS, as_actor};
pub(crate) use shards::{Inbox, Urgency};
use shards::{Padded, Shard};

/// Commands queued in a shard at which a send wakes the actor whatever their urgency, in an
/// inbox [`taking_early`](Inbox::taking_early): a producer that queues thousands of commands
/// no one waits for yet (keys set a minute ahead, in bulk) then has the actor apply them
/// beside it, on another core, rather than all at once when it finally asks for an answer.
/// One wake-up per this many commands.
const EARLY_TAKE: usize = 512;

/// Every shard of an inbox, locked ([`Inbox::lock_every_shard`]).
pub(crate) struct EveryShard<'a, C> {
    inbox: &'a Inbox<C>,
    states: Vec<MutexGuard<'a, Shard<C>>>,
}

impl<C> EveryShard<'_, C> {
    /// Queues what `make` builds into `shard`, unless the actor has stopped; returns whether
    /// it did, and if so whether the actor must be notified once the locks are let go
    /// ([`Inbox::notify_if`]).
    pub(crate) fn queue_made(
        &mut self,
        shard: usize,
        urgency: Urgency,
        make: impl FnOnce() -> C,
    ) -> Option<bool> {
        self.inbox
            .queue_made(&mut self.states[shard], urgency, make)
    }
}

/// How long a command that only gives memory back may wait for the actor's next wake-up.
pub(crate) const LAZY_BOUND: u64 = 10_000_000;

/// What a withdrawn command leaves in its place in the queue (positions must stay stable for
/// the commands after it): a no-op the actor skips.
pub(crate) trait Placeholder {
    fn placeholder() -> Self;
    fn is_placeholder(&self) -> bool;
}

/// Lets another worker run a task this worker just woke (the actor, for an early take) while
/// the current task goes on. tokio's multi-thread scheduler puts a task woken from a worker
/// into that worker's LIFO slot, which no other worker may steal: the actor would run only once
/// the producer yields — what a request-shaped producer wants (it yields soon, and the actor
/// then finds its commands warm in this core's cache), but a bulk load would wait for its whole
/// apply after its own work instead of beside it. A task spawned here takes the LIFO slot in
/// its turn and pushes the woken one into the worker's run queue, and tokio unparks an idle
/// worker to steal it. Costs a spawn of an empty task per early take (one per [`EARLY_TAKE`]
/// commands); elsewhere (a current-thread runtime, a thread outside any runtime, whose wakes
/// need no help) it does nothing.
fn hand_to_an_idle_worker() {
    if let Ok(here) = tokio::runtime::Handle::try_current() {
        if here.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
            drop(here.spawn(async {}));
        }
    }
}

/// A number per thread, spreading threads over shards.
pub(crate) fn thread_seed() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    use std::sync::atomic::Ordering;
    thread_local! {
        static SEED: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SEED.with(|seed| {
        if seed.get() == usize::MAX {
            seed.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        seed.get()
    })
}

impl<C> Inbox<C> {
    /// An inbox with `shards` shards (at least one).
    pub(crate) fn new(shards: usize) -> Self {
        let count = shards.max(1);
        let shards = (0..count)
            .map(|_| {
                Padded((
                    Mutex::new(Shard {
                        commands: VecDeque::new(),
                        notified: false,
                        flagged: false,
                        free: Vec::new(),
                        stopped: false,
                        waiting: 0,
                        stalled: false,
                    }),
                    Condvar::new(),
                ))
            })
            .collect();
        Inbox {
            shards,
            bound: (BOUND_COMMANDS / count).max(MIN_SHARD_BOUND),
            early_take: usize::MAX,
            actor_current_thread: None,
            actor_known: false,
            wake: Notify::new(),
            senders_gone: AtomicBool::new(false),
            next_look: AtomicU64::new(u64::MAX),
            looks_soon: AtomicBool::new(false),
            pending: AtomicBool::new(false),
            watch_returns: AtomicBool::new(false),
        }
    }

    /// Queues `command` in a locked shard, and says whether the actor must be notified (a
    /// shard it fills always does: its sender is about to wait for the actor).
    fn push(&self, state: &mut Shard<C>, command: C, urgency: Urgency) -> (u32, bool) {
        let position = state.commands.len() as u32;
        state.commands.push_back(command);
        if !state.flagged {
            // Dekker with the actor's `publish_next_look` + `has_pending`: flag, fence, then
            // read `next_look`; the actor stores `next_look`, fences, then reads the flag. One
            // of the two sees the other's store. Later sends into this shard, until the actor
            // takes it, read `next_look` under its lock after this read, so they see what it
            // saw or later and need no store or fence of their own (a shard emptied by
            // withdrawn registrations and filled again writes no shared line).
            state.flagged = true;
            self.pending.store(true, Ordering::Relaxed);
            fence(Ordering::SeqCst);
        }
        let needed = self.is_full(state)
            || state.commands.len() == self.early_take
            || match urgency {
                Urgency::Now => true,
                Urgency::By(deadline) => deadline < self.next_look.load(Ordering::Relaxed),
                Urgency::Lazy => !self.looks_soon.load(Ordering::Relaxed),
            };
        let notify = needed && !state.notified;
        state.notified |= notify;
        (position, notify)
    }

    /// Has a send wake the actor once its shard holds [`EARLY_TAKE`] commands, whatever their
    /// urgency, and hand it to an idle worker: for a keyed set, whose bulk loads the actor
    /// then applies beside the producer. Not for the timer actors: there a queued sleep
    /// dropped before the actor's lazy look is withdrawn for nothing, and taking early would
    /// file it (measured: one task's schedule + cancel of 10^4 sleeps twice as slow).
    pub(crate) fn taking_early(mut self) -> Self {
        self.early_take = EARLY_TAKE;
        self
    }

    /// The actor will next look at its inbox by itself at offset `at` (if any); `now` is the
    /// current offset. Call before the actor's last look at the shards ([`has_pending`]), so a
    /// sender that misses this sees the actor notice its command instead.
    ///
    /// [`has_pending`]: Self::has_pending
    pub(crate) fn publish_next_look(&self, at: Option<u64>, now: u64) {
        let at = at.unwrap_or(u64::MAX);
        self.next_look.store(at, Ordering::Relaxed);
        self.looks_soon
            .store(at <= now.saturating_add(LAZY_BOUND), Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Whether a send has notified the actor since it last took `shard`.
    #[cfg(test)]
    fn state_notified(&self, shard: usize) -> bool {
        self.lock(shard).notified
    }

    /// Whether a command may have come in since the actor last took the shards. Lock-free;
    /// call after [`publish_next_look`](Self::publish_next_look).
    pub(crate) fn has_pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed)
    }

    /// How many shards suit a runtime: a few per core, so threads rarely share one.
    pub(crate) fn shards_for_this_machine() -> usize {
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        (cores * 2).next_power_of_two().min(64)
    }

    /// The shard the current thread sends to.
    pub(crate) fn shard_for_thread(&self) -> usize {
        self.shard_for_seed(thread_seed())
    }

    /// The shard a thread with seed `seed` sends to.
    pub(crate) fn shard_for_seed(&self, seed: usize) -> usize {
        let shards = self.shards.len();
        if shards.is_power_of_two() {
            // A mask, not a division: this is on every registration's path.
            seed & (shards - 1)
        } else {
            seed % shards
        }
    }

    /// Queues a command; gives it back if the actor has stopped. Returns where in the shard's
    /// queue it went (see [`withdraw_or_send`](Self::withdraw_or_send)).
    pub(crate) fn send(&self, shard: usize, command: C, urgency: Urgency) -> Result<u32, C> {
        let mut state = self.lock(shard);
        if state.stopped {
            return Err(command);
        }
        let (position, notify) = self.push(&mut state, command, urgency);
        self.after_send(shard, state, Some(notify));
        Ok(position)
    }

    /// Queues the command `make` builds, calling it under the shard's lock (so what it counts
    /// is counted in the shard's queue order) and only if the actor has not stopped. Returns
    /// whether it queued.
    pub(crate) fn send_made(
        &self,
        shard: usize,
        urgency: Urgency,
        make: impl FnOnce() -> C,
    ) -> bool {
        let mut state = self.lock(shard);
        let queued = self.queue_made(&mut state, urgency, make);
        self.after_send(shard, state, queued)
    }

    /// After a command was queued (or refused: `queued` is `None`) into `shard`, whose lock
    /// `state` is: lets the lock go, notifies the actor if asked (handing it to an idle
    /// worker for an early take), and waits for room if the shard is full. Whether it queued.
    fn after_send(
        &self,
        shard: usize,
        state: MutexGuard<'_, Shard<C>>,
        queued: Option<bool>,
    ) -> bool {
        let full = self.is_full(&state);
        let early = state.commands.len() == self.early_take;
        drop(state);
        let sent = self.notify_if(queued);
        if early && queued.is_some() {
            // Whether this send woke the actor or an earlier one did (the first of the
            // batch, say): it may be waiting in this worker's LIFO slot either way.
            hand_to_an_idle_worker();
        }
        if full {
            self.wait_for_room(shard);
        }
        sent
    }

    /// [`send_made`](Self::send_made), calling `make` with every shard locked: what it counts
    /// is counted between two other sends, never in the middle of one (a command on every
    /// key counts in every stripe, one stripe at a time). Rare, so the locks cost little.
    #[cfg(loom)]
    pub(crate) fn send_made_alone(
        &self,
        shard: usize,
        urgency: Urgency,
        make: impl FnOnce() -> C,
    ) -> bool {
        let mut locked = self.lock_every_shard();
        let queued = locked.queue_made(shard, urgency, make);
        drop(locked);
        self.notify_if(queued)
    }

    /// Locks every shard, in shard order (as everyone who takes more than one lock:
    /// `release_segments`): no command can be queued here until the guard goes. Several
    /// inboxes locked together (a keyed set's shards) are locked in one order by everyone.
    pub(crate) fn lock_every_shard(&self) -> EveryShard<'_, C> {
        EveryShard {
            inbox: self,
            states: (0..self.shards.len()).map(|s| self.lock(s)).collect(),
        }
    }

    /// Notifies the actor after a command queued through [`EveryShard::queue_made`] (the
    /// guard let go), if that asked for it; whether it queued.
    pub(crate) fn notify_if(&self, queued: Option<bool>) -> bool {
        if queued == Some(true) {
            self.wake.notify_one();
        }
        queued.is_some()
    }

    /// Queues what `make` builds into a locked shard, unless the actor has stopped; returns
    /// whether it did, and if so whether the actor must be notified.
    fn queue_made(
        &self,
        state: &mut Shard<C>,
        urgency: Urgency,
        make: impl FnOnce() -> C,
    ) -> Option<bool> {
        (!state.stopped).then(|| self.push(state, make(), urgency).1)
    }

    /// Replaces a command still waiting in `shard`'s queue at `position` (as `send` or
    /// `send_with_slot` returned) with a [`Placeholder`], if `is_it` recognises it, and gives
    /// `slot` straight back to the shard's free list: the actor never sees the timer at all.
    /// The last command of the queue is removed rather than replaced, with the placeholders
    /// left before it, so a task that arms and drops sleeps in a loop reuses
    /// one queue entry and one slot, both warm in its cache, and tasks that drop theirs in
    /// the reverse order of arming leave nothing behind.
    /// If the actor has taken the command already, queues what `otherwise` makes instead
    /// (unless the actor has stopped), calling it under the lock. One lock either way.
    /// Returns whether it withdrew.
    ///
    /// Positions are stable until the actor takes the shard (it only ever takes a whole
    /// queue), and `is_it` checks that the command there is still the caller's own.
    pub(crate) fn withdraw_or_send(
        &self,
        shard: usize,
        position: u32,
        is_it: impl FnOnce(&C) -> bool,
        slot: u32,
        otherwise: impl FnOnce() -> C,
    ) -> bool
    where
        C: Placeholder,
    {
        let mut state = self.lock(shard);
        let state = &mut *state;
        if state.stopped {
            return false;
        }
        let last = state.commands.len() == position as usize + 1;
        if let Some(command) = state.commands.get_mut(position as usize) {
            if is_it(command) {
                if last {
                    // The last command queued (a task's own sleep, dropped before anything
                    // else was sent here): taken back, so a loop of such sleeps does not grow
                    // the queue. So are placeholders before it, whose handles are gone: no
                    // live handle's position is at or past the new end.
                    state.commands.pop_back();
                    while state.commands.back().is_some_and(C::is_placeholder) {
                        state.commands.pop_back();
                    }
                } else {
                    *command = C::placeholder();
                }
                state.free.push(slot);
                return true;
            }
        }
        let (_, notify) = self.push(state, otherwise(), Urgency::Lazy);
        if notify {
            self.wake.notify_one();
        }
        false
    }

    /// Offers the last `depth` commands still waiting in `shard`'s queue to `rewrite`, newest
    /// first, until it answers `Some`: `Some(Some(done))` when it rewrote that command in
    /// place (a command that cancels or moves one its sender queued a moment ago: the actor
    /// sees one, or none), `Some(None)` when that command rules a rewrite out. Unless it
    /// rewrote one, queues what `make` builds, as [`send_made`](Self::send_made) does. One
    /// lock either way. Returns `Ok(done)`, or `Err(queued)` (`false`: the actor stopped).
    pub(crate) fn rewrite_recent_or_send_made<T>(
        &self,
        shard: usize,
        depth: usize,
        rewrite: impl FnMut(&mut C) -> Option<Option<T>>,
        urgency: Urgency,
        make: impl FnOnce() -> C,
    ) -> Result<T, bool> {
        let mut state = self.lock(shard);
        if state.stopped {
            return Err(false);
        }
        let rewritten = state
            .commands
            .iter_mut()
            .rev()
            .take(depth)
            .find_map(rewrite)
            .flatten();
        match rewritten {
            Some(done) => Ok(done),
            None => {
                let queued = self.queue_made(&mut state, urgency, make);
                Err(self.after_send(shard, state, queued))
            }
        }
    }

    /// How many shards the inbox has.
    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The last sending handle is gone.
    pub(crate) fn close(&self) {
        self.senders_gone.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Wakes the actor to look at its state (no command queued).
    pub(crate) fn nudge(&self) {
        self.wake.notify_one();
    }

    pub(crate) fn senders_gone(&self) -> bool {
        self.senders_gone.load(Ordering::Acquire)
    }

    /// Completes once a command may be queued (possibly spuriously).
    pub(crate) async fn wait(&self) {
        self.wake.notified().await;
    }
}

#[cfg(all(test, not(loom)))]
mod tests;

/// Model checks of the slot protocol and the inbox's hand-offs (see the module).
#[cfg(all(test, loom))]
mod loom_model;
