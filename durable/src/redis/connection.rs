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
pub(super) const RETRY_BUDGET: Duration = Duration::from_secs(10);
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
    /// Inspect only: write nothing, at connect or after (see `Builder::read_only`).
    pub(crate) read_only: bool,
}

/// Reply codes of a server that is there but cannot serve this client right now: still
/// loading its data, running a long script, without its master, in a resharding or a
/// cluster failover. With "max number of clients reached" (an `ERR`), they are retried like
/// a dropped connection and reported as [`Error::Unreachable`], never as a refusal.
const BUSY_CODES: [&str; 5] = ["LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"];

/// Whether the server answered that it is busy (see [`BUSY_CODES`]), not that it refuses.
pub(super) fn is_busy(error: &redis::RedisError) -> bool {
    let text = error.to_string();
    let first_word = |t: &str| t.split_whitespace().next().map(str::to_owned);
    error.code().is_some_and(|code| BUSY_CODES.contains(&code))
        || first_word(&text).is_some_and(|word| BUSY_CODES.contains(&word.as_str()))
        || text
            .to_lowercase()
            .contains("max number of clients reached")
}

/// Whether trying again may succeed: a lost or refused connection, a timeout, a busy server
/// (still loading its data after a restart, at its client limit, a cluster moving slots).
/// Anything else (a script error, bad data, refused credentials) is final.
fn is_transient(error: &redis::RedisError) -> bool {
    !matches!(error.retry_method(), redis::RetryMethod::NoRetry) || is_busy(error)
}

/// A Redis error as the queue reports it: refused credentials and certificates are
/// [`Error::Denied`] (final, at once), an unreachable or busy server [`Error::Unreachable`].
/// The redis crate's messages name the server, never the credentials.
pub(super) fn classify(error: &redis::RedisError) -> Error {
    let text = error.to_string();
    if is_busy(error) {
        return Error::Unreachable(text);
    }
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

/// Asks the server again why it refused to authenticate. The redis crate reports any error
/// reply to `AUTH` as "Password authentication failed", so a server at its client limit
/// ("max number of clients reached") or still loading looked like a wrong password: final,
/// where it should be retried. The probe connects without credentials and sends `AUTH`
/// itself, so it sees the server's own reply.
pub(super) struct Probe {
    /// One client per URL, without credentials.
    clients: Vec<redis::Client>,
    /// The URL's user (if any) and password.
    credentials: Option<(Option<String>, String)>,
}

impl Probe {
    pub(super) fn new(target: &Target) -> Result<Probe, Error> {
        let mut clients = Vec::new();
        let mut credentials = None;
        for url in &target.urls {
            let full = client(url, target.tls_roots.as_deref())?;
            let info = full.get_connection_info().clone();
            let settings = info.redis_settings();
            if let Some(password) = settings.password() {
                credentials = Some((settings.username().map(str::to_owned), password.to_owned()));
            }
            let bare = redis::RedisConnectionInfo::default()
                .set_db(settings.db())
                .set_protocol(settings.protocol());
            let probe = redis::Client::open(info.set_redis_settings(bare))
                .map_err(|e| Error::Invalid(format!("a Redis URL cannot be used: {e}")))?;
            clients.push(probe);
        }
        Ok(Probe {
            clients,
            credentials,
        })
    }

    /// What an `AuthenticationFailed` from the redis crate really was: [`Error::Denied`] if a
    /// server refuses the credentials again in its own words (`WRONGPASS`, …),
    /// [`Error::Unreachable`] if none does (busy, unreachable, or accepting them now).
    pub(super) async fn refusal(&self, error: &redis::RedisError) -> Error {
        let Some((user, password)) = &self.credentials else {
            return classify(error);
        };
        let mut why = error.to_string();
        for client in &self.clients {
            let ask = async {
                let mut connection = client.get_multiplexed_async_connection().await?;
                let mut auth = redis::cmd("AUTH");
                if let Some(user) = user {
                    auth.arg(user);
                }
                auth.arg(password);
                auth.query_async::<()>(&mut connection).await
            };
            match tokio::time::timeout(Duration::from_secs(2), ask).await {
                Ok(Err(answer)) if !is_transient(&answer) && !answer.is_io_error() => {
                    return Error::Denied(answer.to_string());
                }
                Ok(Err(answer)) => why = answer.to_string(),
                Ok(Ok(())) => why = "the server accepted the credentials when asked again".into(),
                Err(_) => why = "no answer to AUTH within 2 s".into(),
            }
        }
        Error::Unreachable(format!("authentication did not complete: {why}"))
    }
}

/// A queue's connection to its server or cluster. The redis crate's connection manager keeps
/// a reconnect that failed other than by I/O (a refused `AUTH`) for good, answering every
/// later command with that error; when the refusal was the server being busy, the link makes
/// a new one. A cluster connection keeps its slot map until a `MOVED` corrects it, and a
/// master demoted to a replica (a failover, or a reshard that took all its slots) answers
/// writes with `READONLY` instead: the link then makes a new connection, which reads the
/// cluster's slots afresh.
pub(super) struct Link {
    current: std::sync::RwLock<Connection>,
    /// A single server's client, to make a new connection manager from.
    client: Option<redis::Client>,
    /// A cluster's client, to make a new cluster connection from.
    cluster: Option<redis::cluster::ClusterClient>,
    probe: Probe,
}

impl Link {
    /// Connects (see [`connect`]).
    pub(super) async fn open(target: &Target) -> Result<Link, Error> {
        let connection = connect(target).await?;
        let (client, cluster) = match target.cluster {
            false => (
                Some(client(&target.urls[0], target.tls_roots.as_deref())?),
                None,
            ),
            true => (None, Some(cluster_client(target)?)),
        };
        Ok(Link {
            current: std::sync::RwLock::new(connection),
            client,
            cluster,
            probe: Probe::new(target)?,
        })
    }

    /// The connection to send on (a cheap clone of a multiplexed handle).
    pub(super) fn get(&self) -> Connection {
        self.current.read().expect("not poisoned").clone()
    }

    /// Replaces a single server's connection manager, if a new one connects.
    async fn renew(&self) {
        let Some(client) = &self.client else { return };
        if let Ok(manager) =
            ConnectionManager::new_with_config(client.clone(), manager_config()).await
        {
            *self.current.write().expect("not poisoned") = Connection::Single(manager);
        }
    }

    /// Replaces a cluster connection with one that reads the slot map afresh, if it connects.
    async fn renew_cluster(&self) {
        let Some(cluster) = &self.cluster else { return };
        if let Ok(connection) = cluster.get_async_connection().await {
            *self.current.write().expect("not poisoned") = Connection::Cluster(connection);
        }
    }
}

/// Runs a Redis operation on the link's connection, retrying with backoff while the server
/// is unreachable or busy. A refusal is final at once, though the redis crate would retry
/// it: a reconnect that the server refuses (the password changed) is not a server that is
/// down. A refused `AUTH` is first asked again (see [`Probe`]), to tell a wrong password from
/// a busy server; a busy one gets a new connection on the next try.
pub(super) async fn with_retries<T, F, Fut>(link: &Link, mut operation: F) -> Result<T, Error>
where
    F: FnMut(Connection) -> Fut,
    Fut: Future<Output = redis::RedisResult<T>>,
{
    retrying(link, || operation(link.get())).await
}

/// [`with_retries`] for an operation that brings its own connection (a waiting write's).
pub(super) async fn retrying<T, F, Fut>(link: &Link, mut operation: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = redis::RedisResult<T>>,
{
    let start = Instant::now();
    let mut delay = RETRY_BACKOFF.0;
    loop {
        let error = match operation().await {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        let refused_auth = matches!(error.kind(), redis::ErrorKind::AuthenticationFailed);
        // A write refused by a former master: nothing was applied, and a fresh slot map
        // names the new one.
        let demoted = link.cluster.is_some()
            && matches!(
                error.kind(),
                redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
            );
        let judged = if refused_auth {
            link.probe.refusal(&error).await
        } else {
            classify(&error)
        };
        if (!is_transient(&error) && !demoted) || judged.is_denied() {
            return Err(match judged {
                Error::Unreachable(text) if !is_busy(&error) => Error::Io(text),
                other => other,
            });
        }
        if start.elapsed() >= RETRY_BUDGET {
            return Err(Error::Unreachable(error.to_string()));
        }
        tracing::debug!(%error, "redis unreachable; retrying");
        tokio::time::sleep(delay).await;
        if refused_auth {
            link.renew().await;
        }
        if demoted {
            tracing::info!(%error, "a cluster master was demoted; reading the slot map again");
            link.renew_cluster().await;
        }
        delay = (delay * 2).min(RETRY_BACKOFF.1);
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

fn manager_config() -> redis::aio::ConnectionManagerConfig {
    redis::aio::ConnectionManagerConfig::new()
        .set_number_of_retries(2)
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_max_delay(Duration::from_secs(2))
}

/// Connects to the server (or the cluster); a refused `AUTH` is asked again (see [`Probe`]).
async fn connect(target: &Target) -> Result<Connection, Error> {
    if !target.cluster {
        let client = client(&target.urls[0], target.tls_roots.as_deref())?;
        return match ConnectionManager::new_with_config(client, manager_config()).await {
            Ok(connection) => Ok(Connection::Single(connection)),
            Err(error) => Err(connect_error(target, &error).await),
        };
    }
    match cluster_client(target)?.get_async_connection().await {
        Ok(connection) => Ok(Connection::Cluster(connection)),
        Err(error) => Err(connect_error(target, &error).await),
    }
}

/// A client for the cluster the target's URLs name.
pub(super) fn cluster_client(target: &Target) -> Result<redis::cluster::ClusterClient, Error> {
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
    builder
        .build()
        .map_err(|e| Error::Invalid(format!("the Redis Cluster URLs cannot be used: {e}")))
}

/// Why connecting failed: a refused `AUTH` is asked again (see [`Probe`]).
async fn connect_error(target: &Target, error: &redis::RedisError) -> Error {
    if !matches!(error.kind(), redis::ErrorKind::AuthenticationFailed) {
        return classify(error);
    }
    match Probe::new(target) {
        Ok(probe) => probe.refusal(error).await,
        Err(invalid) => invalid,
    }
}
