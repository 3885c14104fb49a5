//! What the axum tests share: one app with a fast, a slow, a streamed and a peer route, and a
//! hyper client (HTTP/1.1 or h2c) that reports when the server closed its connection.

#![allow(dead_code)] // each test file uses its own part

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Path};
use axum::routing::get;
use futures::StreamExt;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::client::conn::{http1, http2};
use hyper::{Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// `/` answers "ok" at once; `/slow/{ms}` after `ms` milliseconds; `/stream/{ms}` sends
/// "first;", pauses `ms` milliseconds, then "second"; `/peer` answers the peer's address as
/// `ConnectInfo<Addr>` gives it (Debug). Sleeps are tokio's, so a wheel shutdown does not
/// cut them short.
pub fn app<Addr>() -> Router
where
    Addr: std::fmt::Debug + Clone + Send + Sync + 'static,
{
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route(
            "/slow/{ms}",
            get(|Path(ms): Path<u64>| async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                "slow ok"
            }),
        )
        .route(
            "/stream/{ms}",
            get(|Path(ms): Path<u64>| async move { streamed(ms) }),
        )
        .route(
            "/peer",
            get(|ConnectInfo(peer): ConnectInfo<Addr>| async move { format!("{peer:?}") }),
        )
}

fn streamed(pause_ms: u64) -> Body {
    let first = futures::stream::once(async { Ok::<_, Infallible>(Bytes::from("first;")) });
    let second = futures::stream::once(async move {
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        Ok(Bytes::from("second"))
    });
    Body::from_stream(first.chain(second))
}

/// Which HTTP the client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Http {
    One,
    /// h2c with prior knowledge.
    Two,
}

enum Sender {
    One(http1::SendRequest<Empty<Bytes>>),
    Two(http2::SendRequest<Empty<Bytes>>),
}

/// One client connection.
pub struct Client {
    sender: Sender,
    closed: Option<oneshot::Receiver<Instant>>,
}

/// A response, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: String,
    /// When the last byte of the body arrived.
    pub at: Instant,
}

impl Client {
    /// Handshakes on `io`; the connection's task reports when the server closed it.
    pub async fn connect<T>(io: T, http: Http) -> Client
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (tx, closed) = oneshot::channel();
        let io = TokioIo::new(io);
        let sender = match http {
            Http::One => {
                let (sender, connection) = http1::handshake(io).await.unwrap();
                tokio::spawn(async move {
                    let _ = connection.await;
                    let _ = tx.send(Instant::now());
                });
                Sender::One(sender)
            }
            Http::Two => {
                let (sender, connection) =
                    http2::handshake(TokioExecutor::new(), io).await.unwrap();
                tokio::spawn(async move {
                    let _ = connection.await;
                    let _ = tx.send(Instant::now());
                });
                Sender::Two(sender)
            }
        };
        Client {
            sender,
            closed: Some(closed),
        }
    }

    /// `GET path`, the whole body read; an error if the connection broke on the way.
    pub async fn get(&mut self, path: &str) -> Result<Answer, hyper::Error> {
        let request = Request::get(format!("http://test{path}"))
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = match &mut self.sender {
            Sender::One(sender) => {
                sender.ready().await?;
                sender.send_request(request).await?
            }
            Sender::Two(sender) => {
                sender.ready().await?;
                sender.send_request(request).await?
            }
        };
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        Ok(Answer {
            status,
            body: String::from_utf8(body.to_vec()).unwrap(),
            at: Instant::now(),
        })
    }

    /// Two requests at once on one h2c connection (two streams).
    pub async fn get_both(
        &mut self,
        first: &str,
        second: &str,
    ) -> (Result<Answer, hyper::Error>, Result<Answer, hyper::Error>) {
        let Sender::Two(sender) = &self.sender else {
            panic!("two requests at once need h2");
        };
        let mut other = Client {
            sender: Sender::Two(sender.clone()),
            closed: None,
        };
        tokio::join!(self.get(first), other.get(second))
    }

    /// Whether the server has closed the connection (without waiting).
    pub fn is_closed(&mut self) -> bool {
        match self.closed.as_mut() {
            Some(closed) => !matches!(closed.try_recv(), Err(oneshot::error::TryRecvError::Empty)),
            None => true,
        }
    }

    /// Waits until the server closes the connection; when it did. Panics if it does not
    /// within `limit`.
    pub async fn closed_at(&mut self, limit: Duration) -> Instant {
        let closed = self.closed.take().expect("closed_at called twice");
        tokio::time::timeout(limit, closed)
            .await
            .expect("the server should have closed the connection by now")
            .unwrap()
    }
}
