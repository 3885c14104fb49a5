//! How long the board's pages take with a large backlog: 10^6 pending tasks (plus 100 dead
//! letters and 3 recurring schedules), each page asked 21 times in-process (axum router, no
//! network), median and p90 in milliseconds, as a markdown table.
//!
//! Run: `cargo run --release -p tokio-wheel-durable --features dashboard,redis --example
//! board_bench -- [--tasks 1000000] [--redis redis://127.0.0.1:6379/]` (the embedded store
//! in a temporary directory without `--redis`; on Redis the queue `board-bench` is made anew).

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel_durable::dashboard::Dashboard;
use tokio_wheel_durable::{DurableQueue, Recurring, Task};
use tower::ServiceExt;

const ROUNDS: usize = 21;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let option = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let tasks: u64 = option("--tasks").map_or(1_000_000, |t| t.parse().expect("--tasks N"));
    let wheel = Wheel::new();
    let dir = std::env::temp_dir().join(format!("tw-board-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (queue, backend) = match option("--redis") {
        Some(url) => {
            let mut connection = redis::Client::open(url.as_str())
                .unwrap()
                .get_connection()
                .unwrap();
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("tw:{board-bench}*")
                .query(&mut connection)
                .unwrap();
            for key in keys {
                let _: () = redis::cmd("DEL").arg(key).query(&mut connection).unwrap();
            }
            let queue = DurableQueue::builder()
                .redis(&url, "board-bench", &wheel)
                .await
                .unwrap();
            (queue, "Redis")
        }
        None => (
            DurableQueue::open(dir.join("tasks.redb"), &wheel)
                .await
                .unwrap(),
            "embedded",
        ),
    };

    let started = Instant::now();
    let batch = 10_000u64;
    for first in (0..tasks).step_by(batch as usize) {
        let chunk = (first..(first + batch).min(tasks)).map(|i| {
            Task::new(format!("{{\"event\":{i}}}"))
                .id(format!("task-{i:07}"))
                .after(Duration::from_secs(3600 + i / 100))
        });
        for answer in queue.schedule_many(chunk).await.unwrap() {
            answer.unwrap();
        }
    }
    for i in 0..100 {
        queue
            .schedule(Task::new("x").id(format!("dead-{i:03}")))
            .await
            .unwrap();
    }
    let mut deliveries = queue.deliveries();
    for _ in 0..100 {
        let delivery = deliveries.next().await.unwrap();
        delivery.fail("endpoint answered 500").await.unwrap();
    }
    drop(deliveries);
    for (id, period) in [("a", 60), ("b", 600), ("c", 3600)] {
        queue
            .schedule_recurring(Recurring::every(Duration::from_secs(period)).id(id))
            .await
            .unwrap();
    }
    let stats = queue.stats().await.unwrap();
    eprintln!(
        "{backend}: {} pending, {} dead, filled in {:.1} s",
        stats.pending,
        stats.dead,
        started.elapsed().as_secs_f64()
    );

    let app = Dashboard::new(queue.clone()).router();
    // The cursor twenty pages in, as an operator paging along would hold it.
    let mut deep = "/tasks/pending".to_owned();
    for _ in 0..20 {
        let body = get(&app, &deep).await.1;
        let at = body.find("id=next-page href=\"").expect("a next page") + 19;
        deep = body[at..].split('"').next().unwrap().replace("&amp;", "&");
    }
    let middle = format!("/task?id=task-{:07}", tasks / 2);
    let pages: [(&str, &str); 8] = [
        ("overview", "/"),
        ("pending, first page (50)", "/tasks/pending"),
        ("pending, page 21 (cursor)", &deep),
        ("pending, 500 a page", "/tasks/pending?limit=500"),
        ("dead letters", "/tasks/dead"),
        ("task page (search hit)", &middle),
        ("search miss", "/task?id=no-such-task"),
        ("recurring schedules", "/recurring"),
    ];
    println!(
        "| page ({backend}, {} pending) | median ms | p90 ms |",
        stats.pending
    );
    println!("|---|---|---|");
    for (name, path) in pages {
        let mut times = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let start = Instant::now();
            let (status, _) = get(&app, path).await;
            times.push(start.elapsed());
            assert!(
                status == StatusCode::OK || status == StatusCode::NOT_FOUND,
                "{path}: {status}"
            );
        }
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "| {name} | {:.2} | {:.2} |",
            ms(times[ROUNDS / 2]),
            ms(times[ROUNDS * 9 / 10])
        );
    }
    queue.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

async fn get(app: &axum::Router, path: &str) -> (StatusCode, String) {
    let request = Request::get(path).body(Body::empty()).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}
