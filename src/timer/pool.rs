//! The wheel's pool of timer slots: the shared state of every sleep and job, without an
//! allocation per timer.
//!
//! A [`Slot`] is a timer's [`TimerWord`] and the waker of the task waiting on it: 32 bytes.
//! Slots are named by dense `u32` indices, which double as the timers' ids in the actor's
//! wheel, so the actor needs no table from timers to wheel positions.
//!
//! Who may touch a slot, and when, is a protocol rather than a reference count:
//!
//! - a handle takes a free index from its inbox shard (under the shard's lock) and owns the
//!   slot until it sends the actor a `Release` for it; it never touches the slot afterwards;
//! - the actor touches a slot only while the timer is filed in its wheel, and returns the index
//!   to a shard's free list when both the handle has released it and the wheel no longer holds
//!   it;
//! - except that a sleep the actor fired (and so unfiled) gives its index back itself, under
//!   the shard's lock, with no `Release` (`Inbox::give_back`): the actor touches nothing of
//!   the slot after firing it but its waker (at worst a spurious wake of the slot's next
//!   user), and frees segments only between its own turns.
//!
//! The slots live in segments that double in size (1024, 2048, … up to 131 072 slots, then
//! stay that size), each allocated once and never moved, so a handle reaches its slot with one
//! atomic load and no lock.
//!
//! # Giving memory back per segment
//!
//! A segment is freed as soon as none of its slots is in use, whatever the other segments hold:
//! after a flood, a few long-lived timers keep only the segments they sit in (at most 4 MiB
//! each), not the whole pool. Once the actor has been quiet for a moment with the pool much
//! larger than what it has filed, it locks every inbox shard (so no slot can be taken) and
//! counts, per segment, the free indices in the shards' free lists: a segment whose every
//! slot is free is held by nobody — the protocol above puts an index in a free list only once
//! both its handle and the wheel are done with it, and a handle never touches a slot it gave
//! back. The segment is freed and its indices leave the free lists before the locks are
//! released, so no handle can obtain an index into it until [`Pool::grow`] allocates it again.
//! The remaining free lists are reordered lowest segment first (a counting sort by segment,
//! linear): new timers then fill the low segments and a busy wheel's high ones empty out for
//! the next pass. `grow` always allocates the lowest segment missing.
//!
//! Rejected: relocatable slots (a handle would reach its slot through an indirection the actor
//! can rewrite: one more load, and a hand-off, on every handle operation), and a live count per
//! segment (one more shared write on every take and release). Counting at release time costs
//! the hot path nothing: a handle still takes and releases a slot under its shard's lock, and
//! `reset` later is one atomic store on the slot's word. The pass is linear in the free slots
//! and runs only when the pool is mostly unused, at most once per idle grace period.

use std::ops::Range;

use futures::task::AtomicWaker;
#[cfg(loom)]
use loom::sync::Mutex;
#[cfg(loom)]
use loom::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
#[cfg(not(loom))]
use std::sync::Mutex;
#[cfg(not(loom))]
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use super::state::TimerWord;

/// Slots in the first segment; segments double up to [`LARGEST`], then stay that size, so
/// a big pool wastes at most one segment's worth and a small one stays small.
#[cfg(not(loom))]
const FIRST: u32 = 1 << 10;
#[cfg(not(loom))]
const LARGEST: u32 = 1 << 17;
/// Loom tracks every atomic: tiny segments keep its models small.
#[cfg(loom)]
const FIRST: u32 = 2;
#[cfg(loom)]
const LARGEST: u32 = 4;
/// Segments that double in size.
const DOUBLING: usize = (LARGEST.trailing_zeros() - FIRST.trailing_zeros()) as usize;
/// The most slots a pool holds: 2^28 timers pending at once in one wheel.
#[cfg(not(loom))]
pub(crate) const MAX_SLOTS: u32 = 1 << 28;
#[cfg(loom)]
pub(crate) const MAX_SLOTS: u32 = 64;
/// Segments the largest pool needs.
const SEGMENTS: usize =
    DOUBLING + (MAX_SLOTS - FIRST * ((1 << DOUBLING) - 1)).div_ceil(LARGEST) as usize;

/// A timer's shared state.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    pub(crate) word: TimerWord,
    pub(crate) waker: AtomicWaker,
}

/// The first index of segment `k`.
fn segment_start(segment: usize) -> u32 {
    if segment <= DOUBLING {
        FIRST * ((1u32 << segment) - 1)
    } else {
        segment_start(DOUBLING) + (segment - DOUBLING) as u32 * LARGEST
    }
}

fn segment_len(segment: usize) -> usize {
    if segment < DOUBLING {
        (FIRST as usize) << segment
    } else {
        LARGEST as usize
    }
}

/// Segment `k` and the offset within it of slot `index`.
fn locate(index: u32) -> (usize, usize) {
    let doubling_end = segment_start(DOUBLING);
    if index < doubling_end {
        let shifted = index + FIRST;
        let segment = (31 - shifted.leading_zeros() - FIRST.trailing_zeros()) as usize;
        (segment, (shifted - (FIRST << segment)) as usize)
    } else {
        let past = index - doubling_end;
        (
            DOUBLING + (past / LARGEST) as usize,
            (past % LARGEST) as usize,
        )
    }
}

/// Growable, shrinkable storage of [`Slot`]s with lock-free access by index.
#[derive(Debug)]
pub(crate) struct Pool {
    /// Segment `k` is null or a leaked `Box<[Slot]>` of `segment_len(k)` slots.
    segments: [AtomicPtr<Slot>; SEGMENTS],
    /// Slots allocated (over every segment); changes under `resize`.
    allocated: AtomicU32,
    resize: Mutex<()>,
    /// Under loom, each segment's memory is modelled by a cell that `get` reads and `release`
    /// writes: loom reports any access to a segment not ordered with its release.
    #[cfg(loom)]
    memory: [loom::cell::UnsafeCell<bool>; SEGMENTS],
}

impl Default for Pool {
    fn default() -> Self {
        Pool {
            segments: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            allocated: AtomicU32::new(0),
            resize: Mutex::new(()),
            #[cfg(loom)]
            memory: std::array::from_fn(|_| loom::cell::UnsafeCell::new(false)),
        }
    }
}

impl Pool {
    /// The slot at `index`.
    ///
    /// The caller must hold `index` under the protocol of the [module docs](self): taken from
    /// a free list and not yet released (a handle), or filed in the wheel (the actor).
    ///
    /// # Panics
    ///
    /// If no segment holds `index`, which the protocol rules out.
    pub(crate) fn get(&self, index: u32) -> &Slot {
        let (segment, offset) = locate(index);
        let base = self.segments[segment].load(Ordering::Acquire);
        assert!(
            !base.is_null(),
            "tokio-wheel: timer slot {index} is not allocated"
        );
        // SAFETY: `base` came from `Box::<[Slot]>::into_raw` of `segment_len(segment)` slots
        // (see `grow`) and `offset < segment_len(segment)` by `locate`. The segment is freed
        // only by `release`, whose caller guarantees that no index in it is held by anyone, and
        // the caller of `get` holds `index`: the segment outlives this borrow.
        unsafe { &*base.add(offset) }
    }

    /// Slots allocated.
    pub(crate) fn capacity(&self) -> u32 {
        self.allocated.load(Ordering::Acquire)
    }

    /// Allocates the lowest segment missing and returns its indices.
    ///
    /// # Panics
    ///
    /// With [`MAX_SLOTS`] timers pending at once in one wheel (8 GiB of slots alone).
    pub(crate) fn grow(&self) -> Range<u32> {
        let _resize = self.resize.lock().unwrap_or_else(|e| e.into_inner());
        let segment = (0..SEGMENTS)
            .find(|&k| self.segments[k].load(Ordering::Acquire).is_null())
            .unwrap_or_else(|| {
                panic!("tokio-wheel: more than {MAX_SLOTS} timers pending at once in one wheel")
            });
        let slots: Box<[Slot]> = (0..segment_len(segment)).map(|_| Slot::default()).collect();
        #[cfg(loom)]
        // SAFETY: a loom cell, written under `resize`.
        self.memory[segment].with_mut(|live| unsafe { *live = true });
        self.segments[segment].store(Box::into_raw(slots).cast::<Slot>(), Ordering::Release);
        let len = segment_len(segment) as u32;
        let allocated = self.allocated.load(Ordering::Acquire);
        self.allocated.store(allocated + len, Ordering::Release);
        let start = segment_start(segment);
        start..start + len
    }

    /// Frees segment `segment`, if allocated, and returns its indices.
    ///
    /// # Safety
    ///
    /// No index of the segment may be held (by a handle or the actor) or be obtainable (in any
    /// free list) during or after this call, until `grow` hands the segment out again.
    pub(crate) unsafe fn release(&self, segment: usize) -> Option<Range<u32>> {
        let _resize = self.resize.lock().unwrap_or_else(|e| e.into_inner());
        let base = self.segments[segment].swap(std::ptr::null_mut(), Ordering::AcqRel);
        if base.is_null() {
            return None;
        }
        #[cfg(loom)]
        // SAFETY: a loom cell; loom reports a `get` this write is not ordered with.
        self.memory[segment].with_mut(|live| unsafe { *live = false });
        let len = segment_len(segment);
        let slots = std::ptr::slice_from_raw_parts_mut(base, len);
        // SAFETY: `base` came from `Box::<[Slot]>::into_raw` with this length in `grow`, it was
        // swapped out so it is freed once, and the caller guarantees nobody holds or can
        // obtain an index in it.
        drop(unsafe { Box::from_raw(slots) });
        let allocated = self.allocated.load(Ordering::Acquire);
        self.allocated
            .store(allocated - len as u32, Ordering::Release);
        let start = segment_start(segment);
        Some(start..start + len as u32)
    }

    /// Whether segment `segment` is allocated.
    pub(crate) fn is_allocated(&self, segment: usize) -> bool {
        !self.segments[segment].load(Ordering::Acquire).is_null()
    }

    /// The segment holding slot `index`.
    pub(crate) fn segment_of(index: u32) -> usize {
        locate(index).0
    }

    /// Slots in segment `segment`.
    pub(crate) fn segment_len(segment: usize) -> u32 {
        segment_len(segment) as u32
    }

    /// How many segments there can be.
    pub(crate) const SEGMENTS: usize = SEGMENTS;

    /// How many segments hold at most `slots` slots.
    pub(crate) fn segments_within(slots: u32) -> usize {
        (0..SEGMENTS)
            .take_while(|&k| segment_start(k + 1) <= slots)
            .count()
    }
}

// SAFETY: only under loom, where `memory`'s cells model the segments' memory: loom itself
// checks every access to them for ordering, which is the point of the model.
#[cfg(loom)]
unsafe impl Sync for Pool {}

impl Drop for Pool {
    fn drop(&mut self) {
        for segment in 0..SEGMENTS {
            // SAFETY: `&mut self`: nobody else can hold an index.
            unsafe { self.release(segment) };
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_thirty_two_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 32);
    }

    #[test]
    fn indices_map_onto_doubling_then_equal_segments() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(1023), (0, 1023));
        assert_eq!(locate(1024), (1, 0));
        assert_eq!(locate(3071), (1, 2047));
        assert_eq!(locate(3072), (2, 0));
        let doubling_end = segment_start(DOUBLING);
        assert_eq!(doubling_end, 1024 * 127);
        assert_eq!(locate(doubling_end - 1), (DOUBLING - 1, 65_535));
        assert_eq!(locate(doubling_end), (DOUBLING, 0));
        assert_eq!(locate(doubling_end + LARGEST), (DOUBLING + 1, 0));
        for index in [0, 5_000, doubling_end + 7, MAX_SLOTS - 1] {
            let (segment, offset) = locate(index);
            assert!(segment < SEGMENTS && offset < segment_len(segment));
            assert_eq!(segment_start(segment) + offset as u32, index);
        }
        assert!(segment_start(SEGMENTS) >= MAX_SLOTS - LARGEST);
    }

    #[test]
    fn segments_are_freed_one_by_one_and_regrown_lowest_first() {
        let pool = Pool::default();
        assert_eq!(pool.grow(), 0..1024);
        assert_eq!(pool.grow(), 1024..3072);
        assert_eq!(pool.grow(), 3072..7168);
        assert_eq!(pool.capacity(), 7168);
        pool.get(5000).word.arm(7);
        assert_eq!(Pool::segments_within(1024), 1);
        assert_eq!(Pool::segments_within(5000), 2);
        assert_eq!(Pool::segment_of(5000), 2);
        // SAFETY: no index of segment 1 is held.
        assert_eq!(unsafe { pool.release(1) }, Some(1024..3072));
        // SAFETY: as above; already freed.
        assert_eq!(unsafe { pool.release(1) }, None);
        assert!(!pool.is_allocated(1) && pool.is_allocated(2));
        assert_eq!(pool.capacity(), 1024 + 4096);
        assert_eq!(pool.get(5000).word.deadline(), 7, "the others stay put");
        assert_eq!(pool.grow(), 1024..3072, "the hole first");
        assert_eq!(
            pool.get(3000).word.deadline(),
            0,
            "a regrown segment is fresh"
        );
        assert_eq!(pool.grow(), 7168..15360);
    }
}
