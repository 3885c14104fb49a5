//! A TCP server on loopback that closes each connection after a period of silence, using one
//! keyed timer per connection (reset on every message), and a built-in load that checks it.
//!
//! The load opens many connections: half stay chatty, half go silent after a few messages.
//! It reports how many idle connections were closed and how late, and fails if any connection
//! was closed early or any chatty one was closed at all. Bounded in count and time; stops by
//! itself.
//!
//! Run: `cargo run --release --example keepalive` (`-- --quick` for a small, short run;
//! `-- --connections N` to choose the load).

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{Mutex, oneshot};
use tokio::time::Instant;
use tokio_wheel::{Timers, Wheel};

/// What the server keeps per connection: how to tell its task to close it.
struct Connection {
    close: oneshot::Sender<()>,
}

/// The server: every line a client sends postpones its connection's timer by `idle`.
async fn serve(
    listener: TcpListener,
    wheel: Wheel,
    idle: Duration,
    server_lateness: Arc<Mutex<Vec<Duration>>>,
) {
    let (timers, mut expired) = wheel.keyed::<u64, Connection>();
    tokio::spawn(async move {
        while let Some(expiry) = expired.next().await {
            server_lateness
                .lock()
                .await
                .push(expiry.deadline().elapsed());
            let (_, connection) = expiry.into_parts();
            let _ = connection.close.send(());
        }
    });
    let mut next_id = 0u64;
    while let Ok((stream, _)) = listener.accept().await {
        next_id += 1;
        let (close, closed) = oneshot::channel();
        timers.set(next_id, Connection { close }, idle);
        tokio::spawn(handle(stream, next_id, timers.clone(), idle, closed));
    }
}

async fn handle(
    stream: TcpStream,
    id: u64,
    timers: Timers<u64, Connection>,
    idle: Duration,
    mut closed: oneshot::Receiver<()>,
) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    loop {
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(_)) => timers.reset(&id, idle),
                _ => {
                    timers.remove(&id); // the client left first
                    return;
                }
            },
            _ = &mut closed => {
                let _ = write.write_all(b"bye: idle\n").await;
                let _ = write.shutdown().await;
                return;
            }
        }
    }
}

/// How a client's connection ended.
#[derive(Debug)]
enum Outcome {
    /// A chatty client finished talking and was never closed.
    StayedOpen,
    /// A chatty client was closed by the server: a failure.
    ChattyClosed,
    /// A silent client was closed this long after its deadline (negative: early, a failure).
    IdleClosed { late_by: Result<Duration, Duration> },
    /// A silent client was never closed within the allowed time: a failure.
    NeverClosed,
}

async fn client(
    address: SocketAddr,
    chatty: bool,
    messages: u32,
    idle: Duration,
    talk_for: Duration,
) -> Outcome {
    // Taken before connecting: the server may accept (and start the idle timer) before this
    // task resumes, so a later reference would make an on-time close look early.
    let start = Instant::now();
    let stream = TcpStream::connect(address)
        .await
        .expect("connect to the server");
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let mut last_sent = start;
    let gap = if chatty { idle / 3 } else { idle / 4 };
    let mut sent = 0;
    loop {
        if chatty && start.elapsed() >= talk_for {
            return Outcome::StayedOpen; // done talking: hang up ourselves
        }
        let talking = chatty || sent < messages;
        let wait = if talking { gap } else { idle * 3 };
        tokio::select! {
            line = lines.next_line() => {
                let closed_at = Instant::now();
                return match line {
                    Ok(Some(_)) | Ok(None) | Err(_) if chatty => Outcome::ChattyClosed,
                    _ => {
                        let due = last_sent + idle;
                        let late_by = closed_at.checked_duration_since(due).ok_or(due - closed_at);
                        Outcome::IdleClosed { late_by }
                    }
                };
            }
            () = tokio::time::sleep(wait) => {
                if !talking {
                    return Outcome::NeverClosed;
                }
                last_sent = Instant::now();
                if write.write_all(b"ping\n").await.is_err() {
                    return if chatty { Outcome::ChattyClosed } else { Outcome::NeverClosed };
                }
                sent += 1;
            }
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let connections: usize = match args.iter().position(|a| a == "--connections") {
        Some(i) => args[i + 1].parse().expect("--connections N"),
        None if quick => 200,
        None => 2_000,
    };
    let idle = Duration::from_millis(if quick { 300 } else { 1_000 });
    let talk_for = idle * 3;

    let wheel = Wheel::builder().name("keepalive").build();
    // A deep accept backlog: thousands of clients connect at once, and a full backlog makes
    // the kernel drop SYNs that are only retried a second later.
    let socket = TcpSocket::new_v4().expect("a TCP socket");
    socket
        .bind("127.0.0.1:0".parse().unwrap())
        .expect("bind on loopback");
    let listener = socket.listen(4096).expect("listen");
    let address = listener.local_addr().expect("local address");
    let server_lateness = Arc::new(Mutex::new(Vec::new()));
    let server = tokio::spawn(serve(
        listener,
        wheel.clone(),
        idle,
        server_lateness.clone(),
    ));
    println!("server on {address}: closes a connection after {idle:?} of silence");
    println!(
        "load: {connections} connections, half chatty for {talk_for:?}, half silent after 0-3 messages"
    );

    let done = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let clients: Vec<_> = (0..connections)
        .map(|i| {
            let done = done.clone();
            tokio::spawn(async move {
                // Ramp up in waves of 200 so the accept loop keeps pace.
                tokio::time::sleep(Duration::from_millis((i / 200) as u64 * 10)).await;
                let outcome = client(address, i % 2 == 0, (i % 8 / 2) as u32, idle, talk_for).await;
                done.fetch_add(1, Ordering::Relaxed);
                outcome
            })
        })
        .collect();
    let progress = tokio::spawn({
        let done = done.clone();
        async move {
            loop {
                let finished = done.load(Ordering::Relaxed);
                let filled = 30 * finished / connections;
                eprint!(
                    "\r[{}{}] {finished}/{connections} connections finished",
                    "#".repeat(filled),
                    " ".repeat(30 - filled)
                );
                let _ = std::io::stderr().flush();
                if finished == connections {
                    eprintln!();
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });

    let (mut stayed_open, mut chatty_closed, mut never_closed, mut early) = (0, 0, 0, 0);
    let mut late = Vec::new();
    for client in clients {
        match client.await.expect("client task") {
            Outcome::StayedOpen => stayed_open += 1,
            Outcome::ChattyClosed => chatty_closed += 1,
            Outcome::NeverClosed => never_closed += 1,
            Outcome::IdleClosed { late_by: Ok(by) } => late.push(by),
            Outcome::IdleClosed { late_by: Err(_) } => early += 1,
        }
    }
    progress.await.expect("progress task");
    server.abort();
    late.sort_unstable();
    let mut server_late = server_lateness.lock().await.clone();
    server_late.sort_unstable();

    println!("finished in {:.1} s", start.elapsed().as_secs_f64());
    println!(
        "  idle connections closed: {} (closed early: {early}, never closed: {never_closed})",
        late.len()
    );
    println!(
        "  chatty connections kept open: {stayed_open} (closed while chatty: {chatty_closed})"
    );
    if !late.is_empty() {
        println!(
            "  close lateness seen by clients (after last message + {idle:?}): p50 {:?} · p99 {:?} · max {:?}",
            percentile(&late, 0.5),
            percentile(&late, 0.99),
            late[late.len() - 1]
        );
    }
    if !server_late.is_empty() {
        println!(
            "  timer lateness inside the server: p50 {:?} · p99 {:?} · max {:?}",
            percentile(&server_late, 0.5),
            percentile(&server_late, 0.99),
            server_late[server_late.len() - 1]
        );
    }
    let stats = wheel.stats();
    println!(
        "  wheel: {} keyed timers set, {} moved, {} fired",
        stats.inserted, stats.rescheduled, stats.fired
    );
    wheel.shutdown().await;
    assert_eq!(early, 0, "a connection was closed before its idle deadline");
    assert_eq!(chatty_closed, 0, "a chatty connection was closed");
    assert_eq!(never_closed, 0, "an idle connection was never closed");
    assert_eq!(late.len() + stayed_open, connections);
}
