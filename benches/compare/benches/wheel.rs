//! Micro-benchmarks of the synchronous cascade wheel: insert, remove, reschedule and
//! advance-and-fire with 10^3 … 10^6 live entries, `clock` versus `binary`.
//!
//! Run: `cargo bench -p tokio-wheel-compare --bench wheel`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tokio_wheel::Layout;
use tokio_wheel::wheel::{Key, TimerWheel};

const SIZES: [usize; 4] = [1_000, 10_000, 100_000, 1_000_000];
const TICK: Duration = Duration::from_millis(1);

/// A small xorshift generator: benchmarks need cheap, repeatable spread, not quality.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A deadline 1 s to 60 s ahead of `now`, in 1 ms ticks.
    fn deadline(&mut self, now: u64) -> u64 {
        now + 1_000 + self.next() % 59_000
    }
}

fn layouts() -> [(&'static str, Vec<u32>); 2] {
    [
        ("clock", Layout::clock().slots_per_level(TICK).unwrap()),
        ("binary", Layout::binary().slots_per_level(TICK).unwrap()),
    ]
}

fn filled(levels: &[u32], n: usize, rng: &mut Rng) -> (TimerWheel<u64>, Vec<Key>) {
    let mut wheel = TimerWheel::with_capacity(levels, n).unwrap();
    let keys = (0..n as u64)
        .map(|i| wheel.insert(rng.deadline(0), i))
        .collect();
    (wheel, keys)
}

fn insert(c: &mut Criterion) {
    let mut group = c.benchmark_group("wheel/insert");
    for (name, levels) in layouts() {
        for n in SIZES {
            let mut rng = Rng(0x2545_F491_4F6C_DD1D);
            let (mut wheel, _) = filled(&levels, n, &mut rng);
            group.bench_function(BenchmarkId::new(name, n), |b| {
                b.iter_custom(|iters| {
                    let mut keys = Vec::with_capacity(iters as usize);
                    let start = Instant::now();
                    for i in 0..iters {
                        keys.push(wheel.insert(rng.deadline(0), i));
                    }
                    let elapsed = start.elapsed();
                    for key in keys {
                        wheel.remove(key);
                    }
                    elapsed
                })
            });
        }
    }
}

fn remove(c: &mut Criterion) {
    let mut group = c.benchmark_group("wheel/remove");
    for (name, levels) in layouts() {
        for n in SIZES {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
            let (mut wheel, _) = filled(&levels, n, &mut rng);
            group.bench_function(BenchmarkId::new(name, n), |b| {
                b.iter_custom(|iters| {
                    let keys: Vec<Key> = (0..iters)
                        .map(|i| wheel.insert(rng.deadline(0), i))
                        .collect();
                    let start = Instant::now();
                    for key in keys {
                        black_box(wheel.remove(key));
                    }
                    start.elapsed()
                })
            });
        }
    }
}

fn reschedule(c: &mut Criterion) {
    let mut group = c.benchmark_group("wheel/reschedule");
    for (name, levels) in layouts() {
        for n in SIZES {
            let mut rng = Rng(0xD1B5_4A32_D192_ED03);
            let (mut wheel, keys) = filled(&levels, n, &mut rng);
            let mut next = 0;
            group.bench_function(BenchmarkId::new(name, n), |b| {
                b.iter(|| {
                    next = (next + 1) % keys.len();
                    black_box(wheel.reschedule(keys[next], rng.deadline(0)))
                })
            });
        }
    }
}

fn advance_and_fire(c: &mut Criterion) {
    let mut group = c.benchmark_group("wheel/advance_and_fire");
    group.sample_size(10);
    for (name, levels) in layouts() {
        for n in SIZES {
            group.throughput(Throughput::Elements(n as u64));
            group.bench_function(BenchmarkId::new(name, n), |b| {
                b.iter_batched(
                    || filled(&levels, n, &mut Rng(0x1234_5678_9ABC_DEF1)).0,
                    |mut wheel| {
                        let fired = wheel.advance(u64::MAX, |e| {
                            black_box(e);
                        });
                        assert_eq!(fired, n);
                        wheel
                    },
                    BatchSize::PerIteration,
                )
            });
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = insert, remove, reschedule, advance_and_fire
}
criterion_main!(benches);
