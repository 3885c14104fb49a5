//! [`HyperTimer`]: `hyper::rt::Timer` on the wheel.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use crate::{Sleep, Wheel};

/// hyper's timer ([`hyper::rt::Timer`]) on a [`Wheel`]: header-read timeouts, HTTP/2
/// keep-alive pings and the client pool's idle expiry fire on the wheel instead of Tokio's
/// timer.
///
/// `HyperTimer` is `Clone + Send + Sync` (a clone of the wheel's handle); give a clone to
/// every builder. Its sleeps are [`HyperSleep`]s, boxed as hyper asks.
///
/// - [`reset`](hyper::rt::Timer::reset) of one of its own sleeps moves that sleep in place
///   ([`Sleep::reset`]): a later deadline is one atomic compare-and-swap, with no allocation
///   and no message to the wheel's actor. A sleep from another timer is replaced by one of
///   ours.
/// - [`now`](hyper::rt::Timer::now) is the wheel's clock, [`tokio::time::Instant::now`], so
///   `tokio::time::pause()` drives hyper's timeouts too.
/// - After [`Wheel::shutdown`] its sleeps complete at once, as every sleep of the wheel does:
///   hyper then sees its timeouts fire.
///
/// ```
/// use std::time::Duration;
///
/// use hyper::rt::Timer;
/// use tokio_wheel::Wheel;
/// use tokio_wheel::hyper::HyperTimer;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let wheel = Wheel::new();
/// let timer = HyperTimer::new(&wheel);
/// // What hyper does with a header-read timeout: a sleep, moved when the deadline changes.
/// let start = timer.now();
/// let mut sleep = timer.sleep(Duration::from_secs(10));
/// timer.reset(&mut sleep, start + Duration::from_secs(30)); // later: moved in place
/// sleep.await;
/// assert!(timer.now() >= start + Duration::from_secs(30));
/// # }
/// ```
///
/// With hyper's builders (compiled in `servers/`): `http1::Builder::new().timer(timer.clone())
/// .header_read_timeout(d)`, `http2::Builder::new(executor).timer(timer.clone())`, hyper-util's
/// `server::conn::auto::Builder` (`.http1().timer(..)`, `.http2().timer(..)`) and its client's
/// `Client::builder(executor).pool_timer(timer.clone())`.
#[derive(Debug, Clone)]
pub struct HyperTimer {
    wheel: Wheel,
}

impl HyperTimer {
    /// A timer whose sleeps run on `wheel`.
    pub fn new(wheel: &Wheel) -> HyperTimer {
        HyperTimer {
            wheel: wheel.clone(),
        }
    }

    /// The wheel this timer's sleeps run on.
    pub fn wheel(&self) -> &Wheel {
        &self.wheel
    }
}

impl ::hyper::rt::Timer for HyperTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn ::hyper::rt::Sleep>> {
        Box::pin(HyperSleep {
            sleep: self.wheel.sleep(duration),
        })
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn ::hyper::rt::Sleep>> {
        Box::pin(HyperSleep {
            sleep: self.wheel.sleep_until(Instant::from_std(deadline)),
        })
    }

    fn now(&self) -> std::time::Instant {
        Instant::now().into_std()
    }

    fn reset(
        &self,
        sleep: &mut Pin<Box<dyn ::hyper::rt::Sleep>>,
        new_deadline: std::time::Instant,
    ) {
        let deadline = Instant::from_std(new_deadline);
        match sleep.as_mut().downcast_mut_pin::<HyperSleep>() {
            Some(ours) => ours.get_mut().reset(deadline),
            None => {
                *sleep = Box::pin(HyperSleep {
                    sleep: self.wheel.sleep_until(deadline),
                })
            }
        }
    }
}

/// The sleep a [`HyperTimer`] hands hyper: a wheel [`Sleep`] that is `Send + Sync + Unpin`,
/// as [`hyper::rt::Sleep`] requires.
///
/// hyper sees it as a `Pin<Box<dyn hyper::rt::Sleep>>`; downcast it to read or move its
/// deadline:
///
/// ```
/// use std::time::Duration;
///
/// use hyper::rt::Timer;
/// use tokio::time::Instant;
/// use tokio_wheel::Wheel;
/// use tokio_wheel::hyper::{HyperSleep, HyperTimer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let wheel = Wheel::new();
/// let timer = HyperTimer::new(&wheel);
/// let mut sleep = timer.sleep(Duration::from_secs(1));
/// let later = Instant::now() + Duration::from_secs(5);
/// timer.reset(&mut sleep, later.into_std());
/// let ours = sleep.as_mut().downcast_mut_pin::<HyperSleep>().unwrap();
/// assert_eq!(ours.deadline(), later);
/// sleep.await;
/// assert!(Instant::now() >= later);
/// # }
/// ```
#[derive(Debug)]
#[must_use = "futures do nothing unless you `.await` or poll them"]
pub struct HyperSleep {
    sleep: Sleep,
}

impl HyperSleep {
    /// The instant this sleep completes at.
    pub fn deadline(&self) -> Instant {
        self.sleep.deadline()
    }

    /// Whether the sleep has completed: its deadline passed, or the wheel shut down.
    pub fn is_elapsed(&self) -> bool {
        self.sleep.is_elapsed()
    }

    /// Moves the deadline, earlier or later, before or after completion ([`Sleep::reset`]).
    pub fn reset(&mut self, deadline: Instant) {
        Pin::new(&mut self.sleep).reset(deadline);
    }
}

impl Future for HyperSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.get_mut().sleep).poll(cx)
    }
}

impl ::hyper::rt::Sleep for HyperSleep {}
