//! An open embedded store's memory is bounded by its index, not by the payloads. A store is
//! filled with pending tasks of 1 KiB, then a fresh child process opens it, checks that every
//! task reloaded, pages through it and takes deliveries, counting its heap all along.
//!
//! Facts asserted (no wall-clock bound: a loaded 2-core machine would miss one): everything
//! reloads; the heap's high-water mark stays under redb's page cache (32 MiB) plus 64 bytes per
//! pending task plus 16 MiB, well below the payloads' size; peak resident memory under 200 MiB. The open time is
//! printed, and measured for real by `cargo run --release -p tokio-wheel-durable --example
//! durable_bench -- --huge`.
//!
//! Default: 10^5 tasks (a 100 MB backlog). `TOKIO_WHEEL_FULL=1`: 10^6 tasks (about 1 GB).

#[path = "../../tests/support/counting.rs"]
mod counting;
#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{DurableQueue, Task, TaskFilter};

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

/// The child: opens the store, uses it, prints `open_ms rss_bytes heap_peak_growth_bytes`.
#[test]
#[ignore = "run by a_big_backlog_opens_fast_in_bounded_memory as its child process"]
fn memory_child() {
    let path = std::env::var(CHILD_STORE).expect("started by the memory test");
    let count: u64 = std::env::var(CHILD_COUNT).unwrap().parse().unwrap();
    let runtime = two_workers();
    runtime.block_on(async move {
        let wheel = Wheel::new();
        counting::reset_peak();
        let baseline = counting::LIVE.load(std::sync::atomic::Ordering::Relaxed);
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
        let heap = counting::PEAK.load(std::sync::atomic::Ordering::Relaxed) - baseline;
        println!("RESULT {} {} {heap}", open.as_millis(), peak_rss());
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
    let (open_ms, rss, heap) = (
        fields.next().unwrap(),
        fields.next().unwrap(),
        fields.next().unwrap(),
    );
    eprintln!(
        "{count} pending tasks of 1 KiB ({} MB file, filled in {filled:?}): opened in {open_ms} ms, \
         heap high-water {} KiB, peak RSS {} MiB",
        size / 1_000_000,
        heap >> 10,
        rss >> 20
    );
    // redb's page cache (32 MiB) + the index (64 B a task) + 16 MiB for everything else.
    let index_bound = (32 << 20) + count as u64 * 64 + (16 << 20);
    assert!(
        heap < index_bound,
        "heap grew by {heap} bytes: over cache + 64 B per task + 16 MiB ({index_bound}); payloads total {}",
        count * 1024
    );
    assert!(rss < 200 << 20, "peak RSS {} MiB", rss >> 20);
}
