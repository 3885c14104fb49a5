//! Outside attack on IdleIo's timing promise under paused time:
//! never closed before `d` of silence; closed within `d` + one tick (+ scheduling), i.e. ≤ d + 2 ms
//! under paused time with the default 1 ms tick.

use std::io::ErrorKind;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_wheel::Wheel;
use tokio_wheel::hyper::IdleIo;

#[path = "support/attack.rs"]
mod attack;
use attack::*;

/// Shared record of the last time a byte moved (as seen by the test).
#[derive(Clone)]
struct Last(Arc<Mutex<Instant>>);
impl Last {
    fn new() -> Self {
        Last(Arc::new(Mutex::new(Instant::now())))
    }
    fn set(&self, t: Instant) {
        *self.0.lock().unwrap() = t;
    }
    fn get(&self) -> Instant {
        *self.0.lock().unwrap()
    }
}

/// Spawns a reader over `io` that records the instant of every successful read (taken before
/// the read was issued is not needed: a read completes at the instant bytes move), returning at
/// the first error with its kind and instant.
fn reader(mut io: IdleIo<DuplexStream>, last: Last) -> JoinHandle<(ErrorKind, Instant)> {
    tokio::spawn(async move {
        let mut buf = [0u8; 64];
        loop {
            match io.read(&mut buf).await {
                Ok(0) => panic!("EOF instead of TimedOut"),
                Ok(_) => last.set(Instant::now()),
                Err(e) => return (e.kind(), Instant::now()),
            }
        }
    })
}

fn check(
    what: &str,
    kind: ErrorKind,
    closed: Instant,
    last: Instant,
    d: Duration,
    slack: Duration,
) {
    assert_eq!(kind, ErrorKind::TimedOut, "{what}: wrong error kind");
    assert!(
        closed >= last + d,
        "{what}: closed EARLY: {:?} after last traffic, timeout {:?}",
        closed - last,
        d
    );
    assert!(
        closed <= last + d + slack,
        "{what}: closed LATE: {:?} after last traffic, timeout {:?}",
        closed - last,
        d
    );
}

/// One connection, no traffic: closes in [d, d+2ms] after creation.
#[tokio::test(start_paused = true)]
async fn single_silent_connection_tight() {
    for d_ms in [1u64, 2, 3, 7, 10, 64, 65, 1000, 1001, 60_000, 3_600_000] {
        let wheel = Wheel::new();
        let (a, _peer) = tokio::io::duplex(64);
        let last = Last::new();
        let io = IdleIo::new(a, &wheel, ms(d_ms));
        let (k, t) = reader(io, last.clone()).await.unwrap();
        check(&format!("d={d_ms}ms"), k, t, last.get(), ms(d_ms), SLACK);
    }
}

/// Creation at a sub-millisecond offset from the wheel's start: the deadline must not be
/// rounded down to the tick.
#[tokio::test(start_paused = true)]
async fn sub_tick_creation_offsets_never_early() {
    for off_us in (0..2000u64).step_by(100) {
        for d_ms in [1u64, 2, 5, 10, 100] {
            let wheel = Wheel::new();
            tokio::task::yield_now().await;
            tokio::time::advance(us(off_us)).await;
            let (a, _peer) = tokio::io::duplex(64);
            let last = Last::new();
            let io = IdleIo::new(a, &wheel, ms(d_ms));
            let (k, t) = reader(io, last.clone()).await.unwrap();
            check(
                &format!("offset {off_us}us d={d_ms}ms"),
                k,
                t,
                last.get(),
                ms(d_ms),
                SLACK,
            );
        }
    }
}

/// Traffic at sub-ms offsets postpones the deadline to exactly last + d, never rounded down.
#[tokio::test(start_paused = true)]
async fn sub_tick_traffic_never_early() {
    for d_ms in [1u64, 3, 10] {
        for off_us in (0..3000u64).step_by(250) {
            let wheel = Wheel::new();
            let (a, mut peer) = tokio::io::duplex(64);
            let last = Last::new();
            let io = IdleIo::new(a, &wheel, ms(d_ms));
            let h = reader(io, last.clone());
            tokio::task::yield_now().await;
            // move to a sub-tick offset before d elapses (only when off < d)
            if us(off_us) < ms(d_ms) {
                tokio::time::advance(us(off_us)).await;
                peer.write_all(b"x").await.unwrap();
            }
            let (k, t) = h.await.unwrap();
            check(
                &format!("d={d_ms}ms traffic at {off_us}us"),
                k,
                t,
                last.get(),
                ms(d_ms),
                SLACK,
            );
        }
    }
}

/// Traffic every d/2 for a while keeps the connection; then silence closes it at last + d.
#[tokio::test(start_paused = true)]
async fn periodic_traffic_keeps_then_closes() {
    let wheel = Wheel::new();
    let d = ms(100);
    let (a, mut peer) = tokio::io::duplex(64);
    let last = Last::new();
    let h = reader(IdleIo::new(a, &wheel, d), last.clone());
    for _ in 0..50 {
        tokio::time::sleep(ms(99)).await;
        assert!(
            !h.is_finished(),
            "closed while traffic came every 99 ms (d = 100 ms)"
        );
        peer.write_all(b"x").await.unwrap();
    }
    let (k, t) = h.await.unwrap();
    check("periodic", k, t, last.get(), d, SLACK);
}

/// Many connections, many timeouts, one wheel; random traffic; each closes in its own window.
#[tokio::test(start_paused = true)]
async fn many_timeouts_one_wheel_random_traffic() {
    let wheel = Wheel::new();
    let timeouts = [
        1u64, 2, 3, 5, 10, 17, 63, 64, 65, 100, 999, 1000, 1001, 4096, 60_000,
    ];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut tasks = Vec::new();
    for i in 0..600 {
        let d = ms(timeouts[i % timeouts.len()]);
        let (a, mut peer) = tokio::io::duplex(64);
        let last = Last::new();
        let start_delay = us(rnd(5000));
        let n_sends = rnd(5);
        let gaps: Vec<Duration> = (0..n_sends)
            .map(|_| {
                // gap strictly below d so it never closes in between
                let d_us = d.as_micros() as u64;
                us(rnd(d_us.max(2) - 1))
            })
            .collect();
        let wheel = wheel.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(start_delay).await;
            let last2 = last.clone();
            last.set(Instant::now());
            let h = reader(IdleIo::new(a, &wheel, d), last2);
            for g in gaps {
                tokio::time::sleep(g).await;
                if h.is_finished() {
                    break;
                }
                let _ = peer.write_all(b"y").await;
            }
            let (k, t) = h.await.unwrap();
            (i, d, k, t, last.get())
        }));
    }
    let mut failures = Vec::new();
    for t in tasks {
        let (i, d, k, closed, last) = t.await.unwrap();
        if k != ErrorKind::TimedOut || closed < last + d || closed > last + d + SLACK {
            failures.push(format!(
                "conn {i} d={d:?}: closed {:?} after last traffic ({k:?})",
                closed
                    .checked_duration_since(last)
                    .map(|x| format!("{x:?}"))
                    .unwrap_or("BEFORE".into())
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures, first: {:?}",
        failures.len(),
        &failures[..failures.len().min(10)]
    );
}

/// Several wheels at once with the same timeout: each connection closes on time.
#[tokio::test(start_paused = true)]
async fn several_wheels_same_timeout() {
    let wheels: Vec<Wheel> = (0..4).map(|_| Wheel::new()).collect();
    let d = ms(50);
    let mut tasks = Vec::new();
    let mut peers = Vec::new();
    for i in 0..200 {
        let (a, peer) = tokio::io::duplex(64);
        peers.push(peer);
        let last = Last::new();
        let io = IdleIo::new(a, &wheels[i % 4], d);
        let h = reader(io, last.clone());
        tasks.push((h, last));
        if i % 10 == 0 {
            tokio::time::advance(us(370)).await;
        }
    }
    for (i, (h, last)) in tasks.into_iter().enumerate() {
        let (k, t) = h.await.unwrap();
        check(&format!("conn {i}"), k, t, last.get(), d, SLACK);
    }
}

/// A wheel with a 10 ms tick: closes within d + one tick (+1 ms), never before d.
#[tokio::test(start_paused = true)]
async fn coarse_tick_bound() {
    let wheel = Wheel::builder().tick(ms(10)).build();
    for d_ms in [1u64, 5, 10, 15, 100, 105] {
        for off in [0u64, 3, 7] {
            tokio::time::advance(ms(off)).await;
            let (a, _peer) = tokio::io::duplex(64);
            let last = Last::new();
            let (k, t) = reader(IdleIo::new(a, &wheel, ms(d_ms)), last.clone())
                .await
                .unwrap();
            check(
                &format!("tick 10ms d={d_ms}ms off={off}"),
                k,
                t,
                last.get(),
                ms(d_ms),
                ms(11),
            );
        }
    }
}

/// The IdleIo is first read long after its deadline passed: the first read closes at once.
/// Read first before the deadline: closes at creation + d.
#[tokio::test(start_paused = true)]
async fn first_poll_late_or_early() {
    let wheel = Wheel::new();
    let d = ms(100);
    let (a, _peer) = tokio::io::duplex(64);
    let created = Instant::now();
    let mut io = IdleIo::new(a, &wheel, d);
    tokio::time::sleep(ms(500)).await;
    let t0 = Instant::now();
    let e = io.read(&mut [0u8; 8]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    assert!(
        Instant::now() <= t0 + SLACK,
        "late first read waited {:?}",
        Instant::now() - t0
    );

    let (a, _peer) = tokio::io::duplex(64);
    let created2 = Instant::now();
    let mut io = IdleIo::new(a, &wheel, d);
    tokio::time::sleep(ms(60)).await;
    let e = io.read(&mut [0u8; 8]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    let el = Instant::now() - created2;
    assert!(el >= d && el <= d + SLACK, "closed {el:?} after creation");
    let _ = created;
}

/// Connections dropped while filed, the group emptied, then re-created with the same timeout,
/// at many sub-tick phases relative to the old group's sweep.
#[tokio::test(start_paused = true)]
async fn drop_all_then_recreate_same_timeout() {
    let wheel = Wheel::new();
    let d = ms(20);
    for round in 0..60u64 {
        // a batch that is polled (filed) then dropped
        let mut ios = Vec::new();
        let mut peers = Vec::new();
        for _ in 0..50 {
            let (a, p) = tokio::io::duplex(64);
            let mut io = IdleIo::new(a, &wheel, d);
            let mut buf = [0u8; 4];
            let r = futures::poll!(std::pin::pin!(io.read(&mut buf)));
            assert!(r.is_pending());
            ios.push(io);
            peers.push(p);
        }
        tokio::time::advance(us(round * 370 % 25_000)).await;
        drop(ios);
        drop(peers);
        tokio::time::advance(us(round * 130 % 3000)).await;
        for _ in 0..(round % 4) {
            tokio::task::yield_now().await;
        }
        let (a, _peer) = tokio::io::duplex(64);
        let last = Last::new();
        let (k, t) = reader(IdleIo::new(a, &wheel, d), last.clone())
            .await
            .unwrap();
        check(&format!("round {round}"), k, t, last.get(), d, SLACK);
    }
}

/// Thousands created and dropped in bulk while others of the same timeout stay: survivors on time.
#[tokio::test(start_paused = true)]
async fn bulk_create_drop_survivors_on_time() {
    let wheel = Wheel::new();
    let d = ms(300);
    let mut survivors = Vec::new();
    let mut keep_peers = Vec::new();
    for wave in 0..10u64 {
        let mut doomed = Vec::new();
        for i in 0..1000u64 {
            let (a, p) = tokio::io::duplex(64);
            let io = IdleIo::new(a, &wheel, d);
            if i % 100 == 0 {
                let last = Last::new();
                survivors.push((wave, reader(io, last.clone()), last));
                keep_peers.push(p);
            } else {
                let last = Last::new();
                doomed.push(reader(io, last));
                keep_peers.push(p);
            }
        }
        tokio::time::advance(ms(7) + us(wave * 111)).await;
        for h in &doomed {
            h.abort();
        }
        drop(doomed);
        tokio::time::advance(ms(3)).await;
    }
    for (wave, h, last) in survivors {
        let (k, t) = h.await.unwrap();
        check(&format!("wave {wave}"), k, t, last.get(), d, SLACK);
    }
}

/// Duration::ZERO: a read that finds data is served; a read that would wait closes at once.
#[tokio::test(start_paused = true)]
async fn zero_timeout() {
    let wheel = Wheel::new();
    let (a, mut peer) = tokio::io::duplex(64);
    peer.write_all(b"hello").await.unwrap();
    let mut io = IdleIo::new(a, &wheel, Duration::ZERO);
    let mut buf = [0u8; 5];
    io.read_exact(&mut buf)
        .await
        .expect("data already sent must be served");
    let t0 = Instant::now();
    let e = io.read(&mut buf).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    assert!(Instant::now() - t0 <= SLACK);
    assert!(io.is_closed());
}

/// Duration::MAX and huge timeouts never close for idleness and never panic; shutdown closes them.
#[tokio::test(start_paused = true)]
async fn max_timeout_never_closes_until_shutdown() {
    let wheel = Wheel::new();
    let mut hs = Vec::new();
    let mut peers = Vec::new();
    for d in [
        Duration::MAX,
        Duration::MAX - ms(1),
        Duration::from_secs(u64::MAX / 2),
        Duration::from_secs(100 * 365 * 86400),
    ] {
        let (a, p) = tokio::io::duplex(64);
        peers.push(p);
        let last = Last::new();
        hs.push(reader(IdleIo::new(a, &wheel, d), last));
    }
    tokio::time::sleep(Duration::from_secs(10 * 365 * 86400)).await;
    for h in &hs {
        assert!(
            !h.is_finished(),
            "a huge timeout closed (or panicked) within 10 years"
        );
    }
    let t0 = Instant::now();
    wheel.shutdown().await;
    for h in hs {
        let (k, t) = h.await.unwrap();
        assert_eq!(k, ErrorKind::TimedOut);
        assert!(t - t0 <= SLACK);
    }
}
