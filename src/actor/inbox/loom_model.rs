//! Model check of the slot protocol (see `timer::pool`): a handle takes a slot, uses it, and
//! withdraws or releases it, while the actor takes commands, touches the slots it has filed,
//! gives released ones back and frees every segment none of whose slots is in use (while a
//! slot of another segment may still be in use). Under loom the pool
//! models each segment's memory as a cell, so any slot access not ordered before the segment
//! is freed is reported. Run with `RUSTFLAGS="--cfg loom" cargo test --release --lib
//! loom_model`.

use std::collections::VecDeque;

use loom::sync::Arc;
use loom::thread;

use super::*;
use crate::timer::pool::Pool;
use crate::timer::state::State;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    Insert(u32),
    Release(u32),
    Withdrawn,
}

impl Placeholder for Command {
    fn placeholder() -> Self {
        Command::Withdrawn
    }
    fn is_placeholder(&self) -> bool {
        *self == Command::Withdrawn
    }
}

/// One actor turn: take, touch filed slots, free released ones, try to shrink.
fn actor_turn(inbox: &Inbox<Command>, pool: &Pool, freed: &mut Vec<Vec<u32>>) {
    let mut batch = VecDeque::new();
    inbox.take_all(&mut batch, freed);
    for command in batch {
        match command {
            Command::Insert(slot) => {
                pool.get(slot).word.on_due(10);
            }
            Command::Release(slot) => freed[0].push(slot),
            Command::Withdrawn => {}
        }
    }
    inbox.release_segments(pool, freed, 0);
}

#[test]
fn a_slot_is_never_freed_while_its_handle_or_the_actor_uses_it() {
    loom::model(|| {
        let pool = Arc::new(Pool::default());
        let inbox = Arc::new(Inbox::new(1));
        let handle = {
            let (pool, inbox) = (pool.clone(), inbox.clone());
            thread::spawn(move || {
                for round in 0..2 {
                    let (slot, position) = inbox
                        .send_with_slot(0, &pool, Urgency::Now, |index, slot| {
                            slot.word.arm(5 + round);
                            Command::Insert(index)
                        })
                        .unwrap();
                    let is_it = |command: &Command| *command == Command::Insert(slot);
                    // As `Sleep::drop`: cancelled only if the actor has it, under the lock.
                    let release = || {
                        pool.get(slot).word.cancel();
                        Command::Release(slot)
                    };
                    inbox.withdraw_or_send(0, position, is_it, slot, release);
                }
            })
        };
        let mut freed = vec![Vec::new()];
        actor_turn(&inbox, &pool, &mut freed);
        actor_turn(&inbox, &pool, &mut freed);
        handle.join().unwrap();
        actor_turn(&inbox, &pool, &mut freed);
        // Everything was given back: the pool shrank to nothing.
        assert_eq!(pool.capacity(), 0);
    });
}

/// Takes a slot for a timer armed at `deadline`, as a sleep's first poll does.
fn file(inbox: &Inbox<Command>, pool: &Pool, deadline: u64) -> (u32, u32) {
    inbox
        .send_with_slot(0, pool, Urgency::Now, |index, slot| {
            slot.word.arm(deadline);
            Command::Insert(index)
        })
        .unwrap()
}

/// Gives a slot back, as `Sleep::drop` does: withdrawn if the actor has not taken it,
/// else cancelled and released under the shard's lock.
fn drop_timer(inbox: &Inbox<Command>, pool: &Pool, (slot, position): (u32, u32)) {
    let is_it = |command: &Command| *command == Command::Insert(slot);
    let release = || {
        pool.get(slot).word.cancel();
        Command::Release(slot)
    };
    inbox.withdraw_or_send(0, position, is_it, slot, release);
}

#[test]
fn a_segment_is_freed_while_a_slot_of_another_stays_in_use() {
    loom::model(|| {
        let pool = Arc::new(Pool::default());
        let inbox = Arc::new(Inbox::new(1));
        // Under loom the first segment holds 2 slots: the third timer, the long one, sits
        // in the second segment.
        let short = [file(&inbox, &pool, 5), file(&inbox, &pool, 6)];
        let long = file(&inbox, &pool, 1_000);
        assert_eq!(Pool::segment_of(long.0), 1);
        let mut freed = vec![Vec::new()];
        // The short timers go while the actor releases segments; the long one's handle
        // uses its slot meanwhile.
        let handle = {
            let (pool, inbox) = (pool.clone(), inbox.clone());
            thread::spawn(move || {
                for timer in short {
                    drop_timer(&inbox, &pool, timer);
                }
                pool.get(long.0).word.move_to(2_000, true);
            })
        };
        actor_turn(&inbox, &pool, &mut freed);
        handle.join().unwrap();
        actor_turn(&inbox, &pool, &mut freed);
        // The first segment is gone, the long timer's stays.
        assert!(!pool.is_allocated(0) && pool.is_allocated(1));
        // Its handle still reaches its slot, and gives it back while the actor looks.
        let handle = {
            let (pool, inbox) = (pool.clone(), inbox.clone());
            thread::spawn(move || {
                assert_eq!(pool.get(long.0).word.deadline(), 2_000);
                drop_timer(&inbox, &pool, long);
            })
        };
        actor_turn(&inbox, &pool, &mut freed);
        handle.join().unwrap();
        actor_turn(&inbox, &pool, &mut freed);
        assert_eq!(pool.capacity(), 0);
    });
}

#[test]
fn a_command_due_before_the_actors_next_look_is_never_missed() {
    loom::model(|| {
        let inbox = Arc::new(Inbox::new(1));
        // The actor was to look at 200; it now moves its next look to 300, then checks
        // for commands. A sender due at 250 must either wake it or be seen by the check.
        inbox.publish_next_look(Some(200), 0);
        let sender = {
            let inbox = inbox.clone();
            thread::spawn(move || {
                inbox.send(0, Command::Withdrawn, Urgency::By(250)).unwrap();
            })
        };
        inbox.publish_next_look(Some(300), 0);
        let seen = inbox.has_pending();
        sender.join().unwrap();
        assert!(seen || inbox.state_notified(0), "neither woken nor seen");
    });
}

#[test]
fn a_lazy_command_is_never_stranded_when_the_actor_stops_looking_soon() {
    loom::model(|| {
        let inbox = Arc::new(Inbox::new(1));
        // Commands were flowing: the actor had a look armed within the lazy bound. Its
        // last turn took nothing, so it arms no other look, then checks for commands. A
        // release sent meanwhile must either wake it or be seen by the check: otherwise
        // it would wait for the next real deadline (an hour away, say).
        inbox.publish_next_look(Some(LAZY_BOUND), 0);
        let sender = {
            let inbox = inbox.clone();
            thread::spawn(move || {
                inbox.send(0, Command::Withdrawn, Urgency::Lazy).unwrap();
            })
        };
        inbox.publish_next_look(None, 0);
        let seen = inbox.has_pending();
        sender.join().unwrap();
        assert!(seen || inbox.state_notified(0), "neither woken nor seen");
    });
}

#[test]
fn a_send_into_a_shard_flagged_before_is_never_missed() {
    loom::model(|| {
        let inbox = Arc::new(Inbox::new(1));
        inbox.publish_next_look(Some(200), 0);
        // A first send flags the shard (due late: no wake-up); a second one into the same
        // shard, due at 250, skips the flag's store and fence if the actor has not taken the
        // shard since. Meanwhile the actor takes, moves its next look to 300 and checks: the
        // second command must be taken, seen by the check, or wake it.
        inbox
            .send(0, Command::Release(1), Urgency::By(1_000))
            .unwrap();
        let sender = {
            let inbox = inbox.clone();
            thread::spawn(move || {
                inbox
                    .send(0, Command::Release(2), Urgency::By(250))
                    .unwrap();
            })
        };
        let mut taken = VecDeque::new();
        inbox.take_all(&mut taken, &mut []);
        inbox.publish_next_look(Some(300), 0);
        let seen = inbox.has_pending();
        sender.join().unwrap();
        let took = taken.contains(&Command::Release(2));
        assert!(
            took || seen || inbox.state_notified(0),
            "second send missed"
        );
    });
}

#[test]
fn a_withdrawn_registration_never_reaches_the_actor() {
    loom::model(|| {
        let pool = Arc::new(Pool::default());
        let inbox = Arc::new(Inbox::new(1));
        let (slot, position) = inbox
            .send_with_slot(0, &pool, Urgency::Now, |index, slot| {
                slot.word.arm(5);
                Command::Insert(index)
            })
            .unwrap();
        let actor = {
            let (pool, inbox) = (pool.clone(), inbox.clone());
            thread::spawn(move || {
                let mut batch = VecDeque::new();
                inbox.take_all(&mut batch, &mut []);
                for command in &batch {
                    if let Command::Insert(slot) = command {
                        pool.get(*slot).word.on_due(1);
                    }
                }
                batch
            })
        };
        let is_it = |command: &Command| *command == Command::Insert(slot);
        let release = || {
            pool.get(slot).word.cancel();
            Command::Release(slot)
        };
        let withdrawn = inbox.withdraw_or_send(0, position, is_it, slot, release);
        let seen = actor.join().unwrap();
        // Either the actor took the registration (and it was not withdrawn: the release
        // is queued), or it took nothing or the placeholder.
        assert_eq!(seen.contains(&Command::Insert(slot)), !withdrawn);
        if withdrawn {
            assert_eq!(pool.get(slot).word.state(), State::Armed);
        }
    });
}

#[test]
fn a_fired_timer_given_back_by_its_handle_is_never_freed_under_the_actor() {
    loom::model(|| {
        let pool = Arc::new(Pool::default());
        let inbox = Arc::new(Inbox::new(1));
        let timer = file(&inbox, &pool, 5);
        let mut freed = vec![Vec::new()];
        let mut batch = VecDeque::new();
        inbox.take_all(&mut batch, &mut freed);
        assert_eq!(batch.pop_front(), Some(Command::Insert(timer.0)));
        // The handle polls: if the actor fired the timer (and so unfiled it), its drop gives
        // the slot straight back; else it releases it as before.
        let handle = {
            let (pool, inbox) = (pool.clone(), inbox.clone());
            thread::spawn(move || {
                if pool.get(timer.0).word.state() == State::Fired {
                    assert!(inbox.give_back(0, timer.0));
                } else {
                    drop_timer(&inbox, &pool, timer);
                }
            })
        };
        // The actor fires it, then wakes its task: the slot's last touch by the actor.
        let slot = pool.get(timer.0);
        if slot.word.on_due(10) == crate::timer::state::Due::Fire(5) {
            slot.waker.wake();
        }
        // Its next turn may free the segment while the handle is still at it.
        actor_turn(&inbox, &pool, &mut freed);
        handle.join().unwrap();
        actor_turn(&inbox, &pool, &mut freed);
        assert_eq!(pool.capacity(), 0);
    });
}

#[test]
fn while_the_actor_watches_for_returns_a_fired_timer_releases_through_it() {
    loom::model(|| {
        let pool = Arc::new(Pool::default());
        let inbox = Arc::new(Inbox::new(1));
        let timer = file(&inbox, &pool, 5);
        let mut freed = vec![Vec::new()];
        let mut batch = VecDeque::new();
        inbox.take_all(&mut batch, &mut freed);
        pool.get(timer.0).word.on_due(10);
        let handle = {
            let inbox = inbox.clone();
            thread::spawn(move || {
                if !inbox.give_back(0, timer.0) {
                    inbox
                        .send(0, Command::Release(timer.0), Urgency::Lazy)
                        .unwrap();
                }
            })
        };
        // A memory release: watch, count, and keep watching while anything is held.
        inbox.watch_returns(true);
        inbox.release_segments(&pool, &mut freed, 0);
        let held = pool.capacity() > 0;
        inbox.watch_returns(held);
        handle.join().unwrap();
        // A slot that came back after the count reached the actor as a release: the next
        // pass frees the segment.
        actor_turn(&inbox, &pool, &mut freed);
        assert_eq!(pool.capacity(), 0);
    });
}
