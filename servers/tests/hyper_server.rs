//! hyper on the wheel: `HyperTimer` in real hyper servers and clients over loopback, and
//! `IdleIo`'s idle close — its rules under paused time, its outcomes in a real server.
//!
//! Real-time tests use short durations and assert ordering facts (never closed before the
//! timeout); their upper bounds are generous, for a loaded 2-core CI machine.

use std::convert::Infallible;
use std::error::Error as _;
use std::future::Future;
use std::io::{self, ErrorKind};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::rt::Timer;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_wheel::Wheel;
use tokio_wheel::hyper::{HyperSleep, HyperTimer, IdleHandle, IdleIo};

/// Generous slack for "closed within the timeout plus a tick plus scheduling" on a busy
/// shared CI machine: what is asserted tightly is "never before".
const SLACK: Duration = Duration::from_millis(1500);

// ---------------------------------------------------------------------------------------
// A real server: hyper http1 on loopback, each connection in an IdleIo, HyperTimer set.

#[derive(Clone, Copy)]
struct Config {
    idle: Duration,
    header_read_timeout: Option<Duration>,
}

/// How one server connection ended, seen by the server.
#[derive(Debug)]
struct Ended {
    at: Instant,
    result: Result<(), hyper::Error>,
    /// Whether the IdleIo closed it (hyper reports an idle keep-alive connection that ends
    /// between requests as `Ok`, whatever the IO answered).
    closed_by_idle_io: bool,
}

impl Ended {
    /// The IO error kind under hyper's error, if the connection ended on one.
    fn io_kind(&self) -> Option<ErrorKind> {
        let error = self.result.as_ref().err()?;
        let io = error.source()?.downcast_ref::<io::Error>()?;
        Some(io.kind())
    }
}

struct Server {
    addr: SocketAddr,
    ended: mpsc::UnboundedReceiver<Ended>,
}

impl Server {
    async fn start(wheel: &Wheel, config: Config) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, ended) = mpsc::unbounded_channel();
        let wheel = wheel.clone();
        tokio::spawn(async move {
            let timer = HyperTimer::new(&wheel);
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let io = IdleIo::new(stream, &wheel, config.idle);
                let idle = io.handle();
                let service = service_fn(move |request| respond(request, idle.clone()));
                let mut builder = http1::Builder::new();
                builder.timer(timer.clone());
                if let Some(timeout) = config.header_read_timeout {
                    builder.header_read_timeout(timeout);
                }
                let tx = tx.clone();
                let handle = io.handle();
                tokio::spawn(async move {
                    let result = builder.serve_connection(TokioIo::new(io), service).await;
                    let _ = tx.send(Ended {
                        at: Instant::now(),
                        result,
                        closed_by_idle_io: handle.is_closed(),
                    });
                });
            }
        });
        Server { addr, ended }
    }

    /// The next connection to end; panics if none does within `limit`.
    async fn next_ended(&mut self, limit: Duration) -> Ended {
        tokio::time::timeout(limit, self.ended.recv())
            .await
            .expect("a server connection should have ended by now")
            .unwrap()
    }
}

/// `/` answers at once; `/slow/<ms>` after `ms` milliseconds of Tokio's timer (not the
/// wheel's, so a wheel shutdown does not cut it short), `/busy/<ms>` the same holding a
/// `Busy` guard.
async fn respond(
    request: Request<Incoming>,
    idle: IdleHandle,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path().to_owned();
    let mut parts = path.trim_start_matches('/').split('/');
    let kind = parts.next().unwrap_or("");
    let ms = parts.next().and_then(|ms| ms.parse().ok()).unwrap_or(0);
    match kind {
        "slow" => tokio::time::sleep(Duration::from_millis(ms)).await,
        "busy" => {
            let _busy = idle.busy();
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        _ => {}
    }
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

// ---------------------------------------------------------------------------------------
// A raw HTTP/1.1 client, to see exactly when the server closes.

/// Sends `GET path` on a keep-alive connection and reads the whole response ("ok").
async fn get(stream: &mut TcpStream, path: &str) -> io::Result<()> {
    let request = format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    let mut chunk = [0; 1024];
    while !(response.ends_with(b"\r\n\r\nok")) {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(
                ErrorKind::UnexpectedEof,
                format!(
                    "closed mid-response: {:?}",
                    String::from_utf8_lossy(&response)
                ),
            ));
        }
        response.extend_from_slice(&chunk[..n]);
    }
    assert!(response.starts_with(b"HTTP/1.1 200 OK"));
    Ok(())
}

/// Waits until the server closes the connection (end of file or a reset); when it did.
async fn closed_at(stream: &mut TcpStream, limit: Duration) -> Instant {
    let mut chunk = [0; 64];
    tokio::time::timeout(limit, async {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => Instant::now(),
            Ok(n) => panic!("unexpected bytes: {:?}", &chunk[..n]),
        }
    })
    .await
    .expect("the server should have closed the connection by now")
}

fn config(idle: Duration) -> Config {
    Config {
        idle,
        header_read_timeout: None,
    }
}

// ---------------------------------------------------------------------------------------
// Real server, real time.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_is_cut_off_by_the_header_read_timeout_not_before() {
    let wheel = Wheel::new();
    let timeout = Duration::from_millis(400);
    let mut server = Server::start(
        &wheel,
        Config {
            idle: Duration::from_secs(60),
            header_read_timeout: Some(timeout),
        },
    )
    .await;
    let start = Instant::now();
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    // A header trickled a byte every 40 ms: traffic enough for the idle timeout, never a
    // whole head for hyper.
    let trickle = async {
        stream.write_all(b"GET / HTTP/1.1\r\n").await?;
        for byte in b"x-slow: ".iter().cycle().take(250) {
            tokio::time::sleep(Duration::from_millis(40)).await;
            stream.write_all(&[*byte]).await?;
        }
        io::Result::Ok(())
    };
    let trickled = tokio::time::timeout(Duration::from_secs(10), trickle)
        .await
        .expect("the server should cut the slow header off");
    assert!(trickled.is_err(), "the server never closed: {trickled:?}");
    let ended = server.next_ended(SLACK).await;
    let after = ended.at - start;
    assert!(
        after >= timeout,
        "cut off after {after:?}, before {timeout:?}"
    );
    assert!(after < timeout + SLACK, "cut off only after {after:?}");
    let error = ended.result.unwrap_err();
    assert!(
        error.is_timeout(),
        "ended with {error:?}, not hyper's timeout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_the_timeout_never_before() {
    let wheel = Wheel::new();
    let idle = Duration::from_millis(300);
    let mut server = Server::start(&wheel, config(idle)).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let sent = Instant::now();
    get(&mut stream, "/").await.unwrap();
    let closed = closed_at(&mut stream, idle + SLACK * 2).await;
    // The server's last traffic (its response) came after `sent`.
    assert!(
        closed - sent >= idle,
        "closed {:?} after the request",
        closed - sent
    );
    let ended = server.next_ended(SLACK).await;
    assert!(ended.at - sent >= idle);
    assert!(
        ended.at - sent < idle + SLACK,
        "closed only after {:?}",
        ended.at - sent
    );
    assert!(ended.closed_by_idle_io, "{ended:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chatty_connection_is_spared() {
    let wheel = Wheel::new();
    let idle = Duration::from_millis(300);
    let mut server = Server::start(&wheel, config(idle)).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    // A request every idle/3 for four idle periods, all on the one connection.
    for _ in 0..12 {
        get(&mut stream, "/")
            .await
            .expect("a chatty connection was closed");
        tokio::time::sleep(idle / 3).await;
    }
    assert!(server.ended.try_recv().is_err(), "a connection ended");
    let last = Instant::now();
    get(&mut stream, "/").await.unwrap();
    let closed = closed_at(&mut stream, idle + SLACK * 2).await;
    assert!(closed - last >= idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_request_holding_busy_is_spared() {
    let wheel = Wheel::new();
    let idle = Duration::from_millis(300);
    let mut server = Server::start(&wheel, config(idle)).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let start = Instant::now();
    // Three idle periods without a byte on the wire, but a request in progress.
    get(&mut stream, "/busy/900")
        .await
        .expect("the connection was closed under a busy request");
    let answered = Instant::now();
    assert!(answered - start >= Duration::from_millis(900));
    // The countdown restarted when the guard dropped, just before the response went out.
    let closed = closed_at(&mut stream, idle + SLACK * 2).await;
    assert!(closed - start >= Duration::from_millis(900) + idle);
    let ended = server.next_ended(SLACK).await;
    assert!(ended.closed_by_idle_io, "{ended:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_request_without_busy_is_cut_off_when_hyper_watches_the_read_side() {
    // The control for the test above: the same request without the guard. hyper's HTTP/1
    // dispatcher keeps reading while a request is in flight (to notice a client going
    // away), so the idle rule sees 900 ms of silence and ends the connection.
    let wheel = Wheel::new();
    let idle = Duration::from_millis(300);
    let mut server = Server::start(&wheel, config(idle)).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let start = Instant::now();
    let outcome = get(&mut stream, "/slow/900").await;
    let ended = server.next_ended(SLACK * 2).await;
    assert!(ended.at - start >= idle);
    assert!(
        outcome.is_err(),
        "the slow request was answered: the control is void"
    );
    assert_eq!(ended.io_kind(), Some(ErrorKind::TimedOut), "{ended:?}");
    assert!(ended.closed_by_idle_io);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_shutdown_idle_connections_close_at_once_and_nothing_hangs() {
    let wheel = Wheel::new();
    let idle = Duration::from_secs(30);
    let mut server = Server::start(&wheel, config(idle)).await;
    let mut idle_streams = Vec::new();
    for _ in 0..3 {
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        get(&mut stream, "/").await.unwrap();
        idle_streams.push(stream);
    }
    // One connection in a busy request when the wheel stops: answered, then closed.
    let mut busy_stream = TcpStream::connect(server.addr).await.unwrap();
    let busy = tokio::spawn(async move {
        let answered = get(&mut busy_stream, "/busy/600").await;
        (answered, busy_stream)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let stopped = Instant::now();
    tokio::time::timeout(SLACK, wheel.shutdown())
        .await
        .expect("shutdown hung");
    for stream in &mut idle_streams {
        let closed = closed_at(stream, SLACK).await;
        assert!(closed - stopped < SLACK);
    }
    let (answered, mut busy_stream) = tokio::time::timeout(SLACK * 2, busy)
        .await
        .expect("the busy request hung")
        .unwrap();
    answered.expect("the busy request was cut off by the shutdown");
    closed_at(&mut busy_stream, SLACK).await;
    for _ in 0..4 {
        let ended = server.next_ended(SLACK).await;
        assert!(ended.closed_by_idle_io, "{ended:?}");
    }
    // New connections on the stopped wheel are closed at once.
    let mut late = TcpStream::connect(server.addr).await.unwrap();
    let _ = late
        .write_all(b"GET / HTTP/1.1\r\nhost: test\r\n\r\n")
        .await;
    closed_at(&mut late, SLACK).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_and_the_auto_builder_run_their_keep_alive_pings_on_the_wheel() {
    let wheel = Wheel::new();
    let timer = HyperTimer::new(&wheel);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server_wheel = wheel.clone();
    let server_timer = timer.clone();
    tokio::spawn(async move {
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(server_timer.clone());
        builder
            .http2()
            .timer(server_timer)
            .keep_alive_interval(Duration::from_millis(50))
            .keep_alive_timeout(Duration::from_secs(5));
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let io = IdleIo::new(stream, &server_wheel, Duration::from_secs(30));
            let idle = io.handle();
            let service = service_fn(move |request| respond(request, idle.clone()));
            let builder = builder.clone();
            tokio::spawn(async move {
                let _ = builder.serve_connection(TokioIo::new(io), service).await;
            });
        }
    });

    // An HTTP/2 client with its own pings on the wheel too.
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut send, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(timer.clone())
        .keep_alive_interval(Duration::from_millis(50))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true)
        .handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    let fired = wheel.stats().fired;
    for _ in 0..3 {
        let request = Request::get(format!("http://{addr}/"))
            .body(Empty::<Bytes>::new())
            .unwrap();
        send.ready().await.unwrap();
        let response = send.send_request(request).await.unwrap();
        assert_eq!(response.version(), hyper::Version::HTTP_2);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Both sides' 50 ms keep-alive pings ran on the wheel's timers.
    let pings = wheel.stats().fired - fired;
    assert!(
        pings >= 4,
        "only {pings} wheel timers fired in 500 ms of pings"
    );
    assert!(
        !connection.is_finished(),
        "pings answered in time must not end it"
    );

    // And the same auto builder speaks HTTP/1.1, with the timer set for it too.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    get(&mut stream, "/").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_builder_serves_with_the_wheel_timer() {
    let wheel = Wheel::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server_wheel = wheel.clone();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let io = IdleIo::new(stream, &server_wheel, Duration::from_millis(300));
        let idle = io.handle();
        let service = service_fn(move |request| respond(request, idle.clone()));
        let _ = http2::Builder::new(TokioExecutor::new())
            .timer(HyperTimer::new(&server_wheel))
            .keep_alive_interval(Duration::from_secs(10))
            .serve_connection(TokioIo::new(io), service)
            .await;
    });
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut send, connection) = hyper::client::conn::http2::handshake::<_, _, Empty<Bytes>>(
        TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .unwrap();
    let connection = tokio::spawn(connection);
    let request = Request::get(format!("http://{addr}/busy/500"))
        .body(Empty::new())
        .unwrap();
    let start = Instant::now();
    let response = send.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    // Then idle: the IdleIo closes the HTTP/2 connection too, never before the timeout.
    let done = tokio::time::timeout(SLACK * 2, connection)
        .await
        .expect("the idle HTTP/2 connection was never closed");
    assert!(start.elapsed() >= Duration::from_millis(800));
    drop(done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_pool_expires_idle_connections_on_the_wheel() {
    let wheel = Wheel::new();
    let mut server = Server::start(&wheel, config(Duration::from_secs(30))).await;
    let pool_idle = Duration::from_millis(300);
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_timer(HyperTimer::new(&wheel))
        .pool_idle_timeout(pool_idle)
        .build_http::<Empty<Bytes>>();
    let sent = Instant::now();
    let uri: hyper::Uri = format!("http://{}/", server.addr).parse().unwrap();
    let response = client.get(uri.clone()).await.unwrap();
    response.into_body().collect().await.unwrap();
    // The pool's idle task (a wheel sleep it resets in place) drops the connection; the
    // server sees the client close it, long before its own 30 s.
    let ended = server.next_ended(pool_idle + SLACK * 2).await;
    assert!(ended.at - sent >= pool_idle);
    assert!(ended.result.is_ok(), "{ended:?}");
    assert!(
        !ended.closed_by_idle_io,
        "the server closed it, not the client's pool"
    );
    // The pool still works afterwards.
    let response = client.get(uri).await.unwrap();
    assert_eq!(response.status(), 200);
}

// ---------------------------------------------------------------------------------------
// HyperTimer under paused time.

#[tokio::test(start_paused = true)]
async fn hyper_timer_reset_moves_its_own_sleep_in_place() {
    let wheel = Wheel::new();
    let timer = HyperTimer::new(&wheel);
    let start = Instant::now();
    let mut sleep = timer.sleep(Duration::from_secs(1));
    assert!(poll_once(&mut sleep).is_pending()); // registered on the wheel
    wheel.flush().await;
    let registered = wheel.stats().inserted;
    let address = &*sleep as *const dyn hyper::rt::Sleep as *const u8;

    let later = start + Duration::from_secs(5);
    timer.reset(&mut sleep, later.into_std());
    assert_eq!(
        &*sleep as *const dyn hyper::rt::Sleep as *const u8, address,
        "reset allocated a new sleep"
    );
    let ours = sleep.as_mut().downcast_mut_pin::<HyperSleep>().unwrap();
    assert_eq!(ours.deadline(), later);
    wheel.flush().await;
    assert_eq!(
        wheel.stats().inserted,
        registered,
        "reset registered a new timer"
    );

    (&mut sleep).await;
    assert!(Instant::now() >= later);
    assert!(Instant::now() < later + Duration::from_millis(5));
}

#[tokio::test(start_paused = true)]
async fn hyper_timer_reset_replaces_a_foreign_sleep() {
    let wheel = Wheel::new();
    let timer = HyperTimer::new(&wheel);
    let start = Instant::now();
    let mut sleep = TokioTimer::new().sleep(Duration::from_secs(1));
    assert!(sleep.as_mut().downcast_mut_pin::<HyperSleep>().is_none());
    let later = start + Duration::from_secs(3);
    timer.reset(&mut sleep, later.into_std());
    let ours = sleep.as_mut().downcast_mut_pin::<HyperSleep>().unwrap();
    assert_eq!(ours.deadline(), later);
    sleep.await;
    assert!(Instant::now() >= later);
}

#[tokio::test(start_paused = true)]
async fn hyper_timer_now_is_the_wheel_clock() {
    let wheel = Wheel::new();
    let timer = HyperTimer::new(&wheel);
    let before = timer.now();
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(timer.now() - before >= Duration::from_secs(3600));
    // hyper computes deadlines as `now() + d`: they land on the paused clock.
    let start = Instant::now();
    timer
        .sleep_until(timer.now() + Duration::from_secs(2))
        .await;
    assert_eq!(start.elapsed().as_secs(), 2);
}

#[test]
fn hyper_types_are_send_sync() {
    fn send_sync<T: Send + Sync + Clone + 'static>() {}
    send_sync::<HyperTimer>();
    send_sync::<IdleHandle>();
    fn send_sync_unpin<T: Send + Sync + Unpin>() {}
    send_sync_unpin::<HyperSleep>();
    send_sync_unpin::<IdleIo<TcpStream>>();
    send_sync_unpin::<tokio_wheel::hyper::Busy>();
}

// ---------------------------------------------------------------------------------------
// IdleIo's rules, under paused time over an in-memory pipe.

const D: Duration = Duration::from_secs(10);

/// Reads until the IO errs; returns the error and when. Fails after an hour (of paused
/// time, so at once) rather than hang.
async fn read_until_error(io: &mut (impl AsyncRead + Unpin)) -> (io::Error, Instant) {
    let mut buf = [0; 64];
    let read = async {
        loop {
            match io.read(&mut buf).await {
                Ok(0) => panic!("end of file instead of an error"),
                Ok(_) => {}
                Err(error) => return (error, Instant::now()),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(3600), read)
        .await
        .expect("the IO was never closed")
}

fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(std::task::Waker::noop()))
}

#[tokio::test(start_paused = true)]
async fn idle_io_closes_after_the_timeout_of_silence() {
    let wheel = Wheel::new();
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, D);
    let start = Instant::now();
    let (error, at) = read_until_error(&mut io).await;
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert!(at - start >= D);
    assert!(
        at - start <= D + Duration::from_millis(2),
        "{:?}",
        at - start
    );
    assert!(io.is_closed());
    // From then on: reads and writes answer TimedOut, without reaching the pipe.
    assert_eq!(
        io.read(&mut [0; 8]).await.unwrap_err().kind(),
        ErrorKind::TimedOut
    );
    assert_eq!(
        io.write(b"late").await.unwrap_err().kind(),
        ErrorKind::TimedOut
    );
    io.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn reads_postpone_the_close() {
    let wheel = Wheel::new();
    let (stream, mut peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, D);
    let writer = tokio::spawn(async move {
        for _ in 0..10 {
            tokio::time::sleep(D / 2).await;
            peer.write_all(b"x").await.unwrap();
        }
        let last = Instant::now();
        (last, peer)
    });
    let (error, at) = read_until_error(&mut io).await;
    let (last, _peer) = writer.await.unwrap();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert!(at - last >= D, "closed {:?} after the last byte", at - last);
    assert!(at - last <= D + Duration::from_millis(2));
}

#[tokio::test(start_paused = true)]
async fn writes_postpone_the_close_of_a_waiting_read_in_another_task() {
    let wheel = Wheel::new();
    let (stream, mut peer) = tokio::io::duplex(1024);
    let io = IdleIo::new(stream, &wheel, D);
    let (mut reader, mut writer) = tokio::io::split(io);
    let write = tokio::spawn(async move {
        for _ in 0..10 {
            tokio::time::sleep(D / 2).await;
            writer.write_all(b"y").await.unwrap();
        }
        Instant::now()
    });
    let drain = tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = peer.read_to_end(&mut sink).await;
    });
    let (error, at) = read_until_error(&mut reader).await;
    let last = write.await.unwrap();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert!(
        at - last >= D,
        "closed {:?} after the last write",
        at - last
    );
    assert!(at - last <= D + Duration::from_millis(2));
    drop(drain);
}

#[tokio::test(start_paused = true)]
async fn touch_counts_as_traffic() {
    let wheel = Wheel::new();
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, D);
    let handle = io.handle();
    let toucher = tokio::spawn(async move {
        for _ in 0..5 {
            tokio::time::sleep(D / 2).await;
            handle.touch();
        }
        Instant::now()
    });
    let (_, at) = read_until_error(&mut io).await;
    let last = toucher.await.unwrap();
    assert!(at - last >= D);
    assert!(at - last <= D + Duration::from_millis(2));
}

#[tokio::test(start_paused = true)]
async fn a_busy_guard_holds_the_connection_open_and_the_countdown_restarts_at_its_drop() {
    let wheel = Wheel::new();
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, D);
    let handle = io.handle();
    let first = handle.busy();
    let second = handle.busy();
    let guards = tokio::spawn(async move {
        tokio::time::sleep(D * 3).await;
        drop(first);
        tokio::time::sleep(D * 2).await;
        drop(second);
        Instant::now()
    });
    let (error, at) = read_until_error(&mut io).await;
    let released = guards.await.unwrap();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert!(
        at - released >= D,
        "closed {:?} after the last guard",
        at - released
    );
    assert!(at - released <= D + Duration::from_millis(2));
}

#[tokio::test(start_paused = true)]
async fn a_write_the_peer_never_reads_times_out() {
    let wheel = Wheel::new();
    let (stream, _peer) = tokio::io::duplex(8);
    let mut io = IdleIo::new(stream, &wheel, D);
    let start = Instant::now();
    let write = tokio::time::timeout(Duration::from_secs(3600), io.write_all(&[7; 100]));
    let error = write.await.expect("never timed out").unwrap_err();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert!(start.elapsed() >= D);
    assert!(start.elapsed() <= D + Duration::from_millis(2));
}

#[tokio::test(start_paused = true)]
async fn shutdown_closes_an_idle_io_at_once_and_a_busy_one_when_its_guard_drops() {
    let wheel = Wheel::new();
    let (idle_stream, _idle_peer) = tokio::io::duplex(64);
    let (busy_stream, _busy_peer) = tokio::io::duplex(64);
    let mut idle = IdleIo::new(idle_stream, &wheel, D);
    let mut busy = IdleIo::new(busy_stream, &wheel, D);
    let guard = busy.handle().busy();
    let idle_read = tokio::spawn(async move { read_until_error(&mut idle).await });
    let busy_read = tokio::spawn(async move { read_until_error(&mut busy).await });
    tokio::time::sleep(D / 2).await;
    let stopped = Instant::now();
    wheel.shutdown().await;
    let (error, at) = idle_read.await.unwrap();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert!(error.to_string().contains("shut down"), "{error}");
    assert_eq!(at, stopped);
    // The busy one waits for its request, however long.
    tokio::time::sleep(D * 3).await;
    assert!(!busy_read.is_finished());
    drop(guard);
    let (error, at) = busy_read.await.unwrap();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert_eq!(at, stopped + D * 3);
}

// Bad input.

#[tokio::test(start_paused = true)]
async fn a_zero_timeout_closes_as_soon_as_a_read_would_wait() {
    let wheel = Wheel::new();
    let (stream, mut peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, Duration::ZERO);
    peer.write_all(b"hello").await.unwrap();
    let start = Instant::now();
    let mut buf = [0; 5];
    io.read_exact(&mut buf).await.unwrap(); // bytes already there still arrive
    let (error, _) = read_until_error(&mut io).await;
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert_eq!(start.elapsed(), Duration::ZERO);

    // While a request is in progress it waits, and closes once the guard drops.
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, Duration::ZERO);
    let guard = io.handle().busy();
    let mut read = Box::pin(async move { read_until_error(&mut io).await });
    assert!(poll_once(&mut read).is_pending());
    tokio::time::sleep(D).await;
    assert!(poll_once(&mut read).is_pending());
    drop(guard);
    let (error, at) = read.await;
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert_eq!(at - start, D);
}

#[tokio::test(start_paused = true)]
async fn a_max_timeout_never_closes() {
    let wheel = Wheel::new();
    let (stream, mut peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, Duration::MAX);
    let mut read = Box::pin(async move {
        let mut buf = [0; 4];
        io.read_exact(&mut buf).await.map(|_| buf)
    });
    assert!(poll_once(&mut read).is_pending());
    // A hundred years of silence, in steps the wheel cascades through.
    for _ in 0..100 {
        tokio::time::advance(Duration::from_secs(365 * 24 * 3600)).await;
        assert!(poll_once(&mut read).is_pending());
    }
    peer.write_all(b"late").await.unwrap();
    assert_eq!(&read.await.unwrap(), b"late");
}

#[tokio::test(start_paused = true)]
async fn a_wheel_already_shut_down_closes_the_io_on_its_first_read() {
    let wheel = Wheel::new();
    wheel.shutdown().await;
    let (stream, mut peer) = tokio::io::duplex(64);
    peer.write_all(b"data").await.unwrap();
    let mut io = IdleIo::new(stream, &wheel, D);
    assert!(io.is_closed());
    let error = io.read(&mut [0; 4]).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert!(error.to_string().contains("shut down"), "{error}");
    let error = io.write(b"x").await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
}

/// An IO whose reads fail.
struct Broken;

impl AsyncRead for Broken {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Poll::Ready(Err(io::Error::new(
            ErrorKind::ConnectionReset,
            "peer vanished",
        )))
    }
}

#[tokio::test(start_paused = true)]
async fn an_inner_error_passes_through_unchanged() {
    let wheel = Wheel::new();
    let mut io = IdleIo::new(Broken, &wheel, D);
    let error = io.read(&mut [0; 4]).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ConnectionReset);
    assert_eq!(error.to_string(), "peer vanished");
    assert!(!io.is_closed());
    // Errors are not traffic, and do not close it: the timeout still runs.
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, D);
    let start = Instant::now();
    let (error, _) = read_until_error(&mut io).await;
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert_eq!(start.elapsed(), D);
}
