//! A response handed to the connection in full but not yet written holds the connection
//! (API.md §5a: a request holds it busy "until its response body has been sent in full or
//! dropped"). Found by an outside attack: the guard went when the body gave hyper its last
//! frame, so an HTTP/1 client reading slowly (the socket's buffer full) for longer than the
//! idle timeout got a truncated response. The test also checks that the connection, idle
//! once the response is out, is then closed by itself: the guard does go. (The HTTP/2 form,
//! a stream waiting for the client's flow-control window, is not covered: see `BusyBody`.)

use std::convert::Infallible;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_wheel::Wheel;
use tokio_wheel::hyper::IdleIo;
use tokio_wheel::tower::BusyLayer;

/// Bounds every wait that must end (a hang is a failure, not a timing fact).
const GUARD: Duration = Duration::from_secs(30);

/// HTTP/1.1, plain hyper + `IdleIo` + `BusyLayer::new`, in memory under paused time: a
/// 64 KiB + 1 response through a 1 KiB pipe to a client that reads the first bytes, then
/// nothing for three idle timeouts.
#[tokio::test(start_paused = true)]
async fn h1_response_the_client_reads_slowly_holds_the_connection() {
    const SIZE: usize = 64 * 1024 + 1;
    let wheel = Wheel::new();
    let idle = Duration::from_secs(10);
    let (server_side, mut client) = tokio::io::duplex(1024);
    let io = IdleIo::new(server_side, &wheel, idle);
    let big = tower::service_fn(|_: Request<Incoming>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(vec![b'x'; SIZE]))))
    });
    let svc = tower::ServiceBuilder::new()
        .layer(BusyLayer::new(io.handle()))
        .service(big);
    let server = tokio::spawn(
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(io), TowerToHyperService::new(svc)),
    );
    client
        .write_all(b"GET / HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    let mut first = vec![0; 512];
    let mut received = client.read(&mut first).await.unwrap();
    tokio::time::sleep(3 * idle).await;
    // Everything else, until the server closes the connection: idle once the response is
    // written (keep-alive), it is closed by itself.
    let mut rest = Vec::new();
    tokio::time::timeout(GUARD, client.read_to_end(&mut rest))
        .await
        .expect("the connection, idle once the response is out, is closed by itself")
        .unwrap();
    received += rest.len();
    let head = received - SIZE;
    assert!(
        (50..200).contains(&head),
        "{received} bytes arrived: the response was cut before it was written"
    );
    let _ = server.await;
}
