//! Attacks on the board (the queue's web dashboard) from outside: only the public API
//! (`dashboard::{router, Dashboard}`, the queue's API). Each test is named by the promise it
//! checks; `attack_dashboard_twq.rs` attacks `twq dashboard`.
#![cfg(feature = "dashboard")]

mod support;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel_durable::dashboard::{Dashboard, router};
use tokio_wheel_durable::{Recurring, Task, TaskId, TaskState};

use support::board::*;

// ---------------------------------------------------------------------------------------
// XSS: a real browser on every page that shows something from the store.

const TITLE_MARKUP: &str = "t\"'><script>document.title='pwned'</script><b id=injected>t</b>";

/// True when the page the browser shows ran no script and gained no injected element.
async fn clean(client: &fantoccini::Client) -> Result<(), String> {
    let verdict = client
        .execute(
            "return [document.title, document.getElementById('injected') === null, \
             document.getElementsByTagName('script').length, \
             document.querySelectorAll('[onerror],[onload],[onclick]').length];",
            vec![],
        )
        .await
        .unwrap();
    let url = client.current_url().await.unwrap();
    let title = verdict[0].as_str().unwrap_or_default().to_owned();
    if title == "pwned" || !title.contains("document.title=") {
        return Err(format!("{url}: the title was changed to {title:?}"));
    }
    if verdict[1] != serde_json::Value::Bool(true) {
        return Err(format!("{url}: an element was injected"));
    }
    if verdict[2] != serde_json::json!(0) || verdict[3] != serde_json::json!(0) {
        return Err(format!(
            "{url}: a script or handler is in the page: {verdict}"
        ));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_markup_from_the_store_or_the_request_runs_in_a_browser_on_any_page() {
    use support::browser;
    let Some(driver) = browser::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = open_file(&dir, &wheel).await;
    let dead = format!("d{MARKUP}");
    let schedule = format!("r{MARKUP}");
    dead_letter(&queue, &dead, MARKUP).await;
    queue
        .schedule(
            Task::new(MARKUP)
                .id(MARKUP)
                .after(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    queue
        .schedule_recurring(
            Recurring::every(Duration::from_secs(3600))
                .id(schedule.clone())
                .payload(MARKUP),
        )
        .await
        .unwrap();
    let base = serve(Dashboard::new(queue.clone()).title(TITLE_MARKUP).router()).await;
    let client = driver.session().await;
    let mut failures = Vec::new();
    let pages = [
        "/".to_owned(),
        "/tasks/pending".to_owned(),
        "/tasks/dead".to_owned(),
        "/tasks/in-flight".to_owned(),
        "/recurring".to_owned(),
        format!("/task?id={}", enc(MARKUP)),
        format!("/task?id={}", enc(&dead)),
        format!("/task?id={}", enc(&schedule)),
        format!("/task?id={}", enc(&format!("missing{MARKUP}"))),
        format!("/tasks/pending?cursor={}", enc(MARKUP)),
        format!("/tasks/dead?limit={}", enc(MARKUP)),
        format!("/recurring?cursor={}", enc(MARKUP)),
        format!("/nope{}", enc(MARKUP)),
    ];
    for path in &pages {
        client.goto(&format!("{base}{path}")).await.unwrap();
        if let Err(e) = clean(&client).await {
            failures.push(e);
        }
    }
    // The payload shows as these exact characters.
    client
        .goto(&format!("{base}/task?id={}", enc(MARKUP)))
        .await
        .unwrap();
    assert_eq!(browser::text(&client, "#payload").await, MARKUP);
    // Notices and errors after actions, through the forms as a person would use them.
    browser::type_into(&client, "form.actions-reschedule", "when", MARKUP).await;
    browser::press(&client, "form.actions-reschedule").await;
    if let Err(e) = clean(&client).await {
        failures.push(e);
    }
    client
        .goto(&format!("{base}/task?id={}", enc(MARKUP)))
        .await
        .unwrap();
    browser::type_into(&client, "form.actions-reschedule", "when", "10m").await;
    browser::press(&client, "form.actions-reschedule").await;
    if let Err(e) = clean(&client).await {
        failures.push(e);
    }
    browser::tick(&client, "form.actions-cancel").await;
    browser::press(&client, "form.actions-cancel").await;
    if let Err(e) = clean(&client).await {
        failures.push(e);
    }
    client
        .goto(&format!("{base}/task?id={}", enc(&dead)))
        .await
        .unwrap();
    browser::press(&client, "form.actions-redrive").await;
    if let Err(e) = clean(&client).await {
        failures.push(e);
    }
    client.goto(&format!("{base}/recurring")).await.unwrap();
    browser::tick(&client, "form.actions-cancel-recurring").await;
    browser::press(&client, "form.actions-cancel-recurring").await;
    if let Err(e) = clean(&client).await {
        failures.push(e);
    }
    assert!(
        queue.get(&TaskId::from(MARKUP)).await.unwrap().is_none(),
        "the markup task was cancelled through the browser"
    );
    client.close().await.unwrap();
    assert!(failures.is_empty(), "{failures:#?}");
    queue.close().await;
}

// ---------------------------------------------------------------------------------------
// Actions answer what they did, and do it.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_action_does_what_its_answer_says() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = open_file(&dir, &wheel).await;
    for i in 0..3 {
        dead_letter(&queue, &format!("dead-{i}"), "boom").await;
    }
    for id in ["a", "b", "c"] {
        queue
            .schedule(Task::new("p").id(id).after(Duration::from_secs(3600)))
            .await
            .unwrap();
    }
    queue
        .schedule_recurring(Recurring::every(Duration::from_secs(3600)).id("sweep"))
        .await
        .unwrap();
    let app = router(queue.clone());
    let token = csrf(&get(&app, "/").await.body);

    // cancel
    let (status, notice) = act(&app, &token, "/actions/cancel", "id=a&confirm=yes").await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(notice.contains("Cancelled task a"), "{notice}");
    assert!(state_of(&queue, "a").await.is_none());
    let (_, notice) = act(&app, &token, "/actions/cancel", "id=dead-0&confirm=yes").await;
    assert!(
        notice.contains("is dead: it cannot be cancelled"),
        "{notice}"
    );
    assert!(matches!(
        state_of(&queue, "dead-0").await,
        Some(TaskState::Dead { .. })
    ));
    let (_, notice) = act(&app, &token, "/actions/cancel", "id=nobody&confirm=yes").await;
    assert!(notice.contains("nobody"), "{notice}");

    // reschedule: a duration, an RFC 3339 time, garbage
    let before = std::time::SystemTime::now();
    let (status, notice) = act(&app, &token, "/actions/reschedule", "id=b&when=10m").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{notice}");
    let due = queue.get(&TaskId::from("b")).await.unwrap().unwrap().due;
    let off = due.duration_since(before).unwrap();
    assert!(
        off >= Duration::from_secs(595) && off <= Duration::from_secs(605),
        "{off:?}: {notice}"
    );
    let (status, notice) = act(
        &app,
        &token,
        "/actions/reschedule",
        "id=b&when=2030-01-02T03%3A04%3A05Z",
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{notice}");
    let due = queue.get(&TaskId::from("b")).await.unwrap().unwrap().due;
    assert_eq!(
        due.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs(),
        1_893_553_445,
        "{notice}"
    );
    assert!(notice.contains("2030-01-02T03:04:05Z"), "{notice}");
    for garbage in ["soon", "-5m", "", "2030-13-01T00:00:00Z", "10"] {
        let (status, said) = act(
            &app,
            &token,
            "/actions/reschedule",
            &format!("id=b&when={}", enc(garbage)),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{garbage:?}: {said}");
        let again = queue.get(&TaskId::from("b")).await.unwrap().unwrap().due;
        assert_eq!(again, due, "{garbage:?} changed nothing");
    }

    // redrive one, redrive all, purge
    let (_, notice) = act(&app, &token, "/actions/redrive", "id=dead-0").await;
    assert!(notice.contains("dead-0"), "{notice}");
    let info = queue.get(&TaskId::from("dead-0")).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Pending);
    assert_eq!(info.attempts, 0, "redrive resets the attempts");
    let (_, notice) = act(&app, &token, "/actions/redrive-all", "confirm=yes").await;
    assert!(notice.contains('2'), "{notice}");
    assert_eq!(queue.stats().await.unwrap().dead, 0);
    for i in 0..3 {
        assert!(
            queue
                .cancel(&TaskId::from(format!("dead-{i}").as_str()))
                .await
                .unwrap()
        );
    }
    dead_letter(&queue, "dead-9", "boom").await;
    for garbage in ["forever", "", "-1d", "1x"] {
        let (status, said) = act(
            &app,
            &token,
            "/actions/purge",
            &format!("older_than={}&confirm=yes", enc(garbage)),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{garbage:?}: {said}");
    }
    assert_eq!(
        queue.stats().await.unwrap().dead,
        1,
        "garbage purged nothing"
    );
    let (_, notice) = act(&app, &token, "/actions/purge", "older_than=7d&confirm=yes").await;
    assert!(notice.contains('0'), "{notice}");
    assert_eq!(queue.stats().await.unwrap().dead, 1);
    let (_, notice) = act(&app, &token, "/actions/purge", "older_than=0s&confirm=yes").await;
    assert!(notice.contains('1'), "{notice}");
    assert_eq!(queue.stats().await.unwrap().dead, 0);

    // pause / resume
    let (_, notice) = act(&app, &token, "/actions/pause", "").await;
    assert!(notice.to_lowercase().contains("paused"), "{notice}");
    assert!(queue.is_paused().await.unwrap());
    let (_, notice) = act(&app, &token, "/actions/resume", "").await;
    assert!(notice.to_lowercase().contains("resumed"), "{notice}");
    assert!(!queue.is_paused().await.unwrap());

    // cancel a recurring schedule
    let (_, notice) = act(
        &app,
        &token,
        "/actions/cancel-recurring",
        "id=sweep&confirm=yes",
    )
    .await;
    assert!(notice.contains("sweep"), "{notice}");
    let page = queue.recurring_page(None, 100).await.unwrap();
    assert!(page.items.is_empty(), "{:?}", page.items);
    queue.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reschedule_far_in_the_future_is_answered_and_not_a_dropped_connection() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = open_file(&dir, &wheel).await;
    queue
        .schedule(Task::new("p").id("far").after(Duration::from_secs(3600)))
        .await
        .unwrap();
    let app = router(queue.clone());
    let token = csrf(&get(&app, "/").await.body);
    let mut failures = Vec::new();
    for when in ["99999999999d", "9999999999999999999ms", "2562047788015d"] {
        let due = queue.get(&TaskId::from("far")).await.unwrap().unwrap().due;
        let reply = post(
            &app,
            "/actions/reschedule",
            &format!("csrf={token}&id=far&when={when}"),
        )
        .await;
        let now = queue.get(&TaskId::from("far")).await.unwrap().unwrap().due;
        match reply.status.as_u16() {
            303 => {}
            400 if now == due => {}
            400 => failures.push(format!("{when}: refused (400) but the task was moved")),
            other => failures.push(format!(
                "{when}: answered {other} ({}); the task's due time went from {:?} to {:?}",
                reply.body.lines().next().unwrap_or_default(),
                due,
                now
            )),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    queue.close().await;
}

// ---------------------------------------------------------------------------------------
// Lists and cursors.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_every_list_shows_each_task_once_and_bad_cursors_and_limits_are_400() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = open_file(&dir, &wheel).await;
    for i in 0..12 {
        dead_letter(&queue, &format!("dead-{i:02}"), "boom").await;
    }
    for i in 0..23 {
        queue
            .schedule(
                Task::new("p")
                    .id(format!("pend-{i:02}"))
                    .after(Duration::from_secs(3600 + (i % 5) as u64)),
            )
            .await
            .unwrap();
    }
    for i in 0..9 {
        queue
            .schedule_recurring(
                Recurring::every(Duration::from_secs(7200 + i as u64)).id(format!("rec-{i}")),
            )
            .await
            .unwrap();
    }
    for i in 0..7 {
        queue
            .schedule(Task::new("p").id(format!("fly-{i}")))
            .await
            .unwrap();
    }
    let mut deliveries = queue.deliveries();
    let mut held = Vec::new();
    for _ in 0..7 {
        held.push(
            tokio::time::timeout(Duration::from_secs(10), deliveries.next())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let app = router(queue.clone());

    for (path, filter) in [
        (
            "/tasks/pending?limit=4",
            tokio_wheel_durable::TaskFilter::Pending,
        ),
        ("/tasks/dead?limit=5", tokio_wheel_durable::TaskFilter::Dead),
        (
            "/tasks/in-flight?limit=3",
            tokio_wheel_durable::TaskFilter::InFlight,
        ),
    ] {
        let shown = page_through(&app, path, false).await;
        let expected: Vec<String> = queue
            .list(filter, None, 1000)
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.id.as_str().to_owned())
            .collect();
        assert_eq!(shown, expected, "{path}");
    }
    let shown = page_through(&app, "/recurring?limit=4", true).await;
    let mut sorted = shown.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), shown.len(), "listed twice: {shown:?}");
    assert_eq!(
        sorted,
        (0..9).map(|i| format!("rec-{i}")).collect::<Vec<_>>()
    );

    // A cursor of another list, a broken one, limits out of range: 400, never a 500.
    let dead_page = get(&app, "/tasks/dead?limit=5").await;
    let next = next_page(&dead_page.body).unwrap();
    let cursor = &next[next.find("cursor=").unwrap() + 7..];
    let cursor = cursor.split('&').next().unwrap();
    for path in [
        format!("/tasks/pending?cursor={cursor}"),
        format!("/tasks/in-flight?cursor={cursor}"),
        format!("/recurring?cursor={cursor}"),
        "/tasks/pending?cursor=p.1.2".to_owned(),
        "/tasks/pending?cursor=p.99999999999999999999999.1.61".to_owned(),
        "/tasks/dead?cursor=".to_owned(),
        "/tasks/pending?limit=0".to_owned(),
        "/tasks/pending?limit=501".to_owned(),
        "/tasks/pending?limit=18446744073709551616".to_owned(),
        "/recurring?limit=0".to_owned(),
    ] {
        let reply = get(&app, &path).await;
        assert!(
            reply.status == StatusCode::BAD_REQUEST || reply.status == StatusCode::OK,
            "{path}: {reply:?}"
        );
        if path.contains("limit=") || path.contains(cursor) {
            assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{path}: {reply:?}");
        }
    }
    drop(held);
    drop(deliveries);
    queue.close().await;
}

// ---------------------------------------------------------------------------------------
// Payloads.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_utf8_payload_cut_at_64_kib_shows_only_characters_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = open_file(&dir, &wheel).await;
    // 65 535 bytes of 'a', then a two-byte 'é' across the 64 KiB line.
    let mut payload = "a".repeat(65_535);
    payload.push_str("étail");
    queue
        .schedule(
            Task::new(payload)
                .id("cut")
                .after(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    queue
        .schedule(
            Task::new(vec![b'x'; 10 << 20])
                .id("huge")
                .after(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    let app = router(queue.clone());
    let huge = get(&app, "/task?id=huge").await;
    assert_eq!(huge.status, StatusCode::OK);
    assert!(
        huge.body.len() < 200_000,
        "a 10 MB payload shows its first 64 KiB only"
    );
    let page = get(&app, "/task?id=cut").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("UTF-8 text"), "{page:?}");
    let shown = &page.body[page.body.find("<pre id=payload").unwrap()..];
    let shown = &shown[..shown.find("</pre>").unwrap()];
    assert!(
        !shown.contains('\u{FFFD}'),
        "the payload is valid UTF-8, yet the page shows a U+FFFD it does not hold: ...{}",
        &shown[shown.len().saturating_sub(40)..]
    );
    queue.close().await;
}

// ---------------------------------------------------------------------------------------
// Robustness: a closed queue.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_queue_is_answered_with_an_error_page_quickly() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = open_file(&dir, &wheel).await;
    queue
        .schedule(Task::new("p").id("t").after(Duration::from_secs(3600)))
        .await
        .unwrap();
    let app = Dashboard::new(queue.clone())
        .call_timeout(Duration::from_secs(2))
        .router();
    let token = csrf(&get(&app, "/").await.body);
    queue.close().await;
    for path in [
        "/",
        "/tasks/pending",
        "/tasks/dead",
        "/recurring",
        "/task?id=t",
    ] {
        let started = std::time::Instant::now();
        let reply = get(&app, path).await;
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{path} took {:?}",
            started.elapsed()
        );
        assert!(reply.status.is_server_error(), "{path}: {reply:?}");
        assert_ne!(reply.status.as_u16(), PANICKED, "{path}: {reply:?}");
        assert!(reply.body.contains("id=error"), "{path}: {reply:?}");
    }
    let reply = post(&app, "/actions/pause", &format!("csrf={token}")).await;
    assert!(reply.status.is_server_error(), "{reply:?}");
    assert_ne!(reply.status.as_u16(), PANICKED, "{reply:?}");
}

// ---------------------------------------------------------------------------------------
// read-only, token, mounting.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_board_answers_every_post_with_403_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = open_file(&dir, &wheel).await;
    dead_letter(&queue, "dead", "boom").await;
    queue
        .schedule(Task::new("p").id("t").after(Duration::from_secs(3600)))
        .await
        .unwrap();
    queue
        .schedule_recurring(Recurring::every(Duration::from_secs(3600)).id("sweep"))
        .await
        .unwrap();
    // A token taken from an ordinary board on the same queue.
    let token = csrf(&get(&router(queue.clone()), "/").await.body);
    let app = Dashboard::new(queue.clone()).read_only(true).router();
    for page in [
        "/",
        "/task?id=t",
        "/task?id=dead",
        "/recurring",
        "/tasks/dead",
    ] {
        let body = get(&app, page).await.body;
        assert!(!body.contains("method=post"), "{page} shows an action");
    }
    let mut not_403 = Vec::new();
    for path in [
        "/actions/cancel",
        "/actions/reschedule",
        "/actions/redrive",
        "/actions/redrive-all",
        "/actions/purge",
        "/actions/pause",
        "/actions/resume",
        "/actions/cancel-recurring",
        "/",
        "/task",
        "/tasks/pending",
        "/recurring",
        "/actions/anything",
        "/nope",
    ] {
        let reply = post(
            &app,
            path,
            &format!("csrf={token}&id=t&when=1m&older_than=0s&confirm=yes"),
        )
        .await;
        if reply.status != StatusCode::FORBIDDEN {
            not_403.push(format!("POST {path}: {}", reply.status));
        }
    }
    assert_eq!(state_of(&queue, "t").await, Some(TaskState::Pending));
    assert!(matches!(
        state_of(&queue, "dead").await,
        Some(TaskState::Dead { .. })
    ));
    assert!(!queue.is_paused().await.unwrap());
    assert_eq!(queue.recurring_page(None, 10).await.unwrap().items.len(), 1);
    assert!(
        not_403.is_empty(),
        "--read-only \"answers every POST with 403\": {not_403:#?}"
    );
    queue.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mounted_board_with_a_token_asks_for_it_everywhere_and_redirects_under_its_prefix() {
    const SECRET: &str = "mount-secret-42";
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = open_file(&dir, &wheel).await;
    dead_letter(&queue, "dead", "boom").await;
    let app = Router::new().nest(
        "/queue",
        Dashboard::new(queue.clone()).token(SECRET).router(),
    );
    for path in [
        "/queue",
        "/queue/tasks/pending",
        "/queue/task?id=dead",
        "/queue/recurring",
        "/queue/nope",
        "/queue/actions/pause",
        "/queue/favicon.ico",
        "/queue?token=wrong",
    ] {
        let reply = get(&app, path).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{path}: {reply:?}");
        assert!(!reply.body.contains(SECRET));
    }
    let reply = post(&app, "/queue/actions/pause", "csrf=x").await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{reply:?}");
    // ?token= becomes a cookie; the browser is sent on, under the prefix, without it.
    let reply = get(&app, &format!("/queue/tasks/dead?limit=3&token={SECRET}")).await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{reply:?}");
    let location = reply.headers[header::LOCATION].to_str().unwrap();
    assert_eq!(location, "/queue/tasks/dead?limit=3");
    let cookie = reply.headers[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_owned();
    let overview = send(
        &app,
        Request::get("/queue")
            .header(header::COOKIE, &pair)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    let token = csrf(&overview.body);
    let page = send(
        &app,
        Request::get("/queue/tasks/dead")
            .header(header::COOKIE, &pair)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(!page.body.contains(SECRET), "the token is not in the page");
    assert_eq!(listed_ids(&page.body), ["dead"]);
    assert!(
        page.body.contains("href=\"/queue/task?id=dead\""),
        "{page:?}"
    );
    // An action through the cookie lands under the prefix.
    let reply = send(
        &app,
        Request::post("/queue/actions/redrive")
            .header(header::COOKIE, &pair)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(format!("csrf={token}&id=dead")))
            .unwrap(),
    )
    .await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{reply:?}");
    let location = reply.headers[header::LOCATION].to_str().unwrap();
    assert!(location.starts_with("/queue/"), "{location}");
    assert!(!location.contains(SECRET));
    assert_eq!(state_of(&queue, "dead").await, Some(TaskState::Pending));
    queue.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_is_refused_without_the_boards_own_token_or_from_another_site_or_by_get() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = open_file(&dir, &wheel).await;
    queue
        .schedule(Task::new("p").id("t").after(Duration::from_secs(3600)))
        .await
        .unwrap();
    let app = router(queue.clone());
    let other = router(queue.clone());
    let mine = csrf(&get(&app, "/").await.body);
    let theirs = csrf(&get(&other, "/").await.body);
    assert_ne!(mine, theirs);
    let form = |token: &str| format!("csrf={token}&id=t&confirm=yes");
    let refused = |reply: &Reply| reply.status.is_client_error();
    assert!(refused(
        &post(&app, "/actions/cancel", "id=t&confirm=yes").await
    ));
    assert!(refused(
        &post(&app, "/actions/cancel", &form(&theirs)).await
    ));
    assert!(refused(
        &post(&app, "/actions/cancel", &form(&mine.to_uppercase())).await
    ));
    assert!(refused(
        &post(&app, "/actions/cancel", &form(&mine[..32])).await
    ));
    assert!(refused(
        &post(&app, "/actions/cancel", &format!("{}&csrf=0", form(&mine))).await
    ));
    for site in ["cross-site"] {
        let reply = send(
            &app,
            Request::post("/actions/cancel")
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .header("sec-fetch-site", site)
                .body(Body::from(form(&mine)))
                .unwrap(),
        )
        .await;
        assert!(refused(&reply), "{site}: {reply:?}");
    }
    let reply = get(&app, &format!("/actions/cancel?{}", form(&mine))).await;
    assert!(refused(&reply), "GET acts: {reply:?}");
    let reply = send(
        &app,
        Request::post("/actions/cancel")
            .header(header::CONTENT_TYPE, "text/plain")
            .body(Body::from(form(&mine)))
            .unwrap(),
    )
    .await;
    assert!(refused(&reply), "text/plain: {reply:?}");
    assert_eq!(state_of(&queue, "t").await, Some(TaskState::Pending));
    queue.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recurring_schedules_task_page_says_it_is_a_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = open_file(&dir, &wheel).await;
    queue
        .schedule_recurring(Recurring::cron("0 0 6 * * MON-FRI").unwrap().id("report"))
        .await
        .unwrap();
    let app = router(queue.clone());
    let token = csrf(&get(&app, "/").await.body);
    let page = get(&app, "/task?id=report").await;
    let (_, notice) = act(&app, &token, "/actions/cancel", "id=report&confirm=yes").await;
    // The page shows "state pending" with a Cancel; pressing it answers "was not pending".
    let main = &page.body[page.body.find("<main>").unwrap()..];
    assert!(
        main.to_lowercase().contains("recurring") || !notice.contains("not pending"),
        "the task page of schedule `report` says it is pending and offers Cancel, whose \
         answer is {notice:?}"
    );
    queue.close().await;
}
