//! The queue's engine on an embedded [`Store`]: one task that owns the store, applies requests
//! in batches (one store transaction per batch), and hands due tasks to consumers. What it
//! shares with the Redis backend (requests, consumers, settings, clocks) is in
//! `protocol.rs`.
//!
//! - `run.rs`: the loop (batches, streams and prefetch, lease renewal, close);
//! - `step.rs`: one batch applied in one transaction (schedule, cancel, finish: ack, retry,
//!   dead letters), answered once it commits;
//! - `claims.rs`: expired leases, due claims, recurring occurrences;
//! - `flights.rs`: the deliveries held in memory and the journal that undoes a failed step;
//! - `inspect.rs`: get, list, dead letters, purge, stats.
//!
//! The tasks live in the store, not in memory: each step reads what it needs (the head of the
//! pending index, the records it changes, the payloads it hands out) inside its transaction.
//! In memory the engine keeps only the deliveries its streams hold (bounded by their
//! prefetch), so its memory does not grow with the backlog and opening a store reads only
//! what a previous holder left in flight.
//!
//! Leases are in-process state here: the store's lock proves no other process holds a task,
//! so a lease only has to end while this process lives. A delivery's lease starts when its
//! stream yields it ([`Request::HandedOut`]); while it waits in a prefetch buffer it has none.
//!
//! A failed transaction leaves the store as it was; the engine undoes its in-memory changes
//! from a journal (the deliveries the step started or ended, the counters), so its state is
//! again exactly what the store holds: no reload, no lease treated as orphaned, and the claims
//! the step made go back to their streams' credits. It tries again after a backoff, so a
//! waiting stream gets its delivery once the store recovers.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::inspect::{LatenessWindow, QueueStats, TaskFilter, TaskInfo, TaskState, percentile};
use crate::protocol::{
    Consumer, Reply, Request, Settings, Want, attach, far_future, instant_of, last_attempt_reason,
    lease_expired_reason, now_ms, stale_cursor, system_time,
};
use crate::recurring::{Spec, occurrence_id};
use crate::store::{Store, Table};
use crate::tasks::{Counters, FORMAT, Record, State, Tasks};
use crate::{Cursor, DeadLetter, Delivery, Error, Page, Recurring, RecurringPage, Task, TaskId};
use tokio_wheel::Wheel;

mod claims;
mod flights;
mod inspect;
mod run;
mod step;

/// Requests handled per batch (and so per store transaction).
const BATCH: usize = 1024;
/// Most leases expired, tasks claimed, or dead letters purged per store transaction: a step's
/// work is bounded however large the backlog (the rest follows in the next steps).
pub(crate) const STEP_LIMIT: usize = 1000;
/// Backoff after a failed commit: doubles from the first to the last.
const RETRY_BACKOFF: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(2));

/// What to answer once the batch's transaction has committed (or failed).
type Answer = Box<dyn FnOnce(Option<&Error>) + Send>;

fn answer<T: Send + 'static>(reply: Reply<T>, value: Result<T, Error>) -> Answer {
    Box::new(move |failure: Option<&Error>| {
        let _ = reply.send(match failure {
            Some(error) => Err(error.clone()),
            None => value,
        });
    })
}

/// Whether an error means the store failed (the step is abandoned), rather than an answer.
fn is_store_failure(error: &Error) -> bool {
    matches!(error, Error::Io(_) | Error::Corrupt(_))
}

/// A task handed to a stream and not finished.
#[derive(Clone)]
struct Flight {
    id: String,
    /// When the lease ends; `None` while the delivery waits in its stream's buffer.
    lease_until: Option<u64>,
    /// Handed out and neither finished nor dropped: `close` waits for it, keep-alive renews it.
    held: bool,
}

/// A claim made in this step, handed to its stream once the step is durable.
struct Claimed {
    consumer: usize,
    id: String,
    token: u64,
    payload: Vec<u8>,
    attempt: u32,
    due_ms: u64,
}

/// What one step is asked to do.
struct Plan {
    now: u64,
    requests: VecDeque<Request>,
    /// Expire leases and purge (not while backing off after a failed commit).
    expire: bool,
    /// The credits of the streams that want deliveries, by consumer index.
    wants: Vec<Want>,
}

/// What one step did.
struct Outcome {
    claims: Vec<Claimed>,
    /// Requests that go on in the next step.
    continuing: Vec<Request>,
    /// The earliest pending due time, after the step.
    next_due: Option<u64>,
    failure: Option<Error>,
}

/// The deliveries this process holds: the engine's only per-task memory.
#[derive(Default)]
struct Flights {
    /// In-flight tasks by delivery token.
    by_token: HashMap<u64, Flight>,
    /// The token of each in-flight task's current delivery.
    tokens: HashMap<String, u64>,
    /// Handed-out deliveries by (lease end, token).
    leases: BTreeSet<(u64, u64)>,
    /// How to put each flight the step changed back, newest last: (id, what it was).
    journal: Vec<(String, Option<(u64, Flight)>)>,
}

/// The engine's state that a step works on, moved to a blocking thread for the step.
struct Core {
    store: Box<dyn Store>,
    settings: Settings,
    flights: Flights,
    next_token: u64,
    next_seq: u64,
    counters: Counters,
    lateness: LatenessWindow,
    /// Paused: nothing is claimed (kept in the store's `Meta`, so it survives a restart).
    paused: bool,
    /// Tokens of the latest deliveries acked: an `ack` made again answers `Ok`, also when
    /// the first call's caller went away before its answer (memory only, bounded).
    acked: Acked,
}

/// The most recently acked delivery tokens, at most [`Acked::KEPT`].
#[derive(Default)]
struct Acked {
    tokens: std::collections::HashSet<u64>,
    order: VecDeque<u64>,
}

impl Acked {
    const KEPT: usize = 4096;

    fn contains(&self, token: u64) -> bool {
        self.tokens.contains(&token)
    }

    fn insert(&mut self, token: u64) {
        if self.tokens.insert(token) {
            self.order.push_back(token);
            if self.order.len() > Acked::KEPT {
                let old = self.order.pop_front().expect("not empty");
                self.tokens.remove(&old);
            }
        }
    }
}

pub(crate) struct Engine {
    /// Absent only while a step runs (or after the store panicked).
    core: Option<Core>,
    consumers: Vec<Consumer>,
    requests: mpsc::UnboundedReceiver<Request>,
    /// Handed to deliveries, so they can ack.
    handle: mpsc::WeakUnboundedSender<Request>,
    wheel: Wheel,
    /// Requests for the store, applied in the next step.
    queued: Vec<Request>,
    /// The earliest pending due time in the store.
    next_due: Option<u64>,
    /// After a failed commit: when to try again, and the backoff after that.
    retry_at: Option<Instant>,
    backoff: Duration,
    /// Keep-alive: when to renew the held leases next.
    renew_at: Option<Instant>,
    /// Retention: when to look for old dead letters next.
    purge_at: Option<Instant>,
    /// `close()` callers, and how long the close waits for held deliveries.
    closing: Vec<Reply<()>>,
    close_deadline: Option<Instant>,
}

fn missing(id: &str) -> Error {
    Error::Corrupt(format!("task {id:?} is indexed but has no record"))
}

/// The earliest pending due time.
fn head(tasks: &mut Tasks<'_>) -> Result<Option<u64>, Error> {
    Ok(tasks
        .ordered(Table::Pending, None, 1)?
        .first()
        .map(|&(due, ..)| due))
}

/// A delivery ended without ack or retry (lease expired, or its holder died): pending again
/// at once, or dead if it has had all its attempts.
fn lease_over(settings: &Settings, record: &Record, now: u64, counters: &mut Counters) -> Record {
    let mut next = record.clone();
    if record.attempts >= settings.policy.attempts() {
        next.state = State::Dead;
        next.dead_ms = now;
        next.reason = lease_expired_reason(record.attempts, settings.policy.attempts());
        counters.dead_lettered += 1;
    } else {
        next.state = State::Pending;
        next.due_ms = now;
        counters.expired += 1;
    }
    next
}

fn lease_result(held: bool) -> Result<(), Error> {
    if held { Ok(()) } else { Err(Error::LeaseLost) }
}

/// A step's view of the core (everything but the store, which runs the transaction).
struct StepState<'c> {
    settings: &'c Settings,
    flights: &'c mut Flights,
    next_token: &'c mut u64,
    next_seq: &'c mut u64,
    counters: &'c mut Counters,
    lateness: &'c mut LatenessWindow,
    paused: &'c mut bool,
    /// Deliveries acked before this step, and by it (kept once it commits).
    acked: &'c Acked,
    acked_now: Vec<u64>,
    now: u64,
}

enum Finish {
    Ack,
    Retry(Option<Duration>),
    Fail(String),
}
