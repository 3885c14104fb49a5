//! Outside attacks on API.md §5: HyperTimer, IdleIo / IdleHandle / Busy (TimeoutLayer: in
//! `attack_tower.rs`). Written from the contract only; a broken promise is kept as
//! `#[ignore = "finding: …"]`.

use std::convert::Infallible;
use std::io::{self, ErrorKind};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::rt::Timer;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;
use tokio_wheel::Wheel;
use tokio_wheel::hyper::{HyperSleep, HyperTimer, IdleIo};
use tokio_wheel::tower::TimeoutLayer;

#[path = "support/attack.rs"]
mod attack;
use attack::*;

// ───────────────────────────────── HyperTimer ────────────────────────────────

#[tokio::test(start_paused = true)]
async fn hyper_reset_our_sleep_earlier_later_and_after_completion() {
    let wheel = Wheel::new();
    let timer = HyperTimer::new(&wheel);
    let start = Instant::now();
    let mut s = timer.sleep(secs(10));
    assert!(poll_once(&mut s).is_pending());
    timer.reset(&mut s, (start + secs(3)).into_std()); // earlier
    assert_eq!(
        s.as_mut()
            .downcast_mut_pin::<HyperSleep>()
            .unwrap()
            .deadline(),
        start + secs(3)
    );
    (&mut s).await;
    assert_eq!(start.elapsed(), secs(3));
    // After completion: re-armed later, pending again, completes then.
    timer.reset(&mut s, (start + secs(20)).into_std());
    assert!(poll_once(&mut s).is_pending(), "re-armed after completion");
    assert!(
        !s.as_mut()
            .downcast_mut_pin::<HyperSleep>()
            .unwrap()
            .is_elapsed()
    );
    (&mut s).await;
    assert_eq!(start.elapsed(), secs(20));
    // Reset to the past: ready on that poll.
    timer.reset(&mut s, start.into_std());
    assert!(poll_once(&mut s).is_ready());
}

/// A foreign sleep (hyper-util's TokioTimer) handed to our reset is replaced by ours.
#[tokio::test(start_paused = true)]
async fn hyper_reset_a_foreign_sleep_replaces_it() {
    let wheel = Wheel::new();
    let timer = HyperTimer::new(&wheel);
    let foreign = TokioTimer::new();
    let start = Instant::now();
    let mut s = foreign.sleep(secs(100));
    assert!(poll_once(&mut s).is_pending());
    timer.reset(&mut s, (start + secs(5)).into_std());
    let ours = s
        .as_mut()
        .downcast_mut_pin::<HyperSleep>()
        .expect("replaced by ours");
    assert_eq!(ours.deadline(), start + secs(5));
    (&mut s).await;
    assert_eq!(start.elapsed(), secs(5));
    // And the other way round: a foreign timer resetting our sleep must not break either.
    let mut s = timer.sleep(secs(100));
    foreign.reset(&mut s, (start + secs(7)).into_std());
    (&mut s).await;
    assert!(start.elapsed() >= secs(7));
}

#[tokio::test(start_paused = true)]
async fn hyper_now_follows_paused_time_and_sleep_until_is_exact() {
    let wheel = Wheel::new();
    let timer = HyperTimer::new(&wheel);
    let a = timer.now();
    assert_eq!(a, Instant::now().into_std());
    tokio::time::advance(secs(3600)).await;
    assert_eq!(timer.now() - a, secs(3600), "paused time drives now()");
    let start = Instant::now();
    timer.sleep_until(timer.now() + secs(10)).await;
    assert_eq!(start.elapsed(), secs(10));
    // In the past: ready on its first poll.
    let mut past = timer.sleep_until(a);
    assert!(poll_once(&mut past).is_ready());
    let mut zero = timer.sleep(Duration::ZERO);
    assert!(poll_once(&mut zero).is_ready());
}

#[tokio::test(start_paused = true)]
async fn hyper_extreme_deadlines_do_not_panic_or_fire_early() {
    let wheel = Wheel::new();
    let timer = HyperTimer::new(&wheel);
    let mut max = timer.sleep(secs(150 * 365 * 86400));
    assert!(poll_once(&mut max).is_pending());
    let far = timer.now() + secs(200 * 365 * 86400);
    let mut s = timer.sleep(secs(1));
    timer.reset(&mut s, far);
    tokio::time::advance(secs(100 * 365 * 86400)).await;
    settle().await;
    assert!(poll_once(&mut max).is_pending(), "a 150-year sleep fired");
    assert!(poll_once(&mut s).is_pending(), "200 years fired at 100");
    // After shutdown a pending sleep completes at once; one re-armed or made afterwards
    // keeps its deadline (on Tokio's timer: see hyper_timer_after_shutdown.rs).
    wheel.shutdown().await;
    assert!(poll_once(&mut max).is_ready());
    timer.reset(&mut s, timer.now() + secs(60));
    let mut fresh = timer.sleep(secs(60));
    assert!(poll_once(&mut s).is_pending(), "re-armed: not early");
    assert!(poll_once(&mut fresh).is_pending(), "made after: not early");
    tokio::time::timeout(secs(61), async {
        (&mut s).await;
        (&mut fresh).await
    })
    .await
    .expect("sleeps re-armed or made after shutdown fire at their deadline");
}

#[test]
fn hyper_sleep_is_send_sync_unpin_and_timer_clone() {
    fn send_sync_unpin<T: Send + Sync + Unpin + 'static>() {}
    fn clone_send_sync<T: Clone + Send + Sync + 'static>() {}
    send_sync_unpin::<HyperSleep>();
    clone_send_sync::<HyperTimer>();
    clone_send_sync::<tokio_wheel::hyper::IdleHandle>();
    clone_send_sync::<TimeoutLayer>();
}

/// A hyper sleep dropped on another thread, after the runtime that made it is gone.
#[test]
fn hyper_sleep_dropped_after_its_runtime() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (timer, mut s) = rt.block_on(async {
        let wheel = Wheel::new();
        let timer = HyperTimer::new(&wheel);
        let mut s = timer.sleep(secs(100));
        assert!(poll_once(&mut s).is_pending());
        (timer, s)
    });
    drop(rt);
    let other = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    other.block_on(async move {
        tokio::time::timeout(secs(5), &mut s)
            .await
            .expect("a sleep from a dead runtime hangs");
        // Re-armed on the dead wheel: on this runtime's own timer, at its deadline.
        timer.reset(&mut s, timer.now() + ms(20));
        tokio::time::timeout(secs(5), &mut s)
            .await
            .expect("re-armed on a dead wheel hangs");
        drop(s);
    });
}

// ─────────────────────────────────── IdleIo ──────────────────────────────────

#[tokio::test(start_paused = true)]
async fn idle_nested_guards_dropped_out_of_order() {
    let wheel = Wheel::new();
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, D);
    let idle = io.handle();
    let start = Instant::now();
    let g1 = idle.busy();
    let g2 = idle.busy();
    let g3 = idle.clone().busy();
    let drops = tokio::spawn(async move {
        tokio::time::sleep(secs(30)).await;
        drop(g2); // middle one first
        tokio::time::sleep(secs(30)).await;
        drop(g1);
        tokio::time::sleep(secs(30)).await;
        drop(g3); // at 90 s: the countdown starts now
    });
    let (e, at) = read_until_error(&mut io).await;
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    assert!(at - start >= secs(90) + D, "closed at {:?}", at - start);
    assert!(
        at - start <= secs(90) + D + 2 * TICK,
        "closed at {:?}",
        at - start
    );
    drops.await.unwrap();
}

/// A guard taken while a read waits, before the timer fires, and held past it.
#[tokio::test(start_paused = true)]
async fn idle_guard_taken_mid_countdown_holds_past_the_timer() {
    let wheel = Wheel::new();
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, D);
    let idle = io.handle();
    let start = Instant::now();
    tokio::spawn(async move {
        tokio::time::sleep(D / 2).await;
        let g = idle.busy();
        tokio::time::sleep(D * 3).await; // held till 35 s
        drop(g);
    });
    let (e, at) = read_until_error(&mut io).await;
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    let released = D / 2 + D * 3;
    assert!(at - start >= released + D, "closed at {:?}", at - start);
    assert!(
        at - start <= released + D + 2 * TICK,
        "closed at {:?}",
        at - start
    );
}

/// Real time: under paused time a guard dropped on a thread outside the runtime reads the real
/// clock (tokio's test-util), which is behind the paused one; production clocks agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_guard_dropped_on_another_thread_wakes_the_read() {
    let d = ms(150);
    let wheel = Wheel::new();
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, d);
    let g = io.handle().busy();
    let start = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let th = std::thread::spawn(move || {
        rx.recv().unwrap();
        let dropped = Instant::now();
        drop(g);
        dropped
    });
    let mut read = Box::pin(read_until_error(&mut io));
    assert!(futures::poll!(&mut read).is_pending());
    tokio::time::sleep(d * 3).await;
    assert!(futures::poll!(&mut read).is_pending(), "closed while busy");
    tx.send(()).unwrap();
    let dropped = th.join().unwrap();
    let (e, at) = tokio::time::timeout(secs(5), read)
        .await
        .expect("the last guard's drop never woke the read");
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    assert!(
        at - dropped >= d,
        "closed {:?} after the guard dropped",
        at - dropped
    );
    assert!(at - start >= d * 4);
}

#[tokio::test(start_paused = true)]
async fn idle_touch_from_another_task_postpones() {
    let wheel = Wheel::new();
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, D);
    let idle = io.handle();
    let start = Instant::now();
    tokio::spawn(async move {
        for _ in 0..5 {
            tokio::time::sleep(D - TICK).await; // just before each deadline
            idle.touch();
        }
    });
    let (e, at) = read_until_error(&mut io).await;
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    let last = (D - TICK) * 5;
    assert!(at - start >= last + D, "closed at {:?}", at - start);
    assert!(at - start <= last + D + 2 * TICK);
}

#[tokio::test(start_paused = true)]
async fn idle_countdown_starts_at_new_even_if_first_read_is_late() {
    let wheel = Wheel::new();
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, D);
    tokio::time::sleep(D * 3).await;
    let start = Instant::now();
    let (e, at) = read_until_error(&mut io).await;
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    assert!(
        at - start <= 2 * TICK,
        "a connection silent since new() waited another {:?}",
        at - start
    );
}

/// A peer that sends exactly at the deadline: no early close, no lost byte silently.
#[tokio::test(start_paused = true)]
async fn idle_peer_sends_exactly_at_the_deadline() {
    for offset_us in [0u64, 1, 500, 999, 1000, 1001] {
        let wheel = Wheel::new();
        let (stream, mut peer) = tokio::io::duplex(64);
        let mut io = IdleIo::new(stream, &wheel, D);
        let start = Instant::now();
        let sent_at = start + D - Duration::from_micros(1000) + Duration::from_micros(offset_us);
        let _keep = tokio::spawn(async move {
            tokio::time::sleep_until(sent_at).await;
            peer.write_all(b"x").await.unwrap();
            tokio::time::sleep(secs(3600)).await; // keep it open
            drop(peer);
        });
        let mut buf = [0u8; 8];
        match io.read(&mut buf).await {
            Ok(n) => {
                assert_eq!(n, 1);
                // Traffic at `sent_at`: the next close is at least D after it.
                let (e, at) = read_until_error(&mut io).await;
                assert_eq!(e.kind(), ErrorKind::TimedOut);
                assert!(
                    at >= sent_at + D,
                    "offset {offset_us}: closed {:?} after the byte",
                    at - sent_at
                );
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::TimedOut);
                assert!(
                    start.elapsed() >= D,
                    "offset {offset_us}: closed early at {:?}",
                    start.elapsed()
                );
                assert!(
                    sent_at >= start + D,
                    "offset {offset_us}: closed although a byte came before D"
                );
            }
        }
    }
}

/// `tokio::io::split`: writes on one half are traffic for a read waiting on the other.
#[tokio::test(start_paused = true)]
async fn idle_split_halves_share_the_countdown() {
    let wheel = Wheel::new();
    let (stream, peer) = tokio::io::duplex(1 << 16);
    let io = IdleIo::new(stream, &wheel, D);
    let (mut rd, mut wr) = tokio::io::split(io);
    let (mut peer_rd, _peer_wr) = tokio::io::split(peer);
    tokio::spawn(async move {
        let mut sink = vec![0u8; 1024];
        loop {
            if peer_rd.read(&mut sink).await.unwrap_or(0) == 0 {
                break;
            }
        }
    });
    let start = Instant::now();
    let writer = tokio::spawn(async move {
        for _ in 0..6 {
            tokio::time::sleep(D / 2).await;
            wr.write_all(b"keepalive").await.unwrap();
        }
        wr // silent from 30 s
    });
    let (e, at) = read_until_error(&mut rd).await;
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    assert!(
        at - start >= D / 2 * 6 + D,
        "closed at {:?} though the write half talked",
        at - start
    );
    assert!(at - start <= D / 2 * 6 + D + 2 * TICK);
    let mut wr = writer.await.unwrap();
    assert_eq!(
        wr.write(b"x").await.unwrap_err().kind(),
        ErrorKind::TimedOut
    );
}

/// A pending read and a pending write in two tasks (split halves): the close wakes both.
#[tokio::test(start_paused = true)]
async fn idle_close_wakes_a_pending_read_and_a_pending_write() {
    let wheel = Wheel::new();
    let (stream, _peer) = tokio::io::duplex(8); // the peer never reads
    let io = IdleIo::new(stream, &wheel, D);
    let (mut rd, mut wr) = tokio::io::split(io);
    let start = Instant::now();
    let w = tokio::spawn(async move {
        let mut total = 0usize;
        loop {
            match wr.write(&[0u8; 64]).await {
                Ok(n) => total += n,
                Err(e) => return (e.kind(), Instant::now(), total),
            }
        }
    });
    let (e, at) = read_until_error(&mut rd).await;
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    let (wk, wat, total) = tokio::time::timeout(secs(1), w)
        .await
        .expect("the writer hangs")
        .unwrap();
    assert_eq!(wk, ErrorKind::TimedOut);
    assert_eq!(total, 8);
    assert!(at - start >= D && wat - start >= D);
}

/// "Errors of the inner IO pass through unchanged (and are not traffic)": an inner write error.
struct FailingWrites {
    fail: Arc<AtomicBool>,
}
impl AsyncRead for FailingWrites {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Poll::Pending // never any bytes (and never wakes: the IdleIo's timer must)
    }
}
impl AsyncWrite for FailingWrites {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        if self.fail.load(Ordering::SeqCst) {
            Poll::Ready(Err(io::Error::new(ErrorKind::BrokenPipe, "gone")))
        } else {
            Poll::Ready(Ok(b.len()))
        }
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[tokio::test(start_paused = true)]
async fn idle_inner_write_errors_pass_through_and_are_not_traffic() {
    let wheel = Wheel::new();
    let fail = Arc::new(AtomicBool::new(false));
    let mut io = IdleIo::new(FailingWrites { fail: fail.clone() }, &wheel, D);
    let start = Instant::now();
    tokio::time::sleep(secs(4)).await;
    io.write_all(b"ok").await.unwrap(); // traffic at 4 s
    fail.store(true, Ordering::SeqCst);
    tokio::time::sleep(secs(5)).await;
    let e = io.write(b"no").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BrokenPipe, "unchanged");
    assert_eq!(e.to_string(), "gone");
    let (e, at) = read_until_error(&mut io).await;
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    assert_eq!(
        at - start,
        secs(14),
        "the failed write at 9 s was not traffic"
    );
}

#[tokio::test(start_paused = true)]
async fn idle_zero_timeout_reads_ready_bytes_then_closes() {
    let wheel = Wheel::new();
    let (stream, mut peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, Duration::ZERO);
    peer.write_all(b"hello").await.unwrap();
    let mut buf = [0u8; 5];
    io.read_exact(&mut buf)
        .await
        .expect("ready bytes are read even with a zero timeout");
    assert_eq!(&buf, b"hello");
    let idle = io.handle();
    let g = idle.busy();
    let mut r = Box::pin(async { io.read(&mut [0u8; 4]).await });
    assert!(
        futures::poll!(&mut r).is_pending(),
        "busy: not closed even with zero timeout"
    );
    drop(g);
    let e = tokio::time::timeout(ms(5), r)
        .await
        .expect("last guard drop wakes")
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    assert!(idle.is_closed());
}

#[tokio::test(start_paused = true)]
async fn idle_max_timeout_then_shutdown_while_busy() {
    let wheel = Wheel::new();
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, Duration::MAX);
    let idle = io.handle();
    let g = idle.busy();
    let mut r = Box::pin(read_until_error(&mut io));
    assert!(futures::poll!(&mut r).is_pending());
    tokio::time::sleep(secs(50 * 365 * 86400)).await;
    assert!(futures::poll!(&mut r).is_pending(), "Duration::MAX closed");
    wheel.shutdown().await;
    settle().await;
    assert!(
        futures::poll!(&mut r).is_pending(),
        "busy across shutdown: still open"
    );
    drop(g);
    let (e, _) = tokio::time::timeout(ms(5), r)
        .await
        .expect("closes when the guard drops after shutdown");
    assert_eq!(e.kind(), ErrorKind::TimedOut);
}

#[tokio::test(start_paused = true)]
async fn idle_handles_and_guards_outliving_the_io() {
    let wheel = Wheel::new();
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, D);
    let idle = io.handle();
    let g = idle.busy();
    let mut r = Box::pin(async { io.read(&mut [0u8; 4]).await });
    assert!(futures::poll!(&mut r).is_pending());
    drop(r);
    drop(io);
    idle.touch();
    drop(g); // wakes nobody: no panic
    let g = idle.busy();
    tokio::time::sleep(D * 2).await;
    drop(g);
    assert!(!idle.is_closed());
    settle().await;
    assert_eq!(
        wheel.stats().pending,
        0,
        "a dropped IdleIo left a timer behind"
    );
}

/// Many connections idle at once, with staggered traffic: none closed early.
#[tokio::test(start_paused = true)]
async fn idle_many_connections_never_early() {
    let wheel = Wheel::new();
    let mut tasks = Vec::new();
    for i in 0..300u64 {
        let (stream, mut peer) = tokio::io::duplex(64);
        let mut io = IdleIo::new(stream, &wheel, D);
        tasks.push(tokio::spawn(async move {
            let talk = tokio::spawn(async move {
                for _ in 0..(i % 4) {
                    tokio::time::sleep(ms(1000 + i * 17)).await;
                    peer.write_all(b"x").await.unwrap();
                }
                tokio::time::sleep(secs(3600)).await;
                drop(peer);
            });
            let mut last = Instant::now();
            let mut buf = [0u8; 8];
            loop {
                match io.read(&mut buf).await {
                    Ok(n) => {
                        assert!(n > 0);
                        last = Instant::now();
                    }
                    Err(e) => {
                        assert_eq!(e.kind(), ErrorKind::TimedOut);
                        let silent = last.elapsed();
                        talk.abort();
                        return silent;
                    }
                }
            }
        }));
    }
    for t in tasks {
        let silent = t.await.unwrap();
        assert!(silent >= D, "closed after {silent:?} of silence");
        assert!(silent <= D + 2 * TICK, "closed after {silent:?}");
    }
}

/// A real HTTP/1 server over TCP with IdleIo + HyperTimer (real time, short durations).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_server_idle_close_and_long_busy_handler() {
    let idle_for = ms(300);
    let wheel = Wheel::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let closed = Arc::new(AtomicUsize::new(0));
    {
        let wheel = wheel.clone();
        let closed = closed.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let io = IdleIo::new(tcp, &wheel, idle_for);
                let idle = io.handle();
                let timer = HyperTimer::new(&wheel);
                let wheel = wheel.clone();
                let closed = closed.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let guard = idle.busy();
                        let wheel = wheel.clone();
                        async move {
                            let slow = req.uri().path() == "/slow";
                            if slow {
                                wheel.sleep(ms(900)).await; // 3x the idle timeout
                            }
                            drop(guard);
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                        }
                    });
                    let h = io.handle();
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(timer)
                        .header_read_timeout(secs(30))
                        .serve_connection(TokioIo::new(io), svc)
                        .await;
                    if h.is_closed() {
                        closed.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
    }
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    for path in ["/fast", "/slow", "/fast"] {
        let req = Request::get(path)
            .header("host", "x")
            .body(Empty::<Bytes>::new())
            .unwrap();
        // hyper's client takes a request only once the previous exchange
        // is done with (`ready`); a closed connection fails here too.
        send.ready().await.expect("a busy request was cut off");
        let resp = send
            .send_request(req)
            .await
            .expect("a busy request was cut off");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
    }
    let last = Instant::now();
    let r = tokio::time::timeout(secs(10), conn)
        .await
        .expect("idle connection never closed");
    let after = last.elapsed();
    r.unwrap().unwrap();
    assert!(
        after >= idle_for - ms(20),
        "closed {after:?} after the last response"
    );
    assert_eq!(closed.load(Ordering::SeqCst), 1);
}
