//! Outside attack on §5a: a real axum 0.8 server over loopback with
//! `axum::serve(IdleListener::new(listener, &wheel, d), busy_aware(app))`. Real time: only
//! "not before d" and "eventually (d + 5 s)" are asserted.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use bytes_compat::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_wheel::Wheel;
use tokio_wheel::axum::{IdleListener, busy_aware};

mod bytes_compat {
    pub use hyper::body::Bytes;
}

const D: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_millis(1200); // 4 × D
const EVENTUALLY: Duration = Duration::from_secs(60);

fn app(wheel: Wheel) -> Router {
    let w1 = wheel.clone();
    let w2 = wheel.clone();
    Router::new()
        .route("/fast", get(|| async { "ok" }))
        .route(
            "/slow",
            get(move || {
                let w = w1.clone();
                async move {
                    w.sleep(LONG).await;
                    "done"
                }
            }),
        )
        .route(
            "/slow_tokio",
            get(|| async {
                tokio::time::sleep(LONG).await;
                "done"
            }),
        )
        .route(
            "/stream",
            get(move || {
                let w = w2.clone();
                async move {
                    let s = futures::stream::unfold(0u32, move |i| {
                        let w = w.clone();
                        async move {
                            if i == 3 {
                                return None;
                            }
                            if i > 0 {
                                w.sleep(LONG).await;
                            }
                            Some((
                                Ok::<_, Infallible>(Bytes::from(format!("chunk{i};"))),
                                i + 1,
                            ))
                        }
                    });
                    Body::from_stream(s)
                }
            }),
        )
        .route(
            "/big",
            get(|| async {
                // 32 MiB in 64 KiB chunks, produced lazily
                let s = futures::stream::iter(0..512)
                    .map(|_| Ok::<_, Infallible>(Bytes::from(vec![b'z'; 65536])));
                Body::from_stream(s)
            }),
        )
        .route(
            "/upload",
            post(|body: Body| async move {
                let mut n = 0usize;
                let mut s = body.into_data_stream();
                while let Some(c) = s.next().await {
                    match c {
                        Ok(c) => n += c.len(),
                        Err(e) => return format!("error {e}"),
                    }
                }
                format!("got {n}")
            }),
        )
}

struct Server {
    addr: SocketAddr,
    wheel: Wheel,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

async fn server() -> Server {
    let wheel = Wheel::new();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let listener = IdleListener::new(tcp, &wheel, D);
    let (tx, rx) = oneshot::channel::<()>();
    let app = app(wheel.clone());
    let task = tokio::spawn(async move {
        axum::serve(listener, busy_aware(app))
            .with_graceful_shutdown(async move {
                let _ = rx.await;
            })
            .await
    });
    Server {
        addr,
        wheel,
        stop: Some(tx),
        task,
    }
}

type H1Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// An HTTP/1 client connection; the JoinHandle resolves (with the instant) when the connection ends.
async fn h1(addr: SocketAddr) -> (H1Sender, JoinHandle<(Instant, Result<(), hyper::Error>)>) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let h = tokio::spawn(async move {
        let r = conn.await;
        (Instant::now(), r)
    });
    (sender, h)
}

type H2Sender = hyper::client::conn::http2::SendRequest<Full<Bytes>>;

async fn h2(addr: SocketAddr) -> (H2Sender, JoinHandle<(Instant, Result<(), hyper::Error>)>) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    let h = tokio::spawn(async move {
        let r = conn.await;
        (Instant::now(), r)
    });
    (sender, h)
}

fn req(path: &str) -> hyper::Request<Full<Bytes>> {
    hyper::Request::get(format!("http://localhost{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap()
}

async fn body_string(resp: hyper::Response<hyper::body::Incoming>) -> Result<String, hyper::Error> {
    let b = resp.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8_lossy(&b).into_owned())
}

/// Asserts the connection ends, not before `not_before`, and within EVENTUALLY after it.
async fn assert_closes(
    h: JoinHandle<(Instant, Result<(), hyper::Error>)>,
    not_before: Instant,
    what: &str,
) {
    let (t, _r) = tokio::time::timeout(D + EVENTUALLY, h)
        .await
        .unwrap_or_else(|_| panic!("{what}: never closed"))
        .unwrap();
    assert!(
        t >= not_before,
        "{what}: closed {:?} too early",
        not_before - t
    );
}

/// Keep-alive HTTP/1 connection: closed after d of silence (not before), eventually.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h1_keepalive_idle_closes_after_d() {
    let s = server().await;
    let (mut tx, conn) = h1(s.addr).await;
    let sent = Instant::now();
    let resp = tx.send_request(req("/fast")).await.unwrap();
    assert_eq!(body_string(resp).await.unwrap(), "ok");
    assert_closes(conn, sent + D, "idle h1").await;
}

/// A raw TCP connection that sends nothing: closed not before d, eventually.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_tcp_closed() {
    let s = server().await;
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 16];
    let r = tokio::time::timeout(D + EVENTUALLY, tcp.read(&mut buf))
        .await
        .expect("silent TCP never closed");
    assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    assert!(Instant::now() >= start + D, "closed early");
}

/// A slow handler (4·d on the wheel's sleep) is never cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h1_slow_handler_not_cut() {
    let s = server().await;
    for path in ["/slow", "/slow_tokio"] {
        let (mut tx, conn) = h1(s.addr).await;
        let resp = tx.send_request(req(path)).await.expect("slow request cut");
        assert_eq!(body_string(resp).await.expect("slow body cut"), "done");
        let done = Instant::now();
        assert_closes(conn, done + D - Duration::from_millis(50), path).await;
    }
}

/// A streamed body pausing 4·d between chunks is never cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h1_streamed_body_pausing_not_cut() {
    let s = server().await;
    let (mut tx, conn) = h1(s.addr).await;
    let resp = tx.send_request(req("/stream")).await.unwrap();
    assert_eq!(
        body_string(resp).await.expect("stream cut"),
        "chunk0;chunk1;chunk2;"
    );
    drop(conn);
}

/// A request body uploaded with a pause of 4·d mid-way is never cut (the request is in
/// progress from its head).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h1_upload_pausing_not_cut() {
    let s = server().await;
    let tcp = TcpStream::connect(s.addr).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake::<
        _,
        StreamBody<futures::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>>,
    >(TokioIo::new(tcp))
    .await
    .unwrap();
    let connh = tokio::spawn(conn);
    let st = futures::stream::unfold(0u32, |i| async move {
        if i == 3 {
            return None;
        }
        if i > 0 {
            tokio::time::sleep(LONG).await;
        }
        Some((
            Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'u'; 1000]))),
            i + 1,
        ))
    })
    .boxed();
    let r = hyper::Request::post("http://localhost/upload")
        .body(StreamBody::new(st))
        .unwrap();
    let resp = tx.send_request(r).await.expect("upload cut");
    let b = resp
        .into_body()
        .collect()
        .await
        .expect("upload response cut")
        .to_bytes();
    assert_eq!(&b[..], b"got 3000");
    drop(connh);
}

/// A large lazily-produced body, the client stops reading for 4·d mid-way: the body has not been
/// sent in full, so the request is in progress and must not be cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h1_slow_reader_of_streamed_body_not_cut() {
    let s = server().await;
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut total = 0usize;
    let mut buf = vec![0u8; 65536];
    let mut paused = false;
    loop {
        let n = match tokio::time::timeout(EVENTUALLY, tcp.read(&mut buf))
            .await
            .expect("stalled")
        {
            Ok(n) => n,
            Err(e) => panic!("read error after {total} bytes: {e}"),
        };
        if n == 0 {
            break;
        }
        total += n;
        if !paused && total > 1 << 20 {
            paused = true;
            tokio::time::sleep(LONG).await;
        }
        if total >= 32 * 1024 * 1024 {
            break;
        }
    }
    // head + chunked framing; the data alone is 32 MiB
    assert!(
        total >= 32 * 1024 * 1024,
        "connection ended after {total} bytes of 32 MiB (cut while a body was in progress)"
    );
}

/// h2c prior knowledge: a slow handler and a pausing stream are never cut; then idle closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_long_requests_not_cut() {
    let s = server().await;
    let (mut tx, conn) = h2(s.addr).await;
    let a = tx.send_request(req("/slow"));
    let mut tx2 = tx.clone();
    let b = async move {
        let resp = tx2.send_request(req("/stream")).await?;
        body_string(resp).await
    };
    let (ra, rb) = tokio::join!(a, b);
    let ra = ra.expect("h2 slow cut");
    assert_eq!(body_string(ra).await.expect("h2 slow body cut"), "done");
    assert_eq!(rb.expect("h2 stream cut"), "chunk0;chunk1;chunk2;");
    let done = Instant::now();
    drop(tx);
    let _ = done;
    drop(conn);
}

/// h2c: a fast stream finishes, a slow stream stays open: the connection must not close when
/// the fast one ends (an open stream remains).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_one_open_stream_keeps_connection() {
    let s = server().await;
    let (mut tx, conn) = h2(s.addr).await;
    let mut tx2 = tx.clone();
    let slow = tokio::spawn(async move {
        let resp = tx2.send_request(req("/slow")).await?;
        body_string(resp).await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..3 {
        let r = tx.send_request(req("/fast")).await.unwrap();
        assert_eq!(body_string(r).await.unwrap(), "ok");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(slow.await.unwrap().expect("slow h2 stream cut"), "done");
    let done = Instant::now();
    assert_closes(
        conn,
        done + D - Duration::from_millis(50),
        "h2 idle after slow",
    )
    .await;
}

/// h2c idle: closes not before d after the last request, eventually.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_idle_closes() {
    let s = server().await;
    let (mut tx, conn) = h2(s.addr).await;
    let sent = Instant::now();
    let r = tx.send_request(req("/fast")).await.unwrap();
    assert_eq!(body_string(r).await.unwrap(), "ok");
    assert_closes(conn, sent + D, "h2 idle").await;
}

/// Many concurrent keep-alive clients, some slow, some idle: slow ones are all served, idle
/// ones all closed eventually and not early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_mixed() {
    let s = server().await;
    let mut hs = Vec::new();
    for i in 0..200 {
        let addr = s.addr;
        hs.push(tokio::spawn(async move {
            let (mut tx, conn) = h1(addr).await;
            let sent = Instant::now();
            let path = if i % 4 == 0 {
                "/slow"
            } else if i % 4 == 1 {
                "/stream"
            } else {
                "/fast"
            };
            let resp = tx
                .send_request(req(path))
                .await
                .unwrap_or_else(|e| panic!("{path} {i}: {e}"));
            let body = body_string(resp)
                .await
                .unwrap_or_else(|e| panic!("{path} {i} body: {e}"));
            assert!(
                body == "ok" || body == "done" || body == "chunk0;chunk1;chunk2;",
                "{body}"
            );
            assert_closes(conn, sent + D, path).await;
        }));
    }
    for h in hs {
        h.await.unwrap();
    }
}

/// Graceful shutdown with a slow request in flight: the request completes, idle connections
/// close, and serve returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_with_slow_request() {
    let mut s = server().await;
    let (mut tx_idle, idle_conn) = h1(s.addr).await;
    let r = tx_idle.send_request(req("/fast")).await.unwrap();
    assert_eq!(body_string(r).await.unwrap(), "ok");
    let (mut tx, _conn) = h1(s.addr).await;
    let slow = tokio::spawn(async move {
        let resp = tx.send_request(req("/slow")).await?;
        body_string(resp).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.stop.take().unwrap().send(()).unwrap();
    assert_eq!(
        slow.await.unwrap().expect("slow cut by graceful shutdown"),
        "done"
    );
    let _ = tokio::time::timeout(EVENTUALLY, idle_conn)
        .await
        .expect("idle connection not closed by graceful shutdown")
        .unwrap();
    tokio::time::timeout(EVENTUALLY, s.task)
        .await
        .expect("serve did not return")
        .unwrap()
        .unwrap();
}

/// Wheel shutdown: idle connections close at once, a slow request in flight still completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wheel_shutdown_with_server() {
    let s = server().await;
    let (mut tx_idle, idle_conn) = h1(s.addr).await;
    let r = tx_idle.send_request(req("/fast")).await.unwrap();
    assert_eq!(body_string(r).await.unwrap(), "ok");
    let (mut tx, _conn) = h1(s.addr).await;
    let slow = tokio::spawn(async move {
        let resp = tx.send_request(req("/slow_tokio")).await?;
        body_string(resp).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.wheel.shutdown().await;
    let _ = tokio::time::timeout(EVENTUALLY, idle_conn)
        .await
        .expect("idle connection not closed after wheel shutdown")
        .unwrap();
    assert_eq!(
        slow.await
            .unwrap()
            .expect("slow request cut by wheel shutdown"),
        "done"
    );
}
