//! [`Sleep`]: a future that completes at a deadline.
//!
//! ```
//! use std::time::Duration;
//! use tokio::time::Instant;
//! use tokio_wheel::Wheel;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let wheel = Wheel::new();
//! let start = Instant::now();
//! wheel.sleep(Duration::from_millis(100)).await;
//! assert!(start.elapsed() >= Duration::from_millis(100));
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use tokio::time::Instant;

use crate::actor::timers::{Command, Timer};
use crate::handle::Wheel;
use crate::state::{Cancelled, Moved, State, TimerState};

/// What a sleep's handle and the actor share.
#[derive(Debug)]
pub(crate) struct SleepShared {
    pub(crate) state: TimerState,
    pub(crate) waker: AtomicWaker,
}

/// How a sleep ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woke {
    /// The deadline passed.
    Elapsed,
    /// The wheel stopped first.
    Shutdown,
}

/// A future that completes at its deadline; made by [`Wheel::sleep`] and
/// [`Wheel::sleep_until`].
///
/// - It never completes before its deadline, and at most one tick (plus scheduling latency)
///   after it. A deadline at or before now completes on the first poll without touching the
///   actor.
/// - The timer is registered on the first poll; dropping the future cancels it, and the actor
///   reclaims its memory at once.
/// - `Duration::MAX` and far-future instants saturate (about 30 years ahead): no panic, no
///   overflow, never early.
/// - If the wheel shuts down first, the sleep completes at once.
///
/// Unlike tokio's `Sleep`, this one is [`Unpin`]: it can be stored and polled without pinning,
/// and [`reset`](Sleep::reset) can be called through `Pin::new(&mut sleep)`.
///
/// # Cost
///
/// One allocation (the state shared with the actor, ~64 bytes) and one channel message when
/// first polled; moving the deadline *later* is a single atomic compare-and-swap with no
/// message, moving it earlier sends one.
#[derive(Debug)]
#[must_use = "futures do nothing unless you `.await` or poll them"]
pub struct Sleep {
    wheel: Wheel,
    deadline: Instant,
    timer: Option<Arc<SleepShared>>,
    /// Set when the sleep completed without a registered timer.
    woke: Option<Woke>,
}

impl Sleep {
    pub(crate) fn new(wheel: Wheel, deadline: Instant) -> Sleep {
        Sleep {
            wheel,
            deadline,
            timer: None,
            woke: None,
        }
    }

    /// The instant this sleep completes at.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    pub(crate) fn wheel_tick(&self) -> std::time::Duration {
        self.wheel.tick()
    }

    /// Whether the sleep has completed (its deadline passed, or the wheel shut down).
    pub fn is_elapsed(&self) -> bool {
        self.woke.is_some()
            || self
                .timer
                .as_ref()
                .is_some_and(|timer| matches!(timer.state.state(), State::Fired | State::Shutdown))
    }

    /// Moves the deadline, earlier or later, before or after completion: the sleep then
    /// completes at the new deadline, even if the old one fired concurrently.
    ///
    /// ```
    /// use std::pin::Pin;
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use tokio_wheel::Wheel;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let wheel = Wheel::new();
    /// let start = Instant::now();
    /// let mut sleep = wheel.sleep(Duration::from_secs(1));
    /// Pin::new(&mut sleep).reset(start + Duration::from_secs(5));
    /// (&mut sleep).await;
    /// assert!(start.elapsed() >= Duration::from_secs(5));
    /// # }
    /// ```
    pub fn reset(self: Pin<&mut Self>, deadline: Instant) {
        let this = self.get_mut();
        this.deadline = deadline;
        this.woke = None;
        let Some(timer) = &this.timer else {
            return;
        };
        let tick = this.wheel.shared().clock.deadline_tick(deadline);
        match timer.state.move_to(tick, true) {
            Moved::Quietly | Moved::Refused => {}
            Moved::Earlier => {
                this.wheel
                    .send(Command::Reschedule(Timer::Sleep(timer.clone())));
            }
            Moved::Rearmed => {
                if !this
                    .wheel
                    .send(Command::Insert(Timer::Sleep(timer.clone())))
                {
                    this.woke = Some(Woke::Shutdown);
                }
            }
        }
    }

    /// Polls for completion and says how it ended.
    pub(crate) fn poll_woke(&mut self, cx: &mut Context<'_>) -> Poll<Woke> {
        if let Some(woke) = self.woke {
            return Poll::Ready(woke);
        }
        let Some(timer) = &self.timer else {
            return self.register(cx);
        };
        let woke = |state| match state {
            State::Fired => Some(Woke::Elapsed),
            State::Shutdown => Some(Woke::Shutdown),
            _ => None,
        };
        if let Some(woke) = woke(timer.state.state()) {
            return Poll::Ready(woke);
        }
        timer.waker.register(cx.waker());
        // The actor may have fired between the check and the registration.
        match woke(timer.state.state()) {
            Some(woke) => Poll::Ready(woke),
            None => Poll::Pending,
        }
    }

    fn register(&mut self, cx: &mut Context<'_>) -> Poll<Woke> {
        if self.deadline <= Instant::now() {
            self.woke = Some(Woke::Elapsed);
            return Poll::Ready(Woke::Elapsed);
        }
        let tick = self.wheel.shared().clock.deadline_tick(self.deadline);
        let timer = Arc::new(SleepShared {
            state: TimerState::pending(tick),
            waker: AtomicWaker::new(),
        });
        timer.waker.register(cx.waker());
        if !self
            .wheel
            .send(Command::Insert(Timer::Sleep(timer.clone())))
        {
            self.woke = Some(Woke::Shutdown);
            return Poll::Ready(Woke::Shutdown);
        }
        self.timer = Some(timer);
        Poll::Pending
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.get_mut().poll_woke(cx).map(|_| ())
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(timer) = self.timer.take() {
            if timer.state.cancel() == Cancelled::InWheel {
                self.wheel.send(Command::Cancel(Timer::Sleep(timer)));
            }
        }
    }
}
