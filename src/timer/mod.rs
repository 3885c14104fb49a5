//! What handles and actors share, below both: the clock, each timer's atomic word, the pool
//! those words live in, the counters and the wheel's lifecycle. Nothing here knows a user-facing
//! type or the wheel's internals.

pub(crate) mod clock;
pub(crate) mod counters;
pub(crate) mod keyed;
pub(crate) mod pool;
pub(crate) mod shared;
pub(crate) mod state;

use std::sync::Arc;

/// What the actor calls back to start a job filed in its wheel. Defined here, below the actor,
/// so the actor never names a handle type.
pub(crate) trait Launch: Send + Sync + 'static {
    /// The job is due: start it on the wheel's runtime.
    fn launch(self: Arc<Self>, shared: &Arc<shared::Shared>);
    /// The wheel stopped before the job started.
    fn refuse(&self);
}
