//! Reaching the server: clients (with their TLS roots), connecting to one server or a
//! cluster, and what a Redis error means for the queue — retried while the server is
//! unreachable ([`with_retries`]), final at once when it refuses the credentials
//! ([`classify`]).

use std::time::Duration;

use redis::RedisFuture;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use tokio::time::Instant;

use crate::Error;

/// How long a command is retried while the server is unreachable before its error is
/// surfaced: rides out a restarting server or a connection that keeps dropping.
const RETRY_BUDGET: Duration = Duration::from_secs(10);
/// The backoff between tries doubles from the first to the last.
const RETRY_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_millis(500));
/// How long a command may go unanswered before its connection counts as lost.
pub(super) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to one server (reconnecting) or to a cluster (following MOVED and ASK,
/// refreshing its slot map).
#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, redis::Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(cmd, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

/// How to reach the server(s), from [`Builder`](crate::Builder).
pub(crate) struct Target {
    /// One URL (a server), or the seed nodes of a cluster.
    pub(crate) urls: Vec<String>,
    pub(crate) cluster: bool,
    pub(crate) partitions: usize,
    pub(crate) replicas: usize,
    /// Connect to (and keep using) a server whose `maxmemory-policy` may evict keys.
    pub(crate) allow_evicting_server: bool,
    /// PEM root certificates to trust for `rediss://` (else the system's).
    pub(crate) tls_roots: Option<Vec<u8>>,
}

/// Whether trying again may succeed: a lost or refused connection, a timeout, a server still
/// loading its data after a restart, a cluster moving slots. Anything else (a script error,
/// bad data, refused credentials) is final.
fn is_transient(error: &redis::RedisError) -> bool {
    !matches!(error.retry_method(), redis::RetryMethod::NoRetry)
}

/// A Redis error as the queue reports it: refused credentials and certificates are
/// [`Error::Denied`] (final, at once), an unreachable server [`Error::Unreachable`]. The
/// redis crate's messages name the server, never the credentials.
pub(super) fn classify(error: &redis::RedisError) -> Error {
    let text = error.to_string();
    let lower = text.to_lowercase();
    let denied = matches!(error.kind(), redis::ErrorKind::AuthenticationFailed)
        || lower.contains("wrongpass")
        || lower.contains("noauth")
        || lower.contains("noperm")
        || lower.contains("certificate")
        || lower.contains("invalid peer")
        || lower.contains("handshake");
    if denied {
        Error::Denied(text)
    } else if is_transient(error) || error.is_connection_refusal() || error.is_io_error() {
        Error::Unreachable(text)
    } else {
        Error::Io(text)
    }
}

/// Runs a Redis operation, retrying with backoff while the server is unreachable. A refusal
/// is final at once, though the redis crate would retry it: a reconnect that the server
/// refuses (the password changed) is not a server that is down.
pub(super) async fn with_retries<T, F, Fut>(mut operation: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = redis::RedisResult<T>>,
{
    let start = Instant::now();
    let mut delay = RETRY_BACKOFF.0;
    loop {
        match operation().await {
            Ok(value) => return Ok(value),
            Err(error) if !is_transient(&error) || classify(&error).is_denied() => {
                return Err(match classify(&error) {
                    Error::Unreachable(text) => Error::Io(text),
                    other => other,
                });
            }
            Err(error) => {
                if start.elapsed() >= RETRY_BUDGET {
                    return Err(Error::Unreachable(error.to_string()));
                }
                tracing::debug!(%error, "redis unreachable; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(RETRY_BACKOFF.1);
            }
        }
    }
}

/// A client for one server, trusting `tls_roots` for `rediss://` if given.
pub(super) fn client(url: &str, tls_roots: Option<&[u8]>) -> Result<redis::Client, Error> {
    let invalid = |e: redis::RedisError| Error::Invalid(format!("a Redis URL cannot be used: {e}"));
    match tls_roots {
        #[cfg(feature = "redis-tls")]
        Some(roots) => redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(roots.to_vec()),
            },
        )
        .map_err(invalid),
        _ => redis::Client::open(url).map_err(invalid),
    }
}

pub(super) async fn connect(target: &Target) -> Result<Connection, Error> {
    if !target.cluster {
        let client = client(&target.urls[0], target.tls_roots.as_deref())?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_number_of_retries(2)
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_max_delay(Duration::from_secs(2));
        let connection = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| classify(&e))?;
        return Ok(Connection::Single(connection));
    }
    #[cfg_attr(not(feature = "redis-tls"), allow(unused_mut))]
    let mut builder =
        redis::cluster::ClusterClient::builder(target.urls.iter().map(String::as_str))
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(RESPONSE_TIMEOUT)
            .retries(6)
            .max_retry_wait(500);
    #[cfg(feature = "redis-tls")]
    if let Some(roots) = &target.tls_roots {
        builder = builder.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(roots.clone()),
        });
    }
    let client = builder
        .build()
        .map_err(|e| Error::Invalid(format!("the Redis Cluster URLs cannot be used: {e}")))?;
    let connection = client
        .get_async_connection()
        .await
        .map_err(|e| classify(&e))?;
    Ok(Connection::Cluster(connection))
}
