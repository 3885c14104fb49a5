//! [`Timeout`]: a future bounded by a deadline.
//!
//! ```
//! use std::time::Duration;
//! use tokio_wheel::Wheel;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let wheel = Wheel::new();
//! let slow = wheel.sleep(Duration::from_secs(10));
//! let result = wheel.timeout(Duration::from_secs(1), slow).await;
//! assert!(result.is_err());
//! assert_eq!(wheel.timeout(Duration::from_secs(1), async { 5 }).await, Ok(5));
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::actor::context::WheelContext;
use crate::error::Elapsed;
use crate::sleep::{Sleep, Woke};

pin_project! {
    /// A future that runs an inner future until a deadline; made by [`Wheel::timeout`] and
    /// [`Wheel::timeout_at`].
    ///
    /// The inner future is polled first, so a future that is already ready completes without
    /// reading the clock or registering any timer. Output: `Ok(value)`, or `Err(Elapsed)` once
    /// the deadline passes (or the wheel shuts down: see [`Elapsed::is_shutdown`]). Polled at
    /// or after its deadline with the inner future still pending, it is `Err` on that poll.
    /// Dropping it cancels the timer.
    ///
    /// With [`Wheel::timeout`], the duration counts from the first poll that finds the inner
    /// future pending (as pingora's `fast_timeout` does); awaited where it is made, as usual,
    /// that is what tokio's `timeout` does too. [`Wheel::timeout_at`] fixes the deadline when
    /// it is made.
    ///
    /// [`Wheel::timeout`]: crate::Wheel::timeout
    /// [`Wheel::timeout_at`]: crate::Wheel::timeout_at
    #[derive(Debug)]
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct Timeout<F> {
        #[pin]
        future: F,
        sleep: Sleep,
        // Until the first pending poll: how long the timeout lasts from then.
        after: Option<Duration>,
    }
}

impl<F> Timeout<F> {
    /// A timeout of `duration` counted from the first pending poll.
    pub(crate) fn after(wheel: &Arc<WheelContext>, duration: Duration, future: F) -> Timeout<F> {
        // A placeholder that costs no clock read; replaced before the timer is armed.
        let origin = wheel.shared.clock.instant(0);
        let sleep = Sleep::new(wheel, origin);
        Timeout {
            future,
            sleep,
            after: Some(duration),
        }
    }

    /// A timeout at a fixed deadline.
    pub(crate) fn at(sleep: Sleep, future: F) -> Timeout<F> {
        Timeout {
            future,
            sleep,
            after: None,
        }
    }

    /// The inner future.
    pub fn get_ref(&self) -> &F {
        &self.future
    }

    /// The inner future, mutably.
    pub fn get_mut(&mut self) -> &mut F {
        &mut self.future
    }

    /// The inner future, dropping the timer.
    pub fn into_inner(self) -> F {
        self.future
    }

    /// The deadline, once fixed: always for [`Wheel::timeout_at`](crate::Wheel::timeout_at),
    /// and from the first poll that found the inner future pending for
    /// [`Wheel::timeout`](crate::Wheel::timeout).
    pub fn deadline(&self) -> Option<Instant> {
        self.after.is_none().then(|| self.sleep.deadline())
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(value) = this.future.poll(cx) {
            return Poll::Ready(Ok(value));
        }
        let woke = match this.after.take() {
            Some(duration) => this.sleep.poll_from_now(duration, cx),
            None => this.sleep.poll_woke(cx),
        };
        woke.map(|woke| Err(Elapsed::new(woke == Woke::Shutdown)))
    }
}
