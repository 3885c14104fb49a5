//! The cascade itself: where each id sits, over caller-chosen dense `u32` ids.
//!
//! [`Cascade`] stores no items, only positions: one 20-byte [`Node`] per id, indexed by the id.
//! Its owner keeps whatever an id stands for in its own tables (the actor keeps a timer's shared
//! state in a pool indexed by the same id; [`TimerWheel`](super::TimerWheel) keeps items in a
//! slab). That keeps the hot structure small and lets the owner pick ids that are already
//! meaningful to it, so no second index maps ids to positions.

use std::collections::BTreeMap;
use std::ops::Range;

use super::bitmap::Bitmap;
pub(crate) use super::nodes::NIL;
use super::nodes::{Node, Nodes, UNFILED};

/// Which list a node is on, packed in a `u32` (`UNFILED`, 0, is in `nodes`).
const READY: u32 = 1;
const OVERFLOW: u32 = 2;
const PARKED: u32 = 3;
/// Slot lists: `SLOTS + level * SLOT_STRIDE + slot`.
const SLOTS: u32 = 4;
const SLOT_STRIDE: u32 = 1 << 12;

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
struct Level {
    /// Ticks one slot spans.
    unit: u64,
    /// Ticks the whole level spans (`unit * slots.len()`).
    span: u64,
    /// Where the level's current block starts: `now - now % span`, kept up to date by
    /// `set_now` so filing an id needs comparisons, not divisions.
    block_start: u64,
    slots: Box<[Links]>,
    occupied: Bitmap,
}

/// The hierarchical wheel over ids. See the [module documentation](super) for the algorithm.
#[derive(Debug)]
pub(crate) struct Cascade {
    nodes: Nodes,
    levels: Box<[Level]>,
    /// Bit `i` is set while level `i` has a node.
    occupied_levels: u32,
    ready: Links,
    /// Ticks beyond the top level, one list per top-level block (`tick / span`), so each
    /// re-enters the levels once, when its block begins: however small the layout and however
    /// far the deadlines, an id moves out of overflow once.
    overflow: BTreeMap<u64, Links>,
    /// Nodes the owner took out as due but set aside (see [`park`](Self::park)).
    parked: Links,
    /// The tick the cascade has been advanced to.
    now: u64,
    /// Nodes filed (on any list).
    len: usize,
    cascades: u64,
}

impl Cascade {
    /// An empty cascade at tick 0. `slots_per_level` must be valid (see
    /// [`Layout::custom`](super::Layout::custom)).
    pub(crate) fn new(slots_per_level: &[u32]) -> Cascade {
        let mut unit = 1u64;
        let levels = slots_per_level
            .iter()
            .map(|&slots| {
                // Cannot overflow: the layout was validated.
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
        Cascade {
            nodes: Nodes::default(),
            levels,
            occupied_levels: 0,
            ready: Links::EMPTY,
            overflow: BTreeMap::new(),
            parked: Links::EMPTY,
            now: 0,
            len: 0,
            cascades: 0,
        }
    }

    /// Room for ids below `ids` without reallocating (and no more).
    pub(crate) fn reserve_ids(&mut self, ids: usize) {
        self.nodes.reserve(ids);
    }

    pub(crate) fn now(&self) -> u64 {
        self.now
    }

    /// Moves an empty cascade's tick forward to `now` (for a fresh cascade replacing one that
    /// had advanced).
    pub(crate) fn advance_to(&mut self, now: u64) {
        debug_assert_eq!(self.len, 0);
        self.set_now(self.now.max(now));
    }

    /// Ids filed, parked ones included.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn cascades(&self) -> u64 {
        self.cascades
    }

    /// Ticks covered by the levels.
    pub(crate) fn span(&self) -> u64 {
        self.levels.last().map_or(1, |level| level.span)
    }

    /// Whether `id` is filed (on any list, parked included).
    pub(crate) fn contains(&self, id: u32) -> bool {
        self.nodes.get(id).is_some_and(Node::is_filed)
    }

    /// Whether `id` is parked.
    pub(crate) fn is_parked(&self, id: u32) -> bool {
        self.nodes.get(id).is_some_and(|node| node.list == PARKED)
    }

    /// The tick `id` is filed at, if filed.
    pub(crate) fn tick(&self, id: u32) -> Option<u64> {
        self.nodes
            .get(id)
            .filter(|node| node.is_filed())
            .map(Node::tick)
    }

    /// Files `id` (which must not be filed) at `tick`; a tick at or before
    /// [`now`](Self::now) is due at once. O(1).
    pub(crate) fn insert(&mut self, id: u32, tick: u64) {
        let node = self.nodes.ensure(id);
        debug_assert_eq!(node.list, UNFILED, "id {id} filed twice");
        node.set_tick(tick);
        self.len += 1;
        self.link(id);
    }

    /// Takes `id` off the cascade; `false` if it was not filed. O(1).
    pub(crate) fn remove(&mut self, id: u32) -> bool {
        if !self.contains(id) {
            return false;
        }
        self.unlink(id);
        self.nodes[id].list = UNFILED;
        self.len -= 1;
        true
    }

    /// Moves a filed `id` to `tick` (a parked one back onto the levels); `false` if it was not
    /// filed. O(1).
    pub(crate) fn reschedule(&mut self, id: u32, tick: u64) -> bool {
        if !self.contains(id) {
            return false;
        }
        let node = self.nodes[id];
        let list = self.list_for(tick);
        if list == node.list
            && (list != OVERFLOW || tick / self.span() == node.tick() / self.span())
        {
            // Already on the list the new tick belongs on: a list is taken whole when its slot
            // comes and each id is then placed by its own tick, so only the tick changes. Saves
            // the unlink's two neighbours, random in memory once a big wheel has churned.
            self.nodes[id].set_tick(tick);
            return true;
        }
        self.unlink(id);
        self.nodes[id].set_tick(tick);
        self.link(id);
        true
    }

    /// Sets a filed `id` aside on the parked list: still filed (it counts in
    /// [`len`](Self::len), [`remove`](Self::remove) finds it), but never handed out by
    /// [`poll_expired`](Self::poll_expired) nor counted in
    /// [`next_expiration`](Self::next_expiration). The owner parks an id it found due by
    /// tick but not yet due by its exact deadline, and walks the list itself.
    pub(crate) fn park(&mut self, id: u32) {
        debug_assert!(self.contains(id));
        self.unlink(id);
        self.append(id, PARKED);
    }

    /// The first parked id.
    pub(crate) fn first_parked(&self) -> Option<u32> {
        (self.parked.head != NIL).then_some(self.parked.head)
    }

    /// The parked id after `id`.
    pub(crate) fn next_parked(&self, id: u32) -> Option<u32> {
        let next = self.nodes[id].next;
        (next != NIL).then_some(next)
    }

    /// The tick at which the cascade next has work: an id to hand out, a slot to cascade, or
    /// the overflow list to re-enter. `None` when nothing but parked ids is filed.
    /// O(levels), no scan of slots.
    pub(crate) fn next_expiration(&self) -> Option<u64> {
        if self.ready.head != NIL {
            return Some(self.now);
        }
        self.next_boundary().map(|(tick, _)| tick)
    }

    /// Advances towards `now` and hands out one filed id whose tick is at or before it (with
    /// that tick), unfiling it; `None` once none is left. Stopping early loses nothing. The
    /// cascade's tick never moves backwards.
    pub(crate) fn poll_expired(&mut self, now: u64) -> Option<(u32, u64)> {
        loop {
            if self.ready.head != NIL {
                let id = self.ready.head;
                self.unlink(id);
                let node = &mut self.nodes[id];
                node.list = UNFILED;
                self.len -= 1;
                debug_assert!(node.tick() <= self.now, "an id was handed out early");
                return Some((id, node.tick()));
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

    /// Unfiles every id, parked ones included, handing each out with its tick; keeps the
    /// current tick. The node table is kept (see [`release_unfiled`](Self::release_unfiled)).
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = (u32, u64)> + '_ {
        for level in self.levels.iter_mut() {
            level.slots.fill(Links::EMPTY);
            level.occupied = Bitmap::new(level.slots.len());
        }
        self.occupied_levels = 0;
        self.ready = Links::EMPTY;
        self.overflow.clear();
        self.parked = Links::EMPTY;
        self.len = 0;
        self.nodes
            .iter_mut()
            .filter(|(_, node)| node.is_filed())
            .map(|(id, node)| {
                node.list = UNFILED;
                (id, node.tick())
            })
    }

    /// Gives back the node storage of the ids in `ids`, which must all be unfiled (whole
    /// chunks only: see `nodes`).
    pub(crate) fn release(&mut self, ids: Range<usize>) {
        self.nodes.release(ids);
    }

    /// Gives back the node storage of every range of ids with nothing filed (linear in the
    /// ids with storage).
    pub(crate) fn release_unfiled(&mut self) {
        self.nodes.release_unfiled();
    }

    /// Ids the node table has room for.
    #[cfg(test)]
    pub(crate) fn node_capacity(&self) -> usize {
        self.nodes.capacity()
    }

    /// The next tick with work on the levels or in overflow, and which list it empties.
    fn next_boundary(&self) -> Option<(u64, u32)> {
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
            let list = SLOTS + level as u32 * SLOT_STRIDE + slot as u32;
            return Some((block_start + slot as u64 * unit, list));
        }
        if let Some(&block) = self.overflow.keys().next() {
            // Overflow blocks lie beyond the current top-level block: this is ahead.
            let block_start = block * self.span();
            debug_assert!(block_start > self.now);
            return Some((block_start, OVERFLOW));
        }
        None
    }

    /// Re-files every id of `list` relative to the current tick: each moves at least one
    /// level down, or to the ready list.
    fn cascade(&mut self, list: u32) {
        let links = if list == OVERFLOW {
            // The earliest block only: the tick has just reached its start.
            self.overflow
                .pop_first()
                .map_or(Links::EMPTY, |(_, links)| links)
        } else {
            std::mem::replace(self.links_mut(list, 0), Links::EMPTY)
        };
        if list >= SLOTS {
            let (level, slot) = split_slot(list);
            self.mark_empty(level, slot);
        }
        // Moving down from a level above the lowest, or out of overflow, is a cascade.
        let counts = list == OVERFLOW || (list >= SLOTS && split_slot(list).0 != 0);
        let mut id = links.head;
        while id != NIL {
            let next = self.nodes[id].next;
            if counts {
                self.cascades += 1;
            }
            self.link(id);
            id = next;
        }
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

    /// The list a tick belongs on, given the current tick: the lowest level whose current
    /// block holds it (one comparison per level climbed, one division at most).
    fn list_for(&self, tick: u64) -> u32 {
        if tick <= self.now {
            return READY;
        }
        for (level, l) in self.levels.iter().enumerate() {
            // `tick > now >= block_start`, so this cannot underflow.
            let offset = tick - l.block_start;
            if offset < l.span {
                let slot = if l.unit == 1 { offset } else { offset / l.unit };
                return SLOTS + level as u32 * SLOT_STRIDE + slot as u32;
            }
        }
        OVERFLOW
    }

    /// The ends of `list`; for the overflow, of the block of `tick` (created if missing).
    fn links_mut(&mut self, list: u32, tick: u64) -> &mut Links {
        match list {
            READY => &mut self.ready,
            OVERFLOW => {
                let block = tick / self.span();
                self.overflow.entry(block).or_insert(Links::EMPTY)
            }
            PARKED => &mut self.parked,
            _ => {
                let (level, slot) = split_slot(list);
                &mut self.levels[level].slots[slot]
            }
        }
    }

    /// Appends `id` to the tail of the list its tick belongs on.
    fn link(&mut self, id: u32) {
        let list = self.list_for(self.nodes[id].tick());
        self.append(id, list);
    }

    /// Appends `id` to the tail of `list`.
    fn append(&mut self, id: u32, list: u32) {
        let tick = self.nodes[id].tick();
        let links = self.links_mut(list, tick);
        let prev = links.tail;
        links.tail = id;
        if prev == NIL {
            links.head = id;
        } else {
            self.nodes[prev].next = id;
        }
        let node = &mut self.nodes[id];
        node.prev = prev;
        node.next = NIL;
        node.list = list;
        if list >= SLOTS && prev == NIL {
            let (level, slot) = split_slot(list);
            self.levels[level].occupied.set(slot);
            self.occupied_levels |= 1 << level;
        }
    }

    /// Takes `id` off its list (its `list` field is left for the caller to set).
    fn unlink(&mut self, id: u32) {
        let node = self.nodes[id];
        let Node {
            prev, next, list, ..
        } = node;
        if prev != NIL {
            self.nodes[prev].next = next;
        }
        if next != NIL {
            self.nodes[next].prev = prev;
        }
        let links = self.links_mut(list, node.tick());
        if links.head == id {
            links.head = next;
        }
        if links.tail == id {
            links.tail = prev;
        }
        if links.head == NIL {
            if list >= SLOTS {
                let (level, slot) = split_slot(list);
                self.mark_empty(level, slot);
            } else if list == OVERFLOW {
                self.overflow.remove(&(node.tick() / self.span()));
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

/// The level and slot of a slot list.
fn split_slot(list: u32) -> (usize, usize) {
    let index = list - SLOTS;
    (
        (index / SLOT_STRIDE) as usize,
        (index % SLOT_STRIDE) as usize,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_twenty_bytes() {
        assert_eq!(std::mem::size_of::<Node>(), 20);
    }

    #[test]
    fn parked_ids_stay_filed_but_are_never_handed_out() {
        let mut cascade = Cascade::new(&[8, 8]);
        cascade.insert(3, 5);
        cascade.insert(9, 5);
        assert_eq!(cascade.poll_expired(5), Some((3, 5)));
        cascade.insert(3, 5);
        cascade.park(3);
        assert!(cascade.contains(3) && cascade.is_parked(3));
        assert_eq!(cascade.poll_expired(5), Some((9, 5)));
        assert_eq!(cascade.poll_expired(100), None);
        assert_eq!(cascade.next_expiration(), None);
        assert_eq!(cascade.len(), 1);
        assert_eq!(cascade.first_parked(), Some(3));
        assert!(cascade.reschedule(3, 120));
        assert!(!cascade.is_parked(3));
        assert_eq!(cascade.next_expiration(), Some(120));
        assert!(cascade.remove(3));
        assert!(!cascade.remove(3));
        assert_eq!(cascade.len(), 0);
    }

    #[test]
    fn drain_hands_out_everything_including_parked() {
        let mut cascade = Cascade::new(&[8, 8]);
        cascade.insert(0, 1);
        cascade.insert(1, 1_000);
        cascade.insert(2, 3);
        cascade.park(2);
        let mut drained: Vec<_> = cascade.drain().collect();
        drained.sort_unstable();
        assert_eq!(drained, [(0, 1), (1, 1_000), (2, 3)]);
        assert_eq!(cascade.len(), 0);
        assert_eq!(cascade.next_expiration(), None);
        cascade.release(0..usize::MAX);
        assert_eq!(cascade.node_capacity(), 0);
    }
}
