//! [`DurableQueue`]: schedule, cancel, reschedule, inspect, redrive and close; each call a
//! request to the engine (embedded) or a script on the server (Redis).

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot};
use tokio_wheel::Wheel;

use crate::RecurringPage;
use crate::protocol::{Consumer, Request};
use crate::{Builder, DeadLetter, Deliveries, Error, Task, TaskId, delay_ms, epoch_ms};
use crate::{Cursor, PAGE_LIMIT, Page, QueueStats, Recurring, TaskFilter, TaskInfo};

/// Where a handle's calls go: through the engine task (embedded: it owns the store), or
/// straight to the Redis server from the caller's task (each call is one atomic script; the
/// Redis engine only claims, and is told what finished).
#[derive(Clone)]
pub(crate) enum Route {
    Engine,
    #[cfg(feature = "redis")]
    Redis(Arc<crate::redis::Shared>),
}

/// A durable queue of delayed tasks. Cheap to clone; every clone talks to one engine.
///
/// See the [crate documentation](crate) for what it guarantees.
#[derive(Clone)]
pub struct DurableQueue {
    pub(crate) requests: mpsc::UnboundedSender<Request>,
    pub(crate) prefetch: usize,
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) route: Route,
    /// Embedded: becomes `true` once the engine has released the store and its lock.
    pub(crate) released: Option<tokio::sync::watch::Receiver<bool>>,
    /// The streams of this handle and its clones: told to give back what they claimed ahead
    /// when the queue is paused through any of them.
    pub(crate) streams: Arc<std::sync::Mutex<Vec<std::sync::Weak<AtomicBool>>>>,
}

impl fmt::Debug for DurableQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableQueue")
            .field("closed", &self.requests.is_closed())
            .field("prefetch", &self.prefetch)
            .finish()
    }
}

impl DurableQueue {
    /// Opens the embedded store at `path` with the default settings. See [`Builder::open`].
    ///
    /// # Errors
    ///
    /// As [`Builder::open`].
    pub async fn open(path: impl AsRef<Path>, wheel: &Wheel) -> Result<DurableQueue, Error> {
        Builder::default().open(path, wheel).await
    }

    /// A [`Builder`] for retry policy, lease, prefetch, keep-alive and close timeout.
    pub fn builder() -> Builder {
        Builder::default()
    }

    async fn ask<T>(
        &self,
        request: impl FnOnce(oneshot::Sender<Result<T, Error>>) -> Request,
    ) -> Result<T, Error> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(request(reply))
            .map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }

    /// The Redis connection to call directly, or `None` to go through the engine.
    #[cfg(feature = "redis")]
    fn redis(&self) -> Result<Option<&std::sync::Arc<crate::redis::Shared>>, Error> {
        match &self.route {
            Route::Engine => Ok(None),
            _ if self.requests.is_closed() => Err(Error::Closed),
            Route::Redis(shared) => Ok(Some(shared)),
        }
    }

    /// Stores the task; returns its id once it is durable.
    ///
    /// Dropping the future before it answers does not withdraw the task: once handed to the
    /// store (on Redis, in a batch with other callers' tasks, retried after a lost reply) it
    /// may still be made, at any point until that call's retries end. A later `schedule` of
    /// the same id made meanwhile can therefore be overtaken by it; await the first call (or
    /// [`cancel`](Self::cancel) after it) when the order matters.
    ///
    /// # Errors
    ///
    /// [`Error::InFlight`] if a task with this id is being delivered, [`Error::Invalid`] for
    /// an id of the form reserved for recurring occurrences (`…@` and digits, see
    /// [`TaskId::is_occurrence`]), [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn schedule(&self, task: Task) -> Result<TaskId, Error> {
        if let Some(id) = &task.id {
            id.check_schedulable()?;
        }
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.schedule(task).await;
        }
        self.ask(|reply| Request::Schedule(task, reply)).await
    }

    /// Stores many tasks at once, in order, and returns one answer per task, in the same
    /// order, once every task that was stored is durable — as `tasks.len()` calls of
    /// [`schedule`](DurableQueue::schedule) made one after the other would, but in far fewer
    /// store steps: on Redis, one script per partition for each chunk of at most 500 tasks
    /// (and at most 1 MiB of payloads); embedded, the tasks share the engine's transactions
    /// (at most 1024 requests each).
    ///
    /// Each task succeeds or fails on its own: an id that is in flight answers
    /// `Err(Error::InFlight)` for that task alone, and the rest of the batch is stored; an id
    /// given twice is stored twice, the later replacing the earlier (so it is delivered once,
    /// as the later); ties in due time go in the batch's order. A store failure answers an
    /// error for the tasks of the chunk it hit (other chunks may be stored), so the answers
    /// say exactly which tasks are durable. An empty batch answers an empty `Vec` without a
    /// store call.
    ///
    /// # Errors
    ///
    /// The whole call, before anything is stored: [`Error::Invalid`] if any id is of the
    /// form reserved for recurring occurrences, [`Error::Closed`] if the queue is closed.
    /// Per task: as [`schedule`](DurableQueue::schedule).
    ///
    /// ```no_run
    /// # async fn example(queue: &tokio_wheel_durable::DurableQueue) -> Result<(), tokio_wheel_durable::Error> {
    /// use std::time::Duration;
    /// use tokio_wheel_durable::Task;
    ///
    /// let tasks = (0..10_000).map(|i| Task::new(format!("order {i}")).after(Duration::from_secs(600)));
    /// for answer in queue.schedule_many(tasks).await? {
    ///     let id = answer?; // or handle Error::InFlight for that one task
    ///     # let _ = id;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn schedule_many(
        &self,
        tasks: impl IntoIterator<Item = Task>,
    ) -> Result<Vec<Result<TaskId, Error>>, Error> {
        let tasks: Vec<Task> = tasks.into_iter().collect();
        for task in &tasks {
            if let Some(id) = &task.id {
                id.check_schedulable()?;
            }
        }
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return Ok(redis.schedule_many(tasks).await);
        }
        // Every request is queued before the first answer is awaited: the engine takes what
        // is queued into one transaction (group commit).
        let mut answers = Vec::with_capacity(tasks.len());
        for task in tasks {
            let (reply, answer) = oneshot::channel();
            self.requests
                .send(Request::Schedule(task, reply))
                .map_err(|_| Error::Closed)?;
            answers.push(answer);
        }
        let mut results = Vec::with_capacity(answers.len());
        for answer in answers {
            results.push(answer.await.unwrap_or(Err(Error::Closed)));
        }
        Ok(results)
    }

    /// Cancels a pending task: `Ok(true)` means it will not be delivered.
    ///
    /// # Errors
    ///
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn cancel(&self, id: &TaskId) -> Result<bool, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.change(id.as_str(), "cancel", 0).await;
        }
        let id = id.as_str().to_owned();
        self.ask(|reply| Request::Cancel(id, reply)).await
    }

    /// Moves a pending task to `when`: `Ok(true)` if it was pending.
    ///
    /// # Errors
    ///
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn reschedule(&self, id: &TaskId, when: SystemTime) -> Result<bool, Error> {
        let due_ms = epoch_ms(when);
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.change(id.as_str(), "reschedule", due_ms).await;
        }
        let id = id.as_str().to_owned();
        self.ask(|reply| Request::Reschedule(id, due_ms, reply))
            .await
    }

    /// Tasks pending or in flight (not dead letters).
    ///
    /// # Errors
    ///
    /// [`Error::Unreachable`], [`Error::Closed`].
    pub async fn len(&self) -> Result<usize, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.len().await;
        }
        self.ask(Request::Len).await
    }

    /// Whether nothing is pending or in flight.
    ///
    /// # Errors
    ///
    /// [`Error::Unreachable`], [`Error::Closed`].
    pub async fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len().await? == 0)
    }

    /// Every dead letter with its payload, in the order they died (on a Redis queue with
    /// `partitions`, one partition after another, in that order within each). This reads
    /// the whole set (in pages of 1000 on Redis, so the server is never blocked): prefer
    /// [`dead_letters_page`](DurableQueue::dead_letters_page) for long lists.
    ///
    /// # Errors
    ///
    /// [`Error::Unreachable`], [`Error::Closed`].
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.dead_letters().await;
        }
        self.ask(Request::DeadLetters).await
    }

    /// Moves a dead letter back to pending, due now, with its attempt count reset:
    /// `Ok(true)` if it was dead.
    ///
    /// # Errors
    ///
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn redrive(&self, id: &TaskId) -> Result<bool, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.change(id.as_str(), "redrive", 0).await;
        }
        let id = id.as_str().to_owned();
        self.ask(|reply| Request::Redrive(id, reply)).await
    }

    /// One task as the store holds it (without its payload), or `None` if there is no task
    /// of that id. A recurring schedule shows as pending at its next occurrence.
    ///
    /// # Errors
    ///
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn get(&self, id: &TaskId) -> Result<Option<TaskInfo>, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.get(id.as_str()).await;
        }
        let id = id.as_str().to_owned();
        self.ask(|reply| Request::Get(id, reply)).await
    }

    /// A page of at most `limit` tasks (capped at [`PAGE_LIMIT`]) in one state, after the
    /// task `after` (from the start if `None`): pending tasks in due order (ties in schedule
    /// order), in-flight tasks in order of lease end, dead letters in the order they died.
    /// Pass the last id of a page as `after` to get the next one; an empty page is the end.
    ///
    /// Each page is one bounded read (on Redis, `ZRANK` and `ZRANGE … LIMIT` on the index:
    /// never the whole set). The list is live: a task that moves between pages (rescheduled,
    /// replaced, extended, finished) may be missed or seen twice. The cursor is a task, found
    /// where it is now: if the task named by `after` itself moved within its state (say, was
    /// rescheduled later), the next page continues from its new place and the tasks it passed
    /// are not listed, so list again from the start after moving the task you page by.
    /// On a Redis queue with `partitions` the list goes one partition after another, in
    /// order within each. In flight, claims still waiting in a stream's buffer come after the deliveries handed
    /// out (embedded store, in id order); on Redis they are kept alive by renewals and move
    /// like extended leases.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] if `after` is no longer in that state (list again from the start),
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn list(
        &self,
        filter: TaskFilter,
        after: Option<&TaskId>,
        limit: usize,
    ) -> Result<Vec<TaskInfo>, Error> {
        let limit = limit.min(PAGE_LIMIT);
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.list(filter, after.map(TaskId::as_str), limit).await;
        }
        let after = after.map(|id| id.as_str().to_owned());
        self.ask(|reply| Request::List(filter, after, limit, reply))
            .await
    }

    /// A page of at most `limit` tasks (capped at [`PAGE_LIMIT`]) in one state, from the start
    /// (`cursor` `None`) or from a position a previous page returned as [`Page::next`]:
    /// pending tasks in due order (ties in schedule order), in-flight tasks in order of lease
    /// end (ties by id), dead letters in the order they died. `next` is `None` once a page
    /// comes back short: the end of the list.
    ///
    /// Unlike [`list`](DurableQueue::list), which continues after a task where that task is
    /// *now*, a [`Cursor`] is a fixed position in the order: whatever happens to the task it
    /// was taken from between pages (rescheduled, acked, replaced, cancelled, dead), the
    /// next page starts right after that position, so no task that stayed in place is
    /// skipped or listed twice. Tasks that move meanwhile are listed where each page finds
    /// them (once, twice or not at all), as in any live list. On a Redis queue with
    /// `partitions` (`Builder::partitions`, feature `redis`) the list goes one partition after another,
    /// in order within each.
    ///
    /// Each page is one bounded read (Redis: a binary search for the position among the
    /// entries of its time, then `ZRANGE … LIMIT`; embedded: a range of the index).
    ///
    /// ```
    /// # use tokio_wheel_durable::{DurableQueue, Error, Page, TaskFilter, TaskInfo};
    /// # async fn all_pending(queue: &DurableQueue) -> Result<Vec<TaskInfo>, Error> {
    /// let mut all = Vec::new();
    /// let mut cursor = None;
    /// loop {
    ///     let page: Page = queue.list_page(TaskFilter::Pending, cursor.as_ref(), 100).await?;
    ///     all.extend(page.items);
    ///     match page.next {
    ///         Some(next) => cursor = Some(next), // or print it: `next.to_string()`
    ///         None => break,
    ///     }
    /// }
    /// # Ok(all)
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for a `limit` of 0 or a cursor of another list (a cursor string
    /// that does not parse is refused by [`str::parse`] already), [`Error::Io`],
    /// [`Error::Unreachable`], [`Error::Closed`].
    pub async fn list_page(
        &self,
        filter: TaskFilter,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, Error> {
        if limit == 0 {
            return Err(Error::Invalid(
                "a page holds at least one task (limit 0)".into(),
            ));
        }
        let limit = limit.min(PAGE_LIMIT);
        let cursor = cursor.map(|c| c.for_list(filter)).transpose()?;
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.list_page(filter, cursor, limit).await;
        }
        let cursor = cursor.cloned();
        self.ask(|reply| Request::ListPage(filter, cursor, limit, reply))
            .await
    }

    /// A page of at most `limit` dead letters (capped at [`PAGE_LIMIT`]) with their
    /// payloads, in the order they died, after the dead letter `after` (on a Redis queue with
    /// `partitions`, one partition after another, in that order within each).
    ///
    /// # Errors
    ///
    /// As [`list`](DurableQueue::list).
    pub async fn dead_letters_page(
        &self,
        after: Option<&TaskId>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, Error> {
        let limit = limit.min(PAGE_LIMIT);
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis
                .dead_letters_page(after.map(TaskId::as_str), limit)
                .await;
        }
        let after = after.map(|id| id.as_str().to_owned());
        self.ask(|reply| Request::DeadPage(after, limit, reply))
            .await
    }

    /// Deletes the dead letters that died more than `older_than` ago (by the store's clock),
    /// in bounded batches; returns how many. `Duration::ZERO` purges them all.
    ///
    /// # Errors
    ///
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn purge_dead(&self, older_than: Duration) -> Result<u64, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.purge_dead(delay_ms(older_than)).await;
        }
        let before_ms = if older_than.is_zero() {
            u64::MAX
        } else {
            crate::protocol::now_ms().saturating_sub(delay_ms(older_than))
        };
        self.ask(|reply| Request::Purge {
            before_ms,
            removed: 0,
            reply: Some(reply),
        })
        .await
    }

    /// Pauses the queue: no worker of it — in this process or any other sharing it (Redis) —
    /// is handed a task until [`resume`](DurableQueue::resume). Scheduling, cancelling and
    /// inspecting go on; deliveries already handed out can still be finished; leases that
    /// run out still bring their tasks back (to pending). Durable: it holds across restarts,
    /// until resumed. [`QueueStats::paused`] and [`is_paused`](DurableQueue::is_paused) say
    /// so.
    ///
    /// What the streams of this handle (and its clones) had claimed ahead (`prefetch`) goes
    /// back at once, unread: the embedded store's one process hands out nothing after the
    /// pause returns. On Redis, a stream of *another* process learns of the pause at its next
    /// claim: it may still yield what it had claimed ahead — at most its prefetch; build its
    /// handle with `prefetch(1)` where a pause must stop even that.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use futures::StreamExt;
    /// # use tokio_wheel::Wheel;
    /// # use tokio_wheel_durable::{DurableQueue, Task, store::MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tokio_wheel_durable::Error> {
    /// # let wheel = Wheel::new();
    /// # let queue = DurableQueue::builder().open_with_store(MemoryStore::new(), &wheel).await?;
    /// queue.pause().await?;
    /// queue.schedule(Task::new("later")).await?; // stored, not delivered
    /// let mut deliveries = queue.deliveries();
    /// assert!(tokio::time::timeout(Duration::from_millis(100), deliveries.next()).await.is_err());
    /// queue.resume().await?;
    /// let delivery = deliveries.next().await.unwrap();
    /// assert_eq!(delivery.payload(), b"later");
    /// # delivery.ack().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`]; [`Error::Invalid`] on a
    /// read-only handle.
    pub async fn pause(&self) -> Result<(), Error> {
        self.set_paused(true).await?;
        // What this handle's streams claimed ahead goes back, not out.
        let mut streams = self.streams.lock().expect("not poisoned");
        streams.retain(|stream| match stream.upgrade() {
            Some(give_back) => {
                give_back.store(true, Ordering::Release);
                true
            }
            None => false,
        });
        Ok(())
    }

    /// Resumes a paused queue: its workers claim again at once (idle Redis workers are woken).
    ///
    /// # Errors
    ///
    /// As [`pause`](DurableQueue::pause).
    pub async fn resume(&self) -> Result<(), Error> {
        self.set_paused(false).await
    }

    async fn set_paused(&self, pause: bool) -> Result<(), Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.pause(pause).await;
        }
        self.ask(|reply| Request::Pause(pause, reply)).await
    }

    /// Whether the queue is paused ([`pause`](DurableQueue::pause)).
    ///
    /// # Errors
    ///
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn is_paused(&self) -> Result<bool, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.is_paused().await;
        }
        Ok(self.stats().await?.paused)
    }

    /// The queue's counts and counters (see [`QueueStats`]).
    ///
    /// # Errors
    ///
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn stats(&self) -> Result<QueueStats, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.stats().await;
        }
        self.ask(Request::Stats).await
    }

    /// Stores a recurring schedule and returns its id once it is durable. Each occurrence is
    /// delivered once, as an ordinary [`Delivery`](crate::Delivery) with the id `"{id}@{ms}"` (a
    /// form [`schedule`](DurableQueue::schedule) refuses, so no task of yours stands in for
    /// an occurrence) whose
    /// [`due`](crate::Delivery::due) is the occurrence's time, across every worker and restart (see
    /// [`Recurring`]). Declaring the same id with the same definition again keeps the
    /// schedule as it is, so every process may declare its schedules at start-up.
    ///
    /// Occurrences are made when a consumer claims: a queue nobody consumes makes none, and
    /// those it missed are caught up by the [`CatchUp`](crate::CatchUp) rule when consuming starts.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for a period under 1 ms or an id of the form reserved for
    /// occurrences (see [`TaskId::is_occurrence`]), [`Error::InFlight`] if a task of that id
    /// is being delivered, [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn schedule_recurring(&self, recurring: Recurring) -> Result<TaskId, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.schedule_recurring(recurring).await;
        }
        self.ask(|reply| Request::ScheduleRecurring(recurring, reply))
            .await
    }

    /// Removes a recurring schedule: `Ok(true)` if there was one. Occurrences already made
    /// stay (cancel them as tasks).
    ///
    /// # Errors
    ///
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn cancel_recurring(&self, id: &TaskId) -> Result<bool, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.change(id.as_str(), "uncron", 0).await;
        }
        let id = id.as_str().to_owned();
        self.ask(|reply| Request::CancelRecurring(id, reply)).await
    }

    /// The payload of task `id` (a recurring schedule's: what each occurrence carries), or
    /// `None` if there is no task of that id. For an operator's look at one task (the
    /// payload is read only here and when a task is handed out).
    ///
    /// # Errors
    ///
    /// [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`].
    pub async fn payload(&self, id: &TaskId) -> Result<Option<Vec<u8>>, Error> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            return redis.payload(id.as_str()).await;
        }
        let id = id.as_str().to_owned();
        self.ask(|reply| Request::Payload(id, reply)).await
    }

    /// A page of at most `limit` recurring schedules (capped at [`PAGE_LIMIT`]), from the
    /// start (`cursor` `None`) or from where a previous page ended ([`RecurringPage::next`]),
    /// in order of their next due time.
    ///
    /// **Cost.** A schedule is kept as a pending entry at its next due time, among the pending
    /// tasks; there is no separate index of schedules. So a call looks through the pending
    /// list: at most [`PAGE_LIMIT`] entries per call (embedded: one read in one transaction;
    /// Redis: one read-only script per partition visited, each on at most that many
    /// entries), and a page may come back with fewer schedules than `limit` — even none —
    /// and a `next` to go on from. Listing every schedule of a queue with `n` pending tasks
    /// takes about `n / 1000` calls. Loop until `next` is `None`:
    ///
    /// ```
    /// # use tokio_wheel_durable::{DurableQueue, Error, RecurringInfo};
    /// # async fn schedules(queue: &DurableQueue) -> Result<Vec<RecurringInfo>, Error> {
    /// let mut all = Vec::new();
    /// let mut cursor = None;
    /// loop {
    ///     let page = queue.recurring_page(cursor.as_ref(), 100).await?;
    ///     all.extend(page.items);
    ///     match page.next {
    ///         Some(next) => cursor = Some(next),
    ///         None => break,
    ///     }
    /// }
    /// # Ok(all)
    /// # }
    /// ```
    ///
    /// The cursor is a position, as for [`list_page`](DurableQueue::list_page): a schedule
    /// that stays in place is listed once. One that fires between two pages moves to its
    /// next due time and may be listed again or missed, like any task that moves. On Redis, a
    /// schedule a worker holds at that moment (for the few milliseconds it takes to make its
    /// occurrences) is listed after the pending ones of its partition.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for a `limit` of 0 or a cursor that did not come from this call
    /// (or from [`list_page`](DurableQueue::list_page) of the pending list), [`Error::Io`],
    /// [`Error::Unreachable`], [`Error::Closed`].
    pub async fn recurring_page(
        &self,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<RecurringPage, Error> {
        if limit == 0 {
            return Err(Error::Invalid(
                "a page holds at least one schedule (limit 0)".into(),
            ));
        }
        let limit = limit.min(PAGE_LIMIT);
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis()? {
            if let Some(cursor) = cursor.filter(|c| c.filter == TaskFilter::Dead) {
                cursor.for_list(TaskFilter::Pending)?;
            }
            return redis.recurring_page(cursor, limit).await;
        }
        let cursor = cursor
            .map(|c| c.for_list(TaskFilter::Pending))
            .transpose()?;
        let cursor = cursor.cloned();
        self.ask(|reply| Request::RecurringPage(cursor, limit, reply))
            .await
    }

    /// A stream of due tasks. Tasks are claimed only while a stream is polled, at most the
    /// prefetch ahead of what was read. May be called more than once; each task goes to one
    /// stream. The stream ends when the queue closes or its wheel shuts down. Dropping it
    /// returns the tasks it had claimed but not yet yielded at once, attempt count unchanged.
    pub fn deliveries(&self) -> Deliveries {
        let (sender, receiver) = mpsc::unbounded_channel();
        let credits = Arc::new(AtomicUsize::new(0));
        let in_transit = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicBool::new(false));
        let give_back = Arc::new(AtomicBool::new(false));
        {
            let mut streams = self.streams.lock().expect("not poisoned");
            // Streams dropped since are forgotten here: a handle that makes a stream per
            // message keeps no trace of the old ones.
            streams.retain(|stream| stream.strong_count() > 0);
            streams.push(Arc::downgrade(&give_back));
        }
        let _ = self.requests.send(Request::Subscribe(Consumer {
            credits: credits.clone(),
            in_transit: in_transit.clone(),
            closed: closed.clone(),
            sender,
        }));
        Deliveries {
            receiver,
            credits,
            in_transit,
            closed,
            give_back,
            prefetch: self.prefetch,
            requests: self.requests.clone(),
        }
    }

    /// Closes the queue gracefully and releases the store for another handle; pending tasks
    /// stay in the store.
    ///
    /// In order: stops claiming; returns the tasks its streams had claimed but not yet
    /// yielded (at once, their attempt count unchanged) and ends the streams; then waits for
    /// the deliveries it handed out to be finished or dropped, at most
    /// [`Builder::close_timeout`] (default 30 s) — what is still held after that is left to
    /// its lease. Other clones and deliveries answer [`Error::Closed`] once it returns.
    pub async fn close(&self) {
        let _ = self.ask(Request::Close).await;
        // Also when the engine had already stopped (the wheel shut down) and could not be
        // asked: it may still be giving the store back.
        if let Some(released) = &self.released {
            let _ = released.clone().wait_for(|released| *released).await;
        }
    }
}
