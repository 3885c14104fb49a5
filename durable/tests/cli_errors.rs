//! `twq`'s errors end to end, the real binary against a real redb file and a real
//! `redis-server` (and a Redis Cluster): a wrong password (denied, and no password ever shown,
//! `--help` included), an unreachable server, bad arguments, partitions that do not match the
//! queue, a misspelt queue name. The subcommands themselves are in `cli.rs`.
#![cfg(feature = "cli")]

mod support;

use std::time::Duration;

use serde_json::Value;
use support::redis_server::{self};
use tokio_wheel::Wheel;
use tokio_wheel_durable::{DurableQueue, Recurring, Task, TaskFilter};

use support::twq::*;

const PASSWORD: &str = "cli-Secret-9d3e71";
const WRONG: &str = "cli-Wrong-1c07aa";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_denied_and_no_password_is_ever_shown() {
    let Some(server) = redis_server::start_with(&["--requirepass", PASSWORD]) else {
        return;
    };
    let port = server.port();
    let right = format!("redis://:{PASSWORD}@127.0.0.1:{port}/");
    let wrong = format!("redis://:{WRONG}@127.0.0.1:{port}/");
    let mut runs = Vec::new();

    let run = twq(&["--redis", &wrong, "--queue", "q", "stats"]).await;
    let run = run.error("denied");
    assert!(
        run.stderr
            .contains(&format!("redis://:***@127.0.0.1:{port}/")),
        "{run:?}"
    );
    runs.push(run);

    // The right one works, and shows the URL masked.
    let run = twq(&[
        "--redis",
        &right,
        "--queue",
        "q",
        "schedule",
        "--payload",
        "p",
        "--id",
        "t",
    ])
    .await
    .ok();
    runs.push(run);
    let run = twq(&["--redis", &right, "--queue", "q", "stats"])
        .await
        .ok();
    assert!(
        run.stdout
            .lines()
            .any(|line| line == format!("queue          \"q\" on redis://:***@127.0.0.1:{port}/")),
        "{run:?}"
    );
    runs.push(run);
    let run = twq(&["--redis", &right, "--queue", "q", "--json", "stats"])
        .await
        .ok();
    assert_eq!(run.json()["pending"], 1);
    runs.push(run);
    // An ACL-style user name stays; its password does not.
    let run = twq(&[
        "--redis",
        &format!("redis://default:{WRONG}@127.0.0.1:{port}/"),
        "--queue",
        "q",
        "get",
        "t",
    ])
    .await
    .error("denied");
    assert!(run.stderr.contains("redis://default:***@"), "{run:?}");
    runs.push(run);

    // From the environment; `--help` never shows it.
    let env = vec![("TWQ_REDIS".to_owned(), right.clone())];
    let run = twq_with(
        ["--queue", "q", "get", "t"].map(String::from).to_vec(),
        None,
        env.clone(),
    )
    .await
    .ok();
    runs.push(run);
    for help in [
        &["--help"][..],
        &["-h"],
        &["get", "--help"],
        &["help", "list"],
    ] {
        let run = twq_with(
            help.iter().map(|a| (*a).to_owned()).collect(),
            None,
            env.clone(),
        )
        .await
        .ok();
        assert!(run.stdout.contains("Usage: twq"), "{run:?}");
        runs.push(run);
    }

    // Argument errors that carry the URL.
    let bad: [&[&str]; 4] = [
        &["--redis", &right, "--queue", "q", "list", "bogus"],
        &["--redis", &right, "--file", "x.redb", "stats"],
        &["--redis", &right, "stats"],
        &[
            "--redis",
            &right,
            "--queue",
            "q",
            "schedule",
            "--payload",
            "x",
            "--after",
            &right,
        ],
    ];
    for args in bad {
        let run = twq(args).await;
        assert_eq!(run.code, 2, "{run:?}");
        assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
        runs.push(run);
    }

    // A password with characters escaped in the URL.
    let run = twq(&[
        "--redis",
        &format!("redis://:{WRONG}%21@127.0.0.1:{port}/"),
        "--queue",
        "q",
        "stats",
    ])
    .await
    .error("denied");
    runs.push(run);

    for run in &runs {
        for secret in [PASSWORD, WRONG] {
            assert!(!run.shows(secret), "{secret} shown: {run:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_an_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{port}/");
    let run = twq(&["--redis", &url, "--queue", "q", "--timeout", "1s", "stats"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
    assert!(
        run.stderr.contains("no answer within 1s") || run.stderr.contains("cannot be reached"),
        "{run:?}"
    );
    assert!(
        run.stderr
            .contains(&format!("redis://:***@127.0.0.1:{port}/")),
        "{run:?}"
    );
    assert!(!run.shows(PASSWORD), "{run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_exit_2_with_one_line() {
    let backend = Backend::file();
    backend.twq(&["schedule", "--payload", "x"]).await.ok();
    let cases: [(&[&str], &str); 9] = [
        (
            &["schedule", "--payload", "x", "--after", "5x"],
            "unknown unit",
        ),
        (
            &["schedule", "--payload", "x", "--at", "tomorrow"],
            "rfc 3339",
        ),
        (
            &[
                "schedule",
                "--payload",
                "x",
                "--after",
                "1m",
                "--at",
                "2030-01-01T00:00:00Z",
            ],
            "cannot be used with",
        ),
        (&["schedule"], "required"),
        (&["reschedule", "x"], "required"),
        (&["list", "everything"], "invalid value"),
        (&["list", "pending", "--limit", "0"], "invalid value"),
        (&["purge-dead"], "--older-than"),
        (
            &["schedule", "--payload-file", "/nonexistent/payload"],
            "/nonexistent/payload",
        ),
    ];
    for (args, needle) in cases {
        backend.twq(args).await.error(needle);
    }
    // No queue named at all.
    twq(&["stats"]).await.error("required");
    // No subcommand.
    twq(&["--file", "x.redb"])
        .await
        .error("requires a subcommand");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_must_match_the_queue() {
    let Some(server) = redis_server::start() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .partitions(4)
        .redis(&server.url(), "parts", &wheel)
        .await
        .unwrap();
    for i in 0..8 {
        queue
            .schedule(
                Task::new(vec![b'x'; i])
                    .id(format!("p{i}"))
                    .after(Duration::from_secs(60 + i as u64)),
            )
            .await
            .unwrap();
    }
    let url = server.url();
    let run = twq(&[
        "--redis",
        &url,
        "--queue",
        "parts",
        "--partitions",
        "4",
        "--json",
        "stats",
    ])
    .await
    .ok();
    assert_eq!(run.json()["pending"], 8);
    let run = twq(&[
        "--redis",
        &url,
        "--queue",
        "parts",
        "--partitions",
        "4",
        "--json",
        "get",
        "p5",
    ])
    .await
    .ok();
    assert_same(
        &run.json(),
        &queue.get(&"p5".into()).await.unwrap().unwrap(),
    );
    // Commands that only look read the queue's own count (and write nothing)…
    let run = twq(&["--redis", &url, "--queue", "parts", "--json", "stats"])
        .await
        .ok();
    assert_eq!(run.json()["pending"], 8);
    // … a command that writes must agree with it.
    twq(&["--redis", &url, "--queue", "parts", "cancel", "p5"])
        .await
        .error("partition");
    queue.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_on_redis_cluster() {
    let Some(cluster) = support::redis_cluster::start() else {
        return;
    };
    let backend = Backend {
        store: Store::Cluster {
            urls: cluster.urls()[..2].to_vec(),
            _cluster: cluster,
            partitions: 3,
        },
        wheel: Wheel::new(),
    };
    for i in 0..6 {
        let id = format!("k{i}");
        let after = format!("{}m", 10 + i);
        backend
            .twq(&["schedule", "--payload", &id, "--id", &id, "--after", &after])
            .await
            .ok();
    }
    let all = backend.list(TaskFilter::Pending).await;
    assert_eq!(all.len(), 6);
    let json = backend.twq(&["--json", "stats"]).await.ok().json();
    assert_eq!(json["pending"], 6);
    let page = backend
        .twq(&["--json", "list", "pending", "--limit", "1000"])
        .await
        .ok()
        .json();
    let mut listed: Vec<String> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    assert_eq!(listed, ["k0", "k1", "k2", "k3", "k4", "k5"]);
    let k3 = backend.get("k3").await.unwrap();
    assert_same(
        &backend.twq(&["--json", "get", "k3"]).await.ok().json(),
        &k3,
    );
    backend.twq(&["cancel", "k3"]).await.ok();
    assert_eq!(backend.get("k3").await, None);
    // Recurring schedules of every partition, read-only through the cluster.
    let queue = backend.open().await;
    for id in ["r1", "r2", "r3", "r4"] {
        queue
            .schedule_recurring(Recurring::every(Duration::from_secs(600)).id(id))
            .await
            .unwrap();
    }
    queue.close().await;
    let json = backend
        .twq(&["--json", "recurring", "list"])
        .await
        .ok()
        .json();
    let mut ids: Vec<&str> = json["recurring"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["r1", "r2", "r3", "r4"]);
    assert_eq!(json["next_cursor"], Value::Null);
    let Store::Cluster { urls, .. } = &backend.store else {
        unreachable!()
    };
    twq(&["--cluster", &urls.join(","), "--queue", "nope", "stats"])
        .await
        .not_found("no queue \"nope\" on this server");
    backend.twq(&["get", "k3"]).await.not_found("no task k3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelt_queue_name_says_so_and_writes_nothing() {
    let Some(backend) = Backend::redis() else {
        return;
    };
    let Store::Redis { url, .. } = &backend.store else {
        unreachable!()
    };
    backend
        .twq(&["schedule", "--payload", "x", "--id", "a", "--after", "1h"])
        .await
        .ok();
    let before = support::redis_server::snapshot(url);
    let commands: [&[&str]; 4] = [
        &["stats"],
        &["list", "pending"],
        &["get", "a"],
        &["recurring", "list"],
    ];
    for command in commands {
        let mut args = vec!["--redis", url.as_str(), "--queue", "opz"];
        args.extend_from_slice(command);
        twq(&args)
            .await
            .not_found("no queue \"opz\" on this server");
        args.insert(4, "--json");
        let run = twq(&args).await;
        assert_eq!(run.code, 1, "{run:?}");
        assert_eq!(run.json()["found"], false);
        // The right name still reads (and writes nothing either).
        let mut args = vec!["--redis", url.as_str(), "--queue", QUEUE];
        args.extend_from_slice(command);
        twq(&args).await.ok();
    }
    assert_eq!(
        support::redis_server::snapshot(url),
        before,
        "a read-only command wrote"
    );
}
