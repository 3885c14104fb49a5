//! A Redis server that evicts keys would delete a queue's tasks (they have no TTL) without an
//! error: found from outside, 200 of 200 pending tasks vanished on an `allkeys-lru` server.
//! Each test starts its own `redis-server` with the `maxmemory-policy` under test: an
//! evicting server is refused at connect, naming its policy and the fix; `noeviction` and
//! `volatile-*` are accepted; a server that hides `CONFIG` is judged by `INFO`; a policy
//! switched under a running queue fails its calls until it is switched back; and the opt-out
//! connects anyway. (The cluster case is in `redis_cluster.rs`.)
#![cfg(feature = "redis")]

mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;

use support::redis_server::{self, RedisServer};
use tokio_wheel::Wheel;
use tokio_wheel_durable::{DurableQueue, Error, Task};

fn raw(server: &RedisServer) -> redis::Connection {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

fn set_policy(server: &RedisServer, policy: &str) {
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg(policy)
        .query(&mut raw(server))
        .unwrap();
}

fn key_count(server: &RedisServer) -> usize {
    redis::cmd("DBSIZE").query(&mut raw(server)).unwrap()
}

async fn refusal(url: &str, wheel: &Wheel) -> String {
    match DurableQueue::builder().redis(url, "evict", wheel).await {
        Err(Error::Invalid(why)) => why,
        Err(other) => panic!("refused, but not as Invalid: {other:?}"),
        Ok(_) => panic!("an evicting server was accepted"),
    }
}

#[tokio::test]
async fn an_allkeys_lru_server_is_refused_at_connect_naming_the_policy_and_the_fix() {
    let Some(server) = redis_server::start_with(&["--maxmemory-policy", "allkeys-lru"]) else {
        return;
    };
    let wheel = Wheel::new();
    let why = refusal(&server.url(), &wheel).await;
    for words in ["allkeys-lru", "noeviction", "allow_evicting_server(true)"] {
        assert!(why.contains(words), "names {words:?}: {why}");
    }
    assert_eq!(key_count(&server), 0, "refused before writing anything");
}

#[tokio::test]
async fn every_allkeys_policy_is_refused_and_noeviction_and_volatile_ones_accepted() {
    let Some(server) = redis_server::start() else {
        return;
    };
    let wheel = Wheel::new();
    for policy in ["allkeys-lfu", "allkeys-random"] {
        set_policy(&server, policy);
        let why = refusal(&server.url(), &wheel).await;
        assert!(why.contains(policy), "{why}");
    }
    for policy in ["noeviction", "volatile-lru", "volatile-ttl"] {
        set_policy(&server, policy);
        let queue = DurableQueue::builder()
            .redis(&server.url(), "evict", &wheel)
            .await
            .unwrap_or_else(|e| panic!("{policy} refused: {e}"));
        queue.schedule(Task::new("x").id("kept")).await.unwrap();
        assert_eq!(queue.len().await.unwrap(), 1);
        queue.cancel(&"kept".into()).await.unwrap();
        queue.close().await;
    }
}

/// A managed server that renames `CONFIG` still tells its policy through `INFO memory`.
#[tokio::test]
async fn a_server_that_hides_config_is_judged_by_info() {
    let Some(server) = redis_server::start_with(&[
        "--maxmemory-policy",
        "allkeys-lru",
        "--rename-command",
        "CONFIG",
        "",
    ]) else {
        return;
    };
    let wheel = Wheel::new();
    let why = refusal(&server.url(), &wheel).await;
    assert!(why.contains("allkeys-lru"), "{why}");
}

/// A least-privilege ACL user (the one issue 29 names: read, write, scripting, pub/sub,
/// transactions and TIME, nothing dangerous — so neither `CONFIG` nor `INFO`) opens the
/// queue: the policy is unknown, which the queue says in `QueueStats` instead of refusing.
#[tokio::test]
async fn a_least_privilege_user_opens_the_queue_with_the_policy_unknown() {
    let Some(server) = redis_server::start() else {
        return;
    };
    let () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "worker",
                "reset",
                "on",
                ">worker-pw",
                "~tw:*",
                "&tw:*",
            ][..],
        )
        .arg(
            &[
                "+@read",
                "+@write",
                "+@scripting",
                "+@pubsub",
                "+@transaction",
            ][..],
        )
        .arg(&["+time", "-@dangerous"][..])
        .query(&mut raw(&server))
        .unwrap();
    let url = format!("redis://worker:worker-pw@127.0.0.1:{}/", server.port());
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .redis(&url, "evict", &wheel)
        .await
        .expect("a least-privilege user opens the queue");
    queue.schedule(Task::new("x").id("lp")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let delivery = tokio::time::timeout(Duration::from_secs(10), deliveries.next())
        .await
        .expect("delivered")
        .unwrap();
    assert_eq!(delivery.payload(), b"x");
    delivery.ack().await.unwrap();
    assert!(queue.stats().await.unwrap().eviction_policy_unknown);

    // The same server through a user that may read the policy: known.
    let known = DurableQueue::builder()
        .redis(&server.url(), "evict", &wheel)
        .await
        .unwrap();
    assert!(!known.stats().await.unwrap().eviction_policy_unknown);
}

#[tokio::test]
async fn the_opt_out_connects_to_an_evicting_server_and_never_refuses_its_calls() {
    let Some(server) = redis_server::start_with(&["--maxmemory-policy", "allkeys-lru"]) else {
        return;
    };
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .allow_evicting_server(true)
        .redis(&server.url(), "evict", &wheel)
        .await
        .expect("the opt-out connects");
    // Misused on a server that is fine, it changes nothing either.
    set_policy(&server, "allkeys-random");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(7) {
        queue.schedule(Task::new("x")).await.expect("never refused");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `CONFIG SET maxmemory-policy allkeys-lru` under a running queue: within one recheck
/// period (5 s) every call fails with the refusal — a producer learns its tasks are not
/// safe instead of losing them — and once the policy is back, calls work again.
#[tokio::test]
async fn a_policy_switched_under_a_running_queue_fails_calls_until_it_is_switched_back() {
    let Some(server) = redis_server::start() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .redis(&server.url(), "evict", &wheel)
        .await
        .unwrap();
    queue.schedule(Task::new("x").id("before")).await.unwrap();
    set_policy(&server, "allkeys-lru");
    let switched = Instant::now();
    let why = loop {
        match queue.schedule(Task::new("x")).await {
            Ok(_) => {}
            Err(Error::Invalid(why)) => break why,
            Err(other) => panic!("refused, but not as Invalid: {other:?}"),
        }
        assert!(
            switched.elapsed() < Duration::from_secs(8),
            "still accepted 8 s after the switch"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(why.contains("allkeys-lru"), "{why}");
    assert!(
        matches!(queue.len().await, Err(Error::Invalid(_))),
        "reads fail too"
    );
    assert!(matches!(
        queue.get(&"before".into()).await,
        Err(Error::Invalid(_))
    ));
    set_policy(&server, "noeviction");
    let restored = Instant::now();
    loop {
        match queue.len().await {
            Ok(n) => {
                assert!(n >= 1, "the task scheduled before is there");
                break;
            }
            Err(Error::Invalid(_)) => {}
            Err(other) => panic!("{other:?}"),
        }
        assert!(
            restored.elapsed() < Duration::from_secs(8),
            "still refused 8 s after the policy was restored"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(queue.get(&"before".into()).await.unwrap().is_some());
}

/// After a reconnect the server may be another one: the next call checks before it runs,
/// without waiting for the recheck period (5 s since the last check, made at open).
#[tokio::test]
async fn after_a_reconnect_the_policy_is_checked_again_at_once() {
    let Some(mut server) = redis_server::start() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .redis(&server.url(), "evict", &wheel)
        .await
        .unwrap();
    let opened = Instant::now();
    queue.schedule(Task::new("x").id("before")).await.unwrap();
    // The same port and data, restarted as a cache: the queue reconnects to it.
    server.set_extra(&["--maxmemory-policy", "allkeys-lru"]);
    server.restart();
    let why = loop {
        match queue.len().await {
            Err(Error::Invalid(why)) => break why,
            Ok(_) | Err(Error::Unreachable(_)) => {}
            Err(other) => panic!("{other:?}"),
        }
        assert!(
            opened.elapsed() < Duration::from_secs(10),
            "the restarted server was never refused"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(why.contains("allkeys-lru"), "{why}");
    assert!(
        opened.elapsed() < Duration::from_secs(5),
        "refused at the reconnect, not by the periodic recheck: {:?} after open",
        opened.elapsed()
    );
}
