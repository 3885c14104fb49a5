//! Delayed and periodic jobs: [`JobHandle`] and [`Schedule`].
//!
//! ```
//! use std::time::Duration;
//! use tokio_wheel::{JobError, Wheel};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let wheel = Wheel::new();
//! let reminder = wheel.spawn_after(Duration::from_secs(30), async { "send reminder" });
//! let unwanted = wheel.spawn_after(Duration::from_secs(30), async { "never" });
//! assert!(unwanted.cancel());
//! assert_eq!(reminder.await, Ok("send reminder"));
//! assert_eq!(unwanted.await, Err(JobError::Cancelled));
//! # }
//! ```

use std::any::Any;
use std::fmt;
use std::future::{Future, poll_fn};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures::FutureExt;
use futures::task::AtomicWaker;
use tokio::sync::Notify;
use tokio::task::{AbortHandle, coop};
use tokio::time::{Instant, MissedTickBehavior};

use crate::actor::context::{Filed, WheelContext};
use crate::actor::inbox::Urgency;
use crate::actor::timers::{Command, JobInsert};
use crate::error::JobError;
use crate::interval::Interval;
use crate::sleep::{Sleep, Woke};
use crate::timer::Launch;
use crate::timer::clock::{deadline_after, saturating_add};
use crate::timer::shared::Shared;
use crate::timer::state::Moved;

/// How a periodic job ([`Wheel::spawn_every`](crate::Wheel::spawn_every)) keeps time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// Runs at `start + k · period`, keeping the phase: exactly the ticks of tokio's `Interval`
    /// with `MissedTickBehavior::Skip`. A run that overruns its slot is followed at once by the
    /// slot it missed (as a late tick), and further missed slots are skipped, not run in a
    /// burst; a run that ends on a slot does not skip it.
    FixedRate,
    /// Waits `period` after each run completes.
    FixedDelay,
}

type JobResult<T> = Result<T, JobError>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code panics while holding these locks; recover rather than propagate.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Where a job's result waits for its handle. The first result set wins.
struct Outcome<T> {
    result: Mutex<Option<JobResult<T>>>,
    done: AtomicBool,
    waker: AtomicWaker,
}

impl<T> Outcome<T> {
    fn new() -> Arc<Self> {
        Arc::new(Outcome {
            result: Mutex::new(None),
            done: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        })
    }

    fn set(&self, result: JobResult<T>) {
        let mut slot = lock(&self.result);
        if self.done.load(Ordering::Acquire) {
            return;
        }
        *slot = Some(result);
        // Set while the result is in place, so `is_done` means "awaiting returns at once".
        self.done.store(true, Ordering::Release);
        drop(slot);
        self.waker.wake();
    }

    fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    fn poll(&self, cx: &mut Context<'_>) -> Poll<JobResult<T>> {
        if !self.is_done() {
            self.waker.register(cx.waker());
            if !self.is_done() {
                return Poll::Pending;
            }
        }
        match lock(&self.result).take() {
            Some(result) => Poll::Ready(result),
            // Polled again after it returned: as with a fused future, it stays pending.
            None => Poll::Pending,
        }
    }
}

/// Settles a job's outcome however its task ends: with the job's result, or, if the task is
/// dropped first (aborted, or its runtime shut down, even before its first poll), with
/// `Cancelled` or `Shutdown`.
struct Settle<T> {
    outcome: Arc<Outcome<T>>,
    aborted: Arc<AtomicBool>,
}

impl<T> Settle<T> {
    fn finish(self, result: JobResult<T>) {
        self.outcome.set(result);
    }
}

impl<T> Drop for Settle<T> {
    fn drop(&mut self) {
        // A no-op after `finish`: the first result wins.
        self.outcome
            .set(Err(if self.aborted.load(Ordering::Acquire) {
                JobError::Cancelled
            } else {
                JobError::Shutdown
            }));
    }
}

/// A handle to a delayed or periodic job; made by [`Wheel::spawn_after`],
/// [`Wheel::spawn_at`] and [`Wheel::spawn_every`].
///
/// - Jobs run as Tokio tasks on the wheel's runtime; the actor never runs user code.
/// - Awaiting the handle yields the job's output, or a [`JobError`]: `Cancelled` (cancelled or
///   aborted before it finished), `Panicked` (the panic is contained; the wheel keeps running),
///   or `Shutdown` (the wheel, or the runtime running the job, stopped before it finished).
/// - [`is_finished`](Self::is_finished) is true exactly when awaiting would return at once.
/// - Dropping the handle detaches the job: it still runs, like a `tokio::task::JoinHandle`.
///
/// A periodic job's handle ([`Wheel::spawn_every`]) controls its future runs: `cancel` stops
/// them, `abort` also stops a run in progress, `reschedule` moves the next run, and awaiting it
/// yields `Err(Cancelled)` or `Err(Shutdown)` once it stops. A panicking run is logged, counted
/// in [`Stats::job_panics`](crate::Stats::job_panics), and the schedule goes on.
///
/// [`Wheel::spawn_after`]: crate::Wheel::spawn_after
/// [`Wheel::spawn_at`]: crate::Wheel::spawn_at
/// [`Wheel::spawn_every`]: crate::Wheel::spawn_every
#[must_use = "dropping a JobHandle detaches the job; it still runs"]
pub struct JobHandle<T> {
    wheel: Arc<WheelContext>,
    control: Arc<dyn Control>,
    outcome: Arc<Outcome<T>>,
}

impl<T> fmt::Debug for JobHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobHandle")
            .field("deadline", &self.control.deadline())
            .field("finished", &self.outcome.is_done())
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> JobHandle<T> {
    pub(crate) fn one_shot<F>(
        wheel: &Arc<WheelContext>,
        deadline: Instant,
        future: F,
    ) -> JobHandle<T>
    where
        F: Future<Output = T> + Send + 'static,
    {
        let outcome = Outcome::new();
        let offset = wheel.shared.clock.offset(deadline);
        let job = Arc::new(OneShot {
            slot: AtomicU64::new(u64::MAX),
            future: Mutex::new(Some(future)),
            outcome: outcome.clone(),
            task: Mutex::new(None),
            aborted: Arc::new(AtomicBool::new(false)),
            deadline: Mutex::new(deadline),
        });
        let launch: Arc<dyn Launch> = job.clone();
        let filed = wheel.file_timer(offset, None, |slot| {
            Command::InsertJob(Box::new(JobInsert {
                slot,
                deadline: offset,
                launch,
            }))
        });
        match filed {
            Some(filed) => job
                .slot
                .store(Filing::from(filed).pack(), Ordering::Release),
            None => job.refuse(),
        }
        JobHandle {
            wheel: wheel.clone(),
            control: job,
            outcome,
        }
    }
}

impl JobHandle<()> {
    pub(crate) fn periodic<J, F>(
        wheel: &Arc<WheelContext>,
        period: Duration,
        schedule: Schedule,
        job: J,
    ) -> JobHandle<()>
    where
        J: FnMut() -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        assert!(
            !period.is_zero(),
            "tokio-wheel: a periodic job's period must be non-zero"
        );
        let outcome = Outcome::new();
        let control = Arc::new(Periodic {
            next: Mutex::new(deadline_after(period)),
            cancelled: AtomicBool::new(false),
            aborted: Arc::new(AtomicBool::new(false)),
            wake: Notify::new(),
            task: Mutex::new(None),
            finished: outcome.clone(),
        });
        if wheel.shared.is_closed() {
            // Refused at once, as a one-shot job on a stopped wheel is: finished before the
            // handle is returned, with no task to spawn.
            outcome.set(Err(JobError::Shutdown));
            return JobHandle {
                wheel: wheel.clone(),
                control,
                outcome,
            };
        }
        let settle = Settle {
            outcome: outcome.clone(),
            aborted: control.aborted.clone(),
        };
        let driver = drive_periodic(wheel.clone(), control.clone(), period, schedule, job);
        let task = wheel.shared.runtime.spawn(async move {
            let settle = settle;
            let stopped = driver.await;
            settle.finish(Err(stopped));
        });
        *lock(&control.task) = Some(task.abort_handle());
        JobHandle {
            wheel: wheel.clone(),
            control,
            outcome,
        }
    }
}

impl<T> JobHandle<T> {
    /// Cancels the job if it has not started: `true` means it had not started and never will.
    /// For a periodic job, `true` means this call stopped its future runs (a run in progress
    /// finishes).
    pub fn cancel(&self) -> bool {
        self.control.cancel(&self.wheel)
    }

    /// Moves a pending job to `deadline`, earlier or later: `true` means it is still pending
    /// and now due then. For a periodic job, moves the next run.
    pub fn reschedule(&self, deadline: Instant) -> bool {
        self.control.reschedule(&self.wheel, deadline)
    }

    /// Stops the job even if it is running (as tokio's `AbortHandle`). Awaiting it then yields
    /// `Err(JobError::Cancelled)`, unless it had already finished.
    pub fn abort(&self) {
        self.control.abort(&self.wheel);
    }

    /// When the job is due. For a periodic job: its next run, named as soon as a run begins
    /// (`FixedRate`: the next slot; `FixedDelay`: while a run is in progress, the earliest the
    /// next can start — a period after this one started — and exact once it ends).
    pub fn deadline(&self) -> Instant {
        self.control.deadline()
    }

    /// Whether the job is over — finished, panicked, cancelled, aborted, or stopped by
    /// shutdown: exactly when awaiting the handle would return at once.
    pub fn is_finished(&self) -> bool {
        self.outcome.is_done()
    }
}

impl<T> Future for JobHandle<T> {
    type Output = JobResult<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<JobResult<T>> {
        // Under tokio's task budget, as awaiting a `JoinHandle` is.
        let budget = ready!(coop::poll_proceed(cx));
        let result = ready!(self.outcome.poll(cx));
        budget.made_progress();
        Poll::Ready(result)
    }
}

impl<T> Drop for JobHandle<T> {
    fn drop(&mut self) {
        self.control.release(&self.wheel);
    }
}

/// What a [`JobHandle`] does to its job, one-shot or periodic.
trait Control: Send + Sync + 'static {
    fn cancel(&self, wheel: &WheelContext) -> bool;
    fn reschedule(&self, wheel: &WheelContext, deadline: Instant) -> bool;
    fn abort(&self, wheel: &WheelContext);
    fn deadline(&self) -> Instant;
    /// The handle is dropped: the job is detached.
    fn release(&self, wheel: &WheelContext);
}

/// A one-shot job: its pool slot, and its future until it starts.
struct OneShot<F: Future> {
    /// Where the job is filed ([`Filing::pack`]); `u64::MAX` if never filed.
    slot: AtomicU64,
    future: Mutex<Option<F>>,
    outcome: Arc<Outcome<F::Output>>,
    task: Mutex<Option<AbortHandle>>,
    aborted: Arc<AtomicBool>,
    deadline: Mutex<Instant>,
}

impl<F: Future> OneShot<F> {
    fn slot(&self) -> Option<Filing> {
        let raw = self.slot.load(Ordering::Acquire);
        (raw != u64::MAX).then(|| Filing::unpack(raw))
    }
}

/// A job's timer lane, pool slot and inbox shard, packed in one word so a handle reads them
/// with one load.
#[derive(Debug, Clone, Copy)]
struct Filing {
    lane: u32,
    slot: u32,
    shard: u32,
}

impl From<Filed> for Filing {
    fn from(filed: Filed) -> Filing {
        Filing {
            lane: filed.lane,
            slot: filed.slot,
            shard: filed.shard,
        }
    }
}

impl Filing {
    /// Slot in the low 32 bits, shard in the next 16, lane in the 16 above (lanes and shards
    /// are a few hundred at most, so the word is never `u64::MAX`).
    fn pack(self) -> u64 {
        u64::from(self.slot) | (u64::from(self.shard) << 32) | (u64::from(self.lane) << 48)
    }

    fn unpack(raw: u64) -> Filing {
        Filing {
            slot: raw as u32,
            shard: (raw >> 32) as u32 & 0xFFFF,
            lane: (raw >> 48) as u32,
        }
    }
}

impl<F> Launch for OneShot<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn launch(self: Arc<Self>, shared: &Arc<Shared>) {
        let Some(future) = lock(&self.future).take() else {
            return;
        };
        let settle = Settle {
            outcome: self.outcome.clone(),
            aborted: self.aborted.clone(),
        };
        let shared_for_task = shared.clone();
        let task = shared.runtime.spawn(async move {
            let settle = settle;
            let result = AssertUnwindSafe(future)
                .catch_unwind()
                .await
                .map_err(|panic| job_panicked(&shared_for_task, panic));
            settle.finish(result);
        });
        let mut slot = lock(&self.task);
        if self.aborted.load(Ordering::Acquire) {
            task.abort();
        } else {
            *slot = Some(task.abort_handle());
        }
    }

    fn refuse(&self) {
        drop(lock(&self.future).take());
        self.outcome.set(Err(JobError::Shutdown));
    }
}

impl<F> Control for OneShot<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn cancel(&self, wheel: &WheelContext) -> bool {
        let Some(Filing { lane, slot, shard }) = self.slot() else {
            return false;
        };
        if !wheel.slot(lane, slot).word.cancel() {
            return false;
        }
        drop(lock(&self.future).take());
        self.outcome.set(Err(JobError::Cancelled));
        wheel.send(lane, shard, Command::Unfile { slot }, Urgency::Lazy);
        true
    }

    fn reschedule(&self, wheel: &WheelContext, deadline: Instant) -> bool {
        let Some(Filing { lane, slot, shard }) = self.slot() else {
            return false;
        };
        let offset = wheel.shared.clock.offset(deadline);
        let Moved::Armed { earlier } = wheel.slot(lane, slot).word.move_to(offset, false) else {
            return false;
        };
        *lock(&self.deadline) = deadline;
        if earlier {
            let advance = Command::Advance {
                slot,
                deadline: offset,
            };
            wheel.send(lane, shard, advance, Urgency::By(offset));
        }
        true
    }

    fn abort(&self, wheel: &WheelContext) {
        self.aborted.store(true, Ordering::Release);
        if !self.cancel(wheel) {
            if let Some(task) = &*lock(&self.task) {
                task.abort();
            }
        }
    }

    fn deadline(&self) -> Instant {
        *lock(&self.deadline)
    }

    fn release(&self, wheel: &WheelContext) {
        if let Some(Filing { lane, slot, shard }) = self.slot() {
            // Refused only once the actor has stopped: the slot goes with the pool.
            let release = Command::Release { slot, shard };
            let _ = wheel
                .inbox(lane)
                .send(shard as usize, release, Urgency::Lazy);
        }
    }
}

fn job_panicked(shared: &Shared, panic: Box<dyn Any + Send>) -> JobError {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".to_owned());
    shared.counters.job_panics.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(wheel = %shared.name, %message, "job panicked");
    JobError::Panicked(message)
}

/// A periodic job's controls, shared by its handle and its driver task.
struct Periodic {
    next: Mutex<Instant>,
    cancelled: AtomicBool,
    aborted: Arc<AtomicBool>,
    wake: Notify,
    task: Mutex<Option<AbortHandle>>,
    finished: Arc<Outcome<()>>,
}

impl Control for Periodic {
    fn cancel(&self, _wheel: &WheelContext) -> bool {
        let stopped = !self.cancelled.swap(true, Ordering::AcqRel) && !self.finished.is_done();
        self.wake.notify_one();
        stopped
    }

    fn reschedule(&self, _wheel: &WheelContext, deadline: Instant) -> bool {
        if self.cancelled.load(Ordering::Acquire) || self.finished.is_done() {
            return false;
        }
        *lock(&self.next) = deadline;
        self.wake.notify_one();
        true
    }

    fn abort(&self, wheel: &WheelContext) {
        self.aborted.store(true, Ordering::Release);
        self.cancel(wheel);
        if let Some(task) = &*lock(&self.task) {
            task.abort();
        }
    }

    fn deadline(&self) -> Instant {
        *lock(&self.next)
    }

    fn release(&self, _wheel: &WheelContext) {}
}

/// Runs a periodic job until it is cancelled or the wheel stops; returns why it stopped.
async fn drive_periodic<J, F>(
    wheel: Arc<WheelContext>,
    control: Arc<Periodic>,
    period: Duration,
    schedule: Schedule,
    mut job: J,
) -> JobError
where
    J: FnMut() -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let shared = wheel.shared.clone();
    // Runs are an interval's ticks: `FixedRate` is tokio's `Interval` with `Skip` exactly;
    // `FixedDelay` restarts the interval a period after each run ends.
    let mut ticks = Interval::new(Sleep::new(&wheel, *lock(&control.next)), period);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
    loop {
        if control.cancelled.load(Ordering::Acquire) {
            return JobError::Cancelled;
        }
        let (due, woke) = tokio::select! {
            biased;
            () = control.wake.notified() => {
                // Cancelled (checked above) or rescheduled: move the next run.
                let wanted = *lock(&control.next);
                if wanted != ticks.next_deadline() {
                    ticks.reset_at(wanted);
                }
                continue;
            }
            tick = poll_fn(|cx| ticks.poll_tick_woke(cx)) => tick,
        };
        if woke == Woke::Shutdown {
            return JobError::Shutdown;
        }
        if control.cancelled.load(Ordering::Acquire) {
            return JobError::Cancelled;
        }
        // From the run's start, the handle's deadline names the next run: the next slot
        // (`FixedRate`), or the earliest a `FixedDelay` run can start, a period from now
        // (exact once this run ends).
        let planned = match schedule {
            Schedule::FixedRate => ticks.next_deadline(),
            Schedule::FixedDelay => saturating_add(Instant::now(), period),
        };
        {
            let mut next = lock(&control.next);
            if *next == due {
                *next = planned;
            }
        }
        shared
            .counters
            .periodic_runs
            .fetch_add(1, Ordering::Relaxed);
        let run = std::panic::catch_unwind(AssertUnwindSafe(&mut job));
        let finished = match run {
            Ok(future) => AssertUnwindSafe(future).catch_unwind().await,
            Err(panic) => Err(panic),
        };
        if let Err(panic) = finished {
            job_panicked(&shared, panic);
        }
        if schedule == Schedule::FixedDelay {
            ticks.reset();
        }
        // Let the worker run something else between runs. A run that outlasts its period
        // finds the next tick already due, and without this the loop would never give the
        // worker back: the actor, woken onto this worker's LIFO slot (which no other worker
        // can steal), would wait behind a blocking job for as long as it kept running late.
        tokio::task::yield_now().await;
        let mut next = lock(&control.next);
        // Keep a reschedule made during the run (its notification moves the interval).
        if *next == planned {
            *next = ticks.next_deadline();
        }
    }
}
