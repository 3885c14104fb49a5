//! [`Builder`]: tick, layout, name and runtime of a new [`Wheel`].

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::actor::Actor;
use crate::actor::inbox::Inbox;
use crate::actor::timers::TimerMachine;
use crate::clock::Clock;
use crate::error::BuildError;
use crate::handle::{Shared, Wheel};
use crate::stats::StatsCell;
use crate::wheel::{Layout, TimerWheel};

/// Configures and starts a [`Wheel`].
///
/// ```
/// use std::time::Duration;
/// use tokio_wheel::{Layout, Wheel};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tokio_wheel::BuildError> {
/// let wheel = Wheel::builder()
///     .tick(Duration::from_millis(10))
///     .layout(Layout::binary())
///     .name("conn-expiry")
///     .try_build()?;
/// assert_eq!(wheel.name(), "conn-expiry");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Builder {
    tick: Duration,
    layout: Layout,
    name: String,
    runtime: Option<Handle>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder::new()
    }
}

impl Builder {
    /// The defaults: 1 ms tick, [`Layout::clock`], name `"tokio-wheel"`, the current runtime.
    pub fn new() -> Builder {
        Builder {
            tick: Duration::from_millis(1),
            layout: Layout::clock(),
            name: "tokio-wheel".to_owned(),
            runtime: None,
        }
    }

    /// The resolution: deadlines round up to a tick, so timers fire at most one tick (plus
    /// scheduling latency) late. Default 1 ms, which is also Tokio's own timer resolution;
    /// a shorter tick costs more wake-ups without making Tokio's sleeps finer.
    pub fn tick(mut self, tick: Duration) -> Builder {
        self.tick = tick;
        self
    }

    /// The cascade's shape. Default [`Layout::clock`].
    pub fn layout(mut self, layout: Layout) -> Builder {
        self.layout = layout;
        self
    }

    /// A name for tracing spans and [`Stats`](crate::Stats).
    pub fn name(mut self, name: impl Into<String>) -> Builder {
        self.name = name.into();
        self
    }

    /// The runtime the actor and jobs run on. Default: the runtime this is built in.
    pub fn runtime(mut self, runtime: Handle) -> Builder {
        self.runtime = Some(runtime);
        self
    }

    /// Starts the wheel.
    ///
    /// # Panics
    ///
    /// With the message of the [`BuildError`] that [`try_build`](Self::try_build) would
    /// return: outside a runtime (name one with [`runtime`](Self::runtime)), for a zero tick,
    /// or for a layout that cannot work.
    #[track_caller]
    pub fn build(self) -> Wheel {
        match self.try_build() {
            Ok(wheel) => wheel,
            Err(error) => panic!("tokio-wheel: {error}"),
        }
    }

    /// Starts the wheel, or says why it cannot.
    ///
    /// # Errors
    ///
    /// [`BuildError::NoRuntime`] outside a runtime when none was named,
    /// [`BuildError::ZeroTick`], and [`BuildError::InvalidLayout`].
    pub fn try_build(self) -> Result<Wheel, BuildError> {
        let runtime = match self.runtime {
            Some(runtime) => runtime,
            None => Handle::try_current().map_err(|_| BuildError::NoRuntime)?,
        };
        let levels = self.layout.slots_per_level(self.tick)?;
        let wheel = TimerWheel::new(&levels)?;
        // Read the runtime's clock, which may be paused.
        let origin = {
            let _entered = runtime.enter();
            Instant::now()
        };
        let shared = Arc::new(Shared {
            name: self.name,
            clock: Clock::new(origin, self.tick),
            runtime,
            levels,
            closed: AtomicBool::new(false),
            shutdown: watch::Sender::new(false),
            live_actors: watch::Sender::new(0),
            stats: StatsCell::default(),
        });
        let inbox = Arc::new(Inbox::new());
        Actor::new(TimerMachine::new(wheel), inbox.clone(), shared.clone()).spawn("timers");
        tracing::debug!(wheel = %shared.name, tick = ?self.tick, levels = ?shared.levels, "wheel built");
        Ok(Wheel::from_parts(shared, inbox))
    }
}
