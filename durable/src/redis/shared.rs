//! [`Shared`]: one queue's connection, partitions, scripts and settings, and how a script is
//! run on them — retried while the server is unreachable, and for a write, confirmed by the
//! replicas asked for. The calls themselves are in `calls.rs` (changing tasks) and
//! `inspect.rs` (reading them); the engine (`engine.rs`) claims through the same [`Shared`].

use std::time::Duration;

use redis::Script;

use super::connection::{Connection, Link, RESPONSE_TIMEOUT, with_retries};
use super::eviction;
use super::keys::{Keys, partition_of};
use super::replicas::Waiting;
use super::scripts::Scripts;
use crate::Error;
use crate::protocol::Settings;

/// Most entries one renewal, release or dead-letter page touches.
pub(super) const PAGE: usize = 1000;

/// How long a write waits for its replicas (`Builder::replicas`) before it reports them
/// missing: one `WAIT`, in the pipeline that made the write, so it must end inside
/// [`RESPONSE_TIMEOUT`] (a longer one fails first, as a lost connection: "timed out"). Not
/// several shorter ones in a row: a later one would answer for a connection that made no
/// write, which any replica satisfies at once (with 2 s slices the cluster failover test
/// lost a task).
const REPLICA_TIMEOUT: Duration = Duration::from_secs(4);
const _: () = assert!(REPLICA_TIMEOUT.as_millis() < RESPONSE_TIMEOUT.as_millis());

/// Script arguments, each turned into Redis bytes once (so retries resend the same values).
macro_rules! redis_args {
    ($($value:expr),* $(,)?) => {{
        let mut args: Vec<Vec<u8>> = Vec::new();
        $(args.extend(redis::ToRedisArgs::to_redis_args(&$value));)*
        args
    }};
}
pub(super) use redis_args;

/// One queue's connection, partitions, scripts and settings: what the engine and every
/// handle and delivery of the queue call directly.
pub(crate) struct Shared {
    pub(super) parts: Vec<Keys>,
    pub(super) scripts: Scripts,
    /// Where schedules and finishes wait to share an invocation (see `batch.rs`).
    pub(super) batchers: super::batch::Batchers,
    pub(super) link: Link,
    pub(super) settings: Settings,
    /// Writes return once this many replicas have them (`WAIT`).
    pub(super) replicas: usize,
    /// A Redis Cluster (its policy is checked on every master).
    pub(super) cluster: bool,
    /// Whether the server's `maxmemory-policy` lets calls go on (see `eviction.rs`).
    pub(super) eviction: eviction::Guard,
    /// With replicas to wait for: the connections waiting writes run on.
    pub(super) waiting: Option<Waiting>,
    /// Opened with `Builder::read_only`: only the scripts that read may run.
    pub(super) read_only: bool,
}

pub(super) fn delay_ms_floor(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A number in a script's reply (Redis prints scores as doubles, "1.7e+12" for some).
pub(super) fn number(bytes: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(bytes).ok()?;
    text.parse::<u64>()
        .ok()
        .or_else(|| text.parse::<f64>().ok().map(|f| f as u64))
}

impl Shared {
    /// The keys of the partition task `id` lives in.
    pub(super) fn keys_for(&self, id: &str) -> &Keys {
        &self.parts[partition_of(id, self.parts.len())]
    }

    /// Runs a Redis operation for a call: first the eviction check when it is due (an
    /// evicting server fails the call with [`Error::Invalid`]), then the operation, retried
    /// while the server is unreachable. A call that had to be retried may have reconnected
    /// to another server (a restart, a failover): the next call checks its policy first.
    pub(super) async fn call<T, F, Fut>(&self, mut operation: F) -> Result<T, Error>
    where
        F: FnMut(Connection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        self.eviction.admit(&self.link.get(), self.cluster).await?;
        let mut tries = 0;
        let result = with_retries(&self.link, |connection| {
            tries += 1;
            operation(connection)
        })
        .await;
        if tries > 1 {
            self.eviction.recheck_soon();
        }
        result
    }

    /// A read-only handle runs only the scripts that read.
    fn admit_script(&self, script: &Script) -> Result<(), Error> {
        if self.read_only && !self.scripts.reads_only(script) {
            return Err(Error::Invalid(
                "this handle is read-only (Builder::read_only): it cannot change the queue".into(),
            ));
        }
        Ok(())
    }

    /// Runs one of the queue's scripts, retrying while the server is unreachable.
    pub(super) async fn invoke<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: Vec<Vec<u8>>,
    ) -> Result<T, Error> {
        self.admit_script(script)?;
        self.call(|mut connection| {
            let mut invocation = script.prepare_invoke();
            for key in keys {
                invocation.key(*key);
            }
            for arg in &args {
                invocation.arg(arg.as_slice());
            }
            async move { invocation.invoke_async(&mut connection).await }
        })
        .await
    }

    /// Runs a script that writes to partition `part` and, with
    /// [`replicas`](crate::Builder::replicas), waits until that many replicas have the write
    /// (see `replicas.rs`: one pipeline on a connection of its own).
    pub(super) async fn invoke_write<T: redis::FromRedisValue>(
        &self,
        part: &Keys,
        script: &Script,
        keys: &[&str],
        args: Vec<Vec<u8>>,
    ) -> Result<T, Error> {
        self.admit_script(script)?;
        let Some(waiting) = &self.waiting else {
            return self.invoke(script, keys, args).await;
        };
        self.eviction.admit(&self.link.get(), self.cluster).await?;
        let waited = waiting
            .write(&self.link, part, script, keys, &args, REPLICA_TIMEOUT)
            .await?;
        let value = T::from_redis_value(waited.reply).map_err(|e| Error::Io(e.to_string()))?;
        let acknowledged = waited.acknowledged;
        if acknowledged < self.replicas {
            return Err(Error::Unreachable(format!(
                "the write is on the primary but only {acknowledged} of {} replicas had it \
                 within {REPLICA_TIMEOUT:?}",
                self.replicas
            )));
        }
        Ok(value)
    }
}
