//! axum 0.8 on the wheel, over real loopback sockets: `axum::serve(IdleListener, busy_aware(app))`
//! closes idle keep-alive connections, never cuts a request in progress (slow handler,
//! paused stream, HTTP/2), hands `ConnectInfo`, and shuts down gracefully; `BusyLayer` does
//! the same for a plain hyper connection. (The exact timing rules, in paused time over
//! in-memory connections: `axum_paused.rs`.)
//!
//! Real time: what is asserted tightly is "never before"; "closed after all" waits with a
//! generous limit, for a loaded 2-core CI machine.

#[path = "support/axum_app.rs"]
mod axum_app;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use hyper::StatusCode;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_wheel::Wheel;
use tokio_wheel::axum::{IdleListener, busy_aware};
use tokio_wheel::hyper::IdleIo;
use tokio_wheel::tower::BusyLayer;

use axum_app::{Client, Http, app};

const IDLE: Duration = Duration::from_millis(300);
/// Longer than the idle timeout: what a request in progress must survive.
const LONG_MS: u64 = 750;
/// Generous: a close is expected within the timeout plus this, on a loaded machine.
const SLACK: Duration = Duration::from_secs(3);

/// `axum::serve(IdleListener, busy_aware(app))` on a loopback port, in the background.
async fn serve_busy_aware(wheel: &Wheel) -> SocketAddr {
    serve_busy_aware_idle(wheel, IDLE).await
}

async fn serve_busy_aware_idle(wheel: &Wheel, idle: Duration) -> SocketAddr {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let listener = IdleListener::new(tcp, wheel, idle);
    tokio::spawn(async move {
        axum::serve(listener, busy_aware(app::<SocketAddr>()))
            .await
            .unwrap();
    });
    addr
}

async fn connect(addr: SocketAddr, http: Http) -> Client {
    Client::connect(TcpStream::connect(addr).await.unwrap(), http).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_after_the_timeout_never_before() {
    let wheel = Wheel::new();
    let addr = serve_busy_aware(&wheel).await;
    for http in [Http::One, Http::Two] {
        let mut client = connect(addr, http).await;
        let sent = Instant::now();
        let answer = client.get("/").await.unwrap();
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (StatusCode::OK, "ok")
        );
        let closed = client.closed_at(IDLE + SLACK).await;
        // The server's last traffic came after the request was sent.
        assert!(
            closed - sent >= IDLE,
            "{http:?}: closed {:?} after the request, before the idle timeout",
            closed - sent
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_slower_than_the_timeout_is_never_cut() {
    let wheel = Wheel::new();
    let addr = serve_busy_aware(&wheel).await;
    for http in [Http::One, Http::Two] {
        let mut client = connect(addr, http).await;
        let sent = Instant::now();
        let answer = client
            .get(&format!("/slow/{LONG_MS}"))
            .await
            .unwrap_or_else(|error| panic!("{http:?}: the slow request was cut: {error}"));
        assert_eq!(answer.body, "slow ok");
        // The countdown restarts when the response ends (at least LONG_MS after the request
        // was sent), not when it began.
        let closed = client.closed_at(IDLE + SLACK).await;
        assert!(
            closed - sent >= Duration::from_millis(LONG_MS) + IDLE,
            "{http:?}: closed {:?} after the slow request was sent",
            closed - sent
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_body_that_pauses_is_never_cut() {
    let wheel = Wheel::new();
    let addr = serve_busy_aware(&wheel).await;
    for http in [Http::One, Http::Two] {
        let mut client = connect(addr, http).await;
        let answer = client
            .get(&format!("/stream/{LONG_MS}"))
            .await
            .unwrap_or_else(|error| panic!("{http:?}: the paused stream was cut: {error}"));
        assert_eq!(answer.body, "first;second", "{http:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_busy_aware_a_slow_handler_is_cut() {
    // The control: what `busy_aware` prevents does happen without it, so the tests above
    // would see it.
    let wheel = Wheel::new();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let listener = IdleListener::new(tcp, &wheel, IDLE);
    tokio::spawn(async move { axum::serve(listener, app::<SocketAddr>()).await });
    let mut client = connect(addr, Http::One).await;
    let cut = client.get(&format!("/slow/{LONG_MS}")).await;
    assert!(cut.is_err(), "a plain app was not cut: {cut:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_gets_its_peer_address_as_connect_info() {
    let wheel = Wheel::new();
    let addr = serve_busy_aware(&wheel).await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let local = stream.local_addr().unwrap();
    let mut client = Client::connect(stream, Http::One).await;
    for _ in 0..2 {
        let answer = client.get("/peer").await.unwrap();
        assert_eq!(answer.body, format!("{local:?}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_active_connections_are_never_closed() {
    let wheel = Wheel::new();
    // Longer than the file's IDLE: 300 connections on a loaded 2-core machine may see a
    // request delayed by a few hundred ms, which must not count as silence.
    let idle = Duration::from_millis(1_200);
    let addr = serve_busy_aware_idle(&wheel, idle).await;
    let tasks: Vec<_> = (0..300)
        .map(|i| {
            tokio::spawn(async move {
                let mut client =
                    connect(addr, if i % 2 == 0 { Http::One } else { Http::Two }).await;
                // A request every third of the timeout, for two timeouts.
                for _ in 0..6 {
                    let answer = client.get("/").await.expect("an active connection was cut");
                    assert_eq!(answer.body, "ok");
                    tokio::time::sleep(idle / 3).await;
                }
                assert!(!client.is_closed(), "an active connection was closed");
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_lets_a_request_in_progress_finish() {
    let wheel = Wheel::new();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let listener = IdleListener::new(tcp, &wheel, IDLE);
    let (stop, signal) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, busy_aware(app::<SocketAddr>()))
            .with_graceful_shutdown(async {
                let _ = signal.await;
            })
            .await
    });
    let mut slow = connect(addr, Http::One).await;
    let mut idle = connect(addr, Http::One).await;
    idle.get("/").await.unwrap();
    let request = tokio::spawn(async move { slow.get(&format!("/slow/{LONG_MS}")).await });
    // Long enough for the request to reach the handler on a loaded machine, well inside the
    // handler's LONG_MS.
    tokio::time::sleep(Duration::from_millis(LONG_MS / 2)).await;
    stop.send(()).unwrap();
    let answer = request
        .await
        .unwrap()
        .expect("graceful shutdown cut the request");
    assert_eq!(answer.body, "slow ok");
    tokio::time::timeout(SLACK, server)
        .await
        .expect("axum::serve should return once its connections ended")
        .unwrap()
        .unwrap();
    idle.closed_at(SLACK).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wheel_shutdown_closes_idle_connections_at_once() {
    let wheel = Wheel::new();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    // Far longer than the test: only the shutdown can close it.
    let listener = IdleListener::new(tcp, &wheel, Duration::from_secs(3600));
    tokio::spawn(async move { axum::serve(listener, busy_aware(app::<SocketAddr>())).await });
    let mut client = connect(addr, Http::One).await;
    client.get("/").await.unwrap();
    wheel.shutdown().await;
    client.closed_at(SLACK).await;
}

/// A plain hyper server (hyper-util's auto builder: HTTP/1.1 and h2c) with each connection in
/// an `IdleIo` and the app under `BusyLayer`.
async fn serve_with_busy_layer(wheel: &Wheel) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let wheel = wheel.clone();
    let app: Router = app::<SocketAddr>();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let io = IdleIo::new(stream, &wheel, IDLE);
            let service = tower::ServiceBuilder::new()
                .layer(BusyLayer::new(io.handle()))
                .service(app.clone());
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(io), TowerToHyperService::new(service))
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_layer_keeps_a_plain_hyper_connection_open_while_it_works() {
    let wheel = Wheel::new();
    let addr = serve_with_busy_layer(&wheel).await;
    for http in [Http::One, Http::Two] {
        let mut client = connect(addr, http).await;
        let answer = client
            .get(&format!("/slow/{LONG_MS}"))
            .await
            .unwrap_or_else(|error| panic!("{http:?}: the slow request was cut: {error}"));
        assert_eq!(answer.body, "slow ok");
        let sent = Instant::now();
        let answer = client
            .get(&format!("/stream/{LONG_MS}"))
            .await
            .unwrap_or_else(|error| panic!("{http:?}: the paused stream was cut: {error}"));
        assert_eq!(answer.body, "first;second");
        let closed = client.closed_at(IDLE + SLACK).await;
        assert!(
            closed - sent >= Duration::from_millis(LONG_MS) + IDLE,
            "{http:?}: closed {:?} after the streamed request was sent",
            closed - sent
        );
    }
}
