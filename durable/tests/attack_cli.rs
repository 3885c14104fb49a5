//! Attacks on the `twq` command line, from the outside (written against API.md, the README
//! and `--help`, not the implementation): exit codes, `--json` on every subcommand, secrets
//! never printed, read-only commands writing nothing to Redis, a locked file, odd ids.
#![cfg(feature = "cli")]

mod support;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use serde_json::Value;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{DurableQueue, Recurring, Task};

use support::redis_server;

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not one JSON document ({e}): {self:?}"))
    }
    fn shows(&self, secret: &str) -> bool {
        self.stdout.contains(secret) || self.stderr.contains(secret)
    }
    /// Exit 2 with one line on standard error.
    fn error(self) -> Run {
        assert_eq!(self.code, 2, "{self:?}");
        assert_eq!(self.stderr.trim_end().lines().count(), 1, "{self:?}");
        self
    }
}

async fn twq_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_twq"));
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for name in ["TWQ_REDIS", "TWQ_CLUSTER", "TWQ_QUEUE", "TWQ_FILE"] {
        command.env_remove(name);
    }
    command.envs(env.iter().copied());
    let out = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("twq hung")
        .unwrap();
    Run {
        code: out.status.code().expect("twq exited by a signal"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn twq(args: &[&str]) -> Run {
    twq_env(args, &[]).await
}

fn with_file<'a>(file: &'a str, json: bool, rest: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--file", file];
    if json {
        v.push("--json");
    }
    v.extend_from_slice(rest);
    v
}

/// A store with a pending task, a dead letter and a recurring schedule, closed.
async fn seed(path: &Path) {
    let wheel = Wheel::new();
    let queue = DurableQueue::open(path, &wheel).await.unwrap();
    queue
        .schedule(
            Task::new(b"{\"x\":1}".to_vec())
                .id("p1")
                .after(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    queue
        .schedule(Task::new(vec![0xff, 0x00, 0x1b]).id("bin"))
        .await
        .unwrap();
    queue
        .schedule_recurring(Recurring::every(Duration::from_secs(3600)).id("hourly"))
        .await
        .unwrap();
    let mut stream = queue.deliveries();
    let d = stream.next().await.unwrap();
    assert_eq!(d.id().as_str(), "bin");
    d.fail("HTTP 503").await.unwrap();
    drop(stream);
    queue.close().await;
}

#[tokio::test]
async fn every_subcommand_prints_json_and_exits_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.redb");
    seed(&path).await;
    let f = path.to_str().unwrap();
    for args in [
        &["stats"][..],
        &["list", "pending"],
        &["list", "in-flight"],
        &["list", "dead"],
        &["list", "pending", "--limit", "1"],
        &["get", "p1"],
        &["get", "bin", "--payload"],
        &["recurring", "list"],
        &[
            "schedule",
            "--payload",
            "hi",
            "--id",
            "s1",
            "--after",
            "10m",
        ],
        &["reschedule", "s1", "--after", "1h30m"],
        &["cancel", "s1"],
        &["redrive", "bin"],
        &["purge-dead", "--older-than", "0s"],
        &["recurring", "cancel", "hourly"],
    ] {
        let run = twq(&with_file(f, true, args)).await;
        assert_eq!(run.code, 0, "{args:?}: {run:?}");
        run.json();
    }
    // The binary payload comes back exact through base64.
    let run = twq(&with_file(f, true, &["get", "bin", "--payload"])).await;
    assert_eq!(run.json()["payload"]["base64"], "/wAb");
    assert_eq!(run.json()["payload"]["text"], Value::Null);
    // Paging through the command line: the cursor it prints takes us on.
    let run = twq(&with_file(f, true, &["list", "pending", "--limit", "1"])).await;
    let cursor = run.json()["next_cursor"].as_str().unwrap().to_owned();
    let run = twq(&with_file(
        f,
        true,
        &["list", "pending", "--limit", "1", "--cursor", &cursor],
    ))
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    // Exit 1: not there, or the wrong state; with --json a document with found/state.
    for args in [
        &["get", "nope"][..],
        &["cancel", "nope"],
        &["redrive", "p1"],
        &["get", "x@123"],
    ] {
        let run = twq(&with_file(f, true, args)).await;
        assert_eq!(run.code, 1, "{args:?}: {run:?}");
        assert!(run.json().get("found").is_some(), "{args:?}: {run:?}");
    }
    // Exit 2: bad arguments, one line on standard error.
    for args in [
        &["list", "bogus"][..],
        &["list", "pending", "--cursor", "zzz"],
        &["list", "dead", "--cursor", &cursor],
        &["schedule", "--payload", "x", "--after", "10 parsecs"],
        &["schedule", "--payload", "x", "--id", "occ@123"],
        &["reschedule", "p1", "--at", "yesterday"],
        &["frobnicate"],
    ] {
        twq(&with_file(f, false, args)).await.error();
    }
    assert!(twq(&with_file(f, true, &["get", "occ@123"])).await.code == 1);
}

#[tokio::test]
async fn a_missing_file_is_created_only_by_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("typo.redb");
    let f = path.to_str().unwrap();
    for args in [
        &["stats"][..],
        &["list", "pending"],
        &["get", "a"],
        &["cancel", "a"],
        &["recurring", "list"],
    ] {
        let run = twq(&with_file(f, false, args)).await;
        assert_ne!(run.code, 0, "{args:?}: {run:?}");
        assert!(!path.exists(), "{args:?} created the file");
    }
    let run = twq(&with_file(f, false, &["schedule", "--payload", "x"])).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(path.exists());
}

#[tokio::test]
async fn a_file_held_by_a_running_app_is_locked_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("held.redb");
    let wheel = Wheel::new();
    let queue = DurableQueue::open(&path, &wheel).await.unwrap();
    queue
        .schedule(Task::new(b"x".to_vec()).id("a"))
        .await
        .unwrap();
    let f = path.to_str().unwrap();
    for args in [
        &["stats"][..],
        &["list", "pending"],
        &["schedule", "--payload", "y", "--id", "b"],
        &["cancel", "a"],
    ] {
        let run = twq(&with_file(f, false, args)).await.error();
        assert!(run.stderr.contains("locked"), "{run:?}");
    }
    assert_eq!(queue.len().await.unwrap(), 1);
    assert!(queue.get(&"a".into()).await.unwrap().is_some());
}

#[tokio::test]
async fn odd_ids_round_trip_and_cannot_forge_output_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.redb");
    let f = path.to_str().unwrap();
    for id in ["café ☕ 注文", "tab\there", "-leading-dash", " "] {
        // `--id=` and `--` so that an id starting with `-` is not taken for an option.
        let flag = format!("--id={id}");
        let run = twq(&with_file(
            f,
            true,
            &["schedule", "--payload", "x", &flag, "--after", "1h"],
        ))
        .await;
        assert_eq!(run.code, 0, "{id:?}: {run:?}");
        assert_eq!(run.json()["id"], id, "{run:?}");
        let run = twq(&with_file(f, true, &["get", "--", id])).await;
        assert_eq!(run.code, 0, "{id:?}: {run:?}");
        assert_eq!(run.json()["id"], id);
    }
    // An empty id: refused or stored, but never a crash.
    let run = twq(&with_file(
        f,
        true,
        &["schedule", "--payload", "x", "--id", ""],
    ))
    .await;
    assert!(run.code == 0 || run.code == 2, "{run:?}");
}

#[tokio::test]
async fn control_characters_in_ids_are_escaped_in_tables() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ctl.redb");
    let f = path.to_str().unwrap();
    let forged = "a\nwebhook-9  dead   2026-11-25T20:56:02Z  now  1  41 B  forged\x1b[2J";
    let run = twq(&with_file(
        f,
        false,
        &[
            "schedule",
            "--payload",
            "x",
            "--id",
            forged,
            "--after",
            "1h",
        ],
    ))
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    for args in [&["list", "pending"][..], &["get", forged]] {
        let run = twq(&with_file(f, false, args)).await;
        assert!(!run.stdout.contains('\x1b'), "{args:?}: {:?}", run.stdout);
        assert!(
            !run.stdout.contains("\nwebhook-9"),
            "{args:?}: {:?}",
            run.stdout
        );
    }
    let run = twq(&with_file(f, true, &["get", forged])).await;
    assert_eq!(run.json()["id"], forged);
}

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

fn dirty(port: u16) -> u64 {
    let info = redis_cli(port, &["INFO", "persistence"]);
    info.lines()
        .find_map(|l| l.strip_prefix("rdb_changes_since_last_save:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn keys(port: u16) -> Vec<String> {
    let mut k: Vec<String> = redis_cli(port, &["--scan"])
        .lines()
        .map(str::to_owned)
        .collect();
    k.sort();
    k
}

#[tokio::test]
async fn looking_writes_nothing_to_redis() {
    let Some(server) = redis_server::start() else {
        return;
    };
    let url = server.url();
    let port = server.port();
    {
        let wheel = Wheel::new();
        let queue = DurableQueue::builder()
            .lease(Duration::from_secs(1))
            .redis(&url, "webhooks", &wheel)
            .await
            .unwrap();
        queue
            .schedule(
                Task::new(b"x".to_vec())
                    .id("p1")
                    .after(Duration::from_secs(3600)),
            )
            .await
            .unwrap();
        queue
            .schedule(Task::new(b"y".to_vec()).id("d1"))
            .await
            .unwrap();
        queue
            .schedule_recurring(Recurring::every(Duration::from_secs(3600)).id("hourly"))
            .await
            .unwrap();
        let mut stream = queue.deliveries();
        loop {
            let d = stream.next().await.unwrap();
            if d.id().as_str() == "d1" {
                d.fail("no").await.unwrap();
                break;
            }
            d.ack().await.unwrap();
        }
        drop(stream);
        queue.close().await;
    }
    // Let the claim records expire (SCAN reaps expired keys) and drop the kept replies of the
    // set-up's calls (they would expire mid-check), then wait for quiet.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for key in redis_cli(port, &["--scan", "--pattern", "tw:*:call:*"]).lines() {
        redis_cli(port, &["DEL", key]);
    }
    let mut before = (dirty(port), keys(port));
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = (dirty(port), keys(port));
        if now == before {
            break;
        }
        before = now;
    }
    let env = [("TWQ_REDIS", url.as_str()), ("TWQ_QUEUE", "webhooks")];
    for args in [
        &["stats"][..],
        &["--json", "stats"],
        &["list", "pending"],
        &["--json", "list", "in-flight"],
        &["list", "dead"],
        &["get", "p1", "--payload"],
        &["--json", "get", "nope"],
        &["recurring", "list"],
        &["--partitions", "8", "stats"],
    ] {
        let run = twq_env(args, &env).await;
        assert!(run.code == 0 || run.code == 1, "{args:?}: {run:?}");
        assert_eq!(
            (dirty(port), keys(port)),
            before,
            "{args:?} wrote to the server"
        );
    }
    let run = twq_env(
        &["--queue", "webhoks", "stats"],
        &[("TWQ_REDIS", url.as_str())],
    )
    .await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("no queue"), "{run:?}");
    assert_eq!(
        (dirty(port), keys(port)),
        before,
        "a misspelt queue left something"
    );
}

#[tokio::test]
async fn a_redis_password_is_never_printed() {
    let secret = "hunter2-S3cret";
    let Some(server) = redis_server::start_with(&["--requirepass", secret]) else {
        return;
    };
    let port = server.port();
    let good = format!("redis://:{secret}@127.0.0.1:{port}/");
    let user = format!("redis://default:{secret}@127.0.0.1:{port}/");
    let wrong = format!("redis://:wrong-{secret}@127.0.0.1:{port}/");
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        drop(l);
        format!("redis://:{secret}@127.0.0.1:{p}/")
    };
    let bad_port = format!("redis://:{secret}@127.0.0.1:notaport/");
    let bad_scheme = format!("http://:{secret}@127.0.0.1:{port}/");
    {
        let wheel = Wheel::new();
        let queue = DurableQueue::builder()
            .redis(&good, "q", &wheel)
            .await
            .unwrap();
        let payload = format!("the password is {secret}, url {good}");
        queue
            .schedule(
                Task::new(payload.into_bytes())
                    .id("leaky")
                    .after(Duration::from_secs(3600)),
            )
            .await
            .unwrap();
        queue.close().await;
    }
    let mut runs = Vec::new();
    for url in [&good, &user] {
        for args in [
            &["get", "leaky", "--payload"][..],
            &["--json", "get", "leaky", "--payload"],
            &["list", "pending"],
            &["--json", "stats"],
        ] {
            let mut a = vec!["--redis", url.as_str(), "--queue", "q"];
            a.extend_from_slice(args);
            let run = twq(&a).await;
            assert_eq!(run.code, 0, "{run:?}");
            runs.push(run);
        }
        let run = twq(&["--redis", url.as_str(), "--queue", "nosuch", "stats"]).await;
        assert_eq!(run.code, 1);
        runs.push(run);
        let run = twq(&[
            "--redis",
            url.as_str(),
            "--queue",
            "q",
            "--partitions",
            "3",
            "cancel",
            "leaky",
        ])
        .await;
        assert_eq!(run.code, 2, "{run:?}");
        runs.push(run);
    }
    // Malformed URLs whose errors once echoed the password (issue 29).
    let no_slashes = format!("redis//:{secret}@127.0.0.1:{port}/");
    let one_slash = format!("redis:/:{secret}@127.0.0.1:{port}/");
    let no_scheme = format!(":{secret}@127.0.0.1:{port}");
    for url in [
        &wrong,
        &closed,
        &bad_port,
        &bad_scheme,
        &no_slashes,
        &one_slash,
        &no_scheme,
    ] {
        for json in [false, true] {
            let mut a = vec!["--redis", url.as_str(), "--queue", "q", "--timeout", "1s"];
            if json {
                a.push("--json");
            }
            a.push("stats");
            runs.push(twq(&a).await.error());
        }
    }
    runs.push(twq_env(&["--help"], &[("TWQ_REDIS", good.as_str())]).await);
    runs.push(twq_env(&["stats", "--help"], &[("TWQ_REDIS", good.as_str())]).await);
    runs.push(twq_env(&["--queue", "q", "bogus"], &[("TWQ_REDIS", good.as_str())]).await);
    for run in &runs {
        assert!(!run.shows(secret), "the password shows: {run:?}");
    }
    let _ = SystemTime::now();
}

#[tokio::test]
async fn limits_stdin_payloads_and_encoded_passwords() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.redb");
    let f = path.to_str().unwrap();
    twq(&with_file(
        f,
        false,
        &["schedule", "--payload", "x", "--id", "a"],
    ))
    .await;
    for limit in ["0", "1001", "-1", "99999999999999999999"] {
        let run = twq(&with_file(f, true, &["list", "pending", "--limit", limit])).await;
        assert!(run.code == 0 || run.code == 2, "--limit {limit}: {run:?}");
        if run.code == 0 {
            assert!(run.json().is_object(), "{run:?}");
        }
    }
    // Binary bytes through standard input come back exact.
    let bytes: Vec<u8> = (0..=255u8).collect();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_twq"))
        .args([
            "--file",
            f,
            "--json",
            "schedule",
            "--payload-file",
            "-",
            "--id",
            "bin",
        ])
        .env_remove("TWQ_FILE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&bytes).await.unwrap();
    }
    assert!(child.wait_with_output().await.unwrap().status.success());
    let run = twq(&with_file(f, true, &["get", "bin", "--payload"])).await;
    assert_eq!(run.json()["payload_len"], 256);
    let b64 = run.json()["payload"]["base64"].as_str().unwrap().to_owned();
    // Standard padded base64 of 0..=255 starts with "AAECAwQF" and ends with "/w==".
    assert!(
        b64.starts_with("AAECAwQF") && b64.ends_with("/w=="),
        "{b64}"
    );
    // A password with characters that must be percent-encoded in the URL: neither its
    // encoded nor its decoded form shows, also inside a payload.
    let secret = "p@ss:w/rd?#x";
    let encoded = "p%40ss%3Aw%2Frd%3F%23x";
    let Some(server) = redis_server::start_with(&["--requirepass", secret]) else {
        return;
    };
    let url = format!("redis://:{encoded}@127.0.0.1:{}/", server.port());
    {
        let wheel = Wheel::new();
        let queue = DurableQueue::builder()
            .redis(&url, "q", &wheel)
            .await
            .unwrap();
        let payload = format!("pw={secret} enc={encoded}");
        queue
            .schedule(
                Task::new(payload.into_bytes())
                    .id("leak")
                    .after(Duration::from_secs(3600)),
            )
            .await
            .unwrap();
        queue.close().await;
    }
    let env = [("TWQ_REDIS", url.as_str()), ("TWQ_QUEUE", "q")];
    for args in [
        &["get", "leak", "--payload"][..],
        &["--json", "get", "leak", "--payload"],
        &["--queue", "nosuch", "stats"],
        &["--partitions", "2", "cancel", "leak"],
        &["--help"],
    ] {
        let run = twq_env(args, &env).await;
        assert!(
            !run.shows(secret) && !run.shows(encoded),
            "{args:?}: {run:?}"
        );
    }
    let wrong = format!("redis://:{encoded}x@127.0.0.1:{}/", server.port());
    let run = twq(&[
        "--redis",
        &wrong,
        "--queue",
        "q",
        "--timeout",
        "1s",
        "stats",
    ])
    .await
    .error();
    assert!(!run.shows(secret) && !run.shows(encoded), "{run:?}");
}
