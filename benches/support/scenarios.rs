//! The comparison scenarios, shared by the criterion benches (`benches/compare.rs`) and the
//! table printer (`examples/compare.rs`): tokio-wheel against `tokio::time` and
//! `tokio_util::time::DelayQueue`, the same work done by each in the same run.
//!
//! Every function runs on a Tokio worker thread and returns wall time for the whole batch
//! of operations. tokio-wheel's numbers include waiting for the actor to apply everything
//! (`Wheel::flush`, or `Timers::len` for keyed sets): they are end to end, not just the cost
//! of sending a command.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use tokio::time::Instant;
use tokio_util::time::DelayQueue;
use tokio_util::time::delay_queue::Key as DelayKey;
use tokio_wheel::Wheel;

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

// ---------------------------------------------------------------- schedule + cancel

/// Registers a boxed `tokio::time::Sleep` per delay, then drops them all.
/// Returns (time to schedule all, time to cancel all).
pub async fn schedule_cancel_tokio(delays: Arc<Vec<Duration>>) -> (Duration, Duration) {
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
    (scheduled, start.elapsed())
}

/// What tokio-wheel's schedule + cancel cost, end to end and on the caller's side.
#[derive(Debug, Clone, Copy)]
pub struct WheelScheduleCancel {
    /// Until the actor has filed every timer.
    pub scheduled: Duration,
    /// Until the actor has reclaimed every timer.
    pub cancelled: Duration,
    /// What the registering task itself spent (the actor works on another core meanwhile).
    pub caller_scheduled: Duration,
    /// What the dropping task itself spent.
    pub caller_cancelled: Duration,
}

/// Registers a tokio-wheel `Sleep` per delay (waiting until the actor has them all), then
/// drops them all (waiting until the actor has reclaimed them).
pub async fn schedule_cancel_wheel(
    wheel: Wheel,
    delays: Arc<Vec<Duration>>,
) -> WheelScheduleCancel {
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
    wheel.shutdown().await;
    WheelScheduleCancel {
        scheduled,
        cancelled,
        caller_scheduled,
        caller_cancelled,
    }
}

/// Inserts every delay into a `DelayQueue`, then removes them all.
pub async fn schedule_cancel_delay_queue(delays: Arc<Vec<Duration>>) -> (Duration, Duration) {
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
    (scheduled, start.elapsed())
}

// ---------------------------------------------------------------- timeouts

/// The request-with-timeout pattern: a timeout around a future that is still pending is polled
/// once (arming its timer) and dropped before it fires. Returns the time for all n.
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
    let elapsed = start.elapsed();
    wheel.shutdown().await;
    elapsed
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
    wheel.shutdown().await;
    elapsed
}

/// `Timers::reset_at` on n keyed entries, `rounds` times each, then a `len()` barrier.
pub async fn postpone_keyed(wheel: Wheel, n: usize, rounds: u32, how: Move) -> Duration {
    let bases = postpone_bases(n);
    let (timers, _expired) = wheel.keyed::<u64, ()>();
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
    wheel.shutdown().await;
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

// ---------------------------------------------------------------- fire

/// What firing n timers spread over one second cost.
#[derive(Debug, Clone)]
pub struct FireReport {
    /// Process CPU time while the timers fired, per timer.
    pub cpu_per_timer: Duration,
    /// Sorted lateness of every timer (completion minus deadline).
    pub lateness: Vec<Duration>,
}

impl FireReport {
    pub fn percentile(&self, p: f64) -> Duration {
        let index = ((self.lateness.len() as f64 - 1.0) * p).round() as usize;
        self.lateness[index]
    }

    pub fn max(&self) -> Duration {
        *self.lateness.last().expect("timers fired")
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

/// Deadlines spread evenly over one second, starting 200 ms from now.
fn fire_deadlines(n: usize) -> Vec<Instant> {
    let first = Instant::now() + Duration::from_millis(200);
    let mut rng = Rng(0x0123_4567_89AB_CDEF);
    let mut deadlines: Vec<Instant> = (0..n)
        .map(|_| first + Duration::from_micros(rng.next() % 1_000_000))
        .collect();
    deadlines.sort_unstable();
    deadlines
}

/// Drives a set of futures that each resolve to their lateness: the first poll registers them
/// all, then CPU time is measured while they fire.
async fn fire_all<F>(futures: FuturesUnordered<F>) -> FireReport
where
    F: Future<Output = Duration>,
{
    let n = futures.len();
    let mut futures = pin!(futures);
    let mut lateness = Vec::with_capacity(n);
    if let Poll::Ready(Some(late)) = futures
        .as_mut()
        .poll_next(&mut Context::from_waker(Waker::noop()))
    {
        lateness.push(late);
    }
    let cpu = process_cpu_time();
    while let Some(late) = futures.next().await {
        lateness.push(late);
    }
    let cpu = process_cpu_time() - cpu;
    lateness.sort_unstable();
    FireReport {
        cpu_per_timer: cpu / n as u32,
        lateness,
    }
}

pub async fn fire_tokio(n: usize) -> FireReport {
    let futures: FuturesUnordered<_> = fire_deadlines(n)
        .into_iter()
        .map(|deadline| async move {
            tokio::time::sleep_until(deadline).await;
            Instant::now() - deadline
        })
        .collect();
    fire_all(futures).await
}

pub async fn fire_wheel(wheel: Wheel, n: usize) -> FireReport {
    let futures: FuturesUnordered<_> = fire_deadlines(n)
        .into_iter()
        .map(|deadline| {
            let sleep = wheel.sleep_until(deadline);
            async move {
                sleep.await;
                Instant::now() - deadline
            }
        })
        .collect();
    let report = fire_all(futures).await;
    wheel.shutdown().await;
    report
}

pub async fn fire_keyed(wheel: Wheel, n: usize) -> FireReport {
    let (timers, mut expired) = wheel.keyed::<u64, ()>();
    for (key, deadline) in fire_deadlines(n).into_iter().enumerate() {
        timers.set_at(key as u64, (), deadline);
    }
    assert_eq!(timers.len().await, n);
    let cpu = process_cpu_time();
    let mut lateness = Vec::with_capacity(n);
    while lateness.len() < n {
        let e = expired.next().await.expect("expiration");
        lateness.push(Instant::now() - e.deadline());
    }
    let cpu = process_cpu_time() - cpu;
    lateness.sort_unstable();
    wheel.shutdown().await;
    FireReport {
        cpu_per_timer: cpu / n as u32,
        lateness,
    }
}

pub async fn fire_delay_queue(n: usize) -> FireReport {
    let mut queue = DelayQueue::with_capacity(n);
    for deadline in fire_deadlines(n) {
        queue.insert_at(deadline, deadline);
    }
    let cpu = process_cpu_time();
    let mut lateness = Vec::with_capacity(n);
    while let Some(expired) = queue.next().await {
        lateness.push(Instant::now() - expired.into_inner());
    }
    let cpu = process_cpu_time() - cpu;
    lateness.sort_unstable();
    FireReport {
        cpu_per_timer: cpu / n as u32,
        lateness,
    }
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
/// return what keeps them alive. A wheel given as `wheel` is shut down afterwards, so no
/// detached job or keyed entry keeps working in the background of later scenarios.
pub async fn bytes_per_timer<H, F>(n: usize, wheel: Option<Wheel>, hold: H) -> f64
where
    H: FnOnce(usize) -> F,
    F: Future,
{
    let before = live_bytes();
    let held = hold(n).await;
    let after = live_bytes();
    drop(held);
    if let Some(wheel) = wheel {
        wheel.shutdown().await;
    }
    (after - before) as f64 / n as f64
}

pub async fn hold_tokio_sleeps(n: usize) -> Vec<Pin<Box<tokio::time::Sleep>>> {
    Rng(7)
        .delays(n)
        .into_iter()
        .map(|delay| {
            let mut sleep = Box::pin(tokio::time::sleep(delay));
            assert!(poll_once(sleep.as_mut()).is_pending());
            sleep
        })
        .collect()
}

pub async fn hold_wheel_sleeps(wheel: Wheel, n: usize) -> Vec<tokio_wheel::Sleep> {
    let sleeps = Rng(7)
        .delays(n)
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
    let jobs = Rng(7)
        .delays(n)
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
    for (key, delay) in Rng(7).delays(n).into_iter().enumerate() {
        timers.set(key as u64, key as u64, delay);
    }
    assert_eq!(timers.len().await, n);
    (timers, expired)
}

pub async fn hold_delay_queue(n: usize) -> (DelayQueue<u64>, Vec<DelayKey>) {
    let mut queue = DelayQueue::new();
    let keys = Rng(7)
        .delays(n)
        .into_iter()
        .enumerate()
        .map(|(i, delay)| queue.insert(i as u64, delay))
        .collect();
    (queue, keys)
}

// ---------------------------------------------------------------- idle

/// What an idle period with many far-future timers pending cost.
#[derive(Debug, Clone, Copy)]
pub struct IdleReport {
    pub cpu: Duration,
    /// Actor wake-ups during the period (tokio-wheel only).
    pub wakeups: Option<u64>,
}

const IDLE_PERIOD: Duration = Duration::from_secs(2);

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
    let cpu = process_cpu_time();
    std::thread::sleep(IDLE_PERIOD); // the same idle wait as tokio-wheel's
    IdleReport {
        cpu: process_cpu_time() - cpu,
        wakeups: None,
    }
}

pub async fn idle_wheel(wheel: Wheel, n: usize) -> IdleReport {
    let _sleeps: Vec<_> = far_delays(n)
        .into_iter()
        .map(|delay| {
            let mut sleep = wheel.sleep(delay);
            assert!(poll_once(Pin::new(&mut sleep)).is_pending());
            sleep
        })
        .collect();
    wheel.flush().await;
    let wakeups = wheel.stats().wakeups;
    let cpu = process_cpu_time();
    std::thread::sleep(IDLE_PERIOD); // not a Tokio timer: nothing of ours may wake
    let report = IdleReport {
        cpu: process_cpu_time() - cpu,
        wakeups: Some(wheel.stats().wakeups - wakeups),
    };
    wheel.shutdown().await;
    report
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
    wheel: Wheel,
    n: usize,
    ops: Arc<Vec<(u64, Churn, Duration)>>,
) -> Duration {
    let (timers, _expired) = wheel.keyed::<u64, u64>();
    for key in 0..n as u64 {
        timers.set(key, key, Duration::from_secs(30));
    }
    timers.len().await;
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
    wheel.shutdown().await;
    elapsed
}

/// DelayQueue with a `HashMap` from user key to queue key: what a keyed API costs users today.
pub async fn churn_delay_queue(n: usize, ops: Arc<Vec<(u64, Churn, Duration)>>) -> Duration {
    let mut queue = DelayQueue::with_capacity(n);
    let mut index = std::collections::HashMap::with_capacity(n);
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
    type Shared = (DelayQueue<u64>, std::collections::HashMap<u64, DelayKey>);
    let shared: Arc<Mutex<Shared>> = Arc::new(Mutex::new((
        DelayQueue::with_capacity(n),
        std::collections::HashMap::with_capacity(n),
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
    index: &mut std::collections::HashMap<u64, DelayKey>,
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

/// `producers` tasks each register and drop `per_task` tokio sleeps, all at once.
pub async fn producers_tokio(producers: usize, per_task: usize) -> Duration {
    let start = Instant::now();
    let tasks: Vec<_> = (0..producers)
        .map(|p| {
            tokio::spawn(async move {
                let mut rng = Rng(p as u64 + 1);
                for _ in 0..per_task {
                    let delay = Duration::from_millis(1_000 + rng.next() % 59_000);
                    let mut sleep = Box::pin(tokio::time::sleep(delay));
                    assert!(poll_once(sleep.as_mut()).is_pending());
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("producer");
    }
    start.elapsed()
}

/// The same with tokio-wheel sleeps, then a flush.
pub async fn producers_wheel(wheel: Wheel, producers: usize, per_task: usize) -> Duration {
    let start = Instant::now();
    let tasks: Vec<_> = (0..producers)
        .map(|p| {
            let wheel = wheel.clone();
            tokio::spawn(async move {
                let mut rng = Rng(p as u64 + 1);
                for _ in 0..per_task {
                    let delay = Duration::from_millis(1_000 + rng.next() % 59_000);
                    let mut sleep = wheel.sleep(delay);
                    assert!(poll_once(Pin::new(&mut sleep)).is_pending());
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("producer");
    }
    wheel.flush().await;
    let elapsed = start.elapsed();
    wheel.shutdown().await;
    elapsed
}

/// The same with insert + remove on one `Arc<Mutex<DelayQueue>>`.
pub async fn producers_shared_delay_queue(producers: usize, per_task: usize) -> Duration {
    let queue = Arc::new(Mutex::new(DelayQueue::<()>::new()));
    let start = Instant::now();
    let tasks: Vec<_> = (0..producers)
        .map(|p| {
            let queue = queue.clone();
            tokio::spawn(async move {
                let mut rng = Rng(p as u64 + 1);
                for _ in 0..per_task {
                    let delay = Duration::from_millis(1_000 + rng.next() % 59_000);
                    let key = queue.lock().unwrap().insert((), delay);
                    queue.lock().unwrap().remove(&key);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("producer");
    }
    start.elapsed()
}
