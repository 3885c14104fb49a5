//! The inbox's bound: how many commands its shards hold before a sender waits for the actor,
//! and where and how long a sender may wait (see the parent module).

use std::cell::Cell;

use super::shards::{Inbox, Shard};

/// Commands the shards of one inbox hold at most together before senders wait for the actor
/// (each shard its share, at least [`MIN_SHARD_BOUND`]): with the batch the actor is applying,
/// at most twice this waits — a few tens of MiB of commands at ~40 bytes each.
pub(crate) const BOUND_COMMANDS: usize = 256 * 1024;
pub(super) const MIN_SHARD_BOUND: usize = 4 * 1024;

/// How long a sender waits for the actor to take its full shard before it concludes the
/// actor is not running (its current-thread runtime not driven, say) and goes on: waiting
/// longer could deadlock a program whose runtime's driver waits for that sender.
const STALL: std::time::Duration = std::time::Duration::from_secs(1);

std::thread_local! {
    /// Set while this thread runs an actor's synchronous work (applying commands, firing):
    /// a send made there (a value's `Drop`) must never wait for the actor.
    static IN_ACTOR: Cell<bool> = const { Cell::new(false) };
}

/// Runs `work` as the actor: sends it makes never wait for room.
pub(crate) fn as_actor<R>(work: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            IN_ACTOR.with(|flag| flag.set(self.0));
        }
    }
    let _reset = Reset(IN_ACTOR.with(|flag| flag.replace(true)));
    work()
}

impl<C> Inbox<C> {
    /// This inbox is one of `parts` that share one bound (a keyed set's shards): its shards
    /// hold a `parts`-th of [`BOUND_COMMANDS`] together (each at least [`MIN_SHARD_BOUND`]).
    pub(crate) fn sharing_bound_with(mut self, parts: usize) -> Self {
        self.bound = (BOUND_COMMANDS / parts.max(1) / self.shards.len()).max(MIN_SHARD_BOUND);
        self
    }

    /// Says which runtime the actor runs on (see [`wait_for_room`](Self::wait_for_room)).
    pub(crate) fn with_actor_on(mut self, runtime: &tokio::runtime::Handle) -> Self {
        self.actor_known = true;
        self.actor_current_thread = matches!(
            runtime.runtime_flavor(),
            tokio::runtime::RuntimeFlavor::CurrentThread
        )
        .then(|| runtime.id());
        self
    }

    pub(super) fn is_full(&self, state: &Shard<C>) -> bool {
        state.commands.len() >= self.bound
    }

    /// After a send that filled `shard` (its lock let go, the actor notified): waits until the
    /// actor has taken the shard, where waiting cannot stop the actor (see the module).
    pub(super) fn wait_for_room(&self, shard: usize) {
        if IN_ACTOR.with(Cell::get) {
            return;
        }
        let wait = || {
            let mut state = self.lock(shard);
            let give_up = std::time::Instant::now() + STALL;
            while !state.stopped && !state.stalled && self.is_full(&state) {
                let left = give_up.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    tracing::warn!(
                        "a timer wheel's actor did not take its commands for {STALL:?}: \
                         senders stop waiting for it until it does"
                    );
                    state.stalled = true;
                    break;
                }
                state.waiting += 1;
                state = self.shards[shard]
                    .0
                    .1
                    .wait_timeout(state, left)
                    .map_or_else(|poisoned| poisoned.into_inner().0, |(state, _)| state);
                state.waiting -= 1;
            }
        };
        match tokio::runtime::Handle::try_current() {
            Err(_) => wait(),
            Ok(here) => match here.runtime_flavor() {
                tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(wait),
                // Another current-thread runtime: its thread may wait, the actor runs
                // elsewhere. The actor's own (or one not said): waiting could stop it for good.
                _ if self.actor_known && self.actor_current_thread != Some(here.id()) => wait(),
                _ => {}
            },
        }
    }

    /// Lets the senders waiting for room in a shard just taken go on.
    pub(super) fn room_made(&self, shard: usize, state: &mut Shard<C>) {
        state.stalled = false;
        if state.waiting > 0 {
            self.shards[shard].0.1.notify_all();
        }
    }
}
