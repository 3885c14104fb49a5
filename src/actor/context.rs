//! [`WheelContext`]: what every handle of a wheel holds — the wheel's [`Shared`] state and its
//! timer lanes (each a timer actor's inbox and pool) — and how a handle files a timer or sends
//! a command through them.
//!
//! It lives here, below the handles, so that a `Sleep`, `Timeout`, `Interval`, `JobHandle` or
//! `Timers` holds what it needs from below and never names the `Wheel` that made it: `Wheel`
//! is one more holder of the context, and its methods construct the handles from it.

use std::fmt;
use std::sync::Arc;
use std::task::Waker;

use super::inbox::{Inbox, Urgency, thread_seed};
use super::timers::Command;
use crate::timer::pool::{Pool, Slot};
use crate::timer::shared::Shared;

/// Copies of a wheel's context (see [`WheelContext::for_this_thread`]): threads take turns
/// over them, so on a machine with up to this many threads making sleeps no two share one.
const COPIES: usize = 16;

/// Where a new timer went: its lane, its pool slot there, its inbox shard, and its command's
/// position in that shard's queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Filed {
    pub(crate) lane: u32,
    pub(crate) slot: u32,
    pub(crate) shard: u32,
    pub(crate) position: u32,
}

/// One timer actor's share of the wheel's sleeps and jobs: its command queue and the pool its
/// timers' shared state lives in. A timer stays in the lane it was filed in for its life (its
/// slot index means nothing in another lane's pool), so its commands apply in order.
#[derive(Clone)]
pub(crate) struct Lane {
    pub(crate) inbox: Arc<Inbox<Command>>,
    pub(crate) pool: Arc<Pool>,
}

/// What every handle of a wheel holds, behind one `Arc`. The timer actors' queues close when
/// the last one goes.
pub(crate) struct WheelContext {
    pub(crate) shared: Arc<Shared>,
    /// The timer actors (`Builder::timer_shards`): a timer goes to the lane of the thread
    /// that registers it, so producers on different threads feed different actors.
    pub(crate) lanes: Box<[Lane]>,
    /// Held by every context of the wheel: the last to go closes the timer actors' queues.
    _open: Arc<KeepOpen>,
    /// Copies of this context for the threads that make sleeps and jobs
    /// ([`for_this_thread`](Self::for_this_thread)); empty in a copy.
    copies: Box<[Arc<WheelContext>]>,
    /// What a layer above keeps once per wheel (the idle connections' group of
    /// `hyper::IdleIo`), weakly: it holds the wheel, not the other way round.
    #[cfg(feature = "hyper")]
    pub(crate) layer: std::sync::Mutex<std::sync::Weak<dyn std::any::Any + Send + Sync>>,
}

/// The timer actors' queues, closed once no context of the wheel is left.
struct KeepOpen(Box<[Arc<Inbox<Command>>]>);

impl Drop for KeepOpen {
    fn drop(&mut self) {
        // The last handle is gone: each timer actor exits once nothing it holds is pending.
        for inbox in &self.0 {
            inbox.close();
        }
    }
}

/// Shown as the wheel it belongs to, so a handle's `Debug` names its wheel.
impl fmt::Debug for WheelContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wheel")
            .field("name", &self.shared.name)
            .field("tick", &self.shared.clock.tick())
            .field("levels", &self.shared.levels)
            .field("timer_shards", &self.lanes.len())
            .field("closed", &self.shared.is_closed())
            .finish()
    }
}

impl WheelContext {
    pub(crate) fn new(shared: Arc<Shared>, lanes: Box<[Lane]>) -> WheelContext {
        assert!(!lanes.is_empty(), "a wheel has at least one timer lane");
        let inboxes = lanes.iter().map(|lane| lane.inbox.clone()).collect();
        let open = Arc::new(KeepOpen(inboxes));
        let copy = || WheelContext::copy(&shared, &lanes, &open);
        let copies = (0..COPIES).map(|_| Arc::new(copy())).collect();
        WheelContext { copies, ..copy() }
    }

    fn copy(shared: &Arc<Shared>, lanes: &[Lane], open: &Arc<KeepOpen>) -> WheelContext {
        WheelContext {
            shared: shared.clone(),
            lanes: lanes.into(),
            _open: open.clone(),
            copies: Box::default(),
            #[cfg(feature = "hyper")]
            layer: std::sync::Mutex::new(std::sync::Weak::<()>::new()),
        }
    }

    /// The context a sleep or job made on this thread holds. Each `Sleep` keeps its wheel
    /// alive through one `Arc`; were that always this one, every thread making sleeps would
    /// write the same count on each sleep made and dropped (a cache line passed between
    /// cores, the largest cost of a sleep made on many threads at once). A copy per few
    /// threads keeps each count on one core; the copies share everything else.
    pub(crate) fn for_this_thread(self: &Arc<Self>) -> &Arc<WheelContext> {
        match self.copies.len() {
            0 => self,
            copies => &self.copies[thread_seed() % copies],
        }
    }

    /// The lane timers registered on this thread go to.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn lane_for_thread(&self) -> u32 {
        self.lane_and_shard(thread_seed()).0
    }

    /// The lane and inbox shard of the thread with seed `seed`: threads spread over the
    /// lanes, and those of one lane over its shards.
    fn lane_and_shard(&self, seed: usize) -> (u32, usize) {
        let lanes = self.lanes.len();
        let (lane, within) = if lanes == 1 {
            (0, seed)
        } else {
            (seed % lanes, seed / lanes)
        };
        (lane as u32, self.lanes[lane].inbox.shard_for_seed(within))
    }

    /// The shared state of slot `slot` of lane `lane`.
    pub(crate) fn slot(&self, lane: u32, slot: u32) -> &Slot {
        self.lanes[lane as usize].pool.get(slot)
    }

    /// The inbox of lane `lane`.
    pub(crate) fn inbox(&self, lane: u32) -> &Inbox<Command> {
        &self.lanes[lane as usize].inbox
    }

    /// Sends a command to the timer actor of lane `lane` through its inbox shard `shard`;
    /// `None` if the wheel has stopped, else where in the shard's queue it went.
    pub(crate) fn send(
        &self,
        lane: u32,
        shard: u32,
        command: Command,
        urgency: Urgency,
    ) -> Option<u32> {
        if self.shared.is_closed() {
            return None;
        }
        self.inbox(lane).send(shard as usize, command, urgency).ok()
    }

    /// Takes a pool slot of this thread's lane for a timer due at offset `deadline`, arms it
    /// (registering `waker`, if any) and files it with the command `file` makes, through this
    /// thread's inbox shard. Returns where it went, or `None` if the wheel has stopped.
    pub(crate) fn file_timer(
        &self,
        deadline: u64,
        waker: Option<&Waker>,
        file: impl FnOnce(u32) -> Command,
    ) -> Option<Filed> {
        if self.shared.is_closed() {
            return None;
        }
        // One read of the thread's seed names both.
        let (lane, shard) = self.lane_and_shard(thread_seed());
        let Lane { inbox, pool } = &self.lanes[lane as usize];
        let urgency = Urgency::By(deadline);
        let (slot, position) = inbox.send_with_slot(shard, pool, urgency, |index, slot| {
            slot.word.arm(deadline);
            if let Some(waker) = waker {
                slot.waker.register(waker);
            }
            file(index)
        })?;
        Some(Filed {
            lane,
            slot,
            shard: shard as u32,
            position,
        })
    }
}
