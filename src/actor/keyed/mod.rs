//! The machine of a keyed timer set: entries by key, each filed in the wheel under a dense id.
//!
//! Handles queue commands into their thread's shard of the set's inbox (no lock shared
//! between threads), and the actor merges the shards back so that commands on a key, and
//! every command made after another was seen, apply in the order they were made (`order.rs`).
//! The actor keeps each entry once (key, value and
//! exact deadline, in a table indexed by id) and finds ids by key through an index of hash
//! bits and ids (`index.rs`) that compares keys in that table: an entry costs its key and value
//! plus about 45–50 bytes.
//!
//! Both structures grow without long pauses, so a flood into a big set never stalls the actor
//! (and its runtime) for long: entries live in fixed-size chunks (growing never copies them),
//! and the index is split into [`INDEX_SHARDS`](index::INDEX_SHARDS) tables, so a resize
//! refiles a small fraction (without reading a key).
//!
//! Postponing is lazy: moving a key's deadline later only rewrites the entry's deadline; when
//! the old tick comes, the actor files the entry again for the new one.
//!
//! An entry made with a handle (`Timers::insert`) keeps its deadline in a [`DeadlineWord`]
//! shared with the handle, which moves it later with no command at all (see `timer::keyed`).
//! Such entries are marked [`Due::SHARED`] in the table and their words kept in a side table by
//! id, so entries without a handle pay nothing for the feature. The actor counts every command
//! it applies in the set's [`Ledger`], which is how a handle knows it may write its word
//! without overtaking a command made before.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{mpsc, oneshot};

mod holds;
mod index;
mod order;
mod tables;

use self::holds::Holds;
use self::index::{Found, Index};
use self::order::{Counted, Merge, Place, Placed};
use self::tables::{CHUNK, Chunk, Due, Entries, Entry, Words, due_at};
use super::inbox::Inbox;
use super::timeline::{Moves, Timeline, Verdict};
use super::{Backlog, Ctx, Machine, PREFETCH_AHEAD};
use crate::timer::clock::Clock;
use crate::timer::keyed::{self as word, DeadlineWord, Ledger, Moved, Ordinals, Seq};
use crate::timer::shared::Shared;

/// What a keyed set's handles ask of its actor. Deadlines are signed offsets from the wheel's
/// origin (negative before it), so an expiration reports the deadline exactly as it was set.
///
/// Kept as small as a `set` (a test says so): a flood queues millions of them, so the actor
/// hashes each key again rather than carry its hash along, and the rarer handle commands box
/// what does not fit.
pub(crate) enum KeyedCommand<K, V> {
    Set {
        key: K,
        value: V,
        deadline: i64,
        seq: Seq,
    },
    /// `set` that also made a handle: the deadline is in the word.
    Insert {
        key: K,
        value: V,
        word: Arc<DeadlineWord>,
        seq: Seq,
    },
    Reset {
        key: K,
        deadline: i64,
        seq: Seq,
    },
    Remove {
        key: K,
        seq: Seq,
    },
    Take {
        key: K,
        reply: oneshot::Sender<Option<V>>,
        seq: Seq,
    },
    Drain {
        reply: oneshot::Sender<Drained<K, V>>,
        ordinals: Ordinals,
    },
    Len {
        reply: oneshot::Sender<usize>,
        ordinals: Ordinals,
    },
    /// A handle moved its word earlier itself: file the entry for the word's deadline. In no
    /// order: it only reads the word.
    Advance(Target<K>),
    /// A handle's move that had to queue behind commands in flight (boxed, as the rarer
    /// path, to keep every command small).
    Move(Box<(Target<K>, i64)>, Seq),
    /// A handle's `remove`.
    Forget(Target<K>, Seq),
    /// A handle's `take` (boxed, to keep every command small).
    TakeEntry(Box<(Target<K>, oneshot::Sender<Option<V>>)>, Seq),
}

impl<K, V> Placed for KeyedCommand<K, V> {
    fn place(&self) -> Place<'_> {
        match self {
            KeyedCommand::Set { seq, .. }
            | KeyedCommand::Insert { seq, .. }
            | KeyedCommand::Reset { seq, .. }
            | KeyedCommand::Remove { seq, .. }
            | KeyedCommand::Take { seq, .. }
            | KeyedCommand::Move(_, seq)
            | KeyedCommand::Forget(_, seq)
            | KeyedCommand::TakeEntry(_, seq) => Place::In(*seq),
            KeyedCommand::Drain { ordinals, .. } | KeyedCommand::Len { ordinals, .. } => {
                Place::Everywhere(ordinals)
            }
            KeyedCommand::Advance(_) => Place::Free,
        }
    }
}

/// The entry a handle's command is for: where the actor filed it (the id the actor wrote into
/// the word when it applied the `Insert`), or — for a command made before that — its key; and
/// the address of the handle's word. The address is compared with the word of the live entry
/// there, never dereferenced, so the command holds no reference to the word and the actor
/// never takes the handle's cache line away to check it.
///
/// Equal addresses mean the same word: the sender holds its word alive when it sends, and the
/// live entry's word was allocated before its `Insert` was sent — so before this command —
/// and lives as long as the entry; two words alive at the same moment never share an address.
pub(crate) enum Target<K> {
    Filed {
        id: u32,
        word: usize,
    },
    /// Boxed: rare (only before the `Insert` is applied), and commands stay small.
    Unfiled(Box<(K, usize)>),
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

/// Every entry of a set, taken out at once (a drain, or the shutdown flush). The actor hands
/// its whole entry table over in O(1) and the receiver walks it — so a drain of millions of
/// keys never stalls the actor or its runtime. Yields `(key, value, deadline offset)`.
pub(crate) struct Drained<K, V> {
    chunks: std::iter::Flatten<std::vec::IntoIter<Option<Chunk<K, V>>>>,
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
            chunks: entries.chunks.into_iter().flatten(),
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
                    // Every shared deadline was written back before the table was handed over.
                    let deadline = entry.due.deadline().expect("an own deadline");
                    return Some((entry.key, entry.value, deadline));
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

/// Commands handed on from the merge at a time (see `order`): a flood's take is applied in
/// steps, firing and yielding between them.
const HAND_ON: usize = 1024;

/// Entry chunks a set with entries pending may keep however sparse they are.
const RETAINED_CHUNKS: usize = 4;

pub(crate) struct KeyedMachine<K, V> {
    timeline: Timeline,
    entries: Entries<K, V>,
    /// Ids by key. Only the live entry of a key is indexed.
    index: Index,
    /// The words of entries made with a handle: exactly the entries marked [`Due::SHARED`].
    words: Words,
    /// Ids the timeline has room for: it grows with the table, by at most an eighth at a time
    /// (not by doubling), so its 20 bytes per entry stay close to 20.
    reserved: usize,
    /// The set's hasher, shared with its senders (who hash keys to count commands in the
    /// ledger's stripes).
    hasher: foldhash::fast::RandomState,
    ledger: Arc<Ledger>,
    /// Due entries held back by commands in flight (`holds.rs`).
    holds: Holds,
    /// Commands taken from the inbox's shards and not yet handed on in order (see `order`).
    merge: Merge<KeyedCommand<K, V>>,
    /// How many `Timers` clones of the set are alive: once none is, nothing new can be set,
    /// and the actor stops when nothing is left (live `KeyedTimer`s, all stale by then, do not
    /// keep the stream open).
    timers: Arc<AtomicUsize>,
    expirations: mpsc::UnboundedSender<Delivery<K, V>>,
}

impl<K, V> KeyedMachine<K, V>
where
    K: Eq + Hash + Send + 'static,
    V: Send + 'static,
{
    /// `hasher` and `ledger` are shared with the set's handles, which count each command they
    /// send in the stripe of its key's hash; `shards` is how many shards the set's inbox has.
    pub(crate) fn new(
        levels: &[u32],
        clock: Clock,
        expirations: mpsc::UnboundedSender<Delivery<K, V>>,
        hasher: foldhash::fast::RandomState,
        ledger: Arc<Ledger>,
        timers: Arc<AtomicUsize>,
        shards: usize,
    ) -> Self {
        KeyedMachine {
            timeline: Timeline::new(levels, clock),
            entries: Entries::new(),
            index: Index::new(),
            words: Words::new(),
            reserved: 0,
            hasher,
            ledger,
            holds: Holds::default(),
            merge: Merge::new(shards),
            timers,
            expirations,
        }
    }

    fn find(&self, key: &K, hash: u64) -> Option<u32> {
        let entries = &self.entries;
        self.index.find(hash, |id| {
            entries
                .slot(id)
                .as_ref()
                .is_some_and(|entry| entry.key == *key)
        })
    }

    /// Files a new entry for `key` (indexed already, by the caller) due at `deadline`.
    fn file_new(&mut self, id: u32, deadline: i64) {
        if id as usize >= self.reserved {
            self.reserved = (self.reserved + self.reserved / 8)
                .max(id as usize + 1)
                .next_multiple_of(CHUNK);
            self.timeline.reserve_ids(self.reserved);
        }
        self.timeline.file(id, due_at(deadline));
    }

    /// Entry `id` is gone: its shared word (if any) is retired. Returns the deadline it had.
    fn retire(&mut self, id: u32) -> Option<i64> {
        self.holds.forget(id);
        let entry = self.entries.get(id);
        if entry.due == Due::SHARED {
            let word = self.words.remove(id).expect("a shared entry has a word");
            Some(word.retire())
        } else {
            entry.due.deadline()
        }
    }

    /// Takes entry `id` out of the index and the table (not the timeline), retiring its word.
    /// Returns it with its deadline.
    fn forget(&mut self, id: u32, hash: u64) -> (Entry<K, V>, i64) {
        let deadline = self.retire(id).expect("a deadline");
        let entry = self.entries.remove(id);
        self.index.remove(hash, id);
        (entry, deadline)
    }

    fn remove(&mut self, id: u32, hash: u64, ctx: &mut Ctx<'_>) -> V {
        self.timeline.unfile(id);
        ctx.delta.cancelled += 1;
        self.forget(id, hash).0.value
    }

    /// The id of a handle's entry, if it is still live (not fired, removed, taken, replaced or
    /// drained since).
    fn live(&self, target: &Target<K>) -> Option<u32> {
        let (id, address) = match target {
            Target::Filed { id, word } => (*id, *word),
            Target::Unfiled(unfiled) => {
                let (key, word) = &**unfiled;
                (self.find(key, self.hasher.hash_one(key))?, *word)
            }
        };
        self.words
            .get(id)
            .is_some_and(|word| Arc::as_ptr(word) as usize == address)
            .then_some(id)
    }

    /// Removes live entry `id`, which a handle named.
    fn remove_by_id(&mut self, id: u32, ctx: &mut Ctx<'_>) -> V {
        let hash = self.hasher.hash_one(&self.entries.get(id).key);
        self.remove(id, hash, ctx)
    }

    /// Sets entry `id`'s deadline (wherever it lives) and files it earlier if need be.
    fn move_entry(&mut self, id: u32, deadline: i64) {
        let entry = self.entries.get_mut(id);
        if entry.due == Due::SHARED {
            let moved = self.words.of(id).move_to(deadline);
            debug_assert_ne!(moved, Moved::Gone, "only the actor retires a word");
        } else {
            entry.due = Due::own(deadline);
        }
        self.timeline.advance_to(id, due_at(deadline));
    }

    fn deliver(&self, entry: Entry<K, V>, deadline: i64, shared: &Shared) {
        let Entry { key, value, .. } = entry;
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

    /// Takes every entry out at once: the index and the wheel start afresh. Each handle's
    /// word is retired and its deadline written back into the table, so the receiver needs
    /// no word (this is the one step that costs time per handle, not per entry).
    fn take_everything(&mut self) -> Drained<K, V> {
        for (id, word) in self.words.drain() {
            let deadline = word.retire();
            self.entries.get_mut(id).due = Due::own(deadline);
        }
        self.index = Index::new();
        self.holds.clear();
        self.timeline.forget_all();
        self.reserved = 0;
        Drained::new(std::mem::replace(&mut self.entries, Entries::new()))
    }

    /// Applies `command`, whose turn has come.
    fn apply_one(&mut self, command: KeyedCommand<K, V>, ctx: &mut Ctx<'_>) {
        let counted = Counted::of(command.place());
        self.act(command, ctx);
        // Published once its effect on any word is done.
        counted.applied(&self.ledger);
    }

    fn act(&mut self, command: KeyedCommand<K, V>, ctx: &mut Ctx<'_>) {
        let hash = |key: &K| self.hasher.hash_one(key);
        match command {
            KeyedCommand::Set {
                key,
                value,
                deadline,
                ..
            } => {
                let hash = hash(&key);
                self.set(key, value, Due::own(deadline), deadline, hash, ctx);
            }
            KeyedCommand::Insert {
                key, value, word, ..
            } => {
                let hash = hash(&key);
                // No handle writes the word before this is applied: the ledger holds them off.
                let deadline = word.load().1;
                let id = self.set(key, value, Due::SHARED, deadline, hash, ctx);
                // Written once, read by the handles: their commands name the entry by it.
                word.filed_as(id);
                self.words.insert(id, word);
            }
            KeyedCommand::Reset { key, deadline, .. } => {
                let hash = hash(&key);
                if let Some(id) = self.find(&key, hash) {
                    self.move_entry(id, deadline);
                    ctx.delta.rescheduled += 1;
                }
            }
            KeyedCommand::Remove { key, .. } => {
                let hash = hash(&key);
                if let Some(id) = self.find(&key, hash) {
                    self.remove(id, hash, ctx);
                }
            }
            KeyedCommand::Take { key, reply, .. } => {
                let hash = hash(&key);
                let value = self.find(&key, hash).map(|id| self.remove(id, hash, ctx));
                let _ = reply.send(value);
            }
            KeyedCommand::Drain { reply, .. } => {
                let drained = self.take_everything();
                ctx.delta.cancelled += drained.len() as u64;
                let _ = reply.send(drained);
            }
            KeyedCommand::Len { reply, .. } => {
                let _ = reply.send(self.index.len);
            }
            // A handle's own commands (but an advance) also count in its word: counted down
            // once applied to a live entry (a gone entry's word refuses every move anyway).
            // An advance only reads the word, so it is not counted.
            KeyedCommand::Advance(target) => {
                if let Some(id) = self.live(&target) {
                    // Should it move again meanwhile, later, the entry's tick finds out.
                    let deadline = self.words.of(id).load().1;
                    self.timeline.advance_to(id, due_at(deadline));
                    ctx.delta.rescheduled += 1;
                }
            }
            KeyedCommand::Move(moved, _) => {
                let (target, deadline) = *moved;
                if let Some(id) = self.live(&target) {
                    self.move_entry(id, deadline);
                    self.words.of(id).applied();
                    ctx.delta.rescheduled += 1;
                }
            }
            KeyedCommand::Forget(target, _) => {
                if let Some(id) = self.live(&target) {
                    self.remove_by_id(id, ctx);
                }
            }
            KeyedCommand::TakeEntry(taken, _) => {
                let (target, reply) = *taken;
                let value = self.live(&target).map(|id| self.remove_by_id(id, ctx));
                let _ = reply.send(value);
            }
        }
    }

    /// Sets `key` to `value`, due as `due` says (at `deadline`): replaces the entry if the key
    /// is set (retiring its word, if it had one), else files a new one. Returns its id.
    fn set(
        &mut self,
        key: K,
        value: V,
        due: Due,
        deadline: i64,
        hash: u64,
        ctx: &mut Ctx<'_>,
    ) -> u32 {
        ctx.delta.inserted += 1;
        // One probe of the index finds the key or the place for it: a set of a new key
        // (most sets) does not probe again to insert.
        let entries = &self.entries;
        let found = self.index.find_or_place(hash, |id| {
            entries
                .slot(id)
                .as_ref()
                .is_some_and(|entry| entry.key == key)
        });
        match found {
            Found::Vacant(place) => {
                let id = self.entries.insert(Entry { key, value, due });
                self.index.insert_at(place, id);
                self.file_new(id, deadline);
                id
            }
            Found::Id(id) => {
                // Replaced: the old entry counts as cancelled, the new as inserted.
                ctx.delta.cancelled += 1;
                self.retire(id);
                let entry = self.entries.get_mut(id);
                entry.value = value;
                entry.due = due;
                self.timeline.file(id, due_at(deadline));
                id
            }
        }
    }
}

impl<K, V> Machine for KeyedMachine<K, V>
where
    K: Eq + Hash + Send + 'static,
    V: Send + 'static,
{
    type Command = KeyedCommand<K, V>;

    fn apply(&mut self, command: KeyedCommand<K, V>, ctx: &mut Ctx<'_>) {
        self.apply_one(command, ctx);
    }

    fn take(&mut self, inbox: &Inbox<Self::Command>, into: &mut VecDeque<Self::Command>) -> usize {
        let took = self.merge.take(inbox);
        self.merge.hand_on(into, HAND_ON, inbox, &self.ledger);
        took
    }

    fn refill(&mut self, inbox: &Inbox<Self::Command>, into: &mut VecDeque<Self::Command>) -> bool {
        self.merge.hand_on(into, HAND_ON, inbox, &self.ledger) > 0
    }

    fn take_stopped(
        &mut self,
        inbox: &Inbox<Self::Command>,
        into: &mut VecDeque<Self::Command>,
    ) -> usize {
        let took = self.merge.stop(inbox);
        self.merge.stopped(into, &self.ledger);
        took
    }

    fn waiting(&self) -> bool {
        self.merge.waiting()
    }

    fn prefetch(&self, command: &KeyedCommand<K, V>) {
        // By-key commands on a big set miss the cache in the index first: start that early.
        // (Hashing the key twice costs little next to a miss.)
        match command {
            KeyedCommand::Set { key, .. }
            | KeyedCommand::Insert { key, .. }
            | KeyedCommand::Reset { key, .. }
            | KeyedCommand::Remove { key, .. }
            | KeyedCommand::Take { key, .. } => self.index.prefetch(self.hasher.hash_one(key)),
            _ => {}
        }
    }

    fn fire(&mut self, now: u64, budget: usize, backlog: Backlog, ctx: &mut Ctx<'_>) -> usize {
        // Commands taken but waiting for one made before them are not applied yet.
        let backlog = if self.merge.waiting() {
            Backlog::Unapplied
        } else {
            backlog
        };
        let mut due = Vec::new();
        let (entries, words, hasher, ledger, holds) = (
            &self.entries,
            &self.words,
            &self.hasher,
            &self.ledger,
            &mut self.holds,
        );
        let shown = self.timeline.expire(now, budget, |id, limit| {
            let entry = entries.get(id);
            let deadline = match entry.due.deadline() {
                Some(deadline) => deadline,
                None => words.of(id).load().1,
            };
            if due_at(deadline) > limit {
                return Verdict::Later(due_at(deadline));
            }
            let stripe = || Ledger::stripe(hasher.hash_one(&entry.key));
            // Held back before, since `hold.limit`: once every command counted by then is
            // applied, what may still be in flight was made after the deadline had passed.
            let released_by = holds.released_by(id, ledger, stripe);
            // In the middle of a flood's batch, a by-key command on this key (a `reset`, a
            // `remove`) may wait in the batch although it returned before the deadline: such
            // an entry waits for the end of the turn, when the batch is applied.
            let held = if backlog == Backlog::Unapplied
                && !ledger.is_quiet(stripe())
                && released_by.is_none_or(|released| due_at(deadline) > released)
            {
                true
            } else if entry.due == Due::SHARED {
                // The handle may be moving it right now: one compare-and-swap decides.
                let released_by = released_by.map(|released| released.min(i64::MAX as u64) as i64);
                match words
                    .of(id)
                    .on_due(limit.min(i64::MAX as u64) as i64, released_by)
                {
                    word::Due::Fire(fired) => {
                        due.push((id, fired, hasher.hash_one(&entry.key)));
                        return Verdict::Done;
                    }
                    word::Due::Later(later) => return Verdict::Later(due_at(later)),
                    // A command of its handle is in flight, perhaps queued after this turn
                    // took the inbox but before the clock read that made the entry due (the
                    // handle then returned before the deadline): a later move queued behind
                    // another command must not lose to the expiry.
                    word::Due::Held => true,
                }
            } else {
                false
            };
            if !held {
                due.push((id, deadline, hasher.hash_one(&entry.key)));
                return Verdict::Done;
            }
            // Look again once what may have returned before the deadline is applied: never
            // early, at most a turn late. `Later(limit)` parks it within its own tick (the
            // timeline shows parked entries first on every pass).
            holds.hold(id, due_at(deadline), limit, ledger, stripe);
            Verdict::Later(limit)
        });
        // Keys expire in deadline order, not the index's: at 10^5 keys each lookup of
        // `forget` missed the cache (~90 % of its time, measured). Their lines are asked for
        // a few entries ahead, so the misses overlap (as `apply_slice` does for commands).
        for &(_, _, hash) in due.iter().take(PREFETCH_AHEAD) {
            self.index.prefetch(hash);
        }
        for at in 0..due.len() {
            if let Some(&(_, _, ahead)) = due.get(at + PREFETCH_AHEAD) {
                self.index.prefetch(ahead);
            }
            let (id, deadline, hash) = due[at];
            // A fired entry's word is gone already: retiring it again changes nothing.
            let (entry, _) = self.forget(id, hash);
            ctx.delta.record_fire(due_at(deadline), now);
            self.deliver(entry, deadline, ctx.shared);
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
        // Handed over whole, in O(1) per entry without a handle: nothing is left to resolve.
        0
    }

    fn abandoned(&self) -> bool {
        // No stream reads expirations and (checked by the caller) no handle can set, take or
        // remove anything: nobody can ever see these entries again.
        self.expirations.is_closed()
    }

    fn cannot_grow(&self) -> bool {
        // Acquire: every command a `Timers` sent before its drop counted down is then seen by
        // the actor's next look at its inbox.
        self.timers.load(Ordering::Acquire) == 0
    }

    fn holds_memory(&self, _shared: &Shared) -> bool {
        !self.entries.chunks.is_empty()
            || self.words.holds_memory()
            || self.index.holds_memory()
            || self.merge.holds_memory()
    }

    fn sparse(&self, _shared: &Shared) -> bool {
        // Most of the entry table unused: a flood is over but some entries outlive it.
        let capacity = self.entries.capacity();
        capacity > RETAINED_CHUNKS * CHUNK && self.entries.len * 4 < capacity
    }

    fn release_memory(&mut self, _inbox: &Inbox<Self::Command>, _shared: &Arc<Shared>) -> bool {
        if self.entries.len == 0 {
            self.entries.release_if_empty();
            self.index.release_if_empty();
            self.words.release_if_empty();
            self.timeline.release_ids(0..usize::MAX);
        } else {
            // Entries outlive a flood: keep only the chunks and table room they use.
            self.entries.release_unused();
            self.words.release_unused();
            self.index.shrink();
            self.timeline.release_unfiled();
        }
        self.reserved = self.reserved.min(CHUNK);
        self.holds.shrink();
        self.merge.shrink();
        true
    }
}

#[cfg(all(test, not(loom)))]
mod tests;

/// Model check of how a set's actor stops once no `Timers` is left: the last `Timers` counts
/// itself out after its last send, and the actor, once it reads the count as zero, looks at
/// its inbox once more before it stops — so that send is never lost. Run with
/// `RUSTFLAGS="--cfg loom" cargo test --release --lib loom_model`.
#[cfg(all(test, loom))]
mod loom_model;
