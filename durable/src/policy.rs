//! [`RetryPolicy`]: how long a retried task waits, and how often it may be delivered.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Exponential backoff with a cap, optional jitter, and a bound on deliveries.
///
/// The delay before delivery `attempt + 1` is `min(initial · 2^(attempt − 1), max)`, then moved
/// by up to ± `jitter` of itself. A task is delivered at most `max_attempts` times: `retry()` of
/// the last delivery, or its lease expiring, moves it to the dead letters.
///
/// ```
/// use std::time::Duration;
/// use tokio_wheel_durable::RetryPolicy;
///
/// let policy = RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(60)).max_attempts(5);
/// assert_eq!(policy.delay(1), Duration::from_secs(1));
/// assert_eq!(policy.delay(3), Duration::from_secs(4));
/// assert_eq!(policy.delay(10), Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    initial: Duration,
    max: Duration,
    jitter: f64,
    max_attempts: u32,
}

impl Default for RetryPolicy {
    /// Exponential from 1 s to 1 h, no jitter, 10 deliveries at most.
    fn default() -> Self {
        RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(3_600))
    }
}

impl RetryPolicy {
    /// Backoff doubling from `initial` up to `max`; 10 deliveries at most, no jitter.
    pub fn exponential(initial: Duration, max: Duration) -> Self {
        RetryPolicy {
            initial,
            max: max.max(initial),
            jitter: 0.0,
            max_attempts: 10,
        }
    }

    /// Moves each delay by a random amount up to ± `fraction` of it (clamped to 0..=1).
    pub fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = if fraction.is_finite() {
            fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self
    }

    /// Delivers a task at most `n` times (at least once).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// The most deliveries of one task.
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The delay after delivery number `attempt` (1-based) failed, before jitter.
    pub fn delay(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(63);
        self.initial
            .checked_mul(1u32.checked_shl(doublings).unwrap_or(u32::MAX))
            .unwrap_or(self.max)
            .min(self.max)
    }

    /// The delay with jitter applied.
    pub(crate) fn jittered_delay(&self, attempt: u32) -> Duration {
        let delay = self.delay(attempt);
        if self.jitter == 0.0 {
            return delay;
        }
        // Uniform in [-1, 1): enough randomness to spread retries, no dependency needed.
        let unit = (next_random() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
        delay.mul_f64((1.0 + unit * self.jitter).max(0.0))
    }
}

fn next_random() -> u64 {
    static STATE: AtomicU64 = AtomicU64::new(0);
    let mut x = STATE.load(Ordering::Relaxed);
    if x == 0 {
        x = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0x9E37_79B9, |d| d.as_nanos() as u64)
            | 1;
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    STATE.store(x, Ordering::Relaxed);
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_and_cap() {
        let policy = RetryPolicy::exponential(Duration::from_millis(100), Duration::from_secs(1));
        let delays: Vec<_> = (1..=6).map(|a| policy.delay(a).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(policy.delay(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn jitter_stays_within_its_fraction() {
        let policy =
            RetryPolicy::exponential(Duration::from_secs(10), Duration::from_secs(10)).jitter(0.2);
        for _ in 0..1_000 {
            let delay = policy.jittered_delay(1);
            assert!(
                delay >= Duration::from_secs(8) && delay <= Duration::from_secs(12),
                "{delay:?}"
            );
        }
    }

    #[test]
    fn defaults_match_the_contract() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.attempts(), 10);
        assert_eq!(policy.delay(1), Duration::from_secs(1));
        assert_eq!(policy.delay(20), Duration::from_secs(3_600));
    }
}
