//! What a keyed set's handles share: its inbox, ledger and hasher.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::actor::context::WheelContext;
use crate::actor::inbox::{Inbox, Urgency};
use crate::actor::keyed::KeyedCommand;
use crate::timer::keyed::{Ledger, Ordinals, Seq};
/// What every [`Timers`] clone and [`KeyedTimer`] of a set hold: the set's inbox (closed when
/// the last of them goes), its ledger and its hasher, and the wheel's context (kept alive, as
/// a `Wheel` would; shown as the wheel).
pub(super) struct Set<K, V> {
    pub(super) wheel: Arc<WheelContext>,
    pub(super) inbox: Arc<Inbox<KeyedCommand<K, V>>>,
    pub(super) ledger: Arc<Ledger>,
    pub(super) hasher: foldhash::fast::RandomState,
    /// How many [`Timers`] clones are alive (shared with the actor). A `KeyedTimer` can only
    /// act on its own entry, so once this is zero and nothing is filed, the actor stops and
    /// the stream ends, whatever handles still live (all stale by then).
    pub(super) timers: Arc<AtomicUsize>,
}

impl<K, V> Drop for Set<K, V> {
    fn drop(&mut self) {
        self.inbox.close();
    }
}

impl<K, V> Set<K, V> {
    /// Queues the command `make` builds, counted in the ledger in `stripe` (the place it is
    /// given), into this thread's inbox shard: threads never share a lock, and the actor puts
    /// the shards' commands back in the order they were made (see `actor::keyed::order`).
    /// `false` if the wheel has stopped (the command is then refused, as documented, and
    /// counted nowhere).
    pub(super) fn send(
        &self,
        stripe: usize,
        urgency: Urgency,
        make: impl FnOnce(Seq) -> KeyedCommand<K, V>,
    ) -> bool {
        !self.wheel.shared.is_closed()
            && self
                .inbox
                .send_made(self.inbox.shard_for_thread(), urgency, || {
                    make(self.ledger.sending(stripe))
                })
    }

    /// Queues a command in no order (an advance).
    pub(super) fn send_free(&self, command: KeyedCommand<K, V>, urgency: Urgency) {
        if !self.wheel.shared.is_closed() {
            let _ = self
                .inbox
                .send(self.inbox.shard_for_thread(), command, urgency);
        }
    }

    /// Sends a question on every key (`drain`, `len`) and waits for the answer: it comes once
    /// every command made before it has been applied.
    pub(super) async fn ask_everywhere<R>(
        &self,
        command: impl FnOnce(oneshot::Sender<R>, Ordinals) -> KeyedCommand<K, V>,
    ) -> Option<R> {
        if self.wheel.shared.is_closed() {
            return None;
        }
        let (reply, answer) = oneshot::channel();
        // Counted with every shard locked: see `Ledger::sending_everywhere`.
        self.inbox
            .send_made_alone(self.inbox.shard_for_thread(), Urgency::Now, || {
                command(reply, self.ledger.sending_everywhere())
            });
        // A refused command drops `reply`, so this never waits on a stopped wheel.
        answer.await.ok()
    }

    /// Sends a question on a key of `stripe` and waits for the answer.
    pub(super) async fn ask<R>(
        &self,
        stripe: usize,
        command: impl FnOnce(oneshot::Sender<R>, Seq) -> KeyedCommand<K, V>,
    ) -> Option<R> {
        let (reply, answer) = oneshot::channel();
        self.send(stripe, Urgency::Now, |seq| command(reply, seq));
        answer.await.ok()
    }

    pub(super) fn offset(&self, deadline: Instant) -> i64 {
        self.wheel.shared.clock.signed_offset(deadline)
    }

    /// The offset of `after` from now (one clock read, integer arithmetic).
    pub(super) fn offset_after(&self, after: Duration) -> i64 {
        self.wheel.shared.clock.signed_offset_after(after)
    }

    pub(super) fn instant(&self, offset: i64) -> Instant {
        self.wheel.shared.clock.instant_at(offset)
    }
}

/// How soon the actor must see a command for a deadline at `offset`.
pub(super) fn by(offset: i64) -> Urgency {
    Urgency::By(offset.max(0) as u64)
}
