//! Puts a keyed set's commands back in the order they were made.
//!
//! Handles queue commands into per-thread inbox shards, so threads never share a lock (one
//! shared lock cost ~40 % of the CPU with 8 producer tasks on 2 workers). The actor takes the
//! shards one by one, and a shard may hold a command made after one still in another shard: a
//! task that moved between workers, or one acting after seeing another's command.
//!
//! Each command that acts on a key carries its place in its key's stripe ([`Seq`]), counted
//! by the [`Ledger`] under its shard's lock just before it is queued; a command on every key
//! (a drain, a `len`) carries an ordinal in every stripe. [`Merge`] takes the shards' queues
//! and hands the commands on in an order that applies each stripe's commands by ordinal: it
//! passes a shard's commands on while the one in front is next in its stripe, and turns to
//! another shard when it is not. That costs one comparison per command and moves nothing
//! aside.
//!
//! It never stalls for good. Counting happens under the shard's lock, so each shard's queue is
//! in counting order; and counting is one sequentially consistent read-modify-write (a command
//! on every key counts with every shard locked, so no other count falls in its middle), so
//! all counts are totally ordered. The earliest-counted command not yet handed on is at the front
//! of its shard, and every command counted before it in its stripe is handed on — or was never
//! queued yet: its sender is between counting and queueing (a few instructions, under that
//! shard's lock). So a shard waits only for a command queued into a shard after the actor took
//! that shard ([`Merge::waiting`]: the actor looks again at once). A refused send (the actor
//! has stopped) counts nothing, so once stopped nothing waits.

use std::collections::VecDeque;

use crate::timer::keyed::{Ordinals, STRIPES, Seq};

/// Where a command stands in the set's order.
#[derive(Debug)]
pub(crate) enum Place<'a> {
    /// Commutes with every command (an advance, which only reads the entry's word).
    Free,
    /// Counted in one stripe.
    In(Seq),
    /// Counted in every stripe, with its ordinal in each.
    Everywhere(&'a Ordinals),
}

/// A command that knows its place.
pub(crate) trait Placed {
    fn place(&self) -> Place<'_>;
}

/// The shards' commands taken and not yet handed on, and each stripe's next ordinal.
#[derive(Debug)]
pub(crate) struct Merge<C> {
    /// One queue per inbox shard, each in the order it was counted.
    shards: Box<[VecDeque<C>]>,
    /// Per stripe, the ordinal of the next command to hand on.
    next: Box<[u32; STRIPES]>,
}

impl<C: Placed> Merge<C> {
    pub(crate) fn new(shards: usize) -> Self {
        Merge {
            shards: (0..shards).map(|_| VecDeque::new()).collect(),
            next: Box::new([0; STRIPES]),
        }
    }

    /// The queues to take the inbox's shards into.
    pub(crate) fn shards(&mut self) -> &mut [VecDeque<C>] {
        &mut self.shards
    }

    /// Moves commands whose turn has come to the back of `into`, in an order that keeps each
    /// stripe's, up to about `limit` of them (so a flood's take is handed on in steps, between
    /// which the actor applies, fires and yields). Returns how many it moved; fewer than
    /// `limit` once the rest waits for commands still on their way (or there is no rest).
    pub(crate) fn hand_on(&mut self, into: &mut VecDeque<C>, limit: usize) -> usize {
        let mut total = 0;
        loop {
            let mut moved = 0;
            for shard in self.shards.iter_mut() {
                // The run of commands whose turn has come, moved at once.
                let run = shard
                    .iter()
                    .take(limit.saturating_sub(total + moved).max(1))
                    .take_while(|command| take_turn(&mut self.next, command.place()))
                    .count();
                into.extend(shard.drain(..run));
                moved += run;
            }
            total += moved;
            if moved == 0 || total >= limit {
                return total;
            }
        }
    }

    /// Whether commands wait for one counted before them: the actor must look at its inbox
    /// again soon, and must not fire as if everything taken were applied.
    pub(crate) fn waiting(&self) -> bool {
        self.shards.iter().any(|shard| !shard.is_empty())
    }

    /// The actor has stopped and the shards are taken for the last time: hands every command
    /// on. (None waits by then: a send counts its command only once it may queue it.)
    pub(crate) fn stopped(&mut self, into: &mut VecDeque<C>) {
        self.hand_on(into, usize::MAX);
        debug_assert!(!self.waiting(), "a counted command was never queued");
        for shard in self.shards.iter_mut() {
            into.append(shard);
        }
    }

    /// Gives back the queues' memory after a flood, once nothing waits.
    pub(crate) fn shrink(&mut self) {
        for shard in self.shards.iter_mut() {
            if shard.is_empty() {
                *shard = VecDeque::new();
            }
        }
    }

    /// Whether a flood left large queues behind.
    pub(crate) fn holds_memory(&self) -> bool {
        self.shards.iter().any(|shard| shard.capacity() > 1024)
    }
}

/// Whether a command at `place` is next in every stripe it counts in; if so, it takes its
/// turn there.
fn take_turn(next: &mut [u32; STRIPES], place: Place<'_>) -> bool {
    let bump = |ordinal: u32| ordinal.wrapping_add(1) & Seq::ORDINAL_MASK;
    match place {
        Place::Free => true,
        Place::In(seq) => {
            let next = &mut next[seq.stripe()];
            let its_turn = *next == seq.ordinal();
            if its_turn {
                *next = bump(*next);
            }
            its_turn
        }
        Place::Everywhere(ordinals) => {
            let its_turn = next.iter().zip(ordinals.iter()).all(|(n, o)| n == o);
            if its_turn {
                for next in next.iter_mut() {
                    *next = bump(*next);
                }
            }
            its_turn
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::timer::keyed::Ledger;

    /// A command for the tests: a name and a place.
    #[derive(Debug)]
    enum Command {
        One(&'static str, Seq),
        Every(&'static str, Ordinals),
    }

    impl Placed for Command {
        fn place(&self) -> Place<'_> {
            match self {
                Command::One(_, seq) => Place::In(*seq),
                Command::Every(_, ordinals) => Place::Everywhere(ordinals),
            }
        }
    }

    fn names(into: &VecDeque<Command>) -> Vec<&'static str> {
        into.iter()
            .map(|command| match command {
                Command::One(name, _) | Command::Every(name, _) => *name,
            })
            .collect()
    }

    #[test]
    fn each_stripe_is_handed_on_in_the_order_it_was_counted() {
        let ledger = Ledger::default();
        let mut merge = Merge::new(2);
        let a = ledger.sending(3);
        let b = ledger.sending(3);
        let c = ledger.sending(3);
        let other = ledger.sending(4);
        // Shard 0 has a and c (one thread), shard 1 has b and other (another).
        merge.shards()[0].extend([Command::One("a", a), Command::One("c", c)]);
        merge.shards()[1].extend([Command::One("b", b), Command::One("other", other)]);
        let mut into = VecDeque::new();
        merge.hand_on(&mut into, usize::MAX);
        assert_eq!(names(&into), ["a", "b", "other", "c"]);
        assert!(!merge.waiting());
    }

    #[test]
    fn a_command_waits_for_one_counted_before_it_still_on_its_way() {
        let ledger = Ledger::default();
        let mut merge = Merge::new(2);
        let on_its_way = ledger.sending(7);
        let after = ledger.sending(7);
        let elsewhere = ledger.sending(8);
        merge.shards()[0].extend([Command::One("after", after), Command::One("x", elsewhere)]);
        let mut into = VecDeque::new();
        merge.hand_on(&mut into, usize::MAX);
        assert!(into.is_empty(), "x is behind a command that waits");
        assert!(merge.waiting());
        merge.shards()[1].push_back(Command::One("first", on_its_way));
        merge.hand_on(&mut into, usize::MAX);
        assert_eq!(names(&into), ["first", "after", "x"]);
        assert!(!merge.waiting());
    }

    #[test]
    fn a_command_on_every_key_comes_after_those_before_and_before_those_after() {
        let ledger = Ledger::default();
        let mut merge = Merge::new(3);
        let before = ledger.sending(1);
        let drain = ledger.sending_everywhere();
        let after = ledger.sending(1);
        let elsewhere = ledger.sending(2);
        merge.shards()[0].extend([Command::One("after", after)]);
        merge.shards()[1].extend([
            Command::Every("drain", drain),
            Command::One("elsewhere", elsewhere),
        ]);
        merge.shards()[2].extend([Command::One("before", before)]);
        let mut into = VecDeque::new();
        merge.hand_on(&mut into, usize::MAX);
        let names = names(&into);
        assert_eq!(names.len(), 4);
        let at = |name| names.iter().position(|n| *n == name).unwrap();
        assert!(at("before") < at("drain"));
        assert!(at("drain") < at("after"));
        assert!(at("drain") < at("elsewhere"));
    }
}

/// Model checks of the hand-off from per-thread shards to the merge: a command made after
/// another (here: by a thread that saw the first one's send return) is never handed on before
/// it, whichever shard each went to and however the actor's takes interleave; and nothing
/// waits once every send has returned. Run with
/// `RUSTFLAGS="--cfg loom" cargo test --release --lib loom_model`.
#[cfg(all(test, loom))]
mod loom_model {
    use std::collections::VecDeque;

    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, Ordering};
    use loom::thread;

    use super::*;
    use crate::actor::inbox::{Inbox, Urgency};
    use crate::timer::keyed::Ledger;

    #[derive(Debug)]
    enum Command {
        One(&'static str, Seq),
        Every(&'static str, Ordinals),
    }

    impl Placed for Command {
        fn place(&self) -> Place<'_> {
            match self {
                Command::One(_, seq) => Place::In(*seq),
                Command::Every(_, ordinals) => Place::Everywhere(ordinals),
            }
        }
    }

    fn name(command: &Command) -> &'static str {
        match command {
            Command::One(name, _) | Command::Every(name, _) => name,
        }
    }

    /// Thread A sends `x` (stripe 0) into shard 0, then flags it; thread B, on shard 1, sends
    /// `second` (built by `make`) and says whether it saw the flag first. The actor takes
    /// once while they run and once after.
    fn race(every: bool, make: fn(&Ledger) -> Command, check: fn(bool, &[&'static str])) {
        loom::model(move || {
            let inbox = Arc::new(Inbox::<Command>::new(2));
            let ledger = Arc::new(Ledger::default());
            let sent = Arc::new(AtomicBool::new(false));
            let a = {
                let (inbox, ledger, sent) = (inbox.clone(), ledger.clone(), sent.clone());
                thread::spawn(move || {
                    inbox.send_made(0, Urgency::Lazy, || Command::One("x", ledger.sending(0)));
                    inbox.send_made(0, Urgency::Lazy, || Command::One("z", ledger.sending(1)));
                    sent.store(true, Ordering::Release);
                })
            };
            let b = {
                let (inbox, ledger, sent) = (inbox.clone(), ledger.clone(), sent.clone());
                thread::spawn(move || {
                    let after = sent.load(Ordering::Acquire);
                    let command = || make(&ledger);
                    if every {
                        inbox.send_made_alone(1, Urgency::Lazy, command);
                    } else {
                        inbox.send_made(1, Urgency::Lazy, command);
                    }
                    after
                })
            };
            let mut merge = Merge::new(2);
            let mut out = VecDeque::new();
            inbox.take_each(merge.shards());
            merge.hand_on(&mut out, usize::MAX);
            let after = b.join().unwrap();
            a.join().unwrap();
            inbox.take_each(merge.shards());
            merge.hand_on(&mut out, usize::MAX);
            assert!(
                !merge.waiting(),
                "a command waits after every send returned"
            );
            let names: Vec<_> = out.iter().map(name).collect();
            assert_eq!(names.len(), 3, "a command was lost: {names:?}");
            check(after, &names);
        });
    }

    fn at(names: &[&'static str], name: &str) -> usize {
        names.iter().position(|n| *n == name).unwrap()
    }

    #[test]
    fn a_command_made_after_another_on_its_key_comes_after_it() {
        race(
            false,
            |ledger| Command::One("y", ledger.sending(0)),
            |after, names| {
                if after {
                    assert!(at(names, "x") < at(names, "y"), "{names:?}");
                }
            },
        );
    }

    #[test]
    fn a_command_on_every_key_comes_after_what_was_made_before_it() {
        race(
            true,
            |ledger| Command::Every("len", ledger.sending_everywhere()),
            |after, names| {
                if after {
                    assert!(at(names, "x") < at(names, "len"), "{names:?}");
                    assert!(at(names, "z") < at(names, "len"), "{names:?}");
                }
            },
        );
    }
}
