//! `IdleIo`'s sweeper under paused time: many connections of several timeouts on one wheel,
//! each with its own traffic, requests and drops, each closed exactly after its own silence.

use std::io::ErrorKind;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_wheel::Wheel;
use tokio_wheel::hyper::IdleIo;

/// A small deterministic generator (xorshift64*), so a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// What one connection's peer and handler do, in milliseconds from the start.
#[derive(Debug, Clone)]
enum Step {
    /// The peer sends a byte after this pause.
    Send(u64),
    /// A request is in progress for this long, starting after the pause.
    Busy { after: u64, hold: u64 },
}

/// Every connection closes no earlier than its last traffic (or last request's end) plus its
/// timeout, and within two ticks of it — whether its deadline is near (a fine bucket) or far
/// (a coarse one first), whatever its neighbours do, and while others are dropped.
#[tokio::test(start_paused = true)]
async fn every_connection_closes_exactly_after_its_own_silence() {
    let wheel = Wheel::new();
    let timeouts = [
        Duration::from_millis(300),
        Duration::from_secs(7),
        Duration::from_secs(60),
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut tasks = Vec::new();
    for n in 0..240u64 {
        let timeout = timeouts[(n % 3) as usize];
        let steps: Vec<Step> = (0..rng.below(6))
            .map(|_| {
                let limit = timeout.as_millis() as u64 * 2;
                if rng.below(3) == 0 {
                    Step::Busy {
                        after: rng.below(limit),
                        hold: rng.below(limit * 2),
                    }
                } else {
                    Step::Send(rng.below(limit))
                }
            })
            .collect();
        // Every tenth connection is dropped part-way, before it could close.
        let dropped_after = (n % 10 == 0).then(|| rng.below(timeout.as_millis() as u64));
        let wheel = wheel.clone();
        tasks.push(tokio::spawn(async move {
            let (stream, mut peer) = tokio::io::duplex(64);
            let mut io = IdleIo::new(stream, &wheel, timeout);
            let idle = io.handle();
            // The silence begins at the last of: creation, a byte sent, a request's end. The
            // peer and the requests act from a task of their own, as a handler may: only the
            // IO's own wake-ups bring its task back.
            let quiet_from = Arc::new(Mutex::new(Instant::now()));
            let driver = tokio::spawn({
                let quiet_from = quiet_from.clone();
                async move {
                    for step in &steps {
                        match *step {
                            Step::Send(pause) => {
                                tokio::time::sleep(Duration::from_millis(pause)).await;
                                peer.write_all(b"x").await.unwrap();
                                *quiet_from.lock().unwrap() = Instant::now();
                            }
                            Step::Busy { after, hold } => {
                                tokio::time::sleep(Duration::from_millis(after)).await;
                                let busy = idle.busy();
                                tokio::time::sleep(Duration::from_millis(hold)).await;
                                drop(busy);
                                *quiet_from.lock().unwrap() = Instant::now();
                            }
                        }
                    }
                    peer
                }
            });
            let reader = async {
                let mut buf = [0; 8];
                loop {
                    match io.read(&mut buf).await {
                        Ok(0) => panic!("end of file instead of a close"),
                        Ok(_) => {}
                        Err(error) => return (error, Instant::now()),
                    }
                }
            };
            let dropper = async {
                match dropped_after {
                    Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                    None => std::future::pending().await,
                }
            };
            let outcome = tokio::select! {
                biased;
                (error, at) = reader => {
                    Some((error.kind(), at, *quiet_from.lock().unwrap(), timeout))
                }
                () = dropper => None,
            };
            driver.abort();
            outcome
        }));
    }
    let mut closed = 0;
    for task in tasks {
        // An hour of paused time passes at once: a connection never closed fails, not hangs.
        let outcome = tokio::time::timeout(Duration::from_secs(3600), task)
            .await
            .expect("a connection was never closed")
            .unwrap();
        if let Some((kind, at, quiet_from, timeout)) = outcome {
            closed += 1;
            assert_eq!(kind, ErrorKind::TimedOut);
            let silence = at - quiet_from;
            assert!(
                silence >= timeout,
                "closed after {silence:?} of {timeout:?}"
            );
            assert!(
                silence <= timeout + Duration::from_millis(2),
                "closed {silence:?} after its silence began, timeout {timeout:?}"
            );
        }
    }
    assert!(closed >= 200, "only {closed} connections closed");
}

/// Once every connection of a timeout is dropped, long before their deadlines, the group lets
/// go at once: its sweeper ends and no wheel timer is left pending for connections that are
/// gone (the actor may then exit, as with no `IdleIo` at all).
#[tokio::test(start_paused = true)]
async fn dropping_every_connection_ends_the_sweeper_and_its_timer() {
    let wheel = Wheel::new();
    let mut ios = Vec::new();
    let mut peers = Vec::new();
    for _ in 0..10 {
        let (stream, peer) = tokio::io::duplex(64);
        let mut io = IdleIo::new(stream, &wheel, Duration::from_secs(60));
        let read = tokio::time::timeout(Duration::from_millis(1), io.read(&mut [0; 8])).await;
        assert!(read.is_err(), "no byte, no close yet");
        ios.push(io);
        peers.push(peer);
    }
    tokio::task::yield_now().await;
    wheel.flush().await;
    assert_eq!(wheel.stats().pending, 1, "one timer: the group's sweeper");
    drop(ios);
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    wheel.flush().await;
    assert_eq!(wheel.stats().pending, 0, "the sweeper still waits");
}

/// Connections with as many timeouts as there are connections (a jittered idle timeout) cost
/// what connections with one timeout cost: one sweeper and one wheel timer for the whole
/// wheel, each connection closing exactly after its own timeout. (An outside attack found a
/// group per timeout, looked up in a list: making 16 000 such connections took seconds.)
#[tokio::test(start_paused = true)]
async fn distinct_timeouts_share_one_sweeper_and_each_closes_on_time() {
    let wheel = Wheel::new();
    let mut readers = Vec::new();
    let mut peers = Vec::new();
    let mut ios = Vec::new();
    for n in 0..2_000u64 {
        let timeout = Duration::from_secs(3) + Duration::from_micros(n * 997);
        let (stream, peer) = tokio::io::duplex(64);
        let mut io = IdleIo::new(stream, &wheel, timeout);
        let read = tokio::time::timeout(Duration::ZERO, io.read(&mut [0; 8])).await;
        assert!(read.is_err(), "nothing to read, nothing closed");
        ios.push((io, timeout, Instant::now()));
        peers.push(peer);
    }
    tokio::task::yield_now().await;
    wheel.flush().await;
    assert_eq!(
        wheel.stats().pending,
        1,
        "one sweeper timer for every timeout"
    );
    for (mut io, timeout, created) in ios {
        readers.push(tokio::spawn(async move {
            let error = io.read(&mut [0; 8]).await.unwrap_err();
            (error.kind(), Instant::now() - created, timeout)
        }));
    }
    for reader in readers {
        let (kind, after, timeout) = reader.await.unwrap();
        assert_eq!(kind, ErrorKind::TimedOut);
        assert!(after >= timeout, "closed after {after:?} of {timeout:?}");
        assert!(
            after <= timeout + Duration::from_millis(2),
            "closed after {after:?} of {timeout:?}"
        );
    }
    drop(peers);
}
