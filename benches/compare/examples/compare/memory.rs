//! The memory scenario: bytes per pending timer, each system measured in a fresh instance.

use tokio_wheel::Wheel;
use tokio_wheel_compare::*;

use super::report::{Progress, Table};
use super::{HASH_WHEEL, KESTREL};

/// Measures bytes per pending timer at each of `memory_sizes` for every system into `memory`.
pub(crate) fn run(
    runtime: &tokio::runtime::Runtime,
    memory_sizes: &[usize],
    new_wheel: &dyn Fn() -> Wheel,
    shutdown: &dyn Fn(&tokio::runtime::Runtime, Wheel),
    progress: &mut Progress,
    memory: &mut Table,
) {
    // A fresh wheel (and peer) per measurement: memory per pending timer includes what
    // the timer service itself grows to hold them, which a warm long-lived service would
    // hide (its capacity would already be there before the count starts).
    for &n in memory_sizes {
        let label = format!("n = {n}");
        progress.step(&format!("memory n={n} tokio"));
        let (b, held) = on_worker(runtime, bytes_per_timer(n, hold_tokio_sleeps));
        drop(held);
        memory.add(&label, "tokio Box<Sleep>", b);
        progress.step(&format!("memory n={n} DelayQueue"));
        let (b, held) = on_worker(runtime, bytes_per_timer(n, hold_delay_queue));
        drop(held);
        memory.add(&label, "DelayQueue entry", b);
        progress.step(&format!("memory n={n} kestrel-timer"));
        let timer = kestrel(runtime);
        let (b, held) = on_worker(runtime, bytes_per_timer(n, move |n| hold_kestrel(timer, n)));
        let (timer, handles) = held;
        drop(handles);
        on_worker(runtime, kestrel_shutdown(timer));
        memory.add(&label, KESTREL, b);
        progress.step(&format!("memory n={n} hierarchical_hash_wheel_timer"));
        let timer = hash_wheel();
        let timer_ref = timer.timer_ref();
        let (b, held) = on_worker(
            runtime,
            bytes_per_timer(n, move |n| hold_hash_wheel(timer_ref, n)),
        );
        drop(held);
        timer.shutdown().expect("timer thread");
        memory.add(&label, HASH_WHEEL, b);
        progress.step(&format!("memory n={n} tokio-wheel Sleep"));
        let w = new_wheel();
        let (b, held) = on_worker(runtime, {
            let w = w.clone();
            bytes_per_timer(n, move |n| hold_wheel_sleeps(w, n))
        });
        drop(held);
        shutdown(runtime, w);
        memory.add(&label, "tokio-wheel Sleep", b);
        progress.step(&format!("memory n={n} tokio-wheel job"));
        let w = new_wheel();
        let (b, held) = on_worker(runtime, {
            let w = w.clone();
            bytes_per_timer(n, move |n| hold_wheel_jobs(w, n))
        });
        for job in &held {
            job.cancel();
        }
        drop(held);
        shutdown(runtime, w);
        memory.add(&label, "tokio-wheel job", b);
        progress.step(&format!("memory n={n} tokio-wheel keyed"));
        let w = new_wheel();
        let (b, held) = on_worker(runtime, {
            let w = w.clone();
            bytes_per_timer(n, move |n| hold_keyed(w, n))
        });
        drop(held);
        shutdown(runtime, w);
        memory.add(&label, "tokio-wheel keyed entry", b);
        progress.step(&format!("memory n={n} tokio-wheel keyed entry + handle"));
        let w = new_wheel();
        let (b, held) = on_worker(runtime, {
            let w = w.clone();
            bytes_per_timer(n, move |n| hold_keyed_handles(w, n))
        });
        drop(held);
        shutdown(runtime, w);
        memory.add(&label, "tokio-wheel keyed entry + handle", b);
    }
}
