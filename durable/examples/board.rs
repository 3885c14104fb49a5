//! The queue's web board on a live queue: a worker acks most tasks, retries some and gives up
//! on a few, while new ones keep coming, so the overview's chart has something to show.
//!
//! Run: `cargo run -p tokio-wheel-durable --features dashboard --example board`, then open
//! <http://127.0.0.1:8080/>. `-- --listen 127.0.0.1:9000` for another address, `-- --for 10s`
//! to stop on its own (it then checks that its own overview answered). The store is a file in
//! a temporary directory, gone when the example ends.

use std::time::Duration;

use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel_durable::dashboard::Dashboard;
use tokio_wheel_durable::{DurableQueue, Recurring, RetryPolicy, Task};

const CUSTOMERS: [&str; 5] = ["acme", "globex", "initech", "umbrella", "hooli"];

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let option = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let listen = option("--listen").unwrap_or_else(|| "127.0.0.1:8080".to_owned());
    let run_for = option("--for").map(|text| {
        let secs = text
            .trim_end_matches('s')
            .parse::<u64>()
            .expect("--for 10s");
        Duration::from_secs(secs)
    });

    let dir = tempfile_dir();
    let wheel = Wheel::new();
    let queue = DurableQueue::builder()
        .retry(
            RetryPolicy::exponential(Duration::from_secs(2), Duration::from_secs(10))
                .max_attempts(3),
        )
        .open(dir.join("tasks.redb"), &wheel)
        .await
        .expect("open the store");

    // A backlog due over the next hour, a markup payload, and a recurring report.
    let backlog = (0..2_000u64).map(|i| {
        let customer = CUSTOMERS[i as usize % CUSTOMERS.len()];
        let payload = format!("{{\"webhook\":\"https://{customer}.example/hooks\",\"event\":{i}}}");
        Task::new(payload)
            .id(format!("webhook-{i:05}"))
            .after(Duration::from_secs(60 + i * 2))
    });
    queue.schedule_many(backlog).await.expect("schedule");
    let markup = "<script>alert('not run')</script><b>shown as text</b>";
    queue
        .schedule(
            Task::new(markup)
                .id("markup-payload")
                .after(Duration::from_secs(7200)),
        )
        .await
        .expect("schedule");
    queue
        .schedule_recurring(Recurring::every(Duration::from_secs(30)).id("sweep-expired-carts"))
        .await
        .expect("recurring");
    queue
        .schedule_recurring(
            Recurring::cron("0 0 * * * *")
                .expect("cron")
                .id("hourly-report"),
        )
        .await
        .expect("recurring");

    // Producers: a few tasks a second, due within seconds.
    let producer = queue.clone();
    tokio::spawn(async move {
        for i in 0u64.. {
            let task = Task::new(format!("{{\"order\":{i}}}"))
                .id(format!("order-{i:06}"))
                .after(Duration::from_millis(500 + (i % 7) * 300));
            if producer.schedule(task).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    });
    // A worker: acks 85 %, retries 10 % (some of which die after their last attempt), fails 5 %.
    let worker = queue.clone();
    tokio::spawn(async move {
        let mut deliveries = worker.deliveries();
        let mut n = 0u64;
        while let Some(delivery) = deliveries.next().await {
            n += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = match n % 20 {
                0 => delivery.fail("the endpoint answered 410 Gone").await,
                1 | 2 => delivery.retry().await,
                _ => delivery.ack().await,
            };
        }
    });

    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .expect("listen (is the port free? -- --listen 127.0.0.1:9000)");
    let address = listener.local_addr().expect("address");
    println!("the board: http://{address}/  (Ctrl-C stops it)");
    let app = Dashboard::new(queue.clone())
        .title("webhooks (demo)")
        .sample_every(Duration::from_secs(5))
        .router();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    match run_for {
        Some(period) => {
            tokio::time::sleep(period).await;
            let overview = fetch(&address.to_string(), "/").await;
            assert!(
                overview.starts_with("HTTP/1.1 200") && overview.contains("Overview"),
                "the overview answered: {overview:.200}"
            );
            let stats = queue.stats().await.expect("stats");
            println!(
                "overview answered; {} pending, {} delivered, {} acked, {} dead",
                stats.pending, stats.delivered, stats.acked, stats.dead
            );
        }
        None => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    server.abort();
    queue.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A directory of this run's own.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tw-board-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}

/// A plain HTTP/1.1 GET, the whole answer as text.
async fn fetch(address: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("read");
    answer
}
