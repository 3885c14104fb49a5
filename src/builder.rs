//! Starting a wheel: [`Wheel::new`], [`Wheel::builder`] and the [`Builder`] that sets tick,
//! layout, name and runtime.
//!
//! Everything that starts a wheel lives here, `Wheel`'s own constructors included, so imports
//! run one way: this file builds a [`Wheel`] through `handle.rs`, and `handle.rs`, the running
//! wheel, never names the builder.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::actor::Actor;
use crate::actor::context::Lane;
use crate::actor::inbox::Inbox;
use crate::actor::thread;
use crate::actor::timers::TimerMachine;
use crate::error::BuildError;
use crate::handle::Wheel;
use crate::timer::clock::Clock;
use crate::timer::pool::Pool;
use crate::timer::shared::Shared;
use crate::wheel::Layout;

impl Wheel {
    /// A wheel with the default settings (1 ms tick, [`Layout::clock`](crate::Layout::clock))
    /// on the current runtime: `Wheel::builder().build()`.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime. Use [`Builder::runtime`] to name one, or
    /// [`Builder::try_build`] to get an error instead.
    pub fn new() -> Wheel {
        Builder::new().build()
    }

    /// A [`Builder`] to configure tick, layout, name and runtime.
    pub fn builder() -> Builder {
        Builder::new()
    }
}

impl Default for Wheel {
    fn default() -> Self {
        Wheel::new()
    }
}

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
    own_thread: bool,
    shards: Option<usize>,
    timer_shards: Option<usize>,
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
            own_thread: false,
            shards: None,
            timer_shards: None,
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

    /// Runs the wheel's actors on a thread of their own (a current-thread runtime that runs
    /// nothing else); jobs still run on [`runtime`](Self::runtime). Default: off.
    ///
    /// On the application's runtime the actor is one task among the others, and a task that
    /// blocks its worker can hold it up: Tokio keeps a task woken from a worker in that
    /// worker's LIFO slot, which other workers cannot steal, so every timer of the wheel then
    /// waits until the blocking task yields (on a current-thread runtime, any blocking holds
    /// it up). With its own thread, timers keep firing on time whatever the application's
    /// tasks do, at the cost of one thread and a cross-thread wake-up when a command needs the
    /// actor sooner than it planned to look.
    ///
    /// The wheel still stops when the jobs' runtime shuts down. Its clock is the real one:
    /// a runtime whose clock is paused is refused ([`BuildError::PausedClock`]), and pausing
    /// it later is not supported. The thread ends once the wheel has stopped (or its last
    /// handle is gone) and nothing of it is left.
    pub fn own_thread(mut self, own_thread: bool) -> Builder {
        self.own_thread = own_thread;
        self
    }

    /// How many actors each keyed set ([`Wheel::keyed`]) runs, its keys spread over them by
    /// hash. Default: one per worker thread of the runtime the actors run on (one on a
    /// current-thread runtime, and with [`own_thread`](Self::own_thread)).
    ///
    /// One actor applies every command of its set on one core; producers on many cores can
    /// make by-key commands faster than that (BENCHMARKS.md measures where: a keyed set +
    /// remove costs the actor about what it costs the caller). With `n` shards, `n` actors
    /// apply them side by side, each with its own cascade, queues and index. What holds
    /// per key holds as before — commands on a key apply in the order they were made, an entry
    /// never fires early, shutdown delivers every entry once — since a key's commands all go
    /// to its shard. [`Timers::len`](crate::Timers::len) and
    /// [`drain`](crate::Timers::drain) ask every shard at one cut of the set's order (every
    /// shard's queues are locked together while the questions are queued, so they see each
    /// command made before them and none made after, as with one; their cost grows with
    /// `n`), and the
    /// one [`Expirations`](crate::Expirations) stream takes from all: entries of different
    /// shards due at nearly the same time may arrive in either order. Each shard costs an
    /// idle set a few KiB.
    ///
    /// Given, `n` is also the number of timer shards for sleeps, intervals, timeouts and
    /// jobs, unless [`timer_shards`](Self::timer_shards) says otherwise.
    ///
    /// `n` must be from 1 to 256 ([`BuildError::Shards`] otherwise).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tokio_wheel::BuildError> {
    /// let wheel = tokio_wheel::Wheel::builder().shards(4).try_build()?;
    /// let (timers, _expired) = wheel.keyed::<u64, ()>();
    /// timers.set(1, (), std::time::Duration::from_secs(30));
    /// assert_eq!(timers.len().await, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn shards(mut self, n: usize) -> Builder {
        self.shards = Some(n);
        self
    }

    /// How many timer actors share the wheel's sleeps, intervals, timeouts and jobs. A timer
    /// goes to the actor of the thread that registers it (its first poll, or `spawn_*`) and
    /// stays there, so producers on different worker threads feed different actors, each
    /// with its own cascade, pool and queues. Default: [`shards`](Self::shards) if given,
    /// else one per two worker threads of the runtime the actors run on, rounded up (one on
    /// two workers, one on a current-thread runtime and with [`own_thread`](Self::own_thread)).
    ///
    /// One actor keeps up with the commands of a few producer cores when sleeps move to
    /// random deadlines (an earlier deadline is a command; a later one, and a sleep armed and
    /// dropped per request, cost the actor next to nothing): BENCHMARKS.md measures where.
    /// More shards raise that ceiling in proportion. They share one allowance of idle
    /// memory (what the pools keep once idle stays within ~128 KiB over all shards, however
    /// many); a wheel firing a few timers per tick pays one more wake-up per tick per busy
    /// shard. Every
    /// promise holds as with one: a timer's commands apply in order, never early, shutdown
    /// resolves every timer, [`Wheel::flush`] waits for every shard, and the
    /// [`Stats`](crate::Stats) add up over all of them. Deadline order holds per shard: two
    /// timers of different shards due within a tick or so of each other may complete in
    /// either order.
    ///
    /// `n` must be from 1 to 256 ([`BuildError::Shards`] otherwise).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), tokio_wheel::BuildError> {
    /// let wheel = tokio_wheel::Wheel::builder().timer_shards(4).try_build()?;
    /// wheel.sleep(std::time::Duration::from_millis(10)).await;
    /// assert_eq!(wheel.stats().fired, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn timer_shards(mut self, n: usize) -> Builder {
        self.timer_shards = Some(n);
        self
    }

    /// Starts the wheel.
    ///
    /// # Panics
    ///
    /// With the message of the [`BuildError`] that [`try_build`](Self::try_build) would
    /// return: outside a runtime (name one with [`runtime`](Self::runtime)), on a runtime
    /// without a time driver, for a zero tick, or for a layout that cannot work.
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
    /// [`BuildError::NoTimeDriver`] for a runtime built without `enable_time` (unless the
    /// actors run on their [own thread](Self::own_thread), which has its own time driver),
    /// [`BuildError::ZeroTick`], [`BuildError::InvalidLayout`], and with
    /// [`own_thread`](Self::own_thread), [`BuildError::PausedClock`] or
    /// [`BuildError::Thread`].
    ///
    /// Tokio offers no way to ask whether a runtime has a time driver, so the wheel finds out
    /// by creating a tokio `Sleep` (which registers nothing): on a runtime without one, tokio
    /// panics, and that panic is caught and turned into `NoTimeDriver`. The process's panic
    /// hook still runs (printing tokio's message), and a program built with
    /// `panic = "abort"` aborts there instead — as it would at the first timer anyway.
    pub fn try_build(self) -> Result<Wheel, BuildError> {
        let runtime = match self.runtime {
            Some(runtime) => runtime,
            None => Handle::try_current().map_err(|_| BuildError::NoRuntime)?,
        };
        if !self.own_thread && !has_time_driver(&runtime) {
            return Err(BuildError::NoTimeDriver);
        }
        let levels = self.layout.slots_per_level(self.tick)?;
        let valid = |n: usize| {
            (1..=MAX_SHARDS)
                .contains(&n)
                .then_some(n)
                .ok_or(BuildError::Shards(n))
        };
        let workers = if self.own_thread {
            1
        } else {
            runtime.metrics().num_workers().clamp(1, MAX_SHARDS)
        };
        let shards = self.shards.map(valid).transpose()?.unwrap_or(workers);
        let timer_shards = match (self.timer_shards, self.shards) {
            (Some(n), _) | (None, Some(n)) => valid(n)?,
            (None, None) => workers.div_ceil(2),
        };
        if self.own_thread && clock_is_paused(&runtime) {
            return Err(BuildError::PausedClock);
        }
        // Read the runtime's clock, which may be paused.
        let origin = {
            let _entered = runtime.enter();
            Instant::now()
        };
        let clock = Clock::new(origin, self.tick);
        let own_thread = if self.own_thread {
            let started = thread::start(&self.name);
            Some(started.map_err(|error| BuildError::Thread(error.to_string()))?)
        } else {
            None
        };
        let shared = Arc::new(
            Shared::new(self.name, clock, runtime.clone(), own_thread, levels)
                .with_keyed_shards(shards),
        );
        if self.own_thread {
            thread::watch_runtime(&runtime, &shared);
        }
        let queues = Inbox::<()>::shards_for_this_machine();
        let lanes = (0..timer_shards)
            .map(|_| {
                let inbox = Arc::new(Inbox::new(queues).with_actor_on(&shared.actors));
                let pool = Arc::new(Pool::default());
                let machine =
                    TimerMachine::new(pool.clone(), timer_shards, &shared.levels, clock, queues);
                Actor::new(machine, inbox.clone(), shared.clone()).spawn("timers");
                Lane { inbox, pool }
            })
            .collect();
        tracing::debug!(wheel = %shared.name, tick = ?self.tick, levels = ?shared.levels, timer_shards, "wheel built");
        Ok(Wheel::from_parts(shared, lanes))
    }
}

/// The most shards a keyed set may run: a key's shard is read from 8 bits of its hash.
const MAX_SHARDS: usize = 256;

/// Whether `runtime` has a time driver. Tokio offers no query: creating a `Sleep` (which
/// registers nothing until polled) panics without one, with tokio's own message. This is the
/// only panic the crate catches on purpose; with `panic = "abort"` it aborts instead.
fn has_time_driver(runtime: &Handle) -> bool {
    let _entered = runtime.enter();
    std::panic::catch_unwind(|| drop(tokio::time::sleep(Duration::ZERO))).is_ok()
}

/// Whether `runtime`'s clock is paused (tokio's `test-util`): it then stands still while real
/// time passes. Tokio offers no query; 50 µs of real time tells.
fn clock_is_paused(runtime: &Handle) -> bool {
    let _entered = runtime.enter();
    let before = Instant::now();
    let real = std::time::Instant::now();
    while real.elapsed() < Duration::from_micros(50) {
        std::hint::spin_loop();
    }
    Instant::now() == before
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::collections::HashSet;

    use super::Wheel;

    #[test]
    fn threads_spread_over_timer_lanes() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let wheel = runtime.block_on(async { Wheel::builder().timer_shards(4).build() });
        let lanes: HashSet<u32> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| wheel.inner.lane_for_thread()))
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        // Eight new threads take eight distinct seeds (other tests' threads may take some in
        // between): they cannot all land in one lane.
        assert!(lanes.len() >= 2, "{lanes:?}");
        // One thread always names the same lane (its timers' commands stay in order there).
        assert_eq!(wheel.inner.lane_for_thread(), wheel.inner.lane_for_thread());
    }

    #[test]
    fn threads_hold_the_wheel_through_copies_of_its_context() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let wheel = runtime.block_on(async { Wheel::builder().build() });
        let home = std::sync::Arc::as_ptr(&wheel.inner) as usize;
        let copies: HashSet<usize> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let wheel = &wheel;
                    scope.spawn(move || {
                        let sleep = wheel.sleep(std::time::Duration::from_secs(1));
                        std::sync::Arc::as_ptr(sleep.wheel()) as usize
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        // A sleep never holds the count every handle shares, and threads spread over the
        // copies (eight new threads take eight distinct seeds; other tests' threads may take
        // some in between), so their sleeps do not write one count.
        assert!(!copies.contains(&home));
        assert!(copies.len() >= 2, "{copies:?}");
    }
}
