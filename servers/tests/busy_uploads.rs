//! A request whose body is still coming in after its response was sent holds its connection
//! (API.md §5a: "an HTTP/2 connection is idle when it has no open stream and no byte has moved
//! for `d`"). Found by an outside attack: the handler answers at once and hands the body to a
//! task that goes on reading it, the client pauses its upload longer than the idle timeout, and
//! the connection used to be cut with the HTTP/2 stream still open.
//!
//! Real sockets and real time: each test pauses an upload for 1 s under a 300 ms idle timeout.
//! A slow machine can only make the pause longer, which the promise covers just the same.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use futures::SinkExt;
use futures::channel::mpsc;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::client::conn::{http1, http2};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_wheel::Wheel;
use tokio_wheel::axum::{IdleListener, busy_aware};
use tokio_wheel::hyper::IdleIo;
use tokio_wheel::tower::BusyLayer;

const IDLE: Duration = Duration::from_millis(300);
const PAUSE: Duration = Duration::from_secs(1);
/// Bounds every wait that must end (a hang is a failure, not a timing fact).
const GUARD: Duration = Duration::from_secs(30);

/// Where a handler leaves the count of request-body bytes its background reader got.
type Read = Arc<Mutex<Option<oneshot::Receiver<usize>>>>;

/// Counts `body`'s bytes on a task of its own, into `read`.
fn read_later<B>(body: B, read: &Read)
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
{
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let mut body = body;
        let mut bytes = 0;
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                bytes += data.len();
            }
        }
        let _ = tx.send(bytes);
    });
    *read.lock().unwrap() = Some(rx);
}

/// An axum server on `IdleListener` + `busy_aware` whose `/upload` answers at once and reads
/// its request body later.
async fn axum_server(wheel: &Wheel, read: &Read) -> std::net::SocketAddr {
    let read = read.clone();
    let app = Router::new().route(
        "/upload",
        post(move |body: Body| {
            read_later(body, &read);
            async { "accepted" }
        }),
    );
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let listener = IdleListener::new(tcp, wheel, IDLE);
    tokio::spawn(axum::serve(listener, busy_aware(app)).into_future());
    addr
}

/// A plain hyper server (auto builder: HTTP/1.1 and h2c) on one accepted connection, with
/// `BusyLayer::new(..).with_request_bodies()`.
async fn hyper_server(wheel: &Wheel, read: &Read) -> std::net::SocketAddr {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let (wheel, read) = (wheel.clone(), read.clone());
    tokio::spawn(async move {
        let (stream, _) = tcp.accept().await.unwrap();
        let io = IdleIo::new(stream, &wheel, IDLE);
        let upload = tower::service_fn(move |request: Request<_>| {
            let body: tokio_wheel::tower::BusyBody<Incoming> = request.into_body();
            read_later(body, &read);
            async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("accepted")))) }
        });
        let svc = tower::ServiceBuilder::new()
            .layer(BusyLayer::new(io.handle()).with_request_bodies())
            .service(upload);
        let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(io), TowerToHyperService::new(svc))
            .await;
    });
    addr
}

type Upload = mpsc::Sender<Result<Frame<Bytes>, Infallible>>;

/// Which HTTP the client speaks.
#[derive(Clone, Copy)]
enum Http {
    One,
    /// h2c with prior knowledge.
    Two,
}

/// A client connection to `addr` with one upload under way, its response read whole: the
/// upload's sender, the client's request sender (dropping it closes the client's side), and
/// the connection's task, which ends when the server closes the connection.
async fn upload_client(
    addr: std::net::SocketAddr,
    http: Http,
) -> (Upload, Box<dyn Send>, JoinHandle<()>) {
    let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
    let (mut upload, frames) = mpsc::channel(4);
    let first = Ok(Frame::data(Bytes::from("first;")));
    upload.send(first).await.unwrap();
    let request = Request::post("http://test/upload")
        .body(StreamBody::new(frames))
        .unwrap();
    let (response, sender, connection): (_, Box<dyn Send>, _) = match http {
        Http::One => {
            let (mut send, connection) = http1::handshake(io).await.unwrap();
            let connection = tokio::spawn(async move { drop(connection.await) });
            (send.send_request(request).await, Box::new(send), connection)
        }
        Http::Two => {
            let executor = TokioExecutor::new();
            let (mut send, connection) = http2::handshake(executor, io).await.unwrap();
            let connection = tokio::spawn(async move { drop(connection.await) });
            (send.send_request(request).await, Box::new(send), connection)
        }
    };
    let body = response.unwrap().into_body().collect().await.unwrap();
    let body = body.to_bytes();
    assert_eq!(
        &body[..],
        b"accepted",
        "the response comes before the upload ends"
    );
    (upload, sender, connection)
}

/// Sends two more chunks, each after a pause longer than the idle timeout, checking the
/// connection is still open before each; then ends the upload and returns the bytes sent.
async fn pause_and_finish(mut upload: Upload, connection: &JoinHandle<()>) -> usize {
    let mut sent = "first;".len();
    for i in 0..2 {
        tokio::time::sleep(PAUSE).await;
        assert!(
            !connection.is_finished(),
            "the connection was closed as idle during pause {i}, its request stream still open"
        );
        let chunk = Bytes::from(format!("more{i};"));
        sent += chunk.len();
        upload.send(Ok(Frame::data(chunk))).await.unwrap();
    }
    drop(upload);
    sent
}

async fn bytes_read(read: &Read) -> usize {
    let rx = read.lock().unwrap().take().expect("the handler ran");
    tokio::time::timeout(GUARD, rx)
        .await
        .expect("the reader should have seen the upload end")
        .expect("the reader finished")
}

/// An h2c upload to `addr` paused twice past the idle timeout arrives whole, and the
/// connection, idle once it ended, is then closed by itself.
async fn h2_upload_is_held_then_let_go(addr: std::net::SocketAddr, read: &Read) {
    let (upload, _client, connection) = upload_client(addr, Http::Two).await;
    let sent = pause_and_finish(upload, &connection).await;
    assert_eq!(
        bytes_read(read).await,
        sent,
        "every byte of the upload arrived"
    );
    tokio::time::timeout(GUARD, connection)
        .await
        .expect("an idle connection is closed once its upload ended")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_h2_upload_read_after_its_response_holds_the_connection() {
    let wheel = Wheel::new();
    let read = Read::default();
    let addr = axum_server(&wheel, &read).await;
    h2_upload_is_held_then_let_go(addr, &read).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_h2_upload_read_after_its_response_holds_the_connection_with_request_bodies() {
    let wheel = Wheel::new();
    let read = Read::default();
    let addr = hyper_server(&wheel, &read).await;
    h2_upload_is_held_then_let_go(addr, &read).await;
}

/// A request body the handler drops unread lets the connection go idle at once (HTTP/2
/// resets the stream): the guard goes with the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_h2_upload_dropped_unread_lets_the_connection_go_idle() {
    let wheel = Wheel::new();
    let app = Router::new().route("/upload", post(|_: Body| async { "accepted" }));
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let listener = IdleListener::new(tcp, &wheel, IDLE);
    tokio::spawn(axum::serve(listener, busy_aware(app)).into_future());
    let (upload, _client, connection) = upload_client(addr, Http::Two).await;
    tokio::time::timeout(GUARD, connection)
        .await
        .expect("nothing holds the connection once the handler dropped the body")
        .unwrap();
    drop(upload);
}

/// The same over HTTP/1.1: a request whose body the app still reads is in progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_h1_upload_read_after_its_response_holds_the_connection() {
    let wheel = Wheel::new();
    let read = Read::default();
    let addr = axum_server(&wheel, &read).await;
    let (upload, _client, connection) = upload_client(addr, Http::One).await;
    let sent = pause_and_finish(upload, &connection).await;
    assert_eq!(
        bytes_read(&read).await,
        sent,
        "every byte of the upload arrived"
    );
}
