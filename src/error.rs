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
    /// The tick was zero.
    ZeroTick,
    /// The layout cannot work; the message says which rule it breaks.
    InvalidLayout(String),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NoRuntime => f.write_str(
                "no Tokio runtime: build the wheel inside a runtime (e.g. under #[tokio::main]) \
                 or pass one with Builder::runtime(handle)",
            ),
            BuildError::ZeroTick => f.write_str("the tick must be longer than zero"),
            BuildError::InvalidLayout(why) => write!(f, "invalid wheel layout: {why}"),
        }
    }
}

impl std::error::Error for BuildError {}
