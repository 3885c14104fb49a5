//! What a keyed set's handles share: its inbox, ledger and hasher.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::actor::context::WheelContext;
use crate::actor::inbox::{Inbox, Urgency};
use crate::actor::keyed::KeyedCommand;
use crate::timer::keyed::{Ledger, Stripe};
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
    /// Counts `command` in the ledger (in `stripe`) and queues it; `false` if the wheel has
    /// stopped (the command is refused, as documented).
    pub(super) fn send(
        &self,
        command: KeyedCommand<K, V>,
        stripe: Stripe,
        urgency: Urgency,
    ) -> bool {
        if self.wheel.shared.is_closed() {
            return false;
        }
        self.ledger.sending_in(stripe);
        // A send fails only once the set's actor has stopped.
        self.inbox.send(0, command, urgency).is_ok()
    }

    pub(super) async fn ask<R>(
        &self,
        command: impl FnOnce(oneshot::Sender<R>) -> KeyedCommand<K, V>,
        stripe: Stripe,
    ) -> Option<R> {
        let (reply, answer) = oneshot::channel();
        self.send(command(reply), stripe, Urgency::Now);
        // A refused command drops `reply`, so this never waits on a stopped wheel.
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
