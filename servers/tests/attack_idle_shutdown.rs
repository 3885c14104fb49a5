//! Outside attack on IdleIo and wheel shutdown / runtime loss / handle drops.

use std::io::ErrorKind;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_wheel::Wheel;
use tokio_wheel::hyper::IdleIo;

#[path = "support/attack.rs"]
mod attack;
use attack::*;

/// Thousands idle on several timeouts, then shutdown: all close at once with TimedOut.
#[tokio::test(start_paused = true)]
async fn shutdown_closes_thousands_at_once_paused() {
    let wheel = Wheel::new();
    let mut rs = Vec::new();
    let mut peers = Vec::new();
    for i in 0..5000u64 {
        let (a, p) = tokio::io::duplex(64);
        peers.push(p);
        let d = ms(1000 + (i % 7) * 1000);
        let mut io = IdleIo::new(a, &wheel, d);
        rs.push(tokio::spawn(async move { read_err(&mut io).await }));
    }
    tokio::time::sleep(ms(500)).await;
    let t0 = Instant::now();
    wheel.shutdown().await;
    for r in rs {
        let (k, t) = r.await.unwrap();
        assert_eq!(k, ErrorKind::TimedOut);
        assert!(t - t0 <= SLACK, "closed {:?} after shutdown", t - t0);
    }
}

/// Same on a multi-thread runtime in real time: all close within 60 s (a hang guard), with TimedOut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_thousands_multithread() {
    let wheel = Wheel::new();
    let mut rs = Vec::new();
    let mut peers = Vec::new();
    for i in 0..5000u64 {
        let (a, p) = tokio::io::duplex(64);
        peers.push(p);
        let d = Duration::from_secs(60 + i % 5);
        let mut io = IdleIo::new(a, &wheel, d);
        rs.push(tokio::spawn(async move { read_err(&mut io).await }));
    }
    tokio::time::sleep(ms(100)).await;
    wheel.shutdown().await;
    let all = futures::future::join_all(rs);
    let out = tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("not all closed within 60 s of shutdown");
    for r in out {
        assert_eq!(r.unwrap().0, ErrorKind::TimedOut);
    }
}

/// Shutdown while busy: stays open while the guard lives, closes at once when it drops.
#[tokio::test(start_paused = true)]
async fn shutdown_while_busy_then_guard_drops() {
    let wheel = Wheel::new();
    let (a, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(a, &wheel, ms(100));
    let idle = io.handle();
    let busy = idle.busy();
    let r = tokio::spawn(async move { read_err(&mut io).await });
    tokio::time::sleep(ms(10)).await;
    wheel.shutdown().await;
    tokio::time::sleep(ms(1000)).await;
    assert!(
        !r.is_finished(),
        "busy connection closed by shutdown while its guard lived"
    );
    assert!(!idle.is_closed());
    let dropped = Instant::now();
    drop(busy);
    let (k, t) = r.await.unwrap();
    assert_eq!(k, ErrorKind::TimedOut);
    assert!(
        t - dropped <= SLACK,
        "closed {:?} after the guard dropped post-shutdown",
        t - dropped
    );
}

/// Shutdown while busy, a guard dropped from an OS thread on a multi-thread runtime: closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_while_busy_guard_dropped_on_thread() {
    let wheel = Wheel::new();
    let mut rs = Vec::new();
    let mut guards = Vec::new();
    let mut peers = Vec::new();
    for _ in 0..1000 {
        let (a, p) = tokio::io::duplex(64);
        peers.push(p);
        let mut io = IdleIo::new(a, &wheel, Duration::from_secs(60));
        guards.push(io.handle().busy());
        rs.push(tokio::spawn(async move { read_err(&mut io).await }));
    }
    tokio::time::sleep(ms(50)).await;
    wheel.shutdown().await;
    tokio::time::sleep(ms(200)).await;
    for r in &rs {
        assert!(!r.is_finished(), "busy connection closed by shutdown");
    }
    std::thread::spawn(move || drop(guards)).join().unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(rs))
        .await
        .expect(
            "busy connections did not close within 60 s of their guard dropping after shutdown",
        );
    for r in out {
        assert_eq!(r.unwrap().0, ErrorKind::TimedOut);
    }
}

/// IdleIo made after shutdown: first read, first write answer TimedOut at once.
#[tokio::test(start_paused = true)]
async fn idleio_after_shutdown() {
    let wheel = Wheel::new();
    wheel.shutdown().await;
    for d in [
        Duration::ZERO,
        ms(1),
        Duration::from_secs(60),
        Duration::MAX,
    ] {
        let (a, mut peer) = tokio::io::duplex(64);
        peer.write_all(b"pending data").await.unwrap();
        let mut io = IdleIo::new(a, &wheel, d);
        let t0 = Instant::now();
        let e = io.read(&mut [0u8; 8]).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut, "d={d:?}");
        assert!(Instant::now() - t0 <= SLACK);
        assert!(io.is_closed());
        let (a, _peer) = tokio::io::duplex(64);
        let mut io = IdleIo::new(a, &wheel, d);
        let e = io.write(b"x").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut, "write d={d:?}");
        // poll_shutdown still reaches the inner IO
        io.shutdown()
            .await
            .expect("shutdown must still reach the inner IO");
    }
}

/// Shutdown from a clone while another task keeps creating connections: every connection,
/// created before or after, ends with TimedOut; nothing hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_racing_creation() {
    let wheel = Wheel::new();
    let w2 = wheel.clone();
    let maker = tokio::spawn(async move {
        let mut rs = Vec::new();
        let mut peers = Vec::new();
        for i in 0..4000u64 {
            let (a, p) = tokio::io::duplex(64);
            peers.push(p);
            let mut io = IdleIo::new(a, &w2, Duration::from_secs(30 + i % 3));
            rs.push(tokio::spawn(async move { read_err(&mut io).await }));
            if i % 100 == 0 {
                tokio::task::yield_now().await;
            }
        }
        (rs, peers)
    });
    tokio::time::sleep(ms(2)).await;
    wheel.shutdown().await;
    let (rs, _peers) = maker.await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(5), futures::future::join_all(rs))
        .await
        .expect("a connection created around shutdown hung");
    for r in out {
        assert_eq!(r.unwrap().0, ErrorKind::TimedOut);
    }
}

/// The runtime running the wheel is dropped: idle connections on another runtime close as if
/// shutdown() had been called (promptly, TimedOut), and do not hang.
#[test]
fn wheel_runtime_dropped() {
    let wheel_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let wheel = Wheel::builder()
        .runtime(wheel_rt.handle().clone())
        .try_build();
    // building needs a runtime context? try inside the runtime if it failed outside
    let wheel = match wheel {
        Ok(w) => w,
        Err(_) => {
            let _g = wheel_rt.enter();
            Wheel::builder().runtime(wheel_rt.handle().clone()).build()
        }
    };
    let user_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    user_rt.block_on(async move {
        let mut rs = Vec::new();
        let mut peers = Vec::new();
        for _ in 0..1000 {
            let (a, p) = tokio::io::duplex(64);
            peers.push(p);
            let mut io = IdleIo::new(a, &wheel, Duration::from_secs(60));
            rs.push(tokio::spawn(async move { read_err(&mut io).await }));
        }
        tokio::time::sleep(ms(100)).await;
        std::thread::spawn(move || drop(wheel_rt)).join().unwrap();
        let out = tokio::time::timeout(Duration::from_secs(5), futures::future::join_all(rs))
            .await
            .expect("idle connections hung after the wheel's runtime was dropped");
        for r in out {
            assert_eq!(r.unwrap().0, ErrorKind::TimedOut);
        }
        // and one made afterwards is closed from the start
        let (a, _p) = tokio::io::duplex(64);
        let mut io = IdleIo::new(a, &wheel, Duration::from_secs(60));
        let e = tokio::time::timeout(Duration::from_secs(5), io.read(&mut [0u8; 4]))
            .await
            .expect("IdleIo made after the wheel's runtime dropped hung")
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut);
    });
}

/// The runtime running the wheel is dropped while the connection is also on it? Here: wheel and
/// connection on one runtime, runtime shut down with a connection whose read was never polled
/// again; then, the IdleIo (moved out) is read on another runtime: TimedOut, no hang/panic.
#[test]
fn idleio_outlives_its_wheel_runtime() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (io, peer) = rt.block_on(async {
        let wheel = Wheel::new();
        let (a, p) = tokio::io::duplex(64);
        let io = IdleIo::new(a, &wheel, Duration::from_secs(60));
        (io, p)
    });
    drop(rt);
    let rt2 = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt2.block_on(async move {
        let mut io = io;
        let _peer = peer;
        let r = tokio::time::timeout(Duration::from_secs(5), io.read(&mut [0u8; 4])).await;
        let e = r
            .expect("read hung after its wheel's runtime was dropped")
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut);
    });
}

/// All Wheel handles dropped while connections are idle: they still close at d (not early,
/// not never).
#[tokio::test(start_paused = true)]
async fn wheel_handles_dropped_still_closes() {
    let wheel = Wheel::new();
    let d = ms(200);
    let mut rs = Vec::new();
    let mut peers = Vec::new();
    let start = Instant::now();
    for _ in 0..100 {
        let (a, p) = tokio::io::duplex(64);
        peers.push(p);
        let mut io = IdleIo::new(a, &wheel, d);
        rs.push(tokio::spawn(async move { read_err(&mut io).await }));
    }
    drop(wheel);
    for r in rs {
        let (k, t) = tokio::time::timeout(Duration::from_secs(3600), r)
            .await
            .expect("hung")
            .unwrap();
        assert_eq!(k, ErrorKind::TimedOut);
        assert!(
            t - start >= d && t - start <= d + SLACK,
            "closed {:?} after creation",
            t - start
        );
    }
}

/// Wheel handle dropped and connection created only from a clone inside a task; the IdleIo
/// is first polled after every handle has gone.
#[tokio::test(start_paused = true)]
async fn idleio_polled_after_all_handles_dropped() {
    let d = ms(200);
    let (a, _p) = tokio::io::duplex(64);
    let io = {
        let wheel = Wheel::new();
        IdleIo::new(a, &wheel, d)
    };
    tokio::time::sleep(ms(50)).await;
    let start = Instant::now() - ms(50);
    let mut io = io;
    let (k, t) = tokio::time::timeout(Duration::from_secs(3600), read_err(&mut io))
        .await
        .expect("hung");
    assert_eq!(k, ErrorKind::TimedOut);
    assert!(
        t - start >= d && t - start <= d + SLACK,
        "closed {:?} after creation",
        t - start
    );
}
