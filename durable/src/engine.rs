//! The queue's engine on an embedded [`Store`]: one task that owns the store, applies requests
//! in batches (one store transaction per batch), and hands due tasks to consumers. Also what
//! both backends share: requests, consumers, settings, clocks, and the one place that reaches
//! into the wheel beyond its public API ([`attach`]).
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

use super::inspect::{LatenessWindow, QueueStats, TaskFilter, TaskInfo, TaskState, percentile};
use super::recurring::{Spec, occurrence_id};
use super::store::{Store, Table};
use super::tasks::{Counters, FORMAT, Record, State, Tasks};
use super::{DeadLetter, Delivery, Error, Recurring, RetryPolicy, Task, TaskId};
use tokio_wheel::{Stopped, Wheel};

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
        super::delay_ms(self.lease)
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
    super::epoch_ms(SystemTime::now())
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

impl Flights {
    fn holds(&self, id: &str, token: u64) -> bool {
        self.tokens.get(id) == Some(&token)
    }

    fn of(&self, id: &str) -> Option<&Flight> {
        self.tokens
            .get(id)
            .and_then(|token| self.by_token.get(token))
    }

    fn journal(&mut self, id: &str) {
        let before = self
            .tokens
            .get(id)
            .map(|&token| (token, self.by_token[&token].clone()));
        self.journal.push((id.to_owned(), before));
    }

    fn unlink(&mut self, id: &str) -> Option<(u64, Flight)> {
        let token = self.tokens.remove(id)?;
        let flight = self.by_token.remove(&token).expect("a flight per token");
        if let Some(until) = flight.lease_until {
            self.leases.remove(&(until, token));
        }
        Some((token, flight))
    }

    fn link(&mut self, token: u64, flight: Flight) {
        if let Some(until) = flight.lease_until {
            self.leases.insert((until, token));
        }
        self.tokens.insert(flight.id.clone(), token);
        self.by_token.insert(token, flight);
    }

    /// Ends `id`'s flight (journaled).
    fn end(&mut self, id: &str) {
        self.journal(id);
        self.unlink(id);
    }

    /// Starts a flight (journaled).
    fn start(&mut self, token: u64, flight: Flight) {
        self.journal(&flight.id);
        self.link(token, flight);
    }

    /// Puts every flight the failed step changed back as it was.
    fn undo(&mut self) {
        while let Some((id, before)) = self.journal.pop() {
            self.unlink(&id);
            if let Some((token, flight)) = before {
                self.link(token, flight);
            }
        }
    }

    /// Moves a handed-out delivery's lease end (memory only: see the module docs).
    fn set_lease(&mut self, token: u64, until: u64) {
        let flight = self.by_token.get_mut(&token).expect("present");
        if let Some(old) = flight.lease_until.replace(until) {
            self.leases.remove(&(old, token));
        }
        self.leases.insert((until, token));
    }
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

impl Engine {
    /// Opens the store's tables (blocking), resolves what a previous holder left in flight, and
    /// returns the engine ready to run. Reads the counters and the in-flight index only.
    pub(crate) fn load(
        store: Box<dyn Store>,
        settings: Settings,
        requests: mpsc::UnboundedReceiver<Request>,
        handle: mpsc::WeakUnboundedSender<Request>,
        wheel: Wheel,
    ) -> Result<Engine, Error> {
        let mut core = Core {
            store,
            settings,
            flights: Flights::default(),
            next_token: 0,
            next_seq: 0,
            counters: Counters::default(),
            lateness: LatenessWindow::default(),
        };
        let (mut next_seq, mut counters) = (0, Counters::default());
        core.store.transact(&mut |tx| {
            let mut tasks = Tasks { tx };
            let format = tasks.meta("format")?;
            if format == 0 {
                if tasks.count(Table::Records)? > 0 {
                    return Err(Error::Corrupt(
                        "task records without a format version".into(),
                    ));
                }
                tasks.set_meta("format", FORMAT)?;
            } else if format != FORMAT {
                return Err(Error::Corrupt(format!(
                    "store format {format} is not one this version reads ({FORMAT})"
                )));
            }
            next_seq = tasks.meta("seq")?;
            counters = tasks.counters()?;
            Ok(())
        })?;
        core.next_seq = next_seq;
        core.counters = counters;
        // Holding the lock proves the previous holder is gone: its leases are over.
        let now = now_ms();
        loop {
            let before = core.counters;
            let mut orphans = 0;
            let Core {
                store,
                settings,
                counters,
                ..
            } = &mut core;
            store.transact(&mut |tx| {
                let mut tasks = Tasks { tx };
                let mut changed = *counters;
                let ids = tasks.in_flight(None, STEP_LIMIT)?;
                orphans = ids.len();
                for id in ids {
                    let record = tasks.get(&id)?.ok_or_else(|| missing(&id))?;
                    let next = lease_over(settings, &record, now, &mut changed);
                    tasks.put(&id, Some(&record), &next)?;
                }
                tasks.save_counters(&before, &changed)?;
                *counters = changed;
                Ok(())
            })?;
            if orphans < STEP_LIMIT {
                break;
            }
        }
        let mut next_due = None;
        core.store.transact(&mut |tx| {
            next_due = head(&mut Tasks { tx })?;
            Ok(())
        })?;
        let purge_at = core
            .settings
            .purge_every()
            .map(|every| Instant::now() + every);
        Ok(Engine {
            core: Some(core),
            consumers: Vec::new(),
            requests,
            handle,
            wheel,
            queued: Vec::new(),
            next_due,
            retry_at: None,
            backoff: RETRY_BACKOFF.0,
            renew_at: None,
            purge_at,
            closing: Vec::new(),
            close_deadline: None,
        })
    }

    fn core(&mut self) -> &mut Core {
        self.core.as_mut().expect("the core is home between steps")
    }

    pub(crate) async fn run(mut self) {
        let mut shutdown = attach(&self.wheel).shutdown;
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            if shutdown.is_stopped() || self.close_done() || self.core.is_none() {
                break;
            }
            let next = self.next_wake();
            let sleep = self.wheel.sleep_until(next.unwrap_or_else(far_future));
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                received = self.requests.recv_many(&mut batch, BATCH) => {
                    if received == 0 {
                        break; // every handle, stream and delivery is gone
                    }
                    for request in batch.drain(..) {
                        self.handle_request(request);
                    }
                }
                () = sleep, if next.is_some() => {}
            }
            self.step(false).await;
        }
        tracing::debug!("durable queue engine stops; its tasks stay in the store");
        // What is already queued first: a delivery its stream yielded just before the stop is
        // held, not buffered, and must not be returned. The rest is refused, so no caller
        // waits for an answer that never comes.
        self.requests.close();
        while let Ok(request) = self.requests.try_recv() {
            match request {
                Request::HandedOut(_)
                | Request::Dropped(_)
                | Request::Release(_)
                | Request::Finishing(_)
                    if self.core.is_some() =>
                {
                    self.handle_request(request)
                }
                other => refuse(other),
            }
        }
        for request in std::mem::take(&mut self.queued) {
            match request {
                Request::Release(_) => self.queued.push(request),
                other => refuse(other),
            }
        }
        if self.core.is_some() {
            // Buffered claims go back now (best effort: if this commit fails, the next open
            // delivers them again, as after a crash).
            self.begin_close_of_streams();
            self.step(true).await;
        }
        // Release the store (and its lock) before `close()` returns.
        if let Some(core) = self.core.take() {
            let _ = tokio::task::spawn_blocking(move || drop(core)).await;
        }
        for reply in self.closing.drain(..) {
            let _ = reply.send(Ok(()));
        }
    }

    /// Closing, and nothing handed out is still held (or the close timeout passed).
    fn close_done(&self) -> bool {
        let Some(deadline) = self.close_deadline else {
            return false;
        };
        Instant::now() >= deadline
            || self
                .core
                .as_ref()
                .is_none_or(|core| !core.flights.by_token.values().any(|f| f.held))
    }

    /// Ends every stream and returns what they buffered.
    fn begin_close_of_streams(&mut self) {
        for consumer in self.consumers.drain(..) {
            consumer.close();
        }
        let buffered: Vec<u64> = self
            .core()
            .flights
            .by_token
            .iter()
            .filter(|(_, f)| f.lease_until.is_none())
            .map(|(&token, _)| token)
            .collect();
        self.queued
            .extend(buffered.into_iter().map(Request::Release));
    }

    /// The next time the engine must act: a task due (when someone wants it), a lease
    /// ending, a keep-alive renewal, a retention purge, the close deadline — or, after a
    /// failed commit, the retry.
    fn next_wake(&self) -> Option<Instant> {
        if let Some(at) = self.retry_at {
            return Some(at);
        }
        if !self.queued.is_empty() {
            return Some(Instant::now()); // a request goes on in the next step
        }
        let core = self.core.as_ref()?;
        let wanted = self.consumers.iter().any(Consumer::wants);
        let due = self
            .next_due
            .filter(|_| wanted && self.close_deadline.is_none());
        let lease = core.flights.leases.first().map(|&(until, _)| until);
        let wall = match (due, lease) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        [
            wall.map(instant_of),
            self.renew_at,
            self.purge_at,
            self.close_deadline,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Expires leases, applies the queued requests, hands out due tasks — one transaction —
    /// then answers and delivers. Does nothing when there is nothing to do. `last`: the final
    /// step before the engine stops (claims nothing).
    async fn step(&mut self, last: bool) {
        if self.core.is_none() {
            return;
        }
        let now = now_ms();
        let retrying = self.retry_at.is_some_and(|at| at > Instant::now());
        if !retrying {
            self.retry_at = None;
            self.renew(now);
            if self.purge_at.is_some_and(|at| at <= Instant::now()) {
                let every = self.core().settings.purge_every();
                let keep = self.core().settings.retention.unwrap_or_default();
                self.purge_at = every.map(|every| Instant::now() + every);
                self.queued.push(Request::Purge {
                    before_ms: now.saturating_sub(super::delay_ms(keep)),
                    removed: 0,
                    reply: None,
                });
            }
        }
        let claiming = !retrying && !last && self.close_deadline.is_none();
        let wants: Vec<Want> = if claiming {
            self.consumers
                .iter()
                .enumerate()
                .filter(|(_, c)| c.wants())
                .map(|(i, c)| Want {
                    consumer: i,
                    credits: c.credits.clone(),
                    in_transit: c.in_transit.clone(),
                })
                .collect()
        } else {
            Vec::new()
        };
        let lease_over = !retrying
            && self
                .core()
                .flights
                .leases
                .first()
                .is_some_and(|&(until, _)| until <= now);
        let claim = !wants.is_empty() && self.next_due.is_some_and(|due| due <= now);
        if self.queued.is_empty() && !lease_over && !claim {
            return;
        }
        let plan = Plan {
            now,
            requests: std::mem::take(&mut self.queued).into(),
            expire: !retrying,
            wants,
        };
        let mut core = self.core.take().expect("checked above");
        let (core, outcome) = match tokio::task::spawn_blocking(move || {
            let outcome = core.step(plan);
            (core, outcome)
        })
        .await
        {
            Ok(done) => done,
            Err(join) => {
                tracing::error!(error = %join, "the store panicked; the queue stops");
                self.requests.close();
                return;
            }
        };
        self.core = Some(core);
        self.queued.extend(outcome.continuing);
        if let Some(error) = outcome.failure {
            tracing::warn!(%error, "durable queue commit failed; undone, trying again");
            self.retry_at = Some(Instant::now() + self.backoff);
            self.backoff = (self.backoff * 2).min(RETRY_BACKOFF.1);
            return;
        }
        self.backoff = RETRY_BACKOFF.0;
        self.next_due = outcome.next_due;
        let Some(engine) = self.handle.upgrade() else {
            return;
        };
        for claim in outcome.claims {
            let delivery = Delivery::new(
                TaskId::from(claim.id),
                claim.payload,
                claim.attempt,
                system_time(claim.due_ms),
                claim.token,
                engine.clone(),
                super::Route::Engine,
            );
            // A stream that went away drops it, and its drop returns the task.
            let consumer = &self.consumers[claim.consumer];
            let _ = consumer.sender.send(delivery);
            // After the send: a stream that sees nothing in transit finds it in its buffer.
            consumer.in_transit.fetch_sub(1, Ordering::AcqRel);
        }
        self.consumers.retain(|c| !c.sender.is_closed());
    }

    /// Keep-alive: every held delivery's lease runs a full lease from now.
    fn renew(&mut self, now: u64) {
        let Some(at) = self.renew_at else { return };
        if at > Instant::now() {
            return;
        }
        let core = self.core();
        let held: Vec<u64> = core
            .flights
            .by_token
            .iter()
            .filter(|(_, f)| f.held)
            .map(|(&token, _)| token)
            .collect();
        let until = now.saturating_add(core.settings.lease_ms());
        for &token in &held {
            core.flights.set_lease(token, until);
        }
        let every = core.settings.renew_every();
        self.renew_at = (!held.is_empty()).then(|| Instant::now() + every);
    }

    fn handle_request(&mut self, request: Request) {
        match request {
            Request::Extend(token, duration, reply) => {
                let flights = &mut self.core().flights;
                let live = flights
                    .by_token
                    .get(&token)
                    .is_some_and(|f| f.lease_until.is_some());
                if live {
                    let until = now_ms().saturating_add(super::delay_ms(duration));
                    flights.set_lease(token, until);
                }
                let _ = reply.send(lease_result(live));
            }
            Request::HandedOut(token) => {
                let core = self.core();
                let buffered = core
                    .flights
                    .by_token
                    .get(&token)
                    .is_some_and(|f| f.lease_until.is_none());
                if buffered {
                    let until = now_ms().saturating_add(core.settings.lease_ms());
                    core.flights.set_lease(token, until);
                    core.flights.by_token.get_mut(&token).expect("present").held = true;
                    let (keep_alive, every) =
                        (core.settings.keep_alive, core.settings.renew_every());
                    if keep_alive && self.renew_at.is_none() {
                        self.renew_at = Some(Instant::now() + every);
                    }
                }
            }
            Request::Dropped(token) | Request::Finishing(token) => {
                if let Some(flight) = self.core().flights.by_token.get_mut(&token) {
                    flight.held = false;
                }
            }
            Request::Subscribe(consumer) => {
                if self.close_deadline.is_some() {
                    consumer.close(); // closing: the stream ends at once
                } else {
                    self.consumers.push(consumer);
                }
            }
            Request::Demand => {}
            Request::Close(reply) => {
                self.closing.push(reply);
                if self.close_deadline.is_none() {
                    let timeout = self.core().settings.close_timeout;
                    self.close_deadline = Some(Instant::now() + timeout);
                    self.begin_close_of_streams();
                }
            }
            store_request => self.queued.push(store_request),
        }
    }
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

impl Core {
    /// One transaction: expire leases, apply the requests in order, claim due tasks, save the
    /// counters and read the new head. On failure, everything in memory is put back.
    fn step(&mut self, mut plan: Plan) -> Outcome {
        let (seq_before, counters_before) = (self.next_seq, self.counters);
        let releases: Vec<u64> = plan
            .requests
            .iter()
            .filter_map(|r| match r {
                Request::Release(token) => Some(*token),
                _ => None,
            })
            .collect();
        let mut answers: Vec<Answer> = Vec::new();
        let mut claims: Vec<Claimed> = Vec::new();
        let mut continuing: Vec<Request> = Vec::new();
        let mut next_due = None;
        let Core {
            store,
            settings,
            flights,
            next_token,
            next_seq,
            counters,
            lateness,
        } = self;
        let mut state = StepState {
            settings,
            flights,
            next_token,
            next_seq,
            counters,
            lateness,
            now: plan.now,
        };
        let result = store.transact(&mut |tx| {
            let mut tasks = Tasks { tx };
            if plan.expire {
                state.expire_leases(&mut tasks)?;
            }
            while let Some(request) = plan.requests.pop_front() {
                state.apply(&mut tasks, request, &mut answers, &mut continuing)?;
            }
            state.claim_due(&mut tasks, &plan.wants, &mut claims)?;
            tasks.save_counters(&counters_before, state.counters)?;
            if *state.next_seq != seq_before {
                tasks.set_meta("seq", *state.next_seq)?;
            }
            next_due = head(&mut tasks)?;
            Ok(())
        });
        let failure = result.err();
        for answer in answers {
            answer(failure.as_ref());
        }
        if let Some(error) = &failure {
            for request in plan.requests.drain(..).chain(continuing.drain(..)) {
                fail(request, error);
            }
            // Claims a stream gave back must still go back: tried again in the next step.
            continuing.extend(releases.into_iter().map(Request::Release));
            self.flights.undo();
            self.next_seq = seq_before;
            self.counters = counters_before;
            for claim in claims.drain(..) {
                if let Some(want) = plan.wants.iter().find(|w| w.consumer == claim.consumer) {
                    want.credits.fetch_add(1, Ordering::AcqRel);
                    want.in_transit.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        self.flights.journal.clear();
        Outcome {
            claims,
            continuing,
            next_due,
            failure,
        }
    }
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

/// Records `result` as the request's answer; a store failure also abandons the step.
fn settle<T: Send + 'static>(
    answers: &mut Vec<Answer>,
    reply: Reply<T>,
    result: Result<T, Error>,
) -> Result<(), Error> {
    let failure = result
        .as_ref()
        .err()
        .filter(|e| is_store_failure(e))
        .cloned();
    answers.push(answer(reply, result));
    failure.map_or(Ok(()), Err)
}

impl StepState<'_> {
    fn apply(
        &mut self,
        tasks: &mut Tasks<'_>,
        request: Request,
        answers: &mut Vec<Answer>,
        continuing: &mut Vec<Request>,
    ) -> Result<(), Error> {
        match request {
            Request::Schedule(task, reply) => {
                let result = self.schedule(tasks, task);
                settle(answers, reply, result)
            }
            Request::Cancel(id, reply) => {
                let result = self.cancel(tasks, &id, State::Pending);
                settle(answers, reply, result)
            }
            Request::CancelRecurring(id, reply) => {
                let result = self.cancel(tasks, &id, State::Recurring);
                settle(answers, reply, result)
            }
            Request::Reschedule(id, due_ms, reply) => {
                let result = self.reschedule(tasks, &id, due_ms);
                settle(answers, reply, result)
            }
            Request::Redrive(id, reply) => {
                let result = self.redrive(tasks, &id);
                settle(answers, reply, result)
            }
            Request::Len(reply) => {
                let result = (|| {
                    Ok((tasks.count(Table::Pending)? + tasks.count(Table::InFlight)?) as usize)
                })();
                settle(answers, reply, result)
            }
            Request::Ack(id, token, reply) => {
                let result = self.finish(tasks, &id, token, Finish::Ack);
                settle(answers, reply, result)
            }
            Request::Retry(id, token, _attempt, after, reply) => {
                let result = self.finish(tasks, &id, token, Finish::Retry(after));
                settle(answers, reply, result)
            }
            Request::Fail(id, token, reason, reply) => {
                let result = self.finish(tasks, &id, token, Finish::Fail(reason));
                settle(answers, reply, result)
            }
            Request::Release(token) => self.release(tasks, token),
            Request::DeadLetters(reply) => {
                let result = self.dead_letters(tasks, None, usize::MAX);
                settle(answers, reply, result)
            }
            Request::DeadPage(after, limit, reply) => {
                let result = self.dead_letters(tasks, after.as_deref(), limit.min(STEP_LIMIT));
                settle(answers, reply, result)
            }
            Request::Get(id, reply) => {
                let result = self.get(tasks, &id);
                settle(answers, reply, result)
            }
            Request::List(filter, after, limit, reply) => {
                let result = self.list(tasks, filter, after.as_deref(), limit.min(STEP_LIMIT));
                settle(answers, reply, result)
            }
            Request::Stats(reply) => {
                let result = self.stats(tasks);
                settle(answers, reply, result)
            }
            Request::Purge {
                before_ms,
                removed,
                reply,
            } => {
                let (now_removed, done) = match self.purge(tasks, before_ms) {
                    Ok(progress) => progress,
                    Err(error) => {
                        return match reply {
                            Some(reply) => settle(answers, reply, Err(error)),
                            None => Err(error),
                        };
                    }
                };
                let removed = removed + now_removed;
                if done {
                    if let Some(reply) = reply {
                        answers.push(answer(reply, Ok(removed)));
                    }
                } else {
                    continuing.push(Request::Purge {
                        before_ms,
                        removed,
                        reply,
                    });
                }
                Ok(())
            }
            Request::ScheduleRecurring(recurring, reply) => {
                let result = self.schedule_recurring(tasks, recurring);
                settle(answers, reply, result)
            }
            // Handled by the engine in memory, never queued for a step.
            Request::Extend(..)
            | Request::HandedOut(_)
            | Request::Dropped(_)
            | Request::Finishing(_)
            | Request::Subscribe(_)
            | Request::Demand
            | Request::Close(_) => {
                debug_assert!(false, "an in-memory request reached a step");
                Ok(())
            }
        }
    }

    fn take_seq(&mut self) -> u64 {
        let seq = *self.next_seq;
        *self.next_seq += 1;
        seq
    }

    fn schedule(&mut self, tasks: &mut Tasks<'_>, task: Task) -> Result<TaskId, Error> {
        let id = task.id.clone().unwrap_or_else(TaskId::generate);
        let old = tasks.get(id.as_str())?;
        if old.as_ref().is_some_and(|r| r.state == State::InFlight) {
            return Err(Error::InFlight);
        }
        let record = Record {
            state: State::Pending,
            due_ms: task.due_ms(self.now),
            seq: self.take_seq(),
            attempts: 0,
            payload_len: task.payload.len() as u64,
            dead_ms: 0,
            reason: String::new(),
        };
        tasks.put(id.as_str(), old.as_ref(), &record)?;
        tasks.set_payload(id.as_str(), &task.payload)?;
        Ok(id)
    }

    fn schedule_recurring(
        &mut self,
        tasks: &mut Tasks<'_>,
        recurring: Recurring,
    ) -> Result<TaskId, Error> {
        let (id, mut spec, payload) = recurring.into_parts(self.now)?;
        let old = tasks.get(id.as_str())?;
        match &old {
            Some(record) if record.state == State::InFlight => return Err(Error::InFlight),
            Some(record) if record.state == State::Recurring => {
                let previous = Spec::decode(&record.reason)?;
                let same_payload = tasks.payload(id.as_str())?.as_deref() == Some(&payload[..]);
                if previous.same_definition(&spec) && same_payload {
                    return Ok(id); // declared again (e.g. at start-up): kept as it is
                }
                spec.continue_from(&previous);
            }
            _ => {}
        }
        let record = Record {
            state: State::Recurring,
            due_ms: spec.next_after(spec.last_ms.max(self.now)),
            seq: self.take_seq(),
            attempts: 0,
            payload_len: payload.len() as u64,
            dead_ms: 0,
            reason: spec.encode(),
        };
        tasks.put(id.as_str(), old.as_ref(), &record)?;
        tasks.set_payload(id.as_str(), &payload)?;
        Ok(id)
    }

    /// Cancels a pending task (`State::Pending`) or a recurring schedule
    /// (`State::Recurring`).
    fn cancel(&mut self, tasks: &mut Tasks<'_>, id: &str, state: State) -> Result<bool, Error> {
        match tasks.get(id)? {
            Some(record) if record.state == state => {
                tasks.delete(id, &record)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn reschedule(&mut self, tasks: &mut Tasks<'_>, id: &str, due_ms: u64) -> Result<bool, Error> {
        match tasks.get(id)? {
            Some(record) if record.state == State::Pending => {
                let next = Record {
                    due_ms,
                    ..record.clone()
                };
                tasks.put(id, Some(&record), &next)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn redrive(&mut self, tasks: &mut Tasks<'_>, id: &str) -> Result<bool, Error> {
        match tasks.get(id)? {
            Some(record) if record.state == State::Dead => {
                let next = Record {
                    state: State::Pending,
                    due_ms: self.now,
                    attempts: 0,
                    dead_ms: 0,
                    reason: String::new(),
                    ..record.clone()
                };
                tasks.put(id, Some(&record), &next)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn finish(
        &mut self,
        tasks: &mut Tasks<'_>,
        id: &str,
        token: u64,
        finish: Finish,
    ) -> Result<(), Error> {
        if !self.flights.holds(id, token) {
            return Err(Error::LeaseLost);
        }
        let record = tasks.get(id)?.ok_or_else(|| missing(id))?;
        let max = self.settings.policy.attempts();
        match finish {
            Finish::Ack => {
                tasks.delete(id, &record)?;
                self.counters.acked += 1;
            }
            // `retry_after` counts toward max_attempts like `retry`.
            Finish::Retry(_) if record.attempts >= max => {
                self.bury(tasks, id, &record, last_attempt_reason(record.attempts))?;
            }
            Finish::Retry(after) => {
                let delay =
                    after.unwrap_or_else(|| self.settings.policy.jittered_delay(record.attempts));
                let next = Record {
                    state: State::Pending,
                    due_ms: self
                        .now
                        .saturating_add(super::delay_ms(delay))
                        .min(super::MAX_DUE_MS),
                    ..record.clone()
                };
                tasks.put(id, Some(&record), &next)?;
                self.counters.retried += 1;
            }
            Finish::Fail(reason) => self.bury(tasks, id, &record, reason)?,
        }
        self.flights.end(id);
        Ok(())
    }

    fn bury(
        &mut self,
        tasks: &mut Tasks<'_>,
        id: &str,
        record: &Record,
        reason: String,
    ) -> Result<(), Error> {
        let next = Record {
            state: State::Dead,
            dead_ms: self.now,
            reason,
            ..record.clone()
        };
        tasks.put(id, Some(record), &next)?;
        self.counters.dead_lettered += 1;
        Ok(())
    }

    /// Returns a claim its stream never yielded: pending again at its due time, the delivery
    /// not counted.
    fn release(&mut self, tasks: &mut Tasks<'_>, token: u64) -> Result<(), Error> {
        let Some(flight) = self.flights.by_token.get(&token) else {
            return Ok(());
        };
        if flight.lease_until.is_some() {
            return Ok(()); // handed out: only its lease, a finish or `close` ends it
        }
        let id = flight.id.clone();
        let record = tasks.get(&id)?.ok_or_else(|| missing(&id))?;
        let next = Record {
            state: State::Pending,
            attempts: record.attempts.saturating_sub(1),
            ..record.clone()
        };
        tasks.put(&id, Some(&record), &next)?;
        self.flights.end(&id);
        self.counters.returned += 1;
        Ok(())
    }

    fn expire_leases(&mut self, tasks: &mut Tasks<'_>) -> Result<(), Error> {
        for _ in 0..STEP_LIMIT {
            let Some(&(until, token)) = self.flights.leases.first() else {
                break;
            };
            if until > self.now {
                break;
            }
            let id = self.flights.by_token[&token].id.clone();
            self.flights.end(&id);
            let record = tasks.get(&id)?.ok_or_else(|| missing(&id))?;
            let next = lease_over(self.settings, &record, self.now, self.counters);
            tracing::debug!(id = %id, attempts = record.attempts, "lease expired");
            tasks.put(&id, Some(&record), &next)?;
        }
        Ok(())
    }

    fn claim_due(
        &mut self,
        tasks: &mut Tasks<'_>,
        wants: &[Want],
        claims: &mut Vec<Claimed>,
    ) -> Result<(), Error> {
        let mut budget = STEP_LIMIT;
        for Want {
            consumer,
            credits,
            in_transit,
        } in wants
        {
            while budget > 0 && credits.load(Ordering::Acquire) > 0 {
                let Some((due, _, id)) = tasks.ordered(Table::Pending, None, 1)?.pop() else {
                    return Ok(());
                };
                if due > self.now {
                    return Ok(());
                }
                budget -= 1;
                let record = tasks.get(&id)?.ok_or_else(|| missing(&id))?;
                if record.state == State::Recurring {
                    self.make_occurrences(tasks, &id, &record)?;
                    continue;
                }
                let payload = tasks
                    .payload(&id)?
                    .ok_or_else(|| Error::Corrupt(format!("task {id:?} has no payload")))?;
                let next = Record {
                    state: State::InFlight,
                    attempts: record.attempts + 1,
                    ..record.clone()
                };
                tasks.put(&id, Some(&record), &next)?;
                // In transit first: the stream never sees both at zero meanwhile.
                in_transit.fetch_add(1, Ordering::AcqRel);
                credits.fetch_sub(1, Ordering::AcqRel);
                let token = *self.next_token;
                *self.next_token += 1;
                // The lease starts at hand-out; until then the delivery waits in its stream.
                self.flights.start(
                    token,
                    Flight {
                        id: id.clone(),
                        lease_until: None,
                        held: false,
                    },
                );
                self.counters.delivered += 1;
                self.lateness.record(self.now.saturating_sub(due));
                claims.push(Claimed {
                    consumer: *consumer,
                    id,
                    token,
                    payload,
                    attempt: next.attempts,
                    due_ms: due,
                });
            }
        }
        Ok(())
    }

    /// A recurring schedule came due: makes the occurrences it owes as pending tasks (due now
    /// or earlier, so claimable at once) and moves it to its next occurrence.
    fn make_occurrences(
        &mut self,
        tasks: &mut Tasks<'_>,
        id: &str,
        record: &Record,
    ) -> Result<(), Error> {
        let mut spec = Spec::decode(&record.reason)?;
        let (owed, next_due) = spec.advance(self.now);
        if !owed.is_empty() {
            let payload = tasks.payload(id)?.unwrap_or_default();
            for at in owed {
                let occurrence = occurrence_id(id, at);
                if tasks.get(&occurrence)?.is_some() {
                    continue; // a task of that name exists: never made twice
                }
                let task = Record {
                    state: State::Pending,
                    due_ms: at,
                    seq: self.take_seq(),
                    attempts: 0,
                    payload_len: payload.len() as u64,
                    dead_ms: 0,
                    reason: String::new(),
                };
                tasks.put(&occurrence, None, &task)?;
                tasks.set_payload(&occurrence, &payload)?;
            }
        }
        let next = Record {
            due_ms: next_due,
            reason: spec.encode(),
            ..record.clone()
        };
        tasks.put(id, Some(record), &next)
    }

    fn purge(&mut self, tasks: &mut Tasks<'_>, before_ms: u64) -> Result<(u64, bool), Error> {
        let page = tasks.ordered(Table::Dead, None, STEP_LIMIT)?;
        let full = page.len() == STEP_LIMIT;
        let mut removed = 0;
        for (dead_ms, _, id) in page {
            if dead_ms >= before_ms {
                return Ok((removed, true));
            }
            let record = tasks.get(&id)?.ok_or_else(|| missing(&id))?;
            tasks.delete(&id, &record)?;
            removed += 1;
        }
        Ok((removed, !full))
    }

    fn info(&self, id: &str, record: &Record) -> TaskInfo {
        let state = match record.state {
            State::Pending | State::Recurring => TaskState::Pending,
            State::Dead => TaskState::Dead {
                reason: record.reason.clone(),
            },
            State::InFlight => TaskState::InFlight {
                attempt: record.attempts,
                lease_until: system_time(self.lease_end(id)),
            },
        };
        TaskInfo {
            id: TaskId::from(id),
            state,
            due: system_time(record.due_ms),
            attempts: record.attempts,
            payload_len: usize::try_from(record.payload_len).unwrap_or(usize::MAX),
            reason: (record.state == State::Dead).then(|| record.reason.clone()),
        }
    }

    /// When `id`'s lease ends (a buffered claim: as if handed out now).
    fn lease_end(&self, id: &str) -> u64 {
        self.flights
            .of(id)
            .and_then(|f| f.lease_until)
            .unwrap_or_else(|| self.now.saturating_add(self.settings.lease_ms()))
    }

    fn get(&mut self, tasks: &mut Tasks<'_>, id: &str) -> Result<Option<TaskInfo>, Error> {
        Ok(tasks.get(id)?.map(|record| self.info(id, &record)))
    }

    fn list(
        &mut self,
        tasks: &mut Tasks<'_>,
        filter: TaskFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TaskInfo>, Error> {
        if filter == TaskFilter::InFlight {
            // Few (bounded by the streams' prefetch), and in memory: sorted here. Claims still
            // in a stream's buffer sort after every delivery handed out (their reported lease
            // end slides with the clock, so it cannot order pages).
            let mut flights: Vec<(u64, String)> = self
                .flights
                .tokens
                .keys()
                .map(|id| {
                    let end = self.flights.of(id).and_then(|f| f.lease_until);
                    (end.unwrap_or(u64::MAX), id.clone())
                })
                .collect();
            flights.sort_unstable();
            let start = match after {
                None => 0,
                Some(after) => {
                    let position = flights.iter().position(|(_, id)| id == after);
                    position.ok_or_else(|| stale_cursor(after, filter))? + 1
                }
            };
            let mut page = Vec::new();
            for (_, id) in flights.into_iter().skip(start).take(limit) {
                let record = tasks.get(&id)?.ok_or_else(|| missing(&id))?;
                page.push(self.info(&id, &record));
            }
            return Ok(page);
        }
        let (table, cursor) = self.cursor(tasks, filter, after)?;
        let mut page = Vec::new();
        for (_, _, id) in tasks.ordered(table, cursor, limit)? {
            let record = tasks.get(&id)?.ok_or_else(|| missing(&id))?;
            page.push(self.info(&id, &record));
        }
        Ok(page)
    }

    /// The index and the position after `after` in it, for the pending or dead list.
    fn cursor(
        &self,
        tasks: &mut Tasks<'_>,
        filter: TaskFilter,
        after: Option<&str>,
    ) -> Result<(Table, Option<(u64, u64)>), Error> {
        let table = match filter {
            TaskFilter::Dead => Table::Dead,
            _ => Table::Pending,
        };
        let Some(after) = after else {
            return Ok((table, None));
        };
        let record = tasks.get(after)?;
        let position = match (filter, record) {
            (TaskFilter::Dead, Some(r)) if r.state == State::Dead => (r.dead_ms, r.seq),
            (TaskFilter::Pending, Some(r))
                if matches!(r.state, State::Pending | State::Recurring) =>
            {
                (r.due_ms, r.seq)
            }
            _ => return Err(stale_cursor(after, filter)),
        };
        Ok((table, Some(position)))
    }

    fn dead_letters(
        &mut self,
        tasks: &mut Tasks<'_>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, Error> {
        let (_, mut cursor) = self.cursor(tasks, TaskFilter::Dead, after)?;
        let mut letters = Vec::new();
        while letters.len() < limit {
            let page =
                tasks.ordered(Table::Dead, cursor, (limit - letters.len()).min(STEP_LIMIT))?;
            let Some(&(dead_ms, seq, _)) = page.last() else {
                break;
            };
            cursor = Some((dead_ms, seq));
            for (_, _, id) in page {
                let record = tasks.get(&id)?.ok_or_else(|| missing(&id))?;
                letters.push(DeadLetter {
                    payload: tasks.payload(&id)?.unwrap_or_default(),
                    id: TaskId::from(id),
                    attempts: record.attempts,
                    reason: record.reason,
                });
            }
        }
        Ok(letters)
    }

    fn stats(&mut self, tasks: &mut Tasks<'_>) -> Result<QueueStats, Error> {
        let mut samples = self.lateness.samples();
        let c = *self.counters;
        Ok(QueueStats {
            pending: tasks.count(Table::Pending)?,
            in_flight: tasks.count(Table::InFlight)?,
            dead: tasks.count(Table::Dead)?,
            delivered: c.delivered,
            acked: c.acked,
            retried: c.retried,
            dead_lettered: c.dead_lettered,
            expired: c.expired,
            returned: c.returned,
            lateness_p50: percentile(&mut samples, 50),
            lateness_p99: percentile(&mut samples, 99),
        })
    }
}

enum Finish {
    Ack,
    Retry(Option<Duration>),
    Fail(String),
}

/// Answers a request the stopped engine will not carry out: dropping its reply sender makes
/// the caller see [`Error::Closed`]; a `close` is simply done.
fn refuse(request: Request) {
    if let Request::Close(reply) = request {
        let _ = reply.send(Ok(()));
    }
}

/// Answers a request that a failed step could not carry out with the step's error.
fn fail(request: Request, error: &Error) {
    fn send<T>(reply: Reply<T>, error: &Error) {
        let _ = reply.send(Err(error.clone()));
    }
    match request {
        Request::Schedule(_, reply) | Request::ScheduleRecurring(_, reply) => send(reply, error),
        Request::Cancel(_, reply)
        | Request::CancelRecurring(_, reply)
        | Request::Reschedule(_, _, reply)
        | Request::Redrive(_, reply) => send(reply, error),
        Request::Len(reply) => send(reply, error),
        Request::DeadLetters(reply) | Request::DeadPage(_, _, reply) => send(reply, error),
        Request::Ack(_, _, reply)
        | Request::Retry(_, _, _, _, reply)
        | Request::Fail(_, _, _, reply)
        | Request::Extend(_, _, reply) => send(reply, error),
        Request::Get(_, reply) => send(reply, error),
        Request::List(_, _, _, reply) => send(reply, error),
        Request::Stats(reply) => send(reply, error),
        Request::Purge { reply, .. } => {
            if let Some(reply) = reply {
                send(reply, error);
            }
        }
        Request::Close(reply) => {
            let _ = reply.send(Ok(()));
        }
        Request::HandedOut(_)
        | Request::Dropped(_)
        | Request::Release(_)
        | Request::Finishing(_)
        | Request::Subscribe(_)
        | Request::Demand => {}
    }
}
