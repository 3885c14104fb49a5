//! What an idle `IdleIo` costs in heap bytes, against a tokio `Sleep` per connection, and that
//! the memory of dropped connections comes back without waiting for their deadlines. Its own
//! test binary: the counting allocator sees the whole process.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, DuplexStream, ReadBuf};
use tokio_wheel::Wheel;
use tokio_wheel::hyper::IdleIo;

#[path = "../../tests/support/counting.rs"]
mod counting;
use counting::{Counting, LIVE};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const N: usize = 20_000;
const TIMEOUT: Duration = Duration::from_secs(60);

fn live() -> isize {
    LIVE.load(Ordering::SeqCst)
}

/// Polls a read once, as a connection's task does before it waits: the IO files its timer.
fn wait_once(io: &mut IdleIo<DuplexStream>) {
    let mut buf = [0; 8];
    let mut buf = ReadBuf::new(&mut buf);
    let polled = Pin::new(io).poll_read(&mut Context::from_waker(Waker::noop()), &mut buf);
    assert!(polled.is_pending());
}

#[tokio::test]
async fn an_idle_connection_costs_less_than_a_tokio_sleep_and_a_dropped_one_gives_it_back() {
    let wheel = Wheel::new();
    // Warm-up: the wheel's group for this timeout exists and its sweeper runs.
    let (warm, _warm_peer) = tokio::io::duplex(64);
    let mut warm = IdleIo::new(warm, &wheel, TIMEOUT);
    wait_once(&mut warm);
    tokio::task::yield_now().await;

    let (mut streams, peers): (Vec<_>, Vec<_>) = (0..N).map(|_| tokio::io::duplex(64)).unzip();
    let mut ios = Vec::with_capacity(N);
    let mut unwrapped = Vec::with_capacity(N);
    let before = live();
    for stream in streams.drain(..) {
        ios.push(IdleIo::new(stream, &wheel, TIMEOUT));
    }
    for io in &mut ios {
        wait_once(io);
    }
    // The heap it took, plus what `IdleIo` adds to the connection's own memory.
    let inline = size_of::<IdleIo<DuplexStream>>() - size_of::<DuplexStream>();
    let wheel_bytes = (live() - before) as usize / N + inline;

    let mut sleeps = Vec::with_capacity(N);
    let before_sleeps = live();
    for _ in 0..N {
        let mut sleep = Box::pin(tokio::time::sleep(TIMEOUT));
        let polled = sleep.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        assert_eq!(polled, Poll::Pending);
        sleeps.push(sleep);
    }
    // The same for a boxed tokio `Sleep`, whose pointer the connection holds.
    let tokio_bytes =
        (live() - before_sleeps) as usize / N + size_of::<Pin<Box<tokio::time::Sleep>>>();
    drop(sleeps);
    assert!(
        wheel_bytes < tokio_bytes,
        "an idle IdleIo adds {wheel_bytes} bytes, a tokio Sleep {tokio_bytes}"
    );

    // Dropped long before their deadlines: the group gives their memory back now, bar a
    // bounded remainder (the compaction threshold), not after the 60 s timeout.
    for io in ios.drain(..) {
        unwrapped.push(io.into_inner()); // the stream stays; the idle timeout goes
    }
    let left = live() - before;
    assert!(
        left < 1024 * 96,
        "{left} bytes still held after dropping {N} idle connections"
    );
    drop((unwrapped, peers));

    // A timeout per connection (jittered) costs the same: one group per wheel, not per
    // timeout.
    let (mut streams, peers): (Vec<_>, Vec<_>) = (0..N).map(|_| tokio::io::duplex(64)).unzip();
    let mut ios = Vec::with_capacity(N);
    let before = live();
    for (n, stream) in streams.drain(..).enumerate() {
        let timeout = TIMEOUT + Duration::from_micros(n as u64 * 997);
        ios.push(IdleIo::new(stream, &wheel, timeout));
    }
    for io in &mut ios {
        wait_once(io);
    }
    let jittered_bytes = (live() - before) as usize / N + inline;
    assert!(
        jittered_bytes < tokio_bytes,
        "an idle IdleIo with a timeout of its own adds {jittered_bytes} bytes, a tokio Sleep {tokio_bytes}"
    );
    drop((ios, peers));
}
