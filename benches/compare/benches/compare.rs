//! tokio-wheel side by side with `tokio::time`, `tokio_util::time::DelayQueue`,
//! `pingora-timeout` (timeouts), `kestrel-timer` and `hierarchical_hash_wheel_timer`, every
//! peer that fits in the same criterion group, n = 10^4. The full tables at 10^4 … 10^6 (plus
//! fire, memory and idle) come from `cargo run --release -p tokio-wheel-compare --example compare`.
//!
//! As there, tokio-wheel runs in steady state: one `Wheel` (or keyed set) per group, kept
//! across iterations, left empty by each, and shut down after the group; likewise one
//! `kestrel-timer` wheel and one timer thread per group.
//!
//! Run: `cargo bench -p tokio-wheel-compare --bench compare`

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tokio_wheel::Wheel;
use tokio_wheel_compare::*;

const N: usize = 10_000;
const ROUNDS: u32 = 10;

fn wheel(runtime: &tokio::runtime::Runtime) -> Wheel {
    Wheel::builder().runtime(runtime.handle().clone()).build()
}

fn shutdown(runtime: &tokio::runtime::Runtime, wheel: Wheel) {
    on_worker(runtime, async move { wheel.shutdown().await });
}

fn keyed_set<V: Send + 'static>(runtime: &tokio::runtime::Runtime, wheel: &Wheel) -> KeyedSet<V> {
    let wheel = wheel.clone();
    on_worker(runtime, async move { KeyedSet::new(&wheel) })
}

/// Sums what `run` measures over `iters` runs.
fn total(iters: u64, mut run: impl FnMut() -> Duration) -> Duration {
    (0..iters).map(|_| run()).sum()
}

fn schedule_cancel(c: &mut Criterion) {
    let runtime = runtime();
    let ours = wheel(&runtime);
    let kestrel_timer = kestrel(&runtime);
    let thread_timer = hash_wheel();
    let delays = Arc::new(Rng(42).delays(N));
    let mut group = c.benchmark_group("schedule_cancel");
    group.throughput(Throughput::Elements(N as u64));
    group.bench_function("tokio::time", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                on_worker(&runtime, schedule_cancel_tokio(delays.clone())).pair()
            })
        })
    });
    group.bench_function("DelayQueue", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                on_worker(&runtime, schedule_cancel_delay_queue(delays.clone())).pair()
            })
        })
    });
    group.bench_function("kestrel-timer", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                on_worker(
                    &runtime,
                    schedule_cancel_kestrel(kestrel_timer.clone(), delays.clone()),
                )
                .pair()
            })
        })
    });
    group.bench_function("hierarchical_hash_wheel_timer", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                on_worker(
                    &runtime,
                    schedule_cancel_hash_wheel(thread_timer.timer_ref(), delays.clone()),
                )
                .pair()
            })
        })
    });
    group.bench_function("tokio-wheel", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                on_worker(
                    &runtime,
                    schedule_cancel_wheel(ours.clone(), delays.clone()),
                )
                .pair()
            })
        })
    });
    group.finish();
    shutdown(&runtime, ours);
    on_worker(&runtime, kestrel_shutdown(kestrel_timer));
    thread_timer.shutdown().expect("timer thread");
}

fn ready_timeout(c: &mut Criterion) {
    let runtime = runtime();
    let ours = wheel(&runtime);
    let delays = Arc::new(Rng(42).delays(N));
    let mut group = c.benchmark_group("ready_timeout");
    group.throughput(Throughput::Elements(N as u64));
    group.bench_function("tokio::time::timeout", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                on_worker(&runtime, ready_timeout_tokio(delays.clone()))
            })
        })
    });
    group.bench_function("pingora fast_timeout", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                on_worker(&runtime, ready_timeout_pingora(delays.clone()))
            })
        })
    });
    group.bench_function("tokio-wheel", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                on_worker(&runtime, ready_timeout_wheel(ours.clone(), delays.clone()))
            })
        })
    });
    group.finish();
    shutdown(&runtime, ours);
}

fn timeout_churn(c: &mut Criterion) {
    let runtime = runtime();
    let ours = wheel(&runtime);
    let delays = Arc::new(Rng(42).delays(N));
    let mut group = c.benchmark_group("timeout_churn");
    group.throughput(Throughput::Elements(N as u64));
    group.bench_function("tokio::time::timeout", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                on_worker(&runtime, timeout_churn_tokio(delays.clone()))
            })
        })
    });
    group.bench_function("pingora fast_timeout", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                on_worker(&runtime, timeout_churn_pingora(delays.clone()))
            })
        })
    });
    group.bench_function("tokio-wheel", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                on_worker(&runtime, timeout_churn_wheel(ours.clone(), delays.clone()))
            })
        })
    });
    group.finish();
    shutdown(&runtime, ours);
}

fn postpone(c: &mut Criterion) {
    let runtime = runtime();
    let ours = wheel(&runtime);
    let set = keyed_set::<()>(&runtime, &ours);
    let kestrel_timer = kestrel(&runtime);
    for how in [Move::Later, Move::Earlier] {
        let mut group = c.benchmark_group(format!("postpone_{how:?}").to_lowercase());
        group.throughput(Throughput::Elements(N as u64 * u64::from(ROUNDS)));
        group.bench_function("tokio Sleep::reset", |b| {
            b.iter_custom(|iters| {
                total(iters, || {
                    on_worker(&runtime, postpone_tokio(N, ROUNDS, how))
                })
            })
        });
        group.bench_function("DelayQueue::reset", |b| {
            b.iter_custom(|iters| {
                total(iters, || {
                    on_worker(&runtime, postpone_delay_queue(N, ROUNDS, how))
                })
            })
        });
        group.bench_function("Mutex<DelayQueue>::reset", |b| {
            b.iter_custom(|iters| {
                total(iters, || {
                    on_worker(&runtime, postpone_shared_delay_queue(N, ROUNDS, how))
                })
            })
        });
        group.bench_function("kestrel-timer postpone", |b| {
            b.iter_custom(|iters| {
                total(iters, || {
                    on_worker(
                        &runtime,
                        postpone_kestrel(kestrel_timer.clone(), N, ROUNDS, how),
                    )
                })
            })
        });
        group.bench_function("tokio-wheel Sleep::reset", |b| {
            b.iter_custom(|iters| {
                total(iters, || {
                    on_worker(&runtime, postpone_wheel(ours.clone(), N, ROUNDS, how))
                })
            })
        });
        group.bench_function("tokio-wheel Timers::reset", |b| {
            b.iter_custom(|iters| {
                total(iters, || {
                    on_worker(&runtime, postpone_keyed(set.timers.clone(), N, ROUNDS, how))
                })
            })
        });
        group.finish();
    }
    drop(set);
    shutdown(&runtime, ours);
    on_worker(&runtime, kestrel_shutdown(kestrel_timer));
}

fn keyed_schedule_cancel(c: &mut Criterion) {
    let runtime = runtime();
    let ours = wheel(&runtime);
    let set = keyed_set::<()>(&runtime, &ours);
    let delays = Arc::new(Rng(42).delays(N));
    let mut group = c.benchmark_group("keyed_schedule_cancel");
    group.throughput(Throughput::Elements(N as u64));
    group.bench_function("DelayQueue + HashMap", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                on_worker(&runtime, keyed_schedule_cancel_delay_queue(delays.clone())).pair()
            })
        })
    });
    group.bench_function("Mutex<DelayQueue + HashMap>", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                on_worker(
                    &runtime,
                    keyed_schedule_cancel_shared_delay_queue(delays.clone()),
                )
                .pair()
            })
        })
    });
    group.bench_function("tokio-wheel Timers", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                on_worker(
                    &runtime,
                    keyed_schedule_cancel_wheel(set.timers.clone(), delays.clone()),
                )
                .pair()
            })
        })
    });
    group.finish();
    drop(set);
    shutdown(&runtime, ours);
}

fn keyed_churn(c: &mut Criterion) {
    let runtime = runtime();
    let ours = wheel(&runtime);
    let set = keyed_set::<u64>(&runtime, &ours);
    let ops = Arc::new(churn_ops(N, 4 * N));
    let mut group = c.benchmark_group("keyed_churn");
    group.throughput(Throughput::Elements(ops.len() as u64));
    group.bench_function("DelayQueue + HashMap", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                on_worker(&runtime, churn_delay_queue(N, ops.clone()))
            })
        })
    });
    group.bench_function("Mutex<DelayQueue + HashMap>", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                on_worker(&runtime, churn_shared_delay_queue(N, ops.clone()))
            })
        })
    });
    group.bench_function("tokio-wheel Timers", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                on_worker(&runtime, churn_keyed(set.timers.clone(), N, ops.clone()))
            })
        })
    });
    group.finish();
    drop(set);
    shutdown(&runtime, ours);
}

fn many_producers(c: &mut Criterion) {
    let runtime = runtime();
    let ours = wheel(&runtime);
    let kestrel_timer = kestrel(&runtime);
    let thread_timer = hash_wheel();
    for producers in [2usize, 8, 64] {
        let per_task = 20_000 / producers;
        let mut group = c.benchmark_group(format!("producers_{producers}"));
        group.throughput(Throughput::Elements((per_task * producers) as u64));
        group.bench_function("tokio::time", |b| {
            b.iter_custom(|iters| {
                total(iters, || {
                    on_worker(&runtime, producers_tokio(producers, per_task))
                })
            })
        });
        group.bench_function("Mutex<DelayQueue>", |b| {
            b.iter_custom(|iters| {
                total(iters, || {
                    on_worker(&runtime, producers_shared_delay_queue(producers, per_task))
                })
            })
        });
        group.bench_function("Arc<kestrel-timer>", |b| {
            b.iter_custom(|iters| {
                total(iters, || {
                    on_worker(
                        &runtime,
                        producers_kestrel(kestrel_timer.clone(), producers, per_task),
                    )
                })
            })
        });
        group.bench_function("hierarchical_hash_wheel_timer", |b| {
            b.iter_custom(|iters| {
                total(iters, || {
                    on_worker(
                        &runtime,
                        producers_hash_wheel(thread_timer.timer_ref(), producers, per_task),
                    )
                })
            })
        });
        group.bench_function("tokio-wheel", |b| {
            b.iter_custom(|iters| {
                total(iters, || {
                    on_worker(&runtime, producers_wheel(ours.clone(), producers, per_task))
                })
            })
        });
        group.finish();
    }
    shutdown(&runtime, ours);
    on_worker(&runtime, kestrel_shutdown(kestrel_timer));
    thread_timer.shutdown().expect("timer thread");
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = schedule_cancel, ready_timeout, timeout_churn, postpone, keyed_schedule_cancel,
        keyed_churn, many_producers
}
criterion_main!(benches);
