//! Keyed timers: set, move and remove timers by key; read expirations as a stream.
//!
//! The use this is built for: a server that closes connections after 30 seconds of silence.
//! Every message postpones the connection's timer; the expiration stream says whom to close.
//!
//! ```
//! use std::time::Duration;
//! use futures::StreamExt;
//! use tokio_wheel::Wheel;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let wheel = Wheel::new();
//! let (timers, mut expired) = wheel.keyed::<u64, &str>();
//! timers.set(1, "alice", Duration::from_secs(30));
//! timers.set(2, "bob", Duration::from_secs(30));
//!
//! tokio::time::sleep(Duration::from_secs(20)).await;
//! timers.reset(&1, Duration::from_secs(30)); // alice spoke: 30 more seconds
//!
//! let first = expired.next().await.unwrap();
//! assert_eq!(first.into_parts(), (2, "bob"));
//! assert_eq!(timers.take(&1).await, Some("alice"));
//! assert_eq!(timers.len().await, 0);
//! # }
//! ```
//!
//! # Costs
//!
//! Each [`Wheel::keyed`](crate::Wheel::keyed) set runs its own actor task, so sets never
//! contend with each other or with sleeps. Every by-key operation is one queued command (one
//! lock and a push; no allocation) plus hashing the key once on the caller's side; `take`,
//! `drain` and `len` also wait for the actor's answer. The actor keeps each entry once — key,
//! value and an 8-byte deadline in a table, found through a hash table of 4-byte ids — plus a
//! 20-byte wheel position: about 35 bytes besides the key and value (53 bytes in all for `u64`
//! keys and values at 10^5 entries). Moving a key's deadline later costs the actor one table
//! write; the entry is filed again only when its old tick comes.
//!
//! # A handle per entry
//!
//! [`Timers::insert`] sets a key and returns a [`KeyedTimer`], a handle to that entry for the
//! task that owns it. The entry's deadline then lives in a word the handle shares with the
//! actor, so postponing it is one compare-and-swap — no command, no lookup. Such an entry costs
//! a 32-byte allocation (the word) and 8 bytes in the actor's table of words besides the above.
//!
//! Expirations are buffered without bound: a slow or absent reader never stalls the wheel,
//! and each unread expiration costs its key, value and deadline (plus the channel's slot) in
//! memory (see [`Stats::expirations_backlog`](crate::Stats)).
//!
//! # Compared with tokio-util's `DelayQueue`
//!
//! `DelayQueue` runs its wheel inside the consumer's poll; a set here has its own actor task.
//! So an entry set (or moved) to a deadline already past is delivered on that actor's next
//! turn — once the calling task yields, with no time passing — rather than inside the call;
//! an entry that fired sits in the stream's buffer, no longer removable (`take` answers
//! `None`); and the stream ends when every [`Timers`] clone is dropped and nothing is
//! pending, not whenever the set is empty. `tests/tokio_suite_delay_queue.rs` runs
//! tokio-util's own `DelayQueue` tests against a set and lists each such difference.
//!
//! # Shutdown
//!
//! Every command made before [`Wheel::shutdown`](crate::Wheel::shutdown) is called, or before
//! the runtime running the actor goes away, is applied before the entries are flushed: each
//! entry set and not removed is delivered exactly once, marked
//! [`is_shutdown`](Expired::is_shutdown); a removed one never is. After that, `set` is refused
//! silently and `take`, `drain` and `len` answer empty.

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures::Stream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::coop;
use tokio::time::Instant;

use crate::actor::Actor;
use crate::actor::context::WheelContext;
use crate::actor::inbox::{Inbox, Urgency};
use crate::actor::keyed::{Delivery, Drained, Expiry, KeyedCommand, KeyedMachine, Target};
use crate::timer::keyed::{DeadlineWord, Ledger, Moved, Stripe};
use crate::timer::shared::Shared;

pub(crate) fn new<K, V>(wheel: &Arc<WheelContext>) -> (Timers<K, V>, Expirations<K, V>)
where
    K: Eq + Hash + Clone + Send + 'static,
    V: Send + 'static,
{
    let shared = wheel.shared.clone();
    // One shard: commands from every handle apply in the order they were made.
    let inbox = Arc::new(Inbox::new(1));
    let ledger = Arc::new(Ledger::default());
    let timers = Arc::new(AtomicUsize::new(1));
    // Randomly seeded per set: keys chosen by clients cannot be aimed at one bucket.
    let hasher = foldhash::fast::RandomState::default();
    let (expired_sender, expired) = mpsc::unbounded_channel();
    if shared.is_closed() {
        // A set made after shutdown gets no actor: calls answer empty, the stream ends at once.
        inbox.stop(&mut Default::default());
    } else {
        let machine = KeyedMachine::new(
            &shared.levels,
            shared.clock,
            expired_sender,
            hasher.clone(),
            ledger.clone(),
            timers.clone(),
        );
        Actor::new(machine, inbox.clone(), shared.clone()).spawn("keyed");
    }
    (
        Timers {
            set: Arc::new(Set {
                wheel: wheel.clone(),
                inbox,
                ledger,
                hasher,
                timers,
            }),
        },
        Expirations {
            receiver: expired,
            flushed: None,
            shared,
        },
    )
}

/// Sets, moves and removes keyed timers; made by [`Wheel::keyed`](crate::Wheel::keyed).
///
/// `Clone + Send + Sync`; commands from one handle take effect in the order they were made.
/// Once the wheel has stopped, `set` is refused silently and `take`, `drain` and `len` answer
/// empty at once.
pub struct Timers<K, V> {
    set: Arc<Set<K, V>>,
}

/// What every [`Timers`] clone and [`KeyedTimer`] of a set hold: the set's inbox (closed when
/// the last of them goes), its ledger and its hasher, and the wheel's context (kept alive, as
/// a `Wheel` would; shown as the wheel).
struct Set<K, V> {
    wheel: Arc<WheelContext>,
    inbox: Arc<Inbox<KeyedCommand<K, V>>>,
    ledger: Arc<Ledger>,
    hasher: foldhash::fast::RandomState,
    /// How many [`Timers`] clones are alive (shared with the actor). A `KeyedTimer` can only
    /// act on its own entry, so once this is zero and nothing is filed, the actor stops and
    /// the stream ends, whatever handles still live (all stale by then).
    timers: Arc<AtomicUsize>,
}

impl<K, V> Drop for Set<K, V> {
    fn drop(&mut self) {
        self.inbox.close();
    }
}

impl<K, V> Set<K, V> {
    /// Counts `command` in the ledger (in `stripe`) and queues it; `false` if the wheel has
    /// stopped (the command is refused, as documented).
    fn send(&self, command: KeyedCommand<K, V>, stripe: Stripe, urgency: Urgency) -> bool {
        if self.wheel.shared.is_closed() {
            return false;
        }
        self.ledger.sending_in(stripe);
        // A send fails only once the set's actor has stopped.
        self.inbox.send(0, command, urgency).is_ok()
    }

    async fn ask<R>(
        &self,
        command: impl FnOnce(oneshot::Sender<R>) -> KeyedCommand<K, V>,
        stripe: Stripe,
    ) -> Option<R> {
        let (reply, answer) = oneshot::channel();
        self.send(command(reply), stripe, Urgency::Now);
        // A refused command drops `reply`, so this never waits on a stopped wheel.
        answer.await.ok()
    }

    fn offset(&self, deadline: Instant) -> i64 {
        self.wheel.shared.clock.signed_offset(deadline)
    }

    /// The offset of `after` from now (one clock read, integer arithmetic).
    fn offset_after(&self, after: Duration) -> i64 {
        self.wheel.shared.clock.signed_offset_after(after)
    }

    fn instant(&self, offset: i64) -> Instant {
        self.wheel.shared.clock.instant_at(offset)
    }
}

/// How soon the actor must see a command for a deadline at `offset`.
fn by(offset: i64) -> Urgency {
    Urgency::By(offset.max(0) as u64)
}

impl<K, V> Clone for Timers<K, V> {
    fn clone(&self) -> Self {
        self.set.timers.fetch_add(1, Ordering::Relaxed);
        Timers {
            set: self.set.clone(),
        }
    }
}

impl<K, V> Drop for Timers<K, V> {
    fn drop(&mut self) {
        // Release: the actor, seeing zero, then sees every command this clone sent.
        if self.set.timers.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.set.inbox.nudge();
        }
    }
}

impl<K, V> fmt::Debug for Timers<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Timers")
            .field("wheel", &self.set.wheel)
            .finish()
    }
}

impl<K, V> Timers<K, V>
where
    K: Eq + Hash + Clone + Send + 'static,
    V: Send + 'static,
{
    fn hash(&self, key: &K) -> u64 {
        self.set.hasher.hash_one(key)
    }

    /// The ledger stripe of commands on `key`.
    fn stripe(&self, key: &K) -> Stripe {
        Stripe::One(Ledger::stripe(self.hash(key)))
    }

    /// Inserts `key` with `value`, expiring `after` from now; replaces the value and deadline
    /// if the key is already set.
    pub fn set(&self, key: K, value: V, after: Duration) {
        self.set_offset(key, value, self.set.offset_after(after));
    }

    /// Inserts `key` with `value`, expiring at `deadline`; replaces the value and deadline if
    /// the key is already set.
    pub fn set_at(&self, key: K, value: V, deadline: Instant) {
        self.set_offset(key, value, self.set.offset(deadline));
    }

    fn set_offset(&self, key: K, value: V, deadline: i64) {
        let stripe = self.stripe(&key);
        let command = KeyedCommand::Set {
            key,
            value,
            deadline,
        };
        self.set.send(command, stripe, by(deadline));
    }

    /// [`set`](Self::set) that also returns a [`KeyedTimer`]: a handle to this entry, for the
    /// task that owns it.
    ///
    /// The handle and the by-key calls act on the same entry, in the order they are made.
    /// Postponing through the handle costs one compare-and-swap on a word the handle shares
    /// with the actor — no message, no lookup — where [`reset`](Self::reset) queues a command
    /// and the actor finds the key. The entry costs a small allocation (the shared word) and a
    /// place in the actor's table of handles, besides what a `set` costs.
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures::StreamExt;
    /// use tokio_wheel::Wheel;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let wheel = Wheel::new();
    /// let (timers, mut expired) = wheel.keyed::<u64, &str>();
    /// let start = tokio::time::Instant::now();
    /// let idle = timers.insert(7, "10.0.0.7:5000", Duration::from_secs(30));
    ///
    /// tokio::time::sleep(Duration::from_secs(20)).await;
    /// idle.reset(Duration::from_secs(30)); // traffic: 30 more seconds, without a message
    /// assert_eq!(idle.deadline(), start + Duration::from_secs(50));
    ///
    /// let closed = expired.next().await.unwrap();
    /// assert_eq!(closed.deadline(), start + Duration::from_secs(50));
    /// assert_eq!(closed.into_parts(), (7, "10.0.0.7:5000"));
    /// # }
    /// ```
    pub fn insert(&self, key: K, value: V, after: Duration) -> KeyedTimer<K, V> {
        self.insert_offset(key, value, self.set.offset_after(after))
    }

    /// [`set_at`](Self::set_at) that also returns a [`KeyedTimer`]; see
    /// [`insert`](Self::insert).
    pub fn insert_at(&self, key: K, value: V, deadline: Instant) -> KeyedTimer<K, V> {
        self.insert_offset(key, value, self.set.offset(deadline))
    }

    fn insert_offset(&self, key: K, value: V, deadline: i64) -> KeyedTimer<K, V> {
        let hash = self.hash(&key);
        let word = Arc::new(DeadlineWord::new(deadline));
        let command = KeyedCommand::Insert {
            key: key.clone(),
            value,
            word: word.clone(),
        };
        let stripe = Stripe::One(Ledger::stripe(hash));
        if !self.set.send(command, stripe, by(deadline)) {
            // Refused: the entry never existed, and its handle is stale from the start.
            word.retire();
        }
        KeyedTimer {
            key,
            hash,
            word,
            set: self.set.clone(),
        }
    }

    /// Moves `key`'s expiry to `after` from now, earlier or later. No-op if absent.
    pub fn reset(&self, key: &K, after: Duration) {
        self.reset_offset(key, self.set.offset_after(after));
    }

    /// Moves `key`'s expiry to `deadline`, earlier or later. No-op if absent.
    pub fn reset_at(&self, key: &K, deadline: Instant) {
        self.reset_offset(key, self.set.offset(deadline));
    }

    fn reset_offset(&self, key: &K, deadline: i64) {
        let command = KeyedCommand::Reset {
            key: key.clone(),
            deadline,
        };
        self.set.send(command, self.stripe(key), by(deadline));
    }

    /// Removes `key` so it does not expire. Fire-and-forget: use [`take`](Self::take) to know
    /// whether it was still there.
    pub fn remove(&self, key: &K) {
        let command = KeyedCommand::Remove(key.clone());
        self.set.send(command, self.stripe(key), Urgency::Lazy);
    }

    /// Removes `key` and returns its value: `Some` if and only if it was removed before it
    /// expired.
    pub async fn take(&self, key: &K) -> Option<V> {
        self.set
            .ask(
                |reply| KeyedCommand::Take(key.clone(), reply),
                self.stripe(key),
            )
            .await
            .flatten()
    }

    /// Removes every key now and returns them with their values.
    ///
    /// The set's actor hands its whole table over at once; turning it into pairs happens on
    /// the calling task, so draining millions of keys never stalls the actor.
    pub async fn drain(&self) -> Vec<(K, V)> {
        match self.set.ask(KeyedCommand::Drain, Stripe::Every).await {
            Some(drained) => drained.map(|(key, value, _)| (key, value)).collect(),
            None => Vec::new(),
        }
    }

    /// How many keys are set.
    pub async fn len(&self) -> usize {
        self.set
            .ask(KeyedCommand::Len, Stripe::Uncounted)
            .await
            .unwrap_or(0)
    }

    /// Whether no key is set.
    pub async fn is_empty(&self) -> bool {
        self.len().await == 0
    }
}

/// A handle to one keyed entry, for the task that owns it; made by [`Timers::insert`].
///
/// The use it is built for: a connection's task that postpones its own idle timer on every
/// message. [`reset`](Self::reset) to a later deadline is one compare-and-swap on a word this
/// handle shares with the set's actor — no message, no map lookup: when the entry's old tick
/// comes, the actor sees the later deadline and files the entry again. Moving it earlier,
/// [`remove`](Self::remove) and [`take`](Self::take) queue a command, as the by-key calls do.
///
/// ```
/// use std::time::Duration;
/// use futures::StreamExt;
/// use tokio_wheel::Wheel;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let wheel = Wheel::new();
/// let (timers, mut expired) = wheel.keyed::<u32, &str>();
///
/// // A connection's task owns its timer.
/// let timer = timers.insert(1, "alice", Duration::from_secs(30));
/// let connection = tokio::spawn(async move {
///     for _message in 0..3 {
///         tokio::time::sleep(Duration::from_secs(10)).await;
///         timer.reset(Duration::from_secs(30)); // later: no message to the actor
///     }
///     timer // the connection keeps its timer until it closes
/// });
///
/// let timer = connection.await.unwrap();
/// assert_eq!(*timer.key(), 1);
/// // Silent since 30 s: it expires 30 s later, at 60 s.
/// let idle = expired.next().await.unwrap();
/// assert_eq!(idle.deadline(), timer.deadline());
/// assert_eq!(idle.into_parts(), (1, "alice"));
///
/// // Once expired, removed, taken or replaced, the handle is stale: its calls do nothing.
/// timer.reset(Duration::from_secs(5));
/// assert_eq!(timer.take().await, None);
/// # }
/// ```
///
/// # Which entry
///
/// The handle and the by-key calls ([`Timers::set`], [`reset`](Timers::reset),
/// [`remove`](Timers::remove), [`take`](Timers::take)) act on the same entry, and commands from
/// one task apply in the order they were made, whichever of the two it used. Once the key is
/// replaced (`set` or `insert` again), removed, taken, drained or expired, or the wheel has
/// stopped, the handle is stale for good: `reset` and `remove` do nothing, `take` answers
/// `None`, and [`deadline`](Self::deadline) keeps the deadline the entry had when it went. A
/// `reset` racing expiry either lands before it (the entry fires at the new deadline) or finds
/// the entry gone: it fires once, never early. One that returned before the entry's deadline
/// always lands, even when it had to queue behind a command in flight on the key (the actor
/// holds such an entry back until it has applied its handle's queued commands).
///
/// Handles do not keep the set's [`Expirations`] stream open: once every [`Timers`] clone is
/// dropped and nothing is pending, it ends (every handle is stale by then).
///
/// `Clone + Send`, and `Sync` when `K` is. Each clone holds its own copy of the key; dropping
/// the handles leaves the entry set.
pub struct KeyedTimer<K, V> {
    key: K,
    /// The key's hash under the set's hasher.
    hash: u64,
    word: Arc<DeadlineWord>,
    set: Arc<Set<K, V>>,
}

impl<K: Clone, V> Clone for KeyedTimer<K, V> {
    fn clone(&self) -> Self {
        KeyedTimer {
            key: self.key.clone(),
            hash: self.hash,
            word: self.word.clone(),
            set: self.set.clone(),
        }
    }
}

impl<K: fmt::Debug, V> fmt::Debug for KeyedTimer<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (gone, deadline) = self.word.load();
        f.debug_struct("KeyedTimer")
            .field("key", &self.key)
            .field("deadline", &self.set.instant(deadline))
            .field("stale", &gone)
            .field("wheel", &self.set.wheel)
            .finish()
    }
}

impl<K, V> KeyedTimer<K, V>
where
    K: Eq + Hash + Clone + Send + 'static,
    V: Send + 'static,
{
    /// Moves the entry's expiry to `after` from now, earlier or later; nothing if the handle
    /// is stale. See [`reset_at`](Self::reset_at).
    pub fn reset(&self, after: Duration) {
        self.reset_offset(self.set.offset_after(after));
    }

    /// Moves the entry's expiry to `deadline`; nothing if the handle is stale.
    ///
    /// A later deadline (the keep-alive case) is one compare-and-swap on the word this handle
    /// shares with the actor: no message, no lookup. An earlier one is written there too and
    /// queues a command, so the actor files the entry for it. Either way the move is visible
    /// at once in [`deadline`](Self::deadline), unless a command on this key (from this task or
    /// another) is still in flight: then the move queues behind it, so that it is not undone
    /// by a command made before it.
    pub fn reset_at(&self, deadline: Instant) {
        self.reset_offset(self.set.offset(deadline));
    }

    fn reset_offset(&self, offset: i64) {
        let stripe = Ledger::stripe(self.hash);
        if self.word.is_quiet() && self.set.ledger.is_quiet(stripe) {
            if self.word.move_to(offset) == Moved::Earlier {
                self.send(KeyedCommand::Advance(self.target()), by(offset));
            }
        } else if !self.is_stale() {
            let command = KeyedCommand::Move(Box::new((self.target(), offset)));
            self.send(command, by(offset));
        }
    }

    /// Removes the entry so it does not expire; nothing if the handle is stale.
    /// Fire-and-forget: use [`take`](Self::take) to know whether it was still there.
    pub fn remove(&self) {
        if !self.is_stale() {
            self.send(KeyedCommand::Forget(self.target()), Urgency::Lazy);
        }
    }

    /// Removes the entry and returns its value: `Some` if and only if this handle's entry was
    /// still set (not expired, removed, taken or replaced). Answers `None` at once when the
    /// handle is known to be stale.
    pub async fn take(&self) -> Option<V> {
        if self.is_stale() {
            return None;
        }
        let (reply, answer) = oneshot::channel();
        let command = KeyedCommand::TakeEntry(Box::new((self.target(), reply)));
        self.send(command, Urgency::Now);
        // A refused command drops `reply`, so this never waits on a stopped wheel.
        answer.await.ok().flatten()
    }

    fn target(&self) -> Target<K> {
        let word = Arc::as_ptr(&self.word) as usize;
        match self.word.id() {
            Some(id) => Target::Filed { id, word },
            None => Target::Unfiled(Box::new((self.key.clone(), word))),
        }
    }

    /// Queues one of this handle's commands, counted in its word (not in the ledger).
    fn send(&self, command: KeyedCommand<K, V>, urgency: Urgency) {
        if !self.set.wheel.shared.is_closed() {
            self.word.sending();
            self.set.send(command, Stripe::Uncounted, urgency);
        }
    }
}

impl<K, V> KeyedTimer<K, V> {
    /// The entry's deadline: the latest this handle (or a by-key call that has reached the
    /// actor) set. Once the handle is stale, the deadline the entry had when it went — for an
    /// entry that expired, the deadline it fired for.
    pub fn deadline(&self) -> Instant {
        self.set.instant(self.word.load().1)
    }

    /// The entry's key.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// Whether the entry is known to be gone: expired, removed, taken, replaced or drained
    /// (as far as the actor has got), or the wheel has stopped. A stale handle's calls do
    /// nothing. `false` does not promise that the entry is still there: it may go at any
    /// moment.
    pub fn is_stale(&self) -> bool {
        self.word.load().0
    }
}

/// A keyed timer that fired (or was flushed by shutdown), read from [`Expirations`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired<K, V> {
    key: K,
    value: V,
    deadline: Instant,
    shutdown: bool,
}

impl<K, V> Expired<K, V> {
    /// The key.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The value.
    pub fn value(&self) -> &V {
        &self.value
    }

    /// The deadline it was set to (saturating 73 years after the wheel was built).
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// `true` if it was delivered because the wheel shut down, not because it expired.
    pub fn is_shutdown(&self) -> bool {
        self.shutdown
    }

    /// The key and value.
    pub fn into_parts(self) -> (K, V) {
        (self.key, self.value)
    }
}

/// The stream of keyed expirations; made by [`Wheel::keyed`](crate::Wheel::keyed).
///
/// `Send + Unpin`. Expirations come in deadline order across ticks. The stream ends once every
/// [`Timers`] clone is dropped and nothing is pending (live [`KeyedTimer`]s, which can only act
/// on their own entries, do not keep it open), or after shutdown (once the entries
/// flushed by it, marked [`Expired::is_shutdown`], are read). Dropping it is allowed: the
/// timers keep working and their expirations are discarded.
pub struct Expirations<K, V> {
    receiver: mpsc::UnboundedReceiver<Delivery<K, V>>,
    /// The entries flushed by shutdown, being read.
    flushed: Option<Drained<K, V>>,
    shared: Arc<Shared>,
}

impl<K, V> fmt::Debug for Expirations<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Expirations")
            .field("buffered", &self.receiver.len())
            .finish()
    }
}

impl<K, V> Expirations<K, V> {
    fn expired(&self, expiry: Expiry<K, V>) -> Expired<K, V> {
        self.shared
            .counters
            .expirations_backlog
            .fetch_sub(1, Ordering::Relaxed);
        Expired {
            key: expiry.key,
            value: expiry.value,
            deadline: self.shared.clock.instant_at(expiry.deadline),
            shutdown: expiry.shutdown,
        }
    }
}

impl<K, V> Stream for Expirations<K, V> {
    type Item = Expired<K, V>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Expired<K, V>>> {
        let this = self.get_mut();
        // Whether this poll has spent a unit of tokio's task budget already (receiving a
        // batch does): each item costs one, as each message from the channel does.
        let mut spent = false;
        loop {
            if let Some(flushed) = &mut this.flushed {
                // Under the budget, as the channel below is: a consumer of a large batch
                // still yields now and then.
                let budget = if spent {
                    None
                } else {
                    Some(ready!(coop::poll_proceed(cx)))
                };
                match flushed.next() {
                    Some((key, value, deadline)) => {
                        if let Some(budget) = budget {
                            budget.made_progress();
                        }
                        let expiry = Expiry {
                            key,
                            value,
                            deadline,
                            shutdown: true,
                        };
                        return Poll::Ready(Some(this.expired(expiry)));
                    }
                    None => this.flushed = None,
                }
            }
            match this.receiver.poll_recv(cx) {
                Poll::Ready(Some(Delivery::Fired(expiry))) => {
                    return Poll::Ready(Some(this.expired(expiry)));
                }
                Poll::Ready(Some(Delivery::Flushed(drained))) => {
                    this.flushed = Some(drained);
                    spent = true;
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<K, V> Drop for Expirations<K, V> {
    fn drop(&mut self) {
        self.receiver.close();
        let mut unread = self.flushed.as_ref().map_or(0, Drained::len);
        while let Ok(delivery) = self.receiver.try_recv() {
            unread += match delivery {
                Delivery::Fired(_) => 1,
                Delivery::Flushed(drained) => drained.len(),
            };
        }
        self.shared
            .counters
            .expirations_backlog
            .fetch_sub(unread as u64, Ordering::Relaxed);
    }
}
