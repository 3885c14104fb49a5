//! What the queue's face and both backends share: the requests a [`DurableQueue`] sends its
//! engine, the consumers (streams) an engine feeds, the settings, the clocks, and what an
//! engine takes from the wheel ([`attach`]).
//!
//! [`DurableQueue`]: crate::DurableQueue

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_wheel::{Stopped, Wheel};

use crate::RecurringPage;
use crate::{
    Cursor, DeadLetter, Delivery, Error, Page, QueueStats, Recurring, RetryPolicy, Task,
    TaskFilter, TaskId, TaskInfo,
};

pub(crate) type Reply<T> = oneshot::Sender<Result<T, Error>>;

pub(crate) enum Request {
    Schedule(Task, Reply<TaskId>),
    Cancel(String, Reply<bool>),
    Reschedule(String, u64, Reply<bool>),
    Len(Reply<usize>),
    DeadLetters(Reply<Vec<DeadLetter>>),
    Redrive(String, Reply<bool>),
    Ack(String, u64, Reply<()>),
    /// Id, token, the delivery's attempt, and an explicit delay (else the policy's).
    Retry(String, u64, u32, Option<Duration>, Reply<()>),
    Fail(String, u64, String, Reply<()>),
    /// Token and the new lease length from now.
    Extend(u64, Duration, Reply<()>),
    /// The stream yielded this delivery: its lease starts.
    HandedOut(u64),
    /// A handed-out delivery was dropped unfinished: its lease runs out as usual, but nothing
    /// waits for it or keeps it alive any more.
    Dropped(u64),
    /// A delivery was dropped before its stream yielded it: the task goes back at once.
    Release(u64),
    /// A handed-out delivery is being finished directly with the store (Redis): nothing waits
    /// for it or keeps it alive any more.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Finishing(u64),
    Subscribe(Consumer),
    /// A consumer has room for more deliveries.
    Demand,
    Close(Reply<()>),
    Get(String, Reply<Option<TaskInfo>>),
    /// Filter, cursor, limit.
    List(TaskFilter, Option<String>, usize, Reply<Vec<TaskInfo>>),
    DeadPage(Option<String>, usize, Reply<Vec<DeadLetter>>),
    /// Filter, position cursor (checked to be of that filter), limit (at least 1).
    ListPage(TaskFilter, Option<Cursor>, usize, Reply<Page>),
    /// Purges dead letters that died before a time (ms): bounded per step, the request goes on
    /// in the next step until done. Retention sends it without a reply.
    Purge {
        before_ms: u64,
        removed: u64,
        reply: Option<Reply<u64>>,
    },
    Stats(Reply<QueueStats>),
    ScheduleRecurring(Recurring, Reply<TaskId>),
    CancelRecurring(String, Reply<bool>),
    /// One task's payload, if there is such a task.
    Payload(String, Reply<Option<Vec<u8>>>),
    /// Recurring schedules after a position in the pending list (checked to be of that
    /// list), at most this many, looking through at most one step's entries.
    RecurringPage(Option<Cursor>, usize, Reply<RecurringPage>),
    /// Pauses (`true`) or resumes claiming, durably.
    Pause(bool, Reply<()>),
}

/// A stream that wants deliveries, as one step sees it.
pub(crate) struct Want {
    pub(crate) consumer: usize,
    pub(crate) credits: Arc<AtomicUsize>,
    pub(crate) in_transit: Arc<AtomicUsize>,
}

/// One `deliveries()` stream, as the engine sees it.
pub(crate) struct Consumer {
    pub(crate) credits: Arc<AtomicUsize>,
    /// Claimed for this stream and not yet received from its channel (a claim waits for its
    /// commit, then in the channel): the engine adds each claim before it takes the credit,
    /// the stream subtracts it as it receives the delivery. The stream asks for more only
    /// when this and its credits are both zero, so it never holds more than the prefetch
    /// ahead, and never waits for a claim it already received.
    pub(crate) in_transit: Arc<AtomicUsize>,
    /// Set when the queue closes: the stream drops what it buffered (the engine returned it).
    pub(crate) closed: Arc<AtomicBool>,
    pub(crate) sender: mpsc::UnboundedSender<Delivery>,
}

impl Consumer {
    pub(crate) fn wants(&self) -> bool {
        self.credits.load(Ordering::Acquire) > 0 && !self.sender.is_closed()
    }

    /// Ends the stream: what it buffered is not handed out.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }
}

pub(crate) struct Settings {
    pub(crate) policy: RetryPolicy,
    pub(crate) lease: Duration,
    pub(crate) keep_alive: bool,
    pub(crate) close_timeout: Duration,
    /// Dead letters older than this are purged on their own.
    pub(crate) retention: Option<Duration>,
}

impl Settings {
    pub(crate) fn lease_ms(&self) -> u64 {
        crate::delay_ms(self.lease)
    }

    /// How often buffered claims (and, with keep-alive, held deliveries) are renewed.
    pub(crate) fn renew_every(&self) -> Duration {
        (self.lease / 3).max(Duration::from_millis(1))
    }

    /// How often retention looks for dead letters to purge.
    pub(crate) fn purge_every(&self) -> Option<Duration> {
        self.retention
            .map(|keep| (keep / 4).clamp(Duration::from_millis(10), Duration::from_secs(60)))
    }
}

/// What the durable engines need from their wheel: the runtime to run on and the shutdown
/// signal (both public API of the wheel).
pub(crate) struct Attachment {
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) shutdown: Stopped,
}

pub(crate) fn attach(wheel: &Wheel) -> Attachment {
    Attachment {
        runtime: wheel.runtime().clone(),
        shutdown: wheel.stopped(),
    }
}

pub(crate) fn now_ms() -> u64 {
    crate::epoch_ms(SystemTime::now())
}

/// Why a task retried on its last delivery went to the dead letters.
pub(crate) fn last_attempt_reason(attempts: u32) -> String {
    format!("retried on its last delivery ({attempts} of {attempts})")
}

/// Why a task whose last lease expired went to the dead letters (the Redis claim script
/// writes the same words).
pub(crate) fn lease_expired_reason(attempts: u32, max_attempts: u32) -> String {
    format!("lease expired on delivery {attempts} of {max_attempts}")
}

pub(crate) fn system_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// The instant on Tokio's clock when this process's wall clock reads `ms`.
pub(crate) fn instant_of(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms.saturating_sub(now_ms()))
}

/// Where a backend with nothing to wait for parks its wake-up.
pub(crate) fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365)
}

/// The clear error for a list or page cursor that is not (any more) in the listed state.
pub(crate) fn stale_cursor(id: &str, filter: TaskFilter) -> Error {
    Error::Invalid(format!(
        "the cursor task {id:?} is not {} (any more): list again from the start",
        filter.name()
    ))
}
