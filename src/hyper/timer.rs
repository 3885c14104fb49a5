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
/// - Sleeps pending when the wheel shuts down ([`Wheel::shutdown`]) complete at once, as every
///   sleep of the wheel does: hyper then sees its timeouts fire. Sleeps made or reset after
///   that run on Tokio's own timer (of the runtime they are made in, which must enable time,
///   as hyper's own `TokioTimer` needs): a stopped wheel fires nothing, and a hyper loop that
///   re-arms a fired sleep (hyper-util's pool idle task) would otherwise find it complete at
///   every reset and spin without yielding (an outside attack saw it hold a current-thread
///   runtime for good).
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

impl HyperTimer {
    /// A sleep until `deadline`: on the wheel, or once the wheel stopped on Tokio's timer of
    /// the runtime it is made in (outside any runtime, where hyper does not run, a wheel sleep
    /// that completes at once).
    fn sleep_at(&self, deadline: Instant) -> HyperSleep {
        let on_tokio = self.wheel.is_shutdown() && tokio::runtime::Handle::try_current().is_ok();
        let sleep = if on_tokio {
            Inner::Tokio(Box::pin(tokio::time::sleep_until(deadline)))
        } else {
            Inner::Wheel(self.wheel.sleep_until(deadline))
        };
        HyperSleep { sleep }
    }
}

impl ::hyper::rt::Timer for HyperTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn ::hyper::rt::Sleep>> {
        let deadline = crate::timer::clock::saturating_add(Instant::now(), duration);
        Box::pin(self.sleep_at(deadline))
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn ::hyper::rt::Sleep>> {
        Box::pin(self.sleep_at(Instant::from_std(deadline)))
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
            Some(ours) if !self.wheel.is_shutdown() => ours.get_mut().reset(deadline),
            Some(ours) => ours.get_mut().sleep = self.sleep_at(deadline).sleep,
            None => *sleep = Box::pin(self.sleep_at(deadline)),
        }
    }
}

/// The sleep a [`HyperTimer`] hands hyper: a wheel [`Sleep`] that is `Send + Sync + Unpin`,
/// as [`hyper::rt::Sleep`] requires (or, made or reset once the wheel has stopped, a Tokio
/// sleep: see [`HyperTimer`]).
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
    sleep: Inner,
}

#[derive(Debug)]
enum Inner {
    Wheel(Sleep),
    /// Made or reset after the wheel stopped.
    Tokio(Pin<Box<tokio::time::Sleep>>),
}

impl HyperSleep {
    /// The instant this sleep completes at.
    pub fn deadline(&self) -> Instant {
        match &self.sleep {
            Inner::Wheel(sleep) => sleep.deadline(),
            Inner::Tokio(sleep) => sleep.deadline(),
        }
    }

    /// Whether the sleep has completed: its deadline passed, or the wheel shut down.
    pub fn is_elapsed(&self) -> bool {
        match &self.sleep {
            Inner::Wheel(sleep) => sleep.is_elapsed(),
            Inner::Tokio(sleep) => sleep.is_elapsed(),
        }
    }

    /// Moves the deadline, earlier or later, before or after completion ([`Sleep::reset`]).
    pub fn reset(&mut self, deadline: Instant) {
        match &mut self.sleep {
            Inner::Wheel(sleep) => Pin::new(sleep).reset(deadline),
            Inner::Tokio(sleep) => sleep.as_mut().reset(deadline),
        }
    }
}

impl Future for HyperSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.get_mut().sleep {
            Inner::Wheel(sleep) => Pin::new(sleep).poll(cx),
            Inner::Tokio(sleep) => sleep.as_mut().poll(cx),
        }
    }
}

impl ::hyper::rt::Sleep for HyperSleep {}
