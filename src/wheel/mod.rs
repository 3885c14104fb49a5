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
//! Entries live in a [`slab::Slab`]; every slot is an intrusive doubly-linked list threaded
//! through slab indices, so insert, remove and reschedule are O(1) (plus one division pair per
//! level climbed) and allocate only when the slab grows. Keys carry a generation, so a key
//! whose entry has gone never reaches a newer entry that reuses its index.

mod bitmap;
mod layout;

use slab::Slab;

use self::bitmap::Bitmap;
use crate::error::BuildError;
pub use layout::{Layout, MAX_LEVELS, MAX_SLOTS_PER_LEVEL};

const NIL: u32 = u32::MAX;

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

/// Which list an entry is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum List {
    Slot { level: u8, slot: u16 },
    Ready,
    Overflow,
}

#[derive(Debug, Clone, Copy)]
struct Links {
    head: u32,
    tail: u32,
}

impl Links {
    const EMPTY: Links = Links {
        head: NIL,
        tail: NIL,
    };
}

#[derive(Debug)]
struct Entry<T> {
    item: T,
    deadline: u64,
    generation: u32,
    prev: u32,
    next: u32,
    list: List,
}

#[derive(Debug)]
struct Level {
    /// Ticks one slot spans.
    unit: u64,
    /// Ticks the whole level spans (`unit * slots.len()`).
    span: u64,
    /// Where the level's current block starts: `now - now % span`, kept up to date by
    /// `set_now` so filing an entry needs comparisons, not divisions.
    block_start: u64,
    slots: Box<[Links]>,
    occupied: Bitmap,
}

/// A hierarchical timer wheel holding items of type `T` at `u64` deadline ticks.
///
/// See the [module documentation](self) for how it works.
#[derive(Debug)]
pub struct TimerWheel<T> {
    entries: Slab<Entry<T>>,
    levels: Box<[Level]>,
    /// Bit `i` is set while level `i` has an entry.
    occupied_levels: u32,
    ready: Links,
    overflow: Links,
    /// A lower bound of the overflow deadlines (exact after each re-entry), so re-entry jumps
    /// straight to the block of the earliest one instead of visiting every top-level wrap.
    overflow_min: u64,
    /// The tick the wheel has been advanced to.
    now: u64,
    next_generation: u32,
    cascades: u64,
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
        let mut unit = 1u64;
        let levels = slots_per_level
            .iter()
            .map(|&slots| {
                // Cannot overflow: validation checked the product of all levels.
                let span = unit * u64::from(slots);
                let level = Level {
                    unit,
                    span,
                    block_start: 0,
                    slots: vec![Links::EMPTY; slots as usize].into_boxed_slice(),
                    occupied: Bitmap::new(slots as usize),
                };
                unit = span;
                level
            })
            .collect();
        Ok(TimerWheel {
            entries: Slab::with_capacity(capacity),
            levels,
            occupied_levels: 0,
            ready: Links::EMPTY,
            overflow: Links::EMPTY,
            overflow_min: u64::MAX,
            now: 0,
            next_generation: 0,
            cascades: 0,
        })
    }

    /// The tick the wheel has been advanced to.
    pub fn now(&self) -> u64 {
        self.now
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
        self.cascades
    }

    /// Ticks covered by the levels; deadlines further than this from [`now`](Self::now) wait
    /// in the overflow list.
    pub fn span(&self) -> u64 {
        self.levels.last().map_or(1, |level| level.span)
    }

    /// Inserts `item` due at `deadline`; a deadline at or before [`now`](Self::now) is due at
    /// once. O(1).
    pub fn insert(&mut self, deadline: u64, item: T) -> Key {
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1);
        let index = self.entries.insert(Entry {
            item,
            deadline,
            generation,
            prev: NIL,
            next: NIL,
            list: List::Ready,
        });
        let index = u32::try_from(index).expect("more than u32::MAX timers in one wheel");
        self.link(index);
        Key { index, generation }
    }

    /// Removes the entry, returning its item, or `None` if the key is stale. O(1).
    pub fn remove(&mut self, key: Key) -> Option<T> {
        self.get_entry(key)?;
        self.unlink(key.index);
        Some(self.entries.remove(key.index as usize).item)
    }

    /// Moves the entry to `deadline` (earlier or later). Returns `false` if the key is stale.
    /// O(1).
    pub fn reschedule(&mut self, key: Key, deadline: u64) -> bool {
        if self.get_entry(key).is_none() {
            return false;
        }
        self.unlink(key.index);
        self.entries[key.index as usize].deadline = deadline;
        self.link(key.index);
        true
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
        self.get_entry(key).map(|entry| entry.deadline)
    }

    /// The tick at which the wheel next has work: an entry to fire, a slot to cascade, or the
    /// overflow list to re-enter. `None` when empty. O(levels), no scan of slots.
    ///
    /// Entries fire at their own deadline, so this is never later than the earliest deadline
    /// and never earlier than [`now`](Self::now).
    pub fn next_expiration(&self) -> Option<u64> {
        if self.ready.head != NIL {
            return Some(self.now);
        }
        self.next_boundary().map(|(tick, _)| tick)
    }

    /// Advances the wheel towards `now` and returns one entry whose deadline is at or before
    /// it, or `None` once none is left. Call it until `None` to fire everything due; stopping
    /// early (to bound a batch) loses nothing.
    ///
    /// The wheel's tick never moves backwards: a `now` behind [`now`](Self::now) only hands out
    /// entries that are already due.
    pub fn poll_expired(&mut self, now: u64) -> Option<Expired<T>> {
        loop {
            if self.ready.head != NIL {
                let index = self.ready.head;
                self.unlink(index);
                let entry = self.entries.remove(index as usize);
                debug_assert!(entry.deadline <= self.now, "an entry fired early");
                return Some(Expired {
                    item: entry.item,
                    deadline: entry.deadline,
                });
            }
            match self.next_boundary() {
                Some((tick, boundary)) if tick <= now => {
                    self.set_now(tick);
                    self.cascade(boundary);
                }
                _ => {
                    self.set_now(self.now.max(now));
                    return None;
                }
            }
        }
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
        }
    }

    /// Removes every entry, in no particular order, keeping the current tick.
    pub fn drain(&mut self) -> impl Iterator<Item = (u64, T)> + '_ {
        for level in self.levels.iter_mut() {
            level.slots.fill(Links::EMPTY);
            level.occupied = Bitmap::new(level.slots.len());
        }
        self.occupied_levels = 0;
        self.ready = Links::EMPTY;
        self.overflow = Links::EMPTY;
        self.overflow_min = u64::MAX;
        self.entries
            .drain()
            .map(|entry| (entry.deadline, entry.item))
    }

    /// The next tick with work on the levels or in overflow, and which list it empties.
    fn next_boundary(&self) -> Option<(u64, List)> {
        if self.occupied_levels != 0 {
            let level = self.occupied_levels.trailing_zeros() as usize;
            let Level {
                unit,
                span,
                block_start,
                occupied,
                ..
            } = &self.levels[level];
            let slot = occupied.first_set().expect("occupied level has a set bit");
            debug_assert_eq!(*block_start, self.now - self.now % span);
            let list = List::Slot {
                level: level as u8,
                slot: slot as u16,
            };
            return Some((block_start + slot as u64 * unit, list));
        }
        if self.overflow.head != NIL {
            let span = self.span();
            // Overflow entries lie in later top-level blocks, and the tick never passes the
            // block of `overflow_min` without re-entering the overflow list: this is ahead.
            let block_start = self.overflow_min - self.overflow_min % span;
            debug_assert!(block_start > self.now);
            return Some((block_start, List::Overflow));
        }
        None
    }

    /// Re-files every entry of `list` relative to the current tick: each moves at least one
    /// level down, or to the ready list.
    fn cascade(&mut self, list: List) {
        let links = std::mem::replace(self.links_mut(list), Links::EMPTY);
        match list {
            List::Slot { level, slot } => self.mark_empty(level as usize, slot as usize),
            List::Overflow => self.overflow_min = u64::MAX,
            List::Ready => {}
        }
        let mut index = links.head;
        while index != NIL {
            let next = self.entries[index as usize].next;
            if !matches!(list, List::Slot { level: 0, .. }) {
                self.cascades += 1;
            }
            self.link(index);
            index = next;
        }
    }

    fn get_entry(&self, key: Key) -> Option<&Entry<T>> {
        self.entries
            .get(key.index as usize)
            .filter(|entry| entry.generation == key.generation)
    }

    /// Moves the current tick, keeping every level's block start in step.
    fn set_now(&mut self, now: u64) {
        if now == self.now {
            return;
        }
        self.now = now;
        for level in self.levels.iter_mut() {
            level.block_start = now - now % level.span;
        }
    }

    /// The list a deadline belongs on, given the current tick: the lowest level whose
    /// current block holds it (one comparison per level climbed, one division at most).
    fn list_for(&self, deadline: u64) -> List {
        if deadline <= self.now {
            return List::Ready;
        }
        for (level, l) in self.levels.iter().enumerate() {
            // `deadline > now >= block_start`, so this cannot underflow.
            let offset = deadline - l.block_start;
            if offset < l.span {
                let slot = if l.unit == 1 { offset } else { offset / l.unit };
                return List::Slot {
                    level: level as u8,
                    slot: slot as u16,
                };
            }
        }
        List::Overflow
    }

    fn links_mut(&mut self, list: List) -> &mut Links {
        match list {
            List::Slot { level, slot } => &mut self.levels[level as usize].slots[slot as usize],
            List::Ready => &mut self.ready,
            List::Overflow => &mut self.overflow,
        }
    }

    /// Appends entry `index` to the tail of the list its deadline belongs on.
    fn link(&mut self, index: u32) {
        let list = self.list_for(self.entries[index as usize].deadline);
        let links = self.links_mut(list);
        let prev = links.tail;
        links.tail = index;
        if prev == NIL {
            links.head = index;
        }
        if prev != NIL {
            self.entries[prev as usize].next = index;
        }
        let entry = &mut self.entries[index as usize];
        entry.prev = prev;
        entry.next = NIL;
        entry.list = list;
        let deadline = entry.deadline;
        match list {
            List::Slot { level, slot } => {
                if prev == NIL {
                    self.levels[level as usize].occupied.set(slot as usize);
                    self.occupied_levels |= 1 << level;
                }
            }
            List::Overflow if prev == NIL => self.overflow_min = deadline,
            List::Overflow => self.overflow_min = self.overflow_min.min(deadline),
            List::Ready => {}
        }
    }

    /// Takes entry `index` off its list.
    fn unlink(&mut self, index: u32) {
        let Entry {
            prev, next, list, ..
        } = self.entries[index as usize];
        if prev != NIL {
            self.entries[prev as usize].next = next;
        }
        if next != NIL {
            self.entries[next as usize].prev = prev;
        }
        let links = self.links_mut(list);
        if links.head == index {
            links.head = next;
        }
        if links.tail == index {
            links.tail = prev;
        }
        if links.head == NIL {
            if let List::Slot { level, slot } = list {
                self.mark_empty(level as usize, slot as usize);
            }
        }
    }

    fn mark_empty(&mut self, level: usize, slot: usize) {
        let occupied = &mut self.levels[level].occupied;
        occupied.clear(slot);
        if occupied.is_empty() {
            self.occupied_levels &= !(1 << level);
        }
    }
}

#[cfg(test)]
mod tests;
