//! A handle that only inspects a queue (`Builder::read_only`): for dashboards and `twq`.
//!
//! An ordinary handle records the queue's partition count at connect (`HSETNX` on
//! `tw:{name}:config`), so connecting under a misspelt name leaves a key behind. This one
//! writes nothing: it reads the count, refuses a queue the server holds no key of
//! ([`Error::NoQueue`]), starts no claiming engine, and its [`Shared`] runs only the
//! scripts that read.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_wheel::Wheel;

use super::connection::{Connection, Link, classify};
use super::keys::{Keys, MAX_PARTITIONS, partition_tags};
use super::scripts::Scripts;
use super::shared::{Shared, redis_args};
use super::{Target, eviction};
use crate::Error;
use crate::protocol::{Request, Settings, attach};

/// Opens the read-only handle on an open connection (the eviction check already done).
pub(super) async fn start(
    target: Target,
    connection: &mut Connection,
    link: Link,
    name: &str,
    settings: Settings,
    wheel: &Wheel,
    policy_unknown: bool,
) -> Result<(mpsc::UnboundedSender<Request>, Arc<Shared>), Error> {
    let partitions = partitions(connection, name, target.partitions).await?;
    let shared = Arc::new(Shared {
        parts: partition_tags(name, partitions)
            .iter()
            .map(|tag| Keys::new(tag))
            .collect(),
        scripts: Scripts::load(),
        link,
        settings,
        replicas: 0,
        cluster: target.cluster,
        eviction: eviction::Guard::new(target.allow_evicting_server, policy_unknown),
        waiting: None,
        read_only: true,
        // Never used: writes are refused before they reach a batch.
        batchers: super::batch::Batchers::new(partitions, attach(wheel).runtime),
    });
    // The permission to read every partition (as an ordinary handle checks it at open).
    let reads = shared.parts.iter().map(|keys| {
        let shared = &shared;
        async move {
            let keys = keys.stats_keys();
            shared
                .invoke::<Vec<u64>>(&shared.scripts.stats, &keys, redis_args!["tw-stats"])
                .await
        }
    });
    futures::future::try_join_all(reads).await?;
    // No engine: a `close` is done at once, a stream ends at once (its sender is dropped),
    // and every other request is routed to the server by the handle itself.
    let (requests, mut inbox) = mpsc::unbounded_channel();
    attach(wheel).runtime.spawn(async move {
        while let Some(request) = inbox.recv().await {
            if let Request::Close(reply) = request {
                inbox.close();
                let _ = reply.send(Ok(()));
            }
        }
    });
    Ok((requests, shared))
}

/// The queue's partition count as recorded, or for a queue made before it was recorded,
/// `asked` if the keys of that layout exist; [`Error::NoQueue`] if none do. Reads only.
async fn partitions(connection: &mut Connection, name: &str, asked: usize) -> Result<usize, Error> {
    let config = format!("tw:{{{name}}}:config");
    let recorded: Option<usize> = redis::cmd("HGET")
        .arg(&config)
        .arg("partitions")
        .query_async(connection)
        .await
        .map_err(|e| classify(&e))?;
    if let Some(n) = recorded {
        if !(1..=MAX_PARTITIONS).contains(&n) {
            return Err(Error::Corrupt(format!(
                "queue {name:?} records {n} partitions"
            )));
        }
        return Ok(n);
    }
    for tag in partition_tags(name, asked) {
        let keys = Keys::new(&tag);
        // One partition's keys share a hash tag, so one EXISTS suits a cluster too.
        let found: usize = redis::cmd("EXISTS")
            .arg(&keys.meta)
            .arg(&keys.due)
            .arg(&keys.inflight)
            .arg(&keys.dead)
            .arg(&keys.stats)
            .arg(&keys.seq)
            .query_async(connection)
            .await
            .map_err(|e| classify(&e))?;
        if found > 0 {
            return Ok(asked);
        }
    }
    Err(Error::NoQueue(format!("{name:?}")))
}
