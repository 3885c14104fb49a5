//! The keyed machine's tables: entries by id in fixed-size chunks, and the handles' shared
//! deadline words by id (the key index is `index.rs`).

use std::num::NonZeroU64;
use std::sync::Arc;

use crate::timer::keyed::DeadlineWord;

/// Entries per chunk of the entry table.
pub(super) const CHUNK: usize = 1024;

pub(super) struct Entry<K, V> {
    pub(super) key: K,
    pub(super) value: V,
    pub(super) due: Due,
}

/// An entry's deadline as the table keeps it: its own signed offset from the wheel's origin,
/// or [`SHARED`](Due::SHARED) — its handle's shared word holds it. Never zero, so an `Option<Entry>`
/// slot needs no tag: for `u64` keys and values a slot is 24 bytes, not 32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Due(pub(super) NonZeroU64);

impl Due {
    /// The deadline is in the entry's shared word.
    pub(super) const SHARED: Due = Due(NonZeroU64::MIN);

    /// An entry's own deadline. Offsets flip their sign bit, so `i64::MIN` would be zero and
    /// `i64::MIN + 1` is [`SHARED`](Due::SHARED): deadlines that far (292 years) before the
    /// origin are due at once anyway, and saturate.
    pub(super) fn own(deadline: i64) -> Due {
        let flipped = (deadline.max(i64::MIN + 2) as u64) ^ (1 << 63);
        Due(NonZeroU64::new(flipped).expect("never zero"))
    }

    /// The entry's own deadline, unless its shared word holds it.
    pub(super) fn deadline(self) -> Option<i64> {
        (self != Due::SHARED).then(|| (self.0.get() ^ (1 << 63)) as i64)
    }
}

/// When a signed deadline is due: deadlines before the origin are due at once.
pub(super) fn due_at(deadline: i64) -> u64 {
    deadline.max(0) as u64
}

/// [`CHUNK`] entries; `None` for free ids.
pub(super) type Chunk<K, V> = Box<[Option<Entry<K, V>>]>;

/// Entries by id, in fixed-size chunks. A chunk with no live entry can be given back while
/// others stay ([`release_unused`](Entries::release_unused)): a few long-lived entries keep
/// only their own chunks after a flood. Ids are handed out lowest chunk first, so the chunks
/// of a busy set's high ids empty out.
pub(super) struct Entries<K, V> {
    /// `None` for chunks given back (or never allocated).
    pub(super) chunks: Vec<Option<Chunk<K, V>>>,
    /// Free ids of allocated chunks, the lowest chunk's last (handed out first).
    pub(super) free: Vec<u32>,
    pub(super) len: usize,
    /// Chunks allocated.
    allocated: usize,
}

impl<K, V> Entries<K, V> {
    pub(super) fn new() -> Self {
        Entries {
            chunks: Vec::new(),
            free: Vec::new(),
            len: 0,
            allocated: 0,
        }
    }

    fn chunk(&self, id: u32) -> &Chunk<K, V> {
        self.chunks[id as usize / CHUNK]
            .as_ref()
            .expect("a live entry's chunk")
    }

    pub(super) fn slot(&self, id: u32) -> &Option<Entry<K, V>> {
        &self.chunk(id)[id as usize % CHUNK]
    }

    pub(super) fn slot_mut(&mut self, id: u32) -> &mut Option<Entry<K, V>> {
        &mut self.chunks[id as usize / CHUNK]
            .as_mut()
            .expect("a live entry's chunk")[id as usize % CHUNK]
    }

    pub(super) fn get(&self, id: u32) -> &Entry<K, V> {
        self.slot(id).as_ref().expect("a live entry")
    }

    pub(super) fn get_mut(&mut self, id: u32) -> &mut Entry<K, V> {
        self.slot_mut(id).as_mut().expect("a live entry")
    }

    pub(super) fn insert(&mut self, entry: Entry<K, V>) -> u32 {
        let id = match self.free.pop() {
            Some(id) => id,
            None => self.grow(),
        };
        *self.slot_mut(id) = Some(entry);
        self.len += 1;
        id
    }

    /// Allocates the lowest chunk missing, keeps its ids but the first as free, and returns
    /// that first.
    fn grow(&mut self) -> u32 {
        let chunk = match self.chunks.iter().position(Option::is_none) {
            Some(chunk) => chunk,
            None => {
                self.chunks.push(None);
                self.chunks.len() - 1
            }
        };
        self.chunks[chunk] = Some((0..CHUNK).map(|_| None).collect());
        self.allocated += 1;
        let first = (chunk * CHUNK) as u32;
        self.free.extend((first + 1..first + CHUNK as u32).rev());
        first
    }

    pub(super) fn remove(&mut self, id: u32) -> Entry<K, V> {
        let entry = self.slot_mut(id).take().expect("a live entry");
        self.free.push(id);
        self.len -= 1;
        entry
    }

    /// Entries the allocated chunks hold.
    pub(super) fn capacity(&self) -> usize {
        self.allocated * CHUNK
    }

    /// Gives every chunk back, once empty.
    pub(super) fn release_if_empty(&mut self) {
        if self.len == 0 && !self.chunks.is_empty() {
            *self = Entries::new();
        }
    }

    /// Gives back every chunk with no live entry, and orders the free ids lowest chunk
    /// first. Linear in the chunks' slots.
    pub(super) fn release_unused(&mut self) {
        for chunk in &mut self.chunks {
            if chunk
                .as_ref()
                .is_some_and(|entries| entries.iter().all(Option::is_none))
            {
                *chunk = None;
                self.allocated -= 1;
            }
        }
        while self.chunks.last().is_some_and(Option::is_none) {
            self.chunks.pop();
        }
        self.chunks.shrink_to_fit();
        let chunks = &self.chunks;
        self.free
            .retain(|&id| chunks.get(id as usize / CHUNK).is_some_and(Option::is_some));
        self.free.sort_unstable_by(|a, b| b.cmp(a));
        self.free.shrink_to_fit();
    }
}

/// The shared words of entries made with a handle, by id, in [`CHUNK`]-sized chunks allocated
/// only for id ranges that hold such an entry: a set without handles pays nothing, one with a
/// handle on every entry 8 bytes per entry, and a handle's command finds its word with no hash
/// lookup (a hash table of 10^5 words outgrew the cache and cost a miss per command).
pub(super) struct Words {
    /// `None` for id ranges without a handle's entry.
    pub(super) chunks: Vec<Option<WordChunk>>,
    pub(super) len: usize,
}

/// [`CHUNK`] words; `None` for ids without a handle's entry.
pub(super) type WordChunk = Box<[Option<Arc<DeadlineWord>>]>;

impl Words {
    pub(super) fn new() -> Self {
        Words {
            chunks: Vec::new(),
            len: 0,
        }
    }

    pub(super) fn get(&self, id: u32) -> Option<&Arc<DeadlineWord>> {
        let chunk = self.chunks.get(id as usize / CHUNK)?.as_ref()?;
        chunk[id as usize % CHUNK].as_ref()
    }

    /// The word of entry `id`, which is marked [`Due::SHARED`].
    pub(super) fn of(&self, id: u32) -> &Arc<DeadlineWord> {
        self.get(id).expect("a shared entry has a word")
    }

    pub(super) fn insert(&mut self, id: u32, word: Arc<DeadlineWord>) {
        let (chunk, slot) = (id as usize / CHUNK, id as usize % CHUNK);
        if self.chunks.len() <= chunk {
            self.chunks.resize_with(chunk + 1, || None);
        }
        let chunk = self.chunks[chunk].get_or_insert_with(|| (0..CHUNK).map(|_| None).collect());
        if chunk[slot].replace(word).is_none() {
            self.len += 1;
        }
    }

    pub(super) fn remove(&mut self, id: u32) -> Option<Arc<DeadlineWord>> {
        let chunk = self.chunks.get_mut(id as usize / CHUNK)?.as_mut()?;
        let word = chunk[id as usize % CHUNK].take()?;
        self.len -= 1;
        Some(word)
    }

    /// Takes every word out, with its id; the chunks are given back.
    pub(super) fn drain(&mut self) -> impl Iterator<Item = (u32, Arc<DeadlineWord>)> {
        self.len = 0;
        std::mem::take(&mut self.chunks)
            .into_iter()
            .enumerate()
            .filter_map(|(chunk, words)| Some((chunk, words?)))
            .flat_map(|(chunk, words)| {
                words
                    .into_vec()
                    .into_iter()
                    .enumerate()
                    .filter_map(move |(slot, word)| Some(((chunk * CHUNK + slot) as u32, word?)))
            })
    }

    pub(super) fn holds_memory(&self) -> bool {
        !self.chunks.is_empty()
    }

    pub(super) fn release_if_empty(&mut self) {
        if self.len == 0 {
            *self = Words::new();
        }
    }

    /// Gives back every chunk with no word.
    pub(super) fn release_unused(&mut self) {
        for chunk in &mut self.chunks {
            if chunk
                .as_ref()
                .is_some_and(|words| words.iter().all(Option::is_none))
            {
                *chunk = None;
            }
        }
        while self.chunks.last().is_some_and(Option::is_none) {
            self.chunks.pop();
        }
        self.chunks.shrink_to_fit();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn entry(key: u64) -> Entry<u64, ()> {
        Entry {
            key,
            value: (),
            due: Due::own(key as i64),
        }
    }

    #[test]
    fn a_live_entry_keeps_only_its_own_chunk_and_ids_refill_lowest_first() {
        let mut entries = Entries::new();
        let ids: Vec<u32> = (0..4 * CHUNK as u64)
            .map(|k| entries.insert(entry(k)))
            .collect();
        assert_eq!(entries.capacity(), 4 * CHUNK);
        let kept = ids[2 * CHUNK + 5];
        for &id in ids.iter().filter(|&&id| id != kept) {
            entries.remove(id);
        }
        entries.release_unused();
        assert_eq!(entries.capacity(), CHUNK, "the kept entry's chunk only");
        assert_eq!(entries.get(kept).key, kept as u64);
        // The free ids left are the kept chunk's; then a hole below it is allocated first.
        let refill: Vec<u32> = (0..CHUNK as u64)
            .map(|k| entries.insert(entry(k)))
            .collect();
        assert!(
            refill[..CHUNK - 1]
                .iter()
                .all(|&id| id as usize / CHUNK == 2)
        );
        assert_eq!(refill[CHUNK - 1], 0, "the lowest chunk missing");
        assert_eq!(entries.capacity(), 2 * CHUNK);
    }
}
