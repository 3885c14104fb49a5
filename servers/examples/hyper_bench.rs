//! A real-server benchmark of idle-connection expiry in hyper 1: HTTP/1.1 keep-alive on
//! loopback, N idle connections plus 64 busy ones, an idle timeout of 5 s, these servers:
//!
//! - `tokio`: hyper-util's `TokioTimer` for hyper, and for idle expiry an IO wrapper holding a
//!   tokio `Sleep` that it resets on every read or write that moves bytes (the usual way to
//!   add the timeout hyper lacks);
//! - `wheel`: `HyperTimer` for hyper and `IdleIo` for idle expiry, on one wheel;
//! - `axum` (with `--variants`): plain `axum::serve`, no idle timeout at all;
//! - `axum-wheel`: `axum::serve(IdleListener, busy_aware(app))` — what adding idle timeouts
//!   costs an axum server, against `axum`.
//!
//! The server runs in a child process (this binary with `--server <variant>`), so its CPU
//! and memory are its own: CPU under load is user + system time of all its threads from
//! `/proc/<pid>/stat` (10 ms ticks, fine over seconds of load); idle CPU, a few milliseconds,
//! is the sum of its threads' on-CPU nanoseconds from `/proc/<pid>/task/*/schedstat`; peak
//! RSS is `VmHWM` from `/proc/<pid>/status`. The load generator runs in this process, on its
//! own runtime (Linux only). Variants take turns, each run starting with another one,
//! `--runs` times each, each run in a fresh server process.
//!
//! Each run: the idle connections connect, all send one request at the same moment and then
//! stay silent; the server's CPU over an idle window (while all of them wait) is the idle
//! cost. Then the 64 busy connections send requests back to back for `--secs` (the idle
//! connections expire meanwhile, under load): requests/s, latency p50/p99, server CPU per
//! request. Each idle connection records when the server closed it: lateness is the close
//! time minus (response received + timeout), an early close is one before (request sent +
//! timeout) — which cannot be blamed on transit time.
//!
//! ```text
//! cargo run --release -p tokio-wheel-servers --example hyper_bench -- [--runs 5] [--idle 10000]
//!     [--secs 10] [--timeout-ms 5000] [--threads 2] [--no-header-timeout] [--quick]
//!     [--variants tokio,wheel,axum,axum-wheel] [--http2]
//! ```
//!
//! hyper arms its header-read timeout (30 s by default once a timer is set) for every
//! request and drops it when the head arrives: `--no-header-timeout` turns it off in both
//! servers, to tell that per-request timer's cost from the idle expiry's. `--threads` sets
//! the server's worker threads.
//!
//! `--http2`: every connection speaks HTTP/2 with prior knowledge (h2c) instead of HTTP/1.1 —
//! hyper's `http2` builder in `tokio` and `wheel` (no header-read timeout there: HTTP/2 has
//! none), hyper-util's auto builder under `axum::serve`; the client is hyper's own HTTP/2
//! connection, one request at a time per connection, and an idle connection's close is the
//! end of that client connection.
//!
//! `--quick` (CI): 200 idle connections, a 1 s timeout, 2 s of load, 1 run. `--idle 100000`
//! raises `RLIMIT_NOFILE` to its hard limit (it must allow N + a few hundred descriptors) and
//! spreads the client ends over several loopback source addresses.

use std::convert::Infallible;
use std::io::{self, BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use http_body_util::Full;
use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::Instant;
use tokio_wheel::Wheel;
use tokio_wheel::axum::{IdleListener, busy_aware};
use tokio_wheel::hyper::{HyperTimer, IdleIo};
use tokio_wheel_servers::TokioIdle;

const BUSY_CONNECTIONS: usize = 64;
/// hyper's default once a timer is set; it arms one sleep per request on the server's timer.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nhost: bench\r\n\r\n";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    Tokio,
    Wheel,
    /// Plain `axum::serve` (no idle timeout at all): what adding one costs an axum server.
    Axum,
    /// `axum::serve(IdleListener, busy_aware(app))`.
    AxumWheel,
}

impl Variant {
    const ALL: [Variant; 4] = [
        Variant::Tokio,
        Variant::Wheel,
        Variant::Axum,
        Variant::AxumWheel,
    ];

    fn name(self) -> &'static str {
        match self {
            Variant::Tokio => "tokio",
            Variant::Wheel => "wheel",
            Variant::Axum => "axum",
            Variant::AxumWheel => "axum-wheel",
        }
    }

    fn parse(name: &str) -> Variant {
        Variant::ALL
            .into_iter()
            .find(|variant| variant.name() == name)
            .unwrap_or_else(|| panic!("unknown variant {name:?}"))
    }

    /// Whether the server closes idle connections (plain axum never does).
    fn closes_idle(self) -> bool {
        self != Variant::Axum
    }
}

struct Options {
    runs: usize,
    idle: usize,
    secs: f64,
    timeout: Duration,
    /// Whether the server runs hyper's header-read timeout (a timer per request).
    header_read: bool,
    variants: Vec<Variant>,
    /// HTTP/2 with prior knowledge instead of HTTP/1.1.
    http2: bool,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|arg| arg == flag)
            .and_then(|at| args.get(at + 1))
            .cloned()
    };
    raise_fd_limit();
    if let Some(variant) = value("--server") {
        let variant = Variant::parse(&variant);
        let timeout = Duration::from_millis(value("--timeout-ms").unwrap().parse().unwrap());
        let threads = value("--threads").map_or(2, |t| t.parse().unwrap());
        let header_read = !args.iter().any(|arg| arg == "--no-header-timeout");
        let http2 = args.iter().any(|arg| arg == "--http2");
        return run_server(variant, timeout, threads, header_read, http2);
    }
    let quick = args.iter().any(|arg| arg == "--quick");
    let mut options = if quick {
        Options {
            runs: 1,
            idle: 200,
            secs: 2.0,
            timeout: Duration::from_secs(1),
            header_read: true,
            variants: vec![Variant::Tokio, Variant::Wheel],
            http2: false,
        }
    } else {
        Options {
            runs: 5,
            idle: 10_000,
            secs: 10.0,
            timeout: Duration::from_secs(5),
            header_read: true,
            variants: vec![Variant::Tokio, Variant::Wheel],
            http2: false,
        }
    };
    if let Some(runs) = value("--runs") {
        options.runs = runs.parse().expect("--runs N");
    }
    if let Some(idle) = value("--idle") {
        options.idle = idle.parse().expect("--idle N");
    }
    if let Some(secs) = value("--secs") {
        options.secs = secs.parse().expect("--secs S");
    }
    if let Some(ms) = value("--timeout-ms") {
        options.timeout = Duration::from_millis(ms.parse().expect("--timeout-ms MS"));
    }
    options.header_read = !args.iter().any(|arg| arg == "--no-header-timeout");
    options.http2 = args.iter().any(|arg| arg == "--http2");
    if let Some(variants) = value("--variants") {
        options.variants = variants.split(',').map(Variant::parse).collect();
    }
    let threads = value("--threads").unwrap_or_else(|| "2".into());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(orchestrate(options, threads));
}

// ---------------------------------------------------------------------------------------
// The server (child process).

fn run_server(variant: Variant, timeout: Duration, threads: usize, header_read: bool, http2: bool) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let listener = listen();
        println!("PORT {}", listener.local_addr().unwrap().port());
        let wheel = Wheel::new();
        let timer = HyperTimer::new(&wheel);
        if matches!(variant, Variant::Axum | Variant::AxumWheel) {
            return serve_axum(listener, variant, &wheel, timeout).await;
        }
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let service = service_fn(hello);
            match variant {
                Variant::Tokio if http2 => {
                    let io = TokioIdle::new(stream, timeout);
                    let connection = http2::Builder::new(TokioExecutor::new())
                        .timer(TokioTimer::new())
                        .serve_connection(TokioIo::new(io), service);
                    tokio::spawn(connection);
                }
                Variant::Wheel if http2 => {
                    let io = IdleIo::new(stream, &wheel, timeout);
                    let connection = http2::Builder::new(TokioExecutor::new())
                        .timer(timer.clone())
                        .serve_connection(TokioIo::new(io), service);
                    tokio::spawn(connection);
                }
                Variant::Tokio => {
                    let io = TokioIdle::new(stream, timeout);
                    let connection = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(header_read.then_some(HEADER_READ_TIMEOUT))
                        .serve_connection(TokioIo::new(io), service);
                    tokio::spawn(connection);
                }
                Variant::Axum | Variant::AxumWheel => unreachable!(),
                Variant::Wheel => {
                    let io = IdleIo::new(stream, &wheel, timeout);
                    let connection = http1::Builder::new()
                        .timer(timer.clone())
                        .header_read_timeout(header_read.then_some(HEADER_READ_TIMEOUT))
                        .serve_connection(TokioIo::new(io), service);
                    tokio::spawn(connection);
                }
            }
        }
    });
}

/// Variants `axum` and `axum-wheel`: axum's own accept loop and hyper-util's auto builder
/// (no header-read timeout: `axum::serve` sets no timer), `TCP_NODELAY` on both.
async fn serve_axum(listener: TcpListener, variant: Variant, wheel: &Wheel, timeout: Duration) {
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let served = if variant == Variant::AxumWheel {
        let listener = IdleListener::new(listener, wheel, timeout);
        axum::serve(listener, busy_aware(app)).await
    } else {
        axum::serve(listener, app).await
    };
    served.unwrap();
}

/// A listener with a deep accept queue: thousands of idle connections arrive at once.
fn listen() -> TcpListener {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket
        .bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0))
        .unwrap();
    socket.listen(4096).unwrap()
}

async fn hello(_: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

// ---------------------------------------------------------------------------------------
// The load generator (this process).

struct ServerProcess {
    child: Child,
    addr: SocketAddr,
}

impl ServerProcess {
    fn start(variant: Variant, options: &Options, threads: &str) -> ServerProcess {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args(["--server", variant.name(), "--threads", threads])
            .args(["--timeout-ms", &options.timeout.as_millis().to_string()]);
        if !options.header_read {
            command.arg("--no-header-timeout");
        }
        if options.http2 {
            command.arg("--http2");
        }
        let mut child = command
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the server process");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .expect("PORT line")
            .parse()
            .unwrap();
        ServerProcess {
            child,
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
        }
    }

    /// User + system CPU time so far.
    fn cpu(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        // Fields after the command name (which may hold spaces): state is field 3, utime 14.
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        // SAFETY: sysconf has no preconditions.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        Duration::from_secs_f64(ticks as f64 / per_second as f64)
    }

    /// On-CPU time of the server's live threads, in nanoseconds (`/proc/<pid>/task/*/schedstat`):
    /// fine-grained where the 10 ms ticks of `/proc/<pid>/stat` are too coarse (an idle
    /// server); `None` where the kernel does not provide it.
    fn cpu_fine(&self) -> Option<Duration> {
        let mut total = 0u64;
        for task in std::fs::read_dir(format!("/proc/{}/task", self.child.id())).ok()? {
            let path = task.ok()?.path().join("schedstat");
            let stat = std::fs::read_to_string(path).ok()?;
            total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
        }
        Some(Duration::from_nanos(total))
    }

    /// Peak resident set size, in MiB.
    fn max_rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status
            .lines()
            .find(|line| line.starts_with("VmHWM:"))
            .unwrap();
        let kib: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kib / 1024.0
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Default)]
struct RunResult {
    requests_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us_per_request: f64,
    max_rss_mib: f64,
    idle_cpu_percent: f64,
    lateness_p50_ms: f64,
    lateness_p99_ms: f64,
    lateness_max_ms: f64,
    early_closes: usize,
    never_closed: usize,
}

/// When one idle connection sent its request, got its answer, and saw the server close.
struct IdleTimes {
    sent: Instant,
    answered: Instant,
    closed: Option<Instant>,
}

/// Server processes started so far.
static SERVER_RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A client socket; past ~25 000 connections, spread over several loopback sources (each
/// source address has its own range of ephemeral ports).
async fn connect(addr: SocketAddr, index: usize) -> io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    // Each server run takes its sources from its own /24 of loopback: the ports a run leaves
    // in TIME_WAIT (a minute) are not the next run's, however many variants take turns.
    let run = SERVER_RUNS.load(std::sync::atomic::Ordering::Relaxed) as u8;
    let source = Ipv4Addr::new(127, 1 + run, 0, 2 + (index / 25_000) as u8);
    socket.bind(SocketAddr::new(IpAddr::V4(source), 0))?;
    let stream = socket.connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Sends one HTTP/1.1 request and reads its whole response.
async fn request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<()> {
    stream.write_all(REQUEST).await?;
    buf.clear();
    loop {
        let mut chunk = [0; 512];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(head) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head_text = String::from_utf8_lossy(&buf[..head]).to_ascii_lowercase();
            let length: usize = head_text
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap_or(0));
            if buf.len() >= head + 4 + length {
                return Ok(());
            }
        }
    }
}

/// One client connection: HTTP/1.1 (the stream and a read buffer) or HTTP/2 (hyper's request
/// sender and the connection's task, which ends when the server closes the connection).
enum Client {
    Http1(TcpStream, Vec<u8>),
    Http2(
        hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
        tokio::task::JoinHandle<()>,
    ),
}

impl Client {
    async fn connect(addr: SocketAddr, index: usize, http2: bool) -> io::Result<Client> {
        let stream = connect(addr, index).await?;
        if !http2 {
            return Ok(Client::Http1(stream, Vec::new()));
        }
        let (sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .map_err(io::Error::other)?;
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Client::Http2(sender, task))
    }

    /// Sends one request and reads its whole response.
    async fn request(&mut self) -> io::Result<()> {
        match self {
            Client::Http1(stream, buf) => request(stream, buf).await,
            Client::Http2(sender, _) => {
                let request = Request::get("http://bench/")
                    .body(Empty::new())
                    .map_err(io::Error::other)?;
                let response = sender
                    .send_request(request)
                    .await
                    .map_err(io::Error::other)?;
                response
                    .into_body()
                    .collect()
                    .await
                    .map_err(io::Error::other)?;
                Ok(())
            }
        }
    }

    /// When the server closed the connection, waiting at most `limit`.
    async fn closed(self, limit: Duration) -> Option<Instant> {
        match self {
            Client::Http1(mut stream, _) => {
                let mut chunk = [0; 64];
                match tokio::time::timeout(limit, stream.read(&mut chunk)).await {
                    Ok(Ok(0) | Err(_)) => Some(Instant::now()),
                    _ => None,
                }
            }
            // The sender stays alive while waiting: the client does not end the connection.
            Client::Http2(_sender, task) => tokio::time::timeout(limit, task)
                .await
                .ok()
                .map(|_| Instant::now()),
        }
    }
}

async fn idle_connection(
    addr: SocketAddr,
    index: usize,
    http2: bool,
    connecting: Arc<Semaphore>,
    connected: mpsc::UnboundedSender<()>,
    mut go: watch::Receiver<bool>,
    limit: Duration,
) -> Option<IdleTimes> {
    let permit = connecting.acquire().await.unwrap();
    let client = Client::connect(addr, index, http2).await;
    drop(permit);
    let _ = connected.send(());
    let mut client = client.ok()?;
    let _ = go.wait_for(|go| *go).await;
    let sent = Instant::now();
    client.request().await.ok()?;
    let answered = Instant::now();
    let closed = client.closed(limit).await;
    Some(IdleTimes {
        sent,
        answered,
        closed,
    })
}

/// Requests back to back, one at a time, until `until`: their latencies in µs.
async fn busy_connection(addr: SocketAddr, index: usize, http2: bool, until: Instant) -> Vec<u32> {
    let mut client = Client::connect(addr, index, http2)
        .await
        .expect("busy connection");
    let mut latencies = Vec::with_capacity(1 << 16);
    while Instant::now() < until {
        let start = Instant::now();
        if client.request().await.is_err() {
            break;
        }
        latencies.push(start.elapsed().as_micros().min(u32::MAX as u128) as u32);
    }
    latencies
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn run_once(variant: Variant, options: &Options, threads: &str) -> RunResult {
    SERVER_RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let server = ServerProcess::start(variant, options, threads);
    let addr = server.addr;

    // Idle connections: connect, then one request each at the same moment.
    let connecting = Arc::new(Semaphore::new(256));
    let (connected, mut established) = mpsc::unbounded_channel();
    let (go, ready) = watch::channel(false);
    let limit = if variant.closes_idle() {
        options.timeout * 3 + Duration::from_secs_f64(options.secs) + Duration::from_secs(10)
    } else {
        // Nothing closes them: stop waiting when the load ends.
        options.timeout + Duration::from_secs_f64(options.secs)
    };
    let idle: Vec<_> = (0..options.idle)
        .map(|i| {
            let connected = connected.clone();
            tokio::spawn(idle_connection(
                addr,
                i,
                options.http2,
                connecting.clone(),
                connected,
                ready.clone(),
                limit,
            ))
        })
        .collect();
    for _ in 0..options.idle {
        established.recv().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = go.send(true);
    let released = Instant::now();

    // Idle CPU: the server holding N silent connections with pending idle timers.
    let window_start = released + options.timeout / 5;
    let window = options.timeout / 2;
    tokio::time::sleep_until(window_start).await;
    let cpu_before = (server.cpu_fine(), server.cpu());
    tokio::time::sleep(window).await;
    let idle_cpu = match (cpu_before.0, server.cpu_fine()) {
        (Some(before), Some(after)) => after.saturating_sub(before),
        _ => server.cpu() - cpu_before.1,
    };

    // Busy: 64 connections back to back; the idle ones expire meanwhile.
    let cpu_before = server.cpu();
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(options.secs);
    let busy: Vec<_> = (0..BUSY_CONNECTIONS)
        .map(|i| {
            tokio::spawn(busy_connection(
                addr,
                options.idle + i,
                options.http2,
                until,
            ))
        })
        .collect();
    let mut latencies = Vec::new();
    for task in busy {
        latencies.extend(task.await.unwrap().into_iter().map(f64::from));
    }
    let took = start.elapsed();
    let busy_cpu = server.cpu() - cpu_before;
    latencies.sort_by(f64::total_cmp);

    let mut lateness = Vec::new();
    let (mut early, mut never) = (0, 0);
    for task in idle {
        let Some(times) = task.await.unwrap() else {
            never += 1;
            continue;
        };
        match times.closed {
            Some(closed) => {
                if closed < times.sent + options.timeout {
                    early += 1;
                }
                let due = times.answered + options.timeout;
                lateness.push(if closed >= due {
                    (closed - due).as_secs_f64() * 1e3
                } else {
                    -(due - closed).as_secs_f64() * 1e3
                });
            }
            None => never += 1,
        }
    }
    lateness.sort_by(f64::total_cmp);
    let requests = latencies.len() as f64;
    RunResult {
        requests_per_sec: requests / took.as_secs_f64(),
        p50_us: percentile(&latencies, 0.50),
        p99_us: percentile(&latencies, 0.99),
        cpu_us_per_request: busy_cpu.as_secs_f64() * 1e6 / requests.max(1.0),
        max_rss_mib: server.max_rss_mib(),
        idle_cpu_percent: idle_cpu.as_secs_f64() / window.as_secs_f64() * 100.0,
        lateness_p50_ms: percentile(&lateness, 0.50),
        lateness_p99_ms: percentile(&lateness, 0.99),
        lateness_max_ms: lateness.last().copied().unwrap_or(f64::NAN),
        early_closes: early,
        never_closed: never,
    }
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    percentile(&values, 0.5)
}

async fn orchestrate(options: Options, threads: String) {
    println!(
        "hyper_bench: {} idle + {BUSY_CONNECTIONS} busy connections, idle timeout {:?}, \
         {} s of load, {} run(s) per variant, server: {threads} worker thread(s), \
         header-read timeout {}, {}",
        options.idle,
        options.timeout,
        options.secs,
        options.runs,
        if options.header_read && !options.http2 {
            "30 s"
        } else {
            "off"
        },
        if options.http2 {
            "HTTP/2 (h2c)"
        } else {
            "HTTP/1.1"
        }
    );
    println!(
        "| run | variant | req/s | p50 µs | p99 µs | server CPU µs/req | max RSS MiB | \
         idle CPU % | close lateness p50/p99/max ms | early | never closed |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut results: Vec<(Variant, RunResult)> = Vec::new();
    for run in 0..options.runs {
        // Each run starts with another variant, so none always runs first.
        let mut order = options.variants.clone();
        let turn = run % order.len();
        order.rotate_left(turn);
        for variant in order {
            let r = run_once(variant, &options, &threads).await;
            println!(
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} | {:.3} | {:.1} / {:.1} / {:.1} | {} | {} |",
                run + 1,
                variant.name(),
                r.requests_per_sec,
                r.p50_us,
                r.p99_us,
                r.cpu_us_per_request,
                r.max_rss_mib,
                r.idle_cpu_percent,
                r.lateness_p50_ms,
                r.lateness_p99_ms,
                r.lateness_max_ms,
                r.early_closes,
                r.never_closed,
            );
            results.push((variant, r));
        }
    }
    println!("\nmedians over runs:");
    println!(
        "| variant | req/s | p50 µs | p99 µs | server CPU µs/req | max RSS MiB | idle CPU % | lateness p99 ms | early (total) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut failed = false;
    for &variant in &options.variants {
        let of = || {
            results
                .iter()
                .filter(move |(v, _)| *v == variant)
                .map(|(_, r)| r)
        };
        let early: usize = of().map(|r| r.early_closes).sum();
        let never: usize = of().map(|r| r.never_closed).sum();
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} | {:.3} | {:.1} | {} |",
            variant.name(),
            median(of().map(|r| r.requests_per_sec)),
            median(of().map(|r| r.p50_us)),
            median(of().map(|r| r.p99_us)),
            median(of().map(|r| r.cpu_us_per_request)),
            median(of().map(|r| r.max_rss_mib)),
            median(of().map(|r| r.idle_cpu_percent)),
            median(of().map(|r| r.lateness_p99_ms)),
            early,
        );
        if early > 0 || (never > 0 && variant.closes_idle()) {
            eprintln!(
                "{}: {early} early closes, {never} connections never closed",
                variant.name()
            );
            failed = failed || matches!(variant, Variant::Wheel | Variant::AxumWheel);
        }
    }
    if failed {
        std::process::exit(1);
    }
}

/// Raises the soft limit on open files to the hard limit (N idle connections each need a
/// descriptor, in the client and in the server).
fn raise_fd_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
