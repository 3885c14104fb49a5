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
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use crate::error::Elapsed;
use crate::sleep::{Sleep, Woke};

pin_project! {
    /// A future that runs an inner future until a deadline; made by [`Wheel::timeout`] and
    /// [`Wheel::timeout_at`].
    ///
    /// The inner future is polled first, so a future that is already ready completes without
    /// registering any timer. Output: `Ok(value)`, or `Err(Elapsed)` once the deadline passes
    /// (or the wheel shuts down: see [`Elapsed::is_shutdown`]). Dropping it cancels the timer.
    ///
    /// [`Wheel::timeout`]: crate::Wheel::timeout
    /// [`Wheel::timeout_at`]: crate::Wheel::timeout_at
    #[derive(Debug)]
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct Timeout<F> {
        #[pin]
        future: F,
        sleep: Sleep,
    }
}

impl<F> Timeout<F> {
    pub(crate) fn new(future: F, sleep: Sleep) -> Timeout<F> {
        Timeout { future, sleep }
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

    /// The deadline.
    pub fn deadline(&self) -> tokio::time::Instant {
        self.sleep.deadline()
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(value) = this.future.poll(cx) {
            return Poll::Ready(Ok(value));
        }
        this.sleep
            .poll_woke(cx)
            .map(|woke| Err(Elapsed::new(woke == Woke::Shutdown)))
    }
}
