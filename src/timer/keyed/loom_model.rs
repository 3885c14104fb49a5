//! Model checks of the races a keyed entry's word sees, and of the ledger's promise that a
//! handle's direct store never overtakes a command made before it (included from `keyed.rs`).
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release --lib loom_model`.

use loom::sync::{Arc, Mutex};
use loom::thread;

use super::*;

#[test]
fn a_postpone_racing_expiry_fires_once_and_never_early() {
    loom::model(|| {
        let word = Arc::new(DeadlineWord::new(5));
        let handle = {
            let word = word.clone();
            thread::spawn(move || word.move_to(50))
        };
        // The actor looks at the entry at time 5.
        let due = word.on_due(5, None);
        let moved = handle.join().unwrap();
        match (due, moved) {
            // Fired first, for the deadline it had: the move did nothing.
            (Due::Fire(5), Moved::Gone) => assert_eq!(word.load(), (true, 5)),
            // Moved first: the actor files it again for the new deadline.
            (Due::Later(50), Moved::Later) => assert_eq!(word.load(), (false, 50)),
            other => panic!("unexpected {other:?}"),
        }
    });
}

#[test]
fn a_move_racing_removal_is_refused_or_overtaken() {
    loom::model(|| {
        let word = Arc::new(DeadlineWord::new(5));
        let handle = {
            let word = word.clone();
            thread::spawn(move || word.move_to(1))
        };
        let had = word.retire();
        let moved = handle.join().unwrap();
        match moved {
            Moved::Gone => assert_eq!(had, 5),
            Moved::Earlier => assert_eq!(had, 1),
            Moved::Later => panic!("1 is earlier than 5"),
        }
        assert_eq!(word.load(), (true, had));
    });
}

/// A handle's move that had to queue (its stripe was busy) races the actor firing the
/// entry at its old deadline — a flood's turn, which fires with commands taken but not yet
/// applied, or before it takes the move. Either the move is registered first and the entry
/// is held until it is applied, then due at the new deadline only; or the entry fired
/// first and the handle sees it gone (its `reset` returned after the actor's clock read).
#[test]
fn a_queued_move_registered_before_the_firing_always_wins() {
    loom::model(|| {
        let word = Arc::new(DeadlineWord::new(5));
        let queue = Arc::new(Mutex::new(Vec::<i64>::new()));
        let handle = {
            let (word, queue) = (word.clone(), queue.clone());
            thread::spawn(move || {
                let live = word.sending();
                queue.lock().unwrap().push(50);
                live
            })
        };
        // The actor's clock says the old deadline has come.
        let due = word.on_due(5, None);
        let live = handle.join().unwrap();
        match due {
            Due::Fire(5) => assert!(!live, "fired at 5 though the move came first"),
            Due::Held => {
                assert!(live);
                // The next turn applies the move: due at 50, and only then.
                for deadline in std::mem::take(&mut *queue.lock().unwrap()) {
                    assert_eq!(word.move_to(deadline), Moved::Later);
                    word.applied();
                }
                assert_eq!(word.on_due(49, None), Due::Later(50));
                assert_eq!(word.on_due(50, None), Due::Fire(50));
            }
            other => panic!("unexpected {other:?}"),
        }
    });
}

/// The actor lifts the hold as it applies the last command in flight, while the handle
/// queues another: the new one's hold is never lost (the entry never fires past a move
/// registered while it was live), and no hold outlives the commands (the entry fires once
/// they are applied).
#[test]
fn a_hold_is_lifted_only_with_nothing_in_flight() {
    loom::model(|| {
        let word = Arc::new(DeadlineWord::new(5));
        let queue = Arc::new(Mutex::new(Vec::<i64>::new()));
        // A first move in flight already.
        assert!(word.sending());
        queue.lock().unwrap().push(20);
        let handle = {
            let (word, queue) = (word.clone(), queue.clone());
            thread::spawn(move || {
                let live = word.sending();
                queue.lock().unwrap().push(40);
                live
            })
        };
        let apply = |word: &DeadlineWord, queue: &Mutex<Vec<i64>>| {
            for deadline in std::mem::take(&mut *queue.lock().unwrap()) {
                word.move_to(deadline);
                word.applied();
            }
        };
        // The actor applies what it finds, then fires whatever is due by 100.
        apply(&word, &queue);
        let due = word.on_due(100, None);
        let live = handle.join().unwrap();
        let left = queue.lock().unwrap().len();
        match due {
            Due::Fire(deadline) => {
                assert!(left == 0 || !live, "fired past a move registered first");
                assert!(deadline == 20 || deadline == 40);
            }
            Due::Held => {
                assert_eq!(left, 1, "held with nothing in flight");
                apply(&word, &queue);
                assert_eq!(
                    word.on_due(100, None),
                    Due::Fire(40),
                    "a hold outlived its move"
                );
            }
            Due::Later(_) => panic!("everything is due by 100"),
        }
    });
}

/// Handles keep a move in flight while the actor finds the entry due: it is held, and the
/// actor notes its mark. Once the commands counted before the mark are applied (the
/// actor takes turns until they are: one may be counted but not yet queued), the entry
/// fires whatever is still in flight, having seen every move counted before the mark.
#[test]
fn a_hold_is_released_once_the_commands_counted_before_it_are_applied() {
    loom::model(|| {
        let word = Arc::new(DeadlineWord::new(5));
        let ledger = Arc::new(Ledger::default());
        let queue = Arc::new(Mutex::new(Vec::<(Seq, i64)>::new()));
        let send = |word: &DeadlineWord, ledger: &Ledger, queue: &Mutex<Vec<_>>, to| {
            let seq = ledger.sending(0);
            word.sending();
            queue.lock().unwrap().push((seq, to));
            seq
        };
        // A move made before the entry was due, in flight.
        send(&word, &ledger, &queue, 3);
        let handle = {
            let (word, ledger, queue) = (word.clone(), ledger.clone(), queue.clone());
            thread::spawn(move || send(&word, &ledger, &queue, 4))
        };
        assert_eq!(word.on_due(5, None), Due::Held);
        // What had been counted when the actor found the entry held, and its mark.
        let counted = ledger.mark(0);
        let mark = counted;
        let mut applied = Vec::new();
        while !ledger.applied_past(0, mark) {
            // A turn applies what it finds, in count order (as the merge does).
            let mut batch = std::mem::take(&mut *queue.lock().unwrap());
            batch.sort_by_key(|(seq, _)| seq.ordinal());
            for (seq, to) in batch {
                word.move_to(to);
                word.applied();
                ledger.applied(0);
                applied.push(seq.ordinal());
            }
            thread::yield_now();
        }
        let fired = match word.on_due(5, Some(5)) {
            Due::Fire(deadline) => deadline,
            other => panic!("not released: {other:?}"),
        };
        let second = handle.join().unwrap();
        if second.ordinal() < counted {
            assert!(
                applied.contains(&second.ordinal()),
                "fired past a move counted first"
            );
            assert_eq!(fired, 4);
        } else {
            assert!(fired == 3 || fired == 4);
        }
    });
}

/// One task resets its key by key (a command), then through its handle; the actor
/// applies the command meanwhile. Whatever the interleaving, the handle's deadline wins,
/// as it was made last.
#[test]
fn a_handle_store_never_overtakes_an_earlier_command() {
    loom::model(|| {
        let word = Arc::new(DeadlineWord::new(10));
        let ledger = Arc::new(Ledger::default());
        let queue = Arc::new(Mutex::new(Vec::<i64>::new()));
        let stripe = 0;
        let actor = {
            let (word, ledger, queue) = (word.clone(), ledger.clone(), queue.clone());
            thread::spawn(move || {
                // One look at the queue, as an actor's turn takes it.
                let batch = std::mem::take(&mut *queue.lock().unwrap());
                for deadline in batch {
                    word.move_to(deadline);
                    ledger.applied(stripe);
                }
            })
        };
        // The task: by key to 30, then through the handle to 40.
        ledger.sending(stripe);
        queue.lock().unwrap().push(30);
        if ledger.is_quiet(stripe) {
            word.move_to(40);
        } else {
            ledger.sending(stripe);
            queue.lock().unwrap().push(40);
        }
        actor.join().unwrap();
        // Whatever the actor did not take in its turn, it applies in its next one.
        for deadline in std::mem::take(&mut *queue.lock().unwrap()) {
            word.move_to(deadline);
            ledger.applied(stripe);
        }
        assert_eq!(word.load(), (false, 40));
        assert!(ledger.is_quiet(stripe));
    });
}

/// The same with the handle's own commands, which its word counts: a move queued by the
/// handle (its stripe was busy) and then a direct one, racing the actor.
#[test]
fn a_handle_store_never_overtakes_its_own_queued_move() {
    loom::model(|| {
        let word = Arc::new(DeadlineWord::new(10));
        let queue = Arc::new(Mutex::new(Vec::<i64>::new()));
        let apply = |word: &DeadlineWord, queue: &Mutex<Vec<i64>>| {
            for deadline in std::mem::take(&mut *queue.lock().unwrap()) {
                word.move_to(deadline);
                word.applied();
            }
        };
        let actor = {
            let (word, queue) = (word.clone(), queue.clone());
            thread::spawn(move || apply(&word, &queue))
        };
        // The handle: a move to 5 queued, then a move to 40.
        word.sending();
        queue.lock().unwrap().push(5);
        if word.is_quiet() {
            word.move_to(40);
        } else {
            word.sending();
            queue.lock().unwrap().push(40);
        }
        actor.join().unwrap();
        apply(&word, &queue);
        assert_eq!(word.load(), (false, 40));
        assert!(word.is_quiet());
    });
}
