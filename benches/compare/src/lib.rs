//! The comparison scenarios, shared by the criterion benches (`benches/compare/benches/compare.rs`) and the
//! table printer (`benches/compare/examples/compare/`): tokio-wheel against `tokio::time`,
//! `tokio_util::time::DelayQueue`, `pingora-timeout`, `kestrel-timer` and
//! `hierarchical_hash_wheel_timer`, the same work done by each in the same run.
//!
//! Every function runs on a Tokio worker thread and returns wall time for the whole batch
//! of operations. tokio-wheel's numbers include waiting for the actor to apply everything
//! (`Wheel::flush`, or `Timers::len` for keyed sets): they are end to end, not just the cost
//! of sending a command. `hierarchical_hash_wheel_timer` works on a thread of its own; its
//! end-to-end numbers wait for that thread with a zero-delay barrier timer
//! ([`hash_wheel_barrier`]).
//!
//! **Steady state.** Timer services are long-lived: tokio's timer driver lives as long as its
//! runtime. So the tokio-wheel functions take a `Wheel` (or a keyed `Timers` handle) that the
//! caller builds once per scenario group and shuts down after it; every function leaves the
//! wheel empty when it returns (everything it registered cancelled, fired or drained, and
//! the actor flushed), outside the measured time. `kestrel-timer` ([`Kestrel`]) and
//! `hierarchical_hash_wheel_timer` ([`HashWheel`]) are kept the same way. `DelayQueue` is a
//! plain data structure: each repetition builds one with the capacity it needs.
//!
//! Which peer fits which scenario, and why some do not:
//! - `kestrel-timer` has no future-based timer: a timer is a registration returning a handle,
//!   completion is a separate receiver, and dropping the handle does **not** cancel (it must
//!   be cancelled explicitly). It fits schedule + cancel, postpone (`TimerWheel::postpone`,
//!   which takes a delay from now), many producers (one `TimerWheel` shared through an
//!   `Arc`), fire (awaiting the completion receiver), memory and idle. It has no timeout
//!   combinator (so no timeout scenarios: wrapping a future would be hand-written
//!   register + select + cancel, i.e. schedule + cancel), and no keyed API (keys would be a
//!   `HashMap<K, TaskId>` beside it, as for `DelayQueue`, which the keyed scenarios already
//!   measure).
//! - The request-shaped scenario ([`requests`]) runs `tokio::time::sleep`, pingora-timeout's
//!   `fast_sleep` and tokio-wheel's `Sleep` (DelayQueue, kestrel-timer and
//!   `hierarchical_hash_wheel_timer` have no future a task can hold and drop), plus a run with
//!   no timer at all: the floor, so the timer's own share can be read off.
//! - `hierarchical_hash_wheel_timer` (`thread_timer`) is a callback timer on a dedicated
//!   thread fed through a channel: `schedule_action_once(id, delay, closure)` and
//!   `cancel(&id)`. It fits schedule + cancel, many producers (a cloned `TimerRef` per task),
//!   fire (the closure completes a `tokio::sync::oneshot`), memory and idle. It has no reset
//!   or postpone (only cancel and schedule again, which leaves the old entry in its wheel
//!   until its slot passes, a different cost model), no timeout combinator and no keyed API,
//!   so it is not in those scenarios.
#![allow(dead_code, clippy::should_implement_trait)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use hierarchical_hash_wheel_timer::thread_timer::{TimerRef, TimerWithThread};
use hierarchical_hash_wheel_timer::{
    ClosureTimer, OneShotClosureState, PeriodicClosureState, Timer as _,
};
use kestrel_timer::{CompletionReceiver, TaskCompletion, TimerHandleWithCompletion, TimerTask};
use tokio::time::Instant;
use tokio_util::time::DelayQueue;
use tokio_util::time::delay_queue::Key as DelayKey;
use tokio_wheel::{Expirations, KeyedTimer, Timers, Wheel};

/// A cheap, repeatable generator: benchmarks need spread, not quality.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// `n` delays spread over [1 s, 60 s], millisecond resolution.
    pub fn delays(&mut self, n: usize) -> Vec<Duration> {
        (0..n)
            .map(|_| Duration::from_millis(1_000 + self.next() % 59_000))
            .collect()
    }
}

/// The runtime every scenario runs on: 2 workers, as on the 2-core reference machine. With
/// `TOKIO_WHEEL_ALT_TIMER=1` in a build with `RUSTFLAGS="--cfg tokio_unstable"`, on tokio's
/// per-worker timer (`enable_alt_timer`): every tokio peer, and the wheel's own actor sleep,
/// then run on it.
pub fn runtime() -> tokio::runtime::Runtime {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(2).enable_all();
    if alt_timer() {
        #[cfg(tokio_unstable)]
        builder.enable_alt_timer();
    }
    builder.build().expect("runtime")
}

/// Whether the runtime runs tokio's per-worker timer (see [`runtime`]).
pub fn alt_timer() -> bool {
    cfg!(tokio_unstable) && std::env::var_os("TOKIO_WHEEL_ALT_TIMER").is_some_and(|v| v == "1")
}

/// Runs `scenario` on a worker thread of `runtime` and returns its output.
pub fn on_worker<F>(runtime: &tokio::runtime::Runtime, scenario: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    runtime.block_on(async { tokio::spawn(scenario).await.expect("scenario panicked") })
}

pub fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

// ---------------------------------------------------------------- long-lived peers

/// A `kestrel-timer` wheel shared by the scenarios of one group (its 10 ms tick task runs on
/// the runtime until the last clone is dropped).
pub type Kestrel = Arc<kestrel_timer::TimerWheel>;

/// Starts a `kestrel-timer` wheel with its defaults (10 ms × 512 slots, then 1 s × 64) on
/// `runtime`.
pub fn kestrel(runtime: &tokio::runtime::Runtime) -> Kestrel {
    let _context = runtime.enter();
    Arc::new(kestrel_timer::TimerWheel::with_defaults())
}

/// Stops a `kestrel-timer` wheel and waits until its tick task is gone. Dropping the last
/// `TimerWheel` only aborts the task, which the runtime drops (with the wheel it holds) some
/// time later, in the middle of whatever is measured next.
pub async fn kestrel_shutdown(timer: Kestrel) {
    match Arc::try_unwrap(timer) {
        Ok(timer) => timer.shutdown().await,
        Err(_) => panic!("kestrel-timer wheel still shared"),
    }
}

/// Registers a one-shot `kestrel-timer` timer with no callback (completion is notified on its
/// receiver). Returns its id (for `postpone`) and handle.
fn kestrel_register(
    timer: &kestrel_timer::TimerWheel,
    delay: Duration,
) -> (kestrel_timer::TaskId, TimerHandleWithCompletion) {
    let handle = timer.allocate_handle();
    let id = handle.task_id();
    (
        id,
        timer.register(handle, TimerTask::new_oneshot(delay, None)),
    )
}

/// A `hierarchical_hash_wheel_timer` thread timer with closure states keyed by `u64`.
pub type HashWheel = TimerWithThread<u64, OneShotClosureState<u64>, PeriodicClosureState<u64>>;
/// A handle to a [`HashWheel`]'s thread (`Clone + Send`).
pub type HashWheelRef = TimerRef<u64, OneShotClosureState<u64>, PeriodicClosureState<u64>>;

/// Starts a `hierarchical_hash_wheel_timer` timer thread. Stop it with `shutdown()`.
pub fn hash_wheel() -> HashWheel {
    TimerWithThread::new().expect("timer thread")
}

/// The id [`hash_wheel_barrier`] uses; scenario ids stay below it.
const BARRIER_ID: u64 = u64::MAX;

/// Waits until the timer thread has applied every message sent before this call: a timer
/// with zero delay is triggered as soon as the thread handles it, and the thread handles its
/// channel in order.
pub async fn hash_wheel_barrier(timer: &mut HashWheelRef) {
    let (done, applied) = tokio::sync::oneshot::channel();
    timer.schedule_action_once(BARRIER_ID, Duration::ZERO, move |_| {
        let _ = done.send(());
    });
    applied.await.expect("timer thread stopped");
}

/// A keyed set kept for a scenario group: the `Timers` handle and its expiration stream.
pub struct KeyedSet<V> {
    pub timers: Timers<u64, V>,
    pub expired: Expirations<u64, V>,
}

impl<V: Send + 'static> KeyedSet<V> {
    pub fn new(wheel: &Wheel) -> KeyedSet<V> {
        let (timers, expired) = wheel.keyed::<u64, V>();
        KeyedSet { timers, expired }
    }
}

mod fire;
mod idle;
mod keyed;
mod memory;
mod postpone;
mod producers;
mod requests;
mod schedule;
mod timeouts;

pub use fire::*;
pub use idle::*;
pub use keyed::*;
pub use memory::*;
pub use postpone::*;
pub use producers::*;
pub use requests::*;
pub use schedule::*;
pub use timeouts::*;
