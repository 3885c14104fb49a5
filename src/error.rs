//! Errors: what went wrong, said plainly, with predicates to branch on.

use std::fmt;

/// Why a [`Wheel`](crate::Wheel) could not be built.
///
/// Returned by [`Builder::try_build`](crate::Builder::try_build) and [`Layout::custom`](crate::Layout::custom).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// No Tokio runtime was given and none is running on this thread.
    NoRuntime,
    /// The runtime has no time driver: it was built without `enable_time` (or `enable_all`).
    NoTimeDriver,
    /// The tick was zero.
    ZeroTick,
    /// The layout cannot work; the message says which rule it breaks.
    InvalidLayout(String),
    /// [`Builder::own_thread`](crate::Builder::own_thread) on a runtime whose clock is paused:
    /// the wheel's own thread follows the real clock.
    PausedClock,
    /// The wheel's own thread or its runtime could not be started; the message is the
    /// operating system's.
    Thread(String),
    /// [`Builder::shards`](crate::Builder::shards) or
    /// [`Builder::timer_shards`](crate::Builder::timer_shards) outside 1 to 256: the number
    /// given.
    Shards(usize),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NoRuntime => f.write_str(
                "no Tokio runtime: build the wheel inside a runtime (e.g. under #[tokio::main]) \
                 or pass one with Builder::runtime(handle)",
            ),
            BuildError::NoTimeDriver => f.write_str(
                "the runtime has no time driver: build it with enable_time() (or enable_all()) \
                 on its tokio::runtime::Builder",
            ),
            BuildError::ZeroTick => f.write_str("the tick must be longer than zero"),
            BuildError::InvalidLayout(why) => write!(f, "invalid wheel layout: {why}"),
            BuildError::PausedClock => f.write_str(
                "a wheel on its own thread follows the real clock, and this runtime's clock is \
                 paused: build it without Builder::own_thread in paused-time tests",
            ),
            BuildError::Thread(why) => write!(f, "could not start the wheel's own thread: {why}"),
            BuildError::Shards(n) => write!(
                f,
                "a shard count runs from 1 to 256, not {n}: see Builder::timer_shards (sleeps \
                 and jobs) and Builder::shards (keyed sets, and sleeps and jobs unless \
                 timer_shards is given)"
            ),
        }
    }
}

impl std::error::Error for BuildError {}

/// A [`timeout`](crate::Wheel::timeout) ran out before its future completed.
///
/// [`is_shutdown`](Elapsed::is_shutdown) tells the two ways that happens apart: the deadline
/// passed, or the wheel shut down first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed {
    shutdown: bool,
}

impl Elapsed {
    pub(crate) fn new(shutdown: bool) -> Elapsed {
        Elapsed { shutdown }
    }

    /// `true` if the wheel shut down before the deadline, rather than the deadline passing.
    pub fn is_shutdown(&self) -> bool {
        self.shutdown
    }
}

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.shutdown {
            f.write_str("timer wheel shut down before the deadline")
        } else {
            f.write_str("deadline has elapsed")
        }
    }
}

impl std::error::Error for Elapsed {}

/// Why a job produced no value; the error of awaiting a [`JobHandle`](crate::JobHandle).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobError {
    /// Cancelled or aborted before it finished.
    Cancelled,
    /// The job panicked; the payload's message, if it was a string.
    Panicked(String),
    /// The wheel (or its runtime) stopped before the job ran or finished.
    Shutdown,
}

impl JobError {
    /// Whether the job was cancelled or aborted.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, JobError::Cancelled)
    }

    /// Whether the job panicked.
    pub fn is_panic(&self) -> bool {
        matches!(self, JobError::Panicked(_))
    }

    /// Whether the wheel stopped before the job could run or finish.
    pub fn is_shutdown(&self) -> bool {
        matches!(self, JobError::Shutdown)
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobError::Cancelled => f.write_str("job was cancelled"),
            JobError::Panicked(message) => write!(f, "job panicked: {message}"),
            JobError::Shutdown => f.write_str("timer wheel shut down before the job finished"),
        }
    }
}

impl std::error::Error for JobError {}
