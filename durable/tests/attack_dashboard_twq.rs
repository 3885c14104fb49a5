//! Attacks on `twq … dashboard` from outside, as a child process over real HTTP: the
//! documented command line only. Each test is named by the promise it checks.
#![cfg(all(feature = "dashboard", feature = "cli"))]

mod support;

use std::time::Duration;

use axum::http::{StatusCode, header};
use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel_durable::dashboard::{Dashboard, router};
use tokio_wheel_durable::{DurableQueue, Recurring, Task, TaskId};

use support::board::*;

use support::board_twq::*;

const PASSWORD: &str = "Brd-Pw_7731zq";

/// A password-protected redis-server holding queue "ops": pending, dead (reason holding
/// markup), a recurring schedule and a task in flight whose worker is gone.
async fn redis_queue_for_the_board(
    server: &support::redis_server::RedisServer,
    extra: impl AsyncFnOnce(&DurableQueue),
) -> String {
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}/", server.port());
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .lease(Duration::from_secs(3600))
        .prefetch(1)
        .redis(&url, "ops", &wheel)
        .await
        .unwrap();
    for i in 0..7 {
        queue
            .schedule(
                Task::new(format!("payload {i}"))
                    .id(format!("p-{i}"))
                    .after(Duration::from_secs(3600 + i)),
            )
            .await
            .unwrap();
    }
    for i in 0..3 {
        dead_letter(&queue, &format!("d-{i}"), MARKUP).await;
    }
    queue
        .schedule_recurring(
            Recurring::cron("0 0 6 * * MON-FRI")
                .unwrap()
                .id("report")
                .payload("weekly"),
        )
        .await
        .unwrap();
    extra(&queue).await;
    queue.schedule(Task::new("fly").id("fly")).await.unwrap();
    let mut deliveries = queue.deliveries();
    let delivery = tokio::time::timeout(Duration::from_secs(30), deliveries.next())
        .await
        .unwrap()
        .unwrap();
    // The worker dies holding it: the task stays in flight for an hour.
    std::mem::forget(delivery);
    drop(deliveries);
    wheel.shutdown().await;
    drop(queue);
    tokio::time::sleep(Duration::from_millis(500)).await;
    url
}

fn board_args(url: &str, queue: &str, addr: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--redis",
        url,
        "--queue",
        queue,
        "dashboard",
        "--listen",
        addr,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

/// Every GET path a curious person (or a crawler) could try.
fn every_path() -> Vec<String> {
    let mut paths: Vec<String> = [
        "/",
        "/tasks/pending",
        "/tasks/pending?limit=2",
        "/tasks/in-flight",
        "/tasks/dead",
        "/tasks/dead?limit=1",
        "/recurring",
        "/recurring?limit=1",
        "/task?id=p-0",
        "/task?id=d-0",
        "/task?id=fly",
        "/task?id=report",
        "/task?id=no-such-task",
        "/task?id=",
        "/task",
        "/tasks/pending?cursor=garbage",
        "/tasks/pending?cursor=d.1.0.61",
        "/tasks/dead?limit=0",
        "/tasks/dead?limit=99999",
        "/recurring?cursor=x",
        "/nope",
        "/actions/cancel",
        "/?notice=1",
        "/?notice=999999999999999999999",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    paths.push(format!("/task?id={}", "x".repeat(4000)));
    paths
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twq_dashboard_on_redis_writes_nothing_and_never_shows_the_password_while_looked_at() {
    let Some(server) = support::redis_server::start_with(&["--requirepass", PASSWORD]) else {
        return;
    };
    let url = redis_queue_for_the_board(&server, async |_| {}).await;
    let before = snapshot(&url);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        before,
        snapshot(&url),
        "the server is quiet before the board"
    );
    let addr = format!("127.0.0.1:{}", free_port());
    let board = start(&board_args(&url, "ops", &addr, &[]), &addr);
    let mut leaks = Vec::new();
    let mut check = |what: &str, reply: &Reply| {
        let headers = format!("{:?}", reply.headers);
        if reply.body.contains(PASSWORD) || headers.contains(PASSWORD) {
            leaks.push(what.to_owned());
        }
        assert_ne!(reply.status.as_u16(), PANICKED, "{what}: {reply:?}");
        assert!(!reply.status.is_server_error(), "{what}: {reply:?}");
    };
    let root = tokio::task::block_in_place(|| board.get("/"));
    check("/", &root);
    let token = csrf(&root.body);
    for path in every_path() {
        let reply = tokio::task::block_in_place(|| board.get(&path));
        check(&path, &reply);
        let reply = tokio::task::block_in_place(|| http(&addr, "HEAD", &path, &[], ""));
        assert!(!reply.status.is_server_error(), "HEAD {path}: {reply:?}");
    }
    // Follow every next-page link.
    for first in [
        "/tasks/pending?limit=2",
        "/tasks/dead?limit=1",
        "/recurring?limit=1",
    ] {
        let mut at = Some(first.to_owned());
        while let Some(path) = at {
            let reply = tokio::task::block_in_place(|| board.get(&path));
            check(&path, &reply);
            at = next_page(&reply.body);
        }
    }
    // Refused actions are not actions: no token, a wrong token, no tick, cross-site.
    for (path, form) in [
        ("/actions/pause", String::new()),
        ("/actions/pause", format!("csrf={}", "0".repeat(64))),
        ("/actions/cancel", format!("csrf={token}&id=p-0")),
        ("/actions/redrive-all", format!("csrf={token}")),
        ("/actions/purge", format!("csrf={token}&older_than=0s")),
        (
            "/actions/purge",
            format!("csrf={token}&older_than=zz&confirm=yes"),
        ),
        (
            "/actions/reschedule",
            format!("csrf={token}&id=p-0&when=zz"),
        ),
    ] {
        let reply = tokio::task::block_in_place(|| board.post(path, &form));
        assert!(reply.status.is_client_error(), "{path} {form}: {reply:?}");
        check(path, &reply);
    }
    // Long enough for the chart's counters to be read.
    tokio::time::sleep(Duration::from_secs(11)).await;
    check("/ again", &tokio::task::block_in_place(|| board.get("/")));
    let after = snapshot(&url);
    assert_eq!(
        before.1, after.1,
        "the server counted writes while the board was looked at"
    );
    assert!(
        before.0 == after.0,
        "a key changed while the board was looked at"
    );
    assert!(leaks.is_empty(), "the password is in: {leaks:?}");
    assert!(!board.output().contains(PASSWORD), "{}", board.output());

    // An action writes, and is answered.
    let reply = tokio::task::block_in_place(|| {
        board.post(
            "/actions/cancel",
            &format!("csrf={token}&id=p-0&confirm=yes"),
        )
    });
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{reply:?}");
    let location = reply.headers[header::LOCATION].to_str().unwrap().to_owned();
    assert!(!location.contains(PASSWORD));
    let landed = tokio::task::block_in_place(|| board.get(&location));
    assert!(
        said(&landed.body).contains("Cancelled task p-0"),
        "{landed:?}"
    );
    assert_ne!(snapshot(&url).0, after.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twq_dashboard_on_a_misspelt_queue_name_says_so_and_writes_nothing() {
    let Some(server) = support::redis_server::start_with(&["--requirepass", PASSWORD]) else {
        return;
    };
    let url = redis_queue_for_the_board(&server, async |_| {}).await;
    let before = snapshot(&url);
    let addr = format!("127.0.0.1:{}", free_port());
    let (code, output) = tokio::task::block_in_place(|| {
        run(
            &board_args(&url, "opz", &addr, &[]),
            Duration::from_secs(20),
        )
    });
    assert_eq!(code, Some(1), "{output}");
    assert!(output.contains("no queue"), "{output}");
    assert!(!output.contains(PASSWORD));
    assert_eq!(before, snapshot(&url));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twq_dashboard_answers_a_frozen_or_dead_redis_with_an_error_page_without_the_password() {
    let Some(mut server) = support::redis_server::start_with(&["--requirepass", PASSWORD]) else {
        return;
    };
    let url = redis_queue_for_the_board(&server, async |_| {}).await;
    let addr = format!("127.0.0.1:{}", free_port());
    // A 2 s call timeout (5 s by default): each frozen or dead page below waits it out.
    let board = start(&board_args(&url, "ops", &addr, &["--timeout", "2s"]), &addr);
    let token = csrf(&tokio::task::block_in_place(|| board.get("/")).body);
    let pages = [
        "/",
        "/tasks/pending",
        "/tasks/dead",
        "/recurring",
        "/task?id=p-1",
    ];

    // Frozen: the pages answer 504 once the call timeout has passed, rather than hang.
    // Two pages (the overview and a task's) stand for all: each costs a whole call timeout.
    unsafe { libc::kill(server.pid() as i32, libc::SIGSTOP) };
    let mut problems = Vec::new();
    for path in [pages[0], pages[4]] {
        let reply = tokio::task::block_in_place(|| board.get(path));
        if reply.status != StatusCode::GATEWAY_TIMEOUT {
            problems.push(format!("frozen {path}: {}", reply.status));
        }
        if reply.body.contains(PASSWORD) || format!("{:?}", reply.headers).contains(PASSWORD) {
            problems.push(format!("frozen {path}: the password is in the answer"));
        }
    }
    let reply = tokio::task::block_in_place(|| {
        board.post(
            "/actions/cancel",
            &format!("csrf={token}&id=p-1&confirm=yes"),
        )
    });
    if !reply.status.is_server_error() {
        problems.push(format!("frozen action: {}", reply.status));
    }
    unsafe { libc::kill(server.pid() as i32, libc::SIGCONT) };

    // Dead: the pages answer an error page at once or within the call timeout.
    server.stop();
    for path in pages {
        let reply = tokio::task::block_in_place(|| board.get(path));
        if !reply.status.is_server_error() {
            problems.push(format!("dead {path}: {}", reply.status));
        }
        if reply.body.contains(PASSWORD) || format!("{:?}", reply.headers).contains(PASSWORD) {
            problems.push(format!("dead {path}: the password is in the answer"));
        }
    }
    // Back with another password: the refusal is shown, the password is not.
    server.set_extra(&["--requirepass", "someone-else"]);
    server.restart();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for path in pages {
        let reply = tokio::task::block_in_place(|| board.get(path));
        if reply.body.contains(PASSWORD) {
            problems.push(format!(
                "wrong password {path}: the password is in the answer"
            ));
        }
    }
    assert!(!board.output().contains(PASSWORD), "{}", board.output());
    assert!(problems.is_empty(), "{problems:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_password_never_appears_in_a_page_even_inside_a_payload_or_a_reason() {
    let Some(server) = support::redis_server::start_with(&["--requirepass", PASSWORD]) else {
        return;
    };
    let url = redis_queue_for_the_board(&server, async |queue: &DurableQueue| {
        queue
            .schedule(
                Task::new(format!("redis password: {PASSWORD}"))
                    .id("leaky")
                    .after(Duration::from_secs(60)),
            )
            .await
            .unwrap();
        dead_letter(queue, "leaky-dead", &format!("AUTH {PASSWORD} failed")).await;
    })
    .await;
    let addr = format!("127.0.0.1:{}", free_port());
    let board = start(&board_args(&url, "ops", &addr, &[]), &addr);
    let mut leaks = Vec::new();
    for path in [
        "/",
        "/tasks/pending",
        "/tasks/dead",
        "/task?id=leaky",
        "/task?id=leaky-dead",
    ] {
        let reply = tokio::task::block_in_place(|| board.get(path));
        assert_eq!(reply.status, StatusCode::OK, "{path}");
        if reply.body.contains(PASSWORD) {
            leaks.push(path);
        }
    }
    // As `twq get --payload` does ("a Redis password given to twq shows as *** even
    // inside a payload"), and as the board promises ("never appears in a page").
    assert!(leaks.is_empty(), "the Redis password is shown on {leaks:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twq_dashboard_never_prints_a_password_holding_a_slash_hash_or_question_mark() {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut leaks = Vec::new();
    for password in ["Pw/zz81k", "Pw#zz81k", "Pw?zz81k", "Pw@zz81k"] {
        let url = format!("redis://:{password}@127.0.0.1:1/");
        let (code, output) = tokio::task::block_in_place(|| {
            run(
                &board_args(&url, "ops", &addr, &[]),
                Duration::from_secs(20),
            )
        });
        assert_eq!(code, Some(2), "{output}");
        if output.contains("zz81k") {
            leaks.push(output);
        }
    }
    assert!(leaks.is_empty(), "{leaks:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twq_dashboard_listens_on_loopback_unless_given_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let file = a_file_with_one_task(&dir).await.display().to_string();
    let port = free_port();
    for listen in [
        format!("0.0.0.0:{port}"),
        format!("[::]:{port}"),
        format!("[::ffff:0.0.0.0]:{port}"),
        format!("192.0.2.1:{port}"),
    ] {
        let args: Vec<String> = ["--file", &file, "dashboard", "--listen", &listen]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let (code, output) = tokio::task::block_in_place(|| run(&args, Duration::from_secs(10)));
        assert_eq!(code, Some(2), "{listen}: {output}");
        assert!(output.contains("--token-file"), "{listen}: {output}");
    }
    // No --listen: 127.0.0.1:8080 (it may be taken on this machine: then it says so).
    let args: Vec<String> = ["--file", &file, "dashboard"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let (_, output) = tokio::task::block_in_place(|| run(&args, Duration::from_secs(2)));
    assert!(output.contains("127.0.0.1:8080"), "{output}");
    assert!(!output.contains("0.0.0.0"), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twq_dashboard_with_a_token_file_needs_it_for_everything_and_never_prints_it() {
    const SECRET: &str = "tok-9f3kq2-secret";
    let dir = tempfile::tempdir().unwrap();
    let file = a_file_with_one_task(&dir).await.display().to_string();
    let token_file = dir.path().join("board.token");
    for empty in ["", "\n", "  \n"] {
        std::fs::write(&token_file, empty).unwrap();
        let args: Vec<String> = [
            "--file",
            &file,
            "dashboard",
            "--listen",
            "127.0.0.1:1",
            "--token-file",
            &token_file.display().to_string(),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let (code, output) = tokio::task::block_in_place(|| run(&args, Duration::from_secs(10)));
        assert_eq!(code, Some(2), "{empty:?}: {output}");
        assert!(!output.contains("panicked"), "{output}");
    }
    std::fs::write(&token_file, format!("{SECRET}\n")).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let args: Vec<String> = [
        "--file",
        &file,
        "dashboard",
        "--listen",
        &addr,
        "--token-file",
        &token_file.display().to_string(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let board = start(&args, &addr);
    let mut open = Vec::new();
    for path in every_path() {
        for method in ["GET", "HEAD", "POST", "OPTIONS"] {
            let reply = tokio::task::block_in_place(|| http(&addr, method, &path, &[], ""));
            if reply.status != StatusCode::UNAUTHORIZED {
                open.push(format!("{method} {path}: {}", reply.status));
            }
        }
    }
    for wrong in ["wrong", "tok-9f3kq2-secreT", "tok-9f3kq2-secret%0A", ""] {
        let reply = tokio::task::block_in_place(|| board.get(&format!("/?token={wrong}")));
        if reply.status != StatusCode::UNAUTHORIZED {
            open.push(format!("?token={wrong}: {}", reply.status));
        }
    }
    assert!(open.is_empty(), "reachable without the token: {open:#?}");
    let bearer = format!("Bearer {SECRET}");
    let page = tokio::task::block_in_place(|| {
        board.get_with("/task?id=t", &[("Authorization", bearer.as_str())])
    });
    assert_eq!(page.status, StatusCode::OK);
    assert!(!page.body.contains(SECRET));
    let reply = tokio::task::block_in_place(|| board.get(&format!("/task?id=t&token={SECRET}")));
    assert_eq!(reply.status, StatusCode::SEE_OTHER);
    assert_eq!(reply.headers[header::LOCATION], "/task?id=t");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!board.output().contains(SECRET), "{}", board.output());
}

/// DNS rebinding: a web page on evil.example whose name is made to resolve to 127.0.0.1
/// reads the board as its own origin (so `Sec-Fetch-Site: same-origin`, and it can read the
/// anti-forgery token from the page). A loopback board without a token is "safe by default"
/// only if it refuses a request whose `Host` is not its own address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twq_dashboard_on_loopback_refuses_a_foreign_host_header() {
    let dir = tempfile::tempdir().unwrap();
    let file = a_file_with_one_task(&dir).await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let args: Vec<String> = [
        "--file",
        &file.display().to_string(),
        "dashboard",
        "--listen",
        &addr,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let board = start(&args, &addr);
    let host = format!("evil.example:{port}");
    let origin = format!("http://evil.example:{port}");
    let page = tokio::task::block_in_place(|| board.get_with("/", &[("Host", host.as_str())]));
    let acted = if page.status == StatusCode::OK {
        let form = format!("csrf={}&id=t&confirm=yes", csrf(&page.body));
        let reply = tokio::task::block_in_place(|| {
            http(
                &addr,
                "POST",
                "/actions/cancel",
                &[
                    ("Host", host.as_str()),
                    ("Origin", origin.as_str()),
                    ("Sec-Fetch-Site", "same-origin"),
                    ("Content-Type", "application/x-www-form-urlencoded"),
                ],
                &form,
            )
        });
        reply.status.as_u16()
    } else {
        0
    };
    assert!(
        page.status.is_client_error(),
        "Host: {host} was answered {} (and the cancel it then posted: {acted})",
        page.status
    );
}

// ---------------------------------------------------------------------------------------
// Odd ids, defaults, settings.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_ids_show_and_are_acted_on_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = open_file(&dir, &wheel).await;
    let ids = [
        "a\r\nSet-Cookie: x=1".to_owned(),
        "nul\0byte".to_owned(),
        "sp ace+plus%25".to_owned(),
        "é/ü?#&=;".to_owned(),
        "\u{202e}cod.exe".to_owned(),
        "tab\there".to_owned(),
        " lead-and-trail ".to_owned(),
        "l".repeat(3000),
        "😀🎉".to_owned(),
    ];
    for id in &ids {
        queue
            .schedule(
                Task::new("p")
                    .id(id.clone())
                    .after(Duration::from_secs(3600)),
            )
            .await
            .unwrap();
    }
    let app = router(queue.clone());
    let token = csrf(&get(&app, "/").await.body);
    let listed = page_through(&app, "/tasks/pending", false).await;
    let mut failures = Vec::new();
    for id in &ids {
        if !listed.contains(id) {
            failures.push(format!("{id:?} not listed as itself"));
        }
        let page = get(&app, &format!("/task?id={}", enc(id))).await;
        let hidden = all_after(&page.body, "name=id value=\"");
        if page.status != StatusCode::OK {
            failures.push(format!(
                "{id:?}: its own link from the list leads to {} ({:?})",
                page.status,
                page.body
                    .find("id=not-found>")
                    .map(|at| &page.body[at..(at + 80).min(page.body.len())])
            ));
        } else if hidden.first().map(|h| unescape(h)) != Some(id.clone()) {
            failures.push(format!("{id:?}: the forms carry {hidden:?}"));
        }
        let (status, notice) = act(
            &app,
            &token,
            "/actions/cancel",
            &format!("id={}&confirm=yes", enc(id)),
        )
        .await;
        if status != StatusCode::SEE_OTHER || !notice.contains(id.as_str()) {
            failures.push(format!("{id:?}: cancel answered {status} {notice:?}"));
        }
        if queue
            .get(&TaskId::from(id.as_str()))
            .await
            .unwrap()
            .is_some()
        {
            failures.push(format!("{id:?}: still there after cancel"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    queue.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_shows_50_by_default_and_up_to_500() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = open_file(&dir, &wheel).await;
    let tasks = (0..520).map(|i| {
        Task::new("p")
            .id(format!("t-{i:04}"))
            .after(Duration::from_secs(3600 + i))
    });
    for result in queue.schedule_many(tasks).await.unwrap() {
        result.unwrap();
    }
    let app = router(queue.clone());
    assert_eq!(
        listed_ids(&get(&app, "/tasks/pending").await.body).len(),
        50
    );
    assert_eq!(
        listed_ids(&get(&app, "/tasks/pending?limit=500").await.body).len(),
        500
    );
    let all = page_through(&app, "/tasks/pending?limit=500", false).await;
    assert_eq!(all.len(), 520);
    queue.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_sample_period_is_raised_to_100_ms_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = open_file(&dir, &wheel).await;
    let app = Dashboard::new(queue.clone())
        .sample_every(Duration::ZERO)
        .router();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reply = get(&app, "/").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    queue.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twq_dashboard_acts_again_once_redis_is_back_after_a_failed_first_action() {
    let Some(mut server) = support::redis_server::start_with(&["--requirepass", PASSWORD]) else {
        return;
    };
    let url = redis_queue_for_the_board(&server, async |_| {}).await;
    let addr = format!("127.0.0.1:{}", free_port());
    let board = start(&board_args(&url, "ops", &addr, &[]), &addr);
    let token = csrf(&tokio::task::block_in_place(|| board.get("/")).body);
    server.stop();
    let reply =
        tokio::task::block_in_place(|| board.post("/actions/pause", &format!("csrf={token}")));
    assert!(reply.status.is_server_error(), "{reply:?}");
    server.restart();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let reply =
        tokio::task::block_in_place(|| board.post("/actions/pause", &format!("csrf={token}")));
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{reply:?}");
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .redis(&url, "ops", &wheel)
        .await
        .unwrap();
    assert!(queue.is_paused().await.unwrap());
    queue.close().await;
}

/// "Redrive all moves at most 10 000 a press and says how many remain."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_all_moves_at_most_10_000_a_press_and_says_how_many_remain() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .retry(
            tokio_wheel_durable::RetryPolicy::exponential(
                Duration::from_secs(1),
                Duration::from_secs(1),
            )
            .max_attempts(1),
        )
        .prefetch(512)
        .redis(&server.url(), "many", &wheel)
        .await
        .unwrap();
    const N: usize = 10_030;
    for chunk in (0..N).collect::<Vec<_>>().chunks(1000) {
        let tasks = chunk.iter().map(|i| Task::new("p").id(format!("m-{i:05}")));
        for result in queue.schedule_many(tasks).await.unwrap() {
            result.unwrap();
        }
    }
    let started = std::time::Instant::now();
    queue
        .deliveries()
        .take(N)
        .for_each_concurrent(256, |delivery| async move {
            delivery.fail("gone").await.unwrap();
        })
        .await;
    eprintln!("{N} dead letters in {:?}", started.elapsed());
    assert_eq!(queue.stats().await.unwrap().dead, N as u64);
    let app = router(queue.clone());
    let token = csrf(&get(&app, "/").await.body);
    let (status, notice) = act(&app, &token, "/actions/redrive-all", "confirm=yes").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{notice}");
    let dead = queue.stats().await.unwrap().dead;
    assert_eq!(dead, (N - 10_000) as u64, "{notice}");
    assert!(
        notice.contains("10000") || notice.contains("10 000") || notice.contains("10,000"),
        "{notice}"
    );
    assert!(notice.contains("30"), "says how many remain: {notice}");
    let (_, notice) = act(&app, &token, "/actions/redrive-all", "confirm=yes").await;
    assert!(notice.contains("30"), "{notice}");
    assert_eq!(queue.stats().await.unwrap().dead, 0);
    queue.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twq_dashboard_read_only_on_redis_refuses_every_action_and_writes_nothing() {
    let Some(server) = support::redis_server::start_with(&["--requirepass", PASSWORD]) else {
        return;
    };
    let url = redis_queue_for_the_board(&server, async |_| {}).await;
    let before = snapshot(&url);
    let addr = format!("127.0.0.1:{}", free_port());
    let board = start(&board_args(&url, "ops", &addr, &["--read-only"]), &addr);
    for path in ["/", "/task?id=p-0", "/task?id=d-0", "/recurring"] {
        let reply = tokio::task::block_in_place(|| board.get(path));
        assert_eq!(reply.status, StatusCode::OK, "{path}");
        assert!(
            !reply.body.contains("method=post"),
            "{path} shows an action"
        );
    }
    let fake = "0".repeat(64);
    for path in [
        "/actions/cancel",
        "/actions/reschedule",
        "/actions/redrive",
        "/actions/redrive-all",
        "/actions/purge",
        "/actions/pause",
        "/actions/resume",
        "/actions/cancel-recurring",
    ] {
        let form = format!("csrf={fake}&id=p-0&when=1m&older_than=0s&confirm=yes");
        let reply = tokio::task::block_in_place(|| board.post(path, &form));
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{path}: {reply:?}");
    }
    assert_eq!(before, snapshot(&url));
}

/// A store in `dir` holding one task `t`, due in an hour, closed again (`twq` needs the file
/// to itself).
async fn a_file_with_one_task(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let file = dir.path().join("tasks.redb");
    let wheel = Wheel::new();
    let queue = DurableQueue::open(&file, &wheel).await.unwrap();
    queue
        .schedule(Task::new("p").id("t").after(Duration::from_secs(3600)))
        .await
        .unwrap();
    queue.close().await;
    file
}

/// The redis crate's Unix socket URLs carry the password in their query
/// (`redis+unix:///path?pass=…`): it never shows on a board page nor in `twq`'s output, a
/// payload holding it included (outside attack: it showed in every page's title).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_urls_password_never_shows() {
    let sockets = tempfile::tempdir().unwrap();
    let socket = sockets.path().join("r.sock").display().to_string();
    let Some(_server) =
        support::redis_server::start_with(&["--requirepass", PASSWORD, "--unixsocket", &socket])
    else {
        return;
    };
    let url = format!("redis+unix://{socket}?pass={PASSWORD}");
    {
        let wheel = Wheel::new();
        let queue = DurableQueue::builder()
            .redis(&url, "ops", &wheel)
            .await
            .unwrap();
        let payload = format!("the password is {PASSWORD}");
        let task = Task::new(payload)
            .id("leaky")
            .after(Duration::from_secs(3600));
        queue.schedule(task).await.unwrap();
        queue.close().await;
    }
    let mut leaks = Vec::new();
    let wrong = format!("redis+unix://{socket}?pass=Wr0ng-{PASSWORD}");
    for (url, args, code) in [
        (&url, &["stats"][..], Some(0)),
        (&url, &["--json", "stats"], Some(0)),
        (&url, &["get", "leaky", "--payload"], Some(0)),
        (&url, &["--json", "get", "leaky", "--payload"], Some(0)),
        (&wrong, &["stats"], Some(2)),
    ] {
        let mut all = vec!["--redis".to_owned(), url.clone(), "--queue".to_owned()];
        all.push("ops".to_owned());
        all.extend(args.iter().map(|arg| (*arg).to_owned()));
        let (exit, output) = tokio::task::block_in_place(|| run(&all, Duration::from_secs(30)));
        assert_eq!(exit, code, "twq {args:?}: {output}");
        if output.contains(PASSWORD) {
            leaks.push(format!("twq {args:?}: {output}"));
        }
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let board = tokio::task::block_in_place(|| start(&board_args(&url, "ops", &addr, &[]), &addr));
    for path in ["/".to_owned(), "/task?id=leaky".to_owned()]
        .into_iter()
        .chain(every_path())
    {
        let reply = tokio::task::block_in_place(|| board.get(&path));
        assert!(!reply.status.is_server_error(), "{path}: {reply:?}");
        if reply.body.contains(PASSWORD) || format!("{:?}", reply.headers).contains(PASSWORD) {
            leaks.push(path);
        }
    }
    if board.output().contains(PASSWORD) {
        leaks.push(format!("the board's own output: {}", board.output()));
    }
    assert!(leaks.is_empty(), "the password shows: {leaks:#?}");
}
