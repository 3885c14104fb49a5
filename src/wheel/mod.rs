//! The cascade wheel: a synchronous, Tokio-free hierarchical timer wheel over `u64` ticks.
//!
//! This is the data structure the actor owns. It knows nothing of time, tasks or wakers: items
//! go in at a deadline tick, and [`TimerWheel::poll_expired`] hands them back once the wheel has
//! been advanced to that tick.
//!
//! ```
//! use tokio_wheel::wheel::TimerWheel;
//!
//! let mut wheel = TimerWheel::new(&[64, 64, 64]).unwrap();
//! let late = wheel.insert(5_000, "late");
//! wheel.insert(10, "soon");
//! assert_eq!(wheel.next_expiration(), Some(10));
//!
//! assert_eq!(wheel.poll_expired(9).map(|e| e.item), None); // never early
//! assert_eq!(wheel.poll_expired(10).map(|e| e.item), Some("soon"));
//! assert_eq!(wheel.remove(late), Some("late"));
//! assert!(wheel.is_empty());
//! ```
//!
//! # How it works
//!
//! Level `i` has `slots[i]` slots, each spanning `unit[i]` ticks, where `unit[0] = 1` and
//! `unit[i + 1] = unit[i] * slots[i]`: a tick is a number in that mixed radix. An entry sits on
//! the highest level whose digit differs between its deadline and the wheel's current tick, in
//! the slot named by that digit. Entries on a level therefore always lie ahead of the current
//! digit and inside the current block of the level above, which gives two properties the code
//! leans on:
//!
//! - lower levels always expire before higher ones, so the next expiration is the first
//!   occupied slot of the lowest non-empty level: two bitmap look-ups, no scan;
//! - when a slot's start is reached, its entries move at least one level down (a *cascade*),
//!   so each entry cascades at most once per level.
//!
//! Deadlines beyond the top level wait in an overflow list and re-enter when the top level
//! wraps. Deadlines at or before the current tick go to a ready list and fire on the next poll.
//!
//! # Performance notes
//!
//! Positions live in a table of 20-byte nodes indexed by dense ids (for a `TimerWheel`, slab
//! indices; the actor uses its timer-pool indices), kept in chunks of 1024 so that the ranges
//! of ids an owner knows to be unfiled can be given back while others stay filed; every slot is an intrusive doubly-linked
//! list threaded through those ids, so insert, remove and reschedule are O(1) (plus one division pair per
//! level climbed) and allocate only when the slab grows. Keys carry a generation, so a key
//! whose entry has gone never reaches a newer entry that reuses its index.

mod bitmap;
pub(crate) mod cascade;
mod layout;
mod nodes;

use slab::Slab;

use self::cascade::Cascade;
use crate::error::BuildError;
pub use layout::{Layout, MAX_LEVELS, MAX_SLOTS_PER_LEVEL};

/// A handle to an entry of a [`TimerWheel`].
///
/// Keys are generational: once the entry is removed or fired, the key refers to nothing, even
/// after its slab index is reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    index: u32,
    generation: u32,
}

impl Key {
    /// The key as one `u64`, e.g. to keep it in an atomic.
    pub fn into_raw(self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.index)
    }

    /// A key from [`into_raw`](Self::into_raw). Any `u64` is accepted: one that names no
    /// entry is simply stale.
    pub fn from_raw(raw: u64) -> Self {
        Key {
            index: raw as u32,
            generation: (raw >> 32) as u32,
        }
    }
}

/// An entry handed back by [`TimerWheel::poll_expired`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Expired<T> {
    /// The item that was inserted.
    pub item: T,
    /// Its deadline tick (at or before the tick the wheel was advanced to).
    pub deadline: u64,
}

#[derive(Debug)]
struct Entry<T> {
    item: T,
    generation: u32,
}

/// A hierarchical timer wheel holding items of type `T` at `u64` deadline ticks.
///
/// See the [module documentation](self) for how it works.
#[derive(Debug)]
pub struct TimerWheel<T> {
    cascade: Cascade,
    entries: Slab<Entry<T>>,
    next_generation: u32,
}

impl<T> TimerWheel<T> {
    /// An empty wheel at tick 0 with the given slots per level, lowest first.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidLayout`] under the rules of [`Layout::custom`].
    pub fn new(slots_per_level: &[u32]) -> Result<Self, BuildError> {
        Self::with_capacity(slots_per_level, 0)
    }

    /// Like [`new`](Self::new), with room for `capacity` entries before reallocating.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn with_capacity(slots_per_level: &[u32], capacity: usize) -> Result<Self, BuildError> {
        Layout::custom(slots_per_level)?;
        let mut cascade = Cascade::new(slots_per_level);
        cascade.reserve_ids(capacity);
        Ok(TimerWheel {
            cascade,
            entries: Slab::with_capacity(capacity),
            next_generation: 0,
        })
    }

    /// The tick the wheel has been advanced to.
    pub fn now(&self) -> u64 {
        self.cascade.now()
    }

    /// How many entries are in the wheel.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the wheel holds no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many entries have moved down a level so far.
    pub fn cascades(&self) -> u64 {
        self.cascade.cascades()
    }

    /// Ticks covered by the levels; deadlines further than this from [`now`](Self::now) wait
    /// in the overflow list.
    pub fn span(&self) -> u64 {
        self.cascade.span()
    }

    /// Inserts `item` due at `deadline`; a deadline at or before [`now`](Self::now) is due at
    /// once. O(1).
    pub fn insert(&mut self, deadline: u64, item: T) -> Key {
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1);
        let index = self.entries.insert(Entry { item, generation });
        let index = u32::try_from(index).expect("more than u32::MAX timers in one wheel");
        self.cascade.insert(index, deadline);
        Key { index, generation }
    }

    /// Removes the entry, returning its item, or `None` if the key is stale. O(1).
    pub fn remove(&mut self, key: Key) -> Option<T> {
        self.get_entry(key)?;
        self.cascade.remove(key.index);
        Some(self.entries.remove(key.index as usize).item)
    }

    /// Moves the entry to `deadline` (earlier or later). Returns `false` if the key is stale.
    /// O(1).
    pub fn reschedule(&mut self, key: Key, deadline: u64) -> bool {
        self.get_entry(key).is_some() && self.cascade.reschedule(key.index, deadline)
    }

    /// The entry's item, or `None` if the key is stale.
    pub fn get(&self, key: Key) -> Option<&T> {
        self.get_entry(key).map(|entry| &entry.item)
    }

    /// The entry's item, mutably, or `None` if the key is stale.
    pub fn get_mut(&mut self, key: Key) -> Option<&mut T> {
        match self.entries.get_mut(key.index as usize) {
            Some(entry) if entry.generation == key.generation => Some(&mut entry.item),
            _ => None,
        }
    }

    /// The entry's deadline tick, or `None` if the key is stale.
    pub fn deadline(&self, key: Key) -> Option<u64> {
        self.get_entry(key)?;
        self.cascade.tick(key.index)
    }

    /// The tick at which the wheel next has work: an entry to fire, a slot to cascade, or the
    /// overflow list to re-enter. `None` when empty. O(levels), no scan of slots.
    ///
    /// Entries fire at their own deadline, so this is never later than the earliest deadline
    /// and never earlier than [`now`](Self::now).
    pub fn next_expiration(&self) -> Option<u64> {
        self.cascade.next_expiration()
    }

    /// Advances the wheel towards `now` and returns one entry whose deadline is at or before
    /// it, or `None` once none is left. Call it until `None` to fire everything due; stopping
    /// early (to bound a batch) loses nothing.
    ///
    /// The wheel's tick never moves backwards: a `now` behind [`now`](Self::now) only hands out
    /// entries that are already due.
    pub fn poll_expired(&mut self, now: u64) -> Option<Expired<T>> {
        let (index, deadline) = self.cascade.poll_expired(now)?;
        let entry = self.entries.remove(index as usize);
        Some(Expired {
            item: entry.item,
            deadline,
        })
    }

    /// Advances the wheel to `now`, calling `fire` for every entry due by then. Returns how
    /// many fired.
    pub fn advance(&mut self, now: u64, mut fire: impl FnMut(Expired<T>)) -> usize {
        let mut fired = 0;
        while let Some(expired) = self.poll_expired(now) {
            fire(expired);
            fired += 1;
        }
        fired
    }

    /// Gives the entry storage back to the allocator when the wheel is empty and its capacity
    /// exceeds `keep` entries: after a burst, memory returns to its baseline. O(1).
    pub fn shrink_if_empty(&mut self, keep: usize) {
        if self.entries.is_empty() && self.entries.capacity() > keep {
            self.entries = Slab::new();
            self.cascade.release(0..usize::MAX);
        }
    }

    /// Removes every entry, in no particular order, keeping the current tick.
    pub fn drain(&mut self) -> impl Iterator<Item = (u64, T)> + '_ {
        let drained: Vec<(u32, u64)> = self.cascade.drain().collect();
        let entries = &mut self.entries;
        drained
            .into_iter()
            .map(move |(index, tick)| (tick, entries.remove(index as usize).item))
    }

    fn get_entry(&self, key: Key) -> Option<&Entry<T>> {
        self.entries
            .get(key.index as usize)
            .filter(|entry| entry.generation == key.generation)
    }
}

#[cfg(test)]
mod tests;
