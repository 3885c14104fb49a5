//! The keyed machine's races, driven deterministically.

use super::*;
use crate::actor::inbox::Urgency;

#[test]
fn commands_and_entries_stay_small() {
    // A flood queues millions of commands: one byte more per command and 2^20 of them
    // outgrow glibc's 32 MiB mmap ceiling, so every flood page-faults afresh.
    assert_eq!(size_of::<KeyedCommand<u64, u64>>(), 32);
    assert_eq!(size_of::<KeyedCommand<u64, ()>>(), 24);
    assert_eq!(size_of::<KeyedCommand<String, ()>>(), 40);
    // The deadline's niche makes the free-slot marker cost nothing.
    assert_eq!(size_of::<Option<Entry<u64, u64>>>(), 24);
}

/// The interleaving behind the race of a handle's later `reset` with expiry, made
/// deterministic: the actor's turn has taken the inbox; the handle, its move held behind a
/// command in flight, counts and queues it and returns — before the old deadline; then the
/// actor reads the clock (past the old deadline) and fires. The entry must wait for the
/// move, not fire at the old deadline.
#[tokio::test(start_paused = true)]
async fn a_queued_handle_move_is_never_lost_to_the_expiry_it_races() {
    let Bench {
        shared,
        mut machine,
        mut expired,
    } = Bench::new();
    let mut delta = Default::default();
    let mut ctx = Ctx {
        shared: &shared,
        delta: &mut delta,
    };
    let (word, id) = insert_with_handle(&mut machine, &mut ctx, 1, ms(5));
    let target = || Target::Filed {
        id,
        word: Arc::as_ptr(&word) as usize,
    };
    // The handle counts its move and queues it; the actor has not taken it.
    let seq = count_sent(&machine, 1);
    word.sending();
    let queued = KeyedCommand::Move(Box::new((target(), ms(50))), seq);
    // The actor fires at 6 ms (the old deadline was 5 ms).
    machine.fire(ms(6) as u64, FIRE_FOR_TEST, Backlog::Applied, &mut ctx);
    assert!(expired.try_recv().is_err(), "fired at the old deadline");
    assert_eq!(word.load(), (false, ms(5)));
    // Its next turn takes the move; the entry then fires at the new deadline only.
    machine.apply(queued, &mut ctx);
    machine.fire(ms(7) as u64, FIRE_FOR_TEST, Backlog::Applied, &mut ctx);
    machine.fire(ms(49) as u64, FIRE_FOR_TEST, Backlog::Applied, &mut ctx);
    assert!(expired.try_recv().is_err(), "fired before the new deadline");
    machine.fire(ms(50) as u64, FIRE_FOR_TEST, Backlog::Applied, &mut ctx);
    match expired.try_recv() {
        Ok(Delivery::Fired(expiry)) => assert_eq!(expiry.deadline, ms(50)),
        _ => panic!("not fired at the new deadline"),
    }
    assert_eq!(word.load(), (true, ms(50)));
}

/// Handles that keep a command in flight at every moment (two threads moving one entry in
/// turn) hold its word marked for good. Only the commands counted before the actor found the
/// entry due may hold it back: once those are applied, it fires though newer ones are still
/// in flight (they were made after its deadline had passed).
#[tokio::test(start_paused = true)]
async fn an_entry_held_by_a_stream_of_commands_fires_once_those_made_before_it_was_due_are_applied()
{
    let Bench {
        shared,
        mut machine,
        mut expired,
    } = Bench::new();
    let mut delta = Default::default();
    let mut ctx = Ctx {
        shared: &shared,
        delta: &mut delta,
    };
    let (word, id) = insert_with_handle(&mut machine, &mut ctx, 1, ms(5));
    let queue_move = |machine: &KeyedMachine<u32, u32>, to| {
        let seq = count_sent(machine, 1);
        word.sending();
        let target = Target::Filed {
            id,
            word: Arc::as_ptr(&word) as usize,
        };
        KeyedCommand::Move(Box::new((target, ms(to))), seq)
    };
    let mut in_flight = queue_move(&machine, 4);
    machine.fire(ms(6) as u64, FIRE_FOR_TEST, Backlog::Applied, &mut ctx);
    assert!(
        expired.try_recv().is_err(),
        "fired past a command in flight"
    );
    // Every turn applies the command in flight while the other thread has queued the next.
    for (turn, to) in [3, 4, 3, 4].into_iter().enumerate() {
        let next = queue_move(&machine, to);
        machine.apply(std::mem::replace(&mut in_flight, next), &mut ctx);
        machine.fire(
            ms(7 + turn as i64) as u64,
            FIRE_FOR_TEST,
            Backlog::Applied,
            &mut ctx,
        );
        if let Ok(Delivery::Fired(expiry)) = expired.try_recv() {
            assert!(expiry.deadline <= ms(7 + turn as i64), "fired early");
            assert!(word.load().0, "its word is gone");
            machine.apply(in_flight, &mut ctx);
            assert!(expired.try_recv().is_err(), "fired twice");
            return;
        }
    }
    panic!("held back for good by commands made after its deadline");
}

/// The same for a by-key command in the middle of a flood's batch: a stripe never quiet
/// holds a due entry back only until the commands counted before it was found due are
/// applied.
#[tokio::test(start_paused = true)]
async fn a_due_entry_in_a_stripe_never_quiet_fires_once_the_commands_before_it_are_applied() {
    let Bench {
        shared,
        mut machine,
        mut expired,
    } = Bench::new();
    let mut delta = Default::default();
    let mut ctx = Ctx {
        shared: &shared,
        delta: &mut delta,
    };
    set_by_key(&mut machine, &mut ctx, 1, ms(5));
    let reset = |machine: &KeyedMachine<u32, u32>, to| KeyedCommand::Reset {
        key: 1,
        deadline: ms(to),
        seq: count_sent(machine, 1),
    };
    let mut in_flight = reset(&machine, 4);
    machine.fire(ms(6) as u64, FIRE_FOR_TEST, Backlog::Unapplied, &mut ctx);
    assert!(
        expired.try_recv().is_err(),
        "fired past a command in its batch"
    );
    let next = reset(&machine, 3);
    machine.apply(std::mem::replace(&mut in_flight, next), &mut ctx);
    machine.fire(ms(7) as u64, FIRE_FOR_TEST, Backlog::Unapplied, &mut ctx);
    match expired.try_recv() {
        Ok(Delivery::Fired(expiry)) => assert_eq!(expiry.deadline, ms(4)),
        _ => panic!("held back by a command made after its deadline"),
    }
}

const FIRE_FOR_TEST: usize = 1024;

#[test]
fn own_deadlines_round_trip_and_never_read_as_shared() {
    for deadline in [0, 1, -1, i64::MAX, i64::MIN + 2] {
        assert_eq!(Due::own(deadline).deadline(), Some(deadline));
    }
    assert_eq!(Due::own(i64::MIN).deadline(), Some(i64::MIN + 2));
    assert_eq!(Due::own(i64::MIN + 1).deadline(), Some(i64::MIN + 2));
    assert_eq!(Due::SHARED.deadline(), None);
}

/// Nanoseconds in `n` milliseconds.
fn ms(n: i64) -> i64 {
    n * 1_000_000
}

/// A keyed machine on a 1 ms tick, driven by hand (no actor, no inbox), and its expirations.
struct Bench {
    shared: Arc<Shared>,
    machine: KeyedMachine<u32, u32>,
    expired: mpsc::UnboundedReceiver<Delivery<u32, u32>>,
}

impl Bench {
    fn new() -> Self {
        let tick = std::time::Duration::from_millis(1);
        let levels = crate::Layout::clock().slots_per_level(tick).unwrap();
        let clock = Clock::new(tokio::time::Instant::now(), tick);
        let handle = tokio::runtime::Handle::current();
        let shared = Arc::new(Shared::new("t".into(), clock, handle, None, levels.clone()));
        let (sender, expired) = mpsc::unbounded_channel();
        let hasher = foldhash::fast::RandomState::default();
        let ledger = Arc::new(Ledger::default());
        let timers = Arc::new(AtomicUsize::new(1));
        let machine = KeyedMachine::new(&levels, clock, sender, hasher, ledger, timers, SHARDS);
        Bench {
            shared,
            machine,
            expired,
        }
    }
}

/// Counts a command on `key` in the ledger, as `Timers` does before queueing it; returns its
/// place.
fn count_sent(machine: &KeyedMachine<u32, u32>, key: u32) -> Seq {
    let stripe = Ledger::stripe(machine.hasher.hash_one(key));
    machine.ledger.sending(stripe)
}

/// An `insert` of `key` (value `key`) due at `deadline`, counted and applied: the entry's
/// word, as its handle holds it, and the id the actor filed it under.
fn insert_with_handle(
    machine: &mut KeyedMachine<u32, u32>,
    ctx: &mut Ctx<'_>,
    key: u32,
    deadline: i64,
) -> (Arc<DeadlineWord>, u32) {
    let word = Arc::new(DeadlineWord::new(deadline));
    let insert = KeyedCommand::Insert {
        key,
        value: key,
        word: word.clone(),
        seq: count_sent(machine, key),
    };
    machine.apply(insert, ctx);
    let id = word.id().expect("filed");
    (word, id)
}

/// A by-key `set` of `key` (value `key`), counted and applied.
fn set_by_key(machine: &mut KeyedMachine<u32, u32>, ctx: &mut Ctx<'_>, key: u32, deadline: i64) {
    let set = set_command(machine, key, deadline);
    machine.apply(set, ctx);
}

/// A by-key `set` of `key` (value `key`), counted, not applied.
fn set_command(
    machine: &KeyedMachine<u32, u32>,
    key: u32,
    deadline: i64,
) -> KeyedCommand<u32, u32> {
    KeyedCommand::Set {
        key,
        value: key,
        deadline,
        seq: count_sent(machine, key),
    }
}

/// The deadline of the expiration delivered, if one was.
fn fired(expired: &mut mpsc::UnboundedReceiver<Delivery<u32, u32>>) -> Option<i64> {
    match expired.try_recv() {
        Ok(Delivery::Fired(expiry)) => Some(expiry.deadline),
        _ => None,
    }
}

/// A flood's turn fires between slices of its batch: a by-key `reset` (or `remove`) made
/// before the deadline may still wait in the batch. The entry must wait for it rather than
/// fire at the old deadline; once the batch is applied, it fires at the new one.
#[tokio::test(start_paused = true)]
async fn a_by_key_reset_waiting_in_a_flood_batch_is_never_lost_to_expiry() {
    let mut bench = Bench::new();
    let mut delta = Default::default();
    let mut ctx = Ctx {
        shared: &bench.shared,
        delta: &mut delta,
    };
    let machine = &mut bench.machine;
    set_by_key(machine, &mut ctx, 1, ms(5));
    // The reset is counted and queued; the actor took it but has not applied it yet.
    let reset = KeyedCommand::Reset {
        key: 1,
        deadline: ms(50),
        seq: count_sent(machine, 1),
    };
    machine.fire(ms(6) as u64, FIRE_FOR_TEST, Backlog::Unapplied, &mut ctx);
    assert_eq!(fired(&mut bench.expired), None, "fired past a queued reset");
    machine.apply(reset, &mut ctx);
    machine.fire(ms(49) as u64, FIRE_FOR_TEST, Backlog::Applied, &mut ctx);
    assert_eq!(
        fired(&mut bench.expired),
        None,
        "fired before the new deadline"
    );
    machine.fire(ms(50) as u64, FIRE_FOR_TEST, Backlog::Applied, &mut ctx);
    assert_eq!(fired(&mut bench.expired), Some(ms(50)));
}

/// With the batch applied, nothing holds a due entry back, however busy its stripe: a by-key
/// command sent after the turn read its clock never starves it.
#[tokio::test(start_paused = true)]
async fn an_applied_batch_fires_due_entries_whatever_is_in_flight() {
    let mut bench = Bench::new();
    let mut delta = Default::default();
    let mut ctx = Ctx {
        shared: &bench.shared,
        delta: &mut delta,
    };
    set_by_key(&mut bench.machine, &mut ctx, 1, ms(5));
    // Sent after the turn read its clock: not in this turn's batch.
    count_sent(&bench.machine, 1);
    let machine = &mut bench.machine;
    machine.fire(ms(6) as u64, FIRE_FOR_TEST, Backlog::Applied, &mut ctx);
    assert_eq!(
        fired(&mut bench.expired),
        Some(ms(5)),
        "a due entry was held back"
    );
}

/// Inbox shards of the machine under test.
const SHARDS: usize = 2;

/// Per-thread shards let the actor take a command before one made earlier on another thread:
/// a `remove` taken before the `set` it follows waits for it, and the set's entry, due
/// meanwhile, never fires (the firing knows commands wait); commands on other keys go on.
#[tokio::test(start_paused = true)]
async fn a_command_taken_before_an_earlier_one_waits_for_it() {
    let mut bench = Bench::new();
    let mut delta = Default::default();
    let mut ctx = Ctx {
        shared: &bench.shared,
        delta: &mut delta,
    };
    let machine = &mut bench.machine;
    let inbox = Inbox::new(SHARDS);
    let send = |shard, command| assert!(inbox.send_made(shard, Urgency::Lazy, || command));
    send(0, set_command(machine, 1, ms(5)));
    assert_eq!(take_and_apply(machine, &inbox, &mut ctx), 1);
    // The actor's next take goes through shard 0; then one thread sets key 1 again there,
    // and another, having seen it return, removes key 1 and sets key 2 on shard 1, which the
    // take goes through next.
    let mut batch = VecDeque::new();
    machine.merge.take_one(&inbox, 0);
    send(0, set_command(machine, 1, ms(20)));
    let remove = KeyedCommand::Remove {
        key: 1,
        seq: count_sent(machine, 1),
    };
    send(1, remove);
    send(1, set_command(machine, 2, ms(30)));
    machine.merge.take_one(&inbox, 1);
    assert!(!machine.refill(&inbox, &mut batch));
    assert!(
        machine.waiting(),
        "the remove waits for the set, the set of key 2 behind it"
    );
    machine.fire(ms(6) as u64, FIRE_FOR_TEST, Backlog::Applied, &mut ctx);
    assert_eq!(
        fired(&mut bench.expired),
        None,
        "fired past a waiting remove"
    );
    // The set again (replacing: one inserted, one cancelled), the remove, the set of key 2.
    assert_eq!(take_and_apply(machine, &inbox, &mut ctx), 4);
    assert!(!machine.waiting());
    machine.fire(ms(25) as u64, FIRE_FOR_TEST, Backlog::Applied, &mut ctx);
    assert_eq!(
        fired(&mut bench.expired),
        None,
        "the remove came after the set"
    );
    assert_eq!(machine.index.len, 1, "key 1 removed, key 2 set");
    machine.fire(ms(30) as u64, FIRE_FOR_TEST, Backlog::Applied, &mut ctx);
    assert_eq!(fired(&mut bench.expired), Some(ms(30)));
}

/// One actor turn's take and apply, by hand; returns how many entries it inserted or
/// cancelled (commands that wait in the merge do nothing yet).
fn take_and_apply(
    machine: &mut KeyedMachine<u32, u32>,
    inbox: &Inbox<KeyedCommand<u32, u32>>,
    ctx: &mut Ctx<'_>,
) -> u64 {
    let before = ctx.delta.inserted + ctx.delta.cancelled;
    let mut batch = VecDeque::new();
    machine.take(inbox, &mut batch);
    loop {
        while let Some(command) = batch.pop_front() {
            machine.apply(command, ctx);
        }
        if !machine.refill(inbox, &mut batch) {
            break;
        }
    }
    ctx.delta.inserted + ctx.delta.cancelled - before
}
