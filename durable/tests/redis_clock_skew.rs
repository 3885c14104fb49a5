//! The Redis-shared queue with a worker whose clock is off: a second worker process runs a
//! minute ahead under libfaketime (API.md §4a "one clock decides": due times and leases are
//! judged by the server's `TIME`). It gets no task early and takes no live lease.
#![cfg(feature = "redis")]

mod support;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{Deliveries, Delivery, DurableQueue, Task};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

async fn next(deliveries: &mut Deliveries) -> Delivery {
    tokio::time::timeout(Duration::from_secs(5), deliveries.next())
        .await
        .expect("a delivery within 5 s")
        .expect("the stream is open")
}

const SKEW_URL: &str = "TOKIO_WHEEL_SKEW_URL";
const SKEW_LOG: &str = "TOKIO_WHEEL_SKEW_LOG";

/// The skewed worker: started by the test under `faketime`, a minute ahead. Logs its clock,
/// then every delivery, and acks.
#[test]
#[ignore = "run by a_worker_whose_clock_is_ahead_gets_nothing_early_and_takes_no_live_lease"]
fn skewed_worker() {
    let url = std::env::var(SKEW_URL).expect("started by the skew test");
    let log = support::LineLog::open(std::env::var(SKEW_LOG).unwrap());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let wheel = Wheel::new();
        let queue = DurableQueue::builder()
            .lease(Duration::from_secs(30))
            .redis(&url, "skew", &wheel)
            .await
            .unwrap();
        let clock = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        log.line(format!("C {}", clock.as_millis()));
        let mut deliveries = queue.deliveries();
        let consume = async {
            while let Some(d) = deliveries.next().await {
                log.line(format!("D {}", d.id()));
                d.ack().await.unwrap();
            }
        };
        // Never outlive the test that started it.
        let _ = tokio::time::timeout(Duration::from_secs(60), consume).await;
    });
}

/// libfaketime, preloaded into the skewed worker directly (the `faketime` wrapper forks, and
/// killing it would orphan the worker). `None`, after saying why, when it is not installed: a
/// failure in CI, where `.ci/run` installs it.
fn libfaketime() -> Option<std::path::PathBuf> {
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/faketime/libfaketime.so.1",
    ];
    let found = candidates
        .iter()
        .map(std::path::PathBuf::from)
        .find(|path| path.exists());
    if found.is_none() {
        let message = "libfaketime is not installed (`apt-get install -y faketime`): the \
                       clock-skew test needs it";
        if std::env::var_os("CI").is_some() {
            panic!("{message}");
        }
        eprintln!("SKIPPED: {message}");
    }
    found
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Issue 12 item 3: a second worker process runs under `faketime` a minute ahead. It gets no
/// task before its due time (neither `after` nor `at`), and does not take a task another
/// worker holds under a live 30 s lease.
#[test]
fn a_worker_whose_clock_is_ahead_gets_nothing_early_and_takes_no_live_lease() {
    let Some(server) = support::redis_server::start() else {
        return;
    };
    let Some(libfaketime) = libfaketime() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let wheel = runtime.block_on(async { Wheel::new() });
    let queue = runtime
        .block_on(
            DurableQueue::builder()
                .lease(Duration::from_secs(30))
                .redis(&server.url(), "skew", &wheel),
        )
        .unwrap();
    let held = runtime.block_on(async {
        queue.schedule(Task::new("h").id("held")).await.unwrap();
        let mut deliveries = queue.deliveries();
        next(&mut deliveries).await
    });
    assert_eq!(held.id().as_str(), "held");

    // The worker's wall clock runs 60 s ahead; its monotonic clock (Tokio's) stays true.
    let _worker = Running(
        Command::new(std::env::current_exe().unwrap())
            .args(["skewed_worker", "--exact", "--ignored", "--nocapture"])
            .env("LD_PRELOAD", libfaketime)
            .env("FAKETIME", "+60s")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env(SKEW_URL, server.url())
            .env(SKEW_LOG, &log)
            .stdout(Stdio::null())
            .spawn()
            .expect("start the skewed worker"),
    );
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let start = Instant::now();
    let worker_clock = loop {
        if let Some(ms) = read().lines().find_map(|l| l.strip_prefix("C ")) {
            break ms.parse::<u128>().unwrap();
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the worker never started"
        );
        std::thread::sleep(ms(5));
    };
    let ours = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let skew = worker_clock as i128 - ours as i128;
    assert!(
        (50_000..70_000).contains(&skew),
        "the worker's clock is not a minute ahead (skew {skew} ms): the fault was not injected"
    );
    std::thread::sleep(ms(300)); // the worker is idle and waiting

    let scheduled = SystemTime::now();
    runtime.block_on(async {
        queue
            .schedule(Task::new("a").id("after").after(ms(1_500)))
            .await
            .unwrap();
        queue
            .schedule(Task::new("b").id("at").at(scheduled + ms(1_500)))
            .await
            .unwrap();
    });
    let mut arrived: HashMap<String, SystemTime> = HashMap::new();
    while arrived.len() < 2 {
        for line in read().lines() {
            if let Some(id) = line.strip_prefix("D ") {
                arrived.entry(id.to_owned()).or_insert_with(SystemTime::now);
            }
        }
        assert!(
            scheduled.elapsed().unwrap() < Duration::from_secs(15),
            "not delivered: {arrived:?}"
        );
        std::thread::sleep(ms(2));
    }
    for id in ["after", "at"] {
        let early = (scheduled + ms(1_500))
            .duration_since(arrived[id])
            .unwrap_or_default();
        // The log is read by polling, so arrival is if anything noted late, never early;
        // 10 ms covers the two machines' millisecond rounding.
        assert!(
            early <= ms(10),
            "{id} reached the skewed worker {early:?} early"
        );
    }
    assert!(
        !arrived.contains_key("held"),
        "the skewed worker took a task under a live lease"
    );
    runtime.block_on(async {
        held.ack().await.expect("the lease was never taken");
        assert_eq!(queue.len().await.unwrap(), 0);
    });
}
