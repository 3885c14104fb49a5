//! The queue's engine: one task that owns the store and the working state, applies requests in
//! batches (one store transaction per batch), and hands due tasks to consumers.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::store::{Mutation, Store, StoredTask, TaskState};
use super::{DeadLetter, Delivery, Error, RetryPolicy, Task, TaskId};
use crate::Wheel;

/// Requests handled per batch (and so per store transaction).
const BATCH: usize = 1024;

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
    Subscribe(Consumer),
    /// A consumer has room for more deliveries.
    Demand,
    Close(Reply<()>),
}

/// One `deliveries()` stream, as the engine sees it.
pub(crate) struct Consumer {
    pub(crate) credits: Arc<AtomicUsize>,
    pub(crate) sender: mpsc::UnboundedSender<Delivery>,
}

pub(crate) struct Settings {
    pub(crate) policy: RetryPolicy,
    pub(crate) lease: Duration,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Why a task retried on its last delivery went to the dead letters.
pub(crate) fn last_attempt_reason(attempts: u32) -> String {
    format!("retried on its last delivery ({attempts} of {attempts})")
}

pub(crate) fn system_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// The instant on Tokio's clock when wall-clock time `ms` comes.
pub(crate) fn instant_of(ms: u64) -> Instant {
    let now = now_ms();
    Instant::now() + Duration::from_millis(ms.saturating_sub(now))
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

pub(crate) struct Engine {
    store: Option<Box<dyn Store>>,
    tasks: HashMap<String, StoredTask>,
    /// Pending tasks by (due, schedule order).
    due: BTreeMap<(u64, u64), String>,
    /// In-flight tasks by (lease end, delivery token).
    leases: BTreeMap<(u64, u64), String>,
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
    // Per batch:
    mutations: Vec<Mutation>,
    answers: Vec<Answer>,
    outgoing: Vec<(usize, Delivery)>,
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
            store: Some(store),
            tasks: HashMap::with_capacity(loaded.len()),
            due: BTreeMap::new(),
            leases: BTreeMap::new(),
            tokens: HashMap::new(),
            next_seq: 0,
            next_token: 0,
            settings,
            consumers: Vec::new(),
            requests,
            handle,
            wheel,
            mutations: Vec::new(),
            answers: Vec::new(),
            outgoing: Vec::new(),
        };
        let now = now_ms();
        for mut task in loaded {
            engine.next_seq = engine.next_seq.max(task.seq + 1);
            if task.state == TaskState::InFlight {
                // Holding the lock proves the previous holder is gone: its lease is over.
                engine.lease_over(&mut task, now);
                engine.mutations.push(Mutation::Put(task.clone()));
            }
            if task.state == TaskState::Pending {
                engine.due.insert((task.due_ms, task.seq), task.id.clone());
            }
            engine.tasks.insert(task.id.clone(), task);
        }
        if !engine.mutations.is_empty() {
            let mutations = std::mem::take(&mut engine.mutations);
            engine
                .store
                .as_mut()
                .expect("store present")
                .apply(&mutations)?;
        }
        Ok(engine)
    }

    /// A delivery ended without ack or retry (lease expired, or its holder died): deliver again
    /// at once, or give up if it has had all its attempts.
    fn lease_over(&self, task: &mut StoredTask, now: u64) {
        if task.attempts >= self.settings.policy.attempts() {
            task.state = TaskState::Dead;
            task.reason = format!(
                "lease expired on delivery {} of {}",
                task.attempts,
                self.settings.policy.attempts()
            );
        } else {
            task.state = TaskState::Pending;
            task.due_ms = now;
        }
    }

    pub(crate) async fn run(mut self) {
        let mut shutdown = self.wheel.shared().shutdown_signal();
        let mut batch = Vec::with_capacity(BATCH);
        let mut closing = None;
        loop {
            if *shutdown.borrow_and_update() {
                break;
            }
            let next = self.next_wake();
            let sleep = self
                .wheel
                .sleep_until(next.map_or_else(far_future, instant_of));
            tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                received = self.requests.recv_many(&mut batch, BATCH) => {
                    if received == 0 {
                        break; // every handle, stream and delivery is gone
                    }
                    for request in batch.drain(..) {
                        if let Request::Close(reply) = request {
                            closing = Some(reply);
                        } else {
                            self.handle_request(request);
                        }
                    }
                    self.step().await;
                    if closing.is_some() {
                        break;
                    }
                    continue;
                }
                () = sleep, if next.is_some() => {}
            }
            self.step().await;
        }
        tracing::debug!("durable queue engine stops; its tasks stay in the store");
        // Refuse what is still queued, so no caller waits for an answer that never comes.
        self.requests.close();
        while let Ok(request) = self.requests.try_recv() {
            refuse(request);
        }
        self.consumers.clear(); // ends every deliveries() stream
        // Release the store (and its lock) before `close()` returns.
        if let Some(store) = self.store.take() {
            let _ = tokio::task::spawn_blocking(move || drop(store)).await;
        }
        if let Some(reply) = closing {
            let _ = reply.send(Ok(()));
        }
    }

    /// The next wall-clock time the engine must act: a task due (when someone wants it) or a
    /// lease ending.
    fn next_wake(&self) -> Option<u64> {
        let wanted = self
            .consumers
            .iter()
            .any(|c| c.credits.load(Ordering::Acquire) > 0);
        let due = self
            .due
            .keys()
            .next()
            .map(|&(due, _)| due)
            .filter(|_| wanted);
        let lease = self.leases.keys().next().map(|&(until, _)| until);
        match (due, lease) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Expires leases, hands out due tasks, commits the batch, then answers and delivers.
    async fn step(&mut self) {
        let now = now_ms();
        self.expire_leases(now);
        self.claim_due(now);
        let mutations = std::mem::take(&mut self.mutations);
        let failure = if mutations.is_empty() {
            None
        } else {
            self.commit(mutations).await.err()
        };
        for answer in self.answers.drain(..) {
            answer(failure.as_ref());
        }
        if failure.is_some() {
            self.outgoing.clear();
            return;
        }
        for (consumer, delivery) in self.outgoing.drain(..) {
            // A consumer that went away drops the delivery: its lease brings the task back.
            let _ = self.consumers[consumer].sender.send(delivery);
        }
        self.consumers.retain(|c| !c.sender.is_closed());
    }

    async fn commit(&mut self, mutations: Vec<Mutation>) -> Result<(), Error> {
        let mut store = self.store.take().expect("store present between commits");
        let (store, result) = match tokio::task::spawn_blocking(move || {
            let result = store.apply(&mutations);
            (store, result)
        })
        .await
        {
            Ok(done) => done,
            Err(join) => {
                tracing::error!(error = %join, "the store panicked; the queue stops");
                self.requests.close();
                return Err(Error::Io(format!("the store panicked: {join}")));
            }
        };
        self.store = Some(store);
        if let Err(error) = &result {
            // Memory ran ahead of the store: resynchronise from what is durable.
            tracing::error!(%error, "durable queue commit failed; reloading from the store");
            self.reload().await;
        }
        result
    }

    async fn reload(&mut self) {
        let mut store = self.store.take().expect("store present");
        let (store, loaded) = match tokio::task::spawn_blocking(move || {
            let loaded = store.load();
            (store, loaded)
        })
        .await
        {
            Ok(done) => done,
            Err(_) => return,
        };
        self.store = Some(store);
        let Ok(loaded) = loaded else { return };
        self.tasks.clear();
        self.due.clear();
        self.leases.clear();
        self.tokens.clear();
        let now = now_ms();
        for mut task in loaded {
            if task.state == TaskState::InFlight {
                self.lease_over(&mut task, now);
                self.mutations.push(Mutation::Put(task.clone()));
            }
            if task.state == TaskState::Pending {
                self.due.insert((task.due_ms, task.seq), task.id.clone());
            }
            self.tasks.insert(task.id.clone(), task);
        }
    }

    fn put(&mut self, task: StoredTask) {
        self.mutations.push(Mutation::Put(task.clone()));
        self.tasks.insert(task.id.clone(), task);
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
                if let Some(token) = self.tokens.remove(id) {
                    self.leases.remove(&(task.lease_until_ms, token));
                }
            }
            TaskState::Dead => {}
        }
    }

    fn pend(&mut self, mut task: StoredTask, due_ms: u64) {
        task.state = TaskState::Pending;
        task.due_ms = due_ms;
        self.due.insert((due_ms, task.seq), task.id.clone());
        self.put(task);
    }

    fn bury(&mut self, mut task: StoredTask, reason: String) {
        task.state = TaskState::Dead;
        task.reason = reason;
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
                    self.unindex(&id);
                    self.tasks.remove(&id);
                    self.mutations.push(Mutation::Delete(id));
                }
                self.answers.push(answer(reply, Ok(pending)));
            }
            Request::Reschedule(id, due_ms, reply) => {
                let pending = self.state_of(&id) == Some(TaskState::Pending);
                if pending {
                    self.unindex(&id);
                    let task = self.tasks[&id].clone();
                    self.pend(task, due_ms);
                }
                self.answers.push(answer(reply, Ok(pending)));
            }
            Request::Len(reply) => {
                let live = self.due.len() + self.leases.len();
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
                    let mut task = self.tasks[&id].clone();
                    task.attempts = 0;
                    task.reason.clear();
                    self.pend(task, now_ms());
                }
                self.answers.push(answer(reply, Ok(dead)));
            }
            Request::Ack(id, token, reply) => {
                let held = self.holds(&id, token);
                if held {
                    self.unindex(&id);
                    self.tasks.remove(&id);
                    self.mutations.push(Mutation::Delete(id));
                }
                self.answers.push(answer(
                    reply,
                    if held { Ok(()) } else { Err(Error::LeaseLost) },
                ));
            }
            Request::Retry(id, token, _attempt, after, reply) => {
                let held = self.holds(&id, token);
                if held {
                    self.unindex(&id);
                    let task = self.tasks[&id].clone();
                    let attempts = task.attempts;
                    match after {
                        Some(after) => {
                            let due = now_ms().saturating_add(after.as_millis() as u64);
                            self.pend(task, due);
                        }
                        None if attempts >= self.settings.policy.attempts() => {
                            let reason = last_attempt_reason(attempts);
                            self.bury(task, reason);
                        }
                        None => {
                            let delay = self.settings.policy.jittered_delay(attempts);
                            let due = now_ms().saturating_add(delay.as_millis() as u64);
                            self.pend(task, due);
                        }
                    }
                }
                self.answers.push(answer(
                    reply,
                    if held { Ok(()) } else { Err(Error::LeaseLost) },
                ));
            }
            Request::Fail(id, token, reason, reply) => {
                let held = self.holds(&id, token);
                if held {
                    self.unindex(&id);
                    let task = self.tasks[&id].clone();
                    self.bury(task, reason);
                }
                self.answers.push(answer(
                    reply,
                    if held { Ok(()) } else { Err(Error::LeaseLost) },
                ));
            }
            Request::Subscribe(consumer) => self.consumers.push(consumer),
            Request::Demand => {}
            Request::Close(_) => unreachable!("handled by the loop"),
        }
    }

    fn state_of(&self, id: &str) -> Option<TaskState> {
        self.tasks.get(id).map(|t| t.state)
    }

    fn holds(&self, id: &str, token: u64) -> bool {
        self.tokens.get(id) == Some(&token)
    }

    fn schedule(&mut self, task: Task) -> Result<TaskId, Error> {
        let id = task.id.unwrap_or_else(TaskId::generate);
        match self.state_of(id.as_str()) {
            Some(TaskState::InFlight) => return Err(Error::InFlight),
            Some(_) => self.unindex(id.as_str()),
            None => {}
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let due_ms = task.due.map_or_else(now_ms, |due| {
            due.duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64)
        });
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
        self.pend(stored, due_ms);
        Ok(id)
    }

    fn expire_leases(&mut self, now: u64) {
        while let Some((&(until, token), _)) = self.leases.first_key_value() {
            if until > now {
                break;
            }
            let id = self.leases.remove(&(until, token)).expect("present");
            self.tokens.remove(&id);
            let mut task = self.tasks[&id].clone();
            self.lease_over(&mut task, now);
            tracing::debug!(id = %task.id, attempts = task.attempts, "lease expired");
            if task.state == TaskState::Pending {
                self.pend(task, now);
            } else {
                self.put(task);
            }
        }
    }

    fn claim_due(&mut self, now: u64) {
        // A live consumer stream holds a sender, so this upgrade succeeds whenever one exists.
        let Some(engine) = self.handle.upgrade() else {
            return;
        };
        for index in 0..self.consumers.len() {
            loop {
                let credits = &self.consumers[index].credits;
                if credits.load(Ordering::Acquire) == 0 || self.consumers[index].sender.is_closed()
                {
                    break;
                }
                let Some((&(due, seq), _)) = self.due.first_key_value() else {
                    return;
                };
                if due > now {
                    return;
                }
                credits.fetch_sub(1, Ordering::AcqRel);
                let id = self.due.remove(&(due, seq)).expect("present");
                let mut task = self.tasks[&id].clone();
                task.state = TaskState::InFlight;
                task.attempts += 1;
                task.lease_until_ms = now.saturating_add(self.settings.lease.as_millis() as u64);
                let token = self.next_token;
                self.next_token += 1;
                self.tokens.insert(id.clone(), token);
                self.leases.insert((task.lease_until_ms, token), id.clone());
                let delivery = Delivery {
                    id: TaskId::from(id),
                    payload: task.payload.clone(),
                    attempt: task.attempts,
                    due: system_time(task.due_ms),
                    token,
                    engine: engine.clone(),
                };
                self.put(task);
                self.outgoing.push((index, delivery));
            }
        }
    }
}

/// Where a backend with nothing to wait for parks its wake-up.
pub(crate) fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365)
}

/// Answers a request the stopped engine will not carry out: dropping its reply sender makes
/// the caller see [`Error::Closed`]; a `close` is simply done.
fn refuse(request: Request) {
    if let Request::Close(reply) = request {
        let _ = reply.send(Ok(()));
    }
}
