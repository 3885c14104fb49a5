//! Outside attack on IdleIo's Busy guards, touch(), split IO and pending writes.

use std::io::ErrorKind;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_wheel::Wheel;
use tokio_wheel::hyper::IdleIo;

#[path = "support/attack.rs"]
mod attack;
use attack::*;

/// A guard dropped at any sub-tick phase: closes in [drop + d, drop + d + 2ms].
#[tokio::test(start_paused = true)]
async fn guard_drop_phases_paused() {
    let d = ms(10);
    for hold_us in (0..30_000u64).step_by(250) {
        let wheel = Wheel::new();
        let (a, _peer) = tokio::io::duplex(64);
        let mut io = IdleIo::new(a, &wheel, d);
        let busy = io.handle().busy();
        let h = tokio::spawn(async move { read_err(&mut io).await });
        tokio::task::yield_now().await;
        // hold: advance in 250us steps (sub-ms phases), letting everything run between
        let start = Instant::now();
        while Instant::now() < start + us(hold_us) {
            tokio::time::advance(us(250)).await;
            for _ in 0..5 {
                tokio::task::yield_now().await;
            }
            assert!(
                !h.is_finished(),
                "hold {hold_us}us: closed while a guard lives"
            );
        }
        let dropped = Instant::now();
        drop(busy);
        let (k, t) = h.await.unwrap();
        assert_eq!(k, ErrorKind::TimedOut);
        assert!(
            t >= dropped + d,
            "hold {hold_us}us: closed EARLY {:?} after guard drop",
            t - dropped
        );
        assert!(
            t <= dropped + d + SLACK,
            "hold {hold_us}us: closed LATE {:?} after guard drop",
            t - dropped
        );
    }
}

/// A guard taken shortly before the deadline (sub-tick), held long: never closed while it lives.
#[tokio::test(start_paused = true)]
async fn guard_taken_just_before_deadline_paused() {
    let d = ms(10);
    for before_us in [1u64, 50, 100, 250, 500, 900, 999, 1000, 1001, 1500, 2000] {
        let wheel = Wheel::new();
        let (a, _peer) = tokio::io::duplex(64);
        let mut io = IdleIo::new(a, &wheel, d);
        let idle = io.handle();
        let created = Instant::now();
        let h = tokio::spawn(async move { read_err(&mut io).await });
        tokio::task::yield_now().await;
        tokio::time::advance(d - us(before_us)).await;
        assert!(
            !h.is_finished(),
            "closed {:?} after creation, before d",
            Instant::now() - created
        );
        let busy = idle.busy();
        tokio::time::sleep(ms(100)).await;
        assert!(
            !h.is_finished(),
            "{before_us}us before deadline: closed while a guard lives"
        );
        let dropped = Instant::now();
        drop(busy);
        let (k, t) = h.await.unwrap();
        assert_eq!(k, ErrorKind::TimedOut);
        assert!(
            t >= dropped + d && t <= dropped + d + SLACK,
            "{before_us}: closed {:?} after drop",
            t - dropped
        );
    }
}

/// Two guards: the countdown restarts at the LAST drop.
#[tokio::test(start_paused = true)]
async fn countdown_restarts_at_last_guard() {
    let wheel = Wheel::new();
    let d = ms(100);
    let (a, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(a, &wheel, d);
    let idle = io.handle();
    let g1 = idle.busy();
    let g2 = idle.busy();
    assert_eq!(idle.busy_count(), 2);
    let h = tokio::spawn(async move { read_err(&mut io).await });
    tokio::time::sleep(ms(50)).await;
    drop(g1);
    tokio::time::sleep(ms(130)).await;
    assert!(!h.is_finished(), "closed while a second guard lives");
    let dropped = Instant::now();
    drop(g2);
    let (k, t) = h.await.unwrap();
    assert_eq!(k, ErrorKind::TimedOut);
    assert!(
        t >= dropped + d && t <= dropped + d + SLACK,
        "closed {:?} after last drop",
        t - dropped
    );
}

/// Guards taken & dropped in rapid succession from many tasks; last drop defines the countdown.
#[tokio::test(start_paused = true)]
async fn many_guard_churn_paused() {
    let wheel = Wheel::new();
    let d = ms(20);
    let (a, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(a, &wheel, d);
    let idle = io.handle();
    let h = tokio::spawn(async move { read_err(&mut io).await });
    let last_drop = Arc::new(std::sync::Mutex::new(Instant::now()));
    let mut ts = Vec::new();
    for i in 0..200u64 {
        let idle = idle.clone();
        let last_drop = last_drop.clone();
        ts.push(tokio::spawn(async move {
            tokio::time::sleep(ms(i % 15)).await;
            let g = idle.busy();
            tokio::time::sleep(ms(5 + (i * 7) % 40)).await;
            *last_drop.lock().unwrap() = Instant::now();
            drop(g);
        }));
    }
    for t in ts {
        t.await.unwrap();
    }
    let ld = *last_drop.lock().unwrap();
    let (k, t) = h.await.unwrap();
    assert_eq!(k, ErrorKind::TimedOut);
    assert!(
        t >= ld + d && t <= ld + d + SLACK,
        "closed {:?} after last drop",
        t.saturating_duration_since(ld)
    );
}

/// touch() from another task keeps it open; closes at last touch + d.
#[tokio::test(start_paused = true)]
async fn touch_from_other_task() {
    let wheel = Wheel::new();
    let d = ms(50);
    let (a, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(a, &wheel, d);
    let idle = io.handle();
    let h = tokio::spawn(async move { read_err(&mut io).await });
    let toucher = tokio::spawn(async move {
        let mut last = Instant::now();
        for _ in 0..40 {
            tokio::time::sleep(ms(49)).await;
            idle.touch();
            last = Instant::now();
        }
        last
    });
    let last = toucher.await.unwrap();
    let (k, t) = h.await.unwrap();
    assert_eq!(k, ErrorKind::TimedOut);
    assert!(
        t >= last + d && t <= last + d + SLACK,
        "closed {:?} after last touch",
        t.saturating_duration_since(last)
    );
}

/// Split IO: reader task waits forever, writer task writes every d/2 (peer reads). Writes are
/// traffic, so the pending read is not closed; after writes stop, closes at last write + d.
#[tokio::test(start_paused = true)]
async fn split_reader_writer_tasks() {
    let wheel = Wheel::new();
    let d = ms(100);
    let (a, mut peer) = tokio::io::duplex(1 << 16);
    let io = IdleIo::new(a, &wheel, d);
    let (mut r, mut w) = tokio::io::split(io);
    let rh = tokio::spawn(async move { read_err(&mut r).await });
    let drain = tokio::spawn(async move {
        let mut buf = [0u8; 1024];
        while let Ok(n) = peer.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    });
    let wh = tokio::spawn(async move {
        let mut last = Instant::now();
        for _ in 0..30 {
            tokio::time::sleep(ms(50)).await;
            w.write_all(b"data").await.unwrap();
            last = Instant::now();
        }
        (w, last)
    });
    let (_w, last) = wh.await.unwrap();
    let (k, t) = rh.await.unwrap();
    assert_eq!(k, ErrorKind::TimedOut);
    assert!(
        t >= last + d && t <= last + d + SLACK,
        "closed {:?} after last write",
        t.saturating_duration_since(last)
    );
    drain.abort();
}

/// A pending write toward a peer that never reads: after d with no byte moved, the write (and
/// the read) answer TimedOut; never before d after the last byte accepted.
#[tokio::test(start_paused = true)]
async fn pending_write_to_nonreading_peer() {
    let wheel = Wheel::new();
    let d = ms(100);
    let (a, _peer) = tokio::io::duplex(64);
    let io = IdleIo::new(a, &wheel, d);
    let (mut r, mut w) = tokio::io::split(io);
    let rh = tokio::spawn(async move { read_err(&mut r).await });
    let data = vec![7u8; 10_000];
    let mut written = 0usize;
    let mut last = Instant::now();
    let err = loop {
        match w.write(&data[written..]).await {
            Ok(n) => {
                written += n;
                last = Instant::now();
            }
            Err(e) => break e,
        }
    };
    let t = Instant::now();
    assert_eq!(written, 64);
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert!(
        t >= last + d && t <= last + d + SLACK,
        "write closed {:?} after last byte",
        t - last
    );
    let (k, t2) = rh.await.unwrap();
    assert_eq!(k, ErrorKind::TimedOut);
    assert!(t2 >= last + d && t2 <= last + d + SLACK);
}

/// Pending write alone (nobody reads the IdleIo), peer never reads.
#[tokio::test(start_paused = true)]
async fn pending_write_only() {
    let wheel = Wheel::new();
    let d = ms(100);
    let (a, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(a, &wheel, d);
    let data = vec![7u8; 10_000];
    let start = Instant::now();
    let e = io.write_all(&data).await.unwrap_err();
    let t = Instant::now() - start;
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    assert!(t >= d && t <= d + SLACK, "{t:?}");
}

/// A guard alive while a write is pending toward a non-reading peer: no close while it lives.
#[tokio::test(start_paused = true)]
async fn pending_write_while_busy() {
    let wheel = Wheel::new();
    let d = ms(100);
    let (a, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(a, &wheel, d);
    let busy = io.handle().busy();
    let h = tokio::spawn(async move {
        let e = io.write_all(&vec![1u8; 1000]).await.unwrap_err();
        (e.kind(), Instant::now())
    });
    tokio::time::sleep(ms(1000)).await;
    assert!(!h.is_finished(), "pending write closed while a guard lives");
    let dropped = Instant::now();
    drop(busy);
    let (k, t) = h.await.unwrap();
    assert_eq!(k, ErrorKind::TimedOut);
    assert!(
        t >= dropped + d && t <= dropped + d + SLACK,
        "{:?}",
        t - dropped
    );
}

/// Multi-thread, real time: guards acquired/dropped from OS threads and other workers racing the
/// deadline. A guard taken while the connection is provably not yet idle for d must keep it open
/// for as long as it lives. Repeated many times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_race_multithread_never_closed_while_held() {
    let wheel = Wheel::new();
    let d = ms(30);
    let failures = Arc::new(AtomicUsize::new(0));
    let mut hs = Vec::new();
    for i in 0..60u64 {
        let wheel = wheel.clone();
        let failures = failures.clone();
        hs.push(tokio::spawn(async move {
            let (a, _peer) = tokio::io::duplex(64);
            let created = Instant::now();
            let mut io = IdleIo::new(a, &wheel, d);
            let idle = io.handle();
            let reader = tokio::spawn(async move { read_err(&mut io).await });
            // acquire on an OS thread a little before the deadline
            let lead = us(500 + (i % 10) * 900); // 0.5 .. 8.6 ms before d
            let idle2 = idle.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            let th = std::thread::spawn(move || {
                let target = std::time::Instant::now() + (d - lead);
                while std::time::Instant::now() < target {
                    std::hint::spin_loop();
                }
                let before = std::time::Instant::now();
                let g = idle2.busy();
                let closed_at_acquire = idle2.is_closed();
                tx.send((before, closed_at_acquire)).unwrap();
                std::thread::sleep(Duration::from_millis(120));
                let closed_while_held = idle2.is_closed();
                let dropped = std::time::Instant::now();
                drop(g);
                (closed_while_held, dropped)
            });
            let _ = created;
            let (closed_while_held, dropped) =
                tokio::task::spawn_blocking(move || th.join().unwrap())
                    .await
                    .unwrap();
            let dropped = Instant::from_std(dropped);
            let (_before, closed_at_acquire) = rx.recv().unwrap();
            // only count it when the guard was taken before the deadline AND it wasn't already
            // closed (spin timing may be late on a loaded machine)
            if !closed_at_acquire && closed_while_held {
                failures.fetch_add(1, Ordering::SeqCst);
                eprintln!("conn {i}: closed while a guard taken {lead:?} before d lived");
            }
            let (k, t) = tokio::time::timeout(d + Duration::from_secs(60), reader)
                .await
                .expect("never closed")
                .unwrap();
            assert_eq!(k, ErrorKind::TimedOut);
            if !closed_at_acquire && t < dropped + d {
                eprintln!(
                    "conn {i}: closed {:?} before guard drop + d",
                    (dropped + d) - t
                );
                failures.fetch_add(1, Ordering::SeqCst);
            }
            let _ = idle;
        }));
    }
    for h in hs {
        h.await.unwrap();
    }
    assert_eq!(failures.load(Ordering::SeqCst), 0);
}

/// Multi-thread real time: one connection, a thread keeps taking/dropping guards with overlaps
/// (there is always at least one alive) for 4·d; the connection must stay open throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_guards_from_threads_keep_open() {
    let wheel = Wheel::new();
    let d = ms(20);
    let (a, _peer) = tokio::io::duplex(64);
    let mut io = IdleIo::new(a, &wheel, d);
    let idle = io.handle();
    let base = idle.busy(); // at least one alive at every instant
    let reader = tokio::spawn(async move { read_err(&mut io).await });
    let stop = Arc::new(AtomicBool::new(false));
    let mut ths = Vec::new();
    for _ in 0..3 {
        let idle = idle.clone();
        let stop = stop.clone();
        ths.push(std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let g = idle.busy();
                if n.is_multiple_of(1000) {
                    std::thread::yield_now();
                }
                drop(g);
                n += 1;
            }
            n
        }));
    }
    // swap the base guard a few times: take a new one before dropping the old
    let mut base = base;
    for _ in 0..20 {
        tokio::time::sleep(ms(10)).await;
        let nb = idle.busy();
        drop(std::mem::replace(&mut base, nb));
        assert!(!idle.is_closed(), "closed while guards were alive");
    }
    stop.store(true, Ordering::Relaxed);
    for t in ths {
        t.join().unwrap();
    }
    assert!(
        !reader.is_finished() && !idle.is_closed(),
        "closed while guards were alive"
    );
    assert_eq!(idle.busy_count(), 1);
    let dropped = Instant::now();
    drop(base);
    let (k, t) = tokio::time::timeout(Duration::from_secs(60), reader)
        .await
        .expect("never closed")
        .unwrap();
    assert_eq!(k, ErrorKind::TimedOut);
    assert!(
        t >= dropped + d,
        "closed {:?} after last drop",
        t.saturating_duration_since(dropped)
    );
}

/// Multi-thread real time: the last guard dropped on an OS thread while the reader is pending on
/// a worker: the reader must still be woken and closed (not hang), not before d after the drop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_dropped_on_os_thread_wakes_reader() {
    let wheel = Wheel::new();
    let d = ms(50);
    let mut rs = Vec::new();
    let mut peers = Vec::new();
    let mut guards = Vec::new();
    for _ in 0..500 {
        let (a, p) = tokio::io::duplex(64);
        peers.push(p);
        let mut io = IdleIo::new(a, &wheel, d);
        guards.push(io.handle().busy());
        rs.push(tokio::spawn(async move { read_err(&mut io).await }));
    }
    tokio::time::sleep(ms(200)).await;
    for r in &rs {
        assert!(!r.is_finished(), "closed while a guard lives");
    }
    let dropped = tokio::task::spawn_blocking(move || {
        let t = Instant::now();
        drop(guards);
        t
    })
    .await
    .unwrap();
    for r in rs {
        let (k, t) = tokio::time::timeout(Duration::from_secs(60), r)
            .await
            .expect("hang")
            .unwrap();
        assert_eq!(k, ErrorKind::TimedOut);
        assert!(
            t >= dropped + d,
            "closed {:?} after drop",
            t.saturating_duration_since(dropped)
        );
    }
}
