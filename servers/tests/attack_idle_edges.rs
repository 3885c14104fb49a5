//! Outside attack on IdleIo edges: sub-millisecond timeouts, IdleIo made/dropped outside any
//! runtime, a wheel on another runtime than the connections.

use std::io::ErrorKind;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_wheel::Wheel;
use tokio_wheel::hyper::IdleIo;

#[path = "support/attack.rs"]
mod attack;
use attack::*;

/// Timeouts that are not whole ticks: never closed before the exact timeout.
#[tokio::test(start_paused = true)]
async fn sub_tick_timeouts_never_early() {
    let ds: Vec<Duration> = [
        1u64, 999, 1000, 1001, 1500, 1999, 2001, 10_300, 10_999, 64_500, 1_000_500,
    ]
    .iter()
    .map(|&u| Duration::from_micros(u))
    .chain([
        Duration::from_nanos(1),
        Duration::from_nanos(1_000_001),
        Duration::from_nanos(9_999_999),
    ])
    .collect();
    for d in ds {
        for off_us in [0u64, 1, 400, 999] {
            let wheel = Wheel::new();
            tokio::task::yield_now().await;
            tokio::time::advance(Duration::from_micros(off_us)).await;
            let (a, _p) = tokio::io::duplex(64);
            let created = Instant::now();
            let mut io = IdleIo::new(a, &wheel, d);
            let (k, t) = read_err(&mut io).await;
            assert_eq!(k, ErrorKind::TimedOut);
            assert!(
                t >= created + d,
                "d={d:?} off={off_us}us: closed EARLY {:?} after creation",
                t - created
            );
            // the tight upper bound is checked separately (non_whole_ms_timeout_late_*)
            assert!(
                t <= created + d + Duration::from_millis(5),
                "d={d:?} off={off_us}us: closed LATE {:?}",
                t - created
            );
        }
    }
}

/// Minimal: a 10.324 ms timeout on a 1 ms-tick wheel built 50 us past a whole ms of tokio's
/// clock, the connection made 0.7 ms after the wheel. Contract: closed within d + one tick
/// (+ scheduling, which paused time does not add). Checked: ≤ d + 2 ms. A `wheel.sleep(d)`
/// started at the same instant is reported for comparison.
#[tokio::test(start_paused = true)]
async fn non_whole_ms_timeout_late_minimal() {
    let d = Duration::from_micros(10_324);
    tokio::time::advance(Duration::from_micros(50)).await;
    let wheel = Wheel::new();
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_micros(700)).await;
    let (a, _p) = tokio::io::duplex(64);
    let created = Instant::now();
    let mut io = IdleIo::new(a, &wheel, d);
    let sleep = {
        let wheel = wheel.clone();
        tokio::spawn(async move {
            wheel.sleep(d).await;
            Instant::now()
        })
    };
    let (k, t) = read_err(&mut io).await;
    let slept = sleep.await.unwrap();
    assert_eq!(k, ErrorKind::TimedOut);
    let late = t - created - d;
    let sleep_late = slept - created - d;
    assert!(
        late <= SLACK,
        "IdleIo closed {late:?} after d ({:?} after creation); wheel.sleep(d) from the same instant ended {sleep_late:?} after d",
        t - created
    );
}

/// Sweep of non-whole-ms timeouts × creation phases: IdleIo's lateness vs wheel.sleep's.
#[tokio::test(start_paused = true)]
async fn non_whole_ms_timeout_late_sweep() {
    let mut worst = (Duration::ZERO, 0u64, 0u64);
    let mut over = Vec::new();
    for d_us in (1000u64..14000).step_by(37) {
        for off_us in (0u64..2000).step_by(100) {
            let d = Duration::from_micros(d_us);
            let wheel = Wheel::new();
            tokio::task::yield_now().await;
            tokio::time::advance(Duration::from_micros(off_us)).await;
            let (a, _p) = tokio::io::duplex(64);
            let created = Instant::now();
            let mut io = IdleIo::new(a, &wheel, d);
            let (k, t) = read_err(&mut io).await;
            assert_eq!(k, ErrorKind::TimedOut);
            assert!(t >= created + d, "EARLY d={d:?} off={off_us}");
            let late = t - created - d;
            if late > worst.0 {
                worst = (late, d_us, off_us);
            }
            if late > SLACK {
                over.push((d_us, off_us, late));
            }
        }
    }
    assert!(
        over.is_empty(),
        "{} of 7040 cases closed more than 2 ms after d; worst {:?} (d={}us, made {}us after the wheel); first: {:?}",
        over.len(),
        worst.0,
        worst.1,
        worst.2,
        &over[..over.len().min(5)]
    );
}

/// Sub-tick timeouts with traffic at sub-tick offsets.
#[tokio::test(start_paused = true)]
async fn sub_tick_timeouts_with_traffic_never_early() {
    for d_us in [1500u64, 2500, 10_300] {
        for t_us in [100u64, 700, 1200] {
            let d = Duration::from_micros(d_us);
            let wheel = Wheel::new();
            let (a, mut p) = tokio::io::duplex(64);
            let mut io = IdleIo::new(a, &wheel, d);
            let h = tokio::spawn(async move {
                let mut buf = [0u8; 8];
                let mut last = Instant::now();
                loop {
                    match io.read(&mut buf).await {
                        Ok(_) => last = Instant::now(),
                        Err(e) => return (e.kind(), Instant::now(), last),
                    }
                }
            });
            tokio::task::yield_now().await;
            tokio::time::advance(Duration::from_micros(t_us)).await;
            p.write_all(b"a").await.unwrap();
            let (k, t, last) = h.await.unwrap();
            assert_eq!(k, ErrorKind::TimedOut);
            assert!(
                t >= last + d,
                "d={d:?} traffic at {t_us}us: closed EARLY {:?} after traffic",
                t - last
            );
            assert!(t <= last + d + SLACK, "d={d:?}: LATE {:?}", t - last);
        }
    }
}

/// IdleIo made on a plain OS thread (no runtime context), read on the runtime: works, closes
/// not before d and eventually; made and dropped outside a runtime: no panic.
#[test]
fn idleio_made_and_dropped_outside_runtime() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let wheel = rt.block_on(async { Wheel::new() });
    let d = Duration::from_millis(100);
    // made outside
    let w2 = wheel.clone();
    let (io, peer, made) = std::thread::spawn(move || {
        let (a, p) = tokio::io::duplex(64);
        let made = std::time::Instant::now();
        (IdleIo::new(a, &w2, d), p, made)
    })
    .join()
    .expect("IdleIo::new panicked outside a runtime");
    // dropped outside: many made, some polled on the runtime first, all dropped on a thread
    let w3 = wheel.clone();
    let polled = rt.block_on(async move {
        let mut v = Vec::new();
        for _ in 0..1000 {
            let (a, p) = tokio::io::duplex(64);
            let mut io = IdleIo::new(a, &w3, d);
            {
                let mut buf = [0u8; 4];
                let mut fut = std::pin::pin!(io.read(&mut buf));
                let _ = futures::poll!(fut.as_mut());
            }
            v.push((io, p));
        }
        v
    });
    std::thread::spawn(move || drop(polled))
        .join()
        .expect("dropping IdleIo outside a runtime panicked");
    rt.block_on(async move {
        let _peer = peer;
        let mut io = io;
        let (k, t) = tokio::time::timeout(Duration::from_secs(60), read_err(&mut io))
            .await
            .expect("never closed");
        assert_eq!(k, ErrorKind::TimedOut);
        assert!(t.into_std() >= made + d, "closed early");
        // a fresh connection on the same timeout still closes
        let (a, _p) = tokio::io::duplex(64);
        let mut io = IdleIo::new(a, &wheel, d);
        let start = Instant::now();
        let (k, t) = tokio::time::timeout(Duration::from_secs(60), read_err(&mut io))
            .await
            .expect("never closed");
        assert_eq!(k, ErrorKind::TimedOut);
        assert!(t >= start + d);
    });
}

/// The wheel runs on runtime A; the connections live and are read on runtime B (current-thread).
#[test]
fn wheel_on_other_runtime() {
    let rt_a = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let wheel = rt_a.block_on(async { Wheel::new() });
    let rt_b = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt_b.block_on(async move {
        let d = Duration::from_millis(100);
        let mut hs = Vec::new();
        let mut peers = Vec::new();
        for i in 0..300u64 {
            let (a, p) = tokio::io::duplex(64);
            peers.push(p);
            let start = Instant::now();
            let mut io = IdleIo::new(a, &wheel, d + Duration::from_millis(i % 3));
            hs.push(tokio::spawn(async move {
                let (k, t) = read_err(&mut io).await;
                (k, t, start, io.timeout())
            }));
        }
        for h in hs {
            let (k, t, start, d) = tokio::time::timeout(Duration::from_secs(60), h)
                .await
                .expect("hung")
                .unwrap();
            assert_eq!(k, ErrorKind::TimedOut);
            assert!(t >= start + d, "closed early");
        }
    });
}

/// Many wheels (one connection each, same timeout): each closes tightly.
#[tokio::test(start_paused = true)]
async fn many_wheels_one_connection_each() {
    let d = Duration::from_millis(30);
    let mut hs = Vec::new();
    let mut keep = Vec::new();
    for i in 0..200u64 {
        let wheel = Wheel::new();
        let (a, p) = tokio::io::duplex(64);
        keep.push(p);
        let start = Instant::now();
        let mut io = IdleIo::new(a, &wheel, d);
        hs.push(tokio::spawn(async move {
            let r = read_err(&mut io).await;
            drop(wheel);
            (r, start)
        }));
        if i % 7 == 0 {
            tokio::time::advance(Duration::from_micros(300)).await;
        }
    }
    for h in hs {
        let ((k, t), start) = h.await.unwrap();
        assert_eq!(k, ErrorKind::TimedOut);
        assert!(t >= start + d && t <= start + d + SLACK, "{:?}", t - start);
    }
}
