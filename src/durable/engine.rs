//! The queue's engine on an embedded [`Store`]: one task that owns the store and the working
//! state, applies requests in batches (one store transaction per batch), and hands due tasks
//! to consumers. Also what both backends share: requests, consumers, settings, clocks, and the
//! one place that reaches into the wheel beyond its public API ([`attach`]).
//!
//! Leases are in-process state here: the store's lock proves no other process holds a task,
//! so a lease only has to end while this process lives. A delivery's lease starts when its
//! stream yields it ([`Request::HandedOut`]); while it waits in a prefetch buffer it has none.
//!
//! A failed commit is undone in memory from a journal of what the batch changed, so the
//! engine's state is again exactly what the store holds: no reload, no lease treated as
//! orphaned, and the claims the batch made go back to their streams' credits; the engine tries
//! again after a backoff, so a waiting stream gets its delivery once the store recovers.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::store::{Mutation, Store, StoredTask, TaskState};
use super::{DeadLetter, Delivery, Error, RetryPolicy, Task, TaskId};
use crate::Wheel;

/// Requests handled per batch (and so per store transaction).
const BATCH: usize = 1024;
/// Most leases expired, and most tasks claimed, per store transaction: a step's work is
/// bounded however large the backlog (the rest follows in the next steps).
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
}

/// One `deliveries()` stream, as the engine sees it.
pub(crate) struct Consumer {
    pub(crate) credits: Arc<AtomicUsize>,
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
}

impl Settings {
    pub(crate) fn lease_ms(&self) -> u64 {
        super::delay_ms(self.lease)
    }

    /// How often buffered claims (and, with keep-alive, held deliveries) are renewed.
    pub(crate) fn renew_every(&self) -> Duration {
        (self.lease / 3).max(Duration::from_millis(1))
    }
}

/// What the durable engines need from their wheel beyond its public API: the runtime to run
/// on and the shutdown signal. The one place that reaches into the wheel's internals.
pub(crate) struct Attachment {
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) shutdown: watch::Receiver<bool>,
}

pub(crate) fn attach(wheel: &Wheel) -> Attachment {
    let shared = wheel.shared();
    Attachment {
        runtime: shared.runtime.clone(),
        shutdown: shared.shutdown_signal(),
    }
}

/// Resolves once the wheel has shut down (or can no longer say).
pub(crate) async fn shut_down(signal: &mut watch::Receiver<bool>) {
    let _ = signal.wait_for(|stopped| *stopped).await;
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

/// A task handed to a stream and not finished.
#[derive(Clone)]
struct Flight {
    id: String,
    /// When the lease ends; `None` while the delivery waits in its stream's buffer.
    lease_until: Option<u64>,
    /// Handed out and neither finished nor dropped: `close` waits for it, keep-alive renews it.
    held: bool,
}

/// How to put one task back as it was before the batch, if the batch's commit fails.
struct Undo {
    id: String,
    task: Option<StoredTask>,
    flight: Option<(u64, Flight)>,
}

/// A claim made in this batch, handed to its stream once the batch is durable.
struct Claimed {
    consumer: usize,
    id: String,
    token: u64,
}

pub(crate) struct Engine {
    store: Option<Box<dyn Store>>,
    tasks: HashMap<String, StoredTask>,
    /// Pending tasks by (due, schedule order).
    due: BTreeMap<(u64, u64), String>,
    /// Handed-out deliveries by (lease end, token).
    leases: BTreeSet<(u64, u64)>,
    /// In-flight tasks by delivery token.
    flights: HashMap<u64, Flight>,
    /// The token of each in-flight task's current delivery.
    tokens: HashMap<String, u64>,
    next_seq: u64,
    next_token: u64,
    settings: Settings,
    consumers: Vec<Consumer>,
    requests: mpsc::UnboundedReceiver<Request>,
    /// Handed to deliveries, so they can ack.
    handle: mpsc::WeakUnboundedSender<Request>,
    wheel: Wheel,
    /// After a failed commit: when to try again, and the backoff after that.
    retry_at: Option<Instant>,
    backoff: Duration,
    /// Keep-alive: when to renew the held leases next.
    renew_at: Option<Instant>,
    /// `close()` callers, and how long the close waits for held deliveries.
    closing: Vec<Reply<()>>,
    close_deadline: Option<Instant>,
    // Per batch:
    mutations: Vec<Mutation>,
    answers: Vec<Answer>,
    claimed: Vec<Claimed>,
    undo: Vec<Undo>,
}

impl Engine {
    /// Loads the store (blocking), resolves what a previous holder left in flight, and
    /// returns the engine ready to run.
    pub(crate) fn load(
        mut store: Box<dyn Store>,
        settings: Settings,
        requests: mpsc::UnboundedReceiver<Request>,
        handle: mpsc::WeakUnboundedSender<Request>,
        wheel: Wheel,
    ) -> Result<Engine, Error> {
        let loaded = store.load()?;
        let mut engine = Engine {
            store: None,
            tasks: HashMap::with_capacity(loaded.len()),
            due: BTreeMap::new(),
            leases: BTreeSet::new(),
            flights: HashMap::new(),
            tokens: HashMap::new(),
            next_seq: 0,
            next_token: 0,
            settings,
            consumers: Vec::new(),
            requests,
            handle,
            wheel,
            retry_at: None,
            backoff: RETRY_BACKOFF.0,
            renew_at: None,
            closing: Vec::new(),
            close_deadline: None,
            mutations: Vec::new(),
            answers: Vec::new(),
            claimed: Vec::new(),
            undo: Vec::new(),
        };
        let now = now_ms();
        let mut orphaned = Vec::new();
        for mut task in loaded {
            engine.next_seq = engine.next_seq.max(task.seq + 1);
            if task.state == TaskState::InFlight {
                // Holding the lock proves the previous holder is gone: its lease is over.
                engine.lease_over(&mut task, now);
                orphaned.push(Mutation::Put(task.clone()));
            }
            if task.state == TaskState::Pending {
                engine.due.insert((task.due_ms, task.seq), task.id.clone());
            }
            engine.tasks.insert(task.id.clone(), task);
        }
        for chunk in orphaned.chunks(STEP_LIMIT) {
            store.apply(chunk)?;
        }
        engine.store = Some(store);
        Ok(engine)
    }

    /// A delivery ended without ack or retry (lease expired, or its holder died): deliver again
    /// at once, or give up if it has had all its attempts.
    fn lease_over(&self, task: &mut StoredTask, now: u64) {
        if task.attempts >= self.settings.policy.attempts() {
            task.state = TaskState::Dead;
            task.reason = lease_expired_reason(task.attempts, self.settings.policy.attempts());
        } else {
            task.state = TaskState::Pending;
            task.due_ms = now;
        }
    }

    pub(crate) async fn run(mut self) {
        let mut shutdown = attach(&self.wheel).shutdown;
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            if *shutdown.borrow_and_update() || self.close_done() {
                break;
            }
            let next = self.next_wake();
            let sleep = self.wheel.sleep_until(next.unwrap_or_else(far_future));
            tokio::select! {
                biased;
                () = shut_down(&mut shutdown) => break,
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
            self.step().await;
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
                | Request::Finishing(_) => self.handle_request(request),
                other => refuse(other),
            }
        }
        // Buffered claims go back now (best effort: if this commit fails, the next open
        // delivers them again, as after a crash).
        self.begin_close_of_streams();
        self.step().await;
        // Release the store (and its lock) before `close()` returns.
        if let Some(store) = self.store.take() {
            let _ = tokio::task::spawn_blocking(move || drop(store)).await;
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
        Instant::now() >= deadline || !self.flights.values().any(|f| f.held)
    }

    /// Ends every stream and returns what they buffered.
    fn begin_close_of_streams(&mut self) {
        for consumer in self.consumers.drain(..) {
            consumer.close();
        }
        let buffered: Vec<u64> = self
            .flights
            .iter()
            .filter(|(_, f)| f.lease_until.is_none())
            .map(|(&token, _)| token)
            .collect();
        for token in buffered {
            self.release(token);
        }
    }

    /// The next time the engine must act: a task due (when someone wants it), a lease
    /// ending, a keep-alive renewal, the close deadline — or, after a failed commit, the retry.
    fn next_wake(&self) -> Option<Instant> {
        if let Some(at) = self.retry_at {
            return Some(at);
        }
        let wanted = self.consumers.iter().any(Consumer::wants);
        let due = self
            .due
            .keys()
            .next()
            .map(|&(due, _)| due)
            .filter(|_| wanted);
        let lease = self.leases.iter().next().map(|&(until, _)| until);
        let wall = match (due, lease) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        [wall.map(instant_of), self.renew_at, self.close_deadline]
            .into_iter()
            .flatten()
            .min()
    }

    /// Expires leases, hands out due tasks, commits the batch, then answers and delivers.
    async fn step(&mut self) {
        let now = now_ms();
        let retrying = self.retry_at.is_some_and(|at| at > Instant::now());
        if !retrying {
            self.retry_at = None;
            self.expire_leases(now);
            self.renew(now);
            if self.close_deadline.is_none() {
                self.claim_due(now);
            }
        }
        let mutations = std::mem::take(&mut self.mutations);
        let failure = if mutations.is_empty() {
            None
        } else {
            self.commit(mutations).await.err()
        };
        for answer in self.answers.drain(..) {
            answer(failure.as_ref());
        }
        if let Some(error) = failure {
            tracing::warn!(%error, "durable queue commit failed; undone, trying again");
            self.undo_batch();
            self.retry_at = Some(Instant::now() + self.backoff);
            self.backoff = (self.backoff * 2).min(RETRY_BACKOFF.1);
            return;
        }
        self.undo.clear();
        self.backoff = RETRY_BACKOFF.0;
        let Some(engine) = self.handle.upgrade() else {
            self.claimed.clear();
            return;
        };
        for claim in std::mem::take(&mut self.claimed) {
            let task = &self.tasks[&claim.id];
            let delivery = Delivery::new(
                TaskId::from(claim.id.clone()),
                task.payload.clone(),
                task.attempts,
                system_time(task.due_ms),
                claim.token,
                engine.clone(),
                super::Route::Engine,
            );
            // A stream that went away drops it, and its drop returns the task.
            let _ = self.consumers[claim.consumer].sender.send(delivery);
        }
        self.consumers.retain(|c| !c.sender.is_closed());
    }

    async fn commit(&mut self, mutations: Vec<Mutation>) -> Result<(), Error> {
        let mut store = self.store.take().expect("store present between commits");
        match tokio::task::spawn_blocking(move || {
            let result = store.apply(&mutations);
            (store, result)
        })
        .await
        {
            Ok((store, result)) => {
                self.store = Some(store);
                result
            }
            Err(join) => {
                tracing::error!(error = %join, "the store panicked; the queue stops");
                self.requests.close();
                Err(Error::Io(format!("the store panicked: {join}")))
            }
        }
    }

    /// Puts every task the failed batch touched back as it was, and gives the batch's claims
    /// back to their streams' credits.
    fn undo_batch(&mut self) {
        while let Some(undo) = self.undo.pop() {
            self.unindex(&undo.id);
            if let Some(token) = self.tokens.remove(&undo.id) {
                self.flights.remove(&token);
            }
            match undo.task {
                Some(task) => self.tasks.insert(undo.id.clone(), task),
                None => self.tasks.remove(&undo.id),
            };
            if let Some((token, flight)) = undo.flight {
                self.tokens.insert(undo.id.clone(), token);
                self.flights.insert(token, flight);
            }
            self.index(&undo.id);
        }
        for claim in self.claimed.drain(..) {
            self.consumers[claim.consumer]
                .credits
                .fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Records how `id` is now, before the batch changes it.
    fn journal(&mut self, id: &str) {
        let task = self.tasks.get(id).cloned();
        let flight = self
            .tokens
            .get(id)
            .map(|&token| (token, self.flights[&token].clone()));
        self.undo.push(Undo {
            id: id.to_owned(),
            task,
            flight,
        });
    }

    fn index(&mut self, id: &str) {
        let Some(task) = self.tasks.get(id) else {
            return;
        };
        match task.state {
            TaskState::Pending => {
                self.due.insert((task.due_ms, task.seq), id.to_owned());
            }
            TaskState::InFlight => {
                if let Some(&token) = self.tokens.get(id) {
                    if let Some(until) = self.flights[&token].lease_until {
                        self.leases.insert((until, token));
                    }
                }
            }
            TaskState::Dead => {}
        }
    }

    fn unindex(&mut self, id: &str) {
        let Some(task) = self.tasks.get(id) else {
            return;
        };
        match task.state {
            TaskState::Pending => {
                self.due.remove(&(task.due_ms, task.seq));
            }
            TaskState::InFlight => {
                if let Some(&token) = self.tokens.get(id) {
                    if let Some(until) = self.flights[&token].lease_until {
                        self.leases.remove(&(until, token));
                    }
                }
            }
            TaskState::Dead => {}
        }
    }

    /// Unindexes `id`, ends its flight and takes its task out, journaling how it was (the
    /// journal keeps the original: nothing is copied for it). Returns the original.
    fn detach(&mut self, id: &str) -> &StoredTask {
        self.unindex(id);
        let flight = self.tokens.remove(id).map(|token| {
            (
                token,
                self.flights.remove(&token).expect("a flight per token"),
            )
        });
        let task = self.tasks.remove(id);
        self.undo.push(Undo {
            id: id.to_owned(),
            task,
            flight,
        });
        self.undo
            .last()
            .and_then(|undo| undo.task.as_ref())
            .expect("present")
    }

    /// A copy of `id`'s task to be changed and stored again with [`put`](Engine::put).
    fn take_for_change(&mut self, id: &str) -> StoredTask {
        self.detach(id).clone()
    }

    fn delete(&mut self, id: String) {
        self.detach(&id);
        self.mutations.push(Mutation::Delete(id));
    }

    /// Stores `task` (replacing any task of its id) and indexes it.
    fn put(&mut self, task: StoredTask) {
        self.mutations.push(Mutation::Put(task.clone()));
        let id = task.id.clone();
        self.tasks.insert(id.clone(), task);
        self.index(&id);
    }

    fn pend(&mut self, mut task: StoredTask, due_ms: u64) {
        task.state = TaskState::Pending;
        task.due_ms = due_ms;
        task.lease_until_ms = 0;
        self.put(task);
    }

    fn bury(&mut self, mut task: StoredTask, reason: String) {
        task.state = TaskState::Dead;
        task.reason = reason;
        task.lease_until_ms = 0;
        self.put(task);
    }

    fn handle_request(&mut self, request: Request) {
        match request {
            Request::Schedule(task, reply) => {
                let value = self.schedule(task);
                self.answers.push(answer(reply, value));
            }
            Request::Cancel(id, reply) => {
                let pending = self.state_of(&id) == Some(TaskState::Pending);
                if pending {
                    self.delete(id);
                }
                self.answers.push(answer(reply, Ok(pending)));
            }
            Request::Reschedule(id, due_ms, reply) => {
                let pending = self.state_of(&id) == Some(TaskState::Pending);
                if pending {
                    let task = self.take_for_change(&id);
                    self.pend(task, due_ms);
                }
                self.answers.push(answer(reply, Ok(pending)));
            }
            Request::Len(reply) => {
                let live = self.due.len() + self.tokens.len();
                self.answers.push(answer(reply, Ok(live)));
            }
            Request::DeadLetters(reply) => {
                let mut dead: Vec<&StoredTask> = self
                    .tasks
                    .values()
                    .filter(|t| t.state == TaskState::Dead)
                    .collect();
                dead.sort_by_key(|t| t.seq);
                let letters = dead
                    .into_iter()
                    .map(|t| DeadLetter {
                        id: TaskId::from(t.id.clone()),
                        payload: t.payload.clone(),
                        attempts: t.attempts,
                        reason: t.reason.clone(),
                    })
                    .collect();
                self.answers.push(answer(reply, Ok(letters)));
            }
            Request::Redrive(id, reply) => {
                let dead = self.state_of(&id) == Some(TaskState::Dead);
                if dead {
                    let mut task = self.take_for_change(&id);
                    task.attempts = 0;
                    task.reason.clear();
                    self.pend(task, now_ms());
                }
                self.answers.push(answer(reply, Ok(dead)));
            }
            Request::Ack(id, token, reply) => {
                let held = self.holds(&id, token);
                if held {
                    self.delete(id);
                }
                self.answers.push(answer(reply, lease_result(held)));
            }
            Request::Retry(id, token, _attempt, after, reply) => {
                let held = self.holds(&id, token);
                if held {
                    let task = self.take_for_change(&id);
                    let attempts = task.attempts;
                    // `retry_after` counts toward max_attempts like `retry`.
                    if attempts >= self.settings.policy.attempts() {
                        self.bury(task, last_attempt_reason(attempts));
                    } else {
                        let delay =
                            after.unwrap_or_else(|| self.settings.policy.jittered_delay(attempts));
                        let due = now_ms()
                            .saturating_add(super::delay_ms(delay))
                            .min(super::MAX_DUE_MS);
                        self.pend(task, due);
                    }
                }
                self.answers.push(answer(reply, lease_result(held)));
            }
            Request::Fail(id, token, reason, reply) => {
                let held = self.holds(&id, token);
                if held {
                    let task = self.take_for_change(&id);
                    self.bury(task, reason);
                }
                self.answers.push(answer(reply, lease_result(held)));
            }
            Request::Extend(token, duration, reply) => {
                let live = self
                    .flights
                    .get(&token)
                    .is_some_and(|f| f.lease_until.is_some());
                if live {
                    let until = now_ms().saturating_add(super::delay_ms(duration));
                    self.set_lease(token, until);
                }
                self.answers.push(answer(reply, lease_result(live)));
            }
            Request::HandedOut(token) => {
                let buffered = self
                    .flights
                    .get(&token)
                    .is_some_and(|f| f.lease_until.is_none());
                if buffered {
                    let until = now_ms().saturating_add(self.settings.lease_ms());
                    self.set_lease(token, until);
                    self.flights.get_mut(&token).expect("present").held = true;
                    if self.settings.keep_alive && self.renew_at.is_none() {
                        self.renew_at = Some(Instant::now() + self.settings.renew_every());
                    }
                }
            }
            Request::Dropped(token) | Request::Finishing(token) => {
                if let Some(flight) = self.flights.get_mut(&token) {
                    flight.held = false;
                }
            }
            Request::Release(token) => self.release(token),
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
                    self.close_deadline = Some(Instant::now() + self.settings.close_timeout);
                    self.begin_close_of_streams();
                }
            }
        }
    }

    /// Returns a claim its stream never yielded: pending again at its due time, the delivery
    /// not counted.
    fn release(&mut self, token: u64) {
        let Some(flight) = self.flights.get(&token) else {
            return;
        };
        if flight.lease_until.is_some() {
            return; // handed out: only its lease, a finish or `close` ends it
        }
        let id = flight.id.clone();
        let mut task = self.take_for_change(&id);
        task.attempts = task.attempts.saturating_sub(1);
        let due = task.due_ms;
        self.pend(task, due);
    }

    /// Moves a handed-out delivery's lease end (memory only: see the module docs).
    fn set_lease(&mut self, token: u64, until: u64) {
        let flight = self.flights.get_mut(&token).expect("present");
        if let Some(old) = flight.lease_until.replace(until) {
            self.leases.remove(&(old, token));
        }
        self.leases.insert((until, token));
    }

    /// Keep-alive: every held delivery's lease runs a full lease from now.
    fn renew(&mut self, now: u64) {
        let Some(at) = self.renew_at else { return };
        if at > Instant::now() {
            return;
        }
        let held: Vec<u64> = self
            .flights
            .iter()
            .filter(|(_, f)| f.held)
            .map(|(&token, _)| token)
            .collect();
        let until = now.saturating_add(self.settings.lease_ms());
        for &token in &held {
            self.set_lease(token, until);
        }
        self.renew_at = (!held.is_empty()).then(|| Instant::now() + self.settings.renew_every());
    }

    fn state_of(&self, id: &str) -> Option<TaskState> {
        self.tasks.get(id).map(|t| t.state)
    }

    fn holds(&self, id: &str, token: u64) -> bool {
        self.tokens.get(id) == Some(&token)
    }

    fn schedule(&mut self, task: Task) -> Result<TaskId, Error> {
        let id = task.id.clone().unwrap_or_else(TaskId::generate);
        match self.state_of(id.as_str()) {
            Some(TaskState::InFlight) => return Err(Error::InFlight),
            Some(_) => {
                self.detach(id.as_str());
            }
            None => self.journal(id.as_str()),
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let due_ms = task.due_ms(now_ms());
        let stored = StoredTask {
            id: id.as_str().to_owned(),
            payload: task.payload,
            due_ms,
            seq,
            attempts: 0,
            state: TaskState::Pending,
            lease_until_ms: 0,
            reason: String::new(),
        };
        self.put(stored);
        Ok(id)
    }

    fn expire_leases(&mut self, now: u64) {
        for _ in 0..STEP_LIMIT {
            let Some(&(until, token)) = self.leases.first() else {
                break;
            };
            if until > now {
                break;
            }
            let id = self.flights[&token].id.clone();
            let mut task = self.take_for_change(&id);
            self.lease_over(&mut task, now);
            tracing::debug!(id = %task.id, attempts = task.attempts, "lease expired");
            self.put(task);
        }
    }

    fn claim_due(&mut self, now: u64) {
        let mut budget = STEP_LIMIT;
        for index in 0..self.consumers.len() {
            while budget > 0 && self.consumers[index].wants() {
                let Some((&(due, seq), _)) = self.due.first_key_value() else {
                    return;
                };
                if due > now {
                    return;
                }
                budget -= 1;
                self.consumers[index].credits.fetch_sub(1, Ordering::AcqRel);
                let id = self.due[&(due, seq)].clone();
                let mut task = self.take_for_change(&id);
                task.state = TaskState::InFlight;
                task.attempts += 1;
                // The lease starts at hand-out; until then the delivery waits in its stream.
                task.lease_until_ms = 0;
                let token = self.next_token;
                self.next_token += 1;
                self.tokens.insert(id.clone(), token);
                self.flights.insert(
                    token,
                    Flight {
                        id: id.clone(),
                        lease_until: None,
                        held: false,
                    },
                );
                self.put(task);
                self.claimed.push(Claimed {
                    consumer: index,
                    id,
                    token,
                });
            }
        }
    }
}

fn lease_result(held: bool) -> Result<(), Error> {
    if held { Ok(()) } else { Err(Error::LeaseLost) }
}

/// Answers a request the stopped engine will not carry out: dropping its reply sender makes
/// the caller see [`Error::Closed`]; a `close` is simply done.
fn refuse(request: Request) {
    if let Request::Close(reply) = request {
        let _ = reply.send(Ok(()));
    }
}
