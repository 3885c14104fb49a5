//! [`Builder`]: retry policy, lease, prefetch, keep-alive, close timeout, retention; opens the
//! embedded store or connects to Redis.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_wheel::Wheel;

use crate::engine::Engine;
use crate::protocol::Settings;
use crate::store::{RedbStore, Store};
use crate::{DurableQueue, Error, RetryPolicy, Route};

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
    allow_evicting_server: bool,
    tls_roots: Option<Vec<u8>>,
    read_only: bool,
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
            .field("allow_evicting_server", &self.allow_evicting_server)
            .field("tls_roots", &self.tls_roots.as_ref().map(Vec::len))
            .field("read_only", &self.read_only)
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
            allow_evicting_server: false,
            tls_roots: None,
            read_only: false,
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
    /// The lease starts when the [`Deliveries`](crate::Deliveries) stream yields the delivery, not when the task
    /// was claimed into the prefetch buffer: the handle keeps buffered claims alive until then
    /// (Redis: one renewal script per lease/3 for all of them). A long job can keep its lease
    /// with [`Delivery::extend`](crate::Delivery::extend) or [`keep_alive`](Builder::keep_alive).
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
    ///
    /// Each waiting write sends its script and its `WAIT` as one pipeline on a connection of
    /// its own (a pool of at most 16 for the handle), so no reconnect comes between them and
    /// a `WAIT` held up by a slow replica never delays the handle's other calls.
    #[cfg(feature = "redis")]
    pub fn replicas(mut self, n: usize) -> Builder {
        self.replicas = n;
        self
    }

    /// Redis: connect even to a server whose `maxmemory-policy` may evict the queue's keys
    /// (default `false`: refused).
    ///
    /// A queue's tasks are keys without a TTL. On a server with an `allkeys-*` policy (common
    /// on caches) they are deleted when memory fills, with no error anywhere, so
    /// [`redis`](Builder::redis) and [`redis_cluster`](Builder::redis_cluster) refuse such a
    /// server with [`Error::Invalid`] naming the policy, and a running handle whose server is
    /// switched to one fails its calls with that error rather than lose tasks silently
    /// (checked before a call every 5 s at most, and at once after a reconnect).
    /// `noeviction` is accepted; so is `volatile-*` (it evicts only keys with a TTL: the
    /// queue's idempotency marks and claim records, never a task), with a warning. A server
    /// that answers neither `CONFIG GET maxmemory-policy` nor `INFO memory` is refused too.
    ///
    /// Turn this on only if you know the server never fills its memory (or its policy is
    /// `noeviction` but it hides it): the policy is then only logged at connect, never
    /// checked again, and nothing protects the tasks from eviction.
    ///
    /// ```
    /// use tokio_wheel_durable::DurableQueue;
    ///
    /// // A cache server whose memory the operator guarantees never fills.
    /// let builder = DurableQueue::builder().allow_evicting_server(true);
    /// # let _ = builder;
    /// ```
    #[cfg(feature = "redis")]
    pub fn allow_evicting_server(mut self, allow: bool) -> Builder {
        self.allow_evicting_server = allow;
        self
    }

    /// Redis: open the queue for inspection only (default `false`) — for a dashboard or an
    /// operator's tool. Such a handle writes nothing to the server, at connect or after:
    ///
    /// - the queue must exist: if the server holds none of its keys (its partition record,
    ///   its tasks, its counters), [`redis`](Builder::redis) and
    ///   [`redis_cluster`](Builder::redis_cluster) fail with [`Error::NoQueue`] and leave
    ///   nothing behind (an ordinary handle records the partition count at connect, so a
    ///   misspelt name would leave a key);
    /// - its partition count is read from the server ([`partitions`](Builder::partitions)
    ///   is only used for a queue made before the count was recorded);
    /// - it answers [`get`](DurableQueue::get), [`payload`](DurableQueue::payload),
    ///   [`list`](DurableQueue::list), [`list_page`](DurableQueue::list_page),
    ///   [`recurring_page`](DurableQueue::recurring_page),
    ///   [`dead_letters`](DurableQueue::dead_letters), [`stats`](DurableQueue::stats) and
    ///   [`len`](DurableQueue::len); every call that would write (`schedule`, `cancel`,
    ///   `purge_dead`, …) fails with [`Error::Invalid`], and
    ///   [`deliveries`](DurableQueue::deliveries) ends at once (it never claims). It starts no
    ///   claiming engine and subscribes to no channel.
    ///
    /// ```no_run
    /// # use tokio_wheel_durable::{DurableQueue, Error};
    /// # async fn look(wheel: &tokio_wheel::Wheel) -> Result<(), Error> {
    /// let queue = DurableQueue::builder()
    ///     .read_only(true)
    ///     .redis("redis://127.0.0.1:6379/", "orders", wheel)
    ///     .await?; // Err(Error::NoQueue(..)) if there is no queue "orders"
    /// println!("{:?}", queue.stats().await?);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redis")]
    pub fn read_only(mut self, on: bool) -> Builder {
        self.read_only = on;
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
            crate::tasks::migrate_legacy(&mut store, crate::protocol::now_ms())?;
            Ok::<_, Error>(store)
        })
        .await
        // redb may panic on a file changed behind its back: that file is not a store.
        .map_err(|e| Error::Corrupt(format!("opening the store panicked: {e}")))??;
        let path = store.path().to_owned();
        let queue = self.open_with_store(store, wheel).await?;
        // An open of the same file once every handle is gone waits for the store to close
        // instead of answering `Locked` (the engine notices the drop a moment later).
        let handles = queue.requests.downgrade();
        crate::embedded::store::watch_handles(&path, move || handles.upgrade().is_none());
        Ok(queue)
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
    /// for a bad URL, a zero lease, a partition count other than the queue's, or a server
    /// whose `maxmemory-policy` would evict the queue's tasks (see
    /// [`allow_evicting_server`](Builder::allow_evicting_server)),
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
        let target = crate::redis::Target {
            urls,
            cluster,
            partitions: self.partitions,
            replicas: self.replicas,
            allow_evicting_server: self.allow_evicting_server,
            tls_roots: self.tls_roots.clone(),
            read_only: self.read_only,
        };
        let (requests, shared) = crate::redis::start(target, name, settings, wheel).await?;
        Ok(DurableQueue {
            requests,
            prefetch: self.prefetch,
            route: Route::Redis(shared),
            released: None,
            streams: Default::default(),
        })
    }

    /// Opens a queue on any [`Store`], e.g. a [`MemoryStore`](crate::store::MemoryStore) in tests.
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
        // Says when the engine has given the store (and its lock) back: `close()` waits for
        // it even when the engine stopped first (a wheel shutdown), so a reopen after
        // `close().await` never finds the store still locked. A runtime that dies drops the
        // sender, which counts as released too (the store goes with the engine's task).
        let (released, on_release) = tokio::sync::watch::channel(false);
        crate::protocol::attach(wheel).runtime.spawn(async move {
            engine.run().await;
            let _ = released.send(true);
        });
        Ok(DurableQueue {
            requests,
            prefetch: self.prefetch,
            route: Route::Engine,
            released: Some(on_release),
            streams: Default::default(),
        })
    }
}
