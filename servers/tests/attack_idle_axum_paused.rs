//! Outside attack on §5a under paused time: axum::serve over an in-memory listener (duplex
//! streams) wrapped in IdleListener, with busy_aware(app). Tight bounds: a connection closes in
//! [last traffic + d, last traffic + d + 2 ms], never while a request is in progress.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::DuplexStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_wheel::Wheel;
use tokio_wheel::axum::{IdleListener, busy_aware};

const D: Duration = Duration::from_secs(10);
const SLACK: Duration = Duration::from_millis(2);

struct MemListener(mpsc::UnboundedReceiver<DuplexStream>);

impl axum::serve::Listener for MemListener {
    type Io = DuplexStream;
    type Addr = u32;
    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.0.recv().await {
            Some(s) => (s, 7),
            None => std::future::pending().await,
        }
    }
    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(0)
    }
}

fn app() -> Router {
    Router::new()
        .route("/fast", get(|| async { "ok" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(D * 5).await;
                "done"
            }),
        )
        .route(
            "/stream",
            get(|| async {
                let s = futures::stream::unfold(0u32, |i| async move {
                    if i == 3 {
                        return None;
                    }
                    if i > 0 {
                        tokio::time::sleep(D * 3).await;
                    }
                    Some((Ok::<_, Infallible>(Bytes::from(format!("c{i};"))), i + 1))
                });
                Body::from_stream(s)
            }),
        )
}

fn start(wheel: &Wheel) -> mpsc::UnboundedSender<DuplexStream> {
    let (tx, rx) = mpsc::unbounded_channel();
    let listener = IdleListener::new(MemListener(rx), wheel, D);
    tokio::spawn(async move {
        axum::serve(listener, busy_aware(app())).await.unwrap();
    });
    tx
}

fn req(path: &str) -> hyper::Request<Full<Bytes>> {
    hyper::Request::get(format!("http://x{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap()
}

type Ended = JoinHandle<Instant>;

async fn h1(
    srv: &mpsc::UnboundedSender<DuplexStream>,
) -> (hyper::client::conn::http1::SendRequest<Full<Bytes>>, Ended) {
    let (a, b) = tokio::io::duplex(1 << 16);
    srv.send(a).unwrap();
    let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(b))
        .await
        .unwrap();
    (
        tx,
        tokio::spawn(async move {
            let _ = conn.await;
            Instant::now()
        }),
    )
}

async fn h2(
    srv: &mpsc::UnboundedSender<DuplexStream>,
    ping: Option<Duration>,
) -> (hyper::client::conn::http2::SendRequest<Full<Bytes>>, Ended) {
    let (a, b) = tokio::io::duplex(1 << 16);
    srv.send(a).unwrap();
    let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
    builder.timer(TokioTimer::new());
    if let Some(p) = ping {
        builder
            .keep_alive_interval(p)
            .keep_alive_timeout(Duration::from_secs(3600))
            .keep_alive_while_idle(true);
    }
    let (tx, conn) = builder.handshake(TokioIo::new(b)).await.unwrap();
    (
        tx,
        tokio::spawn(async move {
            let _ = conn.await;
            Instant::now()
        }),
    )
}

async fn text(r: hyper::Response<hyper::body::Incoming>) -> String {
    String::from_utf8_lossy(&r.into_body().collect().await.expect("body cut").to_bytes())
        .into_owned()
}

fn tight(what: &str, closed: Instant, last: Instant) {
    assert!(
        closed >= last + D,
        "{what}: closed EARLY, {:?} after last traffic",
        closed.saturating_duration_since(last)
    );
    assert!(
        closed <= last + D + SLACK,
        "{what}: closed LATE, {:?} after last traffic",
        closed - last
    );
}

#[tokio::test(start_paused = true)]
async fn h1_keepalive_tight() {
    let wheel = Wheel::new();
    let srv = start(&wheel);
    let (mut tx, ended) = h1(&srv).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let r = tx.send_request(req("/fast")).await.unwrap();
    assert_eq!(text(r).await, "ok");
    let last = Instant::now();
    tight("h1 keep-alive", ended.await.unwrap(), last);
}

#[tokio::test(start_paused = true)]
async fn h1_slow_then_tight() {
    let wheel = Wheel::new();
    let srv = start(&wheel);
    let (mut tx, ended) = h1(&srv).await;
    let r = tx.send_request(req("/slow")).await.expect("slow cut");
    assert_eq!(text(r).await, "done");
    let last = Instant::now();
    tight("h1 after slow", ended.await.unwrap(), last);
}

#[tokio::test(start_paused = true)]
async fn h1_stream_then_tight() {
    let wheel = Wheel::new();
    let srv = start(&wheel);
    let (mut tx, ended) = h1(&srv).await;
    let r = tx.send_request(req("/stream")).await.unwrap();
    assert_eq!(text(r).await, "c0;c1;c2;");
    let last = Instant::now();
    tight("h1 after stream", ended.await.unwrap(), last);
}

#[tokio::test(start_paused = true)]
async fn h2_slow_and_stream_then_tight() {
    let wheel = Wheel::new();
    let srv = start(&wheel);
    let (tx, ended) = h2(&srv, None).await;
    let (mut a, mut b) = (tx.clone(), tx.clone());
    let (ra, rb) = tokio::join!(
        async move { text(a.send_request(req("/slow")).await.expect("h2 slow cut")).await },
        async move { text(b.send_request(req("/stream")).await.expect("h2 stream cut")).await },
    );
    assert_eq!(ra, "done");
    assert_eq!(rb, "c0;c1;c2;");
    let last = Instant::now();
    let closed = ended.await.unwrap();
    // HTTP/2: the server may still send/receive control frames right after the last response;
    // never before d after the last response, within d + 2 ms of it.
    tight("h2 after slow+stream", closed, last);
    drop(tx);
}

/// HTTP/2 keep-alive pings more often than d keep an idle HTTP/2 connection open (documented).
#[tokio::test(start_paused = true)]
async fn h2_pings_keep_idle_connection_open() {
    let wheel = Wheel::new();
    let srv = start(&wheel);
    let (mut tx, ended) = h2(&srv, Some(D / 3)).await;
    let r = tx.send_request(req("/fast")).await.unwrap();
    assert_eq!(text(r).await, "ok");
    tokio::time::sleep(D * 20).await;
    assert!(
        !ended.is_finished(),
        "idle HTTP/2 connection with pings every d/3 was closed"
    );
    let r = tx
        .send_request(req("/fast"))
        .await
        .expect("connection kept by pings unusable");
    assert_eq!(text(r).await, "ok");
}

/// Many h1 connections opened at different instants: each closes tightly after its own last
/// response.
#[tokio::test(start_paused = true)]
async fn many_h1_tight() {
    let wheel = Wheel::new();
    let srv = start(&wheel);
    let mut hs = Vec::new();
    for i in 0..300u64 {
        let srv = srv.clone();
        hs.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(i * 37 % 20_000)).await;
            let (mut tx, ended) = h1(&srv).await;
            let path = ["/fast", "/slow", "/stream"][(i % 3) as usize];
            let r = tx.send_request(req(path)).await.unwrap();
            let _ = text(r).await;
            let last = Instant::now();
            let closed = ended.await.unwrap();
            (i, path, closed, last)
        }));
    }
    let mut bad = Vec::new();
    for h in hs {
        let (i, path, closed, last) = h.await.unwrap();
        if closed < last + D || closed > last + D + SLACK {
            bad.push(format!(
                "{i} {path}: {:?} after last",
                closed.checked_duration_since(last)
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{} bad: {:?}",
        bad.len(),
        &bad[..bad.len().min(10)]
    );
}
