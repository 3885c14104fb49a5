//! `HyperTimer` once its wheel has stopped: sleeps pending at the stop complete at once (hyper
//! sees its timeouts fire), and sleeps made or reset afterwards keep their deadlines on Tokio's
//! timer. Found by an outside attack: hyper-util's pool idle task re-arms its sleep with
//! `Timer::reset` after every fire; on the stopped wheel that sleep completed at every reset,
//! so the task never yielded and held its (current-thread) runtime for good (API.md: "Nothing
//! created by the wheel ever hangs ... because the wheel stopped").

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::mpsc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Bytes;
use hyper::rt::Timer;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_wheel::Wheel;
use tokio_wheel::hyper::{HyperSleep, HyperTimer};

/// Bounds every wait that must end (a hang is a failure, not a timing fact).
const GUARD: Duration = Duration::from_secs(30);

fn poll_once(sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>) -> Poll<()> {
    sleep
        .as_mut()
        .poll(&mut Context::from_waker(std::task::Waker::noop()))
}

#[tokio::test(start_paused = true)]
async fn after_a_stop_pending_sleeps_fire_and_new_or_reset_ones_keep_their_deadlines() {
    let wheel = Wheel::new();
    let timer = HyperTimer::new(&wheel);
    let mut pending = timer.sleep(Duration::from_secs(10));
    assert_eq!(poll_once(&mut pending), Poll::Pending);
    wheel.shutdown().await;
    assert_eq!(
        poll_once(&mut pending),
        Poll::Ready(()),
        "a sleep pending at the stop completes at once"
    );

    let start = Instant::now();
    let hour = Duration::from_secs(3_600);
    timer.reset(&mut pending, (start + hour).into_std());
    let mut made = timer.sleep(hour);
    let mut until = timer.sleep_until((start + hour).into_std());
    for (what, sleep) in [
        ("reset", &mut pending),
        ("sleep", &mut made),
        ("sleep_until", &mut until),
    ] {
        assert_eq!(poll_once(sleep), Poll::Pending, "{what}: not early");
        let ours = sleep.as_mut().downcast_mut_pin::<HyperSleep>().unwrap();
        assert_eq!(ours.deadline(), start + hour, "{what}");
    }
    tokio::time::sleep(hour).await;
    for sleep in [&mut pending, &mut made, &mut until] {
        assert_eq!(poll_once(sleep), Poll::Ready(()), "fires at its deadline");
    }
}

/// A hyper-util client with the wheel as its pool timer and a connection idle in its pool,
/// then `wheel.shutdown()`, on a current-thread runtime: the runtime goes on.
#[test]
fn a_client_pool_on_a_stopped_wheel_does_not_hold_its_runtime() {
    let (done, finished) = mpsc::channel();
    // Not joined: were the runtime held, its thread would never end.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = tcp.local_addr().unwrap();
            tokio::spawn(async move {
                loop {
                    let (stream, _) = tcp.accept().await.unwrap();
                    let hello = service_fn(|_| async {
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from("hi"))))
                    });
                    let connection = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), hello);
                    tokio::spawn(connection);
                }
            });
            let wheel = Wheel::new();
            let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
                .pool_timer(HyperTimer::new(&wheel))
                .pool_idle_timeout(Duration::from_secs(3_600))
                .build_http::<Empty<Bytes>>();
            let url = format!("http://{addr}/").parse().unwrap();
            let response = client.get(url).await.unwrap();
            response.into_body().collect().await.unwrap();
            // The connection is back in the pool; its idle task has run.
            tokio::task::yield_now().await;
            wheel.shutdown().await;
            // Other tasks still run, and time still passes for them.
            let other = tokio::spawn(async { "polled" });
            tokio::time::sleep(Duration::from_millis(50)).await;
            let answer = other.await.unwrap();
            drop(client);
            done.send(answer).unwrap();
        });
    });
    let answer = finished
        .recv_timeout(GUARD)
        .expect("the runtime was held after the wheel stopped");
    assert_eq!(answer, "polled");
}
