//! Idle connections at scale, in memory (`tokio::io::duplex`, no sockets, so 10^6 fit):
//! `IdleIo` against a tokio `Sleep` per connection reset on traffic (`TokioIdle`, what a
//! hyper-util `TokioTimer` user writes), and a bare connection with no idle timeout at all.
//!
//! - **memory**: N connections, each a task waiting on a read of its server half; heap bytes
//!   per connection (a counting allocator, live bytes once every read waits and the wheel has
//!   filed every timer), and what the idle timeout adds over the bare connection;
//! - **mass close**: N connections made at once with a 2 s timeout, so all expire within the
//!   same second: CPU per closed connection (user + system of this process, from 200 ms
//!   before the first deadline until the last close), close lateness p50 / p99 / max (close
//!   seen by the connection's task minus its deadline), and early closes.
//!
//! Runtime: Tokio multi-thread, 2 workers. Variants take turns, each run starting with another
//! one; medians over `--runs`.
//!
//! ```text
//! cargo run --release -p tokio-wheel-servers --example idle_bench -- [--sizes 100000,1000000]
//!     [--close 100000] [--runs 3] [--quick]
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, DuplexStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_wheel::Wheel;
use tokio_wheel::hyper::IdleIo;
use tokio_wheel_servers::TokioIdle;

#[path = "../../tests/support/counting.rs"]
mod counting;
use counting::{Counting, LIVE};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    Bare,
    Tokio,
    Wheel,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Bare => "bare (no idle timeout)",
            Variant::Tokio => "tokio Sleep per connection",
            Variant::Wheel => "tokio-wheel IdleIo",
        }
    }
}

/// Reads until the connection ends; when it ended, and whether it timed out.
async fn wait<T: AsyncRead + Unpin>(mut io: T, started: Arc<AtomicUsize>) -> (Instant, bool) {
    started.fetch_add(1, Ordering::Relaxed);
    let mut buf = [0; 16];
    loop {
        match io.read(&mut buf).await {
            Ok(0) => return (Instant::now(), false),
            Ok(_) => {}
            Err(error) => {
                return (Instant::now(), error.kind() == std::io::ErrorKind::TimedOut);
            }
        }
    }
}

/// N connections of `variant`, each a task waiting on its server half; the client halves and
/// when each connection's countdown started.
struct Connections {
    clients: Vec<DuplexStream>,
    tasks: Vec<JoinHandle<(Instant, bool)>>,
    created: Vec<Instant>,
}

async fn open(variant: Variant, wheel: &Wheel, n: usize, timeout: Duration) -> Connections {
    let started = Arc::new(AtomicUsize::new(0));
    let mut connections = Connections {
        clients: Vec::with_capacity(n),
        tasks: Vec::with_capacity(n),
        created: Vec::with_capacity(n),
    };
    for _ in 0..n {
        let (client, server) = tokio::io::duplex(64);
        connections.created.push(Instant::now());
        let started = started.clone();
        let task = match variant {
            Variant::Bare => tokio::spawn(wait(server, started)),
            Variant::Tokio => tokio::spawn(wait(TokioIdle::new(server, timeout), started)),
            Variant::Wheel => tokio::spawn(wait(IdleIo::new(server, wheel, timeout), started)),
        };
        connections.clients.push(client);
        connections.tasks.push(task);
    }
    while started.load(Ordering::Relaxed) < n {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Every task has made its first poll; give the last ones time to finish it, and the wheel
    // time to file every timer.
    tokio::time::sleep(Duration::from_millis(100)).await;
    wheel.flush().await;
    connections
}

/// Heap bytes per idle connection.
async fn memory(variant: Variant, n: usize) -> f64 {
    let wheel = Wheel::new();
    wheel.flush().await;
    let before = LIVE.load(Ordering::Relaxed);
    let connections = open(variant, &wheel, n, Duration::from_secs(3600)).await;
    let bytes = (LIVE.load(Ordering::Relaxed) - before) as f64 / n as f64;
    // Ends every read (end of file), then every task.
    drop(connections.clients);
    for task in connections.tasks {
        let (_, timed_out) = task.await.unwrap();
        assert!(!timed_out);
    }
    bytes
}

struct Close {
    cpu_ns_per_close: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    early: usize,
}

fn cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let of = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    of(usage.ru_utime) + of(usage.ru_stime)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// N connections expiring within the same second.
async fn mass_close(variant: Variant, n: usize) -> Close {
    let timeout = Duration::from_secs(2);
    let wheel = Wheel::new();
    let connections = open(variant, &wheel, n, timeout).await;
    let first_due = connections.created[0] + timeout;
    tokio::time::sleep_until(first_due - Duration::from_millis(200)).await;
    let cpu_before = cpu_time();
    let mut lateness = Vec::with_capacity(n);
    let mut early = 0;
    for (task, created) in connections.tasks.into_iter().zip(&connections.created) {
        let (closed, timed_out) = task.await.unwrap();
        assert!(timed_out, "a connection ended without timing out");
        let due = *created + timeout;
        if closed < due {
            early += 1;
            lateness.push(-(due - closed).as_secs_f64() * 1e3);
        } else {
            lateness.push((closed - due).as_secs_f64() * 1e3);
        }
    }
    let cpu = cpu_time() - cpu_before;
    drop(connections.clients);
    lateness.sort_by(f64::total_cmp);
    Close {
        cpu_ns_per_close: cpu.as_nanos() as f64 / n as f64,
        p50_ms: percentile(&lateness, 0.5),
        p99_ms: percentile(&lateness, 0.99),
        max_ms: lateness.last().copied().unwrap_or(f64::NAN),
        early,
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    percentile(&values, 0.5)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|arg| arg == flag)
            .and_then(|at| args.get(at + 1))
            .cloned()
    };
    let quick = args.iter().any(|arg| arg == "--quick");
    let sizes: Vec<usize> = value("--sizes")
        .unwrap_or_else(|| {
            if quick {
                "10000".into()
            } else {
                "100000,1000000".into()
            }
        })
        .split(',')
        .map(|n| n.parse().expect("--sizes N,N"))
        .collect();
    let close: usize = value("--close")
        .unwrap_or_else(|| {
            if quick {
                "10000".into()
            } else {
                "100000".into()
            }
        })
        .parse()
        .expect("--close N");
    let runs: usize = value("--runs")
        .unwrap_or_else(|| if quick { "1".into() } else { "3".into() })
        .parse()
        .expect("--runs N");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        println!("idle_bench: {runs} run(s) per variant, 2 workers, in-memory connections\n");
        for &n in &sizes {
            let variants = [Variant::Bare, Variant::Tokio, Variant::Wheel];
            let mut bytes = vec![Vec::new(); variants.len()];
            for run in 0..runs {
                for turn in 0..variants.len() {
                    let at = (turn + run) % variants.len();
                    bytes[at].push(memory(variants[at], n).await);
                }
            }
            let bare = median(bytes[0].clone());
            println!("#### Memory per idle connection, N = {n} (heap bytes; median of {runs})");
            println!("| variant | bytes per connection | added by the idle timeout |");
            println!("|---|---|---|");
            for (variant, samples) in variants.iter().zip(&bytes) {
                let median = median(samples.clone());
                println!(
                    "| {} | {median:.0} | {:.0} |",
                    variant.name(),
                    median - bare
                );
            }
            let (tokio, wheel) = (median(bytes[1].clone()), median(bytes[2].clone()));
            println!(
                "\nwheel ÷ tokio: {:.2}× per connection, {:.2}× of what the idle timeout adds\n",
                wheel / tokio,
                (wheel - bare) / (tokio - bare)
            );
        }

        let variants = [Variant::Tokio, Variant::Wheel];
        let mut results: Vec<Vec<Close>> = vec![Vec::new(), Vec::new()];
        for run in 0..runs {
            for turn in 0..variants.len() {
                let at = (turn + run) % variants.len();
                results[at].push(mass_close(variants[at], close).await);
            }
        }
        println!(
            "#### Mass close: {close} connections expiring within one second (median of {runs})"
        );
        println!("| variant | CPU ns per close | lateness p50 / p99 / max ms | early (total) |");
        println!("|---|---|---|---|");
        let mut cpu = Vec::new();
        for (variant, runs) in variants.iter().zip(&results) {
            let of = |f: fn(&Close) -> f64| median(runs.iter().map(f).collect());
            let early: usize = runs.iter().map(|r| r.early).sum();
            cpu.push(of(|r| r.cpu_ns_per_close));
            println!(
                "| {} | {:.0} | {:.1} / {:.1} / {:.1} | {early} |",
                variant.name(),
                of(|r| r.cpu_ns_per_close),
                of(|r| r.p50_ms),
                of(|r| r.p99_ms),
                of(|r| r.max_ms),
            );
            if early > 0 && *variant == Variant::Wheel {
                eprintln!("tokio-wheel closed {early} connections early");
                std::process::exit(1);
            }
        }
        println!("\nwheel ÷ tokio CPU per close: {:.2}×", cpu[1] / cpu[0]);
    });
}
