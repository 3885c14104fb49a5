//! tokio-wheel side by side with `tokio::time`, `tokio_util::time::DelayQueue` and (for
//! timeouts) `pingora-timeout`, every peer
//! in the same criterion group, n = 10^4. The full table at 10^4 … 10^6 (plus fire, memory
//! and idle) comes from `cargo run --release --example compare`.
//!
//! Run: `cargo bench --bench compare`

#[path = "support/scenarios.rs"]
mod scenarios;

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use scenarios::*;
use tokio_wheel::Wheel;

const N: usize = 10_000;
const ROUNDS: u32 = 10;

fn wheel(runtime: &tokio::runtime::Runtime) -> Wheel {
    Wheel::builder().runtime(runtime.handle().clone()).build()
}

/// Sums what `run` measures over `iters` runs.
fn total(iters: u64, mut run: impl FnMut() -> Duration) -> Duration {
    (0..iters).map(|_| run()).sum()
}

fn schedule_cancel(c: &mut Criterion) {
    let runtime = runtime();
    let delays = Arc::new(Rng(42).delays(N));
    let mut group = c.benchmark_group("schedule_cancel");
    group.throughput(Throughput::Elements(N as u64));
    group.bench_function("tokio::time", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                let (s, c) = on_worker(&runtime, schedule_cancel_tokio(delays.clone()));
                s + c
            })
        })
    });
    group.bench_function("DelayQueue", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                let (s, c) = on_worker(&runtime, schedule_cancel_delay_queue(delays.clone()));
                s + c
            })
        })
    });
    group.bench_function("tokio-wheel", |b| {
        b.iter_custom(|iters| {
            total(iters, || {
                let r = on_worker(
                    &runtime,
                    schedule_cancel_wheel(wheel(&runtime), delays.clone()),
                );
                r.scheduled + r.cancelled
            })
        })
    });
}

fn timeout_churn(c: &mut Criterion) {
    let runtime = runtime();
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
                on_worker(
                    &runtime,
                    timeout_churn_wheel(wheel(&runtime), delays.clone()),
                )
            })
        })
    });
}

fn postpone(c: &mut Criterion) {
    let runtime = runtime();
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
        group.bench_function("tokio-wheel Sleep::reset", |b| {
            b.iter_custom(|iters| {
                total(iters, || {
                    on_worker(&runtime, postpone_wheel(wheel(&runtime), N, ROUNDS, how))
                })
            })
        });
        group.bench_function("tokio-wheel Timers::reset", |b| {
            b.iter_custom(|iters| {
                total(iters, || {
                    on_worker(&runtime, postpone_keyed(wheel(&runtime), N, ROUNDS, how))
                })
            })
        });
    }
}

fn keyed_churn(c: &mut Criterion) {
    let runtime = runtime();
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
                on_worker(&runtime, churn_keyed(wheel(&runtime), N, ops.clone()))
            })
        })
    });
}

fn many_producers(c: &mut Criterion) {
    let runtime = runtime();
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
        group.bench_function("tokio-wheel", |b| {
            b.iter_custom(|iters| {
                total(iters, || {
                    on_worker(
                        &runtime,
                        producers_wheel(wheel(&runtime), producers, per_task),
                    )
                })
            })
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = schedule_cancel, timeout_churn, postpone, keyed_churn, many_producers
}
criterion_main!(benches);
