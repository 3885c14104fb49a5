//! [`KeyedTimer`]: a handle to one keyed entry, for the task that owns it.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::actor::inbox::Urgency;
use crate::actor::keyed::{KeyedCommand, Target};
use crate::timer::keyed::{DeadlineWord, Ledger, Moved, Seq};

use super::set::{Set, by};

/// A handle to one keyed entry, for the task that owns it; made by
/// [`Timers::insert`](crate::Timers::insert).
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
/// The handle and the by-key calls ([`Timers::set`](crate::Timers::set),
/// [`reset`](crate::Timers::reset), [`remove`](crate::Timers::remove),
/// [`take`](crate::Timers::take)) act on the same entry, and commands from one task apply in
/// the order they were made, whichever of the two it used. Once the key is
/// replaced (`set` or `insert` again), removed, taken, drained or expired, or the wheel has
/// stopped, the handle is stale for good: `reset` and `remove` do nothing, `take` answers
/// `None`, and [`deadline`](Self::deadline) keeps the deadline the entry had when it went. A
/// `reset` racing expiry either lands before it (the entry fires at the new deadline) or finds
/// the entry gone: it fires once, never early. One that returned before the entry's deadline
/// always lands, even when it had to queue behind a command in flight on the key (the actor
/// holds such an entry back until it has applied its handle's queued commands).
///
/// Handles do not keep the set's [`Expirations`](crate::Expirations) stream open: once every
/// [`Timers`](crate::Timers) clone is dropped and nothing is pending, it ends (every handle is
/// stale by then).
///
/// `Clone + Send`, and `Sync` when `K` is. Each clone holds its own copy of the key; dropping
/// the handles leaves the entry set.
pub struct KeyedTimer<K, V> {
    pub(super) key: K,
    /// The key's hash under the set's hasher.
    pub(super) hash: u64,
    pub(super) word: Arc<DeadlineWord>,
    pub(super) set: Arc<Set<K, V>>,
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
        if self.word.is_quiet() && self.set.shard(self.hash).ledger.is_quiet(stripe) {
            if self.word.move_to(offset) == Moved::Earlier {
                // Not counted in the word: the advance writes nothing there (the actor reads
                // the word when it applies it), so no later store of this handle can be undone
                // by it, and the actor need not take the word's cache line back to count it
                // down.
                if !self.set.wheel.shared.is_closed() {
                    let command = KeyedCommand::Advance(self.target());
                    self.set.send_free(self.hash, command, by(offset));
                }
            }
        } else if !self.is_stale() {
            let target = self.target();
            self.send(
                |seq| KeyedCommand::Move(Box::new((target, offset)), seq),
                by(offset),
            );
        }
    }

    /// Removes the entry so it does not expire; nothing if the handle is stale.
    /// Fire-and-forget: use [`take`](Self::take) to know whether it was still there.
    pub fn remove(&self) {
        if !self.is_stale() {
            let target = self.target();
            self.send(|seq| KeyedCommand::Forget(target, seq), Urgency::Lazy);
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
        let target = self.target();
        self.send(
            |seq| KeyedCommand::TakeEntry(Box::new((target, reply)), seq),
            Urgency::Now,
        );
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

    /// Counts a command of this handle in its word (which holds the entry back from firing
    /// until it is applied) and in its key's stripe (it is ordered with the by-key commands on
    /// the key), and queues it.
    fn send(&self, command: impl FnOnce(Seq) -> KeyedCommand<K, V>, urgency: Urgency) {
        self.set.send(self.hash, urgency, |seq| {
            // Queued even if the entry went meanwhile: the command is counted in the stripe
            // already, and the actor finds the entry gone.
            let _live = self.word.sending();
            command(seq)
        });
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
