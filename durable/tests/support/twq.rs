//! Runs the real `twq` binary for the command-line tests (`cli.rs`, `cli_errors.rs`), and the
//! backends it is pointed at.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{DurableQueue, TaskFilter, TaskId, TaskInfo, TaskState};

use super::redis_server::{self, RedisServer};

/// What one run of `twq` did.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The one JSON document it printed.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not one JSON document ({e}): {self:?}"))
    }

    pub fn ok(self) -> Run {
        assert_eq!(self.code, 0, "{self:?}");
        assert!(self.stderr.is_empty(), "{self:?}");
        self
    }

    /// Exit 1 with one line on standard error that contains `needle`.
    pub fn not_found(self, needle: &str) -> Run {
        assert_eq!(self.code, 1, "{self:?}");
        assert_eq!(self.stderr.lines().count(), 1, "{self:?}");
        assert!(self.stderr.contains(needle), "{needle:?} in {self:?}");
        self
    }

    /// Exit 2 with one line on standard error that contains `needle`, nothing on standard
    /// output.
    pub fn error(self, needle: &str) -> Run {
        assert_eq!(self.code, 2, "{self:?}");
        assert_eq!(self.stderr.lines().count(), 1, "{self:?}");
        assert!(self.stderr.starts_with("twq: "), "{self:?}");
        assert!(
            self.stderr.to_lowercase().contains(needle),
            "{needle:?} in {self:?}"
        );
        assert!(self.stdout.is_empty(), "{self:?}");
        self
    }

    pub fn shows(&self, secret: &str) -> bool {
        self.stdout.contains(secret) || self.stderr.contains(secret)
    }
}

/// Runs `twq args…` (with `stdin` on its standard input), its environment free of `TWQ_*`
/// plus `env`.
pub async fn twq_with(
    args: Vec<String>,
    stdin: Option<Vec<u8>>,
    env: Vec<(String, String)>,
) -> Run {
    tokio::task::spawn_blocking(move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_twq"));
        command
            .args(&args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for name in ["TWQ_REDIS", "TWQ_CLUSTER", "TWQ_QUEUE", "TWQ_FILE"] {
            command.env_remove(name);
        }
        command.envs(env);
        let mut child = command.spawn().expect("run twq");
        if let Some(input) = stdin {
            child.stdin.take().unwrap().write_all(&input).unwrap();
        }
        let output = child.wait_with_output().unwrap();
        Run {
            code: output.status.code().expect("twq exited"),
            stdout: String::from_utf8(output.stdout).unwrap(),
            stderr: String::from_utf8(output.stderr).unwrap(),
        }
    })
    .await
    .unwrap()
}

pub async fn twq(args: &[&str]) -> Run {
    twq_with(
        args.iter().map(|a| (*a).to_owned()).collect(),
        None,
        Vec::new(),
    )
    .await
}

pub fn now_ms() -> u64 {
    ms_of(SystemTime::now())
}

pub fn ms_of(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

pub fn rfc3339_ms(time: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(time)
}

/// The queue the command line is pointed at, and how the test reaches it through the API.
pub enum Store {
    File {
        _dir: tempfile::TempDir,
        path: PathBuf,
    },
    Redis {
        _server: RedisServer,
        url: String,
    },
    Cluster {
        _cluster: super::redis_cluster::Cluster,
        urls: Vec<String>,
        partitions: usize,
    },
}

pub struct Backend {
    pub store: Store,
    pub wheel: Wheel,
}

pub const QUEUE: &str = "ops";

impl Backend {
    pub fn file() -> Backend {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tasks.redb");
        Backend {
            store: Store::File { _dir: dir, path },
            wheel: Wheel::new(),
        }
    }

    pub fn redis() -> Option<Backend> {
        let server = redis_server::start()?;
        Some(Backend {
            store: Store::Redis {
                url: server.url(),
                _server: server,
            },
            wheel: Wheel::new(),
        })
    }

    /// The global options that point `twq` at this queue.
    pub fn global(&self) -> Vec<String> {
        match &self.store {
            Store::File { path, .. } => vec!["--file".into(), path.display().to_string()],
            Store::Redis { url, .. } => {
                vec![
                    "--redis".into(),
                    url.clone(),
                    "--queue".into(),
                    QUEUE.into(),
                ]
            }
            Store::Cluster {
                urls, partitions, ..
            } => vec![
                "--cluster".into(),
                urls.join(","),
                "--queue".into(),
                QUEUE.into(),
                "--partitions".into(),
                partitions.to_string(),
            ],
        }
    }

    pub async fn twq(&self, args: &[&str]) -> Run {
        self.twq_in(args, None).await
    }

    pub async fn twq_in(&self, args: &[&str], stdin: Option<Vec<u8>>) -> Run {
        let mut all = self.global();
        all.extend(args.iter().map(|a| (*a).to_owned()));
        twq_with(all, stdin, Vec::new()).await
    }

    /// A handle through the API. On the embedded store it holds the file's lock: close it
    /// before running `twq`.
    pub async fn open(&self) -> DurableQueue {
        match &self.store {
            Store::File { path, .. } => DurableQueue::open(path, &self.wheel).await.unwrap(),
            Store::Redis { url, .. } => DurableQueue::builder()
                .redis(url, QUEUE, &self.wheel)
                .await
                .unwrap(),
            Store::Cluster {
                urls, partitions, ..
            } => {
                let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
                DurableQueue::builder()
                    .partitions(*partitions)
                    .redis_cluster(&urls, QUEUE, &self.wheel)
                    .await
                    .unwrap()
            }
        }
    }

    pub async fn get(&self, id: &str) -> Option<TaskInfo> {
        let queue = self.open().await;
        let info = queue.get(&TaskId::from(id)).await.unwrap();
        queue.close().await;
        info
    }

    pub async fn reschedule(&self, id: &str, due: std::time::SystemTime) {
        let queue = self.open().await;
        assert!(queue.reschedule(&TaskId::from(id), due).await.unwrap());
        queue.close().await;
    }

    pub async fn list(&self, filter: TaskFilter) -> Vec<TaskInfo> {
        let queue = self.open().await;
        let page = queue.list(filter, None, 1000).await.unwrap();
        queue.close().await;
        page
    }
}

/// The fields of a task in `twq`'s JSON that the library reports too.
pub fn assert_same(json: &Value, info: &TaskInfo) {
    assert_eq!(json["id"], info.id.as_str(), "{json}");
    let state = match &info.state {
        TaskState::Pending => "pending",
        TaskState::InFlight { .. } => "in-flight",
        TaskState::Dead { .. } => "dead",
        other => panic!("unexpected state {other:?}"),
    };
    assert_eq!(json["state"], state, "{json}");
    assert_eq!(json["due_ms"], ms_of(info.due), "{json}");
    assert_eq!(json["attempts"], info.attempts, "{json}");
    assert_eq!(json["payload_len"], info.payload_len as u64, "{json}");
    assert_eq!(json["reason"].as_str(), info.reason.as_deref(), "{json}");
    if let TaskState::InFlight {
        attempt,
        lease_until,
    } = &info.state
    {
        assert_eq!(json["attempt"], *attempt, "{json}");
        assert_eq!(json["lease_until_ms"], ms_of(*lease_until), "{json}");
    }
}
