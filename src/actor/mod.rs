//! The actor: one task that owns a cascade wheel and everything filed in it.
//!
//! Every actor runs the same loop (this module); what it holds and how it fires is a
//! [`Machine`]: [`timers::TimerMachine`] for sleeps and jobs, and one keyed machine per
//! [`Wheel::keyed`](crate::Wheel::keyed) set. The loop
//!
//! 1. applies every queued command, in slices of [`COMMAND_BATCH`] with firing in between, then
//!    fires what is due in batches of [`FIRE_BATCH`], yielding between fire batches so a burst
//!    of expirations never starves the runtime;
//! 2. arms a single `tokio::time::Sleep` at the next occupied slot — it never ticks while idle;
//! 3. waits for that sleep, for commands, or for shutdown.
//!
//! An actor stops on shutdown, when its runtime drops it, or on its own once no handle can
//! reach it and nothing is filed. However it stops, [`Actor`]'s `Drop` resolves everything
//! still pending, so nothing created by the wheel hangs.

pub(crate) mod inbox;
pub(crate) mod timers;

use std::sync::Arc;

use tokio::time::Instant;
use tracing::Instrument;

use self::inbox::{Inbox, Senders};
use crate::handle::Shared;
use crate::stats::Delta;
use crate::wheel::TimerWheel;

/// Commands applied before the actor fires what is due and yields to the runtime.
pub(crate) const COMMAND_BATCH: usize = 16 * 1024;
/// Timers fired before the actor yields to the runtime.
pub(crate) const FIRE_BATCH: usize = 1024;

/// What an actor holds and how it applies commands and fires.
pub(crate) trait Machine: Send + 'static {
    type Command: Send + 'static;

    /// Applies one command.
    fn apply(&mut self, command: Self::Command, shared: &Arc<Shared>, delta: &mut Delta);

    /// Fires up to `budget` timers due at tick `now`; returns how many it handled.
    fn fire(&mut self, now: u64, budget: usize, shared: &Arc<Shared>, delta: &mut Delta) -> usize;

    /// What the machine files in its wheel.
    type Item;

    /// The machine's wheel.
    fn wheel(&self) -> &TimerWheel<Self::Item>;

    /// The tick of the next work, if anything is filed.
    fn next_expiration(&self) -> Option<u64> {
        self.wheel().next_expiration()
    }

    /// How many timers are filed.
    fn len(&self) -> usize {
        self.wheel().len()
    }

    /// The wheel's cascade count so far.
    fn cascades(&self) -> u64 {
        self.wheel().cascades()
    }

    /// A command that arrived after the actor stopped: resolve it as shut down.
    fn refuse(&mut self, command: Self::Command);

    /// The actor stops: resolve everything filed as shut down.
    fn shut_down(&mut self, shared: &Arc<Shared>, delta: &mut Delta);

    /// Called after each turn's stats are published: answer anything waiting on that.
    fn turn_done(&mut self) {}
}

/// A machine with its command queue; dropping it resolves everything it still holds.
pub(crate) struct Actor<M: Machine> {
    machine: M,
    inbox: Arc<Inbox<M::Command>>,
    shared: Arc<Shared>,
    delta: Delta,
    reported_pending: usize,
    reported_cascades: u64,
}

impl<M: Machine> Actor<M> {
    /// Counts the actor as live at once, so `shutdown()` waits for it even before it runs.
    pub(crate) fn new(machine: M, inbox: Arc<Inbox<M::Command>>, shared: Arc<Shared>) -> Self {
        shared.live_actors.send_modify(|live| *live += 1);
        Actor {
            machine,
            inbox,
            shared,
            delta: Delta::default(),
            reported_pending: 0,
            reported_cascades: 0,
        }
    }

    /// Spawns the actor on the wheel's runtime.
    pub(crate) fn spawn(self, kind: &'static str) {
        let span = tracing::debug_span!("tokio_wheel::actor", wheel = %self.shared.name, kind);
        let runtime = self.shared.runtime.clone();
        runtime.spawn(self.run().instrument(span));
    }

    async fn run(mut self) {
        tracing::debug!("actor started");
        let mut shutdown = self.shared.shutdown.subscribe();
        let mut batch = Vec::new();
        let timer = tokio::time::sleep_until(Instant::now());
        tokio::pin!(timer);
        let mut armed: Option<u64> = None;
        loop {
            if *shutdown.borrow_and_update() {
                break;
            }
            self.delta.wakeups += 1;
            let senders = self.inbox.take(&mut batch);
            let received = batch.len();
            if received > 0 {
                tracing::trace!(received, "applying commands");
                self.delta.commands += received as u64;
                let mut commands = batch.drain(..);
                loop {
                    let mut applied = 0;
                    for command in commands.by_ref().take(COMMAND_BATCH) {
                        self.machine.apply(command, &self.shared, &mut self.delta);
                        applied += 1;
                    }
                    if applied < COMMAND_BATCH {
                        break;
                    }
                    // A flood: keep firing on time between slices. No yield here: yielding
                    // mid-turn hands the CPU back to the producers and the backlog only grows;
                    // the turn is bounded by what was queued when it began, and Tokio's
                    // cooperative budget makes the actor yield between turns.
                    self.fire_due();
                }
            }
            while self.fire_due() == FIRE_BATCH {
                tokio::task::yield_now().await;
            }
            self.flush_stats();
            self.machine.turn_done();
            if senders == Senders::Gone {
                if received > 0 {
                    continue;
                }
                if self.machine.len() == 0 {
                    tracing::debug!("no handle left and nothing pending: actor exits");
                    break;
                }
            }
            match self.machine.next_expiration() {
                Some(tick) if armed != Some(tick) => {
                    timer.as_mut().reset(self.shared.clock.instant_of(tick));
                    armed = Some(tick);
                }
                Some(_) => {}
                None => armed = None,
            }
            tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                () = self.inbox.wait(), if senders == Senders::Open => {}
                () = &mut timer, if armed.is_some() => armed = None,
            }
        }
        self.stop();
    }

    fn fire_due(&mut self) -> usize {
        let now = self.shared.clock.now_tick();
        let fired = self
            .machine
            .fire(now, FIRE_BATCH, &self.shared, &mut self.delta);
        if fired > 0 {
            tracing::trace!(fired, now, "fired");
        }
        fired
    }

    fn flush_stats(&mut self) {
        let pending = self.machine.len();
        let cascades = self.machine.cascades();
        let change = pending as i64 - self.reported_pending as i64;
        self.shared
            .stats
            .merge(&mut self.delta, change, cascades - self.reported_cascades);
        self.reported_pending = pending;
        self.reported_cascades = cascades;
    }

    /// Refuses every command still queued (and all later ones), then resolves everything
    /// filed. Idempotent.
    fn stop(&mut self) {
        for command in self.inbox.stop() {
            self.delta.commands += 1;
            self.machine.refuse(command);
        }
        if self.machine.len() > 0 {
            tracing::debug!(
                pending = self.machine.len(),
                "actor stops with timers pending"
            );
        }
        self.machine.shut_down(&self.shared, &mut self.delta);
        self.flush_stats();
        self.machine.turn_done();
    }
}

impl<M: Machine> Drop for Actor<M> {
    fn drop(&mut self) {
        self.stop();
        self.shared.live_actors.send_modify(|live| *live -= 1);
        tracing::debug!("actor stopped");
    }
}
