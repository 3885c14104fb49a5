//! A wheel's own thread ([`Builder::own_thread`](crate::Builder::own_thread)): a
//! current-thread runtime that runs the wheel's actors and nothing else, so no task of the
//! application can hold them up.
//!
//! On a shared runtime the actor is one task among the application's. A task that wakes it
//! and then blocks its worker strands it: Tokio puts a task woken from a worker in that
//! worker's LIFO slot, which no other worker may steal, so every timer of the wheel waits
//! until the blocking task yields. On its own thread the actor is woken from outside its
//! runtime, through the runtime's injection queue, and nothing else ever runs there.

use std::io;
use std::sync::{Arc, Weak};

use tokio::runtime::{Handle, Runtime};
use tokio::sync::oneshot;

use crate::timer::shared::Shared;

/// The handle of a wheel's own runtime, and the sender that keeps its thread alive: the thread
/// ends once the sender is dropped (with the wheel's shared state) and the actors it ran are
/// gone.
pub(crate) fn start(name: &str) -> io::Result<(Handle, oneshot::Sender<()>)> {
    let runtime: Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .thread_name(format!("tokio-wheel {name}"))
        .build()?;
    let handle = runtime.handle().clone();
    let (keep, dropped) = oneshot::channel::<()>();
    std::thread::Builder::new()
        .name(format!("tokio-wheel {name}"))
        .spawn(move || {
            // `Err` once the sender goes: nothing of the wheel is left to run.
            let _ = runtime.block_on(dropped);
            tracing::debug!("wheel thread exits");
        })?;
    Ok((handle, keep))
}

/// Stops the wheel when the application's runtime (where its jobs run) shuts down, as a wheel
/// whose actors run there would stop: a task on that runtime that waits for the wheel to stop,
/// and stops it if the runtime drops it first.
pub(crate) fn watch_runtime(runtime: &Handle, shared: &Arc<Shared>) {
    struct Watch {
        shared: Weak<Shared>,
        armed: bool,
    }
    impl Drop for Watch {
        fn drop(&mut self) {
            if !self.armed {
                return;
            }
            if let Some(shared) = self.shared.upgrade() {
                if shared.close() {
                    tracing::debug!(wheel = %shared.name, "the jobs' runtime shut down: wheel stops");
                }
                shared.request_shutdown();
            }
        }
    }
    let mut stopped = shared.shutdown_signal();
    let watch = Watch {
        shared: Arc::downgrade(shared),
        armed: true,
    };
    runtime.spawn(async move {
        let mut watch = watch;
        // Ends when the wheel stops, or when its shared state is gone (the sender with it).
        let _ = stopped.wait_for(|stop| *stop).await;
        watch.armed = false;
    });
}
