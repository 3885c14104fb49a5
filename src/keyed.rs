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
//! contend with each other or with sleeps. Every operation is one queued command (one lock
//! and a push; no allocation); `take`, `drain` and `len` also wait for the actor's answer.
//! The actor keeps each entry once — key, value and deadline in a table, found through a hash
//! table of 4-byte ids — plus a 20-byte wheel position: about 30 bytes besides the key and
//! value. Moving a key's deadline later costs the actor one table write; the entry is filed
//! again only when its old tick comes.
//!
//! Expirations are buffered without bound: a slow or absent reader never stalls the wheel,
//! and each unread expiration costs its key, value and deadline (plus the channel's slot) in
//! memory (see [`Stats::expirations_backlog`](crate::Stats)).
//!
//! # Shutdown
//!
//! Every command made before [`Wheel::shutdown`](crate::Wheel::shutdown) is called, or before
//! the runtime running the actor goes away, is applied before the entries are flushed: each
//! entry set and not removed is delivered exactly once, marked
//! [`is_shutdown`](Expired::is_shutdown); a removed one never is. After that, `set` is refused
//! silently and `take`, `drain` and `len` answer empty.

use std::fmt;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures::Stream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::coop;
use tokio::time::Instant;

use crate::actor::Actor;
use crate::actor::context::WheelContext;
use crate::actor::inbox::{Inbox, Urgency};
use crate::actor::keyed::{Delivery, Drained, Expiry, KeyedCommand, KeyedMachine};
use crate::timer::clock::deadline_after;
use crate::timer::shared::Shared;

pub(crate) fn new<K, V>(wheel: &Arc<WheelContext>) -> (Timers<K, V>, Expirations<K, V>)
where
    K: Eq + Hash + Clone + Send + 'static,
    V: Send + 'static,
{
    let shared = wheel.shared.clone();
    // One shard: commands from every handle apply in the order they were made.
    let inbox = Arc::new(Inbox::new(1));
    let (expired_sender, expired) = mpsc::unbounded_channel();
    if shared.is_closed() {
        // A set made after shutdown gets no actor: calls answer empty, the stream ends at once.
        inbox.stop(&mut Default::default());
    } else {
        let machine = KeyedMachine::new(&shared.levels, shared.clock, expired_sender);
        Actor::new(machine, inbox.clone(), shared.clone()).spawn("keyed");
    }
    (
        Timers {
            wheel: wheel.clone(),
            sender: Arc::new(KeyedSender(inbox)),
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
    /// Keeps the wheel's handles' state alive, as a `Wheel` would; shown as the wheel.
    wheel: Arc<WheelContext>,
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
    fn send(&self, command: KeyedCommand<K, V>, urgency: Urgency) {
        if !self.wheel.shared.is_closed() {
            // A send fails only once the set's actor has stopped: refused, as documented.
            let _ = self.sender.0.send(0, command, urgency);
        }
    }

    fn offset(&self, deadline: Instant) -> i64 {
        self.wheel.shared.clock.signed_offset(deadline)
    }

    /// Inserts `key` with `value`, expiring `after` from now; replaces the value and deadline
    /// if the key is already set.
    pub fn set(&self, key: K, value: V, after: Duration) {
        self.set_at(key, value, deadline_after(after));
    }

    /// Inserts `key` with `value`, expiring at `deadline`; replaces the value and deadline if
    /// the key is already set.
    pub fn set_at(&self, key: K, value: V, deadline: Instant) {
        let deadline = self.offset(deadline);
        let urgency = Urgency::By(deadline.max(0) as u64);
        self.send(
            KeyedCommand::Set {
                key,
                value,
                deadline,
            },
            urgency,
        );
    }

    /// Moves `key`'s expiry to `after` from now, earlier or later. No-op if absent.
    pub fn reset(&self, key: &K, after: Duration) {
        self.reset_at(key, deadline_after(after));
    }

    /// Moves `key`'s expiry to `deadline`, earlier or later. No-op if absent.
    pub fn reset_at(&self, key: &K, deadline: Instant) {
        let deadline = self.offset(deadline);
        let urgency = Urgency::By(deadline.max(0) as u64);
        self.send(
            KeyedCommand::Reset {
                key: key.clone(),
                deadline,
            },
            urgency,
        );
    }

    /// Removes `key` so it does not expire. Fire-and-forget: use [`take`](Self::take) to know
    /// whether it was still there.
    pub fn remove(&self, key: &K) {
        self.send(KeyedCommand::Remove(key.clone()), Urgency::Lazy);
    }

    /// Removes `key` and returns its value: `Some` if and only if it was removed before it
    /// expired.
    pub async fn take(&self, key: &K) -> Option<V> {
        self.ask(|reply| KeyedCommand::Take(key.clone(), reply))
            .await
            .flatten()
    }

    /// Removes every key now and returns them with their values.
    ///
    /// The set's actor hands its whole table over at once; turning it into pairs happens on
    /// the calling task, so draining millions of keys never stalls the actor.
    pub async fn drain(&self) -> Vec<(K, V)> {
        match self.ask(KeyedCommand::Drain).await {
            Some(drained) => drained.map(|(key, value, _)| (key, value)).collect(),
            None => Vec::new(),
        }
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
        self.send(command(reply), Urgency::Now);
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
/// [`Timers`] clone is dropped and nothing is pending, or after shutdown (once the entries
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
