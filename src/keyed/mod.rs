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
//! Each [`Wheel::keyed`](crate::Wheel::keyed) set runs actor tasks of its own, so sets never
//! contend with each other or with sleeps: by default one per worker thread of the runtime,
//! each owning the keys whose hash falls to it ([`Builder::shards`](crate::Builder::shards)),
//! so producers on many cores are not all served by one. Every by-key operation is one queued command (one
//! lock and a push; no allocation) plus hashing the key once on the caller's side; `take`,
//! `drain` and `len` also wait for the actor's answer. The actor keeps each entry once — key,
//! value and an 8-byte deadline in a table, found through an index of 8-byte slots (hash bits
//! and id, at most ¾ full) — plus a 20-byte wheel position: about 45–50 bytes besides the key
//! and value (61–65 bytes in all for `u64` keys and values from 10^4 to 10^6 entries). Moving a
//! key's deadline later costs the actor one index lookup and one table write; the entry is
//! filed again only when its old tick comes. Lookups of successive commands overlap their
//! cache misses, so a set of 10^6 keys costs little more per command than one of 10^4.
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
//! `DelayQueue` runs its wheel inside the consumer's poll; a set here has actor tasks of its own.
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

mod expirations;
mod handle;
mod set;
mod timers;

pub use expirations::{Expirations, Expired};
pub use handle::KeyedTimer;
pub use timers::Timers;

use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use tokio::sync::mpsc;

use crate::actor::Actor;
use crate::actor::context::WheelContext;
use crate::actor::inbox::Inbox;
use crate::actor::keyed::KeyedMachine;
use crate::timer::keyed::Ledger;

use set::{Set, SetShard};
pub(crate) fn new<K, V>(wheel: &Arc<WheelContext>) -> (Timers<K, V>, Expirations<K, V>)
where
    K: Eq + Hash + Clone + Send + 'static,
    V: Send + 'static,
{
    let shared = wheel.shared.clone();
    let timers = Arc::new(AtomicUsize::new(1));
    // Randomly seeded per set: keys chosen by clients cannot be aimed at one bucket (or one
    // shard).
    let hasher = foldhash::fast::RandomState::default();
    // One stream for every shard: each shard's actor holds a sender, and the stream ends
    // once all of them are gone.
    let (expired_sender, expired) = mpsc::unbounded_channel();
    // Queues per shard's inbox, so that threads rarely share one (the actor puts commands
    // back in the order they were made, `actor::keyed::order`): a few per core in all, spread
    // over the shards, so a set costs about the same whatever its shard count.
    let queues = (Inbox::<()>::shards_for_this_machine() / shared.keyed_shards)
        .max(2)
        .next_power_of_two();
    let shards = (0..shared.keyed_shards)
        .map(|_| {
            // The set's shards share one bound on commands waiting.
            let inbox = Arc::new(
                Inbox::new(queues)
                    .sharing_bound_with(shared.keyed_shards)
                    .taking_early()
                    .with_actor_on(&shared.actors),
            );
            let ledger = Arc::new(Ledger::default());
            if shared.is_closed() {
                // A set made after shutdown gets no actor: calls answer empty, the stream
                // ends at once.
                inbox.stop(&mut Default::default());
            } else {
                let machine = KeyedMachine::new(
                    &shared.levels,
                    shared.clock,
                    expired_sender.clone(),
                    hasher.clone(),
                    ledger.clone(),
                    timers.clone(),
                    inbox.shard_count(),
                );
                Actor::new(machine, inbox.clone(), shared.clone()).spawn("keyed");
            }
            SetShard { inbox, ledger }
        })
        .collect();
    drop(expired_sender);
    (
        Timers {
            set: Arc::new(Set {
                wheel: wheel.clone(),
                shards,
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
