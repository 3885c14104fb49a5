//! Issue 13: an open embedded store's memory is bounded by what it has in flight, not by the
//! backlog or the payloads. A store is filled with pending tasks, then a fresh child process
//! opens it, reads its length and stats, pages through it, takes deliveries, and reports its
//! open time and peak resident memory.
//!
//! Default: 10^5 tasks of 1 KiB (a 100 MB backlog). `TOKIO_WHEEL_FULL=1`: 10^6 tasks of
//! 1 KiB (about 1 GB). Either way the child must open in under 3 s with under 200 MiB peak RSS.
#![cfg(feature = "durable")]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel::durable::{DurableQueue, Task, TaskFilter};

const CHILD_STORE: &str = "TOKIO_WHEEL_MEMORY_STORE";
const CHILD_COUNT: &str = "TOKIO_WHEEL_MEMORY_COUNT";

/// Peak resident memory of this process (Linux `VmHWM`), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The child: opens the store, uses it, prints `open_ms rss_bytes`.
#[test]
#[ignore = "run by a_big_backlog_opens_fast_in_bounded_memory as its child process"]
fn memory_child() {
    let path = std::env::var(CHILD_STORE).expect("started by the memory test");
    let count: u64 = std::env::var(CHILD_COUNT).unwrap().parse().unwrap();
    let runtime = two_workers();
    runtime.block_on(async move {
        let wheel = Wheel::new();
        let start = Instant::now();
        let queue = DurableQueue::builder()
            .prefetch(64)
            .open(&path, &wheel)
            .await
            .expect("open");
        assert_eq!(queue.len().await.unwrap() as u64, count);
        let open = start.elapsed();
        let stats = queue.stats().await.unwrap();
        assert_eq!(stats.pending, count);
        // Page through a good part of it, and take deliveries (payloads read at hand-out).
        let mut after = None;
        for _ in 0..50 {
            let page = queue
                .list(TaskFilter::Pending, after.as_ref(), 1_000)
                .await
                .unwrap();
            after = page.last().map(|t| t.id.clone());
        }
        let mut deliveries = queue.deliveries();
        for _ in 0..1_000 {
            let d = tokio::time::timeout(Duration::from_secs(10), deliveries.next())
                .await
                .expect("a delivery")
                .unwrap();
            assert_eq!(d.payload().len(), 1024);
            d.ack().await.unwrap();
        }
        drop(deliveries);
        queue.close().await;
        println!("RESULT {} {}", open.as_millis(), peak_rss());
    });
}

/// A runtime like the application's: two workers.
fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn fill(path: &Path, count: usize) {
    let runtime = two_workers();
    runtime.block_on(async move {
        let wheel = Wheel::new();
        let queue = DurableQueue::open(path, &wheel).await.unwrap();
        let producers: Vec<_> = (0..256)
            .map(|p| {
                let queue = queue.clone();
                tokio::spawn(async move {
                    for i in (p..count).step_by(256) {
                        // A tenth due now (delivered by the child), the rest in an hour.
                        let due = if i % 10 == 0 {
                            SystemTime::now()
                        } else {
                            SystemTime::now() + Duration::from_secs(3_600)
                        };
                        let task = Task::new(vec![(i % 251) as u8; 1024]).at(due);
                        queue.schedule(task).await.unwrap();
                    }
                })
            })
            .collect();
        for producer in producers {
            producer.await.unwrap();
        }
        queue.close().await;
    });
}

#[test]
fn a_big_backlog_opens_fast_in_bounded_memory() {
    let count = if std::env::var_os("TOKIO_WHEEL_FULL").is_some() {
        1_000_000
    } else {
        100_000
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("backlog.redb");
    let start = Instant::now();
    fill(&path, count);
    let filled = start.elapsed();
    let size = std::fs::metadata(&path).unwrap().len();
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "memory_child", "--ignored", "--nocapture"])
        .env(CHILD_STORE, &path)
        .env(CHILD_COUNT, count.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result = stdout
        .lines()
        .find_map(|line| line.strip_prefix("RESULT "))
        .expect("the child's result");
    let mut fields = result.split(' ').map(|f| f.parse::<u64>().unwrap());
    let (open_ms, rss) = (fields.next().unwrap(), fields.next().unwrap());
    eprintln!(
        "{count} pending tasks of 1 KiB ({} MB file, filled in {filled:?}): opened in {open_ms} ms, \
         peak RSS {} MiB",
        size / 1_000_000,
        rss >> 20
    );
    assert!(open_ms < 3_000, "opening took {open_ms} ms");
    assert!(rss < 200 << 20, "peak RSS {} MiB", rss >> 20);
}
