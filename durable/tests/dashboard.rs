//! The board over HTTP, without a browser: what a client that is not a browser meets (status
//! codes, the anti-forgery check, the token, the safety headers), the chart's counting, and
//! that looking never opens the handle that writes. The pages themselves are tested in a
//! browser (`dashboard_browser.rs`).
#![cfg(feature = "dashboard")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};

use futures::StreamExt;
use support::board::{csrf, get, post, send};
use tokio_wheel::Wheel;
use tokio_wheel_durable::dashboard::{Dashboard, router};
use tokio_wheel_durable::{DurableQueue, Task, TaskId};

async fn queue_with_a_task(dir: &tempfile::TempDir, wheel: &Wheel) -> DurableQueue {
    let queue = DurableQueue::open(dir.path().join("tasks.redb"), wheel)
        .await
        .unwrap();
    let task = Task::new("p").id("a/b c").after(Duration::from_secs(3600));
    queue.schedule(task).await.unwrap();
    queue
}

#[tokio::test]
async fn an_action_needs_the_pages_token_from_the_same_site_and_a_tick() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = queue_with_a_task(&dir, &wheel).await;
    let app = router(queue.clone());
    let page = get(&app, "/task?id=a%2Fb%20c").await;
    assert_eq!(page.status, StatusCode::OK);
    let token = csrf(&page.body);
    let id = TaskId::from("a/b c");

    let no_token = post(&app, "/actions/cancel", "id=a%2Fb+c&confirm=yes").await;
    assert_eq!(no_token.status, StatusCode::FORBIDDEN);
    let wrong = format!("id=a%2Fb+c&confirm=yes&csrf={}", "0".repeat(64));
    assert_eq!(
        post(&app, "/actions/cancel", &wrong).await.status,
        StatusCode::FORBIDDEN
    );
    let form = format!("id=a%2Fb+c&confirm=yes&csrf={token}");
    let cross = Request::post("/actions/cancel")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header("sec-fetch-site", "cross-site")
        .body(Body::from(form.clone()))
        .unwrap();
    assert_eq!(send(&app, cross).await.status, StatusCode::FORBIDDEN);
    let unticked = post(&app, "/actions/cancel", &format!("id=a%2Fb+c&csrf={token}")).await;
    assert_eq!(unticked.status, StatusCode::BAD_REQUEST);
    assert!(
        queue.get(&id).await.unwrap().is_some(),
        "nothing refused was done"
    );

    let done = post(&app, "/actions/cancel", &form).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    let location = done.headers[header::LOCATION].to_str().unwrap().to_owned();
    assert!(
        location.starts_with("/task?id=a%2Fb%20c&notice="),
        "{location}"
    );
    assert!(queue.get(&id).await.unwrap().is_none());
    let shown = get(&app, &location).await;
    assert!(
        shown.body.contains("Cancelled task a/b c."),
        "{}",
        shown.body
    );
    // Another board has another secret: a token is good for its own board only.
    let other = router(queue.clone());
    let page = get(&other, "/").await;
    assert_ne!(csrf(&page.body), token);
    queue.close().await;
}

#[tokio::test]
async fn a_read_only_board_shows_no_action_and_refuses_every_post() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = queue_with_a_task(&dir, &wheel).await;
    let app = Dashboard::new(queue.clone()).read_only(true).router();
    for path in ["/", "/task?id=a%2Fb%20c", "/recurring"] {
        let page = get(&app, path).await;
        assert_eq!(page.status, StatusCode::OK);
        assert!(!page.body.contains("<form class=\"action"), "{path}");
    }
    for action in ["cancel", "pause", "purge", "redrive-all", "anything"] {
        let reply = post(
            &app,
            &format!("/actions/{action}"),
            "id=a%2Fb+c&confirm=yes",
        )
        .await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{action}");
    }
    assert!(!queue.is_paused().await.unwrap());
    assert!(queue.get(&TaskId::from("a/b c")).await.unwrap().is_some());
    queue.close().await;
}

#[tokio::test]
async fn a_token_is_needed_for_every_request_and_becomes_a_cookie() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = queue_with_a_task(&dir, &wheel).await;
    let app = Dashboard::new(queue.clone()).token("s3cret-token").router();
    for path in ["/", "/tasks/pending", "/task?id=x", "/nowhere"] {
        assert_eq!(
            get(&app, path).await.status,
            StatusCode::UNAUTHORIZED,
            "{path}"
        );
    }
    assert_eq!(
        post(&app, "/actions/pause", "").await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        get(&app, "/?token=wrong").await.status,
        StatusCode::UNAUTHORIZED
    );
    let bearer = Request::get("/")
        .header(header::AUTHORIZATION, "Bearer s3cret-token")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, bearer).await.status, StatusCode::OK);
    let given = get(&app, "/tasks/pending?token=s3cret-token&limit=5").await;
    assert_eq!(given.status, StatusCode::SEE_OTHER);
    assert_eq!(given.headers[header::LOCATION], "/tasks/pending?limit=5");
    let cookie = given.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
    let pair = cookie.split(';').next().unwrap().to_owned();
    let with_cookie = Request::get("/tasks/pending?limit=5")
        .header(header::COOKIE, pair)
        .body(Body::empty())
        .unwrap();
    let page = send(&app, with_cookie).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("a/b c"));
    queue.close().await;
}

#[tokio::test]
async fn every_answer_forbids_scripts_and_framing() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = queue_with_a_task(&dir, &wheel).await;
    let app = router(queue.clone());
    let tokened = Dashboard::new(queue.clone()).token("t").router();
    for reply in [
        get(&app, "/").await,
        get(&app, "/nowhere").await,
        get(&app, "/tasks/nothing").await,
        get(&app, "/task?id=missing").await,
        post(&app, "/actions/cancel", "").await,
        get(&tokened, "/").await,
    ] {
        let policy = reply.headers[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap();
        assert!(policy.contains("default-src 'none'"), "{policy}");
        assert!(
            !policy.contains("script-src"),
            "no script is ever allowed: {policy}"
        );
        assert!(policy.contains("frame-ancestors 'none'"));
        assert_eq!(reply.headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    }
    queue.close().await;
}

#[tokio::test]
async fn bad_addresses_are_answered_plainly() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = queue_with_a_task(&dir, &wheel).await;
    let app = router(queue.clone());
    assert_eq!(
        get(&app, "/tasks/nothing").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(get(&app, "/nowhere").await.status, StatusCode::NOT_FOUND);
    assert_eq!(
        get(&app, "/task?id=missing").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(get(&app, "/task").await.status, StatusCode::BAD_REQUEST);
    let bad_cursor = get(&app, "/tasks/pending?cursor=%3Cnot-one%3E").await;
    assert_eq!(bad_cursor.status, StatusCode::BAD_REQUEST);
    assert!(
        bad_cursor.body.contains("&lt;not-one&gt;"),
        "escaped in the answer"
    );
    assert_eq!(
        get(&app, "/tasks/pending?limit=0").await.status,
        StatusCode::BAD_REQUEST
    );
    // A cursor of another list is refused by the queue itself.
    let page = get(&app, "/tasks/pending?limit=1").await;
    assert_eq!(page.status, StatusCode::OK);
    queue.close().await;
    // A closed queue: the store does not answer.
    let closed = get(&app, "/").await;
    assert_eq!(closed.status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn links_follow_where_the_board_is_mounted() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = queue_with_a_task(&dir, &wheel).await;
    let app = Router::new().nest("/ops/queue", router(queue.clone()));
    let page = get(&app, "/ops/queue").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("href=\"/ops/queue/tasks/pending\""));
    assert!(page.body.contains("action=\"/ops/queue/task\""));
    assert!(page.body.contains("href=\"/ops/queue/task?id=a%2Fb%20c\""));
    let form = format!("csrf={}", csrf(&page.body));
    let done = post(&app, "/ops/queue/actions/pause", &form).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    let location = done.headers[header::LOCATION].to_str().unwrap();
    assert!(location.starts_with("/ops/queue?notice="), "{location}");
    assert!(queue.is_paused().await.unwrap());
    queue.close().await;
}

#[tokio::test]
async fn looking_never_opens_the_handle_that_writes() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = queue_with_a_task(&dir, &wheel).await;
    let opened = Arc::new(AtomicUsize::new(0));
    let app = {
        let (opened, queue) = (Arc::clone(&opened), queue.clone());
        Dashboard::new(queue.clone())
            .act_through(move || {
                opened.fetch_add(1, Ordering::SeqCst);
                let queue = queue.clone();
                async move { Ok(queue) }
            })
            .router()
    };
    let page = get(&app, "/").await;
    for path in [
        "/tasks/pending",
        "/tasks/dead",
        "/recurring",
        "/task?id=a%2Fb%20c",
    ] {
        assert_eq!(get(&app, path).await.status, StatusCode::OK);
    }
    assert_eq!(opened.load(Ordering::SeqCst), 0);
    let form = format!("csrf={}", csrf(&page.body));
    assert_eq!(
        post(&app, "/actions/pause", &form).await.status,
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        post(&app, "/actions/resume", &form).await.status,
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        opened.load(Ordering::SeqCst),
        1,
        "opened once, at the first action"
    );
    queue.close().await;
}

/// The number in `<b id={id}>N</b>`.
fn figure(page: &str, id: &str) -> u64 {
    let start = page.find(&format!("<b id={id}>")).unwrap() + id.len() + 7;
    page[start..].split('<').next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn the_chart_counts_deliveries_and_failures_from_the_queues_counters() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = Wheel::new();
    let queue = DurableQueue::open(dir.path().join("tasks.redb"), &wheel)
        .await
        .unwrap();
    let app = Dashboard::new(queue.clone())
        .sample_every(Duration::from_millis(100))
        .router();
    // The first reading, before anything is delivered.
    let page = get(&app, "/").await;
    assert_eq!(figure(&page.body, "chart-delivered"), 0);
    for i in 0..4 {
        queue
            .schedule(Task::new("x").id(format!("t{i}")))
            .await
            .unwrap();
    }
    let mut deliveries = queue.deliveries();
    for i in 0..4 {
        let delivery = deliveries.next().await.unwrap();
        if i == 0 {
            delivery.fail("no").await.unwrap();
        } else {
            delivery.ack().await.unwrap();
        }
    }
    let (mut delivered, mut failed) = (0, 0);
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let page = get(&app, "/").await;
        (delivered, failed) = (
            figure(&page.body, "chart-delivered"),
            figure(&page.body, "chart-failed"),
        );
        if delivered == 4 {
            break;
        }
    }
    assert_eq!((delivered, failed), (4, 1));
    queue.close().await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_board_pages_through_every_partition_of_a_redis_cluster_queue() {
    let Some(cluster) = support::redis_cluster::start() else {
        return;
    };
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .partitions(3)
        .redis_cluster(&urls, "board", &wheel)
        .await
        .unwrap();
    for i in 0..30 {
        let task = Task::new("x")
            .id(format!("c-{i:02}"))
            .after(Duration::from_secs(3600 + i));
        queue.schedule(task).await.unwrap();
    }
    let looking = DurableQueue::builder()
        .read_only(true)
        .redis_cluster(&urls, "board", &wheel)
        .await
        .unwrap();
    let app = Dashboard::new(looking.clone())
        .act_through({
            let queue = queue.clone();
            move || {
                let queue = queue.clone();
                async move { Ok(queue) }
            }
        })
        .router();
    let overview = get(&app, "/").await;
    assert_eq!(overview.status, StatusCode::OK);
    assert!(
        overview.body.contains("<div class=n>30</div>"),
        "30 pending"
    );
    // Every task once across the three partitions, 7 a page (due order holds within a
    // partition: the list goes partition by partition, as `list_page` does).
    let mut seen = Vec::new();
    let mut path = "/tasks/pending?limit=7".to_owned();
    loop {
        let page = get(&app, &path).await;
        assert_eq!(page.status, StatusCode::OK);
        for piece in page.body.split("class=task-link href=\"/task?id=").skip(1) {
            seen.push(piece.split('"').next().unwrap().to_owned());
        }
        let Some(at) = page.body.find("id=next-page href=\"") else {
            break;
        };
        let rest = &page.body[at + "id=next-page href=\"".len()..];
        path = rest.split('"').next().unwrap().replace("&amp;", "&");
    }
    let expected: Vec<String> = (0..30).map(|i| format!("c-{i:02}")).collect();
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(sorted, expected, "each task once: {seen:?}");
    let form = format!("id=c-05&confirm=yes&csrf={}", csrf(&overview.body));
    assert_eq!(
        post(&app, "/actions/cancel", &form).await.status,
        StatusCode::SEE_OTHER
    );
    assert!(queue.get(&TaskId::from("c-05")).await.unwrap().is_none());
    looking.close().await;
    queue.close().await;
}
