//! The actor's alarm on tokio's timer: two `tokio::time::Sleep`s, so that one is still
//! registered with tokio's driver when the other fires.
//!
//! # Why two
//!
//! Tokio's driver, after firing its due timers, notes the earliest timer still registered; a
//! timer registered (or moved earlier) afterwards for a sooner tick makes the driver *unpark*
//! itself — a write to its eventfd, and one more trip through `epoll_wait` before the worker
//! can sleep. With one sleep, the actor's alarm was the only timer in tokio's wheel while a
//! flood fired: it fired, the driver found nothing left, and re-arming it for the next tick
//! unparked the driver on every turn (measured with `--only fire` at 10^5: one `write` and two
//! `epoll_wait`s per actor wake-up, against one `epoll_wait` per wake-up of tokio's own
//! driver).
//!
//! So while the actor fires densely (its next wake-up within two ticks), each arming also
//! sets a *spare* one tick (at least tokio's millisecond) after the wake-up asked for: a guess
//! at the next one. When the main sleep fires, the spare is still registered, the driver parks
//! with its tick in mind, and the next arming moves the spare to the next wake-up — within
//! that tick or earlier: no unpark — and the fired one out to become the new spare, later
//! still: no unpark either. A wake-up earlier than the spare (a command due sooner) unparks
//! the driver as it must.
//!
//! Tokio moves a registered sleep *later* lazily (it stays filed at its old tick and the driver
//! wakes there for nothing), so a sleep armed a tick or more before the wake-up is dropped
//! (which deregisters it) rather than moved, and while the actor wakes seldom (a lazy look,
//! sparse timers) it keeps no spare: re-arming then unparks the driver once per turn, as with
//! one sleep, which costs less than a spare moved later every turn. Once the actor has nothing
//! to wake for, both are dropped, so an idle actor is never woken by its spare.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::timer::clock::Clock;

/// Tokio's timer resolution: the spare is never closer than this to the wake-up it follows.
const DRIVER_GRID: Duration = Duration::from_millis(1);

/// The actor's wake-up on tokio's timer.
pub(crate) struct Alarm {
    sleeps: [Pin<Box<Sleep>>; 2],
    /// The offset each sleep is armed for, while it is registered and not seen to fire.
    at: [Option<u64>; 2],
}

impl Alarm {
    /// An alarm set for nothing.
    pub(crate) fn new() -> Self {
        Alarm {
            sleeps: [unarmed(), unarmed()],
            at: [None, None],
        }
    }

    /// Sets the alarm for `wake` (an offset of `clock`), or for nothing; `now` is the offset
    /// the turn read last.
    pub(crate) fn set(&mut self, wake: Option<u64>, now: u64, clock: &Clock) {
        for (at, sleep) in self.at.iter_mut().zip(&self.sleeps) {
            if at.is_some() && sleep.is_elapsed() {
                *at = None;
            }
        }
        let Some(wake) = wake else {
            // Left armed, a sleep would wake the idle actor.
            self.disarm(0);
            self.disarm(1);
            return;
        };
        let lead = clock.tick().max(DRIVER_GRID).as_nanos() as u64;
        // Tokio moves a registered sleep later lazily: it stays filed at its old tick, and
        // the driver wakes there for nothing. So a sleep armed a tick or more before the
        // wake-up is taken out (dropping deregisters it) rather than moved.
        for which in 0..2 {
            if self.at[which].is_some_and(|at| at.saturating_add(lead) <= wake) {
                self.disarm(which);
            }
        }
        // The main sleep is the armed one due first (moving it within its tick, or earlier,
        // costs tokio no unpark); the other becomes the spare.
        let main = match self.at {
            [Some(a), Some(b)] => usize::from(b < a),
            [None, Some(_)] => 1,
            _ => 0,
        };
        self.arm(main, wake, clock);
        if wake <= now.saturating_add(lead.saturating_mul(2)) {
            // Firing densely: the next wake-up is likely a tick after this one.
            self.arm(1 - main, wake.saturating_add(lead), clock);
        } else {
            // Waking seldom (a lazy look, sparse timers): a spare would be moved later each
            // turn and wake the driver for nothing; re-arming then unparks it, once per turn.
            self.disarm(1 - main);
        }
    }

    /// Drops sleep `which` if it is armed: that deregisters it without unparking the driver,
    /// and a fresh sleep is not registered until it is polled or reset.
    fn disarm(&mut self, which: usize) {
        if self.at[which].take().is_some() {
            self.sleeps[which] = unarmed();
        }
    }

    fn arm(&mut self, which: usize, offset: u64, clock: &Clock) {
        if self.at[which] != Some(offset) {
            self.sleeps[which].as_mut().reset(clock.instant(offset));
            self.at[which] = Some(offset);
        }
    }

    /// Completes when an armed sleep fires.
    pub(crate) async fn rings(&mut self) {
        poll_fn(|cx| {
            let mut rang = false;
            for (at, sleep) in self.at.iter_mut().zip(&mut self.sleeps) {
                if at.is_some() && sleep.as_mut().poll(cx).is_ready() {
                    *at = None;
                    rang = true;
                }
            }
            if rang { Poll::Ready(()) } else { Poll::Pending }
        })
        .await
    }
}

/// A sleep tokio does not know of until it is polled or reset.
fn unarmed() -> Pin<Box<Sleep>> {
    Box::pin(tokio::time::sleep_until(Instant::now()))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Waker};

    use super::*;

    const MS: u64 = 1_000_000;

    fn rang(alarm: &mut Alarm) -> bool {
        let rings = pin!(alarm.rings());
        rings
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_ready()
    }

    async fn advance_to(clock: &Clock, offset: u64) {
        let target = clock.instant(offset);
        tokio::time::advance(target.saturating_duration_since(Instant::now())).await;
    }

    #[tokio::test(start_paused = true)]
    async fn it_rings_at_the_wake_up_not_before() {
        let clock = Clock::new(Instant::now(), Duration::from_millis(1));
        let mut alarm = Alarm::new();
        alarm.set(Some(20 * MS), 19 * MS, &clock);
        advance_to(&clock, 20 * MS - 1).await;
        assert!(!rang(&mut alarm));
        advance_to(&clock, 20 * MS).await;
        assert!(rang(&mut alarm));
    }

    #[tokio::test(start_paused = true)]
    async fn the_spare_is_still_registered_when_the_wake_up_rings() {
        let clock = Clock::new(Instant::now(), Duration::from_millis(1));
        let mut alarm = Alarm::new();
        alarm.set(Some(5 * MS), 4 * MS, &clock);
        advance_to(&clock, 5 * MS).await;
        assert!(rang(&mut alarm));
        // What keeps tokio's driver from unparking itself when the actor re-arms.
        let spare = alarm.at.iter().flatten().copied().collect::<Vec<_>>();
        assert_eq!(spare, [6 * MS]);
        // The next wake-up reuses the spare, and the fired sleep becomes the new spare.
        alarm.set(Some(6 * MS), 5 * MS, &clock);
        let mut armed = alarm.at.iter().flatten().copied().collect::<Vec<_>>();
        armed.sort_unstable();
        assert_eq!(armed, [6 * MS, 7 * MS]);
        advance_to(&clock, 6 * MS).await;
        assert!(rang(&mut alarm));
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_wake_up_moves_it() {
        let clock = Clock::new(Instant::now(), Duration::from_millis(1));
        let mut alarm = Alarm::new();
        alarm.set(Some(50 * MS), 0, &clock);
        assert!(!rang(&mut alarm));
        alarm.set(Some(10 * MS), 0, &clock);
        advance_to(&clock, 10 * MS).await;
        assert!(rang(&mut alarm));
    }

    #[tokio::test(start_paused = true)]
    async fn waking_seldom_it_keeps_no_spare_and_no_sleep_due_before_the_wake_up() {
        let clock = Clock::new(Instant::now(), Duration::from_millis(1));
        let mut alarm = Alarm::new();
        alarm.set(Some(5 * MS), 4 * MS, &clock);
        advance_to(&clock, 5 * MS).await;
        assert!(rang(&mut alarm));
        // The next wake-up is a lazy look 10 ms on: the spare at 6 ms would wake tokio's
        // driver for nothing there; it goes, and no new one is armed.
        alarm.set(Some(15 * MS), 5 * MS, &clock);
        let armed = alarm.at.iter().flatten().copied().collect::<Vec<_>>();
        assert_eq!(armed, [15 * MS]);
        advance_to(&clock, 15 * MS - 1).await;
        assert!(!rang(&mut alarm));
        advance_to(&clock, 15 * MS).await;
        assert!(rang(&mut alarm));
    }

    #[tokio::test(start_paused = true)]
    async fn set_for_nothing_it_never_rings_not_even_the_spare() {
        let clock = Clock::new(Instant::now(), Duration::from_millis(1));
        let mut alarm = Alarm::new();
        alarm.set(Some(5 * MS), 4 * MS, &clock);
        assert!(!rang(&mut alarm));
        advance_to(&clock, 5 * MS).await;
        assert!(rang(&mut alarm));
        alarm.set(None, 5 * MS, &clock);
        tokio::time::advance(Duration::from_secs(3_600)).await;
        assert!(!rang(&mut alarm), "an idle actor was woken");
        assert_eq!(alarm.at, [None, None]);
    }
}
