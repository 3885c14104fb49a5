//! The durable queue shared across processes through Redis (feature `redis`).
//!
//! # Data layout
//!
//! Every key of a queue named `orders` carries the hash tag `{orders}`, so the whole queue
//! lives in one Redis Cluster slot and every script is atomic. With
//! [`partitions(n)`](crate::Builder::partitions) the queue is `n` such key sets, each with its
//! own tag `{orders~p~k}` chosen so the partitions spread evenly over the cluster's slots (and
//! so its masters); a task lives in the partition its id hashes to (FNV-1a), and a worker
//! claims from every partition in turn. `tw:{orders}:config` records the partition count,
//! which every process of the queue must share.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `tw:{orders}:payload` | hash | id → payload |
//! | `tw:{orders}:meta` | hash | id → `state|due|seq|attempts|token|call|reason` (`call` names the schedule call that made it, so that call retried after a lost reply is recognised; a recurring schedule's `reason` is its definition) |
//! | `tw:{orders}:due` | sorted set | pending tasks and recurring schedules, score = due (ms), member = zero-padded seq + id, so ties go in schedule order |
//! | `tw:{orders}:inflight` | sorted set | in-flight ids, score = lease end (ms) |
//! | `tw:{orders}:dead` | sorted set | dead ids, score = time of death (ms) |
//! | `tw:{orders}:seq`, `tw:{orders}:token` | counters | schedule order, delivery tokens |
//! | `tw:{orders}:stats` | hash | the counters of [`QueueStats`](crate::QueueStats) |
//! | `tw:{orders}:lateness` | list | lateness (ms) of recent deliveries (trimmed to 1000 once past 1100; stats reads the last 1000) |
//! | `tw:{orders}:call:<invocation>` | string, expires after one lease (at least 15 s: the client's retry span) | the reply of one schedule or finish invocation (a batch of calls), so that invocation, retried after a lost reply, is answered again without acting twice |
//! | `tw:{orders}:claim:<claimer>` | string, expires after one lease | the call number and `id, token, …` of the worker's last claim call that handed something out, so a claim whose reply was lost is answered again |
//!
//! # One clock
//!
//! Every script reads the server's `TIME`: due times, lease ends and reply windows are judged
//! by it alone. `Task::after` sends the delay, not an instant. A worker keeps an estimate of
//! the server clock's offset from its own (from the `TIME` its claims return) only to arm its
//! wheel; when it wakes it asks the server, which decides what is due.
//!
//! # Claims
//!
//! A claim is one script (`scripts/claim.lua`): it moves at most
//! [`EXPIRE_BATCH`](engine::EXPIRE_BATCH) expired leases back to pending (or to the dead
//! letters), then moves at most [`CLAIM_BATCH`](engine::CLAIM_BATCH) due tasks to in-flight
//! and returns them *with their payloads*, plus the server's time, the next due time and next
//! lease end. A task is handed out only from that one atomic reply; a claim whose reply is
//! lost is retried with the same claim id and answered again from its record.
//!
//! A claimed task first waits in its stream's prefetch buffer under a lease the engine renews
//! (one script per lease/3 for all buffered claims); when the stream yields it, its lease is
//! set to a full lease from then. Dropping a stream returns what it buffered.
//!
//! # Wake-ups
//!
//! A script that makes a task pending publishes its due time on `tw:{orders}:wake` only when
//! it is earlier than every pending task — i.e. earlier than anything a worker knows of. Idle
//! workers re-arm their wheel to it (no call) and claim only when it is due. No worker polls.
//!
//! # Where things are
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | opening a queue: [`start`] checks the partitions and permissions, starts the engine and the wake listener |
//! | `connection.rs` | clients, TLS roots, connecting to a server or a cluster, error classification, retries |
//! | `eviction.rs` | refusing a server whose `maxmemory-policy` evicts keys, at connect and while running |
//! | `keys.rs` | the keys of a partition, hash slots, partition tags, which partition a task is in |
//! | `scripts.rs`, `scripts/*.lua` | the Lua scripts, one per file, each opening with its KEYS, ARGV, reply and invariant |
//! | `shared.rs` | [`Shared`]: a queue's connection, partitions and scripts, and running a script (retries, replicas) |
//! | `replicas.rs` | writes that wait for replicas: the script and its `WAIT` as one pipeline on a connection of their own |
//! | `calls.rs` | schedule, change, recurring schedules, and a delivery's finish, extend and release |
//! | `inspect.rs` | get, list, dead letters, stats, purge, payloads, recurring schedules |
//! | `read_only.rs` | a handle that only inspects (`Builder::read_only`): the queue must exist, nothing is written |
//! | `engine.rs` | the claiming loop: claim rounds, prefetch buffers and their leases, renewals, retention |
//! | `wake.rs` | the wake channel listener |

mod batch;
mod calls;
mod connection;
mod engine;
mod eviction;
mod inspect;
mod keys;
mod read_only;
mod replicas;
mod scripts;
mod shared;
mod wake;

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_wheel::Wheel;

pub(crate) use self::batch::Kept;
pub(crate) use self::connection::Target;
use self::connection::{Link, classify, client, with_retries};
use self::engine::RedisEngine;
use self::keys::{Keys, MAX_PARTITIONS, partition_tags};
use self::scripts::Scripts;
pub(crate) use self::shared::Shared;
use self::shared::redis_args;
use self::wake::listen;
use crate::protocol::{Request, Settings, attach};
use crate::{Error, TaskId};

/// Connects (failing with [`Error::Unreachable`] if it cannot, [`Error::Denied`] at once if
/// the server refuses the credentials or the client its certificate), refuses a server that
/// evicts keys, checks the queue's partition count, and starts the engine.
pub(crate) async fn start(
    target: Target,
    name: &str,
    settings: Settings,
    wheel: &Wheel,
) -> Result<(mpsc::UnboundedSender<Request>, Arc<Shared>), Error> {
    if target.urls.is_empty() {
        return Err(Error::Invalid("no Redis URL given".into()));
    }
    if !(1..=MAX_PARTITIONS).contains(&target.partitions) {
        return Err(Error::Invalid(format!(
            "partitions must be between 1 and {MAX_PARTITIONS} (got {})",
            target.partitions
        )));
    }
    let link = Link::open(&target).await?;
    let mut connection = link.get();
    let ping: Result<(), _> = redis::cmd("PING").query_async(&mut connection).await;
    if let Err(error) = ping {
        // A user whose ACL leaves out `@connection` may not PING; its refusal still proves
        // the server reached and the user authenticated.
        if !error.to_string().to_lowercase().contains("noperm") {
            return Err(classify(&error));
        }
    }
    // Before anything is written: a server that evicts keys would lose tasks silently.
    let verdict = eviction::check(&connection, target.cluster).await?;
    let policy_unknown = matches!(verdict, eviction::Verdict::Unknown(_));
    match verdict {
        eviction::Verdict::Safe => {}
        eviction::Verdict::Unknown(note) => tracing::warn!(
            %note,
            "opening the queue with the server's maxmemory-policy unknown"
        ),
        eviction::Verdict::Volatile(note) => tracing::warn!(
            %note,
            "volatile-* evicts only keys with a TTL: never a task, but under memory pressure \
             the kept replies that recognise a call retried after a lost reply"
        ),
        eviction::Verdict::Refused(why) if target.allow_evicting_server => {
            tracing::warn!(%why, "connecting anyway: allow_evicting_server(true)");
        }
        eviction::Verdict::Refused(why) => return Err(Error::Invalid(why)),
    }
    // Every process of a queue must agree on its partitions, or tasks would be lost in
    // partitions nobody claims from.
    let config = format!("tw:{{{name}}}:config");
    if target.read_only {
        return read_only::start(
            target,
            &mut connection,
            link,
            name,
            settings,
            wheel,
            policy_unknown,
        )
        .await;
    }
    let (_, agreed): (bool, usize) = redis::pipe()
        .hset_nx(&config, "partitions", target.partitions)
        .hget(&config, "partitions")
        .query_async(&mut connection)
        .await
        .map_err(|e| classify(&e))?;
    if agreed != target.partitions {
        return Err(Error::Invalid(format!(
            "queue {name:?} has {agreed} partitions; this handle asked for {}",
            target.partitions
        )));
    }
    let shared = Arc::new(Shared {
        parts: partition_tags(name, target.partitions)
            .iter()
            .map(|tag| Keys::new(tag))
            .collect(),
        scripts: Scripts::load(),
        batchers: batch::Batchers::new(target.partitions, attach(wheel).runtime),
        link,
        settings,
        replicas: target.replicas,
        cluster: target.cluster,
        eviction: eviction::Guard::new(target.allow_evicting_server, policy_unknown),
        waiting: match target.replicas {
            0 => None,
            _ => Some(replicas::Waiting::new(&target)?),
        },
        read_only: false,
    });
    let (wake_sender, wakes) = mpsc::unbounded_channel();
    let attachment = attach(wheel);
    let claimer = TaskId::generate().0;
    let own_channel = format!("tw:{{{name}}}:wake:{claimer}");
    let mut clients = Vec::new();
    for url in &target.urls {
        clients.push(client(url, target.tls_roots.as_deref())?);
    }
    let channels: Vec<String> = shared.parts.iter().map(|k| k.channel.clone()).collect();
    let idle: Vec<String> = shared.parts.iter().map(|k| k.idle.clone()).collect();
    check_permissions(&shared, &channels, &own_channel).await?;
    let listener = attachment.runtime.spawn(listen(
        clients,
        channels,
        idle,
        own_channel.clone(),
        wake_sender,
    ));
    let (engine, requests) = RedisEngine::new(
        shared.clone(),
        wheel,
        attachment.shutdown,
        wakes,
        claimer,
        own_channel,
    );
    attachment.runtime.spawn(async move {
        engine.run().await;
        listener.abort();
    });
    Ok((requests, shared))
}

/// A user the server lets connect may still lack a permission the queue needs: finds out
/// at open ([`Error::Denied`] with the server's NOPERM), not at some later call — or never,
/// for a worker that may not subscribe and so waits for wake-ups forever. A read-only script
/// on every partition checks scripts and keys; an empty message on every wake channel checks
/// channels (PUBLISH needs the same permission as SUBSCRIBE, whose refusal the redis crate
/// does not report; listeners ignore empty messages, and this worker's own channel has no
/// listener yet). `TIME`, which every writing script calls for the server's clock, is asked
/// once on its own: the read-only script does not call it.
async fn check_permissions(shared: &Shared, channels: &[String], own: &str) -> Result<(), Error> {
    // Every partition: an ACL that admits partition 0's keys only would otherwise pass here
    // and fail later, on the tasks that hash elsewhere.
    let reads = shared.parts.iter().map(|keys| async move {
        let keys = keys.stats_keys();
        let args = redis_args!["tw-stats"];
        shared
            .invoke::<Vec<u64>>(&shared.scripts.stats, &keys, args)
            .await
    });
    futures::future::try_join_all(reads).await?;
    // One command per channel (a cluster pipeline wants a single slot), sent together.
    let probes = channels
        .iter()
        .map(String::as_str)
        .chain([own])
        .map(|channel| {
            with_retries(&shared.link, move |mut connection| {
                let mut probe = redis::cmd("PUBLISH");
                probe.arg(channel).arg("");
                async move { probe.query_async::<()>(&mut connection).await }
            })
        });
    futures::future::try_join_all(probes).await?;
    with_retries(&shared.link, |mut connection| async move {
        redis::cmd("TIME")
            .query_async::<(u64, u64)>(&mut connection)
            .await
    })
    .await?;
    Ok(())
}
