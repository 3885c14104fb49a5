//! The instant-messaging ack-timeout pattern with keyed timers.
//!
//! A server pushes messages to a client over a lossy link. Every message gets a keyed timer;
//! the client's ack removes it (`take` tells whether the ack beat the timer); an expired timer
//! resends the message, with backoff, up to a retry cap. The client drops duplicates.
//!
//! Run: `cargo run --release --example ack_timeouts` (`-- --quick` for a shorter run).

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_wheel::Wheel;

const MAX_ATTEMPTS: u32 = 5;

/// A cheap deterministic generator for the simulated losses.
struct Rng(u64);

impl Rng {
    fn chance(&mut self, percent: u64) -> bool {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % 100 < percent
    }

    fn millis(&mut self, max: u64) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_millis(self.0 % max)
    }
}

/// What the server keeps per unacknowledged message.
struct InFlight {
    attempt: u32,
    first_sent: Instant,
}

/// A client behind a link that loses 30% of messages and 10% of acks, and acks after up to
/// 40 ms.
async fn client(
    mut inbox: mpsc::UnboundedReceiver<u64>,
    acks: mpsc::UnboundedSender<u64>,
) -> usize {
    let mut rng = Rng(0x5EED_1234_ABCD_0001);
    let mut seen = HashSet::new();
    let mut duplicates = 0;
    while let Some(id) = inbox.recv().await {
        if rng.chance(30) {
            continue; // lost on the way in
        }
        if !seen.insert(id) {
            duplicates += 1;
        }
        let ack_lost = rng.chance(10);
        let delay = rng.millis(40);
        let acks = acks.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if !ack_lost {
                let _ = acks.send(id);
            }
        });
    }
    duplicates
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let messages: u64 = if quick { 200 } else { 2_000 };
    let ack_timeout = Duration::from_millis(if quick { 60 } else { 100 });
    let wheel = Wheel::builder().name("acks").build();
    let (timers, mut expired) = wheel.keyed::<u64, InFlight>();
    let (link, inbox) = mpsc::unbounded_channel();
    let (ack_sender, mut acks) = mpsc::unbounded_channel();
    let client = tokio::spawn(client(inbox, ack_sender));

    println!(
        "pushing {messages} messages; ack timeout {ack_timeout:?}, at most {MAX_ATTEMPTS} attempts each"
    );
    let start = Instant::now();
    for id in 0..messages {
        let _ = link.send(id);
        timers.set(
            id,
            InFlight {
                attempt: 1,
                first_sent: Instant::now(),
            },
            ack_timeout,
        );
    }

    let (mut delivered, mut late_acks, mut resent, mut failed) = (0u64, 0u64, 0u64, Vec::new());
    let mut latencies = Vec::new();
    while delivered + (failed.len() as u64) < messages {
        tokio::select! {
            Some(id) = acks.recv() => match timers.take(&id).await {
                Some(in_flight) => {
                    delivered += 1;
                    latencies.push(in_flight.first_sent.elapsed());
                }
                None => late_acks += 1, // its timer fired first: already resent or given up
            },
            Some(expiry) = expired.next() => {
                let (id, in_flight) = expiry.into_parts();
                if in_flight.attempt == MAX_ATTEMPTS {
                    failed.push(id);
                    continue;
                }
                resent += 1;
                let _ = link.send(id);
                let backoff = ack_timeout * 2u32.pow(in_flight.attempt);
                timers.set(id, InFlight { attempt: in_flight.attempt + 1, ..in_flight }, backoff);
            }
        }
    }
    drop(link);
    let duplicates = client.await.expect("client task");
    latencies.sort_unstable();

    println!("done in {:.2} s", start.elapsed().as_secs_f64());
    println!("  delivered (acked): {delivered}");
    println!("  resent on timeout: {resent}");
    println!("  late acks (ack after its timer fired): {late_acks}");
    println!("  duplicates dropped by the client: {duplicates}");
    println!("  failed after {MAX_ATTEMPTS} attempts: {}", failed.len());
    if let (Some(p50), Some(max)) = (latencies.get(latencies.len() / 2), latencies.last()) {
        println!("  time to ack: p50 {p50:?}, max {max:?}");
    }
    let stats = wheel.stats();
    println!(
        "  wheel: {} timers set, {} fired, {} removed by acks, {} pending",
        stats.inserted, stats.fired, stats.cancelled, stats.pending
    );
    assert_eq!(
        delivered + failed.len() as u64,
        messages,
        "every message is acked or given up"
    );
    assert_eq!(timers.len().await, 0, "no timer left behind");
    wheel.shutdown().await;
}
