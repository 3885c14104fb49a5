//! `HyperTimer` and `IdleIo`'s rules under paused time (the real servers over loopback are in
//! `hyper_server.rs`).

use std::future::Future;
use std::io::{self, ErrorKind};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::rt::Timer;
use hyper_util::rt::TokioTimer;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_wheel::Wheel;
use tokio_wheel::hyper::{HyperSleep, HyperTimer, IdleHandle, IdleIo};

// ---------------------------------------------------------------------------------------
// HyperTimer under paused time.

#[tokio::test(start_paused = true)]
async fn hyper_timer_reset_moves_its_own_sleep_in_place() {
    let wheel = Wheel::new();
    let timer = HyperTimer::new(&wheel);
    let start = Instant::now();
    let mut sleep = timer.sleep(Duration::from_secs(1));
    assert!(poll_once(&mut sleep).is_pending()); // registered on the wheel
    wheel.flush().await;
    let registered = wheel.stats().inserted;
    let address = &*sleep as *const dyn hyper::rt::Sleep as *const u8;

    let later = start + Duration::from_secs(5);
    timer.reset(&mut sleep, later.into_std());
    assert_eq!(
        &*sleep as *const dyn hyper::rt::Sleep as *const u8, address,
        "reset allocated a new sleep"
    );
    let ours = sleep.as_mut().downcast_mut_pin::<HyperSleep>().unwrap();
    assert_eq!(ours.deadline(), later);
    wheel.flush().await;
    assert_eq!(
        wheel.stats().inserted,
        registered,
        "reset registered a new timer"
    );

    (&mut sleep).await;
    assert!(Instant::now() >= later);
    assert!(Instant::now() < later + Duration::from_millis(5));
}

#[tokio::test(start_paused = true)]
async fn hyper_timer_reset_replaces_a_foreign_sleep() {
    let wheel = Wheel::new();
    let timer = HyperTimer::new(&wheel);
    let start = Instant::now();
    let mut sleep = TokioTimer::new().sleep(Duration::from_secs(1));
    assert!(sleep.as_mut().downcast_mut_pin::<HyperSleep>().is_none());
    let later = start + Duration::from_secs(3);
    timer.reset(&mut sleep, later.into_std());
    let ours = sleep.as_mut().downcast_mut_pin::<HyperSleep>().unwrap();
    assert_eq!(ours.deadline(), later);
    sleep.await;
    assert!(Instant::now() >= later);
}

#[tokio::test(start_paused = true)]
async fn hyper_timer_now_is_the_wheel_clock() {
    let wheel = Wheel::new();
    let timer = HyperTimer::new(&wheel);
    let before = timer.now();
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(timer.now() - before >= Duration::from_secs(3600));
    // hyper computes deadlines as `now() + d`: they land on the paused clock.
    let start = Instant::now();
    timer
        .sleep_until(timer.now() + Duration::from_secs(2))
        .await;
    assert_eq!(start.elapsed().as_secs(), 2);
}

#[test]
fn hyper_types_are_send_sync() {
    fn send_sync<T: Send + Sync + Clone + 'static>() {}
    send_sync::<HyperTimer>();
    send_sync::<IdleHandle>();
    fn send_sync_unpin<T: Send + Sync + Unpin>() {}
    send_sync_unpin::<HyperSleep>();
    send_sync_unpin::<IdleIo<TcpStream>>();
    send_sync_unpin::<tokio_wheel::hyper::Busy>();
}

// ---------------------------------------------------------------------------------------
// IdleIo's rules, under paused time over an in-memory pipe.

const D: Duration = Duration::from_secs(10);

/// Reads until the IO errs; returns the error and when. Fails after an hour (of paused
/// time, so at once) rather than hang.
async fn read_until_error(io: &mut (impl AsyncRead + Unpin)) -> (io::Error, Instant) {
    let mut buf = [0; 64];
    let read = async {
        loop {
            match io.read(&mut buf).await {
                Ok(0) => panic!("end of file instead of an error"),
                Ok(_) => {}
                Err(error) => return (error, Instant::now()),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(3600), read)
        .await
        .expect("the IO was never closed")
}

fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(std::task::Waker::noop()))
}

#[tokio::test(start_paused = true)]
async fn idle_io_closes_after_the_timeout_of_silence() {
    let wheel = Wheel::new();
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, D);
    let start = Instant::now();
    let (error, at) = read_until_error(&mut io).await;
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert!(at - start >= D);
    assert!(
        at - start <= D + Duration::from_millis(2),
        "{:?}",
        at - start
    );
    assert!(io.is_closed());
    // From then on: reads and writes answer TimedOut, without reaching the pipe.
    assert_eq!(
        io.read(&mut [0; 8]).await.unwrap_err().kind(),
        ErrorKind::TimedOut
    );
    assert_eq!(
        io.write(b"late").await.unwrap_err().kind(),
        ErrorKind::TimedOut
    );
    io.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn reads_postpone_the_close() {
    let wheel = Wheel::new();
    let (stream, mut peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, D);
    let writer = tokio::spawn(async move {
        for _ in 0..10 {
            tokio::time::sleep(D / 2).await;
            peer.write_all(b"x").await.unwrap();
        }
        let last = Instant::now();
        (last, peer)
    });
    let (error, at) = read_until_error(&mut io).await;
    let (last, _peer) = writer.await.unwrap();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert!(at - last >= D, "closed {:?} after the last byte", at - last);
    assert!(at - last <= D + Duration::from_millis(2));
}

#[tokio::test(start_paused = true)]
async fn writes_postpone_the_close_of_a_waiting_read_in_another_task() {
    let wheel = Wheel::new();
    let (stream, mut peer) = tokio::io::duplex(1024);
    let io = IdleIo::new(stream, &wheel, D);
    let (mut reader, mut writer) = tokio::io::split(io);
    let write = tokio::spawn(async move {
        for _ in 0..10 {
            tokio::time::sleep(D / 2).await;
            writer.write_all(b"y").await.unwrap();
        }
        Instant::now()
    });
    let drain = tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = peer.read_to_end(&mut sink).await;
    });
    let (error, at) = read_until_error(&mut reader).await;
    let last = write.await.unwrap();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert!(
        at - last >= D,
        "closed {:?} after the last write",
        at - last
    );
    assert!(at - last <= D + Duration::from_millis(2));
    drop(drain);
}

#[tokio::test(start_paused = true)]
async fn touch_counts_as_traffic() {
    let wheel = Wheel::new();
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, D);
    let handle = io.handle();
    let toucher = tokio::spawn(async move {
        for _ in 0..5 {
            tokio::time::sleep(D / 2).await;
            handle.touch();
        }
        Instant::now()
    });
    let (_, at) = read_until_error(&mut io).await;
    let last = toucher.await.unwrap();
    assert!(at - last >= D);
    assert!(at - last <= D + Duration::from_millis(2));
}

#[tokio::test(start_paused = true)]
async fn a_busy_guard_holds_the_connection_open_and_the_countdown_restarts_at_its_drop() {
    let wheel = Wheel::new();
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, D);
    let handle = io.handle();
    let first = handle.busy();
    let second = handle.busy();
    let guards = tokio::spawn(async move {
        tokio::time::sleep(D * 3).await;
        drop(first);
        tokio::time::sleep(D * 2).await;
        drop(second);
        Instant::now()
    });
    let (error, at) = read_until_error(&mut io).await;
    let released = guards.await.unwrap();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert!(
        at - released >= D,
        "closed {:?} after the last guard",
        at - released
    );
    assert!(at - released <= D + Duration::from_millis(2));
}

#[tokio::test(start_paused = true)]
async fn a_write_the_peer_never_reads_times_out() {
    let wheel = Wheel::new();
    let (stream, _peer) = tokio::io::duplex(8);
    let mut io = IdleIo::new(stream, &wheel, D);
    let start = Instant::now();
    let write = tokio::time::timeout(Duration::from_secs(3600), io.write_all(&[7; 100]));
    let error = write.await.expect("never timed out").unwrap_err();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert!(start.elapsed() >= D);
    assert!(start.elapsed() <= D + Duration::from_millis(2));
}

#[tokio::test(start_paused = true)]
async fn shutdown_closes_an_idle_io_at_once_and_a_busy_one_when_its_guard_drops() {
    let wheel = Wheel::new();
    let (idle_stream, _idle_peer) = tokio::io::duplex(64);
    let (busy_stream, _busy_peer) = tokio::io::duplex(64);
    let mut idle = IdleIo::new(idle_stream, &wheel, D);
    let mut busy = IdleIo::new(busy_stream, &wheel, D);
    let guard = busy.handle().busy();
    let idle_read = tokio::spawn(async move { read_until_error(&mut idle).await });
    let busy_read = tokio::spawn(async move { read_until_error(&mut busy).await });
    tokio::time::sleep(D / 2).await;
    let stopped = Instant::now();
    wheel.shutdown().await;
    let (error, at) = idle_read.await.unwrap();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert!(error.to_string().contains("shut down"), "{error}");
    assert_eq!(at, stopped);
    // The busy one waits for its request, however long.
    tokio::time::sleep(D * 3).await;
    assert!(!busy_read.is_finished());
    drop(guard);
    let (error, at) = busy_read.await.unwrap();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert_eq!(at, stopped + D * 3);
}

// Bad input.

#[tokio::test(start_paused = true)]
async fn a_zero_timeout_closes_as_soon_as_a_read_would_wait() {
    let wheel = Wheel::new();
    let (stream, mut peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, Duration::ZERO);
    peer.write_all(b"hello").await.unwrap();
    let start = Instant::now();
    let mut buf = [0; 5];
    io.read_exact(&mut buf).await.unwrap(); // bytes already there still arrive
    let (error, _) = read_until_error(&mut io).await;
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert_eq!(start.elapsed(), Duration::ZERO);

    // While a request is in progress it waits, and closes once the guard drops.
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, Duration::ZERO);
    let guard = io.handle().busy();
    let mut read = Box::pin(async move { read_until_error(&mut io).await });
    assert!(poll_once(&mut read).is_pending());
    tokio::time::sleep(D).await;
    assert!(poll_once(&mut read).is_pending());
    drop(guard);
    let (error, at) = read.await;
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert_eq!(at - start, D);
}

#[tokio::test(start_paused = true)]
async fn a_max_timeout_never_closes() {
    let wheel = Wheel::new();
    let (stream, mut peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, Duration::MAX);
    let mut read = Box::pin(async move {
        let mut buf = [0; 4];
        io.read_exact(&mut buf).await.map(|_| buf)
    });
    assert!(poll_once(&mut read).is_pending());
    // A hundred years of silence, in steps the wheel cascades through.
    for _ in 0..100 {
        tokio::time::advance(Duration::from_secs(365 * 24 * 3600)).await;
        assert!(poll_once(&mut read).is_pending());
    }
    peer.write_all(b"late").await.unwrap();
    assert_eq!(&read.await.unwrap(), b"late");
}

#[tokio::test(start_paused = true)]
async fn a_wheel_already_shut_down_closes_the_io_on_its_first_read() {
    let wheel = Wheel::new();
    wheel.shutdown().await;
    let (stream, mut peer) = tokio::io::duplex(64);
    peer.write_all(b"data").await.unwrap();
    let mut io = IdleIo::new(stream, &wheel, D);
    assert!(io.is_closed());
    let error = io.read(&mut [0; 4]).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert!(error.to_string().contains("shut down"), "{error}");
    let error = io.write(b"x").await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
}

/// An IO whose reads fail.
struct Broken;

impl AsyncRead for Broken {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Poll::Ready(Err(io::Error::new(
            ErrorKind::ConnectionReset,
            "peer vanished",
        )))
    }
}

#[tokio::test(start_paused = true)]
async fn an_inner_error_passes_through_unchanged() {
    let wheel = Wheel::new();
    let mut io = IdleIo::new(Broken, &wheel, D);
    let error = io.read(&mut [0; 4]).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ConnectionReset);
    assert_eq!(error.to_string(), "peer vanished");
    assert!(!io.is_closed());
    // Errors are not traffic, and do not close it: the timeout still runs.
    let (stream, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(stream, &wheel, D);
    let start = Instant::now();
    let (error, _) = read_until_error(&mut io).await;
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert_eq!(start.elapsed(), D);
}
