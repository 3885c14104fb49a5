//! Crash test: a child process schedules and acks tasks and is killed with SIGKILL at random
//! points, many times. After the last kill, every task whose `schedule` returned is still
//! delivered (or was acked), and no task whose `ack` returned is ever delivered again.

mod support;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use support::{LineLog, Rng};
use tokio_wheel::Wheel;
use tokio_wheel_durable::{DurableQueue, Error, Task};

const CHILD_DIR: &str = "TOKIO_WHEEL_CRASH_DIR";
const CHILD_RUN: &str = "TOKIO_WHEEL_CRASH_RUN";
const RUNS: u32 = 8;

/// The child: schedules tasks and consumes them (acking most), forever, until killed.
#[test]
#[ignore = "run by killed_children_lose_nothing as its child process"]
fn crash_child() {
    let dir = std::env::var(CHILD_DIR).expect("started by the crash test");
    let run: u64 = std::env::var(CHILD_RUN).unwrap().parse().unwrap();
    // What the child saw succeed.
    let log = LineLog::open(Path::new(&dir).join("log"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let wheel = Wheel::new();
        let queue = DurableQueue::builder()
            .lease(Duration::from_millis(300))
            .open(Path::new(&dir).join("tasks.redb"), &wheel)
            .await
            .expect("the previous child is dead, so the store opens");
        log.line(format!("O {run}"));
        let producer = {
            let (queue, log) = (queue.clone(), log.clone());
            tokio::spawn(async move {
                let mut rng = Rng(run * 7_919 + 1);
                for i in 0.. {
                    let id = format!("r{run}-{i}");
                    let due = SystemTime::now() + Duration::from_millis(rng.below(100));
                    queue
                        .schedule(Task::new(id.clone()).id(id.clone()).at(due))
                        .await
                        .unwrap();
                    log.line(format!("S {id}"));
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        };
        let mut rng = Rng(run * 104_729 + 3);
        let mut deliveries = queue.deliveries();
        while let Some(delivery) = deliveries.next().await {
            let id = delivery.id().to_string();
            log.line(format!("D {run} {id}"));
            if rng.below(10) < 8 {
                log.line(format!("a {run} {id}"));
                delivery.ack().await.unwrap();
                log.line(format!("A {run} {id}"));
            } // else: dropped without ack, as a crashed handler would
        }
        producer.abort();
    });
}

/// The running child, killed however the test ends (a failed assertion must not leave it).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_child(dir: &Path, run: u32) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "crash_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir)
        .env(CHILD_RUN, run.to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn the child")
}

fn log_text(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("log")).unwrap_or_default()
}

#[test]
fn killed_children_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut rng = Rng(0xC0FFEE);
    for run in 0..RUNS {
        let mut child = Running(spawn_child(dir.path(), run));
        let opened = format!("O {run}\n");
        let start = Instant::now();
        while !log_text(dir.path()).contains(&opened) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "child {run} never opened the store"
            );
            if let Some(status) = child.0.try_wait().unwrap() {
                panic!("child {run} exited early: {status}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // While the child holds the store, another process cannot open it.
        runtime.block_on(async {
            let wheel = Wheel::new();
            let locked = DurableQueue::open(dir.path().join("tasks.redb"), &wheel).await;
            assert_eq!(locked.unwrap_err(), Error::Locked);
        });
        std::thread::sleep(Duration::from_millis(100 + rng.below(300)));
        drop(child); // SIGKILL
    }

    // Recover: drain everything that is left.
    let redelivered: Vec<String> = runtime.block_on(async {
        let wheel = Wheel::new();
        let queue = DurableQueue::open(dir.path().join("tasks.redb"), &wheel)
            .await
            .unwrap();
        let mut deliveries = queue.deliveries();
        let mut seen = Vec::new();
        while let Ok(Some(delivery)) =
            tokio::time::timeout(Duration::from_secs(2), deliveries.next()).await
        {
            seen.push(delivery.id().to_string());
            delivery.ack().await.unwrap();
        }
        assert_eq!(queue.len().await.unwrap(), 0);
        seen
    });

    let text = log_text(dir.path());
    let mut scheduled = HashSet::new();
    let mut acked: HashMap<String, u32> = HashMap::new(); // id → run whose ack returned
    let mut ack_started = HashSet::new();
    let mut delivered: Vec<(u32, String)> = Vec::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.as_slice() {
            ["S", id] => {
                scheduled.insert(id.to_string());
            }
            ["D", run, id] => delivered.push((run.parse().unwrap(), id.to_string())),
            ["a", _, id] => {
                ack_started.insert(id.to_string());
            }
            ["A", run, id] => {
                acked.insert(id.to_string(), run.parse().unwrap());
            }
            _ => {}
        }
    }
    assert!(
        scheduled.len() > 100,
        "too little happened to test: {} scheduled",
        scheduled.len()
    );
    assert!(!acked.is_empty());
    let redelivered_set: HashSet<&String> = redelivered.iter().collect();

    // Nothing lost: a task whose schedule returned was acked, is being acked when killed, or
    // is delivered after the last restart.
    for id in &scheduled {
        assert!(
            acked.contains_key(id) || ack_started.contains(id) || redelivered_set.contains(id),
            "task {id} was scheduled and then lost"
        );
    }
    // Nothing acked comes back: not in a later run, not after the last restart.
    for (id, run) in &acked {
        assert!(
            !redelivered_set.contains(id),
            "task {id} was acked in run {run} and delivered again"
        );
        for (later, again) in &delivered {
            assert!(
                !(again == id && later > run),
                "task {id} was acked in run {run} and delivered again in run {later}"
            );
        }
    }
    eprintln!(
        "{RUNS} kills: {} scheduled, {} acked, {} delivered again after the last restart",
        scheduled.len(),
        acked.len(),
        redelivered.len()
    );
}
