//! A deterministic generator, shared with the queue crate's tests (`durable/tests/support`).

/// A small deterministic generator (xorshift): tests need repeatable spread, not quality.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in `0..max` milliseconds, microsecond grain.
    pub fn millis(&mut self, max: u64) -> std::time::Duration {
        std::time::Duration::from_micros(self.below(max * 1_000))
    }
}
