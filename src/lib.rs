//! An async, Tokio-native hierarchical timer wheel.
//!
//! One actor task owns a seconds → minutes → hours → days cascade of wheels; you hold cheap
//! handles to it:
//!
//! - futures that resolve at a deadline: [`Wheel::sleep`], [`Wheel::timeout`],
//!   [`Wheel::interval`];
//! - delayed async jobs: [`Wheel::spawn_after`], [`Wheel::spawn_every`], with [`JobHandle`]s
//!   to cancel, reschedule, abort and await them;
//! - keyed timers: [`Wheel::keyed`] gives [`Timers`] to set, move and remove timers by key,
//!   and an [`Expirations`] stream;
//! - servers (features `hyper`, `tower`): hyper's timer and an idle-connection timeout in
//!   `tokio_wheel::hyper`, a request-deadline layer in `tokio_wheel::tower`.
//!
//! ```
//! use std::time::Duration;
//! use futures::StreamExt;
//! use tokio_wheel::Wheel;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let wheel = Wheel::new();
//!
//! // A future that resolves at a deadline.
//! wheel.sleep(Duration::from_millis(50)).await;
//!
//! // A delayed job, run as a Tokio task.
//! let job = wheel.spawn_after(Duration::from_secs(1), async { "done" });
//! assert_eq!(job.await, Ok("done"));
//!
//! // Keyed timers: connection keep-alive.
//! let (timers, mut expired) = wheel.keyed::<u32, &str>();
//! timers.set(7, "10.0.0.7:5000", Duration::from_secs(30));
//! let idle = expired.next().await.unwrap();
//! assert_eq!(idle.into_parts(), (7, "10.0.0.7:5000"));
//!
//! let stats = wheel.stats();
//! assert_eq!(stats.inserted, stats.fired + stats.cancelled + stats.pending);
//! wheel.shutdown().await;
//! # }
//! ```
//!
//! # Guarantees
//!
//! - A timer never fires before its deadline, and at most one tick (default 1 ms) plus
//!   scheduling latency after it. Deadlines round *up* to a tick.
//! - Each timer fires at most once; a cancelled timer never fires.
//! - Time is [`tokio::time::Instant`]: under `tokio::time::pause()` or
//!   `#[tokio::test(start_paused = true)]` the wheel follows the paused clock.
//! - The actor never ticks while idle: it sleeps until the next occupied slot.
//! - Nothing created by the wheel hangs or panics because the wheel stopped: see
//!   [`Wheel::shutdown`].
//! - A sleep, timeout or interval tick polled at or after its deadline is ready on that poll,
//!   however much of Tokio's cooperative budget the task has spent (Tokio's own turn pending
//!   after 128 completions in one turn): a loop that only awaits due timers must yield by
//!   itself. Awaiting jobs and expirations spends the budget as `JoinHandle` and `mpsc` do.
//! - The actor is a task on your runtime: a task that blocks its worker can hold it up. Where
//!   that may happen, [`Builder::own_thread`] gives the actors a thread of their own.
//!
//! # Cost model
//!
//! Registering a timer takes a 32-byte slot from the wheel's pool (no allocation once the pool
//! has grown) and queues one command, under one uncontended lock of the calling thread's inbox
//! shard; the actor applies commands in batches on its own task, and a command wakes it only if
//! it would otherwise look too late (a deadline earlier than its next wake-up, a barrier).
//! Postponing a `Sleep` is one atomic compare-and-swap with no command; dropping one queues a
//! release, or withdraws its registration if the actor has not taken it yet. The actor
//! applies what it takes in time-bounded stretches, firing due timers and yielding to the
//! runtime between them ([`Stats::commands`] counts what it took). Once empty and idle for a
//! moment, it gives flood-sized memory back.
//!
//! **Several actors on many cores.** Sleeps and jobs run on [`Builder::timer_shards`] timer
//! actors (by default one per two workers), each with its own pool, queues and cascade: a
//! timer goes to the actor of the thread that registers it. Each keyed set runs
//! [`Builder::shards`] actors (by default one per worker), keys spread by hash. One actor
//! keeps up with a few producer cores making commands flat out; more actors raise that in
//! proportion (BENCHMARKS.md, "cores until one actor saturates").
//!
//! **Floods are bounded by backpressure.** The commands waiting for an actor are at most
//! about 2 × 256 Ki (the inbox's shards hold 256 Ki together, the actor's batch as many):
//! tens of MiB at ~40 bytes a command, whatever producers on any number of threads do. A call
//! that fills its thread's shard (a by-key `reset` flood, say) waits until the actor has
//! taken that shard — through `tokio::task::block_in_place` on a multi-thread runtime (the
//! worker's other tasks, the actor too, go on elsewhere), blocking the thread outside a
//! runtime. So an authoritative call made during a flood (`take`, `len`, `drain`, `flush`)
//! waits behind at most that many commands (measured: a few milliseconds, BENCHMARKS.md).
//! A call made on the thread of the current-thread runtime the actor runs on never waits
//! (the actor needs that thread): a task there that floods without yielding is not bounded.
//! Other current-thread runtimes' threads wait like any thread. Below the bound —
//! every ordinary workload — nothing waits: the check is a length read under the lock the
//! send holds anyway.
//!
//! The timer a server pays for most is a request's header-read timeout: armed, then dropped
//! unfired about a millisecond later. While commands flow, the actor looks at its queue by
//! itself every 10 ms (and once more after the flow stops, never while idle), so neither a
//! far-future registration nor a release wakes it: such a sleep costs its task one clock read
//! per `Sleep` made by duration plus one on its first poll, and two uncontended shard locks
//! (register; withdraw, or queue a release if the actor filed it meanwhile), and the actor
//! nothing for most of them (a few per cent are filed and unfiled in batches). Releases wait
//! at most those 10 ms, so memory stays bounded by what is sent in 10 ms; a withdrawn
//! registration that is the last in its queue is taken back whole, so most never reach the
//! actor at all. Measured with 128 tasks on 2 workers, each request arming a 30 s sleep and
//! dropping it after a real 0.2–0.4 ms round trip: about one actor wake-up per 1 000
//! requests, 3 % of the sleeps filed, and the timer's CPU per request on a par with
//! `tokio::time` (it was 4–8× before the actor stopped waking per request).
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![doc(test(attr(deny(warnings), allow(dead_code))))]

mod actor;
#[cfg(feature = "axum")]
pub mod axum;
mod builder;
mod error;
mod handle;
#[cfg(feature = "hyper")]
pub mod hyper;
mod interval;
mod job;
pub mod keyed;
#[cfg(feature = "metrics")]
mod metrics_export;
mod sleep;
mod stats;
mod stopped;
mod timeout;
mod timer;
#[cfg(feature = "tower")]
pub mod tower;
pub mod wheel;

pub use builder::Builder;
pub use error::{BuildError, Elapsed, JobError};
pub use handle::Wheel;
pub use interval::Interval;
pub use job::{JobHandle, Schedule};
pub use keyed::{Expirations, Expired, KeyedTimer, Timers};
pub use sleep::Sleep;
pub use stats::Stats;
pub use stopped::Stopped;
pub use timeout::Timeout;
pub use tokio::time::MissedTickBehavior;
pub use wheel::Layout;

/// The README's code samples, compiled as doc tests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeSamples;
