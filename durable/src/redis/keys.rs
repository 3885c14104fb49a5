//! Where a queue lives: the keys of each partition, and which partition a task belongs to.
//!
//! Every key of a partition carries the partition's hash tag, so each partition is one Redis
//! Cluster slot and every script runs atomically on one node. With several partitions the tags
//! are chosen so the partitions spread evenly over the slot space (and so over the masters).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::TaskId;

/// A name for one call (or one invocation of a script carrying several), unique across
/// processes: its retries carry it, so a store step that already ran for it is recognised.
pub(super) fn call_id() -> String {
    static PROCESS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let process = PROCESS.get_or_init(|| TaskId::generate().0);
    format!("{process}.{:x}", CALLS.fetch_add(1, Ordering::Relaxed))
}

/// The keys of one partition of a queue.
pub(super) struct Keys {
    prefix: String,
    /// The partition's hash slot (Redis Cluster), where `WAIT` is sent.
    pub(super) slot: u16,
    pub(super) payload: String,
    pub(super) meta: String,
    pub(super) due: String,
    pub(super) inflight: String,
    pub(super) dead: String,
    pub(super) seq: String,
    pub(super) token: String,
    /// Workers with room for more that found nothing due: the one to wake for a due task.
    pub(super) idle: String,
    pub(super) channel: String,
    /// The partition's counters (a hash).
    pub(super) stats: String,
    /// The lateness of the partition's latest claims (a capped list).
    pub(super) lateness: String,
    /// Set while claiming is paused (`DurableQueue::pause`): one per partition, in its slot.
    pub(super) paused: String,
    /// What this handle last read of the server's clock on the partition's node.
    pub(super) clock: ServerClock,
}

/// A reading of a node's clock (server ms) and the instant it arrived: an estimate of the
/// server's clock now that is never behind it by more than the clocks' drift since (the
/// reading was taken before it arrived), so a deadline derived from it can only be late by
/// the reply's transit.
#[derive(Debug, Default)]
pub(super) struct ServerClock(Mutex<Option<(u64, Instant)>>);

impl ServerClock {
    /// The server's clock now, if a reading younger than `fresh` is known.
    pub(super) fn now_ms(&self, fresh: Duration) -> Option<u64> {
        let reading = *self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (server_ms, at) = reading?;
        let since = at.elapsed();
        (since < fresh).then(|| server_ms.saturating_add(crate::delay_ms(since)))
    }

    /// Notes a reading that just arrived.
    pub(super) fn learn(&self, server_ms: u64) {
        *self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((server_ms, Instant::now()));
    }
}

impl Keys {
    pub(super) fn new(tag: &str) -> Keys {
        let prefix = format!("tw:{{{tag}}}:");
        let key = |part: &str| format!("{prefix}{part}");
        Keys {
            slot: slot_of(tag.as_bytes()),
            payload: key("payload"),
            meta: key("meta"),
            due: key("due"),
            inflight: key("inflight"),
            dead: key("dead"),
            seq: key("seq"),
            token: key("token"),
            idle: key("idle"),
            channel: key("wake"),
            stats: key("stats"),
            lateness: key("lateness"),
            paused: key("paused"),
            clock: ServerClock::default(),
            prefix,
        }
    }

    /// Where the reply of one schedule or finish invocation is kept for a while, so a retry
    /// of that invocation (after a lost reply) is answered again without acting twice.
    pub(super) fn replied(&self, invocation: &str) -> String {
        format!("{}call:{invocation}", self.prefix)
    }

    /// The keys the stats script reads.
    pub(super) fn stats_keys(&self) -> [&str; 5] {
        [
            &self.due,
            &self.inflight,
            &self.dead,
            &self.stats,
            &self.lateness,
        ]
    }

    /// Where a worker's claim calls record what the last of them handed out.
    pub(super) fn claim_record(&self, claimer: &str) -> String {
        format!("{}claim:{claimer}", self.prefix)
    }
}

/// Redis Cluster's hash slot of a hash tag: CRC16 (XMODEM) modulo 16384.
fn slot_of(tag: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in tag {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16_384
}

/// The most partitions a queue may have.
pub(super) const MAX_PARTITIONS: usize = 256;

/// The hash tags of a queue's partitions. One partition keeps the tag `name` (the layout of
/// a queue without partitions). With `n` partitions, partition `p`'s tag is `name~p~k` with
/// the smallest `k` whose slot falls in the `p`-th of `n` equal slices of the 16384 slots, so
/// the partitions spread evenly over the slot space and so over the cluster's masters.
pub(super) fn partition_tags(name: &str, n: usize) -> Vec<String> {
    if n <= 1 {
        return vec![name.to_owned()];
    }
    (0..n)
        .map(|p| {
            let (low, high) = (p * 16_384 / n, (p + 1) * 16_384 / n);
            (0..)
                .map(|k| format!("{name}~{p}~{k}"))
                .find(|tag| (low..high).contains(&usize::from(slot_of(tag.as_bytes()))))
                .expect("some suffix lands in every slice")
        })
        .collect()
}

/// Which partition task `id` lives in (FNV-1a: the same in every process and version).
pub(super) fn partition_of(id: &str, partitions: usize) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in id.as_bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % partitions as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_cluster() {
        // Values from `CLUSTER KEYSLOT`.
        assert_eq!(slot_of(b"foo"), 12_182);
        assert_eq!(slot_of(b"bar"), 5_061);
        assert_eq!(slot_of(b"123456789"), 12_739);
    }

    #[test]
    fn partitions_spread_over_the_slot_space() {
        assert_eq!(partition_tags("q", 1), ["q"]);
        for n in [2, 3, 8, 16] {
            let tags = partition_tags("orders", n);
            for (p, tag) in tags.iter().enumerate() {
                let slot = usize::from(slot_of(tag.as_bytes()));
                assert!(
                    (p * 16_384 / n..(p + 1) * 16_384 / n).contains(&slot),
                    "{tag}"
                );
            }
        }
        let counts = (0..10_000).fold([0; 4], |mut counts, i| {
            counts[partition_of(&format!("task-{i}"), 4)] += 1;
            counts
        });
        assert!(counts.iter().all(|&c| c > 2_000), "{counts:?}");
    }
}
