//! The command queue from handles to an actor.
//!
//! A mutex-guarded `Vec` that the actor swaps out whole, rather than a channel: a send is one
//! uncontended lock and a push (two atomic operations, no per-message allocation), the actor
//! takes every queued command with one swap, and it is woken only by the send that finds the
//! queue empty — while it is busy, senders never touch its waker. Measured against tokio's
//! unbounded channel this roughly halves the cost of a command (see BENCHMARKS.md).
//!
//! The queue is unbounded by design: a timer call never blocks or fails because the actor is
//! busy. Its backlog is bounded by what callers send between two actor turns; the actor
//! drains it in slices so a flood cannot starve firing (see `actor::run`).

use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;

/// Retained capacity above which the actor's spare buffer is shrunk after a flood.
const RETAINED_CAPACITY: usize = 64 * 1024;

pub(crate) struct Inbox<C> {
    state: Mutex<State<C>>,
    wake: Notify,
}

struct State<C> {
    commands: Vec<C>,
    /// Every handle that can send is gone.
    senders_gone: bool,
    /// The actor stopped: sends are refused.
    stopped: bool,
}

/// What [`Inbox::take`] found besides the commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Senders {
    Open,
    Gone,
}

impl<C> Inbox<C> {
    pub(crate) fn new() -> Self {
        Inbox {
            state: Mutex::new(State {
                commands: Vec::new(),
                senders_gone: false,
                stopped: false,
            }),
            wake: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<C>> {
        // No code panics while holding this lock; recover the data if it ever happens.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues a command; gives it back if the actor has stopped.
    pub(crate) fn send(&self, command: C) -> Result<(), C> {
        let mut state = self.lock();
        if state.stopped {
            return Err(command);
        }
        let was_empty = state.commands.is_empty();
        state.commands.push(command);
        drop(state);
        if was_empty {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// The last sending handle is gone.
    pub(crate) fn close(&self) {
        self.lock().senders_gone = true;
        self.wake.notify_one();
    }

    /// Moves every queued command into `into` (which must be empty).
    pub(crate) fn take(&self, into: &mut Vec<C>) -> Senders {
        debug_assert!(into.is_empty());
        if into.capacity() > RETAINED_CAPACITY {
            *into = Vec::new();
        }
        let mut state = self.lock();
        std::mem::swap(&mut state.commands, into);
        if state.senders_gone {
            Senders::Gone
        } else {
            Senders::Open
        }
    }

    /// Completes once a command may be queued (possibly spuriously).
    pub(crate) async fn wait(&self) {
        self.wake.notified().await;
    }

    /// Refuses all further sends and returns what was still queued.
    pub(crate) fn stop(&self) -> Vec<C> {
        let mut state = self.lock();
        state.stopped = true;
        std::mem::take(&mut state.commands)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_swaps_out_everything_in_order() {
        let inbox = Inbox::new();
        for i in 0..5 {
            inbox.send(i).unwrap();
        }
        let mut batch = Vec::new();
        assert_eq!(inbox.take(&mut batch), Senders::Open);
        assert_eq!(batch, [0, 1, 2, 3, 4]);
        batch.clear();
        assert_eq!(inbox.take(&mut batch), Senders::Open);
        assert!(batch.is_empty());
    }

    #[test]
    fn a_stopped_inbox_refuses_and_hands_back_the_rest() {
        let inbox = Inbox::new();
        inbox.send(1).unwrap();
        assert_eq!(inbox.stop(), [1]);
        assert_eq!(inbox.send(2), Err(2));
        assert!(inbox.stop().is_empty());
    }

    #[tokio::test]
    async fn the_first_send_into_an_empty_inbox_wakes_the_actor() {
        let inbox = std::sync::Arc::new(Inbox::new());
        let waiter = tokio::spawn({
            let inbox = inbox.clone();
            async move {
                inbox.wait().await;
                let mut batch = Vec::new();
                inbox.take(&mut batch);
                batch
            }
        });
        tokio::task::yield_now().await;
        inbox.send(7).unwrap();
        assert_eq!(waiter.await.unwrap(), [7]);
    }

    #[test]
    fn close_is_reported_by_take() {
        let inbox = Inbox::<u8>::new();
        inbox.close();
        assert_eq!(inbox.take(&mut Vec::new()), Senders::Gone);
    }
}
