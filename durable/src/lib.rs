//! Durable delayed tasks that survive restarts: the job queue beside [`tokio_wheel`].
//!
//! "Retry this webhook in 10 minutes", "auto-accept the order if no review in 7 days": delayed
//! work that must not vanish when the process restarts or crashes. A [`DurableQueue`] keeps
//! tasks in a store (an embedded [redb](https://docs.rs/redb) file by default), wakes exactly
//! when the earliest one is due through a [`Wheel`], and hands due tasks out as
//! [`Delivery`]s that must be acknowledged.
//!
//! ```
//! use std::time::Duration;
//! use futures::StreamExt;
//! use tokio_wheel::Wheel;
//! use tokio_wheel_durable::{DurableQueue, Task};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), tokio_wheel_durable::Error> {
//! # let dir = std::env::temp_dir().join(format!("tokio-wheel-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir).unwrap();
//! # let path = dir.join("tasks.redb");
//! let wheel = Wheel::new();
//! let queue = DurableQueue::open(&path, &wheel).await?;
//! let id = queue
//!     .schedule(Task::new(b"send the reminder".to_vec()).after(Duration::from_millis(50)).id("order-42"))
//!     .await?; // durable once this returns
//!
//! let mut deliveries = queue.deliveries();
//! let delivery = deliveries.next().await.unwrap();
//! assert_eq!(delivery.id(), &id);
//! assert_eq!(delivery.payload(), b"send the reminder");
//! delivery.ack().await?; // done: deleted for good
//! # drop(deliveries);
//! # queue.close().await;
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok(())
//! # }
//! ```
//!
//! # Guarantees
//!
//! - **Durable:** `schedule`, `cancel`, `reschedule`, `ack`, `retry`, `fail` and `redrive`
//!   return only once their effect is committed to the store. Concurrent calls share one
//!   transaction (group commit), so throughput is not one fsync per task.
//! - **Never early, promptly on time:** a task is never delivered before its due time; an idle
//!   consumer is woken by the wheel when it is due, not by polling.
//! - **At least once:** a task is deleted only by `ack`. A delivery neither acked nor retried
//!   within its lease (a crash, a hang, a dropped [`Delivery`]) is delivered again, with its
//!   attempt count raised. While every delivery is acked or retried within its lease, each task
//!   is delivered exactly once. `ack`, `retry`, `retry_after` and `fail` after the task was
//!   handed out again return [`Error::LeaseLost`] and change nothing; `ack` never returns `Ok`
//!   without deleting.
//! - **Leases from hand-out:** a lease starts when the stream yields the delivery, not while
//!   the task waits in the prefetch buffer. [`Delivery::extend`] and
//!   [`Builder::keep_alive`] keep a long job's lease.
//! - **Under faults:** a delivery carries exactly the payload that was scheduled; a call
//!   retried after a lost reply is recognised; due times and leases are judged by the store's
//!   clock (Redis: the server's `TIME`), never a worker's; a failed commit never strands a
//!   stream nor redelivers a live lease; every store step touches a bounded batch. The
//!   README's "What the durable queue guarantees under faults" lists each with its test.
//! - **Restarts:** on open, pending tasks reload; overdue ones are delivered at once, in due
//!   order (ties in schedule order); tasks in flight when the previous holder died are
//!   delivered again at once.
//! - **One holder:** opening a store another handle holds returns [`Error::Locked`] at once.
//!   Dropping every handle (or [`DurableQueue::close`]) releases it.
//! - **Replacing:** scheduling an id that is pending or dead replaces it; one in flight returns
//!   [`Error::InFlight`].
//!
//! Due times are wall-clock ([`SystemTime`]): an `Instant` does not survive a restart.
//!
//! # Features
//!
//! - default: the embedded store ([redb](https://docs.rs/redb)) and recurring tasks.
//! - `redis`: one queue shared across processes through Redis or Redis Cluster
//!   (`Builder::redis`, `Builder::redis_cluster`); `redis-tls`: `rediss://` through rustls.
//! - `serde`: JSON payload helpers (`Task::json`, `Delivery::json`).
//! - `metrics`: [`QueueStats`] through the `metrics` facade
//!   (`QueueStats::record_metrics`, `DurableQueue::export_metrics`).
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![doc(test(attr(deny(warnings), allow(dead_code))))]

mod engine;
mod error;
mod inspect;
#[cfg(feature = "metrics")]
mod metrics_export;
mod policy;
mod recurring;
#[cfg(feature = "redis")]
mod redis;
pub mod store;
mod tasks;

use std::fmt;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::Stream;
use tokio::sync::{mpsc, oneshot};

use self::engine::{Consumer, Engine, Request, Settings};
pub use self::error::Error;
pub use self::inspect::{QueueStats, TaskFilter, TaskInfo, TaskState};
pub use self::policy::RetryPolicy;
pub use self::recurring::{CatchUp, MAX_CATCH_UP, Recurring};
use self::store::{RedbStore, Store};
use tokio_wheel::Wheel;

/// A task's id: a user key (`"order-42"`) or one generated by [`DurableQueue::schedule`].
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(String);

impl TaskId {
    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A new id, unique across processes and restarts (time, process and counter).
    fn generate() -> TaskId {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let count = COUNTER.fetch_add(1, Ordering::Relaxed);
        TaskId(format!("t{nanos:x}-{:x}-{count:x}", std::process::id()))
    }
}

impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TaskId({:?})", self.0)
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for TaskId {
    fn from(id: &str) -> Self {
        TaskId(id.to_owned())
    }
}

impl From<String> for TaskId {
    fn from(id: String) -> Self {
        TaskId(id)
    }
}

/// A task to schedule: an opaque payload, an optional id, and a due time (default: now).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    payload: Vec<u8>,
    id: Option<TaskId>,
    due: Option<Due>,
}

/// When a task is due: an instant on the wall clock, or a delay the store resolves against its
/// own clock when it takes the task (so a worker's clock never decides it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    At(SystemTime),
    After(Duration),
}

/// The latest due time a store keeps, in milliseconds since the Unix epoch (about the year
/// 144 000): later ones saturate to it, so they wait "forever" and never overflow, and every
/// value is exact in a Lua number (a double).
pub(crate) const MAX_DUE_MS: u64 = 1 << 52;

/// Milliseconds since the Unix epoch, saturating at [`MAX_DUE_MS`]; times before the epoch
/// are the epoch.
pub(crate) fn epoch_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .min(MAX_DUE_MS)
}

/// A delay in milliseconds, rounded up (never early) and saturating at [`MAX_DUE_MS`].
pub(crate) fn delay_ms(delay: Duration) -> u64 {
    let ms = delay.as_millis() + u128::from(delay.subsec_nanos() % 1_000_000 != 0);
    u64::try_from(ms).unwrap_or(u64::MAX).min(MAX_DUE_MS)
}

impl Task {
    /// A task carrying `payload`, due now, with a generated id.
    pub fn new(payload: impl Into<Vec<u8>>) -> Task {
        Task {
            payload: payload.into(),
            id: None,
            due: None,
        }
    }

    /// A task carrying `value` serialized as JSON (feature `serde`); read it back with
    /// [`Delivery::json`].
    ///
    /// # Errors
    ///
    /// What `serde_json` reports for a value that cannot be serialized.
    #[cfg(feature = "serde")]
    pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> Result<Task, serde_json::Error> {
        Ok(Task::new(serde_json::to_vec(value)?))
    }

    /// Gives the task an id (scheduling an existing pending or dead id replaces it).
    pub fn id(mut self, id: impl Into<String>) -> Task {
        self.id = Some(TaskId(id.into()));
        self
    }

    /// Due at a wall-clock time (in the past: due at once; past the year 144 000: never).
    pub fn at(mut self, due: SystemTime) -> Task {
        self.due = Some(Due::At(due));
        self
    }

    /// Due `delay` after the store takes the task, by the store's clock (Redis: the server's
    /// `TIME`; embedded: this process's wall clock), so a worker whose clock is off does not
    /// move it. Saturating: `Duration::MAX` waits forever.
    pub fn after(mut self, delay: Duration) -> Task {
        self.due = Some(Due::After(delay));
        self
    }

    /// The due time in milliseconds since the Unix epoch, resolved against `now_ms` (the
    /// store's clock).
    pub(crate) fn due_ms(&self, now_ms: u64) -> u64 {
        match self.due {
            None => now_ms,
            Some(Due::At(at)) => epoch_ms(at),
            Some(Due::After(delay)) => now_ms.saturating_add(delay_ms(delay)).min(MAX_DUE_MS),
        }
    }
}

/// The most entries one page of [`DurableQueue::list`] or [`DurableQueue::dead_letters_page`]
/// returns.
pub const PAGE_LIMIT: usize = 1000;

/// A task that was given up on: retried on its last attempt, failed, or out of leases.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The task's id.
    pub id: TaskId,
    /// Its payload.
    pub payload: Vec<u8>,
    /// How many times it was delivered.
    pub attempts: u32,
    /// Why it was given up on.
    pub reason: String,
}

/// Configures and opens a [`DurableQueue`].
#[derive(Clone)]
pub struct Builder {
    policy: RetryPolicy,
    lease: Duration,
    prefetch: usize,
    keep_alive: bool,
    close_timeout: Duration,
    retention: Option<Duration>,
    check_integrity: bool,
    partitions: usize,
    replicas: usize,
    tls_roots: Option<Vec<u8>>,
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("policy", &self.policy)
            .field("lease", &self.lease)
            .field("prefetch", &self.prefetch)
            .field("keep_alive", &self.keep_alive)
            .field("close_timeout", &self.close_timeout)
            .field("retention", &self.retention)
            .field("check_integrity", &self.check_integrity)
            .field("partitions", &self.partitions)
            .field("replicas", &self.replicas)
            .field("tls_roots", &self.tls_roots.as_ref().map(Vec::len))
            .finish()
    }
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            policy: RetryPolicy::default(),
            lease: Duration::from_secs(30),
            prefetch: 16,
            keep_alive: false,
            close_timeout: Duration::from_secs(30),
            retention: None,
            check_integrity: false,
            partitions: 1,
            replicas: 0,
            tls_roots: None,
        }
    }
}

impl Builder {
    /// How retries back off and how many deliveries a task gets. Default:
    /// `RetryPolicy::exponential(1 s, 1 h)`, 10 deliveries.
    pub fn retry(mut self, policy: RetryPolicy) -> Builder {
        self.policy = policy;
        self
    }

    /// How long a delivery may go without `ack`, `retry` or `fail` before the task is delivered
    /// again. Default 30 s; at least 1 ms (opening with a zero lease is
    /// [`Error::Invalid`]).
    ///
    /// The lease starts when the [`Deliveries`] stream yields the delivery, not when the task
    /// was claimed into the prefetch buffer: the handle keeps buffered claims alive until then
    /// (Redis: one renewal script per lease/3 for all of them). A long job can keep its lease
    /// with [`Delivery::extend`] or [`keep_alive`](Builder::keep_alive).
    pub fn lease(mut self, lease: Duration) -> Builder {
        self.lease = lease;
        self
    }

    /// How many tasks one `deliveries()` stream may hold claimed ahead of being read. Default 16.
    pub fn prefetch(mut self, prefetch: usize) -> Builder {
        self.prefetch = prefetch.max(1);
        self
    }

    /// Renews every delivery this handle has handed out, every lease/3, until it is finished or
    /// dropped. Off by default: then a hung job loses its lease and the task is delivered
    /// again, which is usually what you want. With it on, a job may run as long as it likes
    /// while its process is alive; a crash still frees its tasks within one lease.
    ///
    /// Cost: on Redis one script call per lease/3 for all held deliveries together (in
    /// batches of 1000); nothing on the embedded store.
    pub fn keep_alive(mut self, on: bool) -> Builder {
        self.keep_alive = on;
        self
    }

    /// How long [`DurableQueue::close`] waits for deliveries handed out and not yet finished
    /// or dropped. Default 30 s.
    pub fn close_timeout(mut self, timeout: Duration) -> Builder {
        self.close_timeout = timeout;
        self
    }

    /// Purges dead letters older than `retention` (by the time they died, on the store's
    /// clock) on their own, in bounded batches, checking every `retention / 4` (between
    /// 10 ms and 1 minute). Off by default: dead letters stay until redriven or purged with
    /// [`DurableQueue::purge_dead`]. On Redis every handle with a retention purges.
    pub fn dead_letter_retention(mut self, retention: Duration) -> Builder {
        self.retention = Some(retention);
        self
    }

    /// Embedded store: verify the checksum of every page when opening (redb's integrity
    /// check). Off by default, because it reads the whole file: opening then takes time in
    /// proportion to the file's size, payloads included. Without it, opening reads nothing
    /// but the tasks a previous holder left in flight; redb still checks and repairs a file
    /// after a crash on its own. Turn it on if the file may be changed behind the queue's
    /// back; a damaged file is then [`Error::Corrupt`] at open rather than later.
    pub fn check_integrity(mut self, on: bool) -> Builder {
        self.check_integrity = on;
        self
    }

    /// Redis: spreads the queue over `n` partitions, each its own hash slot (so, on a cluster,
    /// over the masters: the slots are chosen evenly over the slot space). A task lives in the
    /// partition its id hashes to. Due order then holds within a partition (never-early holds
    /// everywhere), and a worker claims from every partition, each getting first pick in
    /// turn. Every process of a queue must use the same count (a mismatch is
    /// [`Error::Invalid`] at connect). Default 1: the layout of a queue without partitions.
    /// 1 to 256.
    #[cfg(feature = "redis")]
    pub fn partitions(mut self, n: usize) -> Builder {
        self.partitions = n;
        self
    }

    /// Redis: every write (`schedule`, `ack`, `retry`, `fail`, `cancel`, …) returns only once
    /// `n` replicas of its master have it (`WAIT n`), so a failover to one of them loses
    /// nothing that returned. If they do not within 4 s, the call returns
    /// [`Error::Unreachable`] — the write is then on the master but may be lost with it.
    /// Default 0: a write returns once the master has it. Claims are not waited for (a claim
    /// lost in a failover is delivered again after its lease).
    #[cfg(feature = "redis")]
    pub fn replicas(mut self, n: usize) -> Builder {
        self.replicas = n;
        self
    }

    /// Redis over TLS (`rediss://`, feature `redis-tls`): trust these PEM root certificates
    /// (e.g. a private CA) instead of the system's. Without it, the system's roots are used
    /// (`SSL_CERT_FILE` is honoured).
    #[cfg(feature = "redis-tls")]
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Builder {
        self.tls_roots = Some(pem.into());
        self
    }

    fn settings(&self) -> Result<Settings, Error> {
        if self.lease < Duration::from_millis(1) {
            return Err(Error::Invalid(format!(
                "the lease must be at least 1 ms (got {:?})",
                self.lease
            )));
        }
        Ok(Settings {
            policy: self.policy.clone(),
            lease: self.lease,
            keep_alive: self.keep_alive,
            close_timeout: self.close_timeout,
            retention: self.retention,
        })
    }

    /// Opens the embedded store at `path` (created if missing or empty).
    ///
    /// # Errors
    ///
    /// [`Error::Locked`] if another handle holds it, [`Error::Corrupt`] if the file is not a
    /// task store (it is left untouched), [`Error::Io`], [`Error::Invalid`] for a zero lease,
    /// or [`Error::Closed`] if the wheel has shut down.
    pub async fn open(self, path: impl AsRef<Path>, wheel: &Wheel) -> Result<DurableQueue, Error> {
        self.settings()?;
        let path = path.as_ref().to_owned();
        let verify = self.check_integrity;
        let store = tokio::task::spawn_blocking(move || {
            let mut store = RedbStore::open_checked(path, verify)?;
            tasks::migrate_legacy(&mut store, engine::now_ms())?;
            Ok::<_, Error>(store)
        })
        .await
        // redb may panic on a file changed behind its back: that file is not a store.
        .map_err(|e| Error::Corrupt(format!("opening the store panicked: {e}")))??;
        self.open_with_store(store, wheel).await
    }

    /// Connects to the Redis server at `url` and opens the queue `name` there, shared with
    /// every other process that opens it (feature `redis`). Connects before it returns.
    ///
    /// The URL may carry credentials (`redis://user:password@host:6379/`, an ACL user, or
    /// `redis://:password@host/` for `requirepass`) and, with feature `redis-tls`, TLS
    /// (`rediss://host:6380/`; see [`tls_root_certificates`](Builder::tls_root_certificates)).
    /// Credentials never appear in this crate's `Debug` output, errors or traces.
    ///
    /// Every key of the queue carries the hash tag `{name}` (one per partition with
    /// [`partitions`](Builder::partitions)). Due times and leases are judged by the server's
    /// clock (`TIME`), never by a worker's. Commands retry with backoff while the server is
    /// unreachable; a retried `ack` is recognised, never applied twice.
    ///
    /// # Errors
    ///
    /// [`Error::Unreachable`] if it cannot connect, [`Error::Denied`] at once if the server
    /// refuses the credentials or the server's certificate is not trusted, [`Error::Invalid`]
    /// for a bad URL, a zero lease, or a partition count other than the queue's,
    /// [`Error::Closed`] if the wheel has shut down.
    #[cfg(feature = "redis")]
    pub async fn redis(self, url: &str, name: &str, wheel: &Wheel) -> Result<DurableQueue, Error> {
        self.connect(vec![url.to_owned()], false, name, wheel).await
    }

    /// Connects to a Redis Cluster through any of its nodes (`urls`: one or more, each
    /// `redis://host:port/` or `rediss://…`) and opens the queue `name` there (feature
    /// `redis`). The cluster client follows `MOVED` and `ASK` redirections and refreshes its
    /// slot map, so the queue keeps working through resharding and failover; whichever node
    /// the URLs name, it reaches the masters that own the queue's slots.
    ///
    /// One queue's partition lives on one master; spread a busy queue over the cluster's
    /// masters with [`partitions`](Builder::partitions).
    ///
    /// # Errors
    ///
    /// As [`redis`](Builder::redis).
    #[cfg(feature = "redis")]
    pub async fn redis_cluster(
        self,
        urls: &[&str],
        name: &str,
        wheel: &Wheel,
    ) -> Result<DurableQueue, Error> {
        let urls = urls.iter().map(|url| (*url).to_owned()).collect();
        self.connect(urls, true, name, wheel).await
    }

    #[cfg(feature = "redis")]
    async fn connect(
        self,
        urls: Vec<String>,
        cluster: bool,
        name: &str,
        wheel: &Wheel,
    ) -> Result<DurableQueue, Error> {
        let settings = self.settings()?;
        if wheel.is_shutdown() {
            return Err(Error::Closed);
        }
        let target = self::redis::Target {
            urls,
            cluster,
            partitions: self.partitions,
            replicas: self.replicas,
            tls_roots: self.tls_roots.clone(),
        };
        let (requests, shared) = self::redis::start(target, name, settings, wheel).await?;
        Ok(DurableQueue {
            requests,
            prefetch: self.prefetch,
            route: Route::Redis(shared),
        })
    }

    /// Opens a queue on any [`Store`], e.g. a [`MemoryStore`](store::MemoryStore) in tests.
    ///
    /// # Errors
    ///
    /// What the store's `load` returns, [`Error::Invalid`] for a zero lease, or
    /// [`Error::Closed`] if the wheel has shut down.
    pub async fn open_with_store(
        self,
        store: impl Store,
        wheel: &Wheel,
    ) -> Result<DurableQueue, Error> {
        let settings = self.settings()?;
        if wheel.is_shutdown() {
            return Err(Error::Closed);
        }
        let (requests, receiver) = mpsc::unbounded_channel();
        let weak = requests.downgrade();
        let owner = wheel.clone();
        let engine = tokio::task::spawn_blocking(move || {
            Engine::load(Box::new(store), settings, receiver, weak, owner)
        })
        .await
        .map_err(|e| Error::Io(format!("loading the store panicked: {e}")))??;
        engine::attach(wheel).runtime.spawn(engine.run());
        Ok(DurableQueue {
            requests,
            prefetch: self.prefetch,
            route: Route::Engine,
        })
    }
}

/// Where a handle's calls go: through the engine task (embedded: it owns the store), or
/// straight to the Redis server from the caller's task (each call is one atomic script; the
/// Redis engine only claims, and is told what finished).
#[derive(Clone)]
pub(crate) enum Route {
    Engine,
    #[cfg(feature = "redis")]
    Redis(Arc<self::redis::Shared>),
}

/// A durable queue of delayed tasks. Cheap to clone; every clone talks to one engine.
///
/// See the [module documentation](self) for what it guarantees.
#[derive(Clone)]
pub struct DurableQueue {
    requests: mpsc::UnboundedSender<Request>,
    prefetch: usize,
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    route: Route,
}

impl fmt::Debug for DurableQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableQueue")
            .field("closed", &self.requests.is_closed())
            .field("prefetch", &self.prefetch)
            .finish()
    }
}

impl DurableQueue {
    /// Opens the embedded store at `path` with the default settings. See [`Builder::open`].
    ///
    /// # Errors
    ///
    /// As [`Builder::open`].
    pub async fn open(path: impl AsRef<Path>, wheel: &Wheel) -> Result<DurableQueue, Error> {
        Builder::default().open(path, wheel).await
    }

    /// A [`Builder`] for retry policy, lease, prefetch, keep-alive and close timeout.
    pub fn builder() -> Builder {
        Builder::default()
    }

    async fn ask<T>(
        &self,
        request: impl FnOnce(oneshot::Sender<Result<T, Error>>) -> Request,
    ) -> Result<T, Error> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(request(reply))
            .map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }

    /// The Redis connection to call directly, or `None` to go through the engine.
    #[cfg(feature = "redis")]
    fn redis(&self) -> Result<Option<&self::redis::Shared>, Error> {
        match &self.route {
            Route::Engine => Ok(None),
            _ if self.requests.is_closed() => Err(Error::Closed),
            Route::Redis(shared) => Ok(Some(shared)),
        }
    }

    /// Stores the task; returns its id once it is durable.
    ///
    /// # Errors
    ///
    /// [`Error::InFlight`] if a task with this id is being delivered, [`Error::Io`],
    /// [`Error::Unreachable`], [`Error::Closed`].
    pub async fn schedule(&self, task: Task) -> Result<TaskId, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.schedule(task).await;
        }
        self.ask(|reply| Request::Schedule(task, reply)).await
    }

    /// Cancels a pending task: `Ok(true)` means it will not be delivered.
    ///
    /// # Errors
    ///
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn cancel(&self, id: &TaskId) -> Result<bool, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.change(id.as_str(), "cancel", 0).await;
        }
        let id = id.as_str().to_owned();
        self.ask(|reply| Request::Cancel(id, reply)).await
    }

    /// Moves a pending task to `when`: `Ok(true)` if it was pending.
    ///
    /// # Errors
    ///
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn reschedule(&self, id: &TaskId, when: SystemTime) -> Result<bool, Error> {
        let due_ms = epoch_ms(when);
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.change(id.as_str(), "reschedule", due_ms).await;
        }
        let id = id.as_str().to_owned();
        self.ask(|reply| Request::Reschedule(id, due_ms, reply))
            .await
    }

    /// Tasks pending or in flight (not dead letters).
    ///
    /// # Errors
    ///
    /// [`Error::Unreachable`], [`Error::Closed`].
    pub async fn len(&self) -> Result<usize, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.len().await;
        }
        self.ask(Request::Len).await
    }

    /// Whether nothing is pending or in flight.
    ///
    /// # Errors
    ///
    /// [`Error::Unreachable`], [`Error::Closed`].
    pub async fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len().await? == 0)
    }

    /// Every dead letter with its payload, in the order they died. This reads the whole set
    /// (in pages of 1000 on Redis, so the server is never blocked): prefer
    /// [`dead_letters_page`](DurableQueue::dead_letters_page) for long lists.
    ///
    /// # Errors
    ///
    /// [`Error::Unreachable`], [`Error::Closed`].
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.dead_letters().await;
        }
        self.ask(Request::DeadLetters).await
    }

    /// Moves a dead letter back to pending, due now, with its attempt count reset:
    /// `Ok(true)` if it was dead.
    ///
    /// # Errors
    ///
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn redrive(&self, id: &TaskId) -> Result<bool, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.change(id.as_str(), "redrive", 0).await;
        }
        let id = id.as_str().to_owned();
        self.ask(|reply| Request::Redrive(id, reply)).await
    }

    /// One task as the store holds it (without its payload), or `None` if there is no task
    /// of that id. A recurring schedule shows as pending at its next occurrence.
    ///
    /// # Errors
    ///
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn get(&self, id: &TaskId) -> Result<Option<TaskInfo>, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.get(id.as_str()).await;
        }
        let id = id.as_str().to_owned();
        self.ask(|reply| Request::Get(id, reply)).await
    }

    /// A page of at most `limit` tasks (capped at [`PAGE_LIMIT`]) in one state, after the
    /// task `after` (from the start if `None`): pending tasks in due order (ties in schedule
    /// order), in-flight tasks in order of lease end, dead letters in the order they died.
    /// Pass the last id of a page as `after` to get the next one; an empty page is the end.
    ///
    /// Each page is one bounded read (on Redis, `ZRANK` and `ZRANGE … LIMIT` on the index:
    /// never the whole set). The list is live: a task that moves between pages (rescheduled,
    /// replaced, extended, finished) may be missed or seen twice. The cursor is a task, found
    /// where it is now: if the task named by `after` itself moved within its state (say, was
    /// rescheduled later), the next page continues from its new place and the tasks it passed
    /// are not listed, so list again from the start after moving the task you page by.
    /// In flight, claims still waiting in a stream's buffer come after the deliveries handed
    /// out (embedded store, in id order); on Redis they are kept alive by renewals and move
    /// like extended leases.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] if `after` is no longer in that state (list again from the start),
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn list(
        &self,
        filter: TaskFilter,
        after: Option<&TaskId>,
        limit: usize,
    ) -> Result<Vec<TaskInfo>, Error> {
        let limit = limit.min(PAGE_LIMIT);
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.list(filter, after.map(TaskId::as_str), limit).await;
        }
        let after = after.map(|id| id.as_str().to_owned());
        self.ask(|reply| Request::List(filter, after, limit, reply))
            .await
    }

    /// A page of at most `limit` dead letters (capped at [`PAGE_LIMIT`]) with their
    /// payloads, in the order they died, after the dead letter `after`.
    ///
    /// # Errors
    ///
    /// As [`list`](DurableQueue::list).
    pub async fn dead_letters_page(
        &self,
        after: Option<&TaskId>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, Error> {
        let limit = limit.min(PAGE_LIMIT);
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis
                .dead_letters_page(after.map(TaskId::as_str), limit)
                .await;
        }
        let after = after.map(|id| id.as_str().to_owned());
        self.ask(|reply| Request::DeadPage(after, limit, reply))
            .await
    }

    /// Deletes the dead letters that died more than `older_than` ago (by the store's clock),
    /// in bounded batches; returns how many. `Duration::ZERO` purges them all.
    ///
    /// # Errors
    ///
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn purge_dead(&self, older_than: Duration) -> Result<u64, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.purge_dead(delay_ms(older_than)).await;
        }
        let before_ms = if older_than.is_zero() {
            u64::MAX
        } else {
            engine::now_ms().saturating_sub(delay_ms(older_than))
        };
        self.ask(|reply| Request::Purge {
            before_ms,
            removed: 0,
            reply: Some(reply),
        })
        .await
    }

    /// The queue's counts and counters (see [`QueueStats`]).
    ///
    /// # Errors
    ///
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn stats(&self) -> Result<QueueStats, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.stats().await;
        }
        self.ask(Request::Stats).await
    }

    /// Stores a recurring schedule and returns its id once it is durable. Each occurrence is
    /// delivered once, as an ordinary [`Delivery`] with the id `"{id}@{ms}"` whose
    /// [`due`](Delivery::due) is the occurrence's time, across every worker and restart (see
    /// [`Recurring`]). Declaring the same id with the same definition again keeps the
    /// schedule as it is, so every process may declare its schedules at start-up.
    ///
    /// Occurrences are made when a consumer claims: a queue nobody consumes makes none, and
    /// those it missed are caught up by the [`CatchUp`] rule when consuming starts.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for a period under 1 ms, [`Error::InFlight`] if a task of that id
    /// is being delivered, [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn schedule_recurring(&self, recurring: Recurring) -> Result<TaskId, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.schedule_recurring(recurring).await;
        }
        self.ask(|reply| Request::ScheduleRecurring(recurring, reply))
            .await
    }

    /// Removes a recurring schedule: `Ok(true)` if there was one. Occurrences already made
    /// stay (cancel them as tasks).
    ///
    /// # Errors
    ///
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn cancel_recurring(&self, id: &TaskId) -> Result<bool, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.change(id.as_str(), "uncron", 0).await;
        }
        let id = id.as_str().to_owned();
        self.ask(|reply| Request::CancelRecurring(id, reply)).await
    }

    /// A stream of due tasks. Tasks are claimed only while a stream is polled, at most the
    /// prefetch ahead of what was read. May be called more than once; each task goes to one
    /// stream. The stream ends when the queue closes or its wheel shuts down. Dropping it
    /// returns the tasks it had claimed but not yet yielded at once, attempt count unchanged.
    pub fn deliveries(&self) -> Deliveries {
        let (sender, receiver) = mpsc::unbounded_channel();
        let credits = Arc::new(AtomicUsize::new(0));
        let in_transit = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicBool::new(false));
        let _ = self.requests.send(Request::Subscribe(Consumer {
            credits: credits.clone(),
            in_transit: in_transit.clone(),
            closed: closed.clone(),
            sender,
        }));
        Deliveries {
            receiver,
            credits,
            in_transit,
            closed,
            prefetch: self.prefetch,
            requests: self.requests.clone(),
        }
    }

    /// Closes the queue gracefully and releases the store for another handle; pending tasks
    /// stay in the store.
    ///
    /// In order: stops claiming; returns the tasks its streams had claimed but not yet
    /// yielded (at once, their attempt count unchanged) and ends the streams; then waits for
    /// the deliveries it handed out to be finished or dropped, at most
    /// [`Builder::close_timeout`] (default 30 s) — what is still held after that is left to
    /// its lease. Other clones and deliveries answer [`Error::Closed`] once it returns.
    pub async fn close(&self) {
        let _ = self.ask(Request::Close).await;
    }
}

/// The stream of due tasks from [`DurableQueue::deliveries`]: `Send + Unpin + 'static`.
pub struct Deliveries {
    receiver: mpsc::UnboundedReceiver<Delivery>,
    credits: Arc<AtomicUsize>,
    /// Claimed for this stream, not yet in `receiver`.
    in_transit: Arc<AtomicUsize>,
    /// Set by the engine when the queue closes: what is still buffered was returned.
    closed: Arc<AtomicBool>,
    prefetch: usize,
    requests: mpsc::UnboundedSender<Request>,
}

impl fmt::Debug for Deliveries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deliveries")
            .field("buffered", &self.receiver.len())
            .finish_non_exhaustive()
    }
}

impl Stream for Deliveries {
    type Item = Delivery;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Delivery>> {
        if self.closed.load(Ordering::Acquire) {
            // The engine returned what we buffered: drop it unread.
            self.receiver.close();
            while self.receiver.try_recv().is_ok() {}
            return Poll::Ready(None);
        }
        match self.receiver.poll_recv(cx) {
            Poll::Ready(Some(mut delivery)) => {
                delivery.hand_out();
                return Poll::Ready(Some(delivery));
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        // Nothing buffered, claimed or asked for: ask for up to `prefetch` more, once. (What
        // is in transit is sent before it leaves the count, so the buffer is looked at after.)
        if self.credits.load(Ordering::Acquire) == 0
            && self.in_transit.load(Ordering::Acquire) == 0
            && self.receiver.is_empty()
        {
            self.credits.store(self.prefetch, Ordering::Release);
            if self.requests.send(Request::Demand).is_err() {
                return Poll::Ready(None);
            }
        }
        Poll::Pending
    }
}

/// How a delivery is finished.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) enum Outcome {
    Ack,
    /// After this delay, or the policy's backoff.
    Retry(Option<Duration>),
    Fail(String),
}

/// A due task handed to a consumer, under a lease. Finish it with [`ack`](Delivery::ack),
/// [`retry`](Delivery::retry), [`retry_after`](Delivery::retry_after) or
/// [`fail`](Delivery::fail); dropped unfinished, it is delivered again when its lease ends.
///
/// The lease started when the stream yielded the delivery; [`extend`](Delivery::extend)
/// moves its end.
pub struct Delivery {
    id: TaskId,
    payload: Vec<u8>,
    attempt: u32,
    due: SystemTime,
    token: u64,
    engine: mpsc::UnboundedSender<Request>,
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    route: Route,
    /// Yielded by the stream (else still in a prefetch buffer: dropping it returns the task).
    handed_out: bool,
    /// Finished successfully: dropping it tells the engine nothing.
    finished: AtomicBool,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("id", &self.id)
            .field("attempt", &self.attempt)
            .field("due", &self.due)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if self.finished.load(Ordering::Acquire) {
            return;
        }
        // Never handed out: the task goes back at once. Handed out: its lease runs out as
        // promised (a dropped delivery is delivered again after it), but keep-alive and
        // `close` stop waiting for it.
        let _ = self.engine.send(if self.handed_out {
            Request::Dropped(self.token)
        } else {
            Request::Release(self.token)
        });
    }
}

impl Delivery {
    pub(crate) fn new(
        id: TaskId,
        payload: Vec<u8>,
        attempt: u32,
        due: SystemTime,
        token: u64,
        engine: mpsc::UnboundedSender<Request>,
        route: Route,
    ) -> Delivery {
        Delivery {
            id,
            payload,
            attempt,
            due,
            token,
            engine,
            route,
            handed_out: false,
            finished: AtomicBool::new(false),
        }
    }

    /// The stream yields it: its lease starts now.
    fn hand_out(&mut self) {
        self.handed_out = true;
        let _ = self.engine.send(Request::HandedOut(self.token));
    }

    /// The task's id.
    pub fn id(&self) -> &TaskId {
        &self.id
    }

    /// The task's payload: exactly the bytes that were scheduled.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The payload deserialized from JSON (feature `serde`), as written by [`Task::json`].
    ///
    /// # Errors
    ///
    /// What `serde_json` reports for a payload that is not a `T`.
    #[cfg(feature = "serde")]
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }

    /// Which delivery this is: 1 for the first.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the task was due (by the store's clock).
    pub fn due(&self) -> SystemTime {
        self.due
    }

    async fn finish(
        &self,
        #[cfg_attr(not(feature = "redis"), allow(unused_variables))] outcome: Outcome,
        request: impl FnOnce(oneshot::Sender<Result<(), Error>>) -> Request,
    ) -> Result<(), Error> {
        let result = match &self.route {
            Route::Engine => {
                let (reply, answer) = oneshot::channel();
                self.engine
                    .send(request(reply))
                    .map_err(|_| Error::Closed)?;
                answer.await.map_err(|_| Error::Closed)?
            }
            #[cfg(feature = "redis")]
            Route::Redis(shared) => {
                // The engine stops waiting for it (close, keep-alive); the store decides.
                self.engine
                    .send(Request::Finishing(self.token))
                    .map_err(|_| Error::Closed)?;
                shared
                    .finish(self.id.as_str(), self.token, self.attempt, outcome)
                    .await
            }
        };
        if result.is_ok() {
            self.finished.store(true, Ordering::Release);
        }
        result
    }

    /// Done: deletes the task for good, once durable.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the task was handed out again or moved on (this call changed
    /// nothing), [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`]. An `ack` whose reply
    /// was lost and that is retried is recognised and answers `Ok` (for about one lease).
    pub async fn ack(&self) -> Result<(), Error> {
        let id = self.id.as_str().to_owned();
        self.finish(Outcome::Ack, |reply| Request::Ack(id, self.token, reply))
            .await
    }

    /// Not now: delivers the task again after the retry policy's backoff, or moves it to the
    /// dead letters if this was its last attempt.
    ///
    /// # Errors
    ///
    /// As [`ack`](Delivery::ack).
    pub async fn retry(&self) -> Result<(), Error> {
        let id = self.id.as_str().to_owned();
        self.finish(Outcome::Retry(None), |reply| {
            Request::Retry(id, self.token, self.attempt, None, reply)
        })
        .await
    }

    /// Not now: delivers the task again after `delay` (e.g. a server's `Retry-After`), by the
    /// store's clock. Counts toward the policy's `max_attempts` like [`retry`](Delivery::retry):
    /// on the last attempt the task goes to the dead letters.
    ///
    /// # Errors
    ///
    /// As [`ack`](Delivery::ack).
    pub async fn retry_after(&self, delay: Duration) -> Result<(), Error> {
        let id = self.id.as_str().to_owned();
        self.finish(Outcome::Retry(Some(delay)), |reply| {
            Request::Retry(id, self.token, self.attempt, Some(delay), reply)
        })
        .await
    }

    /// Never: moves the task to the dead letters with `reason`.
    ///
    /// # Errors
    ///
    /// As [`ack`](Delivery::ack).
    pub async fn fail(&self, reason: impl Into<String>) -> Result<(), Error> {
        let id = self.id.as_str().to_owned();
        let reason = reason.into();
        self.finish(Outcome::Fail(reason.clone()), |reply| {
            Request::Fail(id, self.token, reason, reply)
        })
        .await
    }

    /// Keeps the lease for a long job: it now ends `duration` from now (by the store's
    /// clock), whatever was left of it. Call it again before then to go on.
    ///
    /// Cost: one store round trip on Redis; nothing durable on the embedded store (its leases
    /// live in the process that holds the lock).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease already ran out (or the delivery was finished),
    /// [`Error::Unreachable`], [`Error::Closed`].
    pub async fn extend(&self, duration: Duration) -> Result<(), Error> {
        #[cfg(feature = "redis")]
        if let Route::Redis(shared) = &self.route {
            if self.engine.is_closed() {
                return Err(Error::Closed);
            }
            let held = shared
                .extend(&[(self.id.as_str().to_owned(), self.token)], duration, true)
                .await?;
            return if held == 1 {
                Ok(())
            } else {
                Err(Error::LeaseLost)
            };
        }
        let (reply, answer) = oneshot::channel();
        self.engine
            .send(Request::Extend(self.token, duration, reply))
            .map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }
}
