//! One queue on each backend the features allow, for tests that run the same behaviour on
//! both: an embedded redb file in a tempdir, or a `redis-server` of the test's own.

use futures::StreamExt;
use tokio_wheel::Wheel;
use tokio_wheel_durable::{Builder, DurableQueue};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Embedded,
    Redis,
}

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub wheel: Wheel,
    pub backend: Backend,
    pub redis: Option<super::redis_server::RedisServer>,
}

/// A fixture, or `None` when the backend cannot run here (Redis without `redis-server`,
/// outside CI: the test then passes after saying so).
pub fn fixture(backend: Backend) -> Option<Fixture> {
    let redis = match backend {
        Backend::Embedded => None,
        Backend::Redis => Some(super::redis_server::start()?),
    };
    Some(Fixture {
        dir: tempfile::tempdir().unwrap(),
        wheel: Wheel::new(),
        backend,
        redis,
    })
}

impl Fixture {
    /// The queue `name` (a file of that name, or a queue of that name on the server).
    pub async fn open_named(&self, builder: Builder, name: &str) -> DurableQueue {
        match self.backend {
            Backend::Embedded => builder
                .open(self.dir.path().join(format!("{name}.redb")), &self.wheel)
                .await
                .unwrap(),
            #[cfg(feature = "redis")]
            Backend::Redis => {
                let url = self.redis.as_ref().expect("server").url();
                builder.redis(&url, name, &self.wheel).await.unwrap()
            }
            #[cfg(not(feature = "redis"))]
            Backend::Redis => unreachable!("Redis tests need the redis feature"),
        }
    }

    pub async fn open(&self) -> DurableQueue {
        self.open_named(DurableQueue::builder(), "queue").await
    }
}

impl Fixture {
    /// Where the embedded backend keeps the queue of [`open`](Self::open).
    pub fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("queue.redb")
    }

    /// The queue of [`open`](Self::open), built by `builder`.
    pub async fn open_with(&self, builder: Builder) -> DurableQueue {
        self.open_named(builder, "queue").await
    }

    /// Opens the queue again, waiting for the embedded store's lock to be released.
    pub async fn reopen(&self, builder: Builder) -> DurableQueue {
        for _ in 0..200 {
            match self.backend {
                Backend::Embedded => match builder.clone().open(self.path(), &self.wheel).await {
                    Ok(queue) => return queue,
                    Err(tokio_wheel_durable::Error::Locked) => {
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await
                    }
                    Err(other) => panic!("{other}"),
                },
                Backend::Redis => return self.open_with(builder).await,
            }
        }
        panic!("the store was never released");
    }
}

/// The stream's next delivery, within 5 s.
pub async fn next(
    deliveries: &mut tokio_wheel_durable::Deliveries,
) -> tokio_wheel_durable::Delivery {
    tokio::time::timeout(std::time::Duration::from_secs(5), deliveries.next())
        .await
        .expect("a delivery within 5 s")
        .expect("the stream is open")
}

/// The stream's next delivery, waiting at most 20 s: for the attack tests' races and
/// floods, where a loaded machine may take seconds. (These tests once nudged the store after
/// 500 ms of quiet to get around the stall that
/// `attack_batch::a_stream_holding_deliveries_keeps_yielding_due_tasks` checks is fixed.)
pub async fn next_delivery(
    stream: &mut tokio_wheel_durable::Deliveries,
) -> tokio_wheel_durable::Delivery {
    tokio::time::timeout(std::time::Duration::from_secs(20), stream.next())
        .await
        .expect("no delivery in 20 s")
        .expect("stream ended")
}

/// Every pending task, through `list_page` from the start.
pub async fn all_pending(queue: &DurableQueue) -> Vec<tokio_wheel_durable::TaskId> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page = queue
            .list_page(
                tokio_wheel_durable::TaskFilter::Pending,
                cursor.as_ref(),
                1000,
            )
            .await
            .unwrap();
        out.extend(page.items.into_iter().map(|t| t.id));
        match page.next {
            Some(next) => cursor = Some(next),
            None => return out,
        }
    }
}

/// `delivered == acked + retried + dead_lettered + expired + returned + in_flight` and the
/// levels agree with `len()`.
pub async fn stats_add_up(queue: &DurableQueue) {
    let s = queue.stats().await.unwrap();
    assert_eq!(
        s.delivered,
        s.acked + s.retried + s.dead_lettered + s.expired + s.returned + s.in_flight,
        "{s:?}"
    );
    assert_eq!(
        s.pending + s.in_flight,
        queue.len().await.unwrap() as u64,
        "{s:?}"
    );
}

/// No delivery comes within `wait`.
pub async fn nothing_within(
    deliveries: &mut tokio_wheel_durable::Deliveries,
    wait: std::time::Duration,
) {
    if let Ok(Some(d)) = tokio::time::timeout(wait, deliveries.next()).await {
        panic!("unexpected delivery {d:?}");
    }
}

/// Runs each listed test (an `async fn(Backend)` of the file) on every backend the features
/// allow, as `#[tokio::test]`s — or under the test attribute given first
/// (`on_every_backend!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] a, b)`).
#[macro_export]
macro_rules! on_every_backend {
    (#[$test_attribute:meta] $($test:ident),* $(,)?) => {
        mod embedded {
            $(
                #[$test_attribute]
                async fn $test() {
                    super::$test(super::Backend::Embedded).await;
                }
            )*
        }
        #[cfg(feature = "redis")]
        mod on_redis {
            $(
                #[$test_attribute]
                async fn $test() {
                    super::$test(super::Backend::Redis).await;
                }
            )*
        }
    };
    ($($test:ident),* $(,)?) => {
        $crate::on_every_backend!(#[tokio::test] $($test),*);
    };
}
