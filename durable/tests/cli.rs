//! `twq`, the operator's command line, end to end: the real binary run against a real redb
//! file and a real `redis-server` of the test's own (and, once, a Redis Cluster). Every
//! subcommand on both backends, its `--json` output parsed back and checked against what the
//! library says (scheduled through the command line and read through the API, and the other
//! way round); exit status 1 for an unknown id or a task in the wrong state, 2 for errors: a
//! file held by a running app (locked), a wrong password (denied), an unreachable server, bad
//! arguments. No password ever shows in standard output or error, `--help` included.
#![cfg(feature = "cli")]

mod support;

use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use tokio_wheel_durable::{Recurring, Task, TaskFilter, TaskState};

use support::twq::*;

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

/// `pause` and `resume` (issue 29): the queue the API sees is paused, and `stats` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_reach_the_queue_and_stats_show_them() {
    let backend = Backend::file();
    backend.twq(&["schedule", "--payload", "p"]).await.ok();
    let json = backend.twq(&["--json", "pause"]).await.ok().json();
    assert_eq!(json["paused"], true);
    assert_eq!(
        backend.twq(&["--json", "stats"]).await.ok().json()["paused"],
        true
    );
    assert!(backend.twq(&["stats"]).await.ok().stdout.contains("paused"));
    {
        let queue = backend.open().await;
        assert!(queue.is_paused().await.unwrap());
        queue.close().await;
    }
    backend.twq(&["resume"]).await.ok();
    assert_eq!(
        backend.twq(&["--json", "stats"]).await.ok().json()["paused"],
        false
    );
}
