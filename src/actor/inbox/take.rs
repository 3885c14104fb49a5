//! The actor's side of the inbox: taking the shards' commands, giving back the memory a flood
//! left, and stopping.

use std::collections::VecDeque;

#[cfg(loom)]
use loom::sync::atomic::Ordering;
#[cfg(not(loom))]
use std::sync::atomic::Ordering;

use super::shards::Inbox;

/// Command capacity a shard keeps after a flood; more is given back once the actor is idle.
const RETAINED_COMMANDS: usize = 4 * 1024;

impl<C> Inbox<C> {
    /// Moves every queued command into `into` (shard by shard, each in order) and gives each
    /// shard back the slots in `freed[shard]`. Returns how many commands it took.
    pub(crate) fn take_all(&self, into: &mut VecDeque<C>, freed: &mut [Vec<u32>]) -> usize {
        let before = into.len();
        // Cleared first: a send that lands in a shard already taken sets it again.
        self.pending.store(false, Ordering::SeqCst);
        for shard in 0..self.shards.len() {
            let mut state = self.lock(shard);
            state.notified = false;
            state.flagged = false;
            if into.is_empty() {
                std::mem::swap(&mut state.commands, into);
            } else {
                into.append(&mut state.commands);
            }
            if let Some(freed) = freed.get_mut(shard) {
                state.free.append(freed);
            }
            self.room_made(shard, &mut state);
        }
        into.len() - before
    }

    /// Moves each shard's queued commands to the back of `into[shard]`, for an actor that puts
    /// the shards' commands back in the order they were made itself (a keyed set's). Returns
    /// how many it took.
    pub(crate) fn take_each(&self, into: &mut [VecDeque<C>]) -> usize {
        debug_assert_eq!(into.len(), self.shards.len());
        // Cleared first: a send that lands in a shard already taken sets it again.
        self.pending.store(false, Ordering::SeqCst);
        let mut took = 0;
        for (shard, into) in into.iter_mut().enumerate() {
            let mut state = self.lock(shard);
            state.notified = false;
            state.flagged = false;
            took += state.commands.len();
            if into.is_empty() {
                std::mem::swap(&mut state.commands, into);
            } else {
                into.append(&mut state.commands);
            }
            self.room_made(shard, &mut state);
        }
        took
    }

    /// Takes one shard's commands (tests: one step of [`take_each`](Self::take_each), to
    /// make a send land between two shards' takes).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn take_one(&self, shard: usize, into: &mut VecDeque<C>) -> usize {
        let mut state = self.lock(shard);
        let took = state.commands.len();
        into.append(&mut state.commands);
        self.room_made(shard, &mut state);
        took
    }

    /// Whether every shard before `shard` (by index: the order [`take_each`](Self::take_each)
    /// takes them in) is empty; waits for a send in progress on each.
    pub(crate) fn empty_before(&self, shard: usize) -> bool {
        (0..shard).all(|before| self.lock(before).commands.is_empty())
    }

    /// Whether a shard holds a flood-sized command buffer.
    pub(crate) fn holds_memory(&self) -> bool {
        (0..self.shards.len()).any(|shard| self.lock(shard).commands.capacity() > RETAINED_COMMANDS)
    }

    /// Gives back the command buffers a flood left behind in the shards.
    pub(crate) fn trim(&self) {
        for shard in 0..self.shards.len() {
            let mut state = self.lock(shard);
            if state.commands.is_empty() && state.commands.capacity() > RETAINED_COMMANDS {
                state.commands = VecDeque::new();
            }
        }
    }

    /// Refuses all further sends and moves what was still queued into `into`.
    pub(crate) fn stop(&self, into: &mut VecDeque<C>) {
        for shard in 0..self.shards.len() {
            let mut state = self.lock(shard);
            state.stopped = true;
            into.append(&mut state.commands);
            state.commands = VecDeque::new();
            self.room_made(shard, &mut state);
        }
    }

    /// [`stop`](Self::stop), each shard's commands into `into[shard]`; returns how many.
    pub(crate) fn stop_each(&self, into: &mut [VecDeque<C>]) -> usize {
        let mut took = 0;
        for (shard, into) in into.iter_mut().enumerate() {
            let mut state = self.lock(shard);
            state.stopped = true;
            took += state.commands.len();
            into.append(&mut state.commands);
            state.commands = VecDeque::new();
            self.room_made(shard, &mut state);
        }
        took
    }
}
