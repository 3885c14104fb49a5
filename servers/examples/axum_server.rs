//! An axum 0.8 server with idle timeouts and request deadlines on one wheel, through
//! `axum::serve` itself, and a built-in client that checks what they do:
//!
//! - `IdleListener` + `busy_aware(app)`: a keep-alive connection with no traffic and no
//!   request in progress closes after the idle timeout — but a slow handler, or a streamed
//!   body that pauses, holds its connection open with no handler code;
//! - `tower::TimeoutLayer` under axum's `HandleErrorLayer`: a request stuck past its deadline
//!   is answered 504;
//! - `ConnectInfo`: each request knows its peer;
//! - graceful shutdown: `with_graceful_shutdown` as usual.
//!
//! Run: `cargo run --release -p tokio-wheel-servers --example axum_server [-- --quick]`.
//! It listens on an ephemeral port of 127.0.0.1 and exits once its client has checked every
//! outcome (non-zero if one is wrong). `-- --serve` keeps serving on 127.0.0.1:3000 instead
//! (try `curl -v localhost:3000/report`; Ctrl-C stops it gracefully).

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::error_handling::HandleErrorLayer;
use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{BoxError, Router};
use futures::StreamExt;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_wheel::axum::{IdleListener, busy_aware};
use tokio_wheel::tower::TimeoutLayer;
use tokio_wheel::{Elapsed, Wheel};
use tower::ServiceBuilder;

/// The server's timeouts, and how long its slow routes take.
#[derive(Clone, Copy)]
struct Limits {
    idle: Duration,
    request: Duration,
    /// `/report`'s work and each pause of `/feed`: longer than the idle timeout.
    slow: Duration,
}

fn app(wheel: &Wheel, limits: Limits) -> Router {
    let report = move || async move {
        tokio::time::sleep(limits.slow).await;
        "report ready"
    };
    let feed = move || async move {
        let lines = futures::stream::iter(["line 1\n", "line 2\n", "line 3\n"])
            .enumerate()
            .then(move |(i, line)| async move {
                if i > 0 {
                    tokio::time::sleep(limits.slow).await;
                }
                Ok::<_, std::convert::Infallible>(Bytes::from(line))
            });
        Body::from_stream(lines)
    };
    let stuck = || std::future::pending::<&'static str>();
    let whoami = |ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() };
    Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/report", get(report))
        .route("/feed", get(feed))
        .route("/stuck", get(stuck))
        .route("/whoami", get(whoami))
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|error: BoxError| async move {
                    if error.is::<Elapsed>() {
                        (StatusCode::GATEWAY_TIMEOUT, "request timed out".to_owned())
                    } else {
                        (StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
                    }
                }))
                .layer(TimeoutLayer::new(wheel, limits.request)),
        )
}

/// The whole server: two lines of axum, and a graceful stop.
async fn serve(listener: TcpListener, limits: Limits, stop: oneshot::Receiver<()>) {
    let wheel = Wheel::new();
    let listener = IdleListener::new(listener, &wheel, limits.idle);
    axum::serve(listener, busy_aware(app(&wheel, limits)))
        .with_graceful_shutdown(async {
            let _ = stop.await;
        })
        .await
        .expect("serve");
}

/// One keep-alive client connection; `closed` fires when the server closes it.
struct Client {
    sender: http1::SendRequest<Empty<Bytes>>,
    closed: oneshot::Receiver<Instant>,
    local: SocketAddr,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let local = stream.local_addr().unwrap();
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await.unwrap();
        let (tx, closed) = oneshot::channel();
        tokio::spawn(async move {
            let _ = connection.await;
            let _ = tx.send(Instant::now());
        });
        Client {
            sender,
            closed,
            local,
        }
    }

    async fn get(&mut self, path: &str) -> Result<(StatusCode, String), hyper::Error> {
        self.sender.ready().await?;
        let request = hyper::Request::get(format!("http://example{path}"))
            .body(Empty::new())
            .unwrap();
        let response = self.sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

fn check(ok: bool, what: &str, failures: &mut u32) {
    println!("{} {what}", if ok { "ok  " } else { "FAIL" });
    if !ok {
        *failures += 1;
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|arg| arg == "--quick");
    let scale = if quick { 1 } else { 3 };
    let limits = Limits {
        idle: Duration::from_millis(400 * scale),
        request: Duration::from_millis(2000 * scale),
        slow: Duration::from_millis(1000 * scale),
    };
    if args.iter().any(|arg| arg == "--serve") {
        let listener = TcpListener::bind("127.0.0.1:3000").await.expect("bind");
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            let _ = stop.send(());
        });
        println!("serving on http://127.0.0.1:3000 (/, /report, /feed, /stuck, /whoami)");
        return serve(listener, limits, stopped).await;
    }

    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel();
    let server = tokio::spawn(serve(listener, limits, stopped));
    println!(
        "axum on {addr}: idle timeout {:?}, request deadline {:?}, slow routes {:?}",
        limits.idle, limits.request, limits.slow
    );
    let mut failures = 0;
    let mut client = Client::connect(addr).await;

    let whoami = client.get("/whoami").await;
    check(
        matches!(&whoami, Ok((StatusCode::OK, peer)) if *peer == client.local.to_string()),
        &format!("/whoami answers the client's address ({whoami:?})"),
        &mut failures,
    );

    let started = Instant::now();
    let report = client.get("/report").await;
    check(
        matches!(&report, Ok((StatusCode::OK, body)) if body == "report ready"),
        &format!(
            "/report, slower than the idle timeout, answered on the same connection after {:?} ({report:?})",
            started.elapsed()
        ),
        &mut failures,
    );

    let feed = client.get("/feed").await;
    check(
        matches!(&feed, Ok((StatusCode::OK, body)) if body == "line 1\nline 2\nline 3\n"),
        "/feed, a stream pausing longer than the idle timeout, arrived whole",
        &mut failures,
    );

    let started = Instant::now();
    let stuck = client.get("/stuck").await;
    let waited = started.elapsed();
    check(
        matches!(&stuck, Ok((StatusCode::GATEWAY_TIMEOUT, _))) && waited >= limits.request,
        &format!(
            "/stuck answered 504 after {waited:?} (deadline {:?})",
            limits.request
        ),
        &mut failures,
    );

    let last = Instant::now();
    let closed = tokio::time::timeout(limits.idle * 10, &mut client.closed).await;
    match closed {
        Ok(Ok(at)) => check(
            at - last >= limits.idle,
            &format!(
                "the idle connection was closed {:?} after its last response (timeout {:?})",
                at - last,
                limits.idle
            ),
            &mut failures,
        ),
        _ => check(false, "the idle connection was closed", &mut failures),
    }

    // Graceful shutdown: a request in progress finishes, then axum::serve returns.
    let mut busy = Client::connect(addr).await;
    let request = tokio::spawn(async move { busy.get("/report").await });
    tokio::time::sleep(limits.idle / 4).await;
    let _ = stop.send(());
    let report = request.await.unwrap();
    check(
        matches!(&report, Ok((StatusCode::OK, _))),
        "graceful shutdown let the request in progress finish",
        &mut failures,
    );
    let ended = tokio::time::timeout(limits.idle * 10, server).await;
    check(
        ended.is_ok(),
        "axum::serve returned after the graceful shutdown",
        &mut failures,
    );

    if failures > 0 {
        eprintln!("{failures} check(s) failed");
        std::process::exit(1);
    }
}
