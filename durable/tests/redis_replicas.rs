//! What a write's return promises on Redis with replicas (`Builder::replicas(n)`, `WAIT`):
//! each test starts a master and a replica of it on loopback and freezes or kills the replica
//! (SIGSTOP, SIGKILL). A write with replicas returns once one has it, fails clearly when none
//! acknowledges in time, and never holds up other calls; without replicas nothing waits.
#![cfg(feature = "redis")]

mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use support::redis_server::{self, RedisServer};
use tokio_wheel::Wheel;
use tokio_wheel_durable::{DurableQueue, Error, Task};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// A plain connection to `url`, for looking behind the queue's back.
fn raw(url: &str) -> redis::Connection {
    redis::Client::open(url).unwrap().get_connection().unwrap()
}

/// A master and a replica of it, in sync.
fn master_and_replica() -> Option<(RedisServer, RedisServer)> {
    // No 5 s pause for more replicas before a diskless full sync.
    let master = redis_server::start_with(&["--repl-diskless-sync-delay", "0"])?;
    let replica = replica_of(&master)?;
    Some((master, replica))
}

/// A new replica of `master`, in sync.
fn replica_of(master: &RedisServer) -> Option<RedisServer> {
    let port = master.port().to_string();
    let replica = redis_server::start_with(&["--replicaof", "127.0.0.1", &port])?;
    let mut connection = raw(&replica.url());
    let start = Instant::now();
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut connection)
            .unwrap();
        if info.contains("master_link_status:up") {
            return Some(replica);
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the replica did not sync:\n{info}"
        );
        std::thread::sleep(ms(20));
    }
}

/// A server stopped with SIGSTOP: connected, but answering nothing, until thawed (or
/// dropped).
struct Frozen(u32);

impl Frozen {
    fn new(server: &RedisServer) -> Frozen {
        signal(server.pid(), libc::SIGSTOP);
        Frozen(server.pid())
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, libc::SIGCONT);
    }
}

fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) with the pid of a child this test started and still holds.
    let result = unsafe { libc::kill(pid as libc::pid_t, signal) };
    assert_eq!(result, 0, "kill({pid}, {signal})");
}

/// Whether the queue `name`'s record of task `id` is on this server.
fn has_task(server: &RedisServer, name: &str, id: &str) -> bool {
    redis::cmd("HEXISTS")
        .arg(format!("tw:{{{name}}}:meta"))
        .arg(id)
        .query(&mut raw(&server.url()))
        .unwrap()
}

/// `replicas(1)`: a schedule returns only once the replica has the task. With the replica
/// frozen the task is on the master, and the call still waits; thawed, the call returns and
/// the replica has it.
#[tokio::test]
async fn with_replicas_a_write_returns_only_once_a_replica_has_it() {
    let Some((master, replica)) = master_and_replica() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .replicas(1)
        .redis(&master.url(), "wait", &wheel)
        .await
        .unwrap();
    queue.schedule(Task::new("w").id("warm-up")).await.unwrap();
    assert!(has_task(&replica, "wait", "warm-up"));

    let frozen = Frozen::new(&replica);
    let scheduling = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.schedule(Task::new("r").id("replicated")).await })
    };
    tokio::time::sleep(ms(500)).await;
    assert!(has_task(&master, "wait", "replicated"), "on the master");
    assert!(
        !scheduling.is_finished(),
        "returned before the replica had it: {:?}",
        scheduling.await
    );
    drop(frozen);
    let start = Instant::now();
    let id = tokio::time::timeout(Duration::from_secs(5), scheduling)
        .await
        .expect("returns once the replica has it")
        .unwrap()
        .unwrap();
    assert_eq!(id.as_str(), "replicated");
    // Well before the 4 s window would have run out.
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert!(has_task(&replica, "wait", "replicated"), "on the replica");
}

/// `replicas(0)`, the default: a write returns once the master has it, replica frozen or not.
#[tokio::test]
async fn without_replicas_a_write_does_not_wait_for_them() {
    let Some((master, replica)) = master_and_replica() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .redis(&master.url(), "nowait", &wheel)
        .await
        .unwrap();
    queue.schedule(Task::new("w").id("warm-up")).await.unwrap();
    let frozen = Frozen::new(&replica);
    // Waiting for the replica would take the whole 4 s window.
    tokio::time::timeout(ms(2_500), queue.schedule(Task::new("m").id("master-only")))
        .await
        .expect("does not wait for the frozen replica")
        .unwrap();
    assert!(has_task(&master, "nowait", "master-only"));
    drop(frozen);
}

/// `replicas(1)` with the replica frozen for the whole wait window: the call fails
/// (unreachable: the write is on the master, but may be lost with it) once the window of
/// 4 s is out — not sooner, not never, and saying why (not "timed out").
#[tokio::test]
async fn with_replicas_a_write_no_replica_acknowledges_in_time_is_unreachable() {
    let Some((master, replica)) = master_and_replica() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .replicas(1)
        .redis(&master.url(), "lost", &wheel)
        .await
        .unwrap();
    queue.schedule(Task::new("w").id("warm-up")).await.unwrap();
    let frozen = Frozen::new(&replica);
    let start = Instant::now();
    let error = tokio::time::timeout(
        Duration::from_secs(10),
        queue.schedule(Task::new("u").id("unreplicated")),
    )
    .await
    .expect("gives up after the wait window")
    .expect_err("no replica had it");
    let took = start.elapsed();
    assert!(matches!(error, Error::Unreachable(_)), "{error:?}");
    assert!(
        format!("{error}").contains("0 of 1 replicas"),
        "says what is missing: {error}"
    );
    assert!(
        (Duration::from_secs(4)..Duration::from_secs(5)).contains(&took),
        "{took:?}"
    );
    assert!(has_task(&master, "lost", "unreplicated"), "on the master");
    drop(frozen);
}

/// Polls (without blocking the runtime) until the master has the task.
async fn until_on_master(master: &RedisServer, name: &str, id: &str) {
    let start = Instant::now();
    while !has_task(master, name, id) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{id} never reached the master"
        );
        tokio::time::sleep(ms(10)).await;
    }
}

/// `replicas(1)`: a write waits for its replica on a connection of its own, so while it
/// waits for a frozen replica the handle's other calls (`len`, `get`, another handle's
/// schedule without replicas) go on: they return before the waiting write does.
#[tokio::test]
async fn a_write_waiting_for_a_frozen_replica_does_not_hold_up_other_calls() {
    let Some((master, replica)) = master_and_replica() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .replicas(1)
        .redis(&master.url(), "waits", &wheel)
        .await
        .unwrap();
    queue.schedule(Task::new("w").id("warm-up")).await.unwrap();
    let frozen = Frozen::new(&replica);
    let waiting = tokio::spawn({
        let queue = queue.clone();
        async move { queue.schedule(Task::new("r").id("waiting")).await }
    });
    until_on_master(&master, "waits", "waiting").await;
    assert!(!waiting.is_finished(), "waits for the frozen replica");
    let len = queue.len().await.unwrap();
    let warm_up = queue.get(&"warm-up".into()).await.unwrap();
    assert!(
        !waiting.is_finished(),
        "the reads returned only after the waiting write"
    );
    assert_eq!(len, 2);
    assert!(warm_up.is_some());
    drop(frozen);
    waiting
        .await
        .unwrap()
        .expect("returns once the replica is thawed and has it");
}

/// Asking for more replicas than there are, or for one that was killed: every write fails
/// clearly ("0 of 1", "1 of 2"), after the wait window, with the write on the master; reads
/// meanwhile go on.
#[tokio::test]
async fn with_a_killed_or_missing_replica_writes_fail_clearly_and_reads_go_on() {
    let Some((master, mut replica)) = master_and_replica() else {
        return;
    };
    let wheel = Wheel::new();
    let two = DurableQueue::builder()
        .replicas(2)
        .redis(&master.url(), "missing", &wheel)
        .await
        .expect("connects: replicas are counted per write");
    let write = tokio::spawn({
        let two = two.clone();
        async move { two.schedule(Task::new("m").id("two")).await }
    });
    until_on_master(&master, "missing", "two").await;
    assert_eq!(two.len().await.unwrap(), 1);
    assert!(!write.is_finished(), "the read returned first");
    let error = write.await.unwrap().expect_err("only one replica");
    assert!(format!("{error}").contains("1 of 2 replicas"), "{error}");

    replica.stop();
    let one = DurableQueue::builder()
        .replicas(1)
        .redis(&master.url(), "killed", &wheel)
        .await
        .unwrap();
    let error = one
        .schedule(Task::new("k").id("killed"))
        .await
        .expect_err("the replica is gone");
    assert!(
        matches!(error, Error::Unreachable(_)) && format!("{error}").contains("0 of 1"),
        "{error}"
    );
    assert!(has_task(&master, "killed", "killed"), "on the master");
}

/// `replicas(1)` with the replica killed: an `ack` deletes the task on the master, no replica
/// confirms it in time, so it answers `Unreachable`. With a replica back, the same `ack` made
/// again is recognised by its delivery and answers `Ok` (issue 29: it answered `LeaseLost`,
/// which means "handed out again"), and so does any repeat of it; another finish of the
/// same delivery answers `LeaseLost` and changes nothing.
#[tokio::test]
async fn an_ack_made_again_after_unreachable_is_recognised_by_its_delivery() {
    let Some((master, mut replica)) = master_and_replica() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .replicas(1)
        .redis(&master.url(), "again", &wheel)
        .await
        .unwrap();
    queue.schedule(Task::new("a").id("once")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let delivery = tokio::time::timeout(Duration::from_secs(10), deliveries.next())
        .await
        .expect("delivered")
        .unwrap();
    replica.stop();
    let error = delivery.ack().await.expect_err("no replica confirms");
    assert!(matches!(error, Error::Unreachable(_)), "{error:?}");
    assert!(
        !has_task(&master, "again", "once"),
        "the ack ran on the master"
    );

    let _replica = replica_of(&master).expect("a replica again");
    delivery
        .ack()
        .await
        .expect("the same ack, made again, is recognised");
    delivery.ack().await.expect("and again");
    assert!(matches!(delivery.retry().await, Err(Error::LeaseLost)));
    assert_eq!(queue.len().await.unwrap(), 0);
}
