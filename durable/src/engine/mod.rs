//! The queue's engine on an embedded [`Store`]: one task that owns the store, applies requests
//! in batches (one store transaction per batch), and hands due tasks to consumers. Also what
//! both backends share: requests, consumers, settings, clocks, and what they take from the
//! wheel ([`attach`]).
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
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::inspect::{LatenessWindow, QueueStats, TaskFilter, TaskInfo, TaskState, percentile};
use crate::recurring::{Spec, occurrence_id};
use crate::store::{Store, Table};
use crate::tasks::{Counters, FORMAT, Record, State, Tasks};
use crate::{DeadLetter, Delivery, Error, Recurring, RetryPolicy, Task, TaskId};
use tokio_wheel::{Stopped, Wheel};

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

pub(crate) type Reply<T> = oneshot::Sender<Result<T, Error>>;

pub(crate) enum Request {
    Schedule(Task, Reply<TaskId>),
    Cancel(String, Reply<bool>),
    Reschedule(String, u64, Reply<bool>),
    Len(Reply<usize>),
    DeadLetters(Reply<Vec<DeadLetter>>),
    Redrive(String, Reply<bool>),
    Ack(String, u64, Reply<()>),
    /// Id, token, the delivery's attempt, and an explicit delay (else the policy's).
    Retry(String, u64, u32, Option<Duration>, Reply<()>),
    Fail(String, u64, String, Reply<()>),
    /// Token and the new lease length from now.
    Extend(u64, Duration, Reply<()>),
    /// The stream yielded this delivery: its lease starts.
    HandedOut(u64),
    /// A handed-out delivery was dropped unfinished: its lease runs out as usual, but nothing
    /// waits for it or keeps it alive any more.
    Dropped(u64),
    /// A delivery was dropped before its stream yielded it: the task goes back at once.
    Release(u64),
    /// A handed-out delivery is being finished directly with the store (Redis): nothing waits
    /// for it or keeps it alive any more.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Finishing(u64),
    Subscribe(Consumer),
    /// A consumer has room for more deliveries.
    Demand,
    Close(Reply<()>),
    Get(String, Reply<Option<TaskInfo>>),
    /// Filter, cursor, limit.
    List(TaskFilter, Option<String>, usize, Reply<Vec<TaskInfo>>),
    DeadPage(Option<String>, usize, Reply<Vec<DeadLetter>>),
    /// Purges dead letters that died before a time (ms): bounded per step, the request goes on
    /// in the next step until done. Retention sends it without a reply.
    Purge {
        before_ms: u64,
        removed: u64,
        reply: Option<Reply<u64>>,
    },
    Stats(Reply<QueueStats>),
    ScheduleRecurring(Recurring, Reply<TaskId>),
    CancelRecurring(String, Reply<bool>),
}

/// A stream that wants deliveries, as one step sees it.
pub(crate) struct Want {
    consumer: usize,
    credits: Arc<AtomicUsize>,
    in_transit: Arc<AtomicUsize>,
}

/// One `deliveries()` stream, as the engine sees it.
pub(crate) struct Consumer {
    pub(crate) credits: Arc<AtomicUsize>,
    /// Claimed for this stream and not yet in its channel (a claim waits for its commit): the
    /// stream asks for more only when this, its credits and its buffer are all empty, so it
    /// never holds more than the prefetch ahead.
    pub(crate) in_transit: Arc<AtomicUsize>,
    /// Set when the queue closes: the stream drops what it buffered (the engine returned it).
    pub(crate) closed: Arc<AtomicBool>,
    pub(crate) sender: mpsc::UnboundedSender<Delivery>,
}

impl Consumer {
    pub(crate) fn wants(&self) -> bool {
        self.credits.load(Ordering::Acquire) > 0 && !self.sender.is_closed()
    }

    /// Ends the stream: what it buffered is not handed out.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }
}

pub(crate) struct Settings {
    pub(crate) policy: RetryPolicy,
    pub(crate) lease: Duration,
    pub(crate) keep_alive: bool,
    pub(crate) close_timeout: Duration,
    /// Dead letters older than this are purged on their own.
    pub(crate) retention: Option<Duration>,
}

impl Settings {
    pub(crate) fn lease_ms(&self) -> u64 {
        crate::delay_ms(self.lease)
    }

    /// How often buffered claims (and, with keep-alive, held deliveries) are renewed.
    pub(crate) fn renew_every(&self) -> Duration {
        (self.lease / 3).max(Duration::from_millis(1))
    }

    /// How often retention looks for dead letters to purge.
    pub(crate) fn purge_every(&self) -> Option<Duration> {
        self.retention
            .map(|keep| (keep / 4).clamp(Duration::from_millis(10), Duration::from_secs(60)))
    }
}

/// What the durable engines need from their wheel: the runtime to run on and the shutdown
/// signal (both public API of the wheel).
pub(crate) struct Attachment {
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) shutdown: Stopped,
}

pub(crate) fn attach(wheel: &Wheel) -> Attachment {
    Attachment {
        runtime: wheel.runtime().clone(),
        shutdown: wheel.stopped(),
    }
}

pub(crate) fn now_ms() -> u64 {
    crate::epoch_ms(SystemTime::now())
}

/// Why a task retried on its last delivery went to the dead letters.
pub(crate) fn last_attempt_reason(attempts: u32) -> String {
    format!("retried on its last delivery ({attempts} of {attempts})")
}

/// Why a task whose last lease expired went to the dead letters (the Redis claim script
/// writes the same words).
pub(crate) fn lease_expired_reason(attempts: u32, max_attempts: u32) -> String {
    format!("lease expired on delivery {attempts} of {max_attempts}")
}

pub(crate) fn system_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// The instant on Tokio's clock when this process's wall clock reads `ms`.
pub(crate) fn instant_of(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms.saturating_sub(now_ms()))
}

/// Where a backend with nothing to wait for parks its wake-up.
pub(crate) fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365)
}

/// The clear error for a list or page cursor that is not (any more) in the listed state.
pub(crate) fn stale_cursor(id: &str, filter: TaskFilter) -> Error {
    Error::Invalid(format!(
        "the cursor task {id:?} is not {} (any more): list again from the start",
        filter.name()
    ))
}

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
    now: u64,
}

enum Finish {
    Ack,
    Retry(Option<Duration>),
    Fail(String),
}
