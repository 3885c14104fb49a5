//! [`Wheel`]: the cheap, cloneable handle every other type starts from.
//!
//! Starting a wheel (`Wheel::new`, `Wheel::builder`) lives in `builder.rs`. The futures, jobs
//! and keyed sets made here hold the wheel's [`WheelContext`], not the `Wheel`, so imports run
//! one way: this file → the handles → the actor.

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::actor::context::{Lane, WheelContext};
use crate::actor::inbox::Urgency;
use crate::actor::timers::Command;
use crate::interval::Interval;
use crate::job::{JobHandle, Schedule};
use crate::keyed::{self, Expirations, Timers};
use crate::sleep::Sleep;
use crate::stats::Stats;
use crate::stopped::Stopped;
use crate::timeout::Timeout;
use crate::timer::clock::deadline_after;
use crate::timer::shared::Shared;

/// A handle to a timer wheel: one actor task owning a cascade of wheels, plus everything
/// created from it.
///
/// `Wheel` is cheap to clone (an `Arc`), `Send + Sync + 'static`; every clone talks to the
/// same actor. Start one with [`Wheel::new`] or [`Wheel::builder`].
///
/// ```
/// use std::time::Duration;
/// use tokio_wheel::Wheel;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let wheel = Wheel::new();
/// wheel.sleep(Duration::from_millis(10)).await;
///
/// let job = wheel.spawn_after(Duration::from_secs(1), async { 6 * 7 });
/// assert_eq!(job.await, Ok(42));
///
/// let (timers, mut expired) = wheel.keyed::<&str, u32>();
/// timers.set("conn-1", 7, Duration::from_secs(30));
/// use futures::StreamExt;
/// let e = expired.next().await.unwrap();
/// assert_eq!(e.into_parts(), ("conn-1", 7));
/// # }
/// ```
///
/// # Lifetime
///
/// The actor runs while anything still needs it — a handle, a future, a job, a keyed entry —
/// and then exits on its own; a detached job still fires after every handle is dropped.
/// [`shutdown`](Wheel::shutdown) stops it early, resolving everything pending.
///
/// # Cost
///
/// A wheel runs one task per timer actor ([`Builder::timer_shards`](crate::Builder::timer_shards))
/// and takes about 2 KiB besides its actors' tables: 16 copies of what its handles share, so
/// that futures and jobs made on many threads each keep their reference count on their own
/// thread's cache line (one shared count cost 8 producers on 2 cores ~40 % of their time).
/// Each keyed set adds an actor per shard ([`Builder::shards`](crate::Builder::shards)).
#[derive(Clone)]
pub struct Wheel {
    pub(crate) inner: Arc<WheelContext>,
}

impl fmt::Debug for Wheel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The context shows itself as its wheel: one format for a `Wheel` and its handles.
        fmt::Debug::fmt(&self.inner, f)
    }
}

impl Wheel {
    /// A wheel around a running actor; the one constructor, used by [`Builder`](crate::Builder).
    pub(crate) fn from_parts(shared: Arc<Shared>, lanes: Box<[Lane]>) -> Wheel {
        Wheel {
            inner: Arc::new(WheelContext::new(shared, lanes)),
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.inner.shared
    }

    /// The wheel's resolution.
    pub fn tick(&self) -> Duration {
        self.inner.shared.clock.tick()
    }

    /// The wheel's name (from [`Builder::name`](crate::Builder::name)).
    pub fn name(&self) -> &str {
        &self.inner.shared.name
    }

    /// Whether the wheel has stopped: [`shutdown`](Wheel::shutdown) was called, or the runtime
    /// running its actor shut down.
    pub fn is_shutdown(&self) -> bool {
        self.inner.shared.is_closed()
    }

    /// The runtime the wheel's jobs run on (and its actors, unless
    /// [`Builder::own_thread`](crate::Builder::own_thread) gave them a thread): where a layer
    /// built on the wheel spawns its own tasks.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.inner.shared.runtime
    }

    /// A future that resolves once the wheel has stopped ([`shutdown`](Wheel::shutdown), or
    /// the runtime running its actor shut down). It does not keep the wheel running. See
    /// [`Stopped`].
    pub fn stopped(&self) -> Stopped {
        Stopped::new(self.inner.shared.shutdown_signal())
    }

    /// A future that completes `duration` from now (saturating: `Duration::MAX` never
    /// overflows). See [`Sleep`].
    pub fn sleep(&self, duration: Duration) -> Sleep {
        Sleep::new(self.inner.for_this_thread(), deadline_after(duration))
    }

    /// A future that completes at `deadline`. See [`Sleep`].
    pub fn sleep_until(&self, deadline: Instant) -> Sleep {
        Sleep::new(self.inner.for_this_thread(), deadline)
    }

    /// Runs `future`, giving up after `duration` with [`Elapsed`](crate::Elapsed).
    ///
    /// The duration counts from the first poll that finds `future` pending, so a timeout
    /// around a future that is ready at once never reads the clock. Awaited where it is made
    /// (the usual way), that is the same as tokio's `timeout`; use
    /// [`timeout_at`](Self::timeout_at) for a deadline fixed now.
    pub fn timeout<F: Future>(&self, duration: Duration, future: F) -> Timeout<F> {
        Timeout::after(self.inner.for_this_thread(), duration, future)
    }

    /// Runs `future`, giving up at `deadline` with [`Elapsed`](crate::Elapsed).
    pub fn timeout_at<F: Future>(&self, deadline: Instant, future: F) -> Timeout<F> {
        Timeout::at(self.sleep_until(deadline), future)
    }

    /// An [`Interval`] ticking every `period`, the first tick at once.
    ///
    /// # Panics
    ///
    /// If `period` is zero.
    pub fn interval(&self, period: Duration) -> Interval {
        self.interval_at(Instant::now(), period)
    }

    /// An [`Interval`] ticking every `period`, the first tick at `start`.
    ///
    /// # Panics
    ///
    /// If `period` is zero.
    pub fn interval_at(&self, start: Instant, period: Duration) -> Interval {
        Interval::new(self.sleep_until(start), period)
    }

    /// Runs `future` as a Tokio task on the wheel's runtime once `delay` has passed.
    /// See [`JobHandle`].
    pub fn spawn_after<F>(&self, delay: Duration, future: F) -> JobHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.spawn_at(deadline_after(delay), future)
    }

    /// Runs `future` as a Tokio task on the wheel's runtime at `deadline`. See [`JobHandle`].
    pub fn spawn_at<F>(&self, deadline: Instant, future: F) -> JobHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        JobHandle::one_shot(self.inner.for_this_thread(), deadline, future)
    }

    /// Runs the future `job` makes every `period`, the first run one period from now; runs
    /// never overlap. See [`Schedule`] and [`JobHandle`].
    ///
    /// # Panics
    ///
    /// If `period` is zero.
    pub fn spawn_every<J, F>(&self, period: Duration, schedule: Schedule, job: J) -> JobHandle<()>
    where
        J: FnMut() -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        JobHandle::periodic(self.inner.for_this_thread(), period, schedule, job)
    }

    /// A set of keyed timers: [`Timers`] to set, move and remove them by key, and the
    /// [`Expirations`] stream that delivers each one when it fires. Each set runs its own
    /// actor on the wheel's runtime, sharing the wheel's clock, stats and shutdown.
    pub fn keyed<K, V>(&self) -> (Timers<K, V>, Expirations<K, V>)
    where
        K: Eq + Hash + Clone + Send + 'static,
        V: Send + 'static,
    {
        keyed::new(&self.inner)
    }

    /// Waits until the timer actors have applied every sleep and job command sent before
    /// this call (from any handle) and published it in [`stats`](Wheel::stats). Returns at
    /// once on a stopped wheel. Keyed sets have their own actors: [`Timers::len`] is their
    /// barrier.
    ///
    /// Useful in tests and benchmarks; timers work without it.
    pub async fn flush(&self) {
        // Every lane's barrier is queued before any is awaited: they run side by side.
        let mut answers = Vec::with_capacity(self.inner.lanes.len());
        for lane in 0..self.inner.lanes.len() as u32 {
            let (reply, done) = tokio::sync::oneshot::channel();
            let shard = self.inner.inbox(lane).shard_for_thread() as u32;
            let flush = Command::Flush(reply);
            if self.inner.send(lane, shard, flush, Urgency::Now).is_some() {
                answers.push(done);
            }
        }
        for done in answers {
            let _ = done.await;
        }
    }

    /// A snapshot of the wheel's counters.
    pub fn stats(&self) -> Stats {
        Stats::from_shared(self.shared())
    }

    /// Stops the wheel gracefully and waits until every actor has stopped.
    ///
    /// New timers are refused from the moment this is called (sleeps resolve at once, jobs
    /// return [`JobError::Shutdown`](crate::JobError::Shutdown), keyed `set`s are dropped).
    /// Pending sleeps and interval ticks resolve; pending timeouts return
    /// [`Elapsed`](crate::Elapsed) with [`is_shutdown`](crate::Elapsed::is_shutdown); jobs not
    /// yet started return `JobError::Shutdown` (running ones finish); pending keyed entries are
    /// delivered marked [`is_shutdown`](crate::Expired::is_shutdown), then the streams end.
    /// Calling it again is harmless.
    pub async fn shutdown(&self) {
        let shared = self.shared();
        if shared.close() {
            tracing::debug!(wheel = %shared.name, "shutdown requested");
        }
        shared.request_shutdown();
        shared.actors_stopped().await;
    }
}
