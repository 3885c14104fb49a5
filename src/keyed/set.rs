//! What a keyed set's handles share: its shards (an actor's inbox and ledger each) and its
//! hasher.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::actor::context::WheelContext;
use crate::actor::inbox::{Inbox, Urgency};
use crate::actor::keyed::KeyedCommand;
use crate::timer::keyed::{Ledger, Ordinals, Seq};

/// What every [`Timers`] clone and [`KeyedTimer`] of a set hold: the set's shards (each an
/// actor with its own inbox, closed when the last of them goes, and ledger), its hasher, and
/// the wheel's context (kept alive, as a `Wheel` would; shown as the wheel).
pub(super) struct Set<K, V> {
    pub(super) wheel: Arc<WheelContext>,
    /// A key belongs to one shard, by its hash ([`Set::shard`]): commands on a key meet in
    /// one actor, in the order they were made; shards apply theirs side by side.
    pub(super) shards: Box<[SetShard<K, V>]>,
    pub(super) hasher: foldhash::fast::RandomState,
    /// How many [`Timers`] clones are alive (shared with the actors). A `KeyedTimer` can only
    /// act on its own entry, so once this is zero and nothing is filed, the actors stop and
    /// the stream ends, whatever handles still live (all stale by then).
    pub(super) timers: Arc<AtomicUsize>,
}

/// One shard of a keyed set: the inbox of its actor, and the ledger of the commands on its
/// keys.
pub(super) struct SetShard<K, V> {
    pub(super) inbox: Arc<Inbox<KeyedCommand<K, V>>>,
    pub(super) ledger: Arc<Ledger>,
}

impl<K, V> Drop for Set<K, V> {
    fn drop(&mut self) {
        for shard in &self.shards {
            shard.inbox.close();
        }
    }
}

/// The shard of a set of `shards` that a key with `hash` belongs to. The top bits: the
/// ledger's stripes take the eight below them, and the actor's index the low ones and its
/// slots' home positions from bit 32 up, so keys of one shard still spread over all of those.
pub(crate) fn shard_of(hash: u64, shards: usize) -> usize {
    (hash >> 56) as usize % shards
}

impl<K, V> Set<K, V> {
    /// The shard of the key with `hash`.
    pub(super) fn shard(&self, hash: u64) -> &SetShard<K, V> {
        &self.shards[shard_of(hash, self.shards.len())]
    }

    /// Queues the command `make` builds on the key with `hash`, counted in its shard's ledger
    /// (the place it is given), into this thread's queue of that shard's inbox: threads never
    /// share a lock, and the actor puts the queues' commands back in the order they were made
    /// (see `actor::keyed::order`). `false` if the wheel has stopped (the command is then
    /// refused, as documented, and counted nowhere).
    pub(super) fn send(
        &self,
        hash: u64,
        urgency: Urgency,
        make: impl FnOnce(Seq) -> KeyedCommand<K, V>,
    ) -> bool {
        let shard = self.shard(hash);
        let stripe = Ledger::stripe(hash);
        !self.wheel.shared.is_closed()
            && shard
                .inbox
                .send_made(shard.inbox.shard_for_thread(), urgency, || {
                    make(shard.ledger.sending(stripe))
                })
    }

    /// Queues a command on the key with `hash` in no order (an advance).
    pub(super) fn send_free(&self, hash: u64, command: KeyedCommand<K, V>, urgency: Urgency) {
        if !self.wheel.shared.is_closed() {
            let inbox = &self.shard(hash).inbox;
            let _ = inbox.send(inbox.shard_for_thread(), command, urgency);
        }
    }

    /// Sends a question on every key (`drain`, `len`) to every shard and waits for their
    /// answers: each comes once every command made before it on the shard's keys has been
    /// applied. `None` if the wheel had stopped; a shard that stops before it answers is left
    /// out (what the others answered, a drain's entries above all, is not lost).
    pub(super) async fn ask_everywhere<R>(
        &self,
        command: impl Fn(oneshot::Sender<R>, Ordinals) -> KeyedCommand<K, V>,
    ) -> Option<Vec<R>> {
        if self.wheel.shared.is_closed() {
            return None;
        }
        // Every shard's queues are locked together while the questions are counted and
        // queued: each shard's question then stands at the same point of the set's order (a
        // command made on another thread meanwhile counts before all of them or after all),
        // so the answers add up to one cut, as one actor's would. Shards in index order, as
        // every caller locks them.
        let answers = self.ask_every_shard_at_once(&command);
        let mut replies = Vec::with_capacity(answers.len());
        for answer in answers {
            // A refused command drops its reply, so this never waits on a stopped wheel.
            replies.extend(answer.await.ok());
        }
        Some(replies)
    }

    /// Queues the question `command` makes to every shard, each shard's queues locked
    /// together meanwhile (see [`ask_everywhere`](Self::ask_everywhere)); returns where the
    /// answers will come. Not async: no lock is ever held across an await (the futures of
    /// `len` and `drain` stay `Send`).
    fn ask_every_shard_at_once<R>(
        &self,
        command: &impl Fn(oneshot::Sender<R>, Ordinals) -> KeyedCommand<K, V>,
    ) -> Vec<oneshot::Receiver<R>> {
        let mut locked: Vec<_> = self
            .shards
            .iter()
            .map(|shard| shard.inbox.lock_every_shard())
            .collect();
        let here = self.shards[0].inbox.shard_for_thread();
        let mut answers = Vec::with_capacity(self.shards.len());
        let mut queued = Vec::with_capacity(self.shards.len());
        for (shard, locked) in self.shards.iter().zip(&mut locked) {
            let (reply, answer) = oneshot::channel();
            queued.push(locked.queue_made(here, Urgency::Now, || {
                command(reply, shard.ledger.sending_everywhere())
            }));
            answers.push(answer);
        }
        drop(locked);
        for (shard, queued) in self.shards.iter().zip(queued) {
            shard.inbox.notify_if(queued);
        }
        answers
    }

    /// Sends a question on the key with `hash` and waits for the answer.
    pub(super) async fn ask<R>(
        &self,
        hash: u64,
        command: impl FnOnce(oneshot::Sender<R>, Seq) -> KeyedCommand<K, V>,
    ) -> Option<R> {
        let (reply, answer) = oneshot::channel();
        self.send(hash, Urgency::Now, |seq| command(reply, seq));
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

/// How many commands back from the newest a `remove` or `reset` looks for the command it
/// cancels or moves.
const RECENT: usize = 8;

impl<K: Eq + Clone, V> Set<K, V> {
    /// Queues a `remove` of `key` (hashing to `hash`), unless its `set` still waits in this
    /// thread's queue, among its last few commands, as the last command counted on the key's
    /// stripe: that set then turns into the remove, in its place and with its count, so the
    /// actor files nothing (an ack that comes before the actor saw the timer costs it one
    /// lookup). Any command made after the set on the stripe, by-key or on every key, rules
    /// that out: it was counted after, and must still apply after the set. One lock either
    /// way. Returns the set command taken out, for the caller to drop outside the lock.
    pub(super) fn remove(&self, hash: u64, key: &K) -> Option<KeyedCommand<K, V>> {
        let shard = self.shard(hash);
        let stripe = Ledger::stripe(hash);
        if self.wheel.shared.is_closed() {
            return None;
        }
        let cancel_queued_set = |command: &mut KeyedCommand<K, V>| {
            let seq = match command {
                KeyedCommand::Set {
                    key: queued, seq, ..
                } if queued == key => *seq,
                _ => return None,
            };
            if !shard.ledger.is_last_counted(seq) {
                return Some(None);
            }
            let remove = KeyedCommand::Remove {
                key: key.clone(),
                seq,
            };
            Some(Some(std::mem::replace(command, remove)))
        };
        let remove = || KeyedCommand::Remove {
            key: key.clone(),
            seq: shard.ledger.sending(stripe),
        };
        shard
            .inbox
            .rewrite_recent_or_send_made(
                shard.inbox.shard_for_thread(),
                RECENT,
                cancel_queued_set,
                Urgency::Lazy,
                remove,
            )
            .ok()
    }

    /// Queues a `reset` of `key` (hashing to `hash`) to `deadline`, unless its `set` or
    /// `reset` still waits in this thread's queue among its last few commands, as the last
    /// command counted on the key's stripe, due no later than `deadline`: that command's
    /// deadline moves instead, so a burst of keep-alive resets on a key costs the actor one.
    /// (An earlier deadline is sent as a command of its own: the queued one may not have woken
    /// the actor soon enough for it.) One lock either way.
    pub(super) fn reset(&self, hash: u64, key: &K, deadline: i64) {
        let shard = self.shard(hash);
        let stripe = Ledger::stripe(hash);
        if self.wheel.shared.is_closed() {
            return;
        }
        let move_queued = |command: &mut KeyedCommand<K, V>| {
            let (queued, seq) = match command {
                KeyedCommand::Set {
                    key: k,
                    deadline: queued,
                    seq,
                    ..
                }
                | KeyedCommand::Reset {
                    key: k,
                    deadline: queued,
                    seq,
                } if k == key => (queued, *seq),
                _ => return None,
            };
            if *queued <= deadline && shard.ledger.is_last_counted(seq) {
                *queued = deadline;
                Some(Some(()))
            } else {
                Some(None)
            }
        };
        let reset = || KeyedCommand::Reset {
            key: key.clone(),
            deadline,
            seq: shard.ledger.sending(stripe),
        };
        let _ = shard.inbox.rewrite_recent_or_send_made(
            shard.inbox.shard_for_thread(),
            RECENT,
            move_queued,
            by(deadline),
            reset,
        );
    }
}

/// How soon the actor must see a command for a deadline at `offset`.
pub(super) fn by(offset: i64) -> Urgency {
    Urgency::By(offset.max(0) as u64)
}
