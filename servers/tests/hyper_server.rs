//! hyper on the wheel: `HyperTimer` in real hyper servers and clients over loopback, and
//! `IdleIo`'s idle close in a real server (their rules under paused time: `paused_rules.rs`).
//!
//! Real-time tests use short durations and assert ordering facts (never closed before the
//! timeout); their upper bounds are generous, for a loaded 2-core CI machine.

use std::convert::Infallible;
use std::error::Error as _;
use std::io::{self, ErrorKind};
use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_wheel::Wheel;
use tokio_wheel::hyper::{HyperTimer, IdleHandle, IdleIo};

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
    let idle = Duration::from_millis(600);
    let mut server = Server::start(&wheel, config(idle)).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    // A request every idle/6 for four idle periods, all on the one connection: a stall of
    // this task up to ~500 ms on a loaded machine still leaves the connection chatty.
    for _ in 0..24 {
        get(&mut stream, "/")
            .await
            .expect("a chatty connection was closed");
        tokio::time::sleep(idle / 6).await;
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
        // Ended by the IdleIo, or by hyper's own header-read timeout: it runs on the same
        // stopped wheel (its sleeps complete at once), and whichever is polled first ends the
        // connection. Both are the wheel's shutdown at work; any other end is not.
        let ended = server.next_ended(SLACK).await;
        let header_timeout = ended.result.as_ref().is_err_and(hyper::Error::is_timeout);
        assert!(ended.closed_by_idle_io || header_timeout, "{ended:?}");
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
