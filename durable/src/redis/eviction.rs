//! Refusing a server that evicts keys: a queue's tasks have no TTL, so under an `allkeys-*`
//! `maxmemory-policy` a full memory deletes them with no error anywhere (200 of 200 pending
//! tasks vanished on such a server, `len()` saying 0).
//!
//! At connect the policy of the server — on a cluster, of every master — is read (`CONFIG GET
//! maxmemory-policy`, else the `maxmemory_policy:` line of `INFO memory`, for managed servers
//! that rename `CONFIG`):
//!
//! - `noeviction` is accepted.
//! - `volatile-*` is accepted with a warning: it evicts only keys with a TTL, and the only
//!   such keys of a queue are its kept replies (`call:<invocation>`) and claim records,
//!   kept for about one lease. Under memory pressure a call retried after a lost reply may then
//!   not be recognised (a retried `ack` answers `LeaseLost`, a retried `schedule` may make
//!   its task again) and a claim whose reply was lost is delivered again after its lease
//!   instead of at once; no task is lost.
//! - anything else (`allkeys-lru`, `allkeys-lfu`, `allkeys-random`, a name this crate does
//!   not know) is refused: [`Error::Invalid`] naming the policy and the fix.
//! - a server that answers neither command — a least-privilege ACL user may run neither —
//!   is accepted with a warning: the policy is unknown. The warning is logged at connect and
//!   after every check that still cannot read it, and [`QueueStats::eviction_policy_unknown`]
//!   says so (so does `twq stats`). Let the user read it (`+config|get` or `+info` in its ACL)
//!   and the check runs as above. A node known to evict is refused even when another's policy
//!   is unknown.
//!
//! The policy can change under a running queue (`CONFIG SET`, a failover to a node
//! configured otherwise, a restart with another config). So a handle checks again before a
//! call when its last check is [`RECHECK`] old — only handles making calls pay, one command
//! per [`RECHECK`], idle ones nothing — and at once before the next call after a reconnect
//! (a call that had to be retried, or the wake listener resubscribing). While the server is
//! found evicting every call of the handle fails with that [`Error::Invalid`] (claims pause;
//! deliveries cannot be finished), and works again once a check finds it safe: a queue that
//! fails loudly rather than one that loses tasks silently.
//!
//! [`QueueStats::eviction_policy_unknown`]: crate::QueueStats::eviction_policy_unknown
//!
//! [`Builder::allow_evicting_server(true)`](crate::Builder::allow_evicting_server) skips the
//! refusal and every later check (the policy is only logged at connect).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::connection::{Connection, classify};
use crate::Error;

/// How old a check may be before a call checks again.
pub(super) const RECHECK: Duration = Duration::from_secs(5);
/// After a check that could not reach the server: try again this soon.
const RECHECK_AFTER_FAILURE: Duration = Duration::from_millis(500);

/// One node's policy, or why it could not be read.
type NodePolicy = (Option<String>, Result<String, String>);

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Every node keeps keys without a TTL.
    Safe,
    /// Every node is safe or `volatile-*` (the note above): accepted with a warning.
    Volatile(String),
    /// No node known to evict, but the policy of at least one could not be read (neither
    /// command allowed): accepted with a warning, which names the node and the fix.
    Unknown(String),
    /// Refused: the message says which node, which policy, and what to do.
    Refused(String),
}

/// The policy's verdict, and when to check again.
pub(super) struct Guard {
    /// `Builder::allow_evicting_server(true)`: never refuse, never check again.
    allowed: bool,
    /// The refusal found by the last check (calls fail with it until a check finds the
    /// server safe).
    refusal: Mutex<Option<String>>,
    /// Milliseconds since `base` when the next call checks again.
    next_check: AtomicU64,
    /// A check is running (calls meanwhile go by the last verdict).
    checking: AtomicBool,
    /// The last check could not read the policy (see [`Verdict::Unknown`]).
    unknown: AtomicBool,
    base: Instant,
}

impl Guard {
    /// `unknown`: the check at connect could not read the policy.
    pub(super) fn new(allowed: bool, unknown: bool) -> Guard {
        let guard = Guard {
            allowed,
            refusal: Mutex::new(None),
            next_check: AtomicU64::new(0),
            checking: AtomicBool::new(false),
            unknown: AtomicBool::new(unknown),
            base: Instant::now(),
        };
        guard.check_in(RECHECK);
        guard
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn check_in(&self, after: Duration) {
        let at = self
            .elapsed_ms()
            .saturating_add(u64::try_from(after.as_millis()).unwrap_or(u64::MAX));
        self.next_check.store(at, Ordering::Release);
    }

    /// The next call checks again first (after a reconnect: the server may be another one).
    pub(super) fn recheck_soon(&self) {
        if !self.allowed {
            self.next_check.store(0, Ordering::Release);
        }
    }

    /// Before a call: checks again if due (one caller at a time; the others go by the last
    /// verdict), then fails with the refusal if the server was found evicting.
    pub(super) async fn admit(&self, connection: &Connection, cluster: bool) -> Result<(), Error> {
        if self.allowed {
            return Ok(());
        }
        let due = self.elapsed_ms() >= self.next_check.load(Ordering::Acquire);
        if due
            && self
                .checking
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            let verdict = check(connection, cluster).await;
            match verdict {
                Ok(Verdict::Refused(why)) => {
                    if self.refusal().is_none() {
                        tracing::error!(%why, "the Redis server evicts keys: refusing calls");
                    }
                    *self.refusal.lock().expect("not poisoned") = Some(why);
                    self.check_in(RECHECK);
                }
                Ok(verdict) => {
                    let unknown = matches!(verdict, Verdict::Unknown(_));
                    if let Verdict::Unknown(note) = &verdict {
                        tracing::warn!(%note, "the Redis server's maxmemory-policy is unknown");
                    }
                    self.unknown.store(unknown, Ordering::Relaxed);
                    if self.refusal.lock().expect("not poisoned").take().is_some() {
                        tracing::warn!("the Redis server no longer evicts keys: calls resume");
                    }
                    self.check_in(RECHECK);
                }
                // Unreachable now: the call finds out for itself; check again soon.
                Err(_) => self.check_in(RECHECK_AFTER_FAILURE),
            }
            self.checking.store(false, Ordering::Release);
        }
        match self.refusal() {
            Some(why) => Err(Error::Invalid(why)),
            None => Ok(()),
        }
    }

    /// Whether the last check could not read the server's policy.
    pub(super) fn policy_unknown(&self) -> bool {
        self.unknown.load(Ordering::Relaxed)
    }

    fn refusal(&self) -> Option<String> {
        self.refusal.lock().expect("not poisoned").clone()
    }
}

/// Reads every node's policy and judges it (see the module doc).
///
/// # Errors
///
/// What reaching the server returns ([`Error::Unreachable`], [`Error::Denied`]): a refused
/// `CONFIG` or `INFO` is not an error here but a verdict.
pub(super) async fn check(connection: &Connection, cluster: bool) -> Result<Verdict, Error> {
    let mut nodes = read(connection, cluster, config_get()).await?;
    let unread: Vec<usize> = (0..nodes.len()).filter(|&i| nodes[i].1.is_err()).collect();
    if !unread.is_empty() {
        let mut info = redis::cmd("INFO");
        info.arg("memory");
        let fallback = read(connection, cluster, info).await?;
        for i in unread {
            let node = nodes[i].0.clone();
            let found = fallback.iter().find(|(n, _)| *n == node);
            if let Some((_, Ok(policy))) = found {
                nodes[i].1 = Ok(policy.clone());
            } else if let (Some((_, Err(info_why))), Err(config_why)) = (found, &nodes[i].1) {
                nodes[i].1 = Err(format!("CONFIG GET: {config_why}; INFO: {info_why}"));
            }
        }
    }
    Ok(judge(&nodes))
}

fn config_get() -> redis::Cmd {
    let mut command = redis::cmd("CONFIG");
    command.arg("GET").arg("maxmemory-policy");
    command
}

/// The policy each node reports through `command` (`CONFIG GET` or `INFO memory`): one entry
/// for a single server, one per master of a cluster (the cluster client holds no connection
/// to replicas; one that a failover promotes is checked by the next recheck).
async fn read(
    connection: &Connection,
    cluster: bool,
    command: redis::Cmd,
) -> Result<Vec<NodePolicy>, Error> {
    let reply = match connection {
        Connection::Single(manager) => {
            let mut manager = manager.clone();
            match command.query_async::<Value>(&mut manager).await {
                Ok(value) => value,
                Err(error) => return refused_or_error(&error).map(|why| vec![(None, Err(why))]),
            }
        }
        Connection::Cluster(nodes) => {
            use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
            let mut nodes = nodes.clone();
            let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllNodes, None));
            match nodes.route_command(command, all).await {
                Ok(value) => value,
                Err(error) => return refused_or_error(&error).map(|why| vec![(None, Err(why))]),
            }
        }
    };
    if !cluster {
        return Ok(vec![(None, policy_in(reply))]);
    }
    match reply {
        Value::Map(nodes) => Ok(nodes
            .into_iter()
            .map(|(node, value)| {
                let node = redis::from_redis_value::<String>(node).ok();
                (node, policy_in(value))
            })
            .collect()),
        other => Ok(vec![(None, policy_in(other))]),
    }
}

/// A command the server refused (renamed, unknown, not permitted) is a verdict to go on
/// from; a server out of reach is an error.
fn refused_or_error(error: &redis::RedisError) -> Result<String, Error> {
    match classify(error) {
        Error::Unreachable(text) => Err(Error::Unreachable(text)),
        _ => Ok(error.to_string()),
    }
}

/// The policy in a `CONFIG GET` reply (`[name, value]`, or a map in RESP3) or an `INFO`
/// text.
fn policy_in(value: Value) -> Result<String, String> {
    match value {
        Value::ServerError(error) => Err(format!(
            "{} {}",
            error.code(),
            error.details().unwrap_or_default()
        )),
        Value::BulkString(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            text.lines()
                .find_map(|line| line.trim().strip_prefix("maxmemory_policy:"))
                .map(|policy| policy.trim().to_owned())
                .ok_or_else(|| "INFO memory has no maxmemory_policy line".to_owned())
        }
        Value::VerbatimString { text, .. } => policy_in(Value::BulkString(text.into_bytes())),
        Value::Array(items) => items
            .get(1)
            .cloned()
            .and_then(|v| redis::from_redis_value::<String>(v).ok())
            .ok_or_else(|| "CONFIG GET maxmemory-policy answered nothing".to_owned()),
        Value::Map(pairs) => pairs
            .into_iter()
            .next()
            .and_then(|(_, v)| redis::from_redis_value::<String>(v).ok())
            .ok_or_else(|| "CONFIG GET maxmemory-policy answered nothing".to_owned()),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

/// The names `volatile-*` policies have (they evict only keys with a TTL).
const VOLATILE: [&str; 4] = [
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
];

fn judge(nodes: &[NodePolicy]) -> Verdict {
    let mut volatile = None;
    let mut unknown = None;
    for (node, policy) in nodes {
        let server = match node {
            Some(node) => format!("the Redis node {node}"),
            None => "the Redis server".to_owned(),
        };
        match policy {
            Ok(policy) if policy == "noeviction" => {}
            Ok(policy) if VOLATILE.contains(&policy.as_str()) => {
                volatile = Some(format!("{server} has maxmemory-policy {policy}"));
            }
            Ok(policy) => return Verdict::Refused(evicting_message(&server, policy)),
            Err(why) => unknown = Some(unknown_message(&server, why)),
        }
    }
    match (unknown, volatile) {
        (Some(unknown), _) => Verdict::Unknown(unknown),
        (None, Some(volatile)) => Verdict::Volatile(volatile),
        (None, None) => Verdict::Safe,
    }
}

/// The refusal of an evicting server (its words are in the README).
pub(super) fn evicting_message(server: &str, policy: &str) -> String {
    format!(
        "{server} evicts keys when its memory is full (maxmemory-policy {policy}): the queue's \
         tasks have no TTL and would be deleted without an error; set maxmemory-policy to \
         noeviction (CONFIG SET maxmemory-policy noeviction, and in redis.conf) or give the \
         queue a server of its own, or connect anyway with Builder::allow_evicting_server(true)"
    )
}

fn unknown_message(server: &str, why: &str) -> String {
    format!(
        "cannot tell whether {server} evicts keys: it refused both CONFIG GET \
         maxmemory-policy and INFO memory ({why}); the queue is open, but if the server's \
         maxmemory-policy evicts (allkeys-*), a full memory deletes tasks without an error: \
         make sure it is noeviction, and let this user read it (ACL: +config|get or +info) \
         so that the check runs"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(policy: &str) -> NodePolicy {
        (Some("127.0.0.1:7000".into()), Ok(policy.into()))
    }

    #[test]
    fn only_noeviction_and_volatile_policies_are_accepted() {
        assert_eq!(
            judge(&[node("noeviction"), node("noeviction")]),
            Verdict::Safe
        );
        assert!(matches!(
            judge(&[node("noeviction"), node("volatile-lru")]),
            Verdict::Volatile(_)
        ));
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "some-new-policy",
        ] {
            let Verdict::Refused(why) = judge(&[node("noeviction"), node(policy)]) else {
                panic!("{policy} accepted");
            };
            assert!(why.contains(policy) && why.contains("noeviction"), "{why}");
            assert!(why.contains("allow_evicting_server"), "{why}");
        }
        let unread = (None, Err("NOPERM this user has no permissions".into()));
        let Verdict::Unknown(why) = judge(std::slice::from_ref(&unread)) else {
            panic!("an unreadable policy is not accepted with a warning");
        };
        assert!(
            why.contains("+config|get") && why.contains("noeviction"),
            "{why}"
        );
        // A node known to evict is refused whatever another's policy is.
        assert!(matches!(
            judge(&[unread.clone(), node("allkeys-lru")]),
            Verdict::Refused(_)
        ));
        assert!(matches!(
            judge(&[node("volatile-lru"), unread]),
            Verdict::Unknown(_)
        ));
    }

    #[test]
    fn the_policy_is_read_from_config_get_and_from_info() {
        let config = Value::Array(vec![
            Value::BulkString(b"maxmemory-policy".to_vec()),
            Value::BulkString(b"allkeys-lru".to_vec()),
        ]);
        assert_eq!(policy_in(config), Ok("allkeys-lru".to_owned()));
        let info = "# Memory\r\nused_memory:1\r\nmaxmemory_policy:volatile-ttl\r\n";
        assert_eq!(
            policy_in(Value::BulkString(info.as_bytes().to_vec())),
            Ok("volatile-ttl".to_owned())
        );
        assert!(policy_in(Value::Array(vec![])).is_err());
    }
}
