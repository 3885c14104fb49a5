//! What a keyed entry's handle shares with its set's actor: the entry's deadline word, and the
//! set's ledger of commands in flight.
//!
//! An entry made by `Timers::insert` keeps its deadline in a [`DeadlineWord`] that its
//! `KeyedTimer` handles and the actor share, so a handle moves the deadline later with one
//! compare-and-swap and no message: when the entry's old tick comes, the actor reads the word,
//! sees the later deadline and files the entry again (the lazy postpone of a `Sleep`). The word
//! packs a "gone" bit (set once, by the actor, when the entry fires or is removed, taken,
//! replaced, drained or flushed) with the signed deadline, so a handle's move and the actor's
//! decision to fire agree on one compare-and-swap: either the actor sees the new deadline, or
//! the handle sees the entry gone and does nothing. A reset racing expiry fires once, never
//! early.
//!
//! A handle may store into the word only if no command that could still write the same entry
//! is in flight — commands apply in the order they were made, and a by-key `reset` queued
//! before the handle's store must not overwrite it when it lands. Two counts say so: the word
//! counts its handles' own commands in flight, and the set's [`Ledger`] counts every command on
//! a key (by key or through a handle) sent and applied per stripe of key hashes (by-key
//! senders cannot find the word). The same counts put the commands back in order in the
//! actor (see [`Ledger`]). A handle
//! whose word and stripe have nothing in flight stores; otherwise it sends its move as a
//! command, behind the others.
//!
//! Such a queued move must still win against an expiry it raced, if it returned before the
//! deadline: an actor's turn may fire between taking its inbox and applying what it took (a
//! flood's turn fires between slices of its batch, and reads the clock after the take), so a
//! move queued in between would be missed by a firing that the clock says is due. So a handle
//! that queues a command which writes the entry first marks the word *held* (one
//! read-modify-write on the word itself), and the actor never fires a held entry: it looks
//! again once it has applied the handle's commands (at most a turn late, and only while they
//! race). The mark and the actor's decision to fire are two read-modify-writes on one word, so
//! one of them sees the other: either the actor finds the entry held, or the handle finds it
//! gone — it fired first, by a clock the actor read before the handle's mark, so the handle's
//! `reset` returned after the deadline. (A count the actor only loads would not do: that load
//! is ordered neither with the handle's count nor with the actor's own clock read.) The actor lifts the mark when
//! it has applied the last command in flight (see [`DeadlineWord::applied`]).
//!
//! A mark alone could hold an entry back for good: handles that keep a command in flight at
//! every moment keep it marked. But only commands made before the entry was due deserve to
//! win. So the actor, finding a due entry held, notes its clock and the ledger's count in
//! the entry's stripe then ([`Ledger::mark`]); once it has applied every command counted
//! before that note, whatever still holds the entry was made after its deadline had passed,
//! and it fires (`on_due`'s `released_by`).

#[cfg(loom)]
use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Set once the entry is gone.
const GONE: u64 = 1 << 63;
/// Set while a command of the entry's handles that writes it is in flight: the actor must not
/// fire the entry (see the module).
const HELD: u64 = 1 << 62;
/// The bits that hold the deadline.
const DEADLINE_BITS: u64 = HELD - 1;
/// The deadline range a word holds: ±2^61 ns (73 years) around the wheel's origin. Keyed
/// deadlines never pass [`NEVER`](super::clock::NEVER) = 2^61 − 1 (the top of the range);
/// earlier ones saturate.
const MIN_DEADLINE: i64 = -(1 << 61);
const MAX_DEADLINE: i64 = (1 << 61) - 1;
const _: () = assert!(MAX_DEADLINE as u64 == super::clock::NEVER);

/// The deadline bits of a word.
fn pack(deadline: i64) -> u64 {
    (deadline.clamp(MIN_DEADLINE, MAX_DEADLINE) - MIN_DEADLINE) as u64
}

fn unpack(word: u64) -> (bool, i64) {
    (
        word & GONE != 0,
        (word & DEADLINE_BITS) as i64 + MIN_DEADLINE,
    )
}

/// What a handle's move did to the word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Moved {
    /// The deadline is now later than (or as late as) it was: nothing else to do.
    Later,
    /// The deadline is now earlier: the actor may have the entry filed too late and must be
    /// told.
    Earlier,
    /// The entry is gone: nothing changed.
    Gone,
}

/// What the actor found when an entry's tick came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// Due by then: the word is gone now, and this was the deadline it fired for.
    Fire(i64),
    /// Moved later, to this deadline: file it again.
    Later(i64),
    /// A handle's command that writes the entry is in flight (it may move or remove it, and
    /// may have returned before the deadline): look again once it is applied.
    Held,
}

/// An entry's deadline (a signed nanosecond offset from the wheel's origin) and whether the
/// entry is gone; plus how many commands its handles have sent that the actor has not applied.
#[derive(Debug)]
pub(crate) struct DeadlineWord {
    word: AtomicU64,
    /// The handles' own commands in flight that write the entry (moves, removals, takes: not
    /// an advance, which only reads the word). Handles count up (and mark the word
    /// [`HELD`]) before queueing one; the actor counts down once it has applied it — if the
    /// entry is still live: a gone entry's word refuses every move anyway — and lifts the mark
    /// with the last.
    in_flight: AtomicU32,
    /// Where the actor filed the entry ([`UNFILED`] until it applies the insert): handles name
    /// the entry by it. Written once, by the actor.
    id: AtomicU32,
}

/// The id of an entry the actor has not filed yet.
pub(crate) const UNFILED: u32 = u32::MAX;

impl DeadlineWord {
    /// A live entry's word.
    pub(crate) fn new(deadline: i64) -> Self {
        DeadlineWord {
            word: AtomicU64::new(pack(deadline)),
            in_flight: AtomicU32::new(0),
            id: AtomicU32::new(UNFILED),
        }
    }

    /// The actor: the entry is filed as `id`.
    pub(crate) fn filed_as(&self, id: u32) {
        self.id.store(id, Ordering::Relaxed);
    }

    /// Where the actor filed the entry, if it has yet.
    pub(crate) fn id(&self) -> Option<u32> {
        Some(self.id.load(Ordering::Relaxed)).filter(|&id| id != UNFILED)
    }

    /// A handle is about to queue a command that writes this entry: counts it and holds the
    /// entry back from firing until the actor has applied it. Returns whether the entry was
    /// live then; if not, it fired (or went) first, and the command will find it gone.
    pub(crate) fn sending(&self) -> bool {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        // Release: publishes the count to an actor whose lift reads this mark (`applied`).
        self.word.fetch_or(HELD, Ordering::AcqRel) & GONE == 0
    }

    /// The actor applied a handle's command for this live entry; what it did to the word is
    /// published with the count. With the last command in flight applied, the entry may fire
    /// again.
    ///
    /// A handle may count another command meanwhile, whose mark must stay: the actor lifts the
    /// mark, then reads the count again and marks the word again if it is not zero. The marks
    /// and the lift are read-modify-writes of one word, so they are ordered: a mark after the
    /// lift stays; a mark before it is read by the lift (acquire), and with it the count made
    /// before the mark, which the read of the count then sees. The actor is the only one to
    /// fire, and it does not in between.
    pub(crate) fn applied(&self) {
        if self.in_flight.fetch_sub(1, Ordering::Release) == 1 {
            self.word.fetch_and(!HELD, Ordering::AcqRel);
            if self.in_flight.load(Ordering::Relaxed) != 0 {
                self.word.fetch_or(HELD, Ordering::Relaxed);
            }
        }
    }

    /// Whether every command this entry's handles sent has been applied (and its effect on
    /// the word is visible to the caller).
    pub(crate) fn is_quiet(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    /// Whether the entry is gone, and its deadline (for a gone entry: the one it had when it
    /// went).
    pub(crate) fn load(&self) -> (bool, i64) {
        unpack(self.word.load(Ordering::Acquire))
    }

    /// Sets the deadline of a live entry, from the handle or (for a by-key or queued move) the
    /// actor; a hold stays. One compare-and-swap, uncontended unless the actor is deciding this
    /// very entry.
    pub(crate) fn move_to(&self, deadline: i64) -> Moved {
        let mut current = self.word.load(Ordering::Acquire);
        loop {
            let (gone, old) = unpack(current);
            if gone {
                return Moved::Gone;
            }
            let new = (current & HELD) | pack(deadline);
            if current == new {
                return Moved::Later;
            }
            match self
                .word
                .compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if deadline < old => return Moved::Earlier,
                Ok(_) => return Moved::Later,
                Err(actual) => current = actual,
            }
        }
    }

    /// The actor: the entry's tick came, and everything due by `limit` may fire. Marks the
    /// word gone if it fires. A held entry does not fire, unless `released_by` is given and its
    /// deadline is at or before it: the actor has applied every command that could have been
    /// made before that time (see `actor::keyed`), so the commands still holding it were made
    /// after the deadline had passed and may lose to the expiry.
    pub(crate) fn on_due(&self, limit: i64, released_by: Option<i64>) -> Due {
        let mut current = self.word.load(Ordering::Acquire);
        loop {
            let (gone, deadline) = unpack(current);
            debug_assert!(
                !gone,
                "only the actor retires a word, and it unfiles it then"
            );
            if current & HELD != 0 && released_by.is_none_or(|released| deadline > released) {
                return Due::Held;
            }
            if deadline > limit {
                return Due::Later(deadline);
            }
            match self.word.compare_exchange_weak(
                current,
                current | GONE,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Due::Fire(deadline),
                Err(actual) => current = actual,
            }
        }
    }

    /// The actor: the entry is gone (removed, taken, replaced, drained or flushed). Returns
    /// the deadline it had.
    pub(crate) fn retire(&self) -> i64 {
        unpack(self.word.fetch_or(GONE, Ordering::AcqRel)).1
    }
}

/// Stripes of key hashes the ledger counts separately: commands on other keys rarely hold a
/// handle's fast path up, nor wait for each other in the actor.
#[cfg(not(loom))]
pub(crate) const STRIPES: usize = 256;
#[cfg(loom)]
pub(crate) const STRIPES: usize = 2;

/// A command on every key's ordinal in each stripe (boxed: such commands are rare, and the
/// others stay small).
pub(crate) type Ordinals = Box<[u32; STRIPES]>;

/// Bits of a [`Seq`] that hold the ordinal; the stripe takes the 8 above.
const ORDINAL_BITS: u32 = 24;
const ORDINAL_MASK: u32 = Seq::ORDINAL_MASK;

/// A command's place in its set's order: its key's stripe, and how many commands were counted
/// in that stripe before it (modulo 2^24: ordinals are only ever compared for equality, and a
/// stripe never has 2^24 commands in flight).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Seq(u32);

impl Seq {
    /// The bits of a count that make an ordinal.
    pub(crate) const ORDINAL_MASK: u32 = (1 << ORDINAL_BITS) - 1;

    pub(crate) fn new(stripe: usize, ordinal: u32) -> Self {
        debug_assert!(stripe < STRIPES);
        Seq(((stripe as u32) << ORDINAL_BITS) | (ordinal & ORDINAL_MASK))
    }

    pub(crate) fn stripe(self) -> usize {
        (self.0 >> ORDINAL_BITS) as usize
    }

    pub(crate) fn ordinal(self) -> u32 {
        self.0 & ORDINAL_MASK
    }
}

/// Commands counted and applied, per stripe of key hashes.
///
/// Every command that acts on a key counts in its key's stripe before it is queued, and the
/// count it finds is its ordinal there ([`Seq`]); a command on every key (a drain, a `len`)
/// counts in every stripe. The actor applies each stripe's commands in ordinal order (see
/// `actor::keyed::order`) and counts them applied. This serves two ends:
///
/// - **Order.** Senders queue into per-thread inbox shards (no lock shared between threads),
///   so the actor may take a command before one made earlier on another thread. Two commands
///   on one key count in one stripe, and one made after another (by the same task, or after
///   seeing its effect) counts after it: the actor applies them in the order they were made.
/// - **Quiet stripes.** A stripe whose counts agree has nothing in flight, so a handle (whose
///   own commands its word also counts) may write its entry's word directly without
///   overtaking a command made before.
#[derive(Debug)]
pub(crate) struct Ledger {
    /// Written by senders.
    sent: Box<[AtomicU32]>,
    /// Written by the actor only (on other cache lines than `sent`).
    applied: Box<[AtomicU32]>,
}

impl Default for Ledger {
    fn default() -> Self {
        let stripes = || (0..STRIPES).map(|_| AtomicU32::new(0)).collect();
        Ledger {
            sent: stripes(),
            applied: stripes(),
        }
    }
}

impl Ledger {
    /// The stripe of a key's hash (bits that neither the index's shard choice nor its
    /// tables' placement lean on most).
    pub(crate) fn stripe(hash: u64) -> usize {
        (hash >> 48) as usize % STRIPES
    }

    /// A command on a key of `stripe` is about to be queued: counts it and returns its place.
    /// Counted first, so the actor can never have applied more than was counted; and under the
    /// lock of the inbox shard it goes to, so each shard's queue is in counting order.
    /// Sequentially consistent as a margin: the order the merge relies on
    /// (`actor::keyed::order`) is carried by the shard locks, and every loom model also passes
    /// with this count relaxed (loom checks `SeqCst` accesses as acquire/release only). On
    /// x86 the two compile to the same locked add.
    pub(crate) fn sending(&self, stripe: usize) -> Seq {
        Seq::new(stripe, self.sent[stripe].fetch_add(1, Ordering::SeqCst))
    }

    /// Whether `seq` is the last command counted in its stripe so far: nothing made after it
    /// on any key of the stripe (a command counted meanwhile is concurrent with the caller).
    pub(crate) fn is_last_counted(&self, seq: Seq) -> bool {
        let sent = self.sent[seq.stripe()].load(Ordering::SeqCst);
        sent.wrapping_sub(1) & ORDINAL_MASK == seq.ordinal()
    }

    /// A command on every key is about to be queued: counts it in every stripe and returns
    /// its ordinal in each. Call with every shard of the set's inbox locked
    /// (`Inbox::lock_every_shard`): counted one stripe at a time, it must not interleave with
    /// another send's counts, or a thread's two commands on two stripes could fall one before
    /// it and one after it in the wrong order, and the actor's merge would wait for good (a
    /// loom model found exactly that).
    pub(crate) fn sending_everywhere(&self) -> Ordinals {
        let mut ordinals = Box::new([0; STRIPES]);
        for (ordinal, sent) in ordinals.iter_mut().zip(self.sent.iter()) {
            *ordinal = sent.fetch_add(1, Ordering::SeqCst) & ORDINAL_MASK;
        }
        ordinals
    }

    /// Each stripe's count of commands applied (modulo the ordinals' range), into `next`: the
    /// ordinal of the next command to apply there. For the actor.
    pub(crate) fn applied_into(&self, next: &mut [u32; STRIPES]) {
        for (next, applied) in next.iter_mut().zip(self.applied.iter()) {
            *next = applied.load(Ordering::Relaxed) & ORDINAL_MASK;
        }
    }

    /// The actor applied a command on a key of `stripe`; what it did to words is published
    /// with the count.
    pub(crate) fn applied(&self, stripe: usize) {
        let applied = &self.applied[stripe];
        applied.store(
            applied.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Release,
        );
    }

    /// The actor applied a command on every key.
    pub(crate) fn applied_everywhere(&self) {
        for stripe in 0..STRIPES {
            self.applied(stripe);
        }
    }

    /// How many commands have been counted in `stripe` so far: a mark for
    /// [`applied_past`](Self::applied_past). Sequentially consistent with the counts, so a
    /// command not included was counted after this call.
    pub(crate) fn mark(&self, stripe: usize) -> u32 {
        self.sent[stripe].load(Ordering::SeqCst)
    }

    /// Whether every command counted in `stripe` before `mark` was taken has been applied.
    /// For the actor, which alone counts commands applied.
    pub(crate) fn applied_past(&self, stripe: usize, mark: u32) -> bool {
        // Counts wrap; a stripe never has 2^31 commands in flight.
        self.applied[stripe]
            .load(Ordering::Relaxed)
            .wrapping_sub(mark) as i32
            >= 0
    }

    /// Whether every command counted in `stripe` so far has been applied (and its effect on
    /// any word is visible to the caller).
    pub(crate) fn is_quiet(&self, stripe: usize) -> bool {
        self.applied[stripe].load(Ordering::Acquire) == self.sent[stripe].load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(loom)))]
mod tests;

/// Model checks of the races a keyed entry's word sees, and of the ledger's promise that a
/// handle's direct store never overtakes a command made before it. Run with
/// `RUSTFLAGS="--cfg loom" cargo test --release --lib loom_model`.
#[cfg(all(test, loom))]
mod loom_model;
