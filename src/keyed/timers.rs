//! [`Timers`]: set, move and remove keyed timers by key.

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use crate::actor::keyed::KeyedCommand;
use crate::timer::keyed::DeadlineWord;

use super::handle::KeyedTimer;
use super::set::{Set, by};
/// Sets, moves and removes keyed timers; made by [`Wheel::keyed`](crate::Wheel::keyed).
///
/// `Clone + Send + Sync`; commands from one handle take effect in the order they were made,
/// and so do commands on one key from any handles: one made after another returned (on any
/// thread, through any clone or [`KeyedTimer`]) takes effect after it. [`len`](Self::len) and
/// [`drain`](Self::drain) see every command made before them and none made after.
/// Once the wheel has stopped, `set` is refused silently and `take`, `drain` and `len` answer
/// empty at once.
///
/// Each thread queues its commands apart (no lock is shared between threads), and the set's
/// actors put them back in that order: many tasks can set and remove keys at once at little
/// more than one task's cost per command. A key belongs to one of the set's
/// [`shards`](Self::shards) (one actor each; [`Builder::shards`](crate::Builder::shards)), so
/// by-key work from many cores is applied on as many cores.
pub struct Timers<K, V> {
    pub(super) set: Arc<Set<K, V>>,
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
            for shard in &self.set.shards {
                shard.inbox.nudge();
            }
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
        let hash = self.hash(&key);
        let set = |seq| KeyedCommand::Set {
            key,
            value,
            deadline,
            seq,
        };
        self.set.send(hash, by(deadline), set);
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
        let insert = |seq| KeyedCommand::Insert {
            key: key.clone(),
            value,
            word: word.clone(),
            seq,
        };
        let sent = self.set.send(hash, by(deadline), insert);
        if !sent {
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
    ///
    /// A reset to a later deadline that follows the key's `set` or `reset` closely on the same
    /// thread, before the actor has taken it, moves that command's deadline instead of
    /// queueing another: a burst of keep-alive resets costs the actor one.
    pub fn reset(&self, key: &K, after: Duration) {
        self.reset_offset(key, self.set.offset_after(after));
    }

    /// Moves `key`'s expiry to `deadline`, earlier or later. No-op if absent.
    pub fn reset_at(&self, key: &K, deadline: Instant) {
        self.reset_offset(key, self.set.offset(deadline));
    }

    fn reset_offset(&self, key: &K, deadline: i64) {
        self.set.reset(self.hash(key), key, deadline);
    }

    /// Removes `key` so it does not expire. Fire-and-forget: use [`take`](Self::take) to know
    /// whether it was still there.
    ///
    /// A `remove` that follows its key's `set` closely on the same thread, before the actor
    /// has taken that set, takes its place in the queue: the actor files nothing (the
    /// request-deadline pattern of a keyed set: an ack before the timer was ever filed).
    pub fn remove(&self, key: &K) {
        // A set taken out of the queue drops its value here, outside the lock.
        drop(self.set.remove(self.hash(key), key));
    }

    /// Removes `key` and returns its value: `Some` if and only if it was removed before it
    /// expired.
    pub async fn take(&self, key: &K) -> Option<V> {
        self.set
            .ask(self.hash(key), |reply, seq| KeyedCommand::Take {
                key: key.clone(),
                reply,
                seq,
            })
            .await
            .flatten()
    }

    /// Removes every key now and returns them with their values.
    ///
    /// Each of the set's actors hands its whole table over at once; turning it into pairs
    /// happens on the calling task, so draining millions of keys never stalls an actor.
    pub async fn drain(&self) -> Vec<(K, V)> {
        let drain = |reply, ordinals| KeyedCommand::Drain { reply, ordinals };
        match self.set.ask_everywhere(drain).await {
            Some(drained) => drained
                .into_iter()
                .flatten()
                .map(|(key, value, _)| (key, value))
                .collect(),
            None => Vec::new(),
        }
    }

    /// How many keys are set.
    ///
    /// Also the set's barrier (as [`Wheel::flush`](crate::Wheel::flush) is the sleeps'): it
    /// answers once each of the set's actors has applied every command sent before it. It
    /// does not wait
    /// for firing: an entry already due may reach the [`Expirations`](crate::Expirations)
    /// stream a moment after `len` answers (the actor answers while it applies commands and
    /// fires after).
    pub async fn len(&self) -> usize {
        self.set
            .ask_everywhere(|reply, ordinals| KeyedCommand::Len { reply, ordinals })
            .await
            .map_or(0, |lens| lens.into_iter().sum())
    }

    /// How many shards (actors) the set runs, its keys spread over them by hash: the
    /// wheel's [`Builder::shards`](crate::Builder::shards).
    pub fn shards(&self) -> usize {
        self.set.shards.len()
    }

    /// Whether no key is set.
    pub async fn is_empty(&self) -> bool {
        self.len().await == 0
    }
}
