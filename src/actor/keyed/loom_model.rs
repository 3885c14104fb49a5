//! Model check of how a set's actor stops once no `Timers` is left (included from
//! `keyed/mod.rs`).

use std::collections::VecDeque;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

use crate::actor::inbox::{Inbox, Urgency};

#[test]
fn a_command_sent_before_the_last_timers_went_is_applied_before_the_actor_stops() {
    loom::model(|| {
        let inbox = Arc::new(Inbox::<u32>::new(1));
        let timers = Arc::new(AtomicUsize::new(1));
        let last = {
            let (inbox, timers) = (inbox.clone(), timers.clone());
            thread::spawn(move || {
                inbox.send(0, 7, Urgency::Lazy).unwrap();
                // `Timers::drop`.
                if timers.fetch_sub(1, Ordering::AcqRel) == 1 {
                    inbox.nudge();
                }
            })
        };
        // The actor's loop: a turn takes and applies, then, with no `Timers` left and
        // nothing filed, one more look; it stops only if that finds nothing.
        let mut applied = VecDeque::new();
        loop {
            inbox.take_all(&mut applied, &mut []);
            if timers.load(Ordering::Acquire) == 0 && inbox.take_all(&mut applied, &mut []) == 0 {
                break;
            }
            thread::yield_now();
        }
        last.join().unwrap();
        assert_eq!(Vec::from(applied), vec![7], "a command was lost");
    });
}
