//! The machine of a timer actor: sleeps (and the timeouts and intervals built on them) and
//! one-shot jobs, each a slot of its lane's timer pool, filed in the wheel under its slot
//! index. A wheel runs one timer actor per lane (`Builder::timer_shards`), each with its own
//! pool, inbox and cascade.
//!
//! The actor learns a timer's deadline from the command that files it and touches the slot's
//! shared word only when the timer comes due (to fire it, or to find it postponed) or when the
//! wheel stops. A slot goes back to its shard's free list once its handle has released it and
//! the wheel no longer holds it — for a sleep the actor fired, straight from its handle's drop
//! (no `Release` to apply: one per timer of a flood).
//!
//! Memory: after a flood the pool gives back every segment none of whose slots is in use, and
//! the wheel every chunk of nodes with nothing filed (see `timer::pool`), as soon as the actor
//! has been quiet for the idle grace with the pool at least four times what is filed — not
//! only once it is empty, so an hour-long timer made among a million short ones holds its own
//! segment (at most 4 MiB) rather than the flood's 56 MiB.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::Waker;

use tokio::sync::oneshot;

use super::inbox::{Inbox, Placeholder};
use super::timeline::{Moves, Timeline, Verdict};
use super::{Backlog, Ctx, Machine};
use crate::timer::Launch;
use crate::timer::clock::Clock;
use crate::timer::pool::Pool;
use crate::timer::shared::Shared;
use crate::timer::state::{Due, State};

/// Pool slots an idle wheel keeps over all its timer lanes (each keeps its share); the rest
/// is given back after a burst.
const RETAINED_SLOTS: u32 = 4 * 1024;

/// What handles ask of a timer actor.
pub(crate) enum Command {
    /// File `slot` (armed for `deadline`), or move it there if it is still filed.
    Insert { slot: u32, deadline: u64 },
    /// File a job's slot and keep its launcher until it is due.
    InsertJob(Box<JobInsert>),
    /// Move a filed slot earlier, to `deadline`.
    Advance { slot: u32, deadline: u64 },
    /// Take a slot out of the wheel now (its word says cancelled).
    Unfile { slot: u32 },
    /// The handle is done with `slot`, taken from inbox shard `shard`: a sleep's is taken out
    /// (its word says cancelled or fired) and freed; a job's is freed once it fires.
    Release { slot: u32, shard: u32 },
    /// Answer once every command sent before this one is applied and counted in the stats.
    Flush(oneshot::Sender<()>),
    /// An `Insert` its handle withdrew before the actor took it: nothing to do.
    Withdrawn,
}

impl Placeholder for Command {
    fn placeholder() -> Self {
        Command::Withdrawn
    }
    fn is_placeholder(&self) -> bool {
        matches!(self, Command::Withdrawn)
    }
}

/// A job to file.
pub(crate) struct JobInsert {
    pub(crate) slot: u32,
    pub(crate) deadline: u64,
    pub(crate) launch: Arc<dyn Launch>,
}

struct FiledJob {
    launch: Arc<dyn Launch>,
    /// The shard its handle released the slot to, once it has.
    released: Option<u32>,
}

pub(crate) struct TimerMachine {
    /// The shared state of this lane's timers.
    pool: Arc<Pool>,
    /// Pool slots this lane keeps once idle: its share of [`RETAINED_SLOTS`] (with more than
    /// four lanes, less than a segment: an idle lane then gives back every segment, so a
    /// wheel's idle memory does not grow with its lanes).
    retained: u32,
    timeline: Timeline,
    jobs: HashMap<u32, FiledJob>,
    /// Slots to give back, per inbox shard.
    freed: Vec<Vec<u32>>,
    /// Slots given back so far, and how many had been when a memory release last found
    /// segments still in use: the next pass waits until enough more come back to be worth its
    /// linear cost (a busy wheel returns slots all the time).
    returned: u64,
    blocked_at: Option<u64>,
    flushes: Vec<oneshot::Sender<()>>,
    /// Timers still to resolve while the wheel stops.
    stopping: Vec<u32>,
    /// Wakers of the timers a fire pass fired, taken from their slots as it fires them and
    /// woken together once the pass ends (at most `FIRE_BATCH` of them). Woken one by one
    /// as their timers fired, a task waiting on many timers from outside the runtime's
    /// workers (`block_on`'s future) was woken, preempted the actor's worker on its own core
    /// and parked again several times per pass: 2.2-2.5x the context switches and ~1.2x
    /// the CPU per fired timer of one burst (BENCHMARKS.md). Costs the pass's first timer the
    /// rest of the pass, tens of microseconds at most.
    woken: Vec<Waker>,
}

impl TimerMachine {
    /// The machine of one of `lanes` timer lanes, whose inbox has `shards` shards.
    pub(crate) fn new(
        pool: Arc<Pool>,
        lanes: usize,
        levels: &[u32],
        clock: Clock,
        shards: usize,
    ) -> Self {
        TimerMachine {
            pool,
            retained: RETAINED_SLOTS / lanes.max(1) as u32,
            timeline: Timeline::new(levels, clock),
            jobs: HashMap::new(),
            freed: vec![Vec::new(); shards],
            returned: 0,
            blocked_at: None,
            flushes: Vec::new(),
            stopping: Vec::new(),
            woken: Vec::new(),
        }
    }
}

// Most wheels fire sleeps only: with no job filed, skip hashing the slot on every fire and
// release (~10 ns each, seen in the fire profile).
fn take_job(jobs: &mut HashMap<u32, FiledJob>, slot: u32) -> Option<FiledJob> {
    if jobs.is_empty() {
        None
    } else {
        jobs.remove(&slot)
    }
}

fn job_mut(jobs: &mut HashMap<u32, FiledJob>, slot: u32) -> Option<&mut FiledJob> {
    if jobs.is_empty() {
        None
    } else {
        jobs.get_mut(&slot)
    }
}

fn free(freed: &mut [Vec<u32>], returned: &mut u64, slot: u32, shard: u32) {
    freed[shard as usize].push(slot);
    *returned += 1;
}

impl Machine for TimerMachine {
    type Command = Command;

    fn apply(&mut self, command: Command, ctx: &mut Ctx<'_>) {
        match command {
            Command::Insert { slot, deadline } => {
                ctx.delta.inserted += 1;
                if self.timeline.contains(slot) {
                    // Re-armed before the wheel got to it: its handle had completed it.
                    ctx.delta.fired += 1;
                }
                self.timeline.file(slot, deadline);
            }
            Command::InsertJob(job) => {
                ctx.delta.inserted += 1;
                self.jobs.insert(
                    job.slot,
                    FiledJob {
                        launch: job.launch,
                        released: None,
                    },
                );
                self.timeline.file(job.slot, job.deadline);
            }
            Command::Advance { slot, deadline } => {
                if self.timeline.advance_to(slot, deadline) {
                    ctx.delta.rescheduled += 1;
                }
            }
            Command::Unfile { slot } => {
                if self.timeline.unfile(slot) {
                    ctx.delta.cancelled += 1;
                    if let Some(FiledJob {
                        released: Some(shard),
                        ..
                    }) = self.jobs.remove(&slot)
                    {
                        free(&mut self.freed, &mut self.returned, slot, shard);
                    }
                }
            }
            Command::Release { slot, shard } => {
                if let Some(job) = job_mut(&mut self.jobs, slot) {
                    // A detached job still runs: free its slot once it fires.
                    job.released = Some(shard);
                    return;
                }
                if self.timeline.unfile(slot) {
                    match self.pool.get(slot).word.state() {
                        State::Fired => ctx.delta.fired += 1,
                        _ => ctx.delta.cancelled += 1,
                    }
                }
                free(&mut self.freed, &mut self.returned, slot, shard);
            }
            Command::Flush(reply) => self.flushes.push(reply),
            Command::Withdrawn => {}
        }
    }

    fn fire(&mut self, now: u64, budget: usize, _backlog: Backlog, ctx: &mut Ctx<'_>) -> usize {
        // A queued command never makes a due timer wrong to fire: cancels and moves are in
        // the shared word before their command is sent.
        let TimerMachine {
            pool,
            timeline,
            jobs,
            freed,
            returned,
            woken,
            ..
        } = self;
        let shared = ctx.shared;
        let delta = &mut *ctx.delta;
        let fired = timeline.expire(now, budget, |id, limit| {
            let slot = pool.get(id);
            match slot.word.on_due(limit) {
                Due::Fire(deadline) => {
                    delta.record_fire(deadline, now);
                    match take_job(jobs, id) {
                        Some(job) => {
                            job.launch.launch(shared);
                            if let Some(shard) = job.released {
                                free(freed, returned, id, shard);
                            }
                        }
                        // Taken now, as a wake would: the slot's next user registers
                        // its own (at worst this takes and wakes that one, spuriously).
                        None => woken.extend(slot.waker.take()),
                    }
                    Verdict::Done
                }
                Due::Later(deadline) => Verdict::Later(deadline),
                Due::Completed => {
                    delta.fired += 1;
                    Verdict::Done
                }
                Due::Cancelled => {
                    delta.cancelled += 1;
                    if let Some(FiledJob {
                        released: Some(shard),
                        ..
                    }) = take_job(jobs, id)
                    {
                        free(freed, returned, id, shard);
                    }
                    Verdict::Done
                }
            }
        });
        woken.drain(..).for_each(Waker::wake);
        fired
    }

    fn next_wake(&self) -> Option<u64> {
        self.timeline.next_wake()
    }

    fn len(&self) -> usize {
        self.timeline.len()
    }

    fn moves(&self) -> Moves {
        self.timeline.moves()
    }

    fn shut_down_some(&mut self, budget: usize, ctx: &mut Ctx<'_>) -> usize {
        if self.stopping.is_empty() {
            self.stopping = self.timeline.drain().collect();
        }
        let pool = &self.pool;
        let start = self.stopping.len().saturating_sub(budget);
        let batch: Vec<u32> = self.stopping.drain(start..).collect();
        for &id in &batch {
            let slot = pool.get(id);
            let job = self.jobs.remove(&id);
            if slot.word.shut_down() {
                ctx.delta.cancelled += 1;
                match job {
                    Some(job) => job.launch.refuse(),
                    None => slot.waker.wake(),
                }
            } else if slot.word.state() == State::Fired {
                ctx.delta.fired += 1;
            } else {
                ctx.delta.cancelled += 1;
            }
        }
        if self.stopping.is_empty() {
            self.jobs.clear();
        }
        batch.len()
    }

    fn freed(&mut self) -> &mut [Vec<u32>] {
        &mut self.freed
    }

    fn wants_barrier(&self) -> bool {
        !self.flushes.is_empty()
    }

    fn holds_memory(&self, _shared: &Shared) -> bool {
        // Empty, any slot back may free a segment; with timers filed, wait for a few more.
        let worth_a_pass = self.timeline.len() == 0
            || self
                .blocked_at
                .is_none_or(|at| self.returned - at >= u64::from(RETAINED_SLOTS));
        (self.pool.capacity() > self.retained && worth_a_pass)
            || self.jobs.capacity() > 2 * self.jobs.len() + 64
            || self
                .freed
                .iter()
                .any(|freed| freed.capacity() > RETAINED_SLOTS as usize)
    }

    fn sparse(&self, _shared: &Shared) -> bool {
        // Most of the pool unused: a flood is over but some timers outlive it.
        let capacity = self.pool.capacity();
        capacity > self.retained && (self.timeline.len() as u64) * 4 < u64::from(capacity)
    }

    fn release_memory(&mut self, inbox: &Inbox<Command>, _shared: &Arc<Shared>) -> bool {
        if self.jobs.capacity() > 2 * self.jobs.len() + 64 {
            self.jobs.shrink_to_fit();
        }
        let mut all = true;
        let pool = &self.pool;
        if pool.capacity() > self.retained {
            // From here until every segment has gone, handles release fired sleeps through
            // the actor, which sees them come back and tries again (see `Inbox::give_back`).
            inbox.watch_returns(true);
            let keep = Pool::segments_within(self.retained);
            let released = inbox.release_segments(pool, &mut self.freed, keep);
            if !released.is_empty() {
                tracing::debug!(capacity = pool.capacity(), "timer pool shrunk");
            }
            // Segments still held (by long timers, a fired job's handle, a sleep that completed
            // and was not dropped) can go once their slots come back.
            all = pool.capacity() <= self.retained;
            self.blocked_at = (!all).then_some(self.returned);
        }
        inbox.watch_returns(!all);
        // The wheel's nodes go by chunk wherever nothing is filed: those of freed segments, and
        // those of the segments a few long timers keep.
        self.timeline.release_unfiled();
        for freed in &mut self.freed {
            if freed.is_empty() && freed.capacity() > RETAINED_SLOTS as usize {
                *freed = Vec::new();
            }
        }
        all
    }

    fn turn_done(&mut self, _inbox: &Inbox<Command>, _shared: &Arc<Shared>) {
        for reply in self.flushes.drain(..) {
            let _ = reply.send(());
        }
    }
}
