//! The board in a real browser (chromium through chromedriver): search, the task page, each
//! action, read-only refusal, a payload holding markup shown as text, the token, and a Redis
//! password that never appears in a page — on a real file and on a real redis-server.
//!
//! Set `TW_BOARD_SCREENSHOT=path.png` to keep a screenshot of the overview (README's).
#![cfg(feature = "dashboard")]

mod support;

use std::time::{Duration, SystemTime};

use fantoccini::{Client, Locator};
use tokio_wheel::Wheel;
use tokio_wheel_durable::{DurableQueue, Recurring, Task, TaskFilter, TaskId, TaskState};

use support::board::{dead_letter, state_of};
use support::browser::{self, count, press, text, tick, type_into};

/// A payload a careless board would run: it must show up as these exact characters.
const MARKUP: &str = "<script>document.title='pwned'</script><b id=injected>bold</b> & \"q\"";

/// The board of `queue`, mounted under /queue of an app, on a loopback port.
async fn serve_in_app(queue: DurableQueue) -> String {
    let app = axum::Router::new().nest(
        "/queue",
        tokio_wheel_durable::dashboard::Dashboard::new(queue)
            .title("orders")
            .router(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}/queue")
}

/// Waits for the page the last click led to (the notice of an action, or any selector).
async fn wait_for(client: &Client, css: &str) -> String {
    client
        .wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css} never appeared: {e}"))
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_and_action_works_in_a_browser_on_a_file() {
    let Some(driver) = browser::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = DurableQueue::open(dir.path().join("tasks.redb"), &wheel)
        .await
        .unwrap();
    let hour = Duration::from_secs(3600);
    queue
        .schedule(Task::new(MARKUP).id("x<b>").after(hour))
        .await
        .unwrap();
    queue
        .schedule(Task::new(vec![0xff, 0x00, b'A']).id("binary").after(hour))
        .await
        .unwrap();
    queue
        .schedule(Task::new("later").id("later").after(hour))
        .await
        .unwrap();
    for i in 0..120 {
        let task = Task::new("bulk")
            .id(format!("bulk-{i:03}"))
            .after(2 * hour + Duration::from_secs(i));
        queue.schedule(task).await.unwrap();
    }
    dead_letter(&queue, "dead-1", "boom <i>why</i>").await;
    queue
        .schedule_recurring(Recurring::every(Duration::from_secs(60)).id("sweep"))
        .await
        .unwrap();
    let base = serve_in_app(queue.clone()).await;
    let client = driver.session().await;

    // The overview answers the first questions.
    client.goto(&base).await.unwrap();
    let pending = queue.stats().await.unwrap().pending;
    assert_eq!(
        text(&client, "#count-pending .n").await,
        pending.to_string()
    );
    assert_eq!(text(&client, "#count-dead .n").await, "1");
    assert_eq!(count(&client, "#chart").await, 1);
    assert!(
        text(&client, "#dead-glimpse")
            .await
            .contains("boom <i>why</i>")
    );
    if let Some(path) = std::env::var_os("TW_BOARD_SCREENSHOT") {
        std::fs::write(path, client.screenshot().await.unwrap()).unwrap();
    }

    // Search by id lands on the task page; the payload's markup is shown, not run.
    type_into(&client, "form.search", "id", "x<b>").await;
    press(&client, "form.search").await;
    assert_eq!(wait_for(&client, "#task-state").await, "pending");
    assert_eq!(text(&client, "#payload").await, MARKUP);
    assert_eq!(
        count(&client, "#injected").await,
        0,
        "the markup made no element"
    );
    assert!(
        !client.title().await.unwrap().contains("pwned"),
        "no script ran"
    );
    // A binary payload is shown in hex.
    type_into(&client, "form.search", "id", "binary").await;
    press(&client, "form.search").await;
    wait_for(&client, "#task-state").await;
    assert!(
        text(&client, "#payload")
            .await
            .starts_with("00000000  ff 00 41")
    );
    // An id that is not there says so.
    type_into(&client, "form.search", "id", "no-such-task").await;
    press(&client, "form.search").await;
    assert!(
        wait_for(&client, "#not-found")
            .await
            .contains("no-such-task")
    );

    // Cancel is confirmed first: without the tick the browser does not send it.
    client
        .goto(&format!("{base}/task?id=x%3Cb%3E"))
        .await
        .unwrap();
    assert_eq!(
        count(&client, "form.actions-cancel input[name=confirm]:invalid").await,
        1,
        "the browser holds the form back until the box is ticked"
    );
    browser::click(&client, "form.actions-cancel").await;
    assert!(
        state_of(&queue, "x<b>").await.is_some(),
        "not cancelled unconfirmed"
    );
    tick(&client, "form.actions-cancel").await;
    press(&client, "form.actions-cancel").await;
    assert!(
        wait_for(&client, "#notice")
            .await
            .contains("Cancelled task x<b>")
    );
    assert_eq!(state_of(&queue, "x<b>").await, None);

    // Reschedule, by a duration from now.
    client.goto(&format!("{base}/task?id=later")).await.unwrap();
    let before = SystemTime::now();
    type_into(&client, "form.actions-reschedule", "when", "3h").await;
    press(&client, "form.actions-reschedule").await;
    assert!(wait_for(&client, "#notice").await.contains("is now due at"));
    let due = queue
        .get(&TaskId::from("later"))
        .await
        .unwrap()
        .unwrap()
        .due;
    assert!(due >= before + 3 * hour - Duration::from_secs(1), "{due:?}");
    // A time that does not parse is refused and changes nothing.
    type_into(&client, "form.actions-reschedule", "when", "tomorrow-ish").await;
    press(&client, "form.actions-reschedule").await;
    assert!(
        wait_for(&client, "#error")
            .await
            .contains("neither a duration")
    );
    assert_eq!(
        queue
            .get(&TaskId::from("later"))
            .await
            .unwrap()
            .unwrap()
            .due,
        due
    );

    // Redrive one dead letter.
    client
        .goto(&format!("{base}/task?id=dead-1"))
        .await
        .unwrap();
    assert_eq!(text(&client, "#task-state").await, "dead");
    press(&client, "form.actions-redrive").await;
    assert!(wait_for(&client, "#notice").await.contains("pending again"));
    assert_eq!(state_of(&queue, "dead-1").await, Some(TaskState::Pending));
    queue.cancel(&TaskId::from("dead-1")).await.unwrap();

    // Pause and resume from the overview.
    client.goto(&base).await.unwrap();
    press(&client, "form.actions-pause").await;
    assert!(wait_for(&client, "#notice").await.contains("Paused"));
    assert!(queue.is_paused().await.unwrap());
    assert_eq!(count(&client, "#paused-banner").await, 1);
    press(&client, "form.actions-resume").await;
    assert!(wait_for(&client, "#notice").await.contains("Resumed"));
    assert!(!queue.is_paused().await.unwrap());

    // Redrive all, then purge.
    dead_letter(&queue, "dead-2", "no").await;
    dead_letter(&queue, "dead-3", "no").await;
    client.goto(&base).await.unwrap();
    tick(&client, "form.actions-redrive-all").await;
    press(&client, "form.actions-redrive-all").await;
    assert!(
        wait_for(&client, "#notice")
            .await
            .contains("Moved 2 dead letters")
    );
    assert_eq!(queue.stats().await.unwrap().dead, 0);
    for id in ["dead-2", "dead-3"] {
        queue.cancel(&TaskId::from(id)).await.unwrap();
    }
    dead_letter(&queue, "dead-4", "no").await;
    client.goto(&base).await.unwrap();
    type_into(&client, "form.actions-purge", "older_than", "0s").await;
    tick(&client, "form.actions-purge").await;
    press(&client, "form.actions-purge").await;
    assert!(
        wait_for(&client, "#notice")
            .await
            .contains("Purged 1 dead letters")
    );
    assert_eq!(queue.stats().await.unwrap().dead, 0);

    // A dead letter redriven from the dead list's own button comes back to the list.
    dead_letter(&queue, "dead-5", "no").await;
    client.goto(&format!("{base}/tasks/dead")).await.unwrap();
    press(&client, "#tasks form.actions-redrive").await;
    assert!(
        wait_for(&client, "#notice")
            .await
            .contains("dead-5 is pending again")
    );
    let address = client.current_url().await.unwrap();
    assert!(address.path().ends_with("/tasks/dead"), "{address}");
    assert_eq!(state_of(&queue, "dead-5").await, Some(TaskState::Pending));
    queue.cancel(&TaskId::from("dead-5")).await.unwrap();

    // The overview can reload itself, with no script.
    client.goto(&base).await.unwrap();
    client
        .find(Locator::Css("#refresh"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for(&client, "#count-pending").await;
    assert!(
        client
            .current_url()
            .await
            .unwrap()
            .as_str()
            .ends_with("?refresh=10")
    );
    assert_eq!(count(&client, "meta[http-equiv=refresh]").await, 1);

    // Lists page through with the queue's own cursor.
    client.goto(&format!("{base}/tasks/pending")).await.unwrap();
    let mut seen = Vec::new();
    loop {
        for link in client
            .find_all(Locator::Css("#tasks a.task-link"))
            .await
            .unwrap()
        {
            seen.push(link.text().await.unwrap());
        }
        if count(&client, "#next-page").await == 0 {
            break;
        }
        client
            .find(Locator::Css("#next-page"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        wait_for(&client, "#first-page").await;
    }
    let all = queue.list(TaskFilter::Pending, None, 1000).await.unwrap();
    let ids: Vec<String> = all.iter().map(|t| t.id.as_str().to_owned()).collect();
    assert_eq!(seen, ids, "the pages, in order, are the whole pending list");
    assert!(seen.len() > 100);

    // Recurring schedules, and cancelling one.
    client.goto(&format!("{base}/recurring")).await.unwrap();
    assert!(text(&client, "#schedules").await.contains("sweep"));
    tick(&client, "form.actions-cancel-recurring").await;
    press(&client, "form.actions-cancel-recurring").await;
    assert!(
        wait_for(&client, "#notice")
            .await
            .contains("Cancelled the recurring schedule sweep")
    );
    assert!(
        !queue
            .cancel_recurring(&TaskId::from("sweep"))
            .await
            .unwrap()
    );

    client.close().await.unwrap();
    queue.close().await;
}

#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twq_dashboard_on_redis_never_shows_the_password_and_writes_only_when_asked() {
    const PASSWORD: &str = "S3cretBoardPw";
    let Some(driver) = browser::start() else {
        return;
    };
    let Some(server) = support::redis_server::start_with(&["--requirepass", PASSWORD]) else {
        return;
    };
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}/", server.port());
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .redis(&url, "webhooks", &wheel)
        .await
        .unwrap();
    let hour = Duration::from_secs(3600);
    queue
        .schedule(Task::new(MARKUP).id("hook-1").after(hour))
        .await
        .unwrap();
    queue
        .schedule(Task::new("b").id("hook-2").after(hour))
        .await
        .unwrap();
    dead_letter(&queue, "hook-dead", "endpoint answered 500").await;
    queue
        .schedule_recurring(Recurring::cron("0 */5 * * * *").unwrap().id("report"))
        .await
        .unwrap();
    let global: Vec<String> = ["--redis", &url, "--queue", "webhooks"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let before = support::redis_server::snapshot(&url);

    let (board, board_url) = twq_dashboard(&global, &[]);
    let client = driver.session().await;
    let pages = [
        "/".to_owned(),
        "/tasks/pending".to_owned(),
        "/tasks/in-flight".to_owned(),
        "/tasks/dead".to_owned(),
        "/recurring".to_owned(),
        "/task?id=hook-1".to_owned(),
        "/task?id=hook-dead".to_owned(),
        "/task?id=missing".to_owned(),
    ];
    for page in &pages {
        client.goto(&format!("{}{page}", board_url)).await.unwrap();
        let source = client.source().await.unwrap();
        assert!(!source.contains(PASSWORD), "the password is in {page}");
        assert!(source.contains("webhooks"), "{page} names the queue");
    }
    client
        .goto(&format!("{}/task?id=hook-1", board_url))
        .await
        .unwrap();
    assert_eq!(text(&client, "#payload").await, MARKUP);
    assert_eq!(count(&client, "#injected").await, 0);
    client
        .goto(&format!("{}/tasks/dead", board_url))
        .await
        .unwrap();
    assert!(
        text(&client, "#tasks")
            .await
            .contains("endpoint answered 500")
    );
    assert_eq!(
        support::redis_server::snapshot(&url),
        before,
        "looking wrote nothing to Redis"
    );

    // An action writes, through the handle opened for it.
    client
        .goto(&format!("{}/task?id=hook-2", board_url))
        .await
        .unwrap();
    tick(&client, "form.actions-cancel").await;
    press(&client, "form.actions-cancel").await;
    assert!(
        wait_for(&client, "#notice")
            .await
            .contains("Cancelled task hook-2")
    );
    assert_eq!(state_of(&queue, "hook-2").await, None);
    assert!(!client.source().await.unwrap().contains(PASSWORD));
    client.close().await.unwrap();
    drop(board);

    // Read-only: no action shown, and a POST is refused.
    let (board, board_url) = twq_dashboard(&global, &["--read-only"]);
    let client = driver.session().await;
    client.goto(&board_url).await.unwrap();
    assert!(
        text(&client, "#count-pending .n")
            .await
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    assert_eq!(count(&client, "form.action").await, 0);
    client
        .goto(&format!("{}/task?id=hook-1", board_url))
        .await
        .unwrap();
    assert_eq!(count(&client, "form.action").await, 0);
    let refused =
        tokio::task::block_in_place(|| board.post("/actions/cancel", "id=hook-1&confirm=yes"));
    assert_eq!(refused.status, axum::http::StatusCode::FORBIDDEN);
    assert!(state_of(&queue, "hook-1").await.is_some());
    client.close().await.unwrap();
    drop(board);

    // A token: refused without it; given once, the browser goes on with a cookie.
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("token");
    std::fs::write(&token_file, "board-token-1234\n").unwrap();
    let (_board, board_url) =
        twq_dashboard(&global, &["--token-file", token_file.to_str().unwrap()]);
    let client = driver.session().await;
    client.goto(&board_url).await.unwrap();
    assert!(client.source().await.unwrap().contains("needs its token"));
    assert_eq!(count(&client, "#count-pending").await, 0);
    client
        .goto(&format!("{}/?token=board-token-1234", board_url))
        .await
        .unwrap();
    assert_eq!(count(&client, "#count-pending").await, 1);
    let address = client.current_url().await.unwrap();
    assert!(!address.as_str().contains("token"), "{address}");
    client
        .goto(&format!("{}/tasks/dead", board_url))
        .await
        .unwrap();
    assert!(text(&client, "#tasks").await.contains("hook-dead"));
    client.close().await.unwrap();
    queue.close().await;
}

/// `twq … dashboard` on a free loopback port: the board and its base URL.
#[cfg(feature = "cli")]
fn twq_dashboard(global: &[String], extra: &[&str]) -> (support::board_twq::Board, String) {
    let addr = format!("127.0.0.1:{}", support::board_twq::free_port());
    let mut args = global.to_vec();
    args.extend(["dashboard", "--listen", &addr].map(str::to_owned));
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let board = support::board_twq::start(&args, &addr);
    (board, format!("http://{addr}"))
}
