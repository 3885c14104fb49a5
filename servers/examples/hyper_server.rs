//! A hyper server with all three integrations on one wheel, and a built-in client that
//! checks what they do:
//!
//! - `HyperTimer`: hyper's header-read timeout (slowloris defence) fires on the wheel;
//! - `IdleIo`: keep-alive connections with no traffic (and no request in progress) close;
//! - `tower::TimeoutLayer`: a slow handler is answered 504 when the request deadline passes.
//!
//! Run: `cargo run --release -p tokio-wheel-servers --example hyper_server [-- --quick]`.
//! The server listens on an ephemeral port of 127.0.0.1; the program exits once its client
//! has checked every outcome (non-zero if one is wrong).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_wheel::hyper::{HyperTimer, IdleHandle, IdleIo};
use tokio_wheel::tower::{BoxError, TimeoutLayer};
use tokio_wheel::{Elapsed, Wheel};
use tower::ServiceBuilder;

/// The server's three timeouts.
#[derive(Clone, Copy)]
struct Limits {
    header_read: Duration,
    idle: Duration,
    request: Duration,
}

/// `/hello` answers at once; `/work/<ms>` works `ms` milliseconds first, holding its
/// connection busy so the idle timeout leaves it alone (the request timeout still applies).
async fn handle(
    request: Request<Incoming>,
    idle: IdleHandle,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path();
    if let Some(ms) = path.strip_prefix("/work/") {
        let _busy = idle.busy();
        let ms = ms.parse().unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        return Ok(Response::new(Full::new(Bytes::from("worked"))));
    }
    Ok(Response::new(Full::new(Bytes::from("hello"))))
}

/// A timed-out request becomes a 504; other errors end the connection.
fn gateway_timeout(
    result: Result<Response<Full<Bytes>>, BoxError>,
) -> Result<Response<Full<Bytes>>, BoxError> {
    match result {
        Err(error) if error.is::<Elapsed>() => {
            let mut response = Response::new(Full::new(Bytes::from("request timed out")));
            *response.status_mut() = StatusCode::GATEWAY_TIMEOUT;
            Ok(response)
        }
        other => other,
    }
}

async fn serve(listener: TcpListener, wheel: Wheel, limits: Limits) {
    let timer = HyperTimer::new(&wheel);
    let deadline = TimeoutLayer::new(&wheel, limits.request);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let io = IdleIo::new(stream, &wheel, limits.idle);
        let idle = io.handle();
        let service = ServiceBuilder::new()
            .map_result(gateway_timeout)
            .layer(deadline.clone())
            .service_fn(move |request| handle(request, idle.clone()));
        let connection = http1::Builder::new()
            .timer(timer.clone())
            .header_read_timeout(limits.header_read)
            .serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
        tokio::spawn(connection);
    }
}

/// One keep-alive client connection.
struct Client {
    send: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    closed: tokio::task::JoinHandle<Instant>,
    addr: SocketAddr,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        let closed = tokio::spawn(async move {
            let _ = connection.await;
            Instant::now()
        });
        Client { send, closed, addr }
    }

    async fn get(&mut self, path: &str) -> (StatusCode, String) {
        let request = Request::get(format!("http://{}{path}", self.addr))
            .body(Empty::new())
            .unwrap();
        self.send.ready().await.expect("connection ready");
        let response = self.send.send_request(request).await.expect("request");
        let status = response.status();
        let body = response.into_body().collect().await.expect("body");
        (
            status,
            String::from_utf8_lossy(&body.to_bytes()).into_owned(),
        )
    }
}

fn check(what: &str, ok: bool, detail: String) {
    println!("{} {what}: {detail}", if ok { "ok  " } else { "FAIL" });
    assert!(ok, "{what}: {detail}");
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let limits = if quick {
        Limits {
            header_read: Duration::from_secs(1),
            idle: Duration::from_millis(250),
            request: Duration::from_millis(200),
        }
    } else {
        Limits {
            header_read: Duration::from_secs(4),
            idle: Duration::from_secs(2),
            request: Duration::from_secs(1),
        }
    };
    // hyper also runs its header-read timeout while a keep-alive connection waits for its
    // next request: keep it longer than the idle timeout, or it closes idle connections first.
    let wheel = Wheel::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    println!("serving on http://{addr}");
    tokio::spawn(serve(listener, wheel.clone(), limits));

    // 1. A plain request, and work within the deadline.
    let mut client = Client::connect(addr).await;
    let (status, body) = client.get("/hello").await;
    check(
        "hello",
        status == StatusCode::OK,
        format!("{status} {body}"),
    );
    let work = limits.request / 2;
    let (status, body) = client.get(&format!("/work/{}", work.as_millis())).await;
    check(
        "work in time",
        status == StatusCode::OK,
        format!("{status} {body}"),
    );

    // 2. The tower layer: a handler slower than the request deadline gets a 504.
    let start = Instant::now();
    let slow = limits.request * 3;
    let (status, body) = client.get(&format!("/work/{}", slow.as_millis())).await;
    let took = start.elapsed();
    check(
        "request deadline (tower TimeoutLayer)",
        status == StatusCode::GATEWAY_TIMEOUT && took >= limits.request && took < slow,
        format!("{status} {body:?} after {took:?}"),
    );

    // 3. IdleIo: the keep-alive connection, now silent, is closed after the idle timeout.
    let silent = Instant::now();
    let closed = client.closed.await.unwrap();
    let after = closed - silent;
    check(
        "idle keep-alive connection closed (IdleIo)",
        after >= limits.idle && after < limits.header_read,
        format!("after {after:?} of silence (timeout {:?})", limits.idle),
    );

    // 4. HyperTimer: a slowloris header, a byte at a time, is cut off by hyper's
    //    header-read timeout on the wheel (the trickle keeps the idle timeout away).
    let mut slowloris = TcpStream::connect(addr).await.expect("connect");
    let start = Instant::now();
    slowloris.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let step = limits.header_read / 8;
    let cut_off = loop {
        tokio::time::sleep(step).await;
        if slowloris.write_all(b"x").await.is_err() {
            break start.elapsed();
        }
        let mut probe = [0; 1];
        let read = tokio::time::timeout(Duration::from_millis(1), slowloris.read(&mut probe));
        if let Ok(Ok(0) | Err(_)) = read.await {
            break start.elapsed();
        }
        assert!(start.elapsed() < limits.header_read * 20, "never cut off");
    };
    check(
        "slowloris cut off (HyperTimer header_read_timeout)",
        cut_off >= limits.header_read,
        format!("after {cut_off:?} (timeout {:?})", limits.header_read),
    );

    // 5. Shutdown: idle connections close at once, long before their timeout.
    let mut idle_client = Client::connect(addr).await;
    idle_client.get("/hello").await;
    let stopped = Instant::now();
    wheel.shutdown().await;
    let closed = idle_client.closed.await.unwrap();
    check(
        "idle connection closed at wheel shutdown",
        closed - stopped < limits.idle,
        format!("{:?} after shutdown", closed - stopped),
    );
    println!("all checks passed");
}
