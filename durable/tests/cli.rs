//! `twq`, the operator's command line, end to end: the real binary run against a real redb
//! file and a real `redis-server` of the test's own (and, once, a Redis Cluster). Every
//! subcommand on both backends, its `--json` output parsed back and checked against what the
//! library says (scheduled through the command line and read through the API, and the other
//! way round); exit status 1 for an unknown id or a task in the wrong state, 2 for errors: a
//! file held by a running app (locked), a wrong password (denied), an unreachable server, bad
//! arguments. No password ever shows in standard output or error, `--help` included.
#![cfg(feature = "cli")]

mod support;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use serde_json::Value;
use support::redis_server::{self, RedisServer};
use tokio_wheel::Wheel;
use tokio_wheel_durable::{DurableQueue, Recurring, Task, TaskFilter, TaskId, TaskInfo, TaskState};

/// What one run of `twq` did.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The one JSON document it printed.
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not one JSON document ({e}): {self:?}"))
    }

    fn ok(self) -> Run {
        assert_eq!(self.code, 0, "{self:?}");
        assert!(self.stderr.is_empty(), "{self:?}");
        self
    }

    /// Exit 1 with one line on standard error that contains `needle`.
    fn not_found(self, needle: &str) -> Run {
        assert_eq!(self.code, 1, "{self:?}");
        assert_eq!(self.stderr.lines().count(), 1, "{self:?}");
        assert!(self.stderr.contains(needle), "{needle:?} in {self:?}");
        self
    }

    /// Exit 2 with one line on standard error that contains `needle`, nothing on standard
    /// output.
    fn error(self, needle: &str) -> Run {
        assert_eq!(self.code, 2, "{self:?}");
        assert_eq!(self.stderr.lines().count(), 1, "{self:?}");
        assert!(self.stderr.starts_with("twq: "), "{self:?}");
        assert!(
            self.stderr.to_lowercase().contains(needle),
            "{needle:?} in {self:?}"
        );
        assert!(self.stdout.is_empty(), "{self:?}");
        self
    }

    fn shows(&self, secret: &str) -> bool {
        self.stdout.contains(secret) || self.stderr.contains(secret)
    }
}

/// Runs `twq args…` (with `stdin` on its standard input), its environment free of `TWQ_*`
/// plus `env`.
async fn twq_with(args: Vec<String>, stdin: Option<Vec<u8>>, env: Vec<(String, String)>) -> Run {
    tokio::task::spawn_blocking(move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_twq"));
        command
            .args(&args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for name in ["TWQ_REDIS", "TWQ_CLUSTER", "TWQ_QUEUE", "TWQ_FILE"] {
            command.env_remove(name);
        }
        command.envs(env);
        let mut child = command.spawn().expect("run twq");
        if let Some(input) = stdin {
            child.stdin.take().unwrap().write_all(&input).unwrap();
        }
        let output = child.wait_with_output().unwrap();
        Run {
            code: output.status.code().expect("twq exited"),
            stdout: String::from_utf8(output.stdout).unwrap(),
            stderr: String::from_utf8(output.stderr).unwrap(),
        }
    })
    .await
    .unwrap()
}

async fn twq(args: &[&str]) -> Run {
    twq_with(
        args.iter().map(|a| (*a).to_owned()).collect(),
        None,
        Vec::new(),
    )
    .await
}

fn now_ms() -> u64 {
    ms_of(SystemTime::now())
}

fn ms_of(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn rfc3339_ms(time: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(time)
}

/// The queue the command line is pointed at, and how the test reaches it through the API.
enum Store {
    File {
        _dir: tempfile::TempDir,
        path: PathBuf,
    },
    Redis {
        _server: RedisServer,
        url: String,
    },
    Cluster {
        _cluster: support::redis_cluster::Cluster,
        urls: Vec<String>,
        partitions: usize,
    },
}

struct Backend {
    store: Store,
    wheel: Wheel,
}

const QUEUE: &str = "ops";

impl Backend {
    fn file() -> Backend {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tasks.redb");
        Backend {
            store: Store::File { _dir: dir, path },
            wheel: Wheel::new(),
        }
    }

    fn redis() -> Option<Backend> {
        let server = redis_server::start()?;
        Some(Backend {
            store: Store::Redis {
                url: server.url(),
                _server: server,
            },
            wheel: Wheel::new(),
        })
    }

    /// The global options that point `twq` at this queue.
    fn global(&self) -> Vec<String> {
        match &self.store {
            Store::File { path, .. } => vec!["--file".into(), path.display().to_string()],
            Store::Redis { url, .. } => {
                vec![
                    "--redis".into(),
                    url.clone(),
                    "--queue".into(),
                    QUEUE.into(),
                ]
            }
            Store::Cluster {
                urls, partitions, ..
            } => vec![
                "--cluster".into(),
                urls.join(","),
                "--queue".into(),
                QUEUE.into(),
                "--partitions".into(),
                partitions.to_string(),
            ],
        }
    }

    async fn twq(&self, args: &[&str]) -> Run {
        self.twq_in(args, None).await
    }

    async fn twq_in(&self, args: &[&str], stdin: Option<Vec<u8>>) -> Run {
        let mut all = self.global();
        all.extend(args.iter().map(|a| (*a).to_owned()));
        twq_with(all, stdin, Vec::new()).await
    }

    /// A handle through the API. On the embedded store it holds the file's lock: close it
    /// before running `twq`.
    async fn open(&self) -> DurableQueue {
        match &self.store {
            Store::File { path, .. } => DurableQueue::open(path, &self.wheel).await.unwrap(),
            Store::Redis { url, .. } => DurableQueue::builder()
                .redis(url, QUEUE, &self.wheel)
                .await
                .unwrap(),
            Store::Cluster {
                urls, partitions, ..
            } => {
                let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
                DurableQueue::builder()
                    .partitions(*partitions)
                    .redis_cluster(&urls, QUEUE, &self.wheel)
                    .await
                    .unwrap()
            }
        }
    }

    async fn get(&self, id: &str) -> Option<TaskInfo> {
        let queue = self.open().await;
        let info = queue.get(&TaskId::from(id)).await.unwrap();
        queue.close().await;
        info
    }

    async fn reschedule(&self, id: &str, due: std::time::SystemTime) {
        let queue = self.open().await;
        assert!(queue.reschedule(&TaskId::from(id), due).await.unwrap());
        queue.close().await;
    }

    async fn list(&self, filter: TaskFilter) -> Vec<TaskInfo> {
        let queue = self.open().await;
        let page = queue.list(filter, None, 1000).await.unwrap();
        queue.close().await;
        page
    }
}

/// The fields of a task in `twq`'s JSON that the library reports too.
fn assert_same(json: &Value, info: &TaskInfo) {
    assert_eq!(json["id"], info.id.as_str(), "{json}");
    let state = match &info.state {
        TaskState::Pending => "pending",
        TaskState::InFlight { .. } => "in-flight",
        TaskState::Dead { .. } => "dead",
        other => panic!("unexpected state {other:?}"),
    };
    assert_eq!(json["state"], state, "{json}");
    assert_eq!(json["due_ms"], ms_of(info.due), "{json}");
    assert_eq!(json["attempts"], info.attempts, "{json}");
    assert_eq!(json["payload_len"], info.payload_len as u64, "{json}");
    assert_eq!(json["reason"].as_str(), info.reason.as_deref(), "{json}");
    if let TaskState::InFlight {
        attempt,
        lease_until,
    } = &info.state
    {
        assert_eq!(json["attempt"], *attempt, "{json}");
        assert_eq!(json["lease_until_ms"], ms_of(*lease_until), "{json}");
    }
}

/// Every subcommand, through `twq`, checked against the API.
async fn every_subcommand(backend: &Backend) {
    // schedule --after: the store resolves the delay against its clock.
    let before = now_ms();
    let run = backend
        .twq(&[
            "--json",
            "schedule",
            "--payload",
            "hello",
            "--after",
            "10m",
            "--id",
            "a",
        ])
        .await
        .ok();
    let after = now_ms();
    let scheduled = run.json();
    assert_eq!(scheduled["id"], "a");
    assert_eq!(scheduled["scheduled"], true);
    let a = backend.get("a").await.expect("scheduled through twq");
    assert_same(&scheduled["task"], &a);
    assert_eq!(a.state, TaskState::Pending);
    assert_eq!(a.payload_len, 5);
    let due = ms_of(a.due);
    assert!((before + 600_000..=after + 600_001).contains(&due), "{due}");

    // schedule --payload-file --at, a generated id.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payload.bin");
    std::fs::write(&file, [0u8, 159, 146, 150, 10]).unwrap();
    let run = backend
        .twq(&[
            "--json",
            "schedule",
            "--payload-file",
            file.to_str().unwrap(),
            "--at",
            "2030-01-01T00:00:00Z",
        ])
        .await
        .ok();
    let generated = run.json()["id"].as_str().unwrap().to_owned();
    let b = backend.get(&generated).await.unwrap();
    assert_eq!(b.due, rfc3339_ms(1_893_456_000_000));
    assert_eq!(b.payload_len, 5);
    assert_eq!(run.json()["task"]["due"], "2030-01-01T00:00:00.000Z");

    // schedule --payload-file - (standard input), due now, in a table.
    let run = backend
        .twq_in(
            &["schedule", "--payload-file", "-", "--id", "stdin"],
            Some(b"from standard input".to_vec()),
        )
        .await
        .ok();
    assert!(run.stdout.starts_with("scheduled\n"), "{run:?}");
    assert!(run.stdout.contains("stdin"), "{run:?}");
    let info = backend.get("stdin").await.unwrap();
    assert_eq!(info.payload_len, 19);

    // Through the API, read through `twq get`.
    let queue = backend.open().await;
    queue
        .schedule(
            Task::new(b"xyz".to_vec())
                .after(Duration::from_secs(3600))
                .id("c"),
        )
        .await
        .unwrap();
    queue.close().await;
    let c = backend.get("c").await.unwrap();
    let run = backend.twq(&["--json", "get", "c"]).await.ok();
    assert_same(&run.json(), &c);
    let run = backend.twq(&["get", "c"]).await.ok();
    assert!(run.stdout.contains("state     pending"), "{run:?}");
    assert!(run.stdout.contains("payload   3 bytes"), "{run:?}");
    assert!(
        run.stdout.contains("(in 1h)") || run.stdout.contains("(in 59m"),
        "{run:?}"
    );

    // list: pages in due order, the cursor of the next page, the end.
    let all = backend.list(TaskFilter::Pending).await;
    let ids: Vec<&str> = all.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["stdin", "a", "c", generated.as_str()]);
    let page = backend
        .twq(&["--json", "list", "pending", "--limit", "3"])
        .await
        .ok()
        .json();
    assert_eq!(page["state"], "pending");
    let tasks = page["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 3);
    for (json, info) in tasks.iter().zip(&all) {
        assert_same(json, info);
    }
    let cursor = page["next_cursor"]
        .as_str()
        .expect("a full page has a next cursor");
    assert!(
        cursor.parse::<tokio_wheel_durable::Cursor>().is_ok(),
        "{cursor}"
    );
    // The position holds whatever happens to the task it was taken at: move "c" to the end.
    backend
        .twq(&["reschedule", "c", "--at", "2100-01-01T00:00:00Z"])
        .await
        .ok();
    let page = backend
        .twq(&[
            "--json", "list", "pending", "--limit", "3", "--cursor", cursor,
        ])
        .await
        .ok()
        .json();
    let tasks = page["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "{page}");
    assert_same(&tasks[0], &all[3]);
    assert_eq!(tasks[1]["id"], "c", "the moved task, at its new place");
    assert_eq!(page["next_cursor"], Value::Null);
    // Back where it was, for the rest of the test.
    backend.reschedule("c", all[2].due).await;
    let run = backend.twq(&["list", "pending", "-n", "2"]).await.ok();
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(lines[0].starts_with("ID "), "{run:?}");
    assert!(
        lines[0].contains("STATE") && lines[0].contains("PAYLOAD"),
        "{run:?}"
    );
    assert!(
        lines[1].starts_with("stdin ") && lines[2].starts_with("a "),
        "{run:?}"
    );
    assert!(
        lines[2].contains("pending") && lines[2].contains("5 B"),
        "{run:?}"
    );
    let shown = lines[3]
        .strip_prefix("next page: --cursor ")
        .unwrap_or_else(|| panic!("{run:?}"));
    // A pending list's cursor given to the dead list, and a task id: refused.
    backend
        .twq(&["list", "dead", "--cursor", shown])
        .await
        .error("cursor");
    backend
        .twq(&["list", "pending", "--cursor", "a"])
        .await
        .error("cursor");

    // reschedule --at / --after.
    backend
        .twq(&["reschedule", "a", "--at", "2031-01-01T00:00:00Z"])
        .await
        .ok();
    assert_eq!(
        backend.get("a").await.unwrap().due,
        rfc3339_ms(1_924_992_000_000)
    );
    let before = now_ms();
    let run = backend
        .twq(&["--json", "reschedule", "a", "--after", "2h"])
        .await
        .ok();
    let after = now_ms();
    let due = ms_of(backend.get("a").await.unwrap().due);
    assert!(
        (before + 7_200_000..=after + 7_200_000).contains(&due),
        "{due}"
    );
    assert_eq!(run.json()["due_ms"], due);
    assert_eq!(run.json()["rescheduled"], true);

    // cancel, and cancel again: exit 1.
    let run = backend.twq(&["--json", "cancel", "c"]).await.ok();
    assert_eq!(run.json()["cancelled"], true);
    assert_eq!(backend.get("c").await, None);
    let run = backend
        .twq(&["--json", "cancel", "c"])
        .await
        .not_found("no task c");
    assert_eq!(run.json()["found"], false);
    assert_eq!(run.json()["cancelled"], false);

    // Unknown ids: exit 1 for get, reschedule, redrive.
    let run = backend
        .twq(&["get", "nope"])
        .await
        .not_found("no task nope");
    assert!(run.stdout.is_empty());
    assert_eq!(
        backend
            .twq(&["--json", "get", "nope"])
            .await
            .not_found("nope")
            .json()["found"],
        false
    );
    backend
        .twq(&["reschedule", "nope", "--after", "1m"])
        .await
        .not_found("no task nope");
    backend
        .twq(&["redrive", "nope"])
        .await
        .not_found("no task nope");
    // A pending task is not dead.
    backend.twq(&["redrive", "a"]).await.not_found("not dead");

    // Dead letters, made through the API.
    let queue = backend.open().await;
    for id in ["d1", "d2"] {
        queue
            .schedule(Task::new(b"bad".to_vec()).id(id))
            .await
            .unwrap();
    }
    {
        let mut deliveries = queue.deliveries();
        let mut failed = Vec::new();
        while failed.len() < 3 {
            let delivery = deliveries.next().await.unwrap();
            delivery.fail("boom\nline two").await.unwrap();
            failed.push(delivery.id().to_string());
            if failed.iter().any(|id| id == "d1") && failed.iter().any(|id| id == "d2") {
                break;
            }
        }
    }
    queue.close().await;
    // ("stdin" was due now too: it may have been failed with them.)
    let dead = backend.list(TaskFilter::Dead).await;
    let page = backend.twq(&["--json", "list", "dead"]).await.ok().json();
    let tasks = page["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), dead.len());
    for (json, info) in tasks.iter().zip(&dead) {
        assert_same(json, info);
        assert_eq!(json["reason"], "boom\nline two");
    }
    let run = backend.twq(&["list", "dead"]).await.ok();
    assert!(run.stdout.contains("boom\\nline two"), "{run:?}");
    let run = backend.twq(&["get", "d1"]).await.ok();
    assert!(run.stdout.contains("state     dead"), "{run:?}");
    assert!(run.stdout.contains("reason    boom\\nline two"), "{run:?}");
    let run = backend
        .twq(&["--json", "cancel", "d1"])
        .await
        .not_found("is dead");
    assert_eq!(run.json()["state"], "dead");
    backend
        .twq(&["reschedule", "d1", "--after", "1m"])
        .await
        .not_found("is dead");
    let run = backend.twq(&["--json", "redrive", "d1"]).await.ok();
    assert_eq!(run.json()["redriven"], true);
    let d1 = backend.get("d1").await.unwrap();
    assert_eq!((d1.state, d1.attempts), (TaskState::Pending, 0));

    // stats: the library's counts.
    let queue = backend.open().await;
    let stats = queue.stats().await.unwrap();
    queue.close().await;
    let json = backend.twq(&["--json", "stats"]).await.ok().json();
    assert_eq!(json["pending"], stats.pending);
    assert_eq!(json["dead"], stats.dead);
    assert_eq!(json["in_flight"], 0);
    assert_eq!(json["dead_lettered"], stats.dead_lettered);
    assert!(stats.dead >= 1 && stats.dead_lettered >= 2, "{stats:?}");
    let run = backend.twq(&["stats"]).await.ok();
    assert!(
        run.stdout
            .lines()
            .any(|line| line == format!("dead           {}", stats.dead)),
        "{run:?}"
    );

    // purge-dead: none older than a day; all with 0s.
    let run = backend
        .twq(&["--json", "purge-dead", "--older-than", "1d"])
        .await
        .ok();
    assert_eq!(run.json()["purged"], 0);
    let run = backend
        .twq(&["purge-dead", "--older-than", "0s"])
        .await
        .ok();
    let plural = if stats.dead == 1 { "" } else { "s" };
    assert_eq!(
        run.stdout,
        format!("purged {} dead letter{plural}\n", stats.dead)
    );
    assert!(backend.list(TaskFilter::Dead).await.is_empty());

    // Recurring schedules: `cancel` cannot, `recurring cancel` does.
    let queue = backend.open().await;
    queue
        .schedule_recurring(Recurring::every(Duration::from_secs(3600)).id("sweep"))
        .await
        .unwrap();
    queue.close().await;
    let json = backend.twq(&["--json", "get", "sweep"]).await.ok().json();
    assert_eq!(json["state"], "pending");
    backend
        .twq(&["cancel", "sweep"])
        .await
        .not_found("recurring");
    let run = backend
        .twq(&["--json", "recurring", "cancel", "sweep"])
        .await
        .ok();
    assert_eq!(run.json()["cancelled"], true);
    assert_eq!(backend.get("sweep").await, None);
    backend
        .twq(&["recurring", "cancel", "sweep"])
        .await
        .not_found("no recurring schedule sweep");
    backend
        .twq(&["recurring", "cancel", "a"])
        .await
        .not_found("not a recurring schedule");
}

/// Standard base64, decoded (for `get --payload --json`).
fn unbase64(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {text}"),
        }
    };
    let mut out = Vec::new();
    for chunk in text.as_bytes().chunks(4) {
        let data: Vec<u8> = chunk.iter().copied().filter(|&c| c != b'=').collect();
        let word = data
            .iter()
            .enumerate()
            .fold(0u32, |word, (i, &c)| word | value(c) << (18 - 6 * i));
        for i in 0..data.len().saturating_sub(1) {
            out.push((word >> (16 - 8 * i)) as u8);
        }
    }
    out
}

/// `get --payload` (text and binary, for people and as JSON) and `recurring list` (paged by
/// its cursor, JSON checked against the library).
async fn payloads_and_recurring_list(backend: &Backend) {
    let binary: Vec<u8> = vec![0x00, 0x9f, 0xff, b'\n', b'a'];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payload.bin");
    std::fs::write(&file, &binary).unwrap();
    let file = file.display().to_string();
    backend
        .twq(&[
            "schedule",
            "--payload-file",
            &file,
            "--id",
            "bin",
            "--after",
            "1h",
        ])
        .await
        .ok();
    backend
        .twq(&[
            "schedule",
            "--payload",
            "héllo\u{1b}[31m",
            "--id",
            "txt",
            "--after",
            "1h",
        ])
        .await
        .ok();
    let run = backend.twq(&["get", "bin", "--payload"]).await.ok();
    assert!(
        run.stdout
            .ends_with("payload (5 bytes, not UTF-8, hex):\n009fff0a61\n"),
        "{run:?}"
    );
    let run = backend.twq(&["get", "txt", "--payload"]).await.ok();
    // The escape character is shown escaped, never sent to the terminal.
    assert!(
        run.stdout
            .ends_with("payload (11 bytes, UTF-8 text):\nhéllo\\u{1b}[31m\n"),
        "{run:?}"
    );
    let json = backend
        .twq(&["--json", "get", "bin", "--payload"])
        .await
        .ok()
        .json();
    assert_eq!(
        unbase64(json["payload"]["base64"].as_str().unwrap()),
        binary
    );
    assert_eq!(json["payload"]["text"], Value::Null);
    assert_eq!(json["payload_len"], 5);
    let json = backend
        .twq(&["--json", "get", "txt", "--payload"])
        .await
        .ok()
        .json();
    assert_eq!(json["payload"]["text"], "héllo\u{1b}[31m");
    assert_eq!(
        unbase64(json["payload"]["base64"].as_str().unwrap()),
        "héllo\u{1b}[31m".as_bytes()
    );
    // Without --payload, no payload.
    let json = backend.twq(&["--json", "get", "bin"]).await.ok().json();
    assert!(json.get("payload").is_none(), "{json}");
    backend
        .twq(&["get", "nope", "--payload"])
        .await
        .not_found("no task nope");

    // recurring list: nothing, then two schedules a page at a time.
    let run = backend.twq(&["recurring", "list"]).await.ok();
    assert_eq!(run.stdout, "no recurring schedules\n");
    let queue = backend.open().await;
    queue
        .schedule_recurring(
            Recurring::every(Duration::from_secs(3600))
                .id("sweep")
                .payload(b"abc".to_vec()),
        )
        .await
        .unwrap();
    queue
        .schedule_recurring(Recurring::cron("0 0 4 * * *").unwrap().id("nightly"))
        .await
        .unwrap();
    let library = queue.recurring_page(None, 10).await.unwrap().items;
    queue.close().await;
    assert_eq!(library.len(), 2);
    let mut listed = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..3 {
        let mut args = vec!["--json", "recurring", "list", "--limit", "1"];
        if let Some(cursor) = &cursor {
            args.extend(["--cursor", cursor.as_str()]);
        }
        let json = backend.twq(&args).await.ok().json();
        listed.extend(json["recurring"].as_array().unwrap().iter().cloned());
        cursor = json["next_cursor"].as_str().map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    assert!(cursor.is_none(), "no end after 3 pages");
    assert_eq!(listed.len(), 2, "{listed:?}");
    for (json, info) in listed.iter().zip(&library) {
        assert_eq!(json["id"], info.id.as_str());
        assert_eq!(json["next_ms"], ms_of(info.next));
        assert_eq!(json["payload_len"], info.payload_len as u64);
        assert_eq!(json["catch_up"], "latest");
    }
    let sweep = listed.iter().find(|j| j["id"] == "sweep").unwrap();
    assert_eq!(
        (&sweep["kind"], &sweep["period_ms"]),
        (&Value::from("every"), &Value::from(3_600_000))
    );
    let nightly = listed.iter().find(|j| j["id"] == "nightly").unwrap();
    assert_eq!(
        (&nightly["kind"], &nightly["expression"]),
        (&Value::from("cron"), &Value::from("0 0 4 * * *"))
    );
    let run = backend.twq(&["recurring", "list"]).await.ok();
    let header = run.stdout.lines().next().unwrap();
    assert!(
        header.starts_with("ID ") && header.contains("CATCH-UP"),
        "{run:?}"
    );
    assert!(
        run.stdout
            .lines()
            .any(|l| l.starts_with("sweep ") && l.contains("every") && l.contains("3 B")),
        "{run:?}"
    );
    assert!(
        run.stdout
            .lines()
            .any(|l| l.starts_with("nightly ") && l.contains("0 0 4 * * *")),
        "{run:?}"
    );
    backend
        .twq(&["recurring", "list", "--cursor", "x"])
        .await
        .error("--cursor");
    let json = backend
        .twq(&["--json", "get", "sweep", "--payload"])
        .await
        .ok()
        .json();
    assert_eq!(json["payload"]["text"], "abc");
    for id in ["sweep", "nightly"] {
        backend.twq(&["recurring", "cancel", id]).await.ok();
    }
    for id in ["bin", "txt"] {
        backend.twq(&["cancel", id]).await.ok();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subcommand_on_a_file() {
    let backend = Backend::file();
    every_subcommand(&backend).await;
    payloads_and_recurring_list(&backend).await;
    // The embedded store's in-flight tasks live in the process that holds it: none here.
    let json = backend
        .twq(&["--json", "list", "in-flight"])
        .await
        .ok()
        .json();
    assert_eq!(json["tasks"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subcommand_on_redis() {
    let Some(backend) = Backend::redis() else {
        return;
    };
    every_subcommand(&backend).await;
    in_flight(&backend).await;
    payloads_and_recurring_list(&backend).await;
}

/// A task held by a worker: listed in flight; neither replaced nor cancelled (exit 1, saying
/// why).
async fn in_flight(backend: &Backend) {
    let queue = backend.open().await;
    queue
        .schedule(Task::new(b"busy".to_vec()).id("busy"))
        .await
        .unwrap();
    let mut deliveries = queue.deliveries();
    let delivery = loop {
        let delivery = deliveries.next().await.unwrap();
        if delivery.id().as_str() == "busy" {
            break delivery;
        }
        delivery.ack().await.unwrap();
    };
    let held = queue.get(&"busy".into()).await.unwrap().unwrap();
    let json = backend
        .twq(&["--json", "list", "in-flight"])
        .await
        .ok()
        .json();
    let listed: Vec<&Value> = json["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["id"] == "busy")
        .collect();
    assert_eq!(listed.len(), 1, "{json}");
    assert_same(listed[0], &held);
    assert_eq!(listed[0]["attempt"], 1);
    let run = backend.twq(&["list", "in-flight"]).await.ok();
    assert!(
        run.stdout.contains("in-flight") && run.stdout.contains("lease ends in"),
        "{run:?}"
    );
    let run = backend
        .twq(&["--json", "schedule", "--payload", "x", "--id", "busy"])
        .await
        .not_found("in flight");
    assert_eq!(run.json()["scheduled"], false);
    let run = backend
        .twq(&["--json", "cancel", "busy"])
        .await
        .not_found("in flight");
    assert_eq!(run.json()["state"], "in-flight");
    backend
        .twq(&["reschedule", "busy", "--after", "1m"])
        .await
        .not_found("in flight");
    delivery.ack().await.unwrap();
    drop(deliveries);
    queue.close().await;
    assert_eq!(backend.get("busy").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_held_by_a_running_app_is_locked() {
    let backend = Backend::file();
    let queue = backend.open().await;
    queue
        .schedule(Task::new(b"x".to_vec()).id("x"))
        .await
        .unwrap();
    for args in [
        &["stats"][..],
        &["get", "x"],
        &["schedule", "--payload", "y"],
    ] {
        backend.twq(args).await.error("locked by another process");
    }
    queue.close().await;
    backend.twq(&["get", "x"]).await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_file_is_an_error_not_a_new_store() {
    let backend = Backend::file();
    let Store::File { path, .. } = &backend.store else {
        unreachable!()
    };
    backend.twq(&["stats"]).await.error("no such file");
    backend
        .twq(&["list", "pending"])
        .await
        .error("no such file");
    assert!(!path.exists());
    // `schedule` creates it.
    backend.twq(&["schedule", "--payload", "first"]).await.ok();
    assert!(path.exists());
    let json = backend.twq(&["--json", "stats"]).await.ok().json();
    assert_eq!(json["pending"], 1);
}

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

/// Every key on the server with its serialized value.
fn server_snapshot(url: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut connection = redis::Client::open(url).unwrap().get_connection().unwrap();
    let mut keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut connection).unwrap();
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let value: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut connection).unwrap();
            (key, value)
        })
        .collect()
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
    let before = server_snapshot(url);
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
    assert_eq!(server_snapshot(url), before, "a read-only command wrote");
}
