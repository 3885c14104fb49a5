//! The cascade's table of positions by id, in fixed-size chunks allocated on demand.
//!
//! A flat `Vec` indexed by id grows with the highest id ever filed and can shrink only from the
//! top: after a flood, one id still filed high up (an hour-long sleep made in the middle of a
//! million short ones) would keep the nodes of every id below it (20 MB at 10^6). In chunks,
//! the owner gives back the chunks of id ranges it knows are unfiled
//! ([`release`](Nodes::release)), and a filed id holds only its own chunk.
//!
//! The cost is one more dependent load per access (the chunk's address, from a small array that
//! stays in cache) and a branch on filing into a chunk not yet allocated; chunk boundaries are
//! powers of two, so finding a node is a shift and a mask.

use std::ops::{Index, IndexMut, Range};

/// No id: the end of a list.
pub(crate) const NIL: u32 = u32::MAX;
/// The list of a node on none.
pub(super) const UNFILED: u32 = 0;

/// One id's position: 20 bytes (the tick is split so the node needs only 4-byte alignment).
/// The cascade links nodes into its lists; `list` says which (see `cascade`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Node {
    tick_low: u32,
    tick_high: u32,
    pub(super) prev: u32,
    pub(super) next: u32,
    pub(super) list: u32,
}

impl Node {
    pub(crate) const UNFILED: Node = Node {
        tick_low: 0,
        tick_high: 0,
        prev: NIL,
        next: NIL,
        list: UNFILED,
    };

    pub(crate) fn is_filed(&self) -> bool {
        self.list != UNFILED
    }

    pub(super) fn tick(&self) -> u64 {
        (u64::from(self.tick_high) << 32) | u64::from(self.tick_low)
    }

    pub(super) fn set_tick(&mut self, tick: u64) {
        self.tick_low = tick as u32;
        self.tick_high = (tick >> 32) as u32;
    }
}

/// Ids per chunk: 20 KiB of nodes. Timer-pool segments start and end on multiples of it, so a
/// pool segment given back frees whole chunks.
pub(crate) const CHUNK: usize = 1 << CHUNK_BITS;
const CHUNK_BITS: u32 = 10;

type Chunk = Box<[Node; CHUNK]>;

#[derive(Debug, Default)]
pub(crate) struct Nodes {
    /// `None` for id ranges with nothing filed since they were last released.
    chunks: Vec<Option<Chunk>>,
    /// Chunks allocated.
    allocated: usize,
}

fn split(id: u32) -> (usize, usize) {
    ((id >> CHUNK_BITS) as usize, id as usize & (CHUNK - 1))
}

impl Nodes {
    /// The node of `id`, if its chunk is allocated.
    pub(crate) fn get(&self, id: u32) -> Option<&Node> {
        let (chunk, offset) = split(id);
        Some(&self.chunks.get(chunk)?.as_ref()?[offset])
    }

    /// The node of `id`, allocating its chunk (all unfiled) if needed.
    pub(crate) fn ensure(&mut self, id: u32) -> &mut Node {
        let (chunk, offset) = split(id);
        if chunk >= self.chunks.len() {
            self.chunks.resize_with(chunk + 1, || None);
        }
        let slot = &mut self.chunks[chunk];
        if slot.is_none() {
            self.allocated += 1;
        }
        &mut slot.get_or_insert_with(|| Box::new([Node::UNFILED; CHUNK]))[offset]
    }

    /// Room in the chunk table for ids below `ids` (the chunks themselves come on demand).
    pub(crate) fn reserve(&mut self, ids: usize) {
        let chunks = ids.div_ceil(CHUNK);
        if chunks > self.chunks.capacity() {
            self.chunks.reserve_exact(chunks - self.chunks.len());
        }
    }

    /// Gives back the chunks lying wholly within `ids`, whose ids must all be unfiled.
    pub(crate) fn release(&mut self, ids: Range<usize>) {
        let first = ids.start.div_ceil(CHUNK);
        let end = (ids.end / CHUNK).min(self.chunks.len());
        for chunk in first..end.max(first) {
            if let Some(nodes) = self.chunks[chunk].take() {
                debug_assert!(nodes.iter().all(|node| !node.is_filed()));
                self.allocated -= 1;
            }
        }
        self.trim();
    }

    /// Gives back every chunk with nothing filed in it. Linear in the chunks allocated: for an
    /// owner that cannot tell which ranges are unfiled, now and then.
    pub(crate) fn release_unfiled(&mut self) {
        for slot in &mut self.chunks {
            if slot
                .as_ref()
                .is_some_and(|nodes| nodes.iter().all(|node| !node.is_filed()))
            {
                *slot = None;
                self.allocated -= 1;
            }
        }
        self.trim();
    }

    fn trim(&mut self) {
        while self.chunks.last().is_some_and(Option::is_none) {
            self.chunks.pop();
        }
        if self.chunks.capacity() > 2 * self.chunks.len() + 16 {
            self.chunks.shrink_to_fit();
        }
    }

    /// Every allocated node with its id.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut Node)> {
        self.chunks
            .iter_mut()
            .enumerate()
            .filter_map(|(chunk, nodes)| Some((chunk, nodes.as_mut()?)))
            .flat_map(|(chunk, nodes)| {
                nodes
                    .iter_mut()
                    .enumerate()
                    .map(move |(offset, node)| ((chunk * CHUNK + offset) as u32, node))
            })
    }

    /// Ids the allocated chunks hold.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.allocated * CHUNK
    }
}

impl Index<u32> for Nodes {
    type Output = Node;

    fn index(&self, id: u32) -> &Node {
        self.get(id).expect("a filed id has a node")
    }
}

impl IndexMut<u32> for Nodes {
    fn index_mut(&mut self, id: u32) -> &mut Node {
        let (chunk, offset) = split(id);
        &mut self.chunks[chunk].as_mut().expect("a filed id has a node")[offset]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_come_on_demand_and_go_where_nothing_is_filed() {
        let mut nodes = Nodes::default();
        assert!(nodes.get(5_000).is_none());
        nodes.ensure(5_000).list = 7;
        assert_eq!(nodes.capacity(), CHUNK, "one chunk, not 5 000 nodes");
        nodes.ensure(10);
        nodes.ensure(3_000);
        assert_eq!(nodes.capacity(), 3 * CHUNK);
        nodes.release_unfiled();
        assert_eq!(nodes.capacity(), CHUNK, "the filed one's chunk stays");
        assert_eq!(nodes[5_000].list, 7);
        nodes[5_000].list = 0;
        nodes.release(0..usize::MAX);
        assert_eq!(nodes.capacity(), 0);
        assert!(nodes.get(5_000).is_none());
    }
}
