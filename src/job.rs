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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::{Notify, oneshot};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::actor::timers::{Command, Timer};
use crate::error::JobError;
use crate::handle::{Shared, Wheel};
use crate::sleep::Woke;
use crate::state::{Cancelled, Moved, State, TimerState};

/// How a periodic job ([`Wheel::spawn_every`](crate::Wheel::spawn_every)) keeps time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// Runs at `start + k · period`, keeping the phase. A run that overruns its slot makes the
    /// missed slots be skipped, not run in a burst.
    FixedRate,
    /// Waits `period` after each run completes.
    FixedDelay,
}

type JobResult<T> = Result<T, JobError>;

/// A handle to a delayed or periodic job; made by [`Wheel::spawn_after`],
/// [`Wheel::spawn_at`] and [`Wheel::spawn_every`].
///
/// - Jobs run as Tokio tasks on the wheel's runtime; the actor never runs user code.
/// - Awaiting the handle yields the job's output, or a [`JobError`]: `Cancelled` (cancelled or
///   aborted before it finished), `Panicked` (the panic is contained; the wheel keeps running),
///   or `Shutdown` (the wheel stopped before it ran).
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
    wheel: Wheel,
    control: Arc<dyn JobControl>,
    /// The entry filed in the main actor's wheel (one-shot jobs only), to name it in commands.
    entry: Option<Arc<dyn JobEntry>>,
    result: oneshot::Receiver<JobResult<T>>,
}

impl<T> fmt::Debug for JobHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobHandle")
            .field("deadline", &self.control.deadline())
            .field("finished", &self.control.is_finished())
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> JobHandle<T> {
    pub(crate) fn one_shot<F>(wheel: Wheel, deadline: Instant, future: F) -> JobHandle<T>
    where
        F: Future<Output = T> + Send + 'static,
    {
        let (sender, result) = oneshot::channel();
        let job = Arc::new(OneShot {
            state: TimerState::pending(wheel.shared().clock.deadline_tick(deadline)),
            deadline: Mutex::new(deadline),
            slot: Mutex::new(Slot {
                future: Some(future),
                sender: Some(sender),
                task: None,
            }),
            aborted: AtomicBool::new(false),
            finished: AtomicBool::new(false),
        });
        if !wheel.send(Command::Insert(Timer::Job(job.clone()))) && job.state.shut_down() {
            job.refuse();
        }
        JobHandle {
            wheel,
            control: job.clone(),
            entry: Some(job),
            result,
        }
    }
}

impl JobHandle<()> {
    pub(crate) fn periodic<J, F>(
        wheel: Wheel,
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
        let (sender, result) = oneshot::channel();
        let control = Arc::new(Periodic {
            next: Mutex::new(crate::clock::deadline_after(period)),
            cancelled: AtomicBool::new(false),
            aborted: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            wake: Notify::new(),
            task: Mutex::new(None),
        });
        let driver = drive_periodic(
            wheel.clone(),
            control.clone(),
            period,
            schedule,
            job,
            sender,
        );
        let task = wheel.shared().runtime.spawn(driver);
        *lock(&control.task) = Some(task.abort_handle());
        JobHandle {
            wheel,
            control,
            entry: None,
            result,
        }
    }
}

impl<T> JobHandle<T> {
    /// Cancels the job if it has not started: `true` means it had not started and never will.
    /// For a periodic job, `true` means this call stopped its future runs (a run in progress
    /// finishes).
    pub fn cancel(&self) -> bool {
        let (cancelled, notice) = self.control.cancel();
        self.tell_actor(notice);
        cancelled
    }

    /// Moves a pending job to `deadline`, earlier or later: `true` means it is still pending
    /// and now due then. For a periodic job, moves the next run.
    pub fn reschedule(&self, deadline: Instant) -> bool {
        let tick = self.wheel.shared().clock.deadline_tick(deadline);
        let (moved, notice) = self.control.reschedule(tick, deadline);
        self.tell_actor(notice);
        moved
    }

    /// Stops the job even if it is running (as tokio's `AbortHandle`). Awaiting it then yields
    /// `Err(JobError::Cancelled)`, unless it had already finished.
    pub fn abort(&self) {
        let notice = self.control.abort();
        self.tell_actor(notice);
    }

    /// When the job is due (for a periodic job: its next run).
    pub fn deadline(&self) -> Instant {
        self.control.deadline()
    }

    /// Whether the job is over: finished, panicked, cancelled, aborted or refused by shutdown.
    pub fn is_finished(&self) -> bool {
        self.control.is_finished()
    }

    fn tell_actor(&self, notice: Notice) {
        let Some(entry) = &self.entry else { return };
        let timer = Timer::Job(entry.clone());
        match notice {
            Notice::Nothing => {}
            Notice::Cancel => {
                self.wheel.send(Command::Cancel(timer));
            }
            Notice::Reschedule => {
                self.wheel.send(Command::Reschedule(timer));
            }
        }
    }
}

impl<T> Future for JobHandle<T> {
    type Output = JobResult<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<JobResult<T>> {
        Pin::new(&mut self.result).poll(cx).map(|received| {
            received.unwrap_or_else(|_| {
                // The result was dropped unsent: the task was aborted, or its runtime stopped.
                Err(if self.control.was_cancelled() {
                    JobError::Cancelled
                } else {
                    JobError::Shutdown
                })
            })
        })
    }
}

/// What a job's control asks its handle to tell the main actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Notice {
    Nothing,
    Cancel,
    Reschedule,
}

/// What a [`JobHandle`] does to its job, one-shot or periodic.
trait JobControl: Send + Sync + 'static {
    fn cancel(&self) -> (bool, Notice);
    fn reschedule(&self, tick: u64, deadline: Instant) -> (bool, Notice);
    fn abort(&self) -> Notice;
    fn deadline(&self) -> Instant;
    fn is_finished(&self) -> bool;
    fn was_cancelled(&self) -> bool;
}

/// What the main actor does with a job filed in its wheel.
pub(crate) trait JobEntry: Send + Sync + 'static {
    fn state(&self) -> &TimerState;
    /// The job is due: spawn it.
    fn start(self: Arc<Self>, shared: &Arc<Shared>);
    /// The wheel stopped before the job started (its state already says so).
    fn refuse(&self);
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic never happens while these locks are held; recover rather than propagate.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct OneShot<F: Future> {
    state: TimerState,
    deadline: Mutex<Instant>,
    slot: Mutex<Slot<F>>,
    aborted: AtomicBool,
    finished: AtomicBool,
}

struct Slot<F: Future> {
    future: Option<F>,
    sender: Option<oneshot::Sender<JobResult<F::Output>>>,
    task: Option<AbortHandle>,
}

impl<F: Future> OneShot<F> {
    /// Drops the future and the result sender: the handle then reads why from the state.
    fn discard(&self) {
        let mut slot = lock(&self.slot);
        slot.future = None;
        slot.sender = None;
        self.finished.store(true, Ordering::Release);
    }
}

impl<F> JobEntry for OneShot<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn state(&self) -> &TimerState {
        &self.state
    }

    fn start(self: Arc<Self>, shared: &Arc<Shared>) {
        let mut slot = lock(&self.slot);
        let (Some(future), Some(sender)) = (slot.future.take(), slot.sender.take()) else {
            return;
        };
        let task = shared
            .runtime
            .spawn(run_one_shot(self.clone(), shared.clone(), future, sender));
        if self.aborted.load(Ordering::Acquire) {
            task.abort();
        } else {
            slot.task = Some(task.abort_handle());
        }
    }

    fn refuse(&self) {
        let sender = lock(&self.slot).sender.take();
        self.discard();
        if let Some(sender) = sender {
            let _ = sender.send(Err(JobError::Shutdown));
        }
    }
}

impl<F> JobControl for OneShot<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn cancel(&self) -> (bool, Notice) {
        let (cancelled, notice) = match self.state.cancel() {
            Cancelled::BeforeSeen => (true, Notice::Nothing),
            Cancelled::InWheel => (true, Notice::Cancel),
            Cancelled::TooLate => (false, Notice::Nothing),
        };
        if cancelled {
            self.discard();
        }
        (cancelled, notice)
    }

    fn reschedule(&self, tick: u64, deadline: Instant) -> (bool, Notice) {
        let moved = self.state.move_to(tick, false);
        if moved == Moved::Refused {
            return (false, Notice::Nothing);
        }
        *lock(&self.deadline) = deadline;
        let notice = if moved == Moved::Earlier {
            Notice::Reschedule
        } else {
            Notice::Nothing
        };
        (true, notice)
    }

    fn abort(&self) -> Notice {
        self.aborted.store(true, Ordering::Release);
        let (cancelled, notice) = self.cancel();
        if !cancelled {
            if let Some(task) = &lock(&self.slot).task {
                task.abort();
            }
        }
        notice
    }

    fn deadline(&self) -> Instant {
        *lock(&self.deadline)
    }

    fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    fn was_cancelled(&self) -> bool {
        self.aborted.load(Ordering::Acquire) || self.state.state() == State::Cancelled
    }
}

async fn run_one_shot<F>(
    job: Arc<OneShot<F>>,
    shared: Arc<Shared>,
    future: F,
    sender: oneshot::Sender<JobResult<F::Output>>,
) where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let _finished = SetOnDrop(&job.finished);
    let result = AssertUnwindSafe(future)
        .catch_unwind()
        .await
        .map_err(|panic| job_panicked(&shared, panic));
    let _ = sender.send(result);
}

fn job_panicked(shared: &Shared, panic: Box<dyn Any + Send>) -> JobError {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".to_owned());
    shared.stats.job_panics.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(wheel = %shared.name, %message, "job panicked");
    JobError::Panicked(message)
}

/// Sets a flag when dropped: marks a job finished however its task ends (done or aborted).
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

struct Periodic {
    next: Mutex<Instant>,
    cancelled: AtomicBool,
    aborted: AtomicBool,
    finished: AtomicBool,
    wake: Notify,
    task: Mutex<Option<AbortHandle>>,
}

impl JobControl for Periodic {
    fn cancel(&self) -> (bool, Notice) {
        let stopped = !self.cancelled.swap(true, Ordering::AcqRel) && !self.is_finished();
        self.wake.notify_one();
        (stopped, Notice::Nothing)
    }

    fn reschedule(&self, _tick: u64, deadline: Instant) -> (bool, Notice) {
        if self.cancelled.load(Ordering::Acquire) || self.is_finished() {
            return (false, Notice::Nothing);
        }
        *lock(&self.next) = deadline;
        self.wake.notify_one();
        (true, Notice::Nothing)
    }

    fn abort(&self) -> Notice {
        self.aborted.store(true, Ordering::Release);
        self.cancel();
        if let Some(task) = &*lock(&self.task) {
            task.abort();
        }
        Notice::Nothing
    }

    fn deadline(&self) -> Instant {
        *lock(&self.next)
    }

    fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    fn was_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }
}

async fn drive_periodic<J, F>(
    wheel: Wheel,
    control: Arc<Periodic>,
    period: Duration,
    schedule: Schedule,
    mut job: J,
    sender: oneshot::Sender<JobResult<()>>,
) where
    J: FnMut() -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let _finished = SetOnDrop(&control.finished);
    let shared = wheel.shared().clone();
    let outcome = loop {
        if control.cancelled.load(Ordering::Acquire) {
            break JobError::Cancelled;
        }
        let due = *lock(&control.next);
        let mut sleep = wheel.sleep_until(due);
        let woke = tokio::select! {
            biased;
            () = control.wake.notified() => continue,
            woke = poll_fn(|cx| sleep.poll_woke(cx)) => woke,
        };
        if woke == Woke::Shutdown {
            break JobError::Shutdown;
        }
        if control.cancelled.load(Ordering::Acquire) {
            break JobError::Cancelled;
        }
        shared.stats.periodic_runs.fetch_add(1, Ordering::Relaxed);
        let run = std::panic::catch_unwind(AssertUnwindSafe(&mut job));
        let finished = match run {
            Ok(future) => AssertUnwindSafe(future).catch_unwind().await,
            Err(panic) => Err(panic),
        };
        if let Err(panic) = finished {
            job_panicked(&shared, panic);
        }
        let following = match schedule {
            Schedule::FixedRate => {
                let now = Instant::now();
                let missed = now.saturating_duration_since(due).as_nanos() / period.as_nanos();
                let slots = u32::try_from(missed.saturating_add(1)).unwrap_or(u32::MAX);
                crate::clock::saturating_add(due, period.saturating_mul(slots))
            }
            Schedule::FixedDelay => crate::clock::deadline_after(period),
        };
        let mut next = lock(&control.next);
        // Keep a reschedule made during the run.
        if *next == due {
            *next = following;
        }
    };
    let _ = sender.send(Err(outcome));
}
