//! Due entries held back by commands in flight, and when they are let go.
//!
//! An entry found due may still be moved or removed by a command that returned before its
//! deadline but waits in a queue: one of its handle's (its word is marked held) or, in the
//! middle of a flood's batch, a by-key one on its stripe. The actor must not fire it yet. But
//! handles that keep a command in flight at every moment would hold it back for good, and only
//! commands made before the entry was due deserve to win. So the first time the actor finds a
//! due entry held, it notes its clock (`limit`) and the ledger's count in the entry's stripe
//! then (`mark`). Once every command counted before the mark is applied, whatever still holds
//! the entry was made after its deadline had passed, and may lose to the expiry, as a `reset`
//! racing expiry may: the entry fires, if its deadline is at or before that clock.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use crate::timer::keyed::Ledger;

/// Held entries by id: only while such races last, so usually empty.
#[derive(Debug, Default)]
pub(super) struct Holds {
    held: HashMap<u32, Hold>,
}

/// Held back since the clock read `limit`, until every command counted in the entry's stripe
/// by then (`mark`, [`Ledger::mark`]) is applied.
#[derive(Debug, Clone, Copy)]
struct Hold {
    limit: u64,
    mark: u32,
}

impl Holds {
    /// If entry `id` (of `stripe`) was held and every command counted before its hold is now
    /// applied: the clock of the hold, by which the entry may fire whatever still holds it.
    pub(super) fn released_by(
        &self,
        id: u32,
        ledger: &Ledger,
        stripe: impl FnOnce() -> usize,
    ) -> Option<u64> {
        let hold = self.held.get(&id)?;
        ledger
            .applied_past(stripe(), hold.mark)
            .then_some(hold.limit)
    }

    /// Entry `id` (of `stripe`), due at `deadline` by the clock `limit`, is held back. A hold
    /// taken while that deadline was already due stays: taken again on every look, it would
    /// wait for commands made after the deadline, and a stream of them would hold the entry
    /// back for good. One taken for an earlier deadline (the entry moved later since) is taken
    /// again.
    pub(super) fn hold(
        &mut self,
        id: u32,
        deadline: u64,
        limit: u64,
        ledger: &Ledger,
        stripe: impl FnOnce() -> usize,
    ) {
        let fresh = || Hold {
            limit,
            mark: ledger.mark(stripe()),
        };
        match self.held.entry(id) {
            Entry::Occupied(mut hold) if hold.get().limit < deadline => {
                *hold.get_mut() = fresh();
            }
            Entry::Occupied(_) => {}
            Entry::Vacant(place) => {
                place.insert(fresh());
            }
        }
    }

    /// Entry `id` is gone (fired, removed, replaced): its id may be reused.
    pub(super) fn forget(&mut self, id: u32) {
        if !self.held.is_empty() {
            self.held.remove(&id);
        }
    }

    /// Every entry is gone.
    pub(super) fn clear(&mut self) {
        self.held = HashMap::new();
    }

    /// Gives back room a burst of races took.
    pub(super) fn shrink(&mut self) {
        self.held.shrink_to_fit();
    }
}
