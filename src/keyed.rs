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
//! contend with each other or with sleeps. Every operation is one message to that actor;
//! `take`, `drain` and `len` also wait for its answer. Expirations are buffered without bound:
//! a slow or absent reader never stalls the wheel, and each unread expiration costs its key,
//! value and deadline in memory (see [`Stats::expirations_backlog`](crate::Stats)).

use std::fmt;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::actor::inbox::Inbox;
use crate::actor::timers::RETAINED_ENTRIES;
use crate::actor::{Actor, Machine};
use crate::clock::deadline_after;
use crate::handle::{Shared, Wheel};
use crate::stats::Delta;
use crate::wheel::{Key, TimerWheel};

/// The actor's key index. foldhash: several times cheaper than SipHash on every command, and
/// still randomly seeded per map, so keys chosen by clients cannot be aimed at one bucket.
type Index<K> = std::collections::HashMap<K, Key, foldhash::fast::RandomState>;

pub(crate) fn new<K, V>(wheel: Wheel) -> (Timers<K, V>, Expirations<K, V>)
where
    K: Eq + Hash + Clone + Send + 'static,
    V: Send + 'static,
{
    let shared = wheel.shared().clone();
    let inbox = Arc::new(Inbox::new());
    let (expired_sender, expired) = mpsc::unbounded_channel();
    if shared.is_closed() {
        // A set made after shutdown gets no actor: calls answer empty, the stream ends at once.
        inbox.stop();
    } else {
        let machine = KeyedMachine {
            wheel: TimerWheel::new(&shared.levels)
                .expect("layout validated when the wheel was built"),
            index: Index::default(),
            expirations: expired_sender,
        };
        Actor::new(machine, inbox.clone(), shared.clone()).spawn("keyed");
    }
    (
        Timers {
            wheel,
            sender: Arc::new(KeyedSender(inbox)),
        },
        Expirations {
            receiver: expired,
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
    wheel: Wheel,
    sender: Arc<KeyedSender<K, V>>,
}

/// The set's inbox, closed when the last `Timers` clone goes.
struct KeyedSender<K, V>(Arc<Inbox<KeyedCommand<K, V>>>);

impl<K, V> Drop for KeyedSender<K, V> {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl<K, V> Clone for Timers<K, V> {
    fn clone(&self) -> Self {
        Timers {
            wheel: self.wheel.clone(),
            sender: self.sender.clone(),
        }
    }
}

impl<K, V> fmt::Debug for Timers<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Timers")
            .field("wheel", &self.wheel)
            .finish()
    }
}

impl<K, V> Timers<K, V>
where
    K: Eq + Hash + Clone + Send + 'static,
    V: Send + 'static,
{
    fn send(&self, command: KeyedCommand<K, V>) {
        if !self.wheel.is_shutdown() {
            // A send fails only once the set's actor has stopped: refused, as documented.
            let _ = self.sender.0.send(command);
        }
    }

    /// Inserts `key` with `value`, expiring `after` from now; replaces the value and deadline
    /// if the key is already set.
    pub fn set(&self, key: K, value: V, after: Duration) {
        self.set_at(key, value, deadline_after(after));
    }

    /// Inserts `key` with `value`, expiring at `deadline`; replaces the value and deadline if
    /// the key is already set.
    pub fn set_at(&self, key: K, value: V, deadline: Instant) {
        self.send(KeyedCommand::Set(key, value, deadline));
    }

    /// Moves `key`'s expiry to `after` from now, earlier or later. No-op if absent.
    pub fn reset(&self, key: &K, after: Duration) {
        self.reset_at(key, deadline_after(after));
    }

    /// Moves `key`'s expiry to `deadline`, earlier or later. No-op if absent.
    pub fn reset_at(&self, key: &K, deadline: Instant) {
        self.send(KeyedCommand::Reset(key.clone(), deadline));
    }

    /// Removes `key` so it does not expire. Fire-and-forget: use [`take`](Self::take) to know
    /// whether it was still there.
    pub fn remove(&self, key: &K) {
        self.send(KeyedCommand::Remove(key.clone()));
    }

    /// Removes `key` and returns its value: `Some` if and only if it was removed before it
    /// expired.
    pub async fn take(&self, key: &K) -> Option<V> {
        self.ask(|reply| KeyedCommand::Take(key.clone(), reply))
            .await
            .flatten()
    }

    /// Removes every key now and returns them with their values.
    pub async fn drain(&self) -> Vec<(K, V)> {
        self.ask(KeyedCommand::Drain).await.unwrap_or_default()
    }

    /// How many keys are set.
    pub async fn len(&self) -> usize {
        self.ask(KeyedCommand::Len).await.unwrap_or(0)
    }

    /// Whether no key is set.
    pub async fn is_empty(&self) -> bool {
        self.len().await == 0
    }

    async fn ask<R>(
        &self,
        command: impl FnOnce(oneshot::Sender<R>) -> KeyedCommand<K, V>,
    ) -> Option<R> {
        let (reply, answer) = oneshot::channel();
        self.send(command(reply));
        // A refused command drops `reply`, so this never waits on a stopped wheel.
        answer.await.ok()
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

    /// The deadline it was set to.
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
/// [`Timers`] clone is dropped and nothing is pending, or after shutdown (once the entries
/// flushed by it, marked [`Expired::is_shutdown`], are read). Dropping it is allowed: the
/// timers keep working and their expirations are discarded.
pub struct Expirations<K, V> {
    receiver: mpsc::UnboundedReceiver<Expired<K, V>>,
    shared: Arc<Shared>,
}

impl<K, V> fmt::Debug for Expirations<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Expirations")
            .field("buffered", &self.receiver.len())
            .finish()
    }
}

impl<K, V> Stream for Expirations<K, V> {
    type Item = Expired<K, V>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Expired<K, V>>> {
        let polled = self.receiver.poll_recv(cx);
        if let Poll::Ready(Some(_)) = polled {
            self.shared
                .stats
                .expirations_backlog
                .fetch_sub(1, Ordering::Relaxed);
        }
        polled
    }
}

impl<K, V> Drop for Expirations<K, V> {
    fn drop(&mut self) {
        self.receiver.close();
        let unread = std::iter::from_fn(|| self.receiver.try_recv().ok()).count();
        self.shared
            .stats
            .expirations_backlog
            .fetch_sub(unread as u64, Ordering::Relaxed);
    }
}

enum KeyedCommand<K, V> {
    Set(K, V, Instant),
    Reset(K, Instant),
    Remove(K),
    Take(K, oneshot::Sender<Option<V>>),
    Drain(oneshot::Sender<Vec<(K, V)>>),
    Len(oneshot::Sender<usize>),
}

struct Entry<K, V> {
    key: K,
    value: V,
    deadline: Instant,
}

struct KeyedMachine<K, V> {
    wheel: TimerWheel<Entry<K, V>>,
    /// The wheel key of each set key. Only the live entry of a key is ever indexed: a replaced
    /// entry leaves the wheel before its successor is filed, so a stale expiry cannot remove
    /// the newer entry's index.
    index: Index<K>,
    expirations: mpsc::UnboundedSender<Expired<K, V>>,
}

impl<K, V> KeyedMachine<K, V>
where
    K: Eq + Hash + Clone + Send + 'static,
    V: Send + 'static,
{
    fn remove(&mut self, key: &K, delta: &mut Delta) -> Option<V> {
        let filed = self.index.remove(key)?;
        delta.cancelled += 1;
        self.wheel.remove(filed).map(|entry| entry.value)
    }

    fn deliver(&self, entry: Entry<K, V>, shutdown: bool, shared: &Shared) {
        let Entry {
            key,
            value,
            deadline,
        } = entry;
        let expired = Expired {
            key,
            value,
            deadline,
            shutdown,
        };
        if self.expirations.send(expired).is_ok() {
            shared
                .stats
                .expirations_backlog
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl<K, V> Machine for KeyedMachine<K, V>
where
    K: Eq + Hash + Clone + Send + 'static,
    V: Send + 'static,
{
    type Command = KeyedCommand<K, V>;
    type Item = Entry<K, V>;

    fn apply(&mut self, command: KeyedCommand<K, V>, shared: &Arc<Shared>, delta: &mut Delta) {
        match command {
            KeyedCommand::Set(key, value, deadline) => {
                self.remove(&key, delta);
                delta.inserted += 1;
                let tick = shared.clock.deadline_tick(deadline);
                let entry = Entry {
                    key: key.clone(),
                    value,
                    deadline,
                };
                let filed = self.wheel.insert(tick, entry);
                self.index.insert(key, filed);
            }
            KeyedCommand::Reset(key, deadline) => {
                let Some(&filed) = self.index.get(&key) else {
                    return;
                };
                if let Some(entry) = self.wheel.get_mut(filed) {
                    entry.deadline = deadline;
                }
                self.wheel
                    .reschedule(filed, shared.clock.deadline_tick(deadline));
                delta.rescheduled += 1;
            }
            KeyedCommand::Remove(key) => {
                self.remove(&key, delta);
            }
            KeyedCommand::Take(key, reply) => {
                let _ = reply.send(self.remove(&key, delta));
            }
            KeyedCommand::Drain(reply) => {
                self.index.clear();
                let drained: Vec<(K, V)> = self
                    .wheel
                    .drain()
                    .map(|(_, entry)| (entry.key, entry.value))
                    .collect();
                delta.cancelled += drained.len() as u64;
                let _ = reply.send(drained);
            }
            KeyedCommand::Len(reply) => {
                let _ = reply.send(self.index.len());
            }
        }
    }

    fn fire(&mut self, now: u64, budget: usize, shared: &Arc<Shared>, delta: &mut Delta) -> usize {
        let mut fired = 0;
        let mut read_at: Option<Instant> = None;
        while fired < budget {
            let Some(expired) = self.wheel.poll_expired(now) else {
                break;
            };
            fired += 1;
            let now = *read_at.get_or_insert_with(Instant::now);
            delta.record_fire(shared.clock.instant_of(expired.deadline), now);
            let indexed = self.index.remove(&expired.item.key);
            debug_assert!(indexed.is_some(), "a fired entry was not indexed");
            self.deliver(expired.item, false, shared);
        }
        fired
    }

    fn wheel(&self) -> &TimerWheel<Entry<K, V>> {
        &self.wheel
    }

    fn turn_done(&mut self) {
        if self.index.is_empty() && self.index.capacity() > RETAINED_ENTRIES {
            self.index = Index::default();
        }
        self.wheel.shrink_if_empty(RETAINED_ENTRIES);
    }

    fn refuse(&mut self, _command: KeyedCommand<K, V>) {
        // Dropping a refused command drops its reply sender: the caller answers empty.
    }

    fn shut_down(&mut self, shared: &Arc<Shared>, delta: &mut Delta) {
        self.index.clear();
        let entries: Vec<Entry<K, V>> = self.wheel.drain().map(|(_, entry)| entry).collect();
        delta.cancelled += entries.len() as u64;
        for entry in entries {
            self.deliver(entry, true, shared);
        }
    }
}
