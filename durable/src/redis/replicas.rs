//! Writes that wait for replicas ([`Builder::replicas(n)`](crate::Builder::replicas)).
//!
//! `WAIT` answers for what *its own connection* wrote, and blocks that connection until it
//! answers. So each waiting write is one pipeline — the script, then `WAIT n timeout` — on a
//! connection it has to itself for that call:
//!
//! - no reconnect can come between the write and its `WAIT` (the two go out together; a
//!   connection lost on the way fails both, and the call is retried whole);
//! - a `WAIT` held up by a slow replica never delays the queue's other calls, which go over
//!   the shared multiplexed connection (nor another waiting write: each has its own).
//!
//! Connections are kept in a small pool (at most [`MAX_WAITING`] writes wait at once; more
//! queue for a connection). A retried write whose first try may have run (its reply lost)
//! is recognised by its script and changes nothing the second time — so that try's `WAIT`
//! would answer for nothing; the retry's pipeline adds an `INCRBY seq 0` (a write that
//! changes no value but is replicated) before its `WAIT`, which then covers everything the
//! master had applied, the first try included.

use std::collections::HashSet;
use std::sync::Mutex;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{RedisResult, Script, Value};
use tokio::sync::Semaphore;

use super::connection::{Link, RESPONSE_TIMEOUT, Target, client, cluster_client, retrying};
use super::keys::Keys;
use super::shared::delay_ms_floor;
use crate::Error;

/// The most writes that wait for replicas at once (each on its own connection).
pub(super) const MAX_WAITING: usize = 16;

/// How waiting writes reach the server: a single server, or a cluster (to the partition's
/// master).
enum Source {
    Single(redis::Client),
    Cluster(redis::cluster::ClusterClient),
}

/// A connection one waiting write has to itself.
enum Dedicated {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// The pool of connections for waiting writes.
pub(super) struct Waiting {
    source: Source,
    free: Mutex<Vec<Dedicated>>,
    permits: Semaphore,
    /// Replicas to wait for.
    replicas: usize,
    /// The scripts loaded on the server: each is loaded before its first waiting write, as
    /// a `NOSCRIPT` inside the pipeline would still leave its `WAIT` blocking for the
    /// whole timeout (no write to wait for, fewer replicas than asked).
    loaded: Mutex<HashSet<String>>,
}

/// What a waiting write's pipeline answered: the script's reply, and how many replicas had
/// the write within the timeout.
pub(super) struct Waited {
    pub(super) reply: Value,
    pub(super) acknowledged: usize,
}

impl Waiting {
    pub(super) fn new(target: &Target) -> Result<Waiting, Error> {
        let source = if target.cluster {
            Source::Cluster(cluster_client(target)?)
        } else {
            Source::Single(client(&target.urls[0], target.tls_roots.as_deref())?)
        };
        Ok(Waiting {
            source,
            free: Mutex::new(Vec::new()),
            permits: Semaphore::new(MAX_WAITING),
            replicas: target.replicas,
            loaded: Mutex::new(HashSet::new()),
        })
    }

    async fn take(&self) -> RedisResult<Dedicated> {
        if let Some(connection) = self.free.lock().expect("not poisoned").pop() {
            return Ok(connection);
        }
        match &self.source {
            Source::Single(client) => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(std::time::Duration::from_secs(2)))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT));
                let connection = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Ok(Dedicated::Single(connection))
            }
            Source::Cluster(client) => Ok(Dedicated::Cluster(client.get_async_connection().await?)),
        }
    }

    /// Runs `script` on partition `part` and waits for the replicas, as one pipeline on a
    /// connection of its own; retried whole while the server is unreachable.
    pub(super) async fn write(
        &self,
        link: &Link,
        part: &Keys,
        script: &Script,
        keys: &[&str],
        args: &[Vec<u8>],
        timeout: std::time::Duration,
    ) -> Result<Waited, Error> {
        let _permit = self.permits.acquire().await.map_err(|_| Error::Closed)?;
        let mut tries = 0;
        retrying(link, || {
            tries += 1;
            let again = tries > 1;
            async move {
                let mut connection = self.take().await?;
                let result = self
                    .run(&mut connection, part, script, keys, args, again, timeout)
                    .await;
                // A connection that failed on the way is dropped; one that answered is kept,
                // unless a demoted master answered (`READONLY`): a new connection reads the
                // cluster's slot map afresh.
                let answered = match &result {
                    Ok(_) => true,
                    Err(error) => {
                        !error.is_io_error()
                            && !error.is_timeout()
                            && !matches!(
                                error.kind(),
                                redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
                            )
                    }
                };
                if answered {
                    self.free.lock().expect("not poisoned").push(connection);
                }
                result
            }
        })
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn run(
        &self,
        connection: &mut Dedicated,
        part: &Keys,
        script: &Script,
        keys: &[&str],
        args: &[Vec<u8>],
        again: bool,
        timeout: std::time::Duration,
    ) -> RedisResult<Waited> {
        let hash = script.get_hash().to_owned();
        if !self.loaded.lock().expect("not poisoned").contains(&hash) {
            load(connection, script).await?;
            self.loaded
                .lock()
                .expect("not poisoned")
                .insert(hash.clone());
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("EVALSHA").arg(script.get_hash()).arg(keys.len());
        for key in keys {
            pipe.arg(*key);
        }
        for arg in args {
            pipe.arg(arg.as_slice());
        }
        if again {
            pipe.cmd("INCRBY").arg(&part.seq).arg(0);
        }
        pipe.cmd("WAIT")
            .arg(self.replicas)
            .arg(delay_ms_floor(timeout));
        let mut values = send(connection, &pipe, part).await?;
        if let Some(Value::ServerError(error)) = values.first()
            && error.code() == "NOSCRIPT"
        {
            // The server lost its scripts (a restart, a failover, SCRIPT FLUSH).
            load(connection, script).await?;
            values = send(connection, &pipe, part).await?;
        }
        let mut values = values.into_iter();
        let reply = match values.next() {
            Some(Value::ServerError(error)) => return Err(error.into()),
            Some(reply) => reply,
            None => return Err((redis::ErrorKind::Client, "an empty pipeline reply").into()),
        };
        let acknowledged = match values.last() {
            Some(Value::ServerError(error)) => return Err(error.into()),
            Some(value) => redis::from_redis_value(value)?,
            None => 0,
        };
        Ok(Waited {
            reply,
            acknowledged,
        })
    }
}

async fn load(connection: &mut Dedicated, script: &Script) -> RedisResult<()> {
    match connection {
        Dedicated::Single(c) => script.load_async(c).await?,
        Dedicated::Cluster(c) => script.load_async(c).await?,
    };
    Ok(())
}

async fn send(
    connection: &mut Dedicated,
    pipe: &redis::Pipeline,
    part: &Keys,
) -> RedisResult<Vec<Value>> {
    match connection {
        Dedicated::Single(c) => pipe.query_async(c).await,
        Dedicated::Cluster(c) => {
            let route =
                SingleNodeRoutingInfo::SpecificNode(Route::new(part.slot, SlotAddr::Master));
            c.route_pipeline(pipe.clone(), 0, pipe.len(), route).await
        }
    }
}
