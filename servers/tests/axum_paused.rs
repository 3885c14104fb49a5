//! The exact timing rules of `axum::serve(IdleListener, busy_aware(app))`, in paused time over
//! in-memory connections (an axum `Listener` of `tokio::io::duplex` pipes): an idle connection
//! closes no earlier than the timeout after its last traffic and no later than one wheel tick
//! after that; a request in progress — slow handler, paused stream, HTTP/1.1 or h2c — holds
//! it open, and the countdown restarts when its response ends. (The same over real sockets:
//! `axum_server.rs`.)

#[path = "support/axum_app.rs"]
mod axum_app;

use std::io;
use std::time::Duration;

use axum::serve::Listener;
use tokio::io::DuplexStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_wheel::Wheel;
use tokio_wheel::axum::{IdleListener, busy_aware};

use axum_app::{Client, Http, app};

const IDLE: Duration = Duration::from_secs(10);
/// The wheel's default tick: how late a close may be.
const TICK: Duration = Duration::from_millis(1);

/// An axum listener of in-memory connections; the address is the connection's number.
struct MemoryListener {
    incoming: mpsc::UnboundedReceiver<DuplexStream>,
    accepted: u32,
}

impl Listener for MemoryListener {
    type Io = DuplexStream;
    type Addr = u32;

    async fn accept(&mut self) -> (DuplexStream, u32) {
        match self.incoming.recv().await {
            Some(io) => {
                self.accepted += 1;
                (io, self.accepted)
            }
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<u32> {
        Ok(0)
    }
}

/// Serves the test app busy-aware behind an `IdleListener` of in-memory connections.
struct Server {
    connect: mpsc::UnboundedSender<DuplexStream>,
}

impl Server {
    fn start(wheel: &Wheel, busy_aware_app: bool) -> Server {
        let (connect, incoming) = mpsc::unbounded_channel();
        let listener = IdleListener::new(
            MemoryListener {
                incoming,
                accepted: 0,
            },
            wheel,
            IDLE,
        );
        if busy_aware_app {
            tokio::spawn(async move { axum::serve(listener, busy_aware(app::<u32>())).await });
        } else {
            tokio::spawn(async move { axum::serve(listener, app::<u32>()).await });
        }
        Server { connect }
    }

    async fn client(&self, http: Http) -> Client {
        let (client, server) = tokio::io::duplex(64 * 1024);
        self.connect.send(server).unwrap();
        Client::connect(client, http).await
    }
}

/// Asserts the connection closes within `[last + IDLE, last + IDLE + TICK]`.
async fn assert_closes_after_idle_from(client: &mut Client, last: Instant, what: &str) {
    let closed = client.closed_at(IDLE * 10).await;
    let after = closed - last;
    assert!(
        after >= IDLE,
        "{what}: closed {after:?} after, before the timeout"
    );
    assert!(
        after <= IDLE + TICK,
        "{what}: closed {after:?} after, more than a tick late"
    );
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_closes_one_timeout_after_its_last_response() {
    let wheel = Wheel::new();
    let server = Server::start(&wheel, true);
    for http in [Http::One, Http::Two] {
        let mut client = server.client(http).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let answer = client.get("/").await.unwrap();
        assert_eq!(answer.body, "ok");
        assert_closes_after_idle_from(&mut client, answer.at, &format!("{http:?}")).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_handler_slower_than_the_timeout_holds_the_connection_and_the_countdown_restarts() {
    let wheel = Wheel::new();
    let server = Server::start(&wheel, true);
    for http in [Http::One, Http::Two] {
        let mut client = server.client(http).await;
        let sent = Instant::now();
        let answer = client.get("/slow/35000").await.unwrap();
        assert_eq!(answer.body, "slow ok");
        assert_eq!(answer.at - sent, Duration::from_secs(35));
        assert_closes_after_idle_from(&mut client, answer.at, &format!("{http:?}")).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_streamed_body_that_pauses_holds_the_connection() {
    let wheel = Wheel::new();
    let server = Server::start(&wheel, true);
    for http in [Http::One, Http::Two] {
        let mut client = server.client(http).await;
        let answer = client.get("/stream/25000").await.unwrap();
        assert_eq!(answer.body, "first;second");
        assert_closes_after_idle_from(&mut client, answer.at, &format!("{http:?}")).await;
    }
}

#[tokio::test(start_paused = true)]
async fn streams_on_one_h2_connection_hold_it_until_the_last_ends() {
    let wheel = Wheel::new();
    let server = Server::start(&wheel, true);
    let mut client = server.client(Http::Two).await;
    // Two streams at once, of 12 s and 27 s: the connection stays open through both, and its
    // countdown starts when the second ends.
    let (first, second) = client.get_both("/slow/12000", "/slow/27000").await;
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(second.at - first.at, Duration::from_secs(15));
    assert_closes_after_idle_from(&mut client, second.at, "h2, two streams").await;
}

#[tokio::test(start_paused = true)]
async fn without_busy_aware_a_slow_handler_is_cut_at_the_timeout() {
    let wheel = Wheel::new();
    let server = Server::start(&wheel, false);
    let mut client = server.client(Http::One).await;
    let sent = Instant::now();
    let cut = client.get("/slow/35000").await;
    assert!(cut.is_err(), "not cut: {cut:?}");
    let after = Instant::now() - sent;
    assert!(after >= IDLE && after <= IDLE + TICK, "cut after {after:?}");
}

#[tokio::test(start_paused = true)]
async fn connect_info_carries_the_listener_address() {
    let wheel = Wheel::new();
    let server = Server::start(&wheel, true);
    let mut first = server.client(Http::One).await;
    let mut second = server.client(Http::Two).await;
    assert_eq!(first.get("/peer").await.unwrap().body, "1");
    assert_eq!(second.get("/peer").await.unwrap().body, "2");
}
