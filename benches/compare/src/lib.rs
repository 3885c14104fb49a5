//! The comparison scenarios, shared by the criterion benches (`benches/compare/benches/compare.rs`) and the
//! table printer (`benches/compare/examples/compare.rs`): tokio-wheel against `tokio::time`,
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

/// The runtime every scenario runs on: 2 workers, as on the 2-core reference machine.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
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

// ---------------------------------------------------------------- schedule + cancel

/// What one schedule + cancel batch cost. For synchronous peers the caller's side is the
/// whole cost; for tokio-wheel and `hierarchical_hash_wheel_timer` the end-to-end numbers
/// also wait for the actor or timer thread, which works on another core meanwhile.
#[derive(Debug, Clone, Copy)]
pub struct ScheduleCancel {
    /// Until every timer is filed.
    pub scheduled: Duration,
    /// Until every timer is reclaimed.
    pub cancelled: Duration,
    /// What the registering task itself spent.
    pub caller_scheduled: Duration,
    /// What the cancelling task itself spent.
    pub caller_cancelled: Duration,
}

impl ScheduleCancel {
    /// A peer whose caller does all the work.
    fn synchronous(scheduled: Duration, cancelled: Duration) -> ScheduleCancel {
        ScheduleCancel {
            scheduled,
            cancelled,
            caller_scheduled: scheduled,
            caller_cancelled: cancelled,
        }
    }

    /// Schedule + cancel, end to end.
    pub fn pair(&self) -> Duration {
        self.scheduled + self.cancelled
    }

    /// Schedule + cancel, caller side only.
    pub fn caller_pair(&self) -> Duration {
        self.caller_scheduled + self.caller_cancelled
    }
}

/// Registers a boxed `tokio::time::Sleep` per delay, then drops them all.
pub async fn schedule_cancel_tokio(delays: Arc<Vec<Duration>>) -> ScheduleCancel {
    let start = Instant::now();
    let mut sleeps = Vec::with_capacity(delays.len());
    for &delay in delays.iter() {
        let mut sleep = Box::pin(tokio::time::sleep(delay));
        assert!(poll_once(sleep.as_mut()).is_pending());
        sleeps.push(sleep);
    }
    let scheduled = start.elapsed();
    let start = Instant::now();
    drop(sleeps);
    ScheduleCancel::synchronous(scheduled, start.elapsed())
}

/// Registers a tokio-wheel `Sleep` per delay (waiting until the actor has them all), then
/// drops them all (waiting until the actor has reclaimed them).
pub async fn schedule_cancel_wheel(wheel: Wheel, delays: Arc<Vec<Duration>>) -> ScheduleCancel {
    let start = Instant::now();
    let mut sleeps = Vec::with_capacity(delays.len());
    for &delay in delays.iter() {
        let mut sleep = wheel.sleep(delay);
        assert!(poll_once(Pin::new(&mut sleep)).is_pending());
        sleeps.push(sleep);
    }
    let caller_scheduled = start.elapsed();
    wheel.flush().await;
    let scheduled = start.elapsed();
    let start = Instant::now();
    drop(sleeps);
    let caller_cancelled = start.elapsed();
    wheel.flush().await;
    let cancelled = start.elapsed();
    ScheduleCancel {
        scheduled,
        cancelled,
        caller_scheduled,
        caller_cancelled,
    }
}

/// Inserts every delay into a `DelayQueue`, then removes them all.
pub async fn schedule_cancel_delay_queue(delays: Arc<Vec<Duration>>) -> ScheduleCancel {
    let mut queue = DelayQueue::with_capacity(delays.len());
    let start = Instant::now();
    let keys: Vec<DelayKey> = delays
        .iter()
        .map(|&delay| queue.insert((), delay))
        .collect();
    let scheduled = start.elapsed();
    let start = Instant::now();
    for key in &keys {
        queue.remove(key);
    }
    ScheduleCancel::synchronous(scheduled, start.elapsed())
}

/// Registers a `kestrel-timer` timer per delay, then cancels them all (dropping a kestrel
/// handle does not cancel its timer: `cancel()` is the API).
pub async fn schedule_cancel_kestrel(timer: Kestrel, delays: Arc<Vec<Duration>>) -> ScheduleCancel {
    let start = Instant::now();
    let handles: Vec<TimerHandleWithCompletion> = delays
        .iter()
        .map(|&delay| kestrel_register(&timer, delay).1)
        .collect();
    let scheduled = start.elapsed();
    let start = Instant::now();
    for handle in &handles {
        assert!(handle.cancel());
    }
    drop(handles);
    ScheduleCancel::synchronous(scheduled, start.elapsed())
}

/// Sends a `schedule_action_once` per delay to the timer thread (waiting until it has them
/// all), then a `cancel` per id (waiting until it has applied them). The thread drops a
/// cancelled entry from its id map at once; the entry's slot in the wheel is reclaimed when
/// the wheel passes it.
pub async fn schedule_cancel_hash_wheel(
    mut timer: HashWheelRef,
    delays: Arc<Vec<Duration>>,
) -> ScheduleCancel {
    let start = Instant::now();
    for (id, &delay) in delays.iter().enumerate() {
        timer.schedule_action_once(id as u64, delay, |_| {});
    }
    let caller_scheduled = start.elapsed();
    hash_wheel_barrier(&mut timer).await;
    let scheduled = start.elapsed();
    let start = Instant::now();
    for id in 0..delays.len() as u64 {
        timer.cancel(&id);
    }
    let caller_cancelled = start.elapsed();
    hash_wheel_barrier(&mut timer).await;
    let cancelled = start.elapsed();
    ScheduleCancel {
        scheduled,
        cancelled,
        caller_scheduled,
        caller_cancelled,
    }
}

// ---------------------------------------------------------------- timeouts

/// A timeout around a future that is already ready, awaited n times: the common case of a
/// request that answers in time. Returns the time for all n.
pub async fn ready_timeout_tokio(delays: Arc<Vec<Duration>>) -> Duration {
    let start = Instant::now();
    for (i, &delay) in delays.iter().enumerate() {
        let output = tokio::time::timeout(black_box(delay), std::future::ready(i)).await;
        black_box(output.expect("ready future"));
    }
    start.elapsed()
}

/// The same with pingora-timeout's `fast_timeout`.
pub async fn ready_timeout_pingora(delays: Arc<Vec<Duration>>) -> Duration {
    let start = Instant::now();
    for (i, &delay) in delays.iter().enumerate() {
        let output =
            pingora_timeout::fast_timeout::fast_timeout(black_box(delay), std::future::ready(i))
                .await;
        black_box(output.expect("ready future"));
    }
    start.elapsed()
}

/// The same with tokio-wheel, until the actor has applied everything (nothing: a timeout
/// whose future is ready registers no timer).
pub async fn ready_timeout_wheel(wheel: Wheel, delays: Arc<Vec<Duration>>) -> Duration {
    let start = Instant::now();
    for (i, &delay) in delays.iter().enumerate() {
        let output = wheel.timeout(black_box(delay), std::future::ready(i)).await;
        black_box(output.expect("ready future"));
    }
    wheel.flush().await;
    start.elapsed()
}

/// The request-with-timeout pattern: a timeout around a future that is still pending is polled
/// once (arming its timer) and dropped before it fires. Returns the time for all n.
///
/// Beware when reading tokio's figure: a registration earlier than the wake-up its driver is
/// parked for unparks the driver (a thread wake-up, ~0.5 µs here). With no other tokio timer
/// pending, every registration of this loop does; with one due sooner pending (as in most
/// servers, or while tokio-wheel's actor has a look armed after the previous repetition),
/// none does. Measured in this harness: ~600 ns against ~95 ns per timeout.
pub async fn timeout_churn_tokio(delays: Arc<Vec<Duration>>) -> Duration {
    let start = Instant::now();
    for &delay in delays.iter() {
        let mut timeout = pin!(tokio::time::timeout(delay, std::future::pending::<()>()));
        assert!(poll_once(timeout.as_mut()).is_pending());
    }
    start.elapsed()
}

/// The same with pingora-timeout's `fast_timeout` (timers shared per 10 ms tick).
pub async fn timeout_churn_pingora(delays: Arc<Vec<Duration>>) -> Duration {
    let start = Instant::now();
    for &delay in delays.iter() {
        let mut timeout = pin!(pingora_timeout::fast_timeout::fast_timeout(
            delay,
            std::future::pending::<()>()
        ));
        assert!(poll_once(timeout.as_mut()).is_pending());
    }
    start.elapsed()
}

/// The same with tokio-wheel, until the actor has applied everything.
pub async fn timeout_churn_wheel(wheel: Wheel, delays: Arc<Vec<Duration>>) -> Duration {
    let start = Instant::now();
    for &delay in delays.iter() {
        let mut timeout = pin!(wheel.timeout(delay, std::future::pending::<()>()));
        assert!(poll_once(timeout.as_mut()).is_pending());
    }
    wheel.flush().await;
    start.elapsed()
}

// ---------------------------------------------------------------- postpone

/// How each round moves every deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// 30 s later each round (keep-alive).
    Later,
    /// 1 s earlier each round.
    Earlier,
}

impl Move {
    /// The deadline of round `round` (1-based) for a timer first due at `base`.
    fn deadline(self, base: Instant, round: u32) -> Instant {
        match self {
            Move::Later => base + Duration::from_secs(30) * round,
            Move::Earlier => base - Duration::from_secs(1) * round,
        }
    }
}

/// First deadlines for the postpone scenarios: far enough that 10 earlier moves stay ahead.
fn postpone_bases(n: usize) -> Vec<Instant> {
    let now = Instant::now();
    let mut rng = Rng(0xA5A5_5A5A_1234_5678);
    (0..n)
        .map(|_| now + Duration::from_secs(100) + Duration::from_millis(rng.next() % 60_000))
        .collect()
}

/// `Sleep::reset` on n registered tokio sleeps, `rounds` times each. Returns the time of all
/// resets.
pub async fn postpone_tokio(n: usize, rounds: u32, how: Move) -> Duration {
    let bases = postpone_bases(n);
    let mut sleeps: Vec<_> = bases
        .iter()
        .map(|&base| {
            let mut sleep = Box::pin(tokio::time::sleep_until(base));
            assert!(poll_once(sleep.as_mut()).is_pending());
            sleep
        })
        .collect();
    let start = Instant::now();
    for round in 1..=rounds {
        for (sleep, &base) in sleeps.iter_mut().zip(&bases) {
            sleep.as_mut().reset(how.deadline(base, round));
        }
    }
    start.elapsed()
}

/// `Sleep::reset` on n registered tokio-wheel sleeps, `rounds` times each, then a flush.
pub async fn postpone_wheel(wheel: Wheel, n: usize, rounds: u32, how: Move) -> Duration {
    let bases = postpone_bases(n);
    let mut sleeps: Vec<_> = bases
        .iter()
        .map(|&base| {
            let mut sleep = wheel.sleep_until(base);
            assert!(poll_once(Pin::new(&mut sleep)).is_pending());
            sleep
        })
        .collect();
    wheel.flush().await;
    let start = Instant::now();
    for round in 1..=rounds {
        for (sleep, &base) in sleeps.iter_mut().zip(&bases) {
            Pin::new(sleep).reset(how.deadline(base, round));
        }
    }
    wheel.flush().await;
    let elapsed = start.elapsed();
    drop(sleeps);
    wheel.flush().await;
    elapsed
}

/// `Timers::reset_at` on n keyed entries, `rounds` times each, then a `len()` barrier.
pub async fn postpone_keyed(timers: Timers<u64, ()>, n: usize, rounds: u32, how: Move) -> Duration {
    let bases = postpone_bases(n);
    for (key, &base) in bases.iter().enumerate() {
        timers.set_at(key as u64, (), base);
    }
    assert_eq!(timers.len().await, n);
    let start = Instant::now();
    for round in 1..=rounds {
        for (key, &base) in bases.iter().enumerate() {
            timers.reset_at(&(key as u64), how.deadline(base, round));
        }
    }
    assert_eq!(timers.len().await, n);
    let elapsed = start.elapsed();
    assert_eq!(timers.drain().await.len(), n);
    elapsed
}

/// `KeyedTimer::reset_at` on the handles of n keyed entries (made by `Timers::insert_at`),
/// `rounds` times each, then a `len()` barrier: the connection-task pattern, where each task
/// holds its own entry's handle.
pub async fn postpone_keyed_handle(
    timers: Timers<u64, ()>,
    n: usize,
    rounds: u32,
    how: Move,
) -> Duration {
    let bases = postpone_bases(n);
    let handles: Vec<KeyedTimer<u64, ()>> = bases
        .iter()
        .enumerate()
        .map(|(key, &base)| timers.insert_at(key as u64, (), base))
        .collect();
    assert_eq!(timers.len().await, n);
    let start = Instant::now();
    for round in 1..=rounds {
        for (handle, &base) in handles.iter().zip(&bases) {
            handle.reset_at(how.deadline(base, round));
        }
    }
    assert_eq!(timers.len().await, n);
    let elapsed = start.elapsed();
    assert_eq!(timers.drain().await.len(), n);
    elapsed
}

/// `DelayQueue::reset_at` through `&mut`, `rounds` times per entry.
pub async fn postpone_delay_queue(n: usize, rounds: u32, how: Move) -> Duration {
    let bases = postpone_bases(n);
    let mut queue = DelayQueue::with_capacity(n);
    let keys: Vec<DelayKey> = bases
        .iter()
        .map(|&base| queue.insert_at((), base))
        .collect();
    let start = Instant::now();
    for round in 1..=rounds {
        for (key, &base) in keys.iter().zip(&bases) {
            queue.reset_at(key, how.deadline(base, round));
        }
    }
    start.elapsed()
}

/// `DelayQueue::reset_at` through an `Arc<Mutex<_>>`: the fair peer for a handle that many
/// tasks share.
pub async fn postpone_shared_delay_queue(n: usize, rounds: u32, how: Move) -> Duration {
    let bases = postpone_bases(n);
    let queue = Arc::new(Mutex::new(DelayQueue::with_capacity(n)));
    let keys: Vec<DelayKey> = {
        let mut queue = queue.lock().unwrap();
        bases
            .iter()
            .map(|&base| queue.insert_at((), base))
            .collect()
    };
    let start = Instant::now();
    for round in 1..=rounds {
        for (key, &base) in keys.iter().zip(&bases) {
            queue
                .lock()
                .unwrap()
                .reset_at(key, how.deadline(base, round));
        }
    }
    start.elapsed()
}

/// `kestrel-timer`'s `TimerWheel::postpone(id, delay, None)`, `rounds` times per timer.
/// kestrel takes a delay from now, not a deadline: each round reads the clock once and
/// passes every timer's deadline minus that instant (a keep-alive would pass its constant
/// timeout and read no clock at all).
pub async fn postpone_kestrel(timer: Kestrel, n: usize, rounds: u32, how: Move) -> Duration {
    let bases = postpone_bases(n);
    let now = Instant::now();
    let (ids, handles): (Vec<_>, Vec<_>) = bases
        .iter()
        .map(|&base| kestrel_register(&timer, base - now))
        .unzip();
    let start = Instant::now();
    for round in 1..=rounds {
        let now = Instant::now();
        for (&id, &base) in ids.iter().zip(&bases) {
            let delay = how.deadline(base, round).saturating_duration_since(now);
            assert!(timer.postpone(id, delay, None));
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(timer.cancel_batch(&ids), n);
    drop(handles);
    elapsed
}

// ---------------------------------------------------------------- keyed schedule + cancel

/// `Timers::set` for n keys (until `len()` says n), then `Timers::remove` for each (until
/// `len()` says 0).
pub async fn keyed_schedule_cancel_wheel(
    timers: Timers<u64, ()>,
    delays: Arc<Vec<Duration>>,
) -> ScheduleCancel {
    let n = delays.len();
    let start = Instant::now();
    for (key, &delay) in delays.iter().enumerate() {
        timers.set(key as u64, (), delay);
    }
    let caller_scheduled = start.elapsed();
    assert_eq!(timers.len().await, n);
    let scheduled = start.elapsed();
    let start = Instant::now();
    for key in 0..n as u64 {
        timers.remove(&key);
    }
    let caller_cancelled = start.elapsed();
    assert_eq!(timers.len().await, 0);
    let cancelled = start.elapsed();
    ScheduleCancel {
        scheduled,
        cancelled,
        caller_scheduled,
        caller_cancelled,
    }
}

/// The same on a `DelayQueue` with a `HashMap` from user key to queue key (the value is the
/// user key, so that an expiration says which key expired): what a keyed API costs users
/// of `DelayQueue`.
pub async fn keyed_schedule_cancel_delay_queue(delays: Arc<Vec<Duration>>) -> ScheduleCancel {
    let n = delays.len();
    let mut queue = DelayQueue::with_capacity(n);
    let mut index: HashMap<u64, DelayKey> = HashMap::with_capacity(n);
    let start = Instant::now();
    for (key, &delay) in delays.iter().enumerate() {
        let key = key as u64;
        if let Some(old) = index.insert(key, queue.insert(key, delay)) {
            queue.remove(&old);
        }
    }
    let scheduled = start.elapsed();
    let start = Instant::now();
    for key in 0..n as u64 {
        if let Some(k) = index.remove(&key) {
            queue.remove(&k);
        }
    }
    ScheduleCancel::synchronous(scheduled, start.elapsed())
}

/// The same through an `Arc<Mutex<_>>`, one lock per operation, as a handle shared across
/// tasks must be.
pub async fn keyed_schedule_cancel_shared_delay_queue(
    delays: Arc<Vec<Duration>>,
) -> ScheduleCancel {
    type Shared = (DelayQueue<u64>, HashMap<u64, DelayKey>);
    let n = delays.len();
    let shared: Arc<Mutex<Shared>> = Arc::new(Mutex::new((
        DelayQueue::with_capacity(n),
        HashMap::with_capacity(n),
    )));
    let start = Instant::now();
    for (key, &delay) in delays.iter().enumerate() {
        let key = key as u64;
        let mut guard = shared.lock().unwrap();
        let (queue, index) = &mut *guard;
        if let Some(old) = index.insert(key, queue.insert(key, delay)) {
            queue.remove(&old);
        }
    }
    let scheduled = start.elapsed();
    let start = Instant::now();
    for key in 0..n as u64 {
        let mut guard = shared.lock().unwrap();
        let (queue, index) = &mut *guard;
        if let Some(k) = index.remove(&key) {
            queue.remove(&k);
        }
    }
    ScheduleCancel::synchronous(scheduled, start.elapsed())
}

// ---------------------------------------------------------------- fire

/// What firing n timers spread over one second cost.
#[derive(Debug, Clone)]
pub struct FireReport {
    /// Process CPU time while the timers fired, per timer (every thread: workers, actors,
    /// tick tasks and timer threads alike).
    pub cpu_per_timer: Duration,
    /// Sorted lateness of every timer in nanoseconds: the instant it was seen complete minus
    /// its deadline, negative if it completed early.
    pub lateness: Vec<i64>,
}

impl FireReport {
    /// The lateness at percentile `p` (0.0 to 1.0), in nanoseconds.
    pub fn percentile(&self, p: f64) -> i64 {
        let index = ((self.lateness.len() as f64 - 1.0) * p).round() as usize;
        self.lateness[index]
    }

    /// The largest lateness, in nanoseconds.
    pub fn max(&self) -> i64 {
        *self.lateness.last().expect("timers fired")
    }

    /// How many timers completed before their deadline.
    pub fn early(&self) -> usize {
        self.lateness.partition_point(|&late| late < 0)
    }

    /// How far before its deadline the earliest timer completed (zero if none was early).
    pub fn most_early(&self) -> Duration {
        let first = *self.lateness.first().expect("timers fired");
        Duration::from_nanos(first.min(0).unsigned_abs())
    }
}

/// Lateness samples as they come in: the instant each timer was seen complete, against its
/// deadline.
struct LatenessLog {
    lateness: Vec<i64>,
}

impl LatenessLog {
    fn with_capacity(n: usize) -> LatenessLog {
        LatenessLog {
            lateness: Vec::with_capacity(n),
        }
    }

    fn len(&self) -> usize {
        self.lateness.len()
    }

    fn record(&mut self, deadline: Instant) {
        let now = Instant::now();
        self.lateness.push(if now >= deadline {
            (now - deadline).as_nanos() as i64
        } else {
            -((deadline - now).as_nanos() as i64)
        });
    }

    fn report(mut self, cpu: Duration) -> FireReport {
        let n = self.lateness.len();
        self.lateness.sort_unstable();
        FireReport {
            cpu_per_timer: cpu / n.max(1) as u32,
            lateness: self.lateness,
        }
    }
}

/// CPU time this process has used so far.
pub fn process_cpu_time() -> Duration {
    let mut spec = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `spec` is a valid, writable timespec; the clock id is a constant the kernel knows.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut spec) };
    assert_eq!(status, 0, "clock_gettime failed");
    Duration::new(spec.tv_sec as u64, spec.tv_nsec as u32)
}

/// Deadlines spread over one second, the first `200 ms + 1 µs · n` from now: registering
/// them all (before the CPU clock starts) must end before the first is due, and registering
/// 10^6 timers takes a few hundred milliseconds.
fn fire_deadlines(n: usize) -> Vec<Instant> {
    let first = Instant::now() + Duration::from_millis(200) + Duration::from_micros(n as u64);
    let mut rng = Rng(0x0123_4567_89AB_CDEF);
    let mut deadlines: Vec<Instant> = (0..n)
        .map(|_| first + Duration::from_micros(rng.next() % 1_000_000))
        .collect();
    deadlines.sort_unstable();
    deadlines
}

/// Drives a set of futures that each resolve to their deadline: the first poll registers them
/// all, then CPU time is measured while they fire.
///
/// The driver runs under `tokio::task::unconstrained`. Under Tokio's cooperative budget, a
/// task gets 128 units per poll and a `tokio::time::Sleep` that completes spends one; once
/// the budget is spent, each further `Sleep` polled returns `Pending` and hands its waker to
/// the scheduler's *deferred* list (`context::defer`, woken only after the task yields)
/// instead of waking it at once. `FuturesUnordered::poll_next` relies on children that
/// wake themselves during their poll to notice it should yield (it stops after two); with
/// deferred wakers it sees none, so it polls every other ready child (`polled == len`) before
/// returning. Each task poll then completes at most 128 timers but polls the whole backlog of
/// fired ones: once timers fire faster than that drains (≈ 4·10^5 timers per second here),
/// the backlog grows, each poll gets slower, and the run collapses into quadratic work
/// (2·10^5 timers: 31 million child polls and 5.6 s lateness; 4·10^5: ~1 300 completions per
/// second). That was the "tokio side stops making progress above ~6·10^5" of earlier runs:
/// the harness's fault (one task driving 10^6 futures), not the timer's, and with one task
/// per timer — the pattern it stands for — the budget never runs out. Unconstrained, the
/// driver drains every fired timer in one poll, for every peer alike.
///
/// `filed` completes once the timer service has filed what the first poll registered: tokio
/// files a `Sleep` inside that poll, the wheel's actor a moment later, so without the barrier
/// the wheel's filing was charged to the firing and tokio's was not (the keyed scenario has
/// always waited for its `len()` before starting the clock).
async fn fire_all<F, S>(futures: FuturesUnordered<F>, filed: S) -> FireReport
where
    F: Future<Output = Instant>,
    S: Future<Output = ()>,
{
    tokio::task::unconstrained(async move {
        let n = futures.len();
        let mut futures = pin!(futures);
        let mut log = LatenessLog::with_capacity(n);
        if let Poll::Ready(Some(deadline)) = futures
            .as_mut()
            .poll_next(&mut Context::from_waker(Waker::noop()))
        {
            log.record(deadline);
        }
        filed.await;
        let cpu = process_cpu_time();
        while let Some(deadline) = futures.next().await {
            log.record(deadline);
        }
        log.report(process_cpu_time() - cpu)
    })
    .await
}

pub async fn fire_tokio(n: usize) -> FireReport {
    let futures: FuturesUnordered<_> = fire_deadlines(n)
        .into_iter()
        .map(|deadline| async move {
            tokio::time::sleep_until(deadline).await;
            deadline
        })
        .collect();
    fire_all(futures, async {}).await
}

pub async fn fire_wheel(wheel: Wheel, n: usize) -> FireReport {
    let futures: FuturesUnordered<_> = fire_deadlines(n)
        .into_iter()
        .map(|deadline| {
            let sleep = wheel.sleep_until(deadline);
            async move {
                sleep.await;
                deadline
            }
        })
        .collect();
    let report = fire_all(futures, wheel.flush()).await;
    wheel.flush().await;
    report
}

/// Fires n keyed entries; returns the keyed set for the next run.
pub async fn fire_keyed(keyed: KeyedSet<()>, n: usize) -> (FireReport, KeyedSet<()>) {
    let KeyedSet {
        timers,
        mut expired,
    } = keyed;
    for (key, deadline) in fire_deadlines(n).into_iter().enumerate() {
        timers.set_at(key as u64, (), deadline);
    }
    assert_eq!(timers.len().await, n);
    let report = tokio::task::unconstrained(async {
        let cpu = process_cpu_time();
        let mut log = LatenessLog::with_capacity(n);
        while log.len() < n {
            let e = expired.next().await.expect("expiration");
            log.record(e.deadline());
        }
        log.report(process_cpu_time() - cpu)
    })
    .await;
    (report, KeyedSet { timers, expired })
}

pub async fn fire_delay_queue(n: usize) -> FireReport {
    let mut queue = DelayQueue::with_capacity(n);
    for deadline in fire_deadlines(n) {
        queue.insert_at(deadline, deadline);
    }
    tokio::task::unconstrained(async move {
        let cpu = process_cpu_time();
        let mut log = LatenessLog::with_capacity(n);
        while let Some(expired) = queue.next().await {
            log.record(expired.into_inner());
        }
        log.report(process_cpu_time() - cpu)
    })
    .await
}

/// `kestrel-timer`: one registration per deadline (as a delay from now: kestrel rounds it
/// down to its 10 ms tick), each awaited through its completion receiver.
pub async fn fire_kestrel(timer: Kestrel, n: usize) -> FireReport {
    let futures: FuturesUnordered<_> = fire_deadlines(n)
        .into_iter()
        .map(|deadline| {
            let delay = deadline.saturating_duration_since(Instant::now());
            let (receiver, _handle) = kestrel_register(&timer, delay).1.into_parts();
            async move {
                match receiver {
                    CompletionReceiver::OneShot(receiver) => {
                        assert_eq!(receiver.await, Ok(TaskCompletion::Called));
                    }
                    CompletionReceiver::Periodic(_) => unreachable!("one-shot timer"),
                }
                deadline
            }
        })
        .collect();
    fire_all(futures, async {}).await
}

/// `hierarchical_hash_wheel_timer`: one `schedule_action_once` per deadline (as a delay from
/// now, millisecond resolution) whose closure, run on the timer thread, completes a
/// `tokio::sync::oneshot` the waiting future awaits.
pub async fn fire_hash_wheel(mut timer: HashWheelRef, n: usize) -> FireReport {
    let futures: FuturesUnordered<_> = fire_deadlines(n)
        .into_iter()
        .enumerate()
        .map(|(id, deadline)| {
            let (done, fired) = tokio::sync::oneshot::channel();
            let delay = deadline.saturating_duration_since(Instant::now());
            timer.schedule_action_once(id as u64, delay, move |_| {
                let _ = done.send(());
            });
            async move {
                fired.await.expect("fired");
                deadline
            }
        })
        .collect();
    fire_all(futures, async {}).await
}

// ---------------------------------------------------------------- memory

/// A global allocator that counts live heap bytes. Binaries that want memory numbers install
/// it with `#[global_allocator]`.
pub struct CountingAllocator;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a side
// effect that never affects the returned memory.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Live heap bytes (meaningful only under [`CountingAllocator`]).
pub fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// Heap bytes per pending timer while `hold` keeps n timers pending. `hold` gets n and must
/// return what keeps them alive (and, for services, everything needed to clean up). Live
/// bytes are counted process-wide, so an actor's, tick task's or timer thread's storage
/// counts. Returns the bytes per timer and what `hold` returned, for the caller to clean up.
pub async fn bytes_per_timer<H, F>(n: usize, hold: H) -> (f64, F::Output)
where
    H: FnOnce(usize) -> F,
    F: Future,
{
    let before = live_bytes();
    let held = hold(n).await;
    let after = live_bytes();
    ((after - before) as f64 / n as f64, held)
}

/// The delays of the memory scenario, spread over [1 h, 2 h) at millisecond resolution: no
/// timer may fire while the count is taken, and registering 10^7 takes seconds.
fn memory_delays(n: usize) -> Vec<Duration> {
    let mut rng = Rng(7);
    (0..n)
        .map(|_| Duration::from_secs(3_600) + Duration::from_millis(rng.next() % 3_600_000))
        .collect()
}

pub async fn hold_tokio_sleeps(n: usize) -> Vec<Pin<Box<tokio::time::Sleep>>> {
    memory_delays(n)
        .into_iter()
        .map(|delay| {
            let mut sleep = Box::pin(tokio::time::sleep(delay));
            assert!(poll_once(sleep.as_mut()).is_pending());
            sleep
        })
        .collect()
}

pub async fn hold_wheel_sleeps(wheel: Wheel, n: usize) -> Vec<tokio_wheel::Sleep> {
    let sleeps = memory_delays(n)
        .into_iter()
        .map(|delay| {
            let mut sleep = wheel.sleep(delay);
            assert!(poll_once(Pin::new(&mut sleep)).is_pending());
            sleep
        })
        .collect();
    wheel.flush().await;
    sleeps
}

pub async fn hold_wheel_jobs(wheel: Wheel, n: usize) -> Vec<tokio_wheel::JobHandle<()>> {
    let jobs = memory_delays(n)
        .into_iter()
        .map(|delay| wheel.spawn_after(delay, async {}))
        .collect();
    wheel.flush().await;
    jobs
}

pub async fn hold_keyed(
    wheel: Wheel,
    n: usize,
) -> (
    tokio_wheel::Timers<u64, u64>,
    tokio_wheel::Expirations<u64, u64>,
) {
    let (timers, expired) = wheel.keyed::<u64, u64>();
    for (key, delay) in memory_delays(n).into_iter().enumerate() {
        timers.set(key as u64, key as u64, delay);
    }
    assert_eq!(timers.len().await, n);
    (timers, expired)
}

/// n keyed entries made by `Timers::insert`, each with its handle held (the handle's own
/// bytes count: the caller holds them).
pub async fn hold_keyed_handles(
    wheel: Wheel,
    n: usize,
) -> (
    tokio_wheel::Timers<u64, u64>,
    tokio_wheel::Expirations<u64, u64>,
    Vec<KeyedTimer<u64, u64>>,
) {
    let (timers, expired) = wheel.keyed::<u64, u64>();
    let handles = memory_delays(n)
        .into_iter()
        .enumerate()
        .map(|(key, delay)| timers.insert(key as u64, key as u64, delay))
        .collect();
    assert_eq!(timers.len().await, n);
    (timers, expired, handles)
}

pub async fn hold_delay_queue(n: usize) -> (DelayQueue<u64>, Vec<DelayKey>) {
    let mut queue = DelayQueue::new();
    let keys = memory_delays(n)
        .into_iter()
        .enumerate()
        .map(|(i, delay)| queue.insert(i as u64, delay))
        .collect();
    (queue, keys)
}

/// n pending `kestrel-timer` timers: the caller holds each one's handle (its id, a reference
/// to the wheel and the completion receiver), the wheel holds the entry and its index slot.
pub async fn hold_kestrel(timer: Kestrel, n: usize) -> (Kestrel, Vec<TimerHandleWithCompletion>) {
    let handles = memory_delays(n)
        .into_iter()
        .map(|delay| kestrel_register(&timer, delay).1)
        .collect();
    (timer, handles)
}

/// n pending `hierarchical_hash_wheel_timer` timers (no-op closures, ids 0..n), once the
/// thread has filed them all: the caller holds nothing per timer (the id is its own).
pub async fn hold_hash_wheel(mut timer: HashWheelRef, n: usize) -> HashWheelRef {
    for (id, delay) in memory_delays(n).into_iter().enumerate() {
        timer.schedule_action_once(id as u64, delay, |_| {});
    }
    hash_wheel_barrier(&mut timer).await;
    timer
}

// ---------------------------------------------------------------- idle

/// What an idle period with many far-future timers pending cost.
#[derive(Debug, Clone, Copy)]
pub struct IdleReport {
    /// Process CPU time over the period.
    pub cpu: Duration,
    /// Thread wake-ups over the period: voluntary context switches summed over the process's
    /// threads (Linux `/proc`; `None` elsewhere). Includes the one of the thread that sleeps
    /// through the period.
    pub thread_wakeups: Option<u64>,
    /// Actor wake-ups during the period (tokio-wheel's `Stats`).
    pub wakeups: Option<u64>,
}

pub const IDLE_PERIOD: Duration = Duration::from_secs(2);

/// The name of pingora-timeout's clock thread, which wakes every 10 ms for the rest of the
/// process once any `fast_timeout` was created, and cannot be stopped.
pub const PINGORA_THREAD: &str = "Timer thread";

/// Voluntary context switches of every thread of this process except pingora-timeout's
/// clock thread (a process-wide background cost no idle peer should be charged with).
pub fn thread_wakeups() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path();
        let Ok(name) = std::fs::read_to_string(path.join("comm")) else {
            continue; // the thread exited meanwhile
        };
        if name.trim_end() == PINGORA_THREAD {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(path.join("status")) else {
            continue;
        };
        total += status
            .lines()
            .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|count| count.trim().parse::<u64>().ok())?;
    }
    Some(total)
}

/// Whether pingora-timeout's clock thread runs in this process (its 10 ms ticks then show in
/// every idle CPU number).
pub fn pingora_clock_running() -> bool {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks.flatten().any(|task| {
                std::fs::read_to_string(task.path().join("comm"))
                    .is_ok_and(|name| name.trim_end() == PINGORA_THREAD)
            })
        })
        .unwrap_or(false)
}

/// Sleeps this worker thread through the idle period (not a Tokio timer: nothing of the
/// timers under test may wake for it) and returns the CPU time and thread wake-ups it saw.
fn idle_period() -> (Duration, Option<u64>) {
    let switches = thread_wakeups();
    let cpu = process_cpu_time();
    std::thread::sleep(IDLE_PERIOD);
    let cpu = process_cpu_time() - cpu;
    let switches = thread_wakeups()
        .zip(switches)
        .map(|(after, before)| after.saturating_sub(before));
    (cpu, switches)
}

fn far_delays(n: usize) -> Vec<Duration> {
    (0..n)
        .map(|i| Duration::from_secs(3_600 + i as u64 % 3_600))
        .collect()
}

pub async fn idle_tokio(n: usize) -> IdleReport {
    let _sleeps: Vec<_> = far_delays(n)
        .into_iter()
        .map(|delay| {
            let mut sleep = Box::pin(tokio::time::sleep(delay));
            assert!(poll_once(sleep.as_mut()).is_pending());
            sleep
        })
        .collect();
    let (cpu, thread_wakeups) = idle_period();
    IdleReport {
        cpu,
        thread_wakeups,
        wakeups: None,
    }
}

pub async fn idle_wheel(wheel: Wheel, n: usize) -> IdleReport {
    let sleeps: Vec<_> = far_delays(n)
        .into_iter()
        .map(|delay| {
            let mut sleep = wheel.sleep(delay);
            assert!(poll_once(Pin::new(&mut sleep)).is_pending());
            sleep
        })
        .collect();
    wheel.flush().await;
    let wakeups = wheel.stats().wakeups;
    let (cpu, thread_wakeups) = idle_period();
    let report = IdleReport {
        cpu,
        thread_wakeups,
        wakeups: Some(wheel.stats().wakeups - wakeups),
    };
    drop(sleeps);
    wheel.flush().await;
    report
}

/// `kestrel-timer` ticks every 10 ms whatever is pending: about 200 wake-ups in 2 s.
pub async fn idle_kestrel(timer: Kestrel, n: usize) -> IdleReport {
    let (ids, handles): (Vec<_>, Vec<_>) = far_delays(n)
        .into_iter()
        .map(|delay| kestrel_register(&timer, delay))
        .unzip();
    let (cpu, thread_wakeups) = idle_period();
    assert_eq!(timer.cancel_batch(&ids), n);
    drop(handles);
    IdleReport {
        cpu,
        thread_wakeups,
        wakeups: None,
    }
}

/// `hierarchical_hash_wheel_timer`'s thread sleeps until its wheel's next slot boundary.
pub async fn idle_hash_wheel(mut timer: HashWheelRef, n: usize) -> IdleReport {
    for (id, delay) in far_delays(n).into_iter().enumerate() {
        timer.schedule_action_once(id as u64, delay, |_| {});
    }
    hash_wheel_barrier(&mut timer).await;
    let (cpu, thread_wakeups) = idle_period();
    for id in 0..n as u64 {
        timer.cancel(&id);
    }
    hash_wheel_barrier(&mut timer).await;
    IdleReport {
        cpu,
        thread_wakeups,
        wakeups: None,
    }
}

// ---------------------------------------------------------------- keyed churn

/// One churn operation on key `key`.
#[derive(Debug, Clone, Copy)]
pub enum Churn {
    Reset,
    Remove,
    Set,
}

/// The churn mix: half resets, a quarter removals, a quarter (re-)sets, on random keys.
pub fn churn_ops(n: usize, count: usize) -> Vec<(u64, Churn, Duration)> {
    let mut rng = Rng(0xDEAD_BEEF_F00D_CAFE);
    (0..count)
        .map(|_| {
            let key = rng.next() % n as u64;
            let op = match rng.next() % 4 {
                0 | 1 => Churn::Reset,
                2 => Churn::Remove,
                _ => Churn::Set,
            };
            (key, op, Duration::from_millis(1_000 + rng.next() % 59_000))
        })
        .collect()
}

pub async fn churn_keyed(
    timers: Timers<u64, u64>,
    n: usize,
    ops: Arc<Vec<(u64, Churn, Duration)>>,
) -> Duration {
    for key in 0..n as u64 {
        timers.set(key, key, Duration::from_secs(30));
    }
    assert_eq!(timers.len().await, n);
    let start = Instant::now();
    for &(key, op, delay) in ops.iter() {
        match op {
            Churn::Reset => timers.reset(&key, delay),
            Churn::Remove => timers.remove(&key),
            Churn::Set => timers.set(key, key, delay),
        }
    }
    timers.len().await;
    let elapsed = start.elapsed();
    timers.drain().await;
    elapsed
}

/// DelayQueue with a `HashMap` from user key to queue key: what a keyed API costs users today.
pub async fn churn_delay_queue(n: usize, ops: Arc<Vec<(u64, Churn, Duration)>>) -> Duration {
    let mut queue = DelayQueue::with_capacity(n);
    let mut index = HashMap::with_capacity(n);
    for key in 0..n as u64 {
        index.insert(key, queue.insert(key, Duration::from_secs(30)));
    }
    let start = Instant::now();
    for &(key, op, delay) in ops.iter() {
        churn_step(&mut queue, &mut index, key, op, delay);
    }
    start.elapsed()
}

/// The same through an `Arc<Mutex<_>>`, as a handle shared across tasks must be.
pub async fn churn_shared_delay_queue(n: usize, ops: Arc<Vec<(u64, Churn, Duration)>>) -> Duration {
    type Shared = (DelayQueue<u64>, HashMap<u64, DelayKey>);
    let shared: Arc<Mutex<Shared>> = Arc::new(Mutex::new((
        DelayQueue::with_capacity(n),
        HashMap::with_capacity(n),
    )));
    {
        let mut guard = shared.lock().unwrap();
        let (queue, index) = &mut *guard;
        for key in 0..n as u64 {
            index.insert(key, queue.insert(key, Duration::from_secs(30)));
        }
    }
    let start = Instant::now();
    for &(key, op, delay) in ops.iter() {
        let mut guard = shared.lock().unwrap();
        let (queue, index) = &mut *guard;
        churn_step(queue, index, key, op, delay);
    }
    start.elapsed()
}

fn churn_step(
    queue: &mut DelayQueue<u64>,
    index: &mut HashMap<u64, DelayKey>,
    key: u64,
    op: Churn,
    delay: Duration,
) {
    match op {
        Churn::Reset => {
            if let Some(k) = index.get(&key) {
                queue.reset(k, delay);
            }
        }
        Churn::Remove => {
            if let Some(k) = index.remove(&key) {
                queue.remove(&k);
            }
        }
        Churn::Set => {
            if let Some(k) = index.remove(&key) {
                queue.remove(&k);
            }
            index.insert(key, queue.insert(key, delay));
        }
    }
}

// ---------------------------------------------------------------- many producers

/// The delay of producer `p`'s timers.
fn producer_rng(p: usize) -> Rng {
    Rng(p as u64 + 1)
}

fn producer_delay(rng: &mut Rng) -> Duration {
    Duration::from_millis(1_000 + rng.next() % 59_000)
}

/// Spawns `producers` tasks running `produce(p)` at once and waits for them all.
async fn run_producers<F, Fut>(producers: usize, produce: F)
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let tasks: Vec<_> = (0..producers).map(|p| tokio::spawn(produce(p))).collect();
    for task in tasks {
        task.await.expect("producer");
    }
}

/// `producers` tasks each register and drop `per_task` tokio sleeps, all at once.
pub async fn producers_tokio(producers: usize, per_task: usize) -> Duration {
    let start = Instant::now();
    run_producers(producers, |p| async move {
        let mut rng = producer_rng(p);
        for _ in 0..per_task {
            let mut sleep = Box::pin(tokio::time::sleep(producer_delay(&mut rng)));
            assert!(poll_once(sleep.as_mut()).is_pending());
        }
    })
    .await;
    start.elapsed()
}

/// The same with tokio-wheel sleeps, then a flush.
pub async fn producers_wheel(wheel: Wheel, producers: usize, per_task: usize) -> Duration {
    let start = Instant::now();
    run_producers(producers, |p| {
        let wheel = wheel.clone();
        async move {
            let mut rng = producer_rng(p);
            for _ in 0..per_task {
                let mut sleep = wheel.sleep(producer_delay(&mut rng));
                assert!(poll_once(Pin::new(&mut sleep)).is_pending());
            }
        }
    })
    .await;
    wheel.flush().await;
    start.elapsed()
}

/// The same with insert + remove on one `Arc<Mutex<DelayQueue>>`.
pub async fn producers_shared_delay_queue(producers: usize, per_task: usize) -> Duration {
    let queue = Arc::new(Mutex::new(DelayQueue::<()>::new()));
    let start = Instant::now();
    run_producers(producers, |p| {
        let queue = queue.clone();
        async move {
            let mut rng = producer_rng(p);
            for _ in 0..per_task {
                let key = queue.lock().unwrap().insert((), producer_delay(&mut rng));
                queue.lock().unwrap().remove(&key);
            }
        }
    })
    .await;
    start.elapsed()
}

/// The same with register + cancel on one `kestrel-timer` wheel shared through an `Arc`
/// (each pair takes its mutex three times: allocate, register, cancel).
pub async fn producers_kestrel(timer: Kestrel, producers: usize, per_task: usize) -> Duration {
    let start = Instant::now();
    run_producers(producers, |p| {
        let timer = timer.clone();
        async move {
            let mut rng = producer_rng(p);
            for _ in 0..per_task {
                let (_, handle) = kestrel_register(&timer, producer_delay(&mut rng));
                assert!(handle.cancel());
            }
        }
    })
    .await;
    start.elapsed()
}

/// The same with schedule + cancel messages from a cloned `TimerRef` per task to one timer
/// thread, until the thread has applied them all.
pub async fn producers_hash_wheel(
    mut timer: HashWheelRef,
    producers: usize,
    per_task: usize,
) -> Duration {
    let start = Instant::now();
    run_producers(producers, |p| {
        let mut timer = timer.clone();
        async move {
            let mut rng = producer_rng(p);
            for i in 0..per_task {
                let id = ((p as u64) << 32) | i as u64;
                timer.schedule_action_once(id, producer_delay(&mut rng), |_| {});
                timer.cancel(&id);
            }
        }
    })
    .await;
    hash_wheel_barrier(&mut timer).await;
    start.elapsed()
}

// ---------------------------------------------------------------- requests

/// The request-shaped scenario's "network": a thread that answers every pending request once
/// per `wait` of real time (a `std::thread::sleep`, so that no Tokio timer of the runtime under
/// test is involved), standing for a round trip of `wait` to `2 · wait`. It samples the live
/// heap each time it wakes, for the peak.
struct Responder {
    requests: Option<std::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>>>,
    thread: std::thread::JoinHandle<isize>,
}

impl Responder {
    fn start(wait: Duration) -> Responder {
        let (requests, pending) = std::sync::mpsc::channel::<tokio::sync::oneshot::Sender<()>>();
        let thread = std::thread::Builder::new()
            .name("responder".into())
            .spawn(move || {
                let mut peak = live_bytes();
                loop {
                    std::thread::sleep(wait);
                    peak = peak.max(live_bytes());
                    loop {
                        match pending.try_recv() {
                            Ok(answer) => {
                                let _ = answer.send(());
                            }
                            Err(std::sync::mpsc::TryRecvError::Empty) => break,
                            Err(std::sync::mpsc::TryRecvError::Disconnected) => return peak,
                        }
                    }
                }
            })
            .expect("responder thread");
        Responder {
            requests: Some(requests),
            thread,
        }
    }

    fn sender(&self) -> std::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>> {
        self.requests.clone().expect("running")
    }

    /// Waits for the thread (every sender must be gone) and returns the peak live heap it saw.
    fn stop(mut self) -> isize {
        drop(self.requests.take());
        self.thread.join().expect("responder")
    }
}

/// What the request-shaped scenario cost.
#[derive(Debug, Clone, Copy)]
pub struct RequestReport {
    /// Process CPU time (every thread) per request.
    pub cpu_per_request: Duration,
    /// Wall time per request (all tasks together).
    pub wall_per_request: Duration,
    /// The largest live heap seen while it ran, minus the live heap before it started.
    pub peak_heap: isize,
}

/// The real wait of the request scenario's responder: round trips of 200–400 µs.
pub const REQUEST_WAIT: Duration = Duration::from_micros(200);
/// The header-read timeout every request arms and drops.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The request-shaped scenario (a keep-alive server's header-read timer): `tasks` tasks on the
/// runtime, each `per_task` times makes a 30 s timer with `make`, sends a request to the
/// responder thread, polls the answer and then the timer (which registers it, with the task's
/// waker), awaits the answer (a real round trip of 200–400 µs) and drops the timer unfired.
/// `finish` runs after the last task, inside the measured time (a flush, for tokio-wheel).
pub async fn requests<T, M, F>(tasks: usize, per_task: usize, make: M, finish: F) -> RequestReport
where
    M: Fn() -> T + Clone + Send + 'static,
    T: Future<Output = ()> + Send + 'static,
    F: Future<Output = ()>,
{
    let responder = Responder::start(REQUEST_WAIT);
    let before = live_bytes();
    let cpu = process_cpu_time();
    let start = Instant::now();
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let network = responder.sender();
            let make = make.clone();
            tokio::spawn(async move {
                for _ in 0..per_task {
                    let timer = pin!(make());
                    let mut timer = timer;
                    let (answer, answered) = tokio::sync::oneshot::channel();
                    network.send(answer).expect("responder");
                    let mut answered = pin!(answered);
                    std::future::poll_fn(|cx| {
                        if let Poll::Ready(answer) = answered.as_mut().poll(cx) {
                            answer.expect("answered");
                            return Poll::Ready(());
                        }
                        assert!(timer.as_mut().poll(cx).is_pending(), "the timer fired");
                        Poll::Pending
                    })
                    .await;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("request task");
    }
    finish.await;
    let wall = start.elapsed();
    let cpu = process_cpu_time() - cpu;
    let peak = responder.stop();
    let n = (tasks * per_task) as u32;
    RequestReport {
        cpu_per_request: cpu / n,
        wall_per_request: wall / n,
        peak_heap: peak - before,
    }
}

/// The request scenario with no timer at all: the floor every timer adds to.
pub async fn requests_none(tasks: usize, per_task: usize) -> RequestReport {
    requests(tasks, per_task, std::future::pending::<()>, async {}).await
}

/// The request scenario with `tokio::time::sleep` (unboxed, pinned in the task).
pub async fn requests_tokio(tasks: usize, per_task: usize) -> RequestReport {
    requests(
        tasks,
        per_task,
        || tokio::time::sleep(REQUEST_TIMEOUT),
        async {},
    )
    .await
}

/// The request scenario with pingora-timeout's `fast_sleep` (timers shared per 10 ms tick).
pub async fn requests_pingora(tasks: usize, per_task: usize) -> RequestReport {
    requests(
        tasks,
        per_task,
        || pingora_timeout::fast_timeout::fast_sleep(REQUEST_TIMEOUT),
        async {},
    )
    .await
}

/// The request scenario with tokio-wheel sleeps, until the actor has applied everything.
pub async fn requests_wheel(wheel: Wheel, tasks: usize, per_task: usize) -> RequestReport {
    let maker = wheel.clone();
    let stats = wheel.stats();
    let report = requests(tasks, per_task, move || maker.sleep(REQUEST_TIMEOUT), {
        let wheel = wheel.clone();
        async move { wheel.flush().await }
    })
    .await;
    if std::env::var_os("REQUEST_STATS").is_some() {
        let after = wheel.stats();
        let n = (tasks * per_task) as f64;
        eprintln!(
            "tokio-wheel requests: {:.3} actor wake-ups, {:.2} commands, {:.3} filed per request",
            (after.wakeups - stats.wakeups) as f64 / n,
            (after.commands - stats.commands) as f64 / n,
            (after.inserted - stats.inserted) as f64 / n,
        );
    }
    report
}

// ---------------------------------------------------------------- keyed, many producers

/// Keys every keyed-producer run starts with (pending far ahead), so a queue is not empty
/// and a new key's deadline rarely becomes its earliest: the shape of a server with live
/// connections.
pub const KEYED_PRODUCERS_PREFILL: u64 = 10_000;

/// Producer `p`'s `i`-th key: each task owns its keys (a connection's task its own), none
/// collides with the prefill.
fn producer_key(p: usize, i: usize) -> u64 {
    ((p as u64 + 1) << 32) | i as u64
}

/// `producers` tasks each set `per_task` keys (deadlines in [1 s, 60 s]) and remove each right
/// after on one keyed set (`reset` by key in between when `reset` is true), then a `len()`
/// barrier: every command applied. The set holds [`KEYED_PRODUCERS_PREFILL`] keys meanwhile.
pub async fn producers_keyed_wheel(
    timers: Timers<u64, u64>,
    producers: usize,
    per_task: usize,
    reset: bool,
) -> Duration {
    let mut rng = Rng(7);
    for key in 0..KEYED_PRODUCERS_PREFILL {
        timers.set(key, key, producer_delay(&mut rng));
    }
    timers.len().await;
    let start = Instant::now();
    run_producers(producers, |p| {
        let timers = timers.clone();
        async move {
            let mut rng = producer_rng(p);
            for i in 0..per_task {
                let key = producer_key(p, i);
                timers.set(key, key, producer_delay(&mut rng));
                if reset {
                    timers.reset(&key, producer_delay(&mut rng));
                }
                timers.remove(&key);
            }
        }
    })
    .await;
    timers.len().await;
    let elapsed = start.elapsed();
    timers.drain().await;
    elapsed
}

type SharedKeyedQueue = Arc<Mutex<(DelayQueue<u64>, HashMap<u64, DelayKey>)>>;

/// The same on one `Arc<Mutex<DelayQueue + HashMap>>` driven by its own task (which polls it
/// for expirations, as a user must, and is woken when an insert becomes the earliest).
pub async fn producers_keyed_shared_delay_queue(
    producers: usize,
    per_task: usize,
    reset: bool,
) -> Duration {
    let shared: SharedKeyedQueue = Arc::new(Mutex::new((DelayQueue::new(), HashMap::new())));
    {
        let mut guard = shared.lock().unwrap();
        let (queue, index) = &mut *guard;
        let mut rng = Rng(7);
        for key in 0..KEYED_PRODUCERS_PREFILL {
            index.insert(key, queue.insert(key, producer_delay(&mut rng)));
        }
    }
    let stop = Arc::new(tokio::sync::Notify::new());
    let driver = tokio::spawn({
        let (shared, stop) = (shared.clone(), stop.clone());
        async move {
            let expired = std::future::poll_fn(|cx| {
                let mut guard = shared.lock().unwrap();
                let (queue, index) = &mut *guard;
                while let Poll::Ready(Some(expired)) = queue.poll_expired(cx) {
                    index.remove(expired.get_ref());
                }
                // Empty (`Ready(None)`) or nothing due: the waker is stored either way.
                Poll::<()>::Pending
            });
            tokio::select! {
                () = expired => {}
                () = stop.notified() => {}
            }
        }
    });
    let start = Instant::now();
    run_producers(producers, |p| {
        let shared = shared.clone();
        async move {
            let mut rng = producer_rng(p);
            for i in 0..per_task {
                let key = producer_key(p, i);
                let delay = producer_delay(&mut rng);
                {
                    let mut guard = shared.lock().unwrap();
                    let (queue, index) = &mut *guard;
                    if let Some(old) = index.insert(key, queue.insert(key, delay)) {
                        queue.remove(&old);
                    }
                }
                if reset {
                    let delay = producer_delay(&mut rng);
                    let guard = &mut *shared.lock().unwrap();
                    if let Some(k) = guard.1.get(&key) {
                        guard.0.reset(k, delay);
                    }
                }
                let guard = &mut *shared.lock().unwrap();
                if let Some(k) = guard.1.remove(&key) {
                    guard.0.remove(&k);
                }
            }
        }
    })
    .await;
    let elapsed = start.elapsed();
    stop.notify_one();
    driver.await.expect("driver");
    elapsed
}
