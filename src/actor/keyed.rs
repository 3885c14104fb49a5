//! The machine of a keyed timer set: entries by key, each filed in the wheel under a dense id.
//!
//! Every command reaches the set's actor through a single-shard inbox, so commands from every
//! handle apply in the order they were made. The actor keeps each entry once (key, value and
//! exact deadline, in a table indexed by id) and finds ids by key through hash tables of ids
//! that compare keys in that table: an entry costs its key and value plus about 30 bytes.
//!
//! Both structures grow without long pauses, so a flood into a big set never stalls the actor
//! (and its runtime) for long: entries live in fixed-size chunks (growing never copies them),
//! and the index is split into [`INDEX_SHARDS`] tables, so a resize rehashes a small fraction.
//!
//! Postponing is lazy: moving a key's deadline later only rewrites the entry's deadline; when
//! the old tick comes, the actor files the entry again for the new one.

use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use hashbrown::HashTable;
use tokio::sync::{mpsc, oneshot};

use super::inbox::Inbox;
use super::timeline::{Moves, Timeline, Verdict};
use super::{Ctx, Machine};
use crate::timer::clock::Clock;
use crate::timer::shared::Shared;

/// Entries per chunk of the entry table.
const CHUNK: usize = 4 * 1024;
/// Hash tables the index is split into.
const INDEX_SHARDS: usize = 64;

/// What a keyed set's handles ask of its actor. Deadlines are signed offsets from the wheel's
/// origin (negative before it), so an expiration reports the deadline exactly as it was set.
pub(crate) enum KeyedCommand<K, V> {
    Set { key: K, value: V, deadline: i64 },
    Reset { key: K, deadline: i64 },
    Remove(K),
    Take(K, oneshot::Sender<Option<V>>),
    Drain(oneshot::Sender<Drained<K, V>>),
    Len(oneshot::Sender<usize>),
}

/// What a set's actor sends its `Expirations` stream.
pub(crate) enum Delivery<K, V> {
    /// One entry that fired.
    Fired(Expiry<K, V>),
    /// Every entry still set when the wheel stopped, handed over at once.
    Flushed(Drained<K, V>),
}

/// An entry that fired or was flushed by shutdown, as the actor sends it.
#[derive(Debug)]
pub(crate) struct Expiry<K, V> {
    pub(crate) key: K,
    pub(crate) value: V,
    /// Signed offset from the wheel's origin.
    pub(crate) deadline: i64,
    pub(crate) shutdown: bool,
}

struct Entry<K, V> {
    key: K,
    value: V,
    /// Signed offset from the wheel's origin.
    deadline: i64,
}

/// Every entry of a set, taken out at once (a drain, or the shutdown flush). The actor hands
/// its whole entry table over in O(1) and the receiver walks it — so a drain of millions of
/// keys never stalls the actor or its runtime. Yields `(key, value, deadline offset)`.
pub(crate) struct Drained<K, V> {
    chunks: std::vec::IntoIter<Chunk<K, V>>,
    current: std::vec::IntoIter<Option<Entry<K, V>>>,
    left: usize,
}

// Never pinned through: a plain iterator over owned storage (so `Expirations` stays `Unpin`
// whatever the key and value types).
impl<K, V> Unpin for Drained<K, V> {}

impl<K, V> Drained<K, V> {
    fn new(entries: Entries<K, V>) -> Self {
        Drained {
            left: entries.len,
            chunks: entries.chunks.into_iter(),
            current: Vec::new().into_iter(),
        }
    }

    /// Entries not yet walked.
    pub(crate) fn len(&self) -> usize {
        self.left
    }
}

impl<K, V> Iterator for Drained<K, V> {
    type Item = (K, V, i64);

    fn next(&mut self) -> Option<(K, V, i64)> {
        loop {
            if let Some(slot) = self.current.next() {
                if let Some(entry) = slot {
                    self.left -= 1;
                    return Some((entry.key, entry.value, entry.deadline));
                }
                continue;
            }
            if self.left == 0 {
                return None;
            }
            self.current = self.chunks.next()?.into_vec().into_iter();
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

/// When a signed deadline is due: deadlines before the origin are due at once.
fn due_at(deadline: i64) -> u64 {
    deadline.max(0) as u64
}

/// [`CHUNK`] entries; `None` for free ids.
type Chunk<K, V> = Box<[Option<Entry<K, V>>]>;

/// Entries by id, in fixed-size chunks.
struct Entries<K, V> {
    chunks: Vec<Chunk<K, V>>,
    /// Ids below this have been handed out at least once.
    high: u32,
    free: Vec<u32>,
    len: usize,
}

impl<K, V> Entries<K, V> {
    fn new() -> Self {
        Entries {
            chunks: Vec::new(),
            high: 0,
            free: Vec::new(),
            len: 0,
        }
    }

    fn slot(&self, id: u32) -> &Option<Entry<K, V>> {
        &self.chunks[id as usize / CHUNK][id as usize % CHUNK]
    }

    fn slot_mut(&mut self, id: u32) -> &mut Option<Entry<K, V>> {
        &mut self.chunks[id as usize / CHUNK][id as usize % CHUNK]
    }

    fn get(&self, id: u32) -> &Entry<K, V> {
        self.slot(id).as_ref().expect("a live entry")
    }

    fn get_mut(&mut self, id: u32) -> &mut Entry<K, V> {
        self.slot_mut(id).as_mut().expect("a live entry")
    }

    fn insert(&mut self, entry: Entry<K, V>) -> u32 {
        let id = self.free.pop().unwrap_or_else(|| {
            if self.high as usize == self.chunks.len() * CHUNK {
                self.chunks.push((0..CHUNK).map(|_| None).collect());
            }
            self.high += 1;
            self.high - 1
        });
        *self.slot_mut(id) = Some(entry);
        self.len += 1;
        id
    }

    fn remove(&mut self, id: u32) -> Entry<K, V> {
        let entry = self.slot_mut(id).take().expect("a live entry");
        self.free.push(id);
        self.len -= 1;
        entry
    }

    /// Gives every chunk back, once empty.
    fn release_if_empty(&mut self) {
        if self.len == 0 && self.high > 0 {
            *self = Entries::new();
        }
    }
}

/// Ids by key, in [`INDEX_SHARDS`] hash tables chosen by hash bits the tables themselves do not
/// use for placement.
struct Index {
    shards: Box<[HashTable<u32>]>,
    len: usize,
}

impl Index {
    fn new() -> Self {
        Index {
            shards: (0..INDEX_SHARDS).map(|_| HashTable::new()).collect(),
            len: 0,
        }
    }

    fn shard(hash: u64) -> usize {
        (hash >> 32) as usize % INDEX_SHARDS
    }

    fn find(&self, hash: u64, eq: impl FnMut(&u32) -> bool) -> Option<u32> {
        self.shards[Self::shard(hash)].find(hash, eq).copied()
    }

    fn insert(&mut self, hash: u64, id: u32, rehash: impl Fn(&u32) -> u64) {
        self.shards[Self::shard(hash)].insert_unique(hash, id, rehash);
        self.len += 1;
    }

    fn remove(&mut self, hash: u64, id: u32) {
        if let Ok(found) = self.shards[Self::shard(hash)].find_entry(hash, |&other| other == id) {
            found.remove();
            self.len -= 1;
        }
    }

    fn release_if_empty(&mut self) {
        if self.len == 0 && self.shards.iter().any(|shard| shard.capacity() > 0) {
            *self = Index::new();
        }
    }
}

pub(crate) struct KeyedMachine<K, V> {
    timeline: Timeline,
    entries: Entries<K, V>,
    /// Ids by key. Only the live entry of a key is indexed.
    index: Index,
    hasher: foldhash::fast::RandomState,
    expirations: mpsc::UnboundedSender<Delivery<K, V>>,
}

impl<K, V> KeyedMachine<K, V>
where
    K: Eq + Hash + Send + 'static,
    V: Send + 'static,
{
    pub(crate) fn new(
        levels: &[u32],
        clock: Clock,
        expirations: mpsc::UnboundedSender<Delivery<K, V>>,
    ) -> Self {
        KeyedMachine {
            timeline: Timeline::new(levels, clock),
            entries: Entries::new(),
            index: Index::new(),
            // Randomly seeded per set: keys chosen by clients cannot be aimed at one bucket.
            hasher: foldhash::fast::RandomState::default(),
            expirations,
        }
    }

    fn find(&self, key: &K) -> Option<u32> {
        let entries = &self.entries;
        self.index.find(self.hasher.hash_one(key), |&id| {
            entries
                .slot(id)
                .as_ref()
                .is_some_and(|entry| entry.key == *key)
        })
    }

    fn insert(&mut self, key: K, value: V, deadline: i64) {
        let hash = self.hasher.hash_one(&key);
        let id = self.entries.insert(Entry {
            key,
            value,
            deadline,
        });
        let (entries, hasher) = (&self.entries, &self.hasher);
        self.index
            .insert(hash, id, |&id| hasher.hash_one(&entries.get(id).key));
        self.timeline.file(id, due_at(deadline));
    }

    /// Takes entry `id` out of the index and the table (not the timeline).
    fn forget(&mut self, id: u32) -> Entry<K, V> {
        let entry = self.entries.remove(id);
        self.index.remove(self.hasher.hash_one(&entry.key), id);
        entry
    }

    fn remove(&mut self, key: &K, ctx: &mut Ctx<'_>) -> Option<V> {
        let id = self.find(key)?;
        self.timeline.unfile(id);
        ctx.delta.cancelled += 1;
        Some(self.forget(id).value)
    }

    fn deliver(&self, entry: Entry<K, V>, shared: &Shared) {
        let Entry {
            key,
            value,
            deadline,
        } = entry;
        let expiry = Expiry {
            key,
            value,
            deadline,
            shutdown: false,
        };
        if self.expirations.send(Delivery::Fired(expiry)).is_ok() {
            shared
                .counters
                .expirations_backlog
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Takes every entry out at once: the index and the wheel start afresh.
    fn take_everything(&mut self) -> Drained<K, V> {
        self.index = Index::new();
        self.timeline.forget_all();
        Drained::new(std::mem::replace(&mut self.entries, Entries::new()))
    }
}

impl<K, V> Machine for KeyedMachine<K, V>
where
    K: Eq + Hash + Send + 'static,
    V: Send + 'static,
{
    type Command = KeyedCommand<K, V>;

    fn apply(&mut self, command: KeyedCommand<K, V>, ctx: &mut Ctx<'_>) {
        match command {
            KeyedCommand::Set {
                key,
                value,
                deadline,
            } => {
                ctx.delta.inserted += 1;
                match self.find(&key) {
                    Some(id) => {
                        // Replaced: the old entry counts as cancelled, the new as inserted.
                        ctx.delta.cancelled += 1;
                        let entry = self.entries.get_mut(id);
                        entry.value = value;
                        entry.deadline = deadline;
                        self.timeline.file(id, due_at(deadline));
                    }
                    None => self.insert(key, value, deadline),
                }
            }
            KeyedCommand::Reset { key, deadline } => {
                if let Some(id) = self.find(&key) {
                    self.entries.get_mut(id).deadline = deadline;
                    self.timeline.advance_to(id, due_at(deadline));
                    ctx.delta.rescheduled += 1;
                }
            }
            KeyedCommand::Remove(key) => {
                self.remove(&key, ctx);
            }
            KeyedCommand::Take(key, reply) => {
                let _ = reply.send(self.remove(&key, ctx));
            }
            KeyedCommand::Drain(reply) => {
                let drained = self.take_everything();
                ctx.delta.cancelled += drained.len() as u64;
                let _ = reply.send(drained);
            }
            KeyedCommand::Len(reply) => {
                let _ = reply.send(self.index.len);
            }
        }
    }

    fn fire(&mut self, now: u64, budget: usize, ctx: &mut Ctx<'_>) -> usize {
        let mut due = Vec::new();
        let entries = &self.entries;
        let shown = self.timeline.expire(now, budget, |id, limit| {
            let deadline = due_at(entries.get(id).deadline);
            if deadline <= limit {
                due.push(id);
                Verdict::Done
            } else {
                Verdict::Later(deadline)
            }
        });
        for id in due {
            let entry = self.forget(id);
            ctx.delta.record_fire(due_at(entry.deadline), now);
            self.deliver(entry, ctx.shared);
        }
        shown
    }

    fn next_wake(&self) -> Option<u64> {
        self.timeline.next_wake()
    }

    fn len(&self) -> usize {
        self.timeline.len()
    }

    fn moves(&self) -> Moves {
        self.timeline.moves()
    }

    fn shut_down_some(&mut self, _budget: usize, ctx: &mut Ctx<'_>) -> usize {
        let drained = self.take_everything();
        let flushed = drained.len() as u64;
        ctx.delta.cancelled += flushed;
        if flushed > 0 && self.expirations.send(Delivery::Flushed(drained)).is_ok() {
            ctx.shared
                .counters
                .expirations_backlog
                .fetch_add(flushed, Ordering::Relaxed);
        }
        // Handed over whole, in O(1): nothing is left to resolve.
        0
    }

    fn abandoned(&self) -> bool {
        // No stream reads expirations and (checked by the caller) no handle can set, take or
        // remove anything: nobody can ever see these entries again.
        self.expirations.is_closed()
    }

    fn holds_memory(&self, _shared: &Shared) -> bool {
        self.entries.high > 0 || self.index.shards.iter().any(|shard| shard.capacity() > 0)
    }

    fn release_memory(&mut self, _inbox: &Inbox<Self::Command>, _shared: &Arc<Shared>) -> bool {
        self.entries.release_if_empty();
        self.index.release_if_empty();
        self.timeline.shrink(0, CHUNK);
        true
    }
}
