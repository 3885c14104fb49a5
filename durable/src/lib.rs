//! Durable delayed tasks that survive restarts: the job queue beside [`tokio_wheel`].
//!
//! "Retry this webhook in 10 minutes", "auto-accept the order if no review in 7 days": delayed
//! work that must not vanish when the process restarts or crashes. A [`DurableQueue`] keeps
//! tasks in a store (an embedded [redb](https://docs.rs/redb) file by default), wakes exactly
//! when the earliest one is due through a [`Wheel`](tokio_wheel::Wheel), and hands due tasks out as
//! [`Delivery`]s that must be acknowledged.
//!
//! ```
//! use std::time::Duration;
//! use futures::StreamExt;
//! use tokio_wheel::Wheel;
//! use tokio_wheel_durable::{DurableQueue, Task};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), tokio_wheel_durable::Error> {
//! # let dir = std::env::temp_dir().join(format!("tokio-wheel-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir).unwrap();
//! # let path = dir.join("tasks.redb");
//! let wheel = Wheel::new();
//! let queue = DurableQueue::open(&path, &wheel).await?;
//! let id = queue
//!     .schedule(Task::new(b"send the reminder".to_vec()).after(Duration::from_millis(50)).id("order-42"))
//!     .await?; // durable once this returns
//!
//! let mut deliveries = queue.deliveries();
//! let delivery = deliveries.next().await.unwrap();
//! assert_eq!(delivery.id(), &id);
//! assert_eq!(delivery.payload(), b"send the reminder");
//! delivery.ack().await?; // done: deleted for good
//! # drop(deliveries);
//! # queue.close().await;
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok(())
//! # }
//! ```
//!
//! # Guarantees
//!
//! - **Durable:** `schedule`, `cancel`, `reschedule`, `ack`, `retry`, `fail` and `redrive`
//!   return only once their effect is committed to the store. Concurrent calls share one
//!   transaction (group commit), so throughput is not one fsync per task.
//! - **Never early, promptly on time:** a task is never delivered before its due time; an idle
//!   consumer is woken by the wheel when it is due, not by polling.
//! - **At least once:** a task is deleted only by `ack`. A delivery neither acked nor retried
//!   within its lease (a crash, a hang, a dropped [`Delivery`]) is delivered again, with its
//!   attempt count raised. While every delivery is acked or retried within its lease, each task
//!   is delivered exactly once. `ack`, `retry`, `retry_after` and `fail` after the task was
//!   handed out again return [`Error::LeaseLost`] and change nothing; `ack` never returns `Ok`
//!   without deleting.
//! - **Leases from hand-out:** a lease starts when the stream yields the delivery, not while
//!   the task waits in the prefetch buffer. [`Delivery::extend`] and
//!   [`Builder::keep_alive`] keep a long job's lease.
//! - **Under faults:** a delivery carries exactly the payload that was scheduled; a call
//!   retried after a lost reply is recognised; due times and leases are judged by the store's
//!   clock (Redis: the server's `TIME`), never a worker's; a failed commit never strands a
//!   stream nor redelivers a live lease; every store step touches a bounded batch. The
//!   README's "What the durable queue guarantees under faults" lists each with its test.
//! - **Restarts:** on open, pending tasks reload; overdue ones are delivered at once, in due
//!   order (ties in schedule order); tasks in flight when the previous holder died are
//!   delivered again at once.
//! - **One holder:** opening a store another handle holds returns [`Error::Locked`] at once.
//!   [`DurableQueue::close`] releases it before it returns (also after the wheel shut down);
//!   dropping every handle releases it in the background, moments later.
//! - **Replacing:** scheduling an id that is pending or dead replaces it; one in flight returns
//!   [`Error::InFlight`].
//!
//! Due times are wall-clock ([`SystemTime`](std::time::SystemTime)): an `Instant` does not survive a restart.
//!
//! # Features
//!
//! - default: the embedded store ([redb](https://docs.rs/redb)) and recurring tasks.
//! - `redis`: one queue shared across processes through Redis or Redis Cluster
//!   (`Builder::redis`, `Builder::redis_cluster`); `redis-tls`: `rediss://` through rustls.
//! - `serde`: JSON payload helpers (`Task::json`, `Delivery::json`).
//! - `metrics`: [`QueueStats`] through the `metrics` facade
//!   (`QueueStats::record_metrics`, `DurableQueue::export_metrics`).
//! - `dashboard`: the web board (`dashboard::router`), on axum 0.8.
//! - `cli`: the operator's command line `twq` (with `twq dashboard`).
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![doc(test(attr(deny(warnings), allow(dead_code))))]

mod builder;
mod cursor;
#[cfg(feature = "dashboard")]
pub mod dashboard;
mod delivery;
mod embedded;
mod error;
mod inspect;
#[cfg(feature = "metrics")]
mod metrics_export;
mod policy;
mod protocol;
mod queue;
mod recurring;
#[cfg(feature = "redis")]
mod redis;
mod task;
// Durations and times in and out; also compiled into `twq` (src/bin/twq/main.rs).
#[cfg(feature = "dashboard")]
#[allow(dead_code)]
mod units;

pub use self::embedded::store;
pub(crate) use self::embedded::{engine, tasks};

pub use self::builder::Builder;
pub use self::cursor::{Cursor, Page, RecurringPage};
pub use self::delivery::{Deliveries, Delivery};
pub use self::error::Error;
pub use self::inspect::{QueueStats, TaskFilter, TaskInfo, TaskState};
pub use self::policy::RetryPolicy;
pub use self::queue::DurableQueue;
pub(crate) use self::queue::Route;
pub use self::recurring::{CatchUp, MAX_CATCH_UP, Recurring, RecurringInfo, RecurringKind};
pub use self::task::{DeadLetter, Task, TaskId};
pub(crate) use self::task::{MAX_DUE_MS, delay_ms, epoch_ms};
#[cfg_attr(not(feature = "redis"), allow(unused_imports))]
pub(crate) use self::{delivery::Outcome, task::Due};
/// The most entries one page of [`DurableQueue::list`], [`DurableQueue::list_page`] or
/// [`DurableQueue::dead_letters_page`] returns.
pub const PAGE_LIMIT: usize = 1000;

/// The README's code samples, compiled as doc tests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeSamples;
