//! [`Stopped`]: a future that resolves once a wheel has stopped.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use tokio::sync::watch;

/// Resolves once its wheel has stopped: [`shutdown`](crate::Wheel::shutdown) was called, the
/// runtime running its actor shut down, or the wheel's state is gone. Made by
/// [`Wheel::stopped`](crate::Wheel::stopped).
///
/// `Clone + Send + Sync + Unpin + 'static`, and it holds nothing that keeps the wheel running.
/// Once resolved it stays resolved: polling it again (or a clone) is `Ready` at once, so it
/// can sit in a `select!` loop by `&mut`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let wheel = tokio_wheel::Wheel::new();
/// let stopped = wheel.stopped();
/// assert!(!stopped.is_stopped());
/// wheel.shutdown().await;
/// stopped.clone().await;
/// assert!(stopped.is_stopped());
/// # }
/// ```
#[derive(Clone)]
pub struct Stopped {
    signal: watch::Receiver<bool>,
    wait: Shared<BoxFuture<'static, ()>>,
}

impl Stopped {
    pub(crate) fn new(signal: watch::Receiver<bool>) -> Stopped {
        let mut watching = signal.clone();
        let wait = async move {
            // An error means the wheel's state is gone: stopped as well.
            let _ = watching.wait_for(|stopped| *stopped).await;
        };
        Stopped {
            signal,
            wait: wait.boxed().shared(),
        }
    }

    /// Whether the wheel has stopped (the future would resolve at once).
    pub fn is_stopped(&self) -> bool {
        *self.signal.borrow() || self.signal.has_changed().is_err()
    }
}

impl Future for Stopped {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // Once stopped, never poll the shared wait again: a completed `Shared` (and a clone
        // made of it afterwards) panics when polled.
        if self.is_stopped() {
            return Poll::Ready(());
        }
        self.wait.poll_unpin(cx)
    }
}

impl fmt::Debug for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stopped")
            .field("stopped", &self.is_stopped())
            .finish()
    }
}
