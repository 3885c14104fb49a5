//! What every actor of a wheel and every handle share: the clock, the runtime, the counters
//! and the wheel's lifecycle. (Each timer actor's pool is its lane's: `actor::context::Lane`.)

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::runtime::Handle;
use tokio::sync::{oneshot, watch};

use super::clock::Clock;
use super::counters::Counters;

/// A wheel's shared state. Actors hold it (never a `Wheel` handle), so a wheel's command
/// queues close when its last handle goes.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) clock: Clock,
    /// Where jobs run.
    pub(crate) runtime: Handle,
    /// Where the actors run: `runtime`, or the wheel's own thread.
    pub(crate) actors: Handle,
    /// Keeps the wheel's own thread (if it has one) running; dropped with this state.
    _own_thread: Option<oneshot::Sender<()>>,
    /// Slots per wheel level, for every actor's wheel.
    pub(crate) levels: Vec<u32>,
    /// How many shards (actors) each keyed set runs (`Builder::shards`).
    pub(crate) keyed_shards: usize,
    pub(crate) counters: Counters,
    /// Set once the wheel stops; new timers are refused from then on.
    closed: AtomicBool,
    /// Tells the actors to stop.
    shutdown: watch::Sender<bool>,
    /// Actors not yet stopped.
    live_actors: watch::Sender<usize>,
}

impl Shared {
    /// `own_thread`: the handle of the runtime on the wheel's own thread and what keeps that
    /// thread running; `None` runs the actors on `runtime`.
    pub(crate) fn new(
        name: String,
        clock: Clock,
        runtime: Handle,
        own_thread: Option<(Handle, oneshot::Sender<()>)>,
        levels: Vec<u32>,
    ) -> Self {
        let (actors, own_thread) = match own_thread {
            Some((actors, keep)) => (actors, Some(keep)),
            None => (runtime.clone(), None),
        };
        Shared {
            name,
            clock,
            runtime,
            actors,
            _own_thread: own_thread,
            levels,
            keyed_shards: 1,
            counters: Counters::default(),
            closed: AtomicBool::new(false),
            shutdown: watch::Sender::new(false),
            live_actors: watch::Sender::new(0),
        }
    }

    /// Each keyed set of the wheel runs `shards` actors (at least one).
    pub(crate) fn with_keyed_shards(mut self, shards: usize) -> Self {
        self.keyed_shards = shards.max(1);
        self
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Refuses new timers from now on; `true` the first time.
    pub(crate) fn close(&self) -> bool {
        !self.closed.swap(true, Ordering::AcqRel)
    }

    /// Asks every actor to stop (after [`close`](Self::close)).
    pub(crate) fn request_shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    /// A receiver that sees the shutdown request.
    pub(crate) fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    pub(crate) fn actor_started(&self) {
        self.live_actors.send_modify(|live| *live += 1);
    }

    pub(crate) fn actor_stopped(&self) {
        self.live_actors.send_modify(|live| *live -= 1);
    }

    pub(crate) fn live_actors(&self) -> usize {
        *self.live_actors.borrow()
    }

    /// Completes once no actor is running.
    pub(crate) async fn actors_stopped(&self) {
        let mut live = self.live_actors.subscribe();
        // The sender lives in `self`, so this cannot fail while we hold it.
        let _ = live.wait_for(|live| *live == 0).await;
    }
}
