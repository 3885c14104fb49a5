//! An outside attack on §5a ("No glue: axum, busy-aware by itself") over real loopback
//! sockets: `axum::serve(IdleListener::new(tcp, &wheel, d), busy_aware(app))` against hyper
//! clients and raw TCP writes.
//!
//! What is asserted tightly is only "never before `d` of silence" (with a small slack for the
//! client seeing bytes later than the server moved them); "closed after all" waits with a
//! generous limit (`d` + 3 s) for a loaded 2-core machine.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use axum::routing::{get, post};
use futures::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::Request;
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};
use tokio_wheel::Wheel;
use tokio_wheel::axum::{IdleListener, busy_aware};

const D: Duration = Duration::from_millis(300);
/// A close is expected within the timeout plus this.
const SLACK: Duration = Duration::from_secs(3);
/// The client sees bytes a little after the server moved them: "never before `d`" is checked
/// as "never before `d` - this", measured by the client.
const EARLY: Duration = Duration::from_millis(60);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// ---------------------------------------------------------------------------------------------
// the server

/// A stream body of `n` chunks of `size` bytes, pausing `pause` before each chunk after the
/// first (`n == usize::MAX`: endless).
fn slow_body(n: usize, size: usize, pause: Duration) -> Body {
    let stream = futures::stream::unfold(0usize, move |i| async move {
        if i >= n {
            return None;
        }
        if i > 0 {
            sleep(pause).await;
        }
        Some((Ok::<_, io::Error>(Bytes::from(vec![b'x'; size])), i + 1))
    });
    Body::from_stream(stream)
}

fn app() -> Router {
    Router::new()
        .route("/fast", get(|| async { "fast" }))
        .route(
            "/slow/{ms}",
            get(
                |axum::extract::Path(n): axum::extract::Path<u64>| async move {
                    sleep(ms(n)).await;
                    "slow"
                },
            ),
        )
        // 4 chunks of 1000 bytes, 2·d apart
        .route("/stream", get(|| async { slow_body(4, 1000, D * 2) }))
        // endless, a chunk every 50 ms
        .route(
            "/endless",
            get(|| async { slow_body(usize::MAX, 100, ms(50)) }),
        )
        // 32 MiB as fast as the peer takes it
        .route(
            "/big",
            get(|| async { slow_body(512, 64 * 1024, Duration::ZERO) }),
        )
        .route(
            "/upload",
            post(|body: Bytes| async move { body.len().to_string() }),
        )
        .route(
            "/panic",
            get(|| async {
                if true {
                    panic!("attack_axum: a handler that panics");
                }
                "unreachable"
            }),
        )
        .route(
            "/panic-in-body",
            get(|| async {
                let stream = futures::stream::unfold(0, |i| async move {
                    if i == 0 {
                        Some((Ok::<_, io::Error>(Bytes::from_static(b"first")), 1))
                    } else {
                        sleep(ms(50)).await;
                        panic!("attack_axum: a body that panics mid-stream");
                    }
                });
                Body::from_stream(stream)
            }),
        )
        .route(
            "/error-in-body",
            get(|| async {
                let stream = futures::stream::iter(vec![
                    Ok(Bytes::from_static(b"first")),
                    Err(io::Error::other("attack_axum: body error")),
                ]);
                Body::from_stream(stream)
            }),
        )
        .route(
            "/no-content-with-body",
            get(|| async { (StatusCode::NO_CONTENT, slow_body(usize::MAX, 10, ms(50))) }),
        )
        .route(
            "/peer",
            get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() }),
        )
}

async fn bind() -> (TcpListener, SocketAddr) {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    (tcp, addr)
}

/// `axum::serve(IdleListener, busy_aware(app()))` in the background.
async fn serve(wheel: &Wheel, d: Duration) -> SocketAddr {
    let (tcp, addr) = bind().await;
    serve_on(tcp, wheel, d);
    addr
}

fn serve_on(tcp: TcpListener, wheel: &Wheel, d: Duration) -> JoinHandle<()> {
    let listener = IdleListener::new(tcp, wheel, d);
    tokio::spawn(async move {
        axum::serve(listener, busy_aware(app())).await.unwrap();
    })
}

// ---------------------------------------------------------------------------------------------
// raw HTTP/1.1 over TCP

struct Raw {
    tcp: TcpStream,
    buf: Vec<u8>,
}

struct RawResponse {
    status: u16,
    body: Vec<u8>,
}

impl Raw {
    async fn connect(addr: SocketAddr) -> Raw {
        Raw {
            tcp: TcpStream::connect(addr).await.unwrap(),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.tcp.write_all(bytes).await.unwrap();
    }

    async fn get(&mut self, path: &str) {
        let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
        self.send(req.as_bytes()).await;
    }

    /// Reads more into the buffer; panics on EOF or error (the connection was cut).
    async fn fill(&mut self, what: &str) {
        let mut chunk = [0u8; 64 * 1024];
        match self.tcp.read(&mut chunk).await {
            Ok(0) => panic!("connection closed while {what}"),
            Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            Err(e) => panic!("connection error while {what}: {e}"),
        }
    }

    async fn line(&mut self) -> String {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8(self.buf[..i].to_vec()).unwrap();
                self.buf.drain(..i + 2);
                return line;
            }
            self.fill("reading a line").await;
        }
    }

    async fn exact(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            self.fill("reading a body").await;
        }
        self.buf.drain(..n).collect()
    }

    /// One response (`no_body`: to a HEAD request, or a 204/304).
    async fn response(&mut self, no_body: bool) -> RawResponse {
        let status_line = self.line().await;
        let status: u16 = status_line.split(' ').nth(1).unwrap().parse().unwrap();
        let mut length = None;
        let mut chunked = false;
        loop {
            let line = self.line().await;
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').unwrap();
            let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
            if name == "content-length" {
                length = Some(value.parse::<usize>().unwrap());
            } else if name == "transfer-encoding" && value.eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
        }
        let mut body = Vec::new();
        if no_body || status == 204 || status == 304 {
        } else if chunked {
            loop {
                let size = usize::from_str_radix(self.line().await.trim(), 16).unwrap();
                if size == 0 {
                    assert_eq!(self.line().await, "");
                    break;
                }
                body.extend(self.exact(size).await);
                assert_eq!(self.exact(2).await, b"\r\n");
            }
        } else {
            body = self.exact(length.unwrap_or(0)).await;
        }
        RawResponse { status, body }
    }

    /// Waits (up to `limit`) for the server to close: EOF or an error. Bytes that come are
    /// discarded. The instant the close was seen, or `None` at the limit.
    async fn closed_within(&mut self, limit: Duration) -> Option<Instant> {
        let mut chunk = [0u8; 64 * 1024];
        timeout(limit, async {
            loop {
                match self.tcp.read(&mut chunk).await {
                    Ok(0) | Err(_) => return Instant::now(),
                    Ok(_) => {}
                }
            }
        })
        .await
        .ok()
    }

    /// Asserts the server closes the connection, no sooner than `d` after `quiet`.
    async fn assert_closes_idle(&mut self, quiet: Instant, d: Duration, what: &str) {
        let closed = self.closed_within(d + SLACK).await;
        assert_closed_after(closed, quiet, d, what);
    }

    /// True if the server has not closed within `wait` (and sent nothing).
    async fn still_open_after(&mut self, wait: Duration) -> bool {
        let mut chunk = [0u8; 1];
        match timeout(wait, self.tcp.peek(&mut chunk)).await {
            Err(_) => true,
            Ok(Ok(0)) | Ok(Err(_)) => false,
            Ok(Ok(_)) => panic!("unexpected bytes from the server"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// hyper clients

type ClientBody = BoxBody<Bytes, io::Error>;

fn empty() -> ClientBody {
    Empty::<Bytes>::new().map_err(|e| match e {}).boxed()
}

fn get_req(path: &str) -> Request<ClientBody> {
    Request::get(path)
        .header("host", "x")
        .body(empty())
        .unwrap()
}

/// A hyper client connection: the sender, and a task that ends (with the instant) when the
/// server closed the connection.
struct H<S> {
    send: S,
    closed: JoinHandle<Instant>,
    local: SocketAddr,
}

async fn h1(addr: SocketAddr) -> H<hyper::client::conn::http1::SendRequest<ClientBody>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let local = tcp.local_addr().unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let closed = tokio::spawn(async move {
        let _ = conn.await;
        Instant::now()
    });
    H {
        send,
        closed,
        local,
    }
}

async fn h2_with(
    addr: SocketAddr,
    ping: Option<Duration>,
) -> H<hyper::client::conn::http2::SendRequest<ClientBody>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let local = tcp.local_addr().unwrap();
    let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
    if let Some(interval) = ping {
        builder
            .timer(TokioTimer::new())
            .keep_alive_interval(interval)
            .keep_alive_timeout(Duration::from_secs(20))
            .keep_alive_while_idle(true);
    }
    let (send, conn) = builder.handshake(TokioIo::new(tcp)).await.unwrap();
    let closed = tokio::spawn(async move {
        let _ = conn.await;
        Instant::now()
    });
    H {
        send,
        closed,
        local,
    }
}

async fn h2(addr: SocketAddr) -> H<hyper::client::conn::http2::SendRequest<ClientBody>> {
    h2_with(addr, None).await
}

impl<S> H<S> {
    /// The instant the server closed the connection, waiting at most `limit`.
    async fn closed_within(&mut self, limit: Duration) -> Option<Instant> {
        timeout(limit, &mut self.closed)
            .await
            .ok()
            .map(Result::unwrap)
    }

    fn is_closed(&self) -> bool {
        self.closed.is_finished()
    }

    /// Asserts the server closes the connection, no sooner than `d` after `quiet`.
    async fn assert_closes_idle(&mut self, quiet: Instant, d: Duration, what: &str) {
        let closed = self.closed_within(d + SLACK).await;
        assert_closed_after(closed, quiet, d, what);
    }
}

async fn text(resp: hyper::Response<hyper::body::Incoming>) -> String {
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Asserts a close came, and no sooner than `d` (minus the client-side slack) after `quiet`.
fn assert_closed_after(closed: Option<Instant>, quiet: Instant, d: Duration, what: &str) {
    let at =
        closed.unwrap_or_else(|| panic!("{what}: still open {:?} after it went quiet", d + SLACK));
    let silence = at.duration_since(quiet);
    assert!(
        silence + EARLY >= d,
        "{what}: closed after only {silence:?} of silence (timeout {d:?})"
    );
}

// ---------------------------------------------------------------------------------------------
// HTTP/1.1

/// A request body uploaded with pauses of 2·d between chunks while the handler reads it: the
/// request is in progress from its head, so the upload is never cut; after the response the
/// countdown restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_pausing_longer_than_d_is_never_cut() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = Raw::connect(addr).await;
    c.send(b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 4000\r\n\r\n")
        .await;
    for i in 0..4 {
        if i > 0 {
            sleep(D * 2).await;
        }
        c.send(&[b'u'; 1000]).await;
    }
    let resp = c.response(false).await;
    let quiet = Instant::now();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, b"4000");
    c.assert_closes_idle(quiet, D, "after the upload").await;
}

/// The same with a chunked upload whose chunks come 2·d apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_chunked_upload_is_never_cut() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = Raw::connect(addr).await;
    c.send(b"POST /upload HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        .await;
    for _ in 0..3 {
        c.send(b"3e8\r\n").await;
        c.send(&[b'u'; 1000]).await;
        c.send(b"\r\n").await;
        sleep(D * 2).await;
    }
    c.send(b"0\r\n\r\n").await;
    let resp = c.response(false).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, b"3000");
}

/// A response streamed with pauses of 2·d between chunks arrives whole; the connection closes
/// only after d of silence after its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_streamed_response_arrives_whole_then_the_countdown_restarts() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = h1(addr).await;
    let resp = c.send.send_request(get_req("/stream")).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = text(resp).await;
    let quiet = Instant::now();
    assert_eq!(body.len(), 4000);
    assert!(!c.is_closed());
    c.assert_closes_idle(quiet, D, "after the stream").await;
}

/// A client that stops reading a 32 MiB response for 4·d: the response is still in progress
/// (not sent in full), so it must not be cut; every byte arrives once the client reads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_a_big_response_is_not_cut() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = Raw::connect(addr).await;
    c.get("/big").await;
    sleep(D * 4).await;
    let resp = c.response(false).await;
    let quiet = Instant::now();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body.len(), 512 * 64 * 1024);
    c.assert_closes_idle(quiet, D, "after the big body").await;
}

/// Three pipelined requests in one write (slow, fast, slow): all answered in order, none cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_all_answered() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = Raw::connect(addr).await;
    let slow = format!("/slow/{}", D.as_millis() * 2);
    let req = format!(
        "GET {slow} HTTP/1.1\r\nhost: x\r\n\r\nGET /fast HTTP/1.1\r\nhost: x\r\n\r\nGET {slow} HTTP/1.1\r\nhost: x\r\n\r\n"
    );
    c.send(req.as_bytes()).await;
    let mut bodies = Vec::new();
    for _ in 0..3 {
        let r = c.response(false).await;
        assert_eq!(r.status, 200);
        bodies.push(String::from_utf8(r.body).unwrap());
    }
    let quiet = Instant::now();
    assert_eq!(bodies, ["slow", "fast", "slow"]);
    c.assert_closes_idle(quiet, D, "after pipelining").await;
}

/// Requests d/2 apart for 4·d keep one connection open (each is traffic); then it closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_closer_than_d_keep_the_connection_open() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = h1(addr).await;
    let mut quiet = Instant::now();
    for _ in 0..8 {
        let resp = c.send.send_request(get_req("/fast")).await.unwrap();
        assert_eq!(text(resp).await, "fast");
        quiet = Instant::now();
        sleep(D / 2).await;
    }
    c.assert_closes_idle(quiet, D, "after the requests").await;
}

/// A partial request head then silence is no request in progress: closed after d, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_head_then_silence_is_idle() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = Raw::connect(addr).await;
    c.send(b"GET /fast HTTP/1.1\r\nhos").await;
    let quiet = Instant::now();
    c.assert_closes_idle(quiet, D, "partial head").await;
}

/// Many connections each with a request slower than d, at once: all answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_slow_requests_all_succeed() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let ok = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let ok = ok.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = h1(addr).await;
            let path = format!("/slow/{}", D.as_millis() as u64 * 2 + i * 5);
            let resp = c.send.send_request(get_req(&path)).await.unwrap();
            if text(resp).await == "slow" {
                ok.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // and 64 slow streams on one HTTP/2 connection
    let c2 = h2(addr).await;
    for _ in 0..64 {
        let ok = ok.clone();
        let mut send = c2.send.clone();
        tasks.push(tokio::spawn(async move {
            let path = format!("/slow/{}", D.as_millis() * 2);
            let resp = send.send_request(get_req(&path)).await.unwrap();
            if text(resp).await == "slow" {
                ok.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(ok.load(Ordering::Relaxed), 128);
}

/// A handler that panics (HTTP/1): the connection is not left open and busy forever, and the
/// server goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_a_panicking_handler_does_not_leave_the_connection_open() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = Raw::connect(addr).await;
    c.get("/panic").await;
    assert!(
        c.closed_within(D + SLACK).await.is_some(),
        "the connection of a panicked handler stayed open"
    );
    let mut again = h1(addr).await;
    let resp = again.send.send_request(get_req("/fast")).await.unwrap();
    assert_eq!(text(resp).await, "fast");
}

/// A HEAD on an endless streamed route: the body is never sent, so it must not keep the
/// connection busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_request_on_an_endless_stream_leaves_the_connection_idle() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = Raw::connect(addr).await;
    c.send(b"HEAD /endless HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let resp = c.response(true).await;
    let quiet = Instant::now();
    assert_eq!(resp.status, 200);
    c.assert_closes_idle(quiet, D, "after HEAD").await;
}

/// A 204 whose body is an endless stream: HTTP forbids sending it; it must not keep the
/// connection busy forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_content_response_with_an_endless_body_leaves_the_connection_idle() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = Raw::connect(addr).await;
    c.get("/no-content-with-body").await;
    let resp = c.response(true).await;
    let quiet = Instant::now();
    assert_eq!(resp.status, 204);
    c.assert_closes_idle(quiet, D, "after 204").await;
}

/// ConnectInfo<SocketAddr> is the client socket's local address, for HTTP/1.1 and HTTP/2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_info_is_the_client_address_for_both_protocols() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c1 = h1(addr).await;
    let resp = c1.send.send_request(get_req("/peer")).await.unwrap();
    assert_eq!(text(resp).await, c1.local.to_string());
    let mut c2 = h2(addr).await;
    for _ in 0..3 {
        let resp = c2.send.send_request(get_req("/peer")).await.unwrap();
        assert_eq!(text(resp).await, c2.local.to_string());
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP/2 (h2c prior knowledge)

/// One long stream (4·d) keeps the connection while short ones come and go; d after it ends
/// the connection closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_a_long_stream_keeps_the_connection_while_short_ones_come_and_go() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = h2(addr).await;
    let mut send = c.send.clone();
    let long = tokio::spawn(async move {
        let path = format!("/slow/{}", D.as_millis() * 4);
        let resp = send.send_request(get_req(&path)).await.unwrap();
        let body = text(resp).await;
        (body, Instant::now())
    });
    let resp = c.send.send_request(get_req("/fast")).await.unwrap();
    assert_eq!(text(resp).await, "fast");
    sleep(D * 2).await;
    let resp = c.send.send_request(get_req("/fast")).await.unwrap();
    assert_eq!(text(resp).await, "fast");
    let (body, quiet) = long.await.unwrap();
    assert_eq!(body, "slow");
    c.assert_closes_idle(quiet, D, "h2 after the long stream")
        .await;
}

/// Two overlapping slow streams: the countdown restarts only when the last one ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_the_countdown_restarts_when_the_last_stream_ends() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = h2(addr).await;
    let mut a = c.send.clone();
    let mut b = c.send.clone();
    let first = tokio::spawn(async move {
        let path = format!("/slow/{}", D.as_millis() * 2);
        text(a.send_request(get_req(&path)).await.unwrap()).await
    });
    let second = tokio::spawn(async move {
        let path = format!("/slow/{}", D.as_millis() * 4);
        let body = text(b.send_request(get_req(&path)).await.unwrap()).await;
        (body, Instant::now())
    });
    assert_eq!(first.await.unwrap(), "slow");
    let (body, quiet) = second.await.unwrap();
    assert_eq!(body, "slow");
    c.assert_closes_idle(quiet, D, "h2 two streams").await;
}

/// A slow HTTP/2 upload (chunks 2·d apart) is never cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_a_slow_upload_is_never_cut() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = h2(addr).await;
    let (tx, rx) = futures::channel::mpsc::channel::<Bytes>(4);
    let body = BodyExt::boxed(StreamBody::new(
        rx.map(|b| Ok::<_, io::Error>(Frame::data(b))),
    ));
    let req = Request::post("/upload")
        .header("host", "x")
        .body(body)
        .unwrap();
    let feeder = tokio::spawn(async move {
        let mut tx = tx;
        for _ in 0..4 {
            futures::SinkExt::send(&mut tx, Bytes::from(vec![b'u'; 1000]))
                .await
                .unwrap();
            sleep(D * 2).await;
        }
    });
    let resp = c.send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(text(resp).await, "4000");
    feeder.await.unwrap();
}

/// A handler that panics on an HTTP/2 stream: the stream fails, the connection lives, and its
/// busy count is released: d later it closes as idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_a_panicking_handler_releases_the_connection() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = h2(addr).await;
    let failed = c.send.send_request(get_req("/panic")).await;
    assert!(failed.is_err(), "the panicked stream answered");
    let resp = c.send.send_request(get_req("/fast")).await.unwrap();
    assert_eq!(text(resp).await, "fast");
    let quiet = Instant::now();
    c.assert_closes_idle(quiet, D, "h2 after a panic").await;
}

/// A body that panics mid-stream on HTTP/2: the same, the busy count is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_a_body_panicking_mid_stream_releases_the_connection() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = h2(addr).await;
    let resp = c
        .send
        .send_request(get_req("/panic-in-body"))
        .await
        .unwrap();
    assert!(resp.into_body().collect().await.is_err());
    let quiet = Instant::now();
    c.assert_closes_idle(quiet, D, "h2 after a body panic")
        .await;
}

/// A body that errors mid-stream on HTTP/2: the stream is reset, the busy count released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_a_body_error_mid_stream_releases_the_connection() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = h2(addr).await;
    // the reset may reach the client before or after the response head
    if let Ok(resp) = c.send.send_request(get_req("/error-in-body")).await {
        assert!(resp.into_body().collect().await.is_err());
    }
    let quiet = Instant::now();
    c.assert_closes_idle(quiet, D, "h2 after a body error")
        .await;
}

/// The client drops an endless response body mid-stream (RST_STREAM): the server drops the
/// body, so the connection is no longer busy and closes d later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_a_response_dropped_by_the_client_releases_the_connection() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = h2(addr).await;
    let resp = c.send.send_request(get_req("/endless")).await.unwrap();
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    drop(body);
    let quiet = Instant::now();
    c.assert_closes_idle(quiet, D, "h2 after the drop").await;
}

/// The client cancels a request while its handler still runs (60 s): the handler's future is
/// dropped by hyper, so the connection is idle and closes d later, not after 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_a_request_cancelled_mid_handler_releases_the_connection() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = h2(addr).await;
    let pending = c.send.send_request(get_req("/slow/60000"));
    assert!(timeout(ms(100), pending).await.is_err());
    let quiet = Instant::now();
    c.assert_closes_idle(quiet, D, "h2 after a cancel").await;
}

/// HTTP/2 keep-alive pings under d are traffic: an idle connection stays open for 5·d.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_pings_under_d_keep_an_idle_connection_open() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, D).await;
    let mut c = h2_with(addr, Some(D / 3)).await;
    sleep(D * 5).await;
    assert!(!c.is_closed(), "closed although pinged every d/3");
    let resp = c.send.send_request(get_req("/fast")).await.unwrap();
    assert_eq!(text(resp).await, "fast");
}

// ---------------------------------------------------------------------------------------------
// shutdown and edge timeouts

/// `with_graceful_shutdown` while a slow request is in flight: the response arrives whole, an
/// idle connection is closed, and `serve` returns after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_the_requests_in_flight() {
    let wheel = Wheel::new();
    let (tcp, addr) = bind().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let listener = IdleListener::new(tcp, &wheel, Duration::from_secs(30));
    let server = tokio::spawn(async move {
        axum::serve(listener, busy_aware(app()))
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    let mut idle = h1(addr).await;
    let resp = idle.send.send_request(get_req("/fast")).await.unwrap();
    assert_eq!(text(resp).await, "fast");
    let H {
        mut send,
        closed: busy_closed,
        ..
    } = h1(addr).await;
    let slow = tokio::spawn(async move {
        let path = format!("/slow/{}", D.as_millis() * 3);
        let resp = send.send_request(get_req(&path)).await.unwrap();
        text(resp).await
    });
    let mut stream2 = h2(addr).await;
    let mut send2 = stream2.send.clone();
    let stream = tokio::spawn(async move {
        let resp = send2.send_request(get_req("/stream")).await.unwrap();
        text(resp).await.len()
    });
    sleep(D).await;
    stop.send(()).unwrap();
    assert!(
        idle.closed_within(SLACK).await.is_some(),
        "an idle connection stayed open through graceful shutdown"
    );
    assert_eq!(slow.await.unwrap(), "slow");
    assert_eq!(stream.await.unwrap(), 4000);
    assert!(
        timeout(SLACK * 2, server).await.is_ok(),
        "serve did not return"
    );
    assert!(timeout(SLACK, busy_closed).await.is_ok());
    assert!(stream2.closed_within(SLACK).await.is_some());
}

/// `wheel.shutdown()` while HTTP/1.1 requests are in progress (a slow handler, a paused
/// stream): idle connections close at once, busy ones get their whole response and then close;
/// connections accepted after are closed from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wheel_shutdown_mid_request_lets_the_response_finish_then_closes() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, Duration::from_secs(30)).await;
    let mut idle = h1(addr).await;
    let resp = idle.send.send_request(get_req("/fast")).await.unwrap();
    assert_eq!(text(resp).await, "fast");
    let mut busy = Raw::connect(addr).await;
    busy.get(&format!("/slow/{}", D.as_millis() * 3)).await;
    let mut busy2 = h1(addr).await;
    let resp2 = busy2.send.send_request(get_req("/stream"));
    let streamed = tokio::spawn(async move { text(resp2.await.unwrap()).await.len() });
    sleep(D).await;
    wheel.shutdown().await;
    assert!(
        idle.closed_within(SLACK).await.is_some(),
        "an idle connection stayed open after wheel.shutdown()"
    );
    let resp = busy.response(false).await;
    assert_eq!((resp.status, resp.body.as_slice()), (200, &b"slow"[..]));
    assert!(
        busy.closed_within(SLACK).await.is_some(),
        "a busy connection stayed open after its response, wheel shut down"
    );
    assert_eq!(streamed.await.unwrap(), 4000);
    assert!(busy2.closed_within(SLACK).await.is_some());
    let mut late = Raw::connect(addr).await;
    assert!(
        late.closed_within(SLACK).await.is_some(),
        "a connection accepted after wheel.shutdown() stayed open"
    );
}

/// `Duration::ZERO`: a request already waiting in the socket when the server accepts is served
/// (it is in progress from its head on), then the connection closes instead of keeping alive
/// (nginx's `keepalive_timeout 0`).
///
/// Finding: the connection is closed before any response byte, even for `/fast` and a 22-byte
/// request fully buffered before the accept (with a 1 ms timeout the same request is served).
/// The same happens with plain hyper `http1` + `IdleIo` + `BusyLayer`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_timeout_serves_a_ready_request_then_ends_keep_alive() {
    let wheel = Wheel::new();
    let (tcp, addr) = bind().await;
    let mut c = Raw::connect(addr).await;
    c.get("/fast").await;
    sleep(ms(50)).await; // the request is in the socket before the server accepts
    serve_on(tcp, &wheel, Duration::ZERO);
    let resp = c.response(false).await;
    assert_eq!((resp.status, resp.body.as_slice()), (200, &b"fast"[..]));
    assert!(
        c.closed_within(SLACK).await.is_some(),
        "a zero timeout kept the connection alive"
    );
}

/// `Duration::MAX`: no overflow, no panic, never closed for idleness; a wheel shutdown closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_max_timeout_never_closes_and_a_wheel_shutdown_does() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, Duration::MAX).await;
    let mut c = h1(addr).await;
    let resp = c.send.send_request(get_req("/fast")).await.unwrap();
    assert_eq!(text(resp).await, "fast");
    let mut raw = Raw::connect(addr).await;
    assert!(raw.still_open_after(ms(1200)).await);
    assert!(!c.is_closed());
    let resp = c.send.send_request(get_req("/fast")).await.unwrap();
    assert_eq!(text(resp).await, "fast");
    wheel.shutdown().await;
    assert!(c.closed_within(SLACK).await.is_some());
    assert!(raw.closed_within(SLACK).await.is_some());
}

/// `Duration::ZERO`, the part that holds: a connection with no request is closed at once (no
/// keep-alive), and nothing panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_timeout_closes_a_silent_connection() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, Duration::ZERO).await;
    let mut c = Raw::connect(addr).await;
    assert!(c.closed_within(SLACK).await.is_some());
    let mut again = Raw::connect(addr).await;
    assert!(again.closed_within(SLACK).await.is_some());
}

/// `wheel.shutdown()` while an HTTP/2 connection has a stream in progress: the connection is
/// busy, so it must stay open until that response ends, then close.
///
/// Finding: the stream fails with `BrokenPipe` ("stream closed because of a broken pipe"): the
/// busy HTTP/2 connection is cut by the shutdown, for a slow handler and for a paused stream
/// alike (HTTP/1.1 in the same situation is not cut: the test above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_wheel_shutdown_mid_request_lets_the_response_finish() {
    let wheel = Wheel::new();
    let addr = serve(&wheel, Duration::from_secs(30)).await;
    let mut c = h2(addr).await;
    let mut a = c.send.clone();
    let mut b = c.send.clone();
    let slow = tokio::spawn(async move {
        let path = format!("/slow/{}", D.as_millis() * 3);
        let resp = a.send_request(get_req(&path)).await.unwrap();
        text(resp).await
    });
    let streamed = tokio::spawn(async move {
        let resp = b.send_request(get_req("/stream")).await.unwrap();
        text(resp).await.len()
    });
    sleep(D).await;
    wheel.shutdown().await;
    assert_eq!(slow.await.unwrap(), "slow");
    assert_eq!(streamed.await.unwrap(), 4000);
    assert!(c.closed_within(SLACK).await.is_some());
}
