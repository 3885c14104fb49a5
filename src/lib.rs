//! tokio-wheel: an async, Tokio-native hierarchical timer wheel.
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![doc(test(attr(deny(warnings))))]

mod actor;
mod builder;
mod clock;
mod error;
mod handle;
mod interval;
mod job;
pub mod keyed;
mod sleep;
mod state;
mod stats;
mod timeout;
pub mod wheel;

pub use builder::Builder;
pub use error::{BuildError, Elapsed, JobError};
pub use handle::Wheel;
pub use interval::Interval;
pub use job::{JobHandle, Schedule};
pub use keyed::{Expirations, Expired, Timers};
pub use sleep::Sleep;
pub use stats::Stats;
pub use timeout::Timeout;
pub use tokio::time::MissedTickBehavior;
pub use wheel::Layout;
