//! The actor: one task that owns a cascade wheel and everything filed in it.
//!
//! Every actor runs the same loop (this module); what it holds and how it fires is a
//! [`Machine`]: [`timers::TimerMachine`] for sleeps and jobs, and one [`keyed::KeyedMachine`]
//! per keyed set. A turn of the loop
//!
//! 1. takes every queued command and applies them; when a stretch runs past its budget of real
//!    time ([`TURN_BUDGET`], doubling up to [`MAX_TURN_BUDGET`] while a backlog lasts), it
//!    fires what is due and yields to the runtime before going on, so a flood of commands
//!    neither delays firing nor starves other tasks;
//! 2. fires what is due in batches of [`FIRE_BATCH`], yielding between batches;
//! 3. publishes its counters and answers barriers; once quiet for [`IDLE_GRACE`] — empty and
//!    idle, or with the few timers a flood left behind in tables it made large
//!    ([`Machine::sparse`]) —, it gives flood-sized memory back (waking for that once, with no
//!    command needed): a long timer keeps only its own bytes;
//! 4. arms a single `tokio::time::Sleep` at the next wake-up its timeline asks for (it never
//!    ticks while idle) — or, if the turn took commands, within [`LAZY_BOUND`] (the *lazy
//!    look*, below) —, tells senders when it will next look at its inbox (so most sends need
//!    not wake it), yields if it has been busy for [`YIELD_EVERY`], and waits for that sleep,
//!    for a command that needs it sooner, or for shutdown.
//!
//! # The lazy look (the server hot path)
//!
//! A keep-alive server arms a header-read sleep per request and drops it a millisecond later,
//! unfired. Were every command to wake the actor, each such request would cost a cross-thread
//! wake-up and an actor turn (measured: one actor wake-up per request, ~0.7–1 µs of CPU per
//! request in the `requests` scenario of `benches/compare`, 4–8× what tokio's timer adds). So
//! commands that only give memory back (`Urgency::Lazy`) or are due far ahead wake the actor
//! only if it has no look armed within [`LAZY_BOUND`]; and a turn that took commands arms one,
//! expecting more. While commands flow, the actor looks once per lazy bound and takes them in
//! one batch; a sleep dropped before that look is withdrawn in the queue and never filed (one
//! lock, no message), and one dropped after it queues a release that wakes nobody. Once the
//! flow stops, one look finds nothing and arms no other: no idle ticking, and what the flow
//! left (releases, the pool) is reclaimed within the lazy bound. Memory stays bounded by what
//! producers send in one lazy bound; once idle, the actor and each inbox shard keep buffers
//! for at most 4096 commands (`tests/cancel_churn.rs`: 10^6 sleeps from 64 tasks peak at
//! ~0.6 MB over the baseline and leave less than 1 MiB once idle).
//!
//! Measured and rejected for the same path: a release buffer per thread or shard handed over
//! in batches (the release already shares the registration's shard lock, and with the lazy
//! look it wakes nobody: a batch would save a push, and strand up to a batch of slots on a
//! thread that goes quiet); computing deadlines from a "now" cached by the actor (a cached
//! now is earlier than the real one, so `sleep(d)` would end early); skipping the first
//! poll's clock read (a sleep polled at or after its deadline must be ready on that poll).
//!
//! Waiting on the inbox costs no cooperative budget (a `Notify` never returns `Pending` for
//! budget reasons), so the explicit yields are what keep the actor a good citizen, on a
//! current-thread runtime fed from other threads too.
//!
//! Handles reach the main actor through a [`context::WheelContext`] (its inbox and the wheel's
//! shared state), defined here so that they never name the `Wheel` that made them.
//!
//! However the actor stops — shutdown, its runtime dropping it, or no handle left and nothing
//! filed — it first applies every command still queued, then resolves what is filed as shut
//! down (except on a quiet exit, where nothing is filed). So a command sent before
//! `shutdown()` is never lost, and nothing created by the wheel hangs.

mod alarm;
pub(crate) mod context;
pub(crate) mod inbox;
pub(crate) mod keyed;
pub(crate) mod thread;
pub(crate) mod timeline;
pub(crate) mod timers;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use pin_project_lite::pin_project;
use tracing::Instrument;

use self::alarm::Alarm;
use self::inbox::{Inbox, LAZY_BOUND, as_actor};
use self::timeline::Moves;
use crate::timer::counters::Delta;
use crate::timer::shared::Shared;

/// Commands applied between two looks at the turn's time budget: few enough that a slice stays
/// short even in a debug build on a preempted thread (128 took up to 90 ms there), enough that
/// the clock read is lost in the work.
const SLICE: usize = 32;
/// How many commands ahead of the one applied [`Machine::prefetch`] looks: far enough that a
/// miss (~100 ns) is served by the time its command comes, near enough to stay in cache.
const PREFETCH_AHEAD: usize = 8;
/// Longest a busy actor goes without yielding to the runtime between turns (each yield costs
/// the worker a trip through its driver, so a busy actor does not yield after every turn).
const YIELD_EVERY: Duration = Duration::from_millis(1);
/// Real time a turn first spends applying commands before it fires what is due and yields.
/// While a backlog lasts, each stretch doubles, up to [`MAX_TURN_BUDGET`]: the actor keeps up
/// with producers on its own runtime, and other tasks still run every few milliseconds.
pub(crate) const TURN_BUDGET: Duration = Duration::from_millis(1);
/// The longest stretch of applying commands without a yield (16 ms let two actors sharing a
/// current-thread runtime hold it ~100 ms between them while preempted by flooding threads).
pub(crate) const MAX_TURN_BUDGET: Duration = Duration::from_millis(8);
/// Timers fired before the actor yields to the runtime.
pub(crate) const FIRE_BATCH: usize = 1024;
/// Command buffer capacity an idle actor keeps.
const RETAINED_BATCH: usize = 4 * 1024;
/// How long an actor stays empty and idle before it gives flood-sized memory back: long
/// enough that a workload pulsing every few hundred milliseconds keeps its buffers warm, short
/// enough that memory returns soon after a burst, with no command needed.
pub(crate) const IDLE_GRACE: Duration = Duration::from_millis(200);

/// Whether a firing comes after every command sent before its `now` was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backlog {
    /// The clock was read before the inbox was taken, and all that was taken is applied: a
    /// command made before `now` — a move or removal that returned before the deadline — has
    /// taken effect.
    Applied,
    /// A flood's turn fires between slices of its batch: commands made before `now` may still
    /// wait in it.
    Unapplied,
}

/// What a machine may use while applying a command or firing.
pub(crate) struct Ctx<'a> {
    pub(crate) shared: &'a Arc<Shared>,
    pub(crate) delta: &'a mut Delta,
}

/// What an actor holds and how it applies commands and fires.
pub(crate) trait Machine: Send + 'static {
    type Command: Send + 'static;

    /// Applies one command.
    fn apply(&mut self, command: Self::Command, ctx: &mut Ctx<'_>);

    /// Whether commands taken wait for others made before them that are still on their way:
    /// the actor must look at its inbox again at once rather than wait.
    fn waiting(&self) -> bool {
        false
    }

    /// Takes every queued command into `into`, in an order it may apply them in; returns how
    /// many it took from the inbox (some may wait for others before they go into `into`: see
    /// [`waiting`](Machine::waiting)).
    fn take(&mut self, inbox: &Inbox<Self::Command>, into: &mut VecDeque<Self::Command>) -> usize {
        inbox.take_all(into, self.freed())
    }

    /// Moves more taken commands into `into` (an empty batch), for a machine whose [`take`]
    /// hands them on in steps; `false` if none is ready.
    ///
    /// [`take`]: Machine::take
    fn refill(
        &mut self,
        _inbox: &Inbox<Self::Command>,
        _into: &mut VecDeque<Self::Command>,
    ) -> bool {
        false
    }

    /// Refuses further commands and takes every queued one (and every one that waited) into
    /// `into`; returns how many it took from the inbox.
    fn take_stopped(
        &mut self,
        inbox: &Inbox<Self::Command>,
        into: &mut VecDeque<Self::Command>,
    ) -> usize {
        let before = into.len();
        inbox.stop(into);
        into.len() - before
    }

    /// Called with a command a few places ahead of the one being applied: a machine whose
    /// commands look up big tables can start bringing the right memory in, so that the misses
    /// of successive commands overlap.
    fn prefetch(&self, _command: &Self::Command) {}

    /// Fires up to `budget` timers due at offset `now`; returns how many it looked at (fewer
    /// than `budget`: nothing due is left). `backlog` says whether every command sent before
    /// `now` has been applied: if not, one still queued may move or remove a timer that looks
    /// due, and a machine whose commands carry deadlines must not fire what they may touch.
    fn fire(&mut self, now: u64, budget: usize, backlog: Backlog, ctx: &mut Ctx<'_>) -> usize;

    /// The offset to wake at next, if anything is filed.
    fn next_wake(&self) -> Option<u64>;

    /// How many timers are filed.
    fn len(&self) -> usize;

    /// The wheel's moves so far.
    fn moves(&self) -> Moves;

    /// Resolves up to `budget` filed timers as shut down; returns how many it resolved (fewer
    /// than `budget`: none is left).
    fn shut_down_some(&mut self, budget: usize, ctx: &mut Ctx<'_>) -> usize;

    /// Whether nothing the machine holds can be observed any more (no stream reads it), so a
    /// machine no handle can reach may stop before its timers are due.
    fn abandoned(&self) -> bool {
        false
    }

    /// Whether no handle left can file anything new (some may still act on what is filed):
    /// with nothing filed, the actor may then stop although such handles live.
    fn cannot_grow(&self) -> bool {
        false
    }

    /// Pool slots released since the last take, per inbox shard, to give back to the shards.
    fn freed(&mut self) -> &mut [Vec<u32>] {
        &mut []
    }

    /// Whether a barrier waits for this turn: take every shard once more before answering.
    fn wants_barrier(&self) -> bool {
        false
    }

    /// Whether the machine holds memory beyond what an idle machine keeps.
    fn holds_memory(&self, shared: &Shared) -> bool;

    /// Whether, with timers still filed, most of what the machine holds is unused (a flood is
    /// over but a few long timers outlive it): worth giving memory back as when empty. Cheap:
    /// asked after every turn that leaves timers filed.
    fn sparse(&self, _shared: &Shared) -> bool {
        false
    }

    /// The machine has been quiet for [`IDLE_GRACE`] — empty and idle, or [sparse] — : give
    /// flood-sized memory back.
    ///
    /// [sparse]: Machine::sparse
    /// Returns `false` if some of it is held by timers still in use (slots of fired jobs
    /// whose handles are alive, say): worth another try once they come back.
    fn release_memory(&mut self, inbox: &Inbox<Self::Command>, shared: &Arc<Shared>) -> bool;

    /// The turn is over and counted: answer barriers.
    fn turn_done(&mut self, _inbox: &Inbox<Self::Command>, _shared: &Arc<Shared>) {}
}

/// How the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exit {
    /// Shutdown was requested.
    Shutdown,
    /// No handle can reach the actor and nothing is filed.
    Quiet,
}

/// A machine with its command queue; dropping it applies what is queued and resolves
/// everything it still holds.
pub(crate) struct Actor<M: Machine> {
    machine: M,
    inbox: Arc<Inbox<M::Command>>,
    shared: Arc<Shared>,
    delta: Delta,
    /// Commands taken and not yet applied (kept here so a drop mid-turn still applies them).
    batch: VecDeque<M::Command>,
    reported_pending: usize,
    reported_moves: Moves,
    /// Since when (clock offset) the machine has been empty and idle, while it still holds
    /// memory to give back.
    idle_since: Option<u64>,
    /// The last release left memory held by timers still in use.
    release_blocked: bool,
    /// Timers pending when memory was last given back around them (a flood's survivors):
    /// once they are all gone, the rest of their memory goes too.
    kept_at_release: usize,
    stopped: bool,
}

impl<M: Machine> Actor<M> {
    /// Counts the actor as live at once, so `shutdown()` waits for it even before it runs.
    pub(crate) fn new(machine: M, inbox: Arc<Inbox<M::Command>>, shared: Arc<Shared>) -> Self {
        shared.actor_started();
        Actor {
            machine,
            inbox,
            shared,
            delta: Delta::default(),
            batch: VecDeque::new(),
            reported_pending: 0,
            reported_moves: Moves::default(),
            idle_since: None,
            release_blocked: false,
            kept_at_release: 0,
            stopped: false,
        }
    }

    /// Spawns the actor on the wheel's runtime.
    pub(crate) fn spawn(self, kind: &'static str) {
        let span = tracing::debug_span!("tokio_wheel::actor", wheel = %self.shared.name, kind);
        let runtime = self.shared.actors.clone();
        runtime.spawn(AsActor { run: self.run() }.instrument(span));
    }

    async fn run(mut self) {
        tracing::debug!("actor started");
        let mut shutdown = self.shared.shutdown_signal();
        let mut alarm = Alarm::new();
        let mut last_yield = std::time::Instant::now();
        let exit = loop {
            if *shutdown.borrow_and_update() {
                break Exit::Shutdown;
            }
            self.delta.wakeups += 1;
            let (took, worked) = self.turn().await;
            self.publish(worked);
            let idle = self.machine.len() == 0;
            if (self.inbox.senders_gone() && (idle || self.machine.abandoned()))
                || (idle && self.machine.cannot_grow())
            {
                // Senders close (or stop counting) after their last send: one more look makes
                // sure it is applied.
                if self.take() == 0 && !self.machine.waiting() {
                    tracing::debug!("no handle left and nothing pending: actor exits");
                    break Exit::Quiet;
                }
                // Applied before the next turn takes again: a take must find the batch empty
                // (a keyed set's merge hands a lone shard's commands on whole, by swapping them
                // into the batch, which would put these behind commands made after them).
                self.apply_batch().await;
                continue;
            }
            let now = self.shared.clock.now();
            // While commands flow, look again within the lazy bound by itself: releases and
            // far-future registrations sent meanwhile then wake nobody (one wake-up per lazy
            // bound instead of one per command), and a registration dropped before that look
            // is withdrawn in the queue, never filed. One look after the flow stops finds
            // nothing and arms no other: no idle ticking.
            let lazy_look = took.then(|| now.saturating_add(LAZY_BOUND));
            let wake = [
                self.machine.next_wake(),
                self.memory_release_due(),
                lazy_look,
            ]
            .into_iter()
            .flatten()
            .min();
            // Tell senders when the actor looks next, then look once more: a command sent
            // meanwhile that did not wake it is seen here.
            self.inbox.publish_next_look(wake, now);
            alarm.set(wake, now, &self.shared.clock);
            if worked && last_yield.elapsed() >= YIELD_EVERY {
                // Notify costs no budget: without this, a busy actor would never yield.
                tokio::task::yield_now().await;
                last_yield = std::time::Instant::now();
            }
            if self.inbox.has_pending() {
                continue;
            }
            if self.machine.waiting() {
                // A command waits for one made before it whose sender is still queueing it
                // (a matter of instructions): look again after letting others run.
                tokio::task::yield_now().await;
                last_yield = std::time::Instant::now();
                continue;
            }
            tokio::select! {
                biased;
                _ = shutdown.changed() => break Exit::Shutdown,
                // Also how the last handle's going is seen: `close` notifies.
                () = self.inbox.wait() => {}
                () = alarm.rings() => {}
            }
            // Busy from here: the wait is not work. (Counted from before the wait, every turn
            // after a wait of a tick or more yielded, and a yield wakes the other worker.)
            last_yield = std::time::Instant::now();
        };
        if exit == Exit::Shutdown {
            self.wind_down().await;
        }
        self.stop(exit);
    }

    /// The asynchronous part of stopping on `shutdown()`: refuse further commands, apply the
    /// queued ones and resolve what is filed in batches, yielding between them, so a stop with
    /// millions of timers pending does not stall the runtime. (A drop by a dying runtime takes
    /// the synchronous path in `stop` instead.)
    async fn wind_down(&mut self) {
        if self.shared.close() {
            tracing::debug!("the wheel stops");
        }
        self.shared.request_shutdown();
        self.delta.commands += self.machine.take_stopped(&self.inbox, &mut self.batch) as u64;
        self.apply_batch().await;
        loop {
            let mut ctx = Ctx {
                shared: &self.shared,
                delta: &mut self.delta,
            };
            if self.machine.shut_down_some(FIRE_BATCH, &mut ctx) < FIRE_BATCH {
                return;
            }
            tokio::task::yield_now().await;
        }
    }

    /// Takes every queued command into the batch (which must be empty: everything taken
    /// before is applied first); returns how many.
    fn take(&mut self) -> usize {
        debug_assert!(
            self.batch.is_empty(),
            "a take behind commands not yet applied"
        );
        let took = self.machine.take(&self.inbox, &mut self.batch);
        self.delta.commands += took as u64;
        took
    }

    /// One turn: apply what is queued (in slices, firing and yielding when the budget runs
    /// out), then fire what is due. Returns whether it took commands, and whether it did
    /// anything.
    async fn turn(&mut self) -> (bool, bool) {
        // The clock first: every command sent before this instant is in the take below, so
        // firing up to it never lets a timer that is due by it beat a move or removal that
        // returned before its deadline.
        let now = self.shared.clock.now();
        let took = self.take();
        if took > 0 {
            tracing::trace!(took, "applying commands");
        }
        let mut worked = took > 0;
        self.apply_batch().await;
        if self.machine.wants_barrier() {
            // A barrier answers for every command sent before it, whichever shard: take once
            // more, since shards taken before the barrier's may have received some since.
            self.take();
            self.apply_batch().await;
        }
        let took = worked;
        worked |= self.fire_due(Some(now)).await > 0;
        (took, worked)
    }

    /// Applies the batch, firing and yielding whenever a stretch runs past the budget.
    async fn apply_batch(&mut self) {
        let mut budget = TURN_BUDGET;
        let mut stretch = std::time::Instant::now();
        while !self.batch.is_empty() || self.machine.refill(&self.inbox, &mut self.batch) {
            self.apply_slice();
            let more = !self.batch.is_empty() || self.machine.waiting();
            if more && stretch.elapsed() >= budget {
                self.fire_due(None).await;
                tokio::task::yield_now().await;
                budget = (budget * 2).min(MAX_TURN_BUDGET);
                stretch = std::time::Instant::now();
            }
        }
        if self.batch.capacity() > RETAINED_BATCH {
            self.batch = VecDeque::new();
        }
    }

    fn apply_slice(&mut self) {
        let mut ctx = Ctx {
            shared: &self.shared,
            delta: &mut self.delta,
        };
        for _ in 0..SLICE {
            if let Some(ahead) = self.batch.get(PREFETCH_AHEAD) {
                self.machine.prefetch(ahead);
            }
            let Some(command) = self.batch.pop_front() else {
                break;
            };
            self.machine.apply(command, &mut ctx);
        }
    }

    /// Fires everything due, yielding between batches: first by `settled`, an instant read
    /// before the inbox was taken and all of it applied, then (or, in the middle of a batch,
    /// from the start) by the clock — commands may arrive while it yields. Returns how many
    /// timers it looked at.
    async fn fire_due(&mut self, mut settled: Option<u64>) -> usize {
        let mut total = 0;
        loop {
            // Later batches read the clock anew: by a fixed instant, timers parked within
            // their tick would be shown again and again without coming due.
            let (now, backlog) = match settled.take() {
                Some(now) => (now, Backlog::Applied),
                None => (self.shared.clock.now(), Backlog::Unapplied),
            };
            let before = self.progress();
            let mut ctx = Ctx {
                shared: &self.shared,
                delta: &mut self.delta,
            };
            let shown = self.machine.fire(now, FIRE_BATCH, backlog, &mut ctx);
            total += shown;
            if shown > 0 {
                tracing::trace!(shown, now, "fired");
            }
            // A full batch that fired or cancelled nothing was all timers put off: parked
            // within their tick, postponed, or (in the middle of a batch) held back behind a
            // queued command, each filed again a little later. Shown again they would be put
            // off again, chasing the clock, and the loop would never end — nor would the batch
            // they wait for be applied (a keyed actor hung on a flood that came due while it
            // applied it). The next turn (its wake-up is already due) applies what they wait
            // for, then fires them.
            if shown < FIRE_BATCH || self.progress() == before {
                return total;
            }
            tokio::task::yield_now().await;
        }
    }

    /// Timers resolved so far: what a firing pass changes unless it puts them all off.
    fn progress(&self) -> u64 {
        self.delta.fired + self.delta.cancelled
    }

    /// Merges the turn's counters and lets the machine answer barriers and trim memory;
    /// `worked`: the turn took commands or fired.
    fn publish(&mut self, worked: bool) {
        if worked && self.idle_since == Some(u64::MAX) && !self.release_blocked {
            // Memory was given back before: a new burst may have taken more since. Without
            // this, a burst applied and finished within one turn (filed, fired and released
            // before the turn's end, so never seen as busy) kept what it grew for good
            // (outside attack: one of eight timer shards kept 1.3 MB). A blocked release is
            // retried as the slots it waits for come back, below.
            self.idle_since = None;
        }
        // Read before the merge empties it: timers fired this turn.
        let fired = self.delta.fired;
        let pending = self.machine.len();
        let moves = self.machine.moves();
        let change = pending as i64 - self.reported_pending as i64;
        self.delta.rescheduled += moves.refiled - self.reported_moves.refiled;
        self.shared.counters.merge(
            &mut self.delta,
            change,
            moves.cascades - self.reported_moves.cascades,
        );
        self.reported_pending = pending;
        self.reported_moves = moves;
        let idle = pending == 0 && self.batch.is_empty();
        // Quiet: empty and idle, or with a few timers left in a pool a flood made large. The
        // memory release then runs as if idle, for the memory those timers do not use.
        let quiet = idle || (self.batch.is_empty() && self.machine.sparse(&self.shared));
        if quiet && !idle && fired > 0 {
            // Sparse, but still firing (the tail of a flood coming due): looking at memory
            // now would lock every inbox shard each turn and release in the middle of the
            // firing, delaying it (10^6 timers fired over 1 s: p99 lateness 1.2 → 3 ms).
            // Restart the grace instead: the release comes once the firing has stopped.
            self.idle_since = Some(self.shared.clock.now());
            self.release_blocked = false;
            self.machine.turn_done(&self.inbox, &self.shared);
            return;
        }
        if quiet && self.release_blocked && self.machine.freed().iter().any(|f| !f.is_empty()) {
            // Slots the last release found in use are coming back: try again once the
            // machine has been quiet for another grace period.
            self.release_blocked = false;
            self.idle_since = None;
        }
        if idle && self.kept_at_release > 0 {
            // The last release kept the memory of a few survivors, and they are gone (removed,
            // fired): give the rest back once idle for a grace period, rather than never.
            self.kept_at_release = 0;
            self.idle_since = None;
        }
        // Looked at only when quiet: `holds_memory` locks every inbox shard.
        let holds = quiet
            && self.idle_since != Some(u64::MAX)
            && (self.batch.capacity() > RETAINED_BATCH
                || self.machine.holds_memory(&self.shared)
                || self.inbox.holds_memory());
        if holds {
            let now = self.shared.clock.now();
            let since = *self.idle_since.get_or_insert(now);
            if now.saturating_sub(since) >= IDLE_GRACE.as_nanos() as u64 {
                self.inbox.trim();
                self.release_blocked = !self.machine.release_memory(&self.inbox, &self.shared);
                self.kept_at_release = pending;
                // Given back, or held by timers still in use: no reason to wake for it again
                // until the next burst, or until those timers give their slots back.
                self.idle_since = Some(u64::MAX);
            }
        } else if !quiet {
            self.idle_since = None;
            self.release_blocked = false;
        } else if self.idle_since != Some(u64::MAX) {
            // Quiet, and nothing left to give back (a drain took the memory the grace was
            // counting for): no release to wake for. Left set, its due time would pass and
            // ring the alarm on every turn — an idle actor spinning (outside attack).
            self.idle_since = None;
        }
        self.machine.turn_done(&self.inbox, &self.shared);
    }

    /// When to wake to give memory back, if the machine is idle and has not yet.
    fn memory_release_due(&self) -> Option<u64> {
        match self.idle_since {
            Some(since) if since != u64::MAX => {
                Some(since.saturating_add(IDLE_GRACE.as_nanos() as u64))
            }
            _ => None,
        }
    }

    /// Refuses further commands, applies every one still queued, then resolves everything
    /// filed as shut down. Idempotent.
    fn stop(&mut self, exit: Exit) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if exit == Exit::Shutdown {
            if self.shared.close() {
                tracing::debug!("the wheel stops: its runtime dropped an actor");
            }
            self.shared.request_shutdown();
        }
        self.delta.commands += self.machine.take_stopped(&self.inbox, &mut self.batch) as u64;
        while !self.batch.is_empty() || self.machine.refill(&self.inbox, &mut self.batch) {
            self.apply_slice();
        }
        if self.machine.len() > 0 {
            tracing::debug!(
                pending = self.machine.len(),
                "actor stops with timers pending"
            );
        }
        let mut ctx = Ctx {
            shared: &self.shared,
            delta: &mut self.delta,
        };
        while self.machine.shut_down_some(usize::MAX, &mut ctx) > 0 {}
        self.publish(false);
    }
}

impl<M: Machine> Drop for Actor<M> {
    fn drop(&mut self) {
        // Dropped before its loop ended: its runtime is going away. The wheel stops with it.
        self.stop(Exit::Shutdown);
        self.shared.actor_stopped();
        tracing::debug!("actor stopped");
    }
}

pin_project! {
    /// An actor's loop, each poll run as the actor: sends made from inside it (a value's
    /// `Drop`, a job dropped at shutdown) never wait for room in an inbox (see `inbox`).
    struct AsActor<F> {
        #[pin]
        run: F,
    }
}

impl<F: std::future::Future> std::future::Future for AsActor<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let run = self.project().run;
        as_actor(|| run.poll(cx))
    }
}
