//! [`WheelContext`]: what every handle of a wheel holds — the wheel's [`Shared`] state and the
//! main actor's inbox — and how a handle files a timer or sends a command through it.
//!
//! It lives here, below the handles, so that a `Sleep`, `Timeout`, `Interval`, `JobHandle` or
//! `Timers` holds what it needs from below and never names the `Wheel` that made it: `Wheel`
//! is one more holder of the context, and its methods construct the handles from it.

use std::fmt;
use std::sync::Arc;
use std::task::Waker;

use super::inbox::{Inbox, Urgency};
use super::timers::Command;
use crate::timer::shared::Shared;

/// Where a new timer went: its pool slot, its inbox shard, and its command's position there.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Filed {
    pub(crate) slot: u32,
    pub(crate) shard: u32,
    pub(crate) position: u32,
}

/// What every handle of a wheel holds, behind one `Arc`. The main actor's queue closes when
/// the last one goes.
pub(crate) struct WheelContext {
    pub(crate) shared: Arc<Shared>,
    pub(crate) inbox: Arc<Inbox<Command>>,
    /// What a layer above keeps once per wheel (the idle connections' group of
    /// `hyper::IdleIo`), weakly: it holds the wheel, not the other way round.
    #[cfg(feature = "hyper")]
    pub(crate) layer: std::sync::Mutex<std::sync::Weak<dyn std::any::Any + Send + Sync>>,
}

impl Drop for WheelContext {
    fn drop(&mut self) {
        // The last handle is gone: the actor exits once nothing it holds is pending.
        self.inbox.close();
    }
}

/// Shown as the wheel it belongs to, so a handle's `Debug` names its wheel.
impl fmt::Debug for WheelContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wheel")
            .field("name", &self.shared.name)
            .field("tick", &self.shared.clock.tick())
            .field("levels", &self.shared.levels)
            .field("closed", &self.shared.is_closed())
            .finish()
    }
}

impl WheelContext {
    pub(crate) fn new(shared: Arc<Shared>, inbox: Arc<Inbox<Command>>) -> WheelContext {
        WheelContext {
            shared,
            inbox,
            #[cfg(feature = "hyper")]
            layer: std::sync::Mutex::new(std::sync::Weak::<()>::new()),
        }
    }

    /// Sends a command to the main actor through inbox shard `shard`; `None` if the wheel
    /// has stopped, else where in the shard's queue it went.
    pub(crate) fn send(&self, shard: u32, command: Command, urgency: Urgency) -> Option<u32> {
        if self.shared.is_closed() {
            return None;
        }
        self.inbox.send(shard as usize, command, urgency).ok()
    }

    /// Takes a pool slot for a timer due at offset `deadline`, arms it (registering `waker`,
    /// if any) and files it with the command `file` makes, through this thread's shard.
    /// Returns the slot, the shard and the command's position in the shard's queue, or `None`
    /// if the wheel has stopped.
    pub(crate) fn file_timer(
        &self,
        deadline: u64,
        waker: Option<&Waker>,
        file: impl FnOnce(u32) -> Command,
    ) -> Option<Filed> {
        let WheelContext { shared, inbox, .. } = self;
        if shared.is_closed() {
            return None;
        }
        let shard = inbox.shard_for_thread();
        let urgency = Urgency::By(deadline);
        let (slot, position) =
            inbox.send_with_slot(shard, &shared.pool, urgency, |index, slot| {
                slot.word.arm(deadline);
                if let Some(waker) = waker {
                    slot.waker.register(waker);
                }
                file(index)
            })?;
        Some(Filed {
            slot,
            shard: shard as u32,
            position,
        })
    }
}
