//! The key index of a keyed set: ids by key hash, in [`INDEX_SHARDS`] open-addressing tables.
//!
//! Why not a general hash table: at 10^6 keys every lookup of a by-key command missed the
//! cache twice in `hashbrown` (its control bytes and its buckets live apart) and that was most
//! of the actor's time. Here a slot is one `u64` — the upper half of the key's hash and the id
//! — so a lookup reads one cache line in the common case, the table can be prefetched a few
//! commands ahead ([`prefetch`](Index::prefetch)), and growing it never touches a key: a slot's
//! home is read from the hash bits it keeps.
//!
//! Linear probing, at most ¾ full; removal shifts the run after the hole back (no tombstones),
//! so a lookup stops at the first empty slot. The key itself is compared by the caller's `eq`,
//! only for slots whose 32 hash bits match.

/// Tables the index is split into (by the hash's low bits): each grows on its own, so no
/// single rehash has to move every id at once.
pub(super) const INDEX_SHARDS: usize = 64;

/// An empty slot. A full slot holds `hash >> 32` above `id + 1`, never zero.
const EMPTY: u64 = 0;

/// Ids by key hash; see the module docs.
pub(super) struct Index {
    shards: Box<[Table]>,
    /// Ids indexed, over all shards.
    pub(super) len: usize,
}

#[derive(Default)]
struct Table {
    /// A power of two long, or empty.
    slots: Box<[u64]>,
    len: usize,
}

/// Where a key was, or where it would go; from [`Index::find_or_place`].
pub(super) enum Found {
    /// The key's id.
    Id(u32),
    /// Not there: [`Index::insert_at`] files it here (valid until the index changes).
    Vacant(Place),
}

/// An empty slot a key would go to.
pub(super) struct Place {
    shard: usize,
    slot: usize,
    tag: u32,
}

impl Index {
    pub(super) fn new() -> Self {
        Index {
            shards: (0..INDEX_SHARDS).map(|_| Table::default()).collect(),
            len: 0,
        }
    }

    fn shard(hash: u64) -> usize {
        hash as usize % INDEX_SHARDS
    }

    /// The hash bits a slot keeps; its home slot is their low bits.
    fn tag(hash: u64) -> u32 {
        (hash >> 32) as u32
    }

    /// The id whose key `eq` accepts, among those filed under `hash`.
    pub(super) fn find(&self, hash: u64, mut eq: impl FnMut(u32) -> bool) -> Option<u32> {
        let table = &self.shards[Self::shard(hash)];
        let tag = Self::tag(hash);
        let mut probe = table.probe(tag)?;
        loop {
            let slot = table.slots[probe.slot];
            if slot == EMPTY {
                return None;
            }
            if (slot >> 32) as u32 == tag && eq(id_of(slot)) {
                return Some(id_of(slot));
            }
            probe.next();
        }
    }

    /// Finds the key as [`find`](Self::find) does, or the place it would be filed at, growing
    /// the table first if one more id would fill it past ¾.
    pub(super) fn find_or_place(&mut self, hash: u64, mut eq: impl FnMut(u32) -> bool) -> Found {
        let shard = Self::shard(hash);
        let table = &mut self.shards[shard];
        table.reserve_one();
        let tag = Self::tag(hash);
        let mut probe = table.probe(tag).expect("reserved");
        loop {
            let slot = table.slots[probe.slot];
            if slot == EMPTY {
                return Found::Vacant(Place {
                    shard,
                    slot: probe.slot,
                    tag,
                });
            }
            if (slot >> 32) as u32 == tag && eq(id_of(slot)) {
                return Found::Id(id_of(slot));
            }
            probe.next();
        }
    }

    /// Files `id` at `place`, as [`find_or_place`](Self::find_or_place) just answered.
    pub(super) fn insert_at(&mut self, place: Place, id: u32) {
        let table = &mut self.shards[place.shard];
        debug_assert_eq!(table.slots[place.slot], EMPTY);
        table.slots[place.slot] = slot_of(place.tag, id);
        table.len += 1;
        self.len += 1;
    }

    /// Takes `id` (filed under `hash`) out, if there.
    pub(super) fn remove(&mut self, hash: u64, id: u32) {
        let table = &mut self.shards[Self::shard(hash)];
        let wanted = slot_of(Self::tag(hash), id);
        let Some(mut probe) = table.probe(Self::tag(hash)) else {
            return;
        };
        loop {
            let slot = table.slots[probe.slot];
            if slot == EMPTY {
                return;
            }
            if slot == wanted {
                table.remove_at(probe.slot);
                self.len -= 1;
                return;
            }
            probe.next();
        }
    }

    /// Asks the CPU to bring in the cache line where a lookup of `hash` starts: the actor
    /// calls it a few commands ahead, so that lookups overlap their misses.
    pub(super) fn prefetch(&self, hash: u64) {
        let table = &self.shards[Self::shard(hash)];
        if let Some(probe) = table.probe(Self::tag(hash)) {
            prefetch_read(&table.slots[probe.slot]);
        }
    }

    /// Whether any table holds memory.
    pub(super) fn holds_memory(&self) -> bool {
        self.shards.iter().any(|table| !table.slots.is_empty())
    }

    /// Gives every table back, once nothing is indexed.
    pub(super) fn release_if_empty(&mut self) {
        if self.len == 0 && self.holds_memory() {
            *self = Index::new();
        }
    }

    /// Shrinks every table to what its ids need (no key is read: each slot keeps its hash bits).
    pub(super) fn shrink(&mut self) {
        for table in self.shards.iter_mut() {
            let fit = Table::capacity_for(table.len);
            if table.slots.len() > 2 * fit {
                table.resize(fit);
            }
        }
    }
}

impl Table {
    /// Where the probe for `tag` starts; `None` while the table has no slots.
    fn probe(&self, tag: u32) -> Option<Probe> {
        let mask = self.slots.len().checked_sub(1)?;
        Some(Probe {
            slot: tag as usize & mask,
            mask,
        })
    }

    /// The smallest power-of-two length that holds `len` ids at most ¾ full (0 for none).
    fn capacity_for(len: usize) -> usize {
        if len == 0 {
            0
        } else {
            (len * 4 / 3 + 1).next_power_of_two().max(8)
        }
    }

    fn reserve_one(&mut self) {
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.resize((self.slots.len() * 2).max(8));
        }
    }

    /// Refiles every id into a table `capacity` slots long.
    fn resize(&mut self, capacity: usize) {
        let old = std::mem::replace(&mut self.slots, vec![EMPTY; capacity].into_boxed_slice());
        if capacity == 0 {
            debug_assert_eq!(self.len, 0);
            return;
        }
        for slot in old.iter().copied().filter(|&slot| slot != EMPTY) {
            let mut probe = self.probe((slot >> 32) as u32).expect("not empty");
            while self.slots[probe.slot] != EMPTY {
                probe.next();
            }
            self.slots[probe.slot] = slot;
        }
    }

    /// Empties slot `hole` and shifts back each later slot of its run that may sit there (its
    /// home at or before the hole), so that every lookup still finds its id before an empty
    /// slot.
    fn remove_at(&mut self, mut hole: usize) {
        let mask = self.slots.len() - 1;
        let mut next = (hole + 1) & mask;
        loop {
            let slot = self.slots[next];
            if slot == EMPTY {
                break;
            }
            let home = (slot >> 32) as usize & mask;
            // Cyclic distances: the slot may move back to the hole if the hole is no further
            // from `next` than its home is.
            if next.wrapping_sub(home) & mask >= next.wrapping_sub(hole) & mask {
                self.slots[hole] = slot;
                hole = next;
            }
            next = (next + 1) & mask;
        }
        self.slots[hole] = EMPTY;
        self.len -= 1;
    }
}

/// A linear probe's position.
struct Probe {
    slot: usize,
    mask: usize,
}

impl Probe {
    fn next(&mut self) {
        self.slot = (self.slot + 1) & self.mask;
    }
}

fn slot_of(tag: u32, id: u32) -> u64 {
    debug_assert!(id < u32::MAX, "ids stay below u32::MAX");
    (u64::from(tag) << 32) | u64::from(id + 1)
}

fn id_of(slot: u64) -> u32 {
    (slot as u32) - 1
}

#[cfg(target_arch = "x86_64")]
fn prefetch_read(at: &u64) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    // SAFETY: `_mm_prefetch` needs SSE, which every x86_64 CPU has (it is in the target's
    // baseline); it is a hint that reads nothing and cannot fault, on any address.
    unsafe { _mm_prefetch::<_MM_HINT_T0>((at as *const u64).cast::<i8>()) };
}

#[cfg(not(target_arch = "x86_64"))]
fn prefetch_read(_at: &u64) {}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    /// Hashes with few distinct bits, so that runs, wrap-around and shared tags are common.
    fn crowded_hash(key: u64) -> u64 {
        let spread = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (spread & 0x0000_0007_0000_0003) | ((key % 5) << 40)
    }

    #[derive(Debug, Clone)]
    enum Op {
        Set(u64),
        Remove(u64),
        Shrink,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..200u64).prop_map(Op::Set),
            4 => (0..200u64).prop_map(Op::Remove),
            1 => Just(Op::Shrink),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// Sets, removals and shrinks against a `HashMap`, with hashes crowded into few homes:
        /// every key set is found with its id, every key removed is not.
        #[test]
        fn the_index_matches_a_map(ops in prop::collection::vec(op(), 0..400)) {
            let mut index = Index::new();
            let mut keys: Vec<Option<u64>> = Vec::new(); // id → key
            let mut model: HashMap<u64, u32> = HashMap::new();
            for op in ops {
                match op {
                    Op::Set(key) => {
                        let hash = crowded_hash(key);
                        match index.find_or_place(hash, |id| keys[id as usize] == Some(key)) {
                            Found::Id(id) => prop_assert_eq!(model.get(&key), Some(&id)),
                            Found::Vacant(place) => {
                                prop_assert!(!model.contains_key(&key));
                                let id = keys.len() as u32;
                                keys.push(Some(key));
                                index.insert_at(place, id);
                                model.insert(key, id);
                            }
                        }
                    }
                    Op::Remove(key) => {
                        if let Some(id) = model.remove(&key) {
                            index.remove(crowded_hash(key), id);
                            keys[id as usize] = None;
                        }
                    }
                    Op::Shrink => index.shrink(),
                }
                prop_assert_eq!(index.len, model.len());
                for key in 0..200u64 {
                    let found = index.find(crowded_hash(key), |id| keys[id as usize] == Some(key));
                    prop_assert_eq!(found, model.get(&key).copied(), "key {}", key);
                }
            }
            for (key, id) in model.drain() {
                index.remove(crowded_hash(key), id);
            }
            prop_assert_eq!(index.len, 0);
            index.release_if_empty();
            prop_assert!(!index.holds_memory());
        }
    }

    #[test]
    fn a_full_run_wrapping_the_end_survives_removal_from_its_middle() {
        let mut index = Index::new();
        // Eight slots; homes 6, 6, 7, 6 make the run 6, 7, 0, 1.
        let hashes = [6u64 << 32, 6 << 32 | 64, 7 << 32, 6 << 32 | 128];
        for (id, &hash) in hashes.iter().enumerate() {
            let Found::Vacant(place) = index.find_or_place(hash, |_| false) else {
                panic!("nothing is filed yet");
            };
            index.insert_at(place, id as u32);
        }
        index.remove(hashes[1], 1);
        for (id, &hash) in hashes.iter().enumerate() {
            let found = index.find(hash, |other| other == id as u32);
            assert_eq!(found, (id != 1).then_some(id as u32), "id {id}");
        }
    }
}
