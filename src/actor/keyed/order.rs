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

use super::super::inbox::Inbox;
use crate::timer::keyed::{Ledger, Ordinals, STRIPES, Seq};

/// Commands a shard hands on before the next shard's turn, in a checked hand-on.
const QUANTUM: usize = 256;

/// Where a command stands in the set's order.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Place<'a> {
    /// Commutes with every command (an advance, which only reads the entry's word).
    Free,
    /// Counted in one stripe.
    In(Seq),
    /// Counted in every stripe, with its ordinal in each.
    Everywhere(&'a Ordinals),
}

/// What applying a command counts in the ledger, read from its place before the command goes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Counted {
    Not,
    In(usize),
    Everywhere,
}

impl Counted {
    pub(crate) fn of(place: Place<'_>) -> Self {
        match place {
            Place::Free => Counted::Not,
            Place::In(seq) => Counted::In(seq.stripe()),
            Place::Everywhere(_) => Counted::Everywhere,
        }
    }

    /// Counts the command applied; what it did to words is published with the count.
    pub(crate) fn applied(self, ledger: &Ledger) {
        match self {
            Counted::Not => {}
            Counted::In(stripe) => ledger.applied(stripe),
            Counted::Everywhere => ledger.applied_everywhere(),
        }
    }
}

/// A command that knows its place.
pub(crate) trait Placed {
    fn place(&self) -> Place<'_>;
}

/// The shards' commands taken and not yet handed on.
#[derive(Debug)]
pub(crate) struct Merge<C> {
    /// One queue per inbox shard, each in the order it was counted.
    shards: Box<[VecDeque<C>]>,
    /// Per stripe, the ordinal of the next command to hand on (scratch of a checked hand-on).
    next: Box<[u32; STRIPES]>,
}

impl<C: Placed> Merge<C> {
    pub(crate) fn new(shards: usize) -> Self {
        Merge {
            shards: (0..shards).map(|_| VecDeque::new()).collect(),
            next: Box::new([0; STRIPES]),
        }
    }

    /// Takes every shard of `inbox` in (`Inbox::take_each`); returns how many commands.
    pub(crate) fn take(&mut self, inbox: &Inbox<C>) -> usize {
        inbox.take_each(&mut self.shards)
    }

    /// Takes one shard of `inbox` in (tests: a send can then land between two shards' takes).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn take_one(&mut self, inbox: &Inbox<C>, shard: usize) -> usize {
        inbox.take_one(shard, &mut self.shards[shard])
    }

    /// Stops `inbox` and takes its shards in for the last time (`Inbox::stop_each`).
    pub(crate) fn stop(&mut self, inbox: &Inbox<C>) -> usize {
        inbox.stop_each(&mut self.shards)
    }

    /// Moves commands whose turn has come into `into`, in an order that keeps each stripe's,
    /// up to about `limit` of them (a flood's take goes in steps, between which the actor
    /// applies, fires and yields). Returns how many it moved; fewer than `limit` once the rest
    /// waits for commands still on their way (or there is no rest).
    ///
    /// `into` must be empty, and everything handed on before applied (and counted in
    /// `ledger`): a checked hand-on starts from the ledger's counts.
    ///
    /// The common case costs nothing per command: when a single shard (`lone`) holds every
    /// command taken and not handed on — one thread sent them all — and the shards the take
    /// went through before it are still empty, that shard goes whole, as it is. Its queue is in
    /// counting order; and a command counted before one of its commands but not yet taken
    /// would be in a shard taken before it (a shard taken after it was taken after that count,
    /// whose critical section — under that shard's lock — the take waited for): counted after
    /// that shard was taken, so found there now, or being pushed, which the look waits for.
    pub(crate) fn hand_on(
        &mut self,
        into: &mut VecDeque<C>,
        limit: usize,
        inbox: &Inbox<C>,
        ledger: &Ledger,
    ) -> usize {
        debug_assert!(into.is_empty());
        let mut busy = self
            .shards
            .iter()
            .enumerate()
            .filter(|(_, shard)| !shard.is_empty());
        if let (Some((lone, _)), None) = (busy.next(), busy.next()) {
            if inbox.empty_before(lone) {
                std::mem::swap(into, &mut self.shards[lone]);
                return into.len();
            }
        }
        ledger.applied_into(&mut self.next);
        self.hand_on_checked(into, limit)
    }

    /// Checks each command's turn against `next`, shard by shard, moving runs whose turn has
    /// come. Shards take turns a [`QUANTUM`] at a time: a shard with a long queue must not
    /// starve the others (a command of one waits for its stripe's earlier commands in another,
    /// and a flooding thread would keep the one it floods ahead for good).
    fn hand_on_checked(&mut self, into: &mut VecDeque<C>, limit: usize) -> usize {
        let mut total = 0;
        loop {
            let mut moved = 0;
            for shard in self.shards.iter_mut() {
                // The run of commands whose turn has come, moved at once.
                let room = limit.saturating_sub(total + moved).clamp(1, QUANTUM);
                let run = shard
                    .iter()
                    .take(room)
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
    /// on, after those in `into` (taken before, not applied yet). None waits by then: a send
    /// counts its command only once it may queue it.
    pub(crate) fn stopped(&mut self, into: &mut VecDeque<C>, ledger: &Ledger) {
        ledger.applied_into(&mut self.next);
        for command in into.iter() {
            take_turn_anyway(&mut self.next, command.place());
        }
        self.hand_on_checked(into, usize::MAX);
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

/// Whether a command at `place` is next in every stripe it counts in.
fn is_turn(next: &[u32; STRIPES], place: Place<'_>) -> bool {
    match place {
        Place::Free => true,
        Place::In(seq) => next[seq.stripe()] == seq.ordinal(),
        Place::Everywhere(ordinals) => next.iter().zip(ordinals.iter()).all(|(n, o)| n == o),
    }
}

/// Counts a command at `place` handed on, in every stripe it counts in.
fn take_turn_anyway(next: &mut [u32; STRIPES], place: Place<'_>) {
    let bump = |next: &mut u32| *next = next.wrapping_add(1) & Seq::ORDINAL_MASK;
    match place {
        Place::Free => {}
        Place::In(seq) => bump(&mut next[seq.stripe()]),
        Place::Everywhere(_) => next.iter_mut().for_each(bump),
    }
}

/// Whether a command at `place` is next in every stripe it counts in; if so, it takes its
/// turn there.
fn take_turn(next: &mut [u32; STRIPES], place: Place<'_>) -> bool {
    let its_turn = is_turn(next, place);
    if its_turn {
        take_turn_anyway(next, place);
    }
    its_turn
}

/// What the unit tests and the loom models share: named commands, and an actor's turn.
#[cfg(test)]
mod fixture {
    use std::collections::VecDeque;

    use super::*;

    /// A command with a name and a place.
    #[derive(Debug)]
    pub(super) enum Command {
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

    pub(super) fn name(command: &Command) -> &'static str {
        match command {
            Command::One(name, _) | Command::Every(name, _) => name,
        }
    }

    /// An actor's turn: takes the inbox in, then hands on (`limit` at a time) and "applies"
    /// (counts in the ledger, names into `applied`) until nothing more comes.
    pub(super) fn turn(
        inbox: &Inbox<Command>,
        merge: &mut Merge<Command>,
        ledger: &Ledger,
        limit: usize,
        applied: &mut Vec<&'static str>,
    ) {
        merge.take(inbox);
        let mut batch = VecDeque::new();
        while merge.hand_on(&mut batch, limit, inbox, ledger) > 0 {
            for command in batch.drain(..) {
                Counted::of(command.place()).applied(ledger);
                applied.push(name(&command));
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::fixture::{Command, name, turn};
    use super::*;
    use crate::actor::inbox::Urgency;

    /// An inbox, its merge and a ledger, driven by hand as an actor would.
    struct Bench {
        inbox: Inbox<Command>,
        merge: Merge<Command>,
        ledger: Ledger,
        applied: Vec<&'static str>,
    }

    impl Bench {
        fn new(shards: usize) -> Self {
            Bench {
                inbox: Inbox::new(shards),
                merge: Merge::new(shards),
                ledger: Ledger::default(),
                applied: Vec::new(),
            }
        }

        fn queue(&self, shard: usize, command: Command) {
            assert!(self.inbox.send_made(shard, Urgency::Lazy, || command));
        }

        /// A turn, handing on two commands at a time.
        fn turn(&mut self) {
            turn(
                &self.inbox,
                &mut self.merge,
                &self.ledger,
                2,
                &mut self.applied,
            );
        }
    }

    #[test]
    fn each_stripe_is_handed_on_in_the_order_it_was_counted() {
        let mut bench = Bench::new(2);
        let ledger = &bench.ledger;
        let (a, b, c, other) = (
            ledger.sending(3),
            ledger.sending(3),
            ledger.sending(3),
            ledger.sending(4),
        );
        // Shard 0 got a and c (one thread), shard 1 b and other (another).
        bench.queue(0, Command::One("a", a));
        bench.queue(0, Command::One("c", c));
        bench.queue(1, Command::One("b", b));
        bench.queue(1, Command::One("other", other));
        bench.turn();
        let applied = &bench.applied;
        let at = |name| applied.iter().position(|n| *n == name).unwrap();
        assert_eq!(applied.len(), 4);
        assert!(at("a") < at("b") && at("b") < at("c"), "{applied:?}");
        assert!(!bench.merge.waiting());
        assert!(bench.ledger.is_quiet(3) && bench.ledger.is_quiet(4));
    }

    #[test]
    fn a_lone_shard_goes_whole_in_its_order() {
        let mut bench = Bench::new(4);
        for name in ["x", "y", "z"] {
            let seq = bench.ledger.sending(9);
            bench.queue(2, Command::One(name, seq));
        }
        bench.turn();
        assert_eq!(bench.applied, ["x", "y", "z"]);
        // The next turn's checked hand-on starts where the whole one left the stripe.
        let late = bench.ledger.sending(9);
        let other = bench.ledger.sending(1);
        bench.queue(0, Command::One("other", other));
        bench.queue(3, Command::One("late", late));
        bench.turn();
        assert_eq!(bench.applied, ["x", "y", "z", "other", "late"]);
    }

    /// A flooding thread's shard must not starve the others: one hand-on moves a fair share
    /// from every shard whose commands are due, however long the first one's queue.
    #[test]
    fn a_long_queue_does_not_starve_the_other_shards() {
        let mut bench = Bench::new(2);
        for _ in 0..4 * QUANTUM {
            let seq = bench.ledger.sending(1);
            bench.queue(0, Command::One("flood", seq));
        }
        for _ in 0..QUANTUM {
            let seq = bench.ledger.sending(2);
            bench.queue(1, Command::One("other", seq));
        }
        bench.merge.take(&bench.inbox);
        let mut batch = VecDeque::new();
        let handed = bench
            .merge
            .hand_on(&mut batch, 2 * QUANTUM, &bench.inbox, &bench.ledger);
        assert_eq!(handed, 2 * QUANTUM);
        let others = batch.iter().filter(|c| name(c) == "other").count();
        assert_eq!(others, QUANTUM, "the second shard got {others} of {handed}");
    }

    /// The actor takes shard 0, then one thread queues `first` there and another, having seen
    /// it return, queues `after` (same stripe) and `behind` into shard 1, which the actor takes
    /// next: `after` waits for `first`, `behind` behind it, until the next take.
    #[test]
    fn a_command_waits_for_one_queued_into_a_shard_already_taken() {
        let mut bench = Bench::new(2);
        bench.merge.take_one(&bench.inbox, 0);
        let first = bench.ledger.sending(7);
        bench.queue(0, Command::One("first", first));
        let after = bench.ledger.sending(7);
        let behind = bench.ledger.sending(8);
        bench.queue(1, Command::One("after", after));
        bench.queue(1, Command::One("behind", behind));
        bench.merge.take_one(&bench.inbox, 1);
        let mut batch = VecDeque::new();
        let handed = bench
            .merge
            .hand_on(&mut batch, usize::MAX, &bench.inbox, &bench.ledger);
        assert_eq!(handed, 0, "after waits for first, behind is behind it");
        assert!(bench.merge.waiting());
        bench.turn();
        assert_eq!(bench.applied, ["first", "after", "behind"]);
        assert!(!bench.merge.waiting());
    }

    #[test]
    fn a_command_on_every_key_comes_after_those_before_and_before_those_after() {
        let mut bench = Bench::new(3);
        let ledger = &bench.ledger;
        let before = ledger.sending(1);
        let drain = ledger.sending_everywhere();
        let after = ledger.sending(1);
        let elsewhere = ledger.sending(2);
        bench.queue(0, Command::One("after", after));
        bench.queue(1, Command::Every("drain", drain));
        bench.queue(1, Command::One("elsewhere", elsewhere));
        bench.queue(2, Command::One("before", before));
        bench.turn();
        let applied = &bench.applied;
        assert_eq!(applied.len(), 4);
        let at = |name| applied.iter().position(|n| *n == name).unwrap();
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

    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, Ordering};
    use loom::thread;

    use super::fixture::{Command, turn};
    use super::*;
    use crate::actor::inbox::Urgency;

    /// Thread A sends `x` (stripe 0) then `z` (stripe 1) into shard `a_shard`, then flags it;
    /// thread B, on the other shard, sends the command `make` builds and says whether it saw
    /// the flag first. Both placements matter: the actor takes shard 0 first, and hands a lone
    /// shard on whole only if the shards before it are still empty. The actor has one turn
    /// while they run and one after.
    ///
    /// Explored with at most five thread preemptions (both tests ~15 s on two cores; loom's
    /// guide: two or three catch most bugs), every interleaving with `TOKIO_WHEEL_FULL` set
    /// (~2 minutes). `LOOM_MAX_PREEMPTIONS` still sets the bound when given. The bound was
    /// checked against seeded bugs: a lone shard handed on whole without looking at the
    /// shards before it fails both tests (in 0.3 s), and a command on every key counted under
    /// its own shard's lock only fails the second (in 5 s).
    fn race(
        a_shard: usize,
        every: bool,
        make: fn(&Ledger) -> Command,
        check: fn(bool, &[&'static str]),
    ) {
        let mut builder = loom::model::Builder::new();
        if std::env::var_os("TOKIO_WHEEL_FULL").is_none() {
            builder.preemption_bound = builder.preemption_bound.or(Some(5));
        }
        builder.check(move || {
            let inbox = Arc::new(Inbox::<Command>::new(2));
            let ledger = Arc::new(Ledger::default());
            let sent = Arc::new(AtomicBool::new(false));
            let a = {
                let (inbox, ledger, sent) = (inbox.clone(), ledger.clone(), sent.clone());
                thread::spawn(move || {
                    inbox.send_made(a_shard, Urgency::Lazy, || {
                        Command::One("x", ledger.sending(0))
                    });
                    inbox.send_made(a_shard, Urgency::Lazy, || {
                        Command::One("z", ledger.sending(1))
                    });
                    sent.store(true, Ordering::Release);
                })
            };
            let b = {
                let (inbox, ledger, sent) = (inbox.clone(), ledger.clone(), sent.clone());
                thread::spawn(move || {
                    let after = sent.load(Ordering::Acquire);
                    let command = || make(&ledger);
                    if every {
                        inbox.send_made_alone(1 - a_shard, Urgency::Lazy, command);
                    } else {
                        inbox.send_made(1 - a_shard, Urgency::Lazy, command);
                    }
                    after
                })
            };
            let mut merge = Merge::new(2);
            let mut names = Vec::new();
            turn(&inbox, &mut merge, &ledger, usize::MAX, &mut names);
            let after = b.join().unwrap();
            a.join().unwrap();
            turn(&inbox, &mut merge, &ledger, usize::MAX, &mut names);
            assert!(
                !merge.waiting(),
                "a command waits after every send returned"
            );
            assert_eq!(names.len(), 3, "a command was lost: {names:?}");
            check(after, &names);
        });
    }

    fn at(names: &[&'static str], name: &str) -> usize {
        names.iter().position(|n| *n == name).unwrap()
    }

    fn one_key(after: bool, names: &[&'static str]) {
        if after {
            assert!(at(names, "x") < at(names, "y"), "{names:?}");
        }
    }

    fn every_key(after: bool, names: &[&'static str]) {
        if after {
            assert!(at(names, "x") < at(names, "len"), "{names:?}");
            assert!(at(names, "z") < at(names, "len"), "{names:?}");
        }
    }

    #[test]
    fn a_command_made_after_another_on_its_key_comes_after_it() {
        for a_shard in [0, 1] {
            race(
                a_shard,
                false,
                |ledger| Command::One("y", ledger.sending(0)),
                one_key,
            );
        }
    }

    #[test]
    fn a_command_on_every_key_comes_after_what_was_made_before_it() {
        for a_shard in [0, 1] {
            race(
                a_shard,
                true,
                |ledger| Command::Every("len", ledger.sending_everywhere()),
                every_key,
            );
        }
    }
}
