//! The timer pool's free slots, kept in the inbox's shards: a registration takes a slot and
//! queues its command under one lock; slots come back to the shard that released them, and a
//! memory release frees whole unused segments (see `timer::pool`).

use std::ops::Range;

#[cfg(loom)]
use loom::sync::atomic::Ordering;
#[cfg(not(loom))]
use std::sync::atomic::Ordering;

use super::shards::{Inbox, Urgency};
use crate::timer::pool::{Pool, Slot};

/// Drops the indices of freed segments from `free` and orders the rest by segment, highest
/// first, so that `pop` hands out the lowest segment's slots first. A counting sort by
/// segment: linear in the list, whatever its order.
fn lowest_segment_last(free: &mut Vec<u32>, pool: &Pool) {
    let mut counts = vec![0usize; Pool::SEGMENTS + 1];
    free.retain(|&index| {
        let segment = Pool::segment_of(index);
        let live = pool.is_allocated(segment);
        if live {
            // Highest segment first: bucket `SEGMENTS - 1 - segment`.
            counts[Pool::SEGMENTS - segment] += 1;
        }
        live
    });
    for bucket in 1..counts.len() {
        counts[bucket] += counts[bucket - 1];
    }
    let mut sorted = vec![0u32; free.len()];
    for &index in free.iter() {
        let bucket = Pool::SEGMENTS - 1 - Pool::segment_of(index);
        sorted[counts[bucket]] = index;
        counts[bucket] += 1;
    }
    *free = sorted;
}

impl<C> Inbox<C> {
    /// Gives `slot` straight back to `shard`'s free list, for a handle whose timer the actor
    /// has fired and so no longer holds: no command, no work for the actor. `false` while the
    /// actor watches for slots coming back ([`watch_returns`](Self::watch_returns)): the
    /// caller then sends its release as usual. Once the actor has stopped there is nothing to
    /// do (the slot goes with the pool).
    pub(crate) fn give_back(&self, shard: usize, slot: u32) -> bool {
        let mut state = self.lock(shard);
        if state.stopped {
            return true;
        }
        // Stored by the actor before it locks the shards to count free slots: a handle that
        // takes the lock after that count sees it, one before put its slot where it counts.
        if self.watch_returns.load(Ordering::Relaxed) {
            return false;
        }
        state.free.push(slot);
        true
    }

    /// Whether handles should send their releases through the actor (see
    /// [`give_back`](Self::give_back)). Set before a memory release counts the free lists.
    pub(crate) fn watch_returns(&self, on: bool) {
        self.watch_returns.store(on, Ordering::Relaxed);
    }

    /// Takes a free pool slot, lets `make` set it up and build the command that files it, and
    /// queues that command, all under the shard's lock. Returns the slot and the command's
    /// position in the queue, or `None` if the actor has stopped.
    pub(crate) fn send_with_slot(
        &self,
        shard: usize,
        pool: &Pool,
        urgency: Urgency,
        make: impl FnOnce(u32, &Slot) -> C,
    ) -> Option<(u32, u32)> {
        let mut state = self.lock(shard);
        if state.stopped {
            return None;
        }
        let index = match state.free.pop() {
            Some(index) => index,
            None => {
                // Lowest indices first: they keep the actor's tables dense.
                state.free.extend(pool.grow().rev());
                state.free.pop().expect("a segment has slots")
            }
        };
        let command = make(index, pool.get(index));
        let (position, notify) = self.push(&mut state, command, urgency);
        self.after_send(shard, state, Some(notify));
        Some((index, position))
    }

    /// Frees every pool segment from `keep` on (by segment number) none of whose slots is in
    /// use, and orders the free lists lowest segment first (see `timer::pool`). Every shard is
    /// locked meanwhile, so no slot can be taken. Returns the indices of the segments freed.
    pub(crate) fn release_segments(
        &self,
        pool: &Pool,
        freed: &mut [Vec<u32>],
        keep: usize,
    ) -> Vec<Range<u32>> {
        let mut shards: Vec<_> = (0..self.shards.len()).map(|s| self.lock(s)).collect();
        for (state, freed) in shards.iter_mut().zip(freed.iter_mut()) {
            state.free.append(freed);
        }
        // Free slots per segment. An index is in at most one free list, and only once nobody
        // holds it (the protocol of `timer::pool`): a segment with every slot free is unused.
        let mut free = vec![0u32; Pool::SEGMENTS];
        for state in &shards {
            for &index in &state.free {
                free[Pool::segment_of(index)] += 1;
            }
        }
        let mut released = Vec::new();
        for (segment, &count) in free.iter().enumerate().skip(keep) {
            if count == Pool::segment_len(segment) {
                // SAFETY: every index of the segment is in a free list, so no handle holds
                // one nor can reach the slots (a handle gives an index back only once it no
                // longer touches the slot), and the actor, which alone puts indices there, no
                // longer holds them either. None can be taken while these locks are held, and
                // the indices leave the free lists below, before the locks are released.
                if let Some(range) = unsafe { pool.release(segment) } {
                    released.push(range);
                }
            }
        }
        for state in &mut shards {
            lowest_segment_last(&mut state.free, pool);
            if state.free.capacity() > 2 * state.free.len() + 64 {
                state.free.shrink_to_fit();
            }
        }
        released
    }
}
