//! [`Expirations`]: the stream of keyed expirations, and [`Expired`], one of them.

use std::fmt;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};

use futures::Stream;
use tokio::sync::mpsc;
use tokio::task::coop;
use tokio::time::Instant;

use crate::actor::keyed::{Delivery, Drained, Expiry};
use crate::timer::shared::Shared;

/// A keyed timer that fired (or was flushed by shutdown), read from
/// [`Expirations`](crate::Expirations).
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
/// [`Timers`](crate::Timers) clone is dropped and nothing is pending (live
/// [`KeyedTimer`](crate::KeyedTimer)s, which can only act on their own entries, do not keep it
/// open), or after shutdown (once the entries flushed by it, marked [`Expired::is_shutdown`],
/// are read). Dropping it is allowed: the
/// timers keep working and their expirations are discarded.
pub struct Expirations<K, V> {
    pub(super) receiver: mpsc::UnboundedReceiver<Delivery<K, V>>,
    /// The entries flushed by shutdown, being read.
    pub(super) flushed: Option<Drained<K, V>>,
    pub(super) shared: Arc<Shared>,
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
