//! Outside attack on IdleIo memory: dropped idle connections give their memory back without
//! waiting for their deadlines; churn does not grow memory.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio_wheel::Wheel;
use tokio_wheel::hyper::IdleIo;

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LIVE.fetch_add(n as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// The allocation counter is process-wide: the tests of this file run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// Polls a read once (so the connection is filed as waiting) and returns.
fn poll_read_once(io: &mut IdleIo<tokio::io::DuplexStream>) {
    let mut buf = [0u8; 8];
    let fut = io.read(&mut buf);
    let mut fut = std::pin::pin!(fut);
    let w = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(w);
    assert!(fut.as_mut().poll(&mut cx).is_pending());
}

use std::future::Future;

fn n() -> usize {
    std::env::var("ATTACK_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000)
}

async fn run_once(wheel: &Wheel, timeouts: &[Duration], poll: bool) -> (isize, isize) {
    let count = n();
    let t0 = std::time::Instant::now();
    let base = live();
    let mut ios = Vec::with_capacity(count);
    let mut peers = Vec::with_capacity(count);
    for i in 0..count {
        let (a, p) = tokio::io::duplex(64);
        let mut io = IdleIo::new(a, wheel, timeouts[i % timeouts.len()]);
        if poll {
            poll_read_once(&mut io);
        }
        ios.push(io);
        peers.push(p);
        if i % 1000 == 0 {
            tokio::task::yield_now().await;
        }
    }
    settle().await;
    eprintln!("  created {count} in {:?}", t0.elapsed());
    let peak = live() - base;
    let t1 = std::time::Instant::now();
    drop(ios);
    drop(peers);
    eprintln!("  dropped in {:?}", t1.elapsed());
    settle().await;
    (peak, live() - base)
}

/// 10^5 polled idle connections (one-hour timeout) dropped: memory back within 1 MiB of the
/// baseline without waiting an hour.
#[tokio::test]
async fn dropped_polled_idle_connections_give_memory_back() {
    let _serial = serial().await;
    let wheel = Wheel::new();
    // warm up the wheel (its first allocations are not the connections')
    let _ = run_once(&wheel, &[Duration::from_secs(3600)], true).await;
    let (peak, after) = run_once(&wheel, &[Duration::from_secs(3600)], true).await;
    eprintln!("polled, one timeout: peak {peak} B, after drop {after} B");
    assert!(
        after < 1 << 20,
        "after dropping {} idle connections, {after} bytes still held (peak {peak})",
        n()
    );
}

/// Same, never polled.
#[tokio::test]
async fn dropped_unpolled_idle_connections_give_memory_back() {
    let _serial = serial().await;
    let wheel = Wheel::new();
    let _ = run_once(&wheel, &[Duration::from_secs(3600)], false).await;
    let (peak, after) = run_once(&wheel, &[Duration::from_secs(3600)], false).await;
    eprintln!("unpolled: peak {peak} B, after drop {after} B");
    assert!(
        after < 1 << 20,
        "after dropping {} idle connections, {after} bytes still held (peak {peak})",
        n()
    );
}

/// Many distinct timeouts (many groups): all given back.
#[tokio::test]
async fn dropped_many_timeouts_give_memory_back() {
    let _serial = serial().await;
    let wheel = Wheel::new();
    let timeouts: Vec<Duration> = (0..1000u64)
        .map(|i| Duration::from_secs(3600) + Duration::from_millis(i))
        .collect();
    let _ = run_once(&wheel, &timeouts, true).await;
    let (peak, after) = run_once(&wheel, &timeouts, true).await;
    eprintln!("1000 timeouts: peak {peak} B, after drop {after} B");
    assert!(
        after < 1 << 20,
        "after dropping {} idle connections of 1000 timeouts, {after} bytes still held (peak {peak})",
        n()
    );
}

/// Many distinct timeouts, each used once then dropped, across rounds: memory must not grow
/// with the number of distinct timeouts ever used.
#[tokio::test]
async fn distinct_timeouts_churn_does_not_grow() {
    let _serial = serial().await;
    let wheel = Wheel::new();
    let mut k = 0u64;
    let mut round = |wheel: Wheel| {
        let mut ios = Vec::new();
        let mut peers = Vec::new();
        for _ in 0..20_000 {
            k += 1;
            let (a, p) = tokio::io::duplex(64);
            let mut io = IdleIo::new(
                a,
                &wheel,
                Duration::from_secs(3600) + Duration::from_micros(k * 1000),
            );
            poll_read_once(&mut io);
            ios.push(io);
            peers.push(p);
        }
        (ios, peers)
    };
    let r = round(wheel.clone());
    drop(r);
    settle().await;
    let base = live();
    for _ in 0..5 {
        let r = round(wheel.clone());
        drop(r);
        settle().await;
    }
    let grown = live() - base;
    eprintln!("after 5 rounds of 20000 distinct timeouts: grown {grown} B");
    assert!(
        grown < 1 << 20,
        "memory grew by {grown} bytes over 100000 connections of distinct timeouts, all dropped"
    );
}

/// Several wheels: dropping the connections and the wheels gives everything back.
#[tokio::test]
async fn wheels_and_connections_dropped() {
    let _serial = serial().await;
    // warm-up
    {
        let w = Wheel::new();
        let _ = run_once(&w, &[Duration::from_secs(60)], true).await;
        w.shutdown().await;
    }
    settle().await;
    let base = live();
    for _ in 0..3 {
        let w = Wheel::new();
        let _ = run_once(
            &w,
            &[Duration::from_secs(60), Duration::from_secs(61)],
            true,
        )
        .await;
        drop(w);
        settle().await;
    }
    let grown = live() - base;
    eprintln!("3 wheels with 10^5 dropped connections each, wheels dropped: grown {grown} B");
    assert!(grown < 1 << 20, "grew {grown} bytes");
}
