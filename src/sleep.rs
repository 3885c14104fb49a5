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
use std::time::Duration;

use tokio::time::Instant;

use crate::actor::context::WheelContext;
use crate::actor::inbox::Urgency;
use crate::actor::timers::Command;
use crate::timer::clock::saturating_add;
use crate::timer::state::{Moved, State};

/// How a sleep ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woke {
    /// The deadline passed.
    Elapsed,
    /// The wheel stopped first.
    Shutdown,
}

/// No pool slot yet: the sleep registers on its first poll.
const UNARMED: u32 = u32::MAX;

/// A future that completes at its deadline; made by [`Wheel::sleep`] and
/// [`Wheel::sleep_until`].
///
/// [`Wheel::sleep`]: crate::Wheel::sleep
/// [`Wheel::sleep_until`]: crate::Wheel::sleep_until
///
/// - It never completes before its deadline, and at most one tick (plus scheduling latency)
///   after it.
/// - Polled at or after its deadline, it is ready on that poll, whether or not the wheel has
///   fired it yet: a deadline already passed completes on the first poll without touching the
///   actor, and under paused time `tokio::time::advance(d)` followed by a poll completes every
///   sleep due by then.
/// - The timer is registered on the first poll; dropping the future cancels it, and the actor
///   reclaims its slot at once.
/// - `Duration::MAX` and far-future instants saturate (an unrepresentable instant sits about
///   1 000 years ahead): no panic, no overflow, never early; a deadline past the wheel's range
///   (73 years after it was built) never fires — so a `Duration::MAX` sleep never completes
///   (tokio's fires after 30 years).
/// - If the wheel shuts down first, the sleep completes at once.
///
/// Unlike tokio's `Sleep`, this one is [`Unpin`]: it can be stored and polled without pinning,
/// and [`reset`](Sleep::reset) can be called through `Pin::new(&mut sleep)`.
///
/// # Cost
///
/// 40 bytes for the future itself; registering takes a 32-byte slot from the pool of the
/// registering thread's timer lane (no allocation once the pool has grown) and queues one
/// command to that lane's actor, which wakes it
/// only if it would otherwise look too late. Moving the deadline *later* is a single atomic
/// compare-and-swap with no message; moving it earlier queues one. Each poll before the timer
/// fires reads the clock once, to honour the deadline exactly. Dropped before the actor took
/// the registration (within about 10 ms while timers are being made), the sleep withdraws it
/// under the same lock and the actor never sees it; dropped later, it queues a release that
/// wakes nobody; dropped after the actor fired it, it gives its slot back under that lock
/// with no message at all.
#[derive(Debug)]
#[must_use = "futures do nothing unless you `.await` or poll them"]
pub struct Sleep {
    /// What the wheel's handles share: one `Arc`, as a `Wheel` is.
    wheel: Arc<WheelContext>,
    deadline: Instant,
    /// The pool slot once registered, else [`UNARMED`].
    slot: u32,
    /// The timer lane the slot is in (`WheelContext::lanes`).
    lane: u8,
    /// The inbox shard the slot came from (all its commands go there, in order).
    shard: u8,
    /// Set when the sleep completed.
    woke: Option<Woke>,
    /// Where the last command that filed the slot went in the shard's queue: dropped before
    /// the actor takes it, the sleep withdraws it and the actor never sees the timer.
    position: u32,
    /// Filed again after it completed ([`Moved::Rearmed`]): the actor may still hold the slot
    /// from the first filing, so a drop cancels the word even when it withdraws the second.
    rearmed: bool,
    /// Seen fired by the actor, which unfiled it then: a drop gives the slot straight back,
    /// with no release for the actor to apply. Only for a sleep never re-armed, whose one
    /// registration the actor applied before it could fire it (a re-armed one may have a
    /// registration still queued, which must not find its slot reused).
    fired: bool,
}

impl Sleep {
    pub(crate) fn new(wheel: &Arc<WheelContext>, deadline: Instant) -> Sleep {
        Sleep {
            wheel: wheel.clone(),
            deadline,
            slot: UNARMED,
            lane: 0,
            shard: 0,
            woke: None,
            position: 0,
            rearmed: false,
            fired: false,
        }
    }

    /// The instant this sleep completes at.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    pub(crate) fn wheel(&self) -> &Arc<WheelContext> {
        &self.wheel
    }

    /// Whether the sleep has completed, as tokio's `Sleep::is_elapsed`: it was polled ready,
    /// or the wheel fired it (or resolved it at shutdown). A sleep never polled is not
    /// elapsed, even once its deadline has passed (it is ready on its first poll then).
    pub fn is_elapsed(&self) -> bool {
        self.woke.is_some()
            || (self.slot != UNARMED && matches!(self.state(), State::Fired | State::Shutdown))
    }

    fn state(&self) -> State {
        self.wheel.slot(self.lane.into(), self.slot).word.state()
    }

    /// Moves the deadline, earlier or later, before or after completion: the sleep then
    /// completes at the new deadline, even if the old one fired concurrently. A deadline at or
    /// before now completes on the next poll.
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
        this.fired = false;
        if this.slot == UNARMED {
            return;
        }
        let wheel = &this.wheel;
        let offset = wheel.shared.clock.offset(deadline);
        let (lane, slot) = (u32::from(this.lane), this.slot);
        match wheel.slot(lane, slot).word.move_to(offset, true) {
            Moved::Armed { earlier } => {
                if earlier {
                    let shard = u32::from(this.shard);
                    let advance = Command::Advance {
                        slot,
                        deadline: offset,
                    };
                    wheel.send(lane, shard, advance, Urgency::By(offset));
                }
            }
            Moved::Rearmed => {
                let shard = u32::from(this.shard);
                let insert = Command::Insert {
                    slot,
                    deadline: offset,
                };
                match wheel.send(lane, shard, insert, Urgency::By(offset)) {
                    Some(position) => {
                        this.position = position;
                        this.rearmed = true;
                    }
                    None => {
                        // The wheel stopped: nobody will fire the word just re-armed. Mark it
                        // shut down, so every later poll and reset sees that.
                        wheel.slot(lane, slot).word.shut_down();
                        this.woke = Some(Woke::Shutdown);
                    }
                }
            }
            Moved::Refused => this.woke = Some(Woke::Shutdown),
        }
    }

    /// Polls for completion and says how it ended.
    pub(crate) fn poll_woke(&mut self, cx: &mut Context<'_>) -> Poll<Woke> {
        if let Some(woke) = self.woke {
            return Poll::Ready(woke);
        }
        if self.slot == UNARMED {
            let now = Instant::now();
            return self.register(cx, now);
        }
        let woke = |state| match state {
            State::Armed => None,
            State::Fired => Some(Woke::Elapsed),
            _ => Some(Woke::Shutdown),
        };
        let slot = self.wheel.slot(self.lane.into(), self.slot);
        // Fired here means fired by the actor: a sleep that completed itself returns above,
        // until a reset arms its word again.
        let mut state = slot.word.state();
        let mut outcome = woke(state);
        if outcome.is_none() && self.deadline <= Instant::now() {
            // Due, whether or not the actor has got to it: complete it here, so the actor
            // does not wake this task again.
            slot.word.complete();
            outcome = Some(Woke::Elapsed);
        }
        if outcome.is_none() {
            slot.waker.register(cx.waker());
            // The actor may have fired between the check and the registration.
            state = slot.word.state();
            outcome = woke(state);
        }
        if let Some(woke) = outcome {
            self.woke = Some(woke);
            self.fired = state == State::Fired;
            return Poll::Ready(woke);
        }
        Poll::Pending
    }

    /// The first poll of a sleep whose deadline counts from now (a timeout's): one clock read
    /// fixes the deadline and decides readiness.
    pub(crate) fn poll_from_now(&mut self, duration: Duration, cx: &mut Context<'_>) -> Poll<Woke> {
        let now = Instant::now();
        self.deadline = saturating_add(now, duration);
        self.register(cx, now)
    }

    fn register(&mut self, cx: &mut Context<'_>, now: Instant) -> Poll<Woke> {
        if self.deadline <= now {
            self.woke = Some(Woke::Elapsed);
            return Poll::Ready(Woke::Elapsed);
        }
        let offset = self.wheel.shared.clock.offset(self.deadline);
        let filed = self
            .wheel
            .file_timer(offset, Some(cx.waker()), |slot| Command::Insert {
                slot,
                deadline: offset,
            });
        let Some(filed) = filed else {
            self.woke = Some(Woke::Shutdown);
            return Poll::Ready(Woke::Shutdown);
        };
        self.slot = filed.slot;
        self.lane = filed.lane as u8;
        self.shard = filed.shard as u8;
        self.position = filed.position;
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
        if self.slot == UNARMED {
            return;
        }
        let slot = self.wheel.slot(self.lane.into(), self.slot);
        // Do not keep the task alive through a waker nobody will use.
        drop(slot.waker.take());
        if self.rearmed {
            // The actor may hold the slot from its first filing even if the second is
            // withdrawn: it must find the word cancelled there, not armed for a sleep gone.
            slot.word.cancel();
        }
        let (index, shard) = (self.slot, usize::from(self.shard));
        let inbox = self.wheel.inbox(self.lane.into());
        if self.fired && !self.rearmed && inbox.give_back(shard, index) {
            // The actor let go of the slot when it fired it: one push under the shard's lock,
            // no command (a flood's fire loop used to queue and apply one release per timer).
            return;
        }
        let is_insert =
            |command: &Command| matches!(command, Command::Insert { slot, .. } if *slot == index);
        // Only a timer the actor has taken needs its word cancelled (so it never fires) and a
        // release; a withdrawn one (never filed) goes straight back to the free list, its word
        // untouched until the next `arm`. Called under the shard's lock, before the release is queued:
        // after that, the slot is the actor's to free.
        let release = || {
            slot.word.cancel();
            Command::Release {
                slot: index,
                shard: shard as u32,
            }
        };
        // Not sent only once the actor has stopped: the slot goes with the pool.
        inbox.withdraw_or_send(shard, self.position, is_insert, index, release);
    }
}
