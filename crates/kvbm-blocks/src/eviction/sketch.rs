//! [`FrequencySketch`]: a count-min sketch of access frequency per hash,
//! TinyLFU-style: four rows of saturating 4-bit counts (kept in bytes),
//! halved periodically so old popularity fades.

use std::hash::BuildHasher;

use foldhash::fast::FixedState;

const ROWS: usize = 4;
const MAX_COUNT: u8 = FrequencySketch::MAX_COUNT;
/// Seeds for the per-row hash functions; any distinct values do.
const SEEDS: [u64; ROWS] = [
    0x9e37_79b9_7f4a_7c15,
    0xc2b2_ae3d_27d4_eb4f,
    0x1656_67b1_9e37_79f9,
    0x27d4_eb2f_1656_67c5,
];

/// How often each block hash was seen, approximately and in bounded memory:
/// the multi-level eviction policy's popularity estimate, and a lower tier's
/// hit count for selective offload. A count never underestimates (until
/// aging halves every count after 10 × width increments) and saturates at
/// [`MAX_COUNT`](Self::MAX_COUNT).
///
/// ```
/// use kvbm_blocks::FrequencySketch;
///
/// let mut sketch = FrequencySketch::new(1024);
/// sketch.increment(7);
/// sketch.increment(7);
/// assert_eq!(sketch.estimate(7), 2);
/// assert_eq!(sketch.estimate(8), 0);
/// ```
#[derive(Debug)]
pub struct FrequencySketch {
    counts: Vec<u8>,
    mask: usize,
    increments: usize,
    /// Halve every count after this many increments (10 × width, as TinyLFU).
    sample_size: usize,
    rows: [FixedState; ROWS],
}

impl FrequencySketch {
    /// The highest count an estimate reaches.
    pub const MAX_COUNT: u8 = 15;

    /// A sketch for a pool of `capacity` blocks.
    ///
    /// The hashes worth remembering far outnumber the blocks (evicted ones
    /// included), and absolute counts only separate hot from cold while the
    /// sketch is sparse, so it is 256 counters wide per pool block, clamped
    /// to 4 Ki..2 Mi (at most 8 MiB for the four rows). Measured on the
    /// Mooncake conversation trace: a pool-sized sketch collided so much that
    /// hit rates fell 3-8 points below plain LRU.
    pub fn new(capacity: usize) -> Self {
        let width = capacity
            .saturating_mul(256)
            .clamp(1 << 12, 1 << 21)
            .next_power_of_two();
        Self {
            counts: vec![0; width * ROWS],
            mask: width - 1,
            increments: 0,
            sample_size: width.saturating_mul(10),
            rows: SEEDS.map(FixedState::with_seed),
        }
    }

    fn cell(&self, row: usize, key: u128) -> usize {
        row * (self.mask + 1) + (self.rows[row].hash_one(key) as usize & self.mask)
    }

    /// Counts one access to `key`.
    pub fn increment(&mut self, key: u128) {
        for row in 0..ROWS {
            let cell = self.cell(row, key);
            if self.counts[cell] < MAX_COUNT {
                self.counts[cell] += 1;
            }
        }
        self.increments += 1;
        if self.increments >= self.sample_size {
            self.age();
        }
    }

    /// The estimated access count of `key` (never an underestimate, before aging).
    pub fn estimate(&self, key: u128) -> u8 {
        (0..ROWS)
            .map(|row| self.counts[self.cell(row, key)])
            .min()
            .unwrap_or(0)
    }

    /// Halves every count: the amortized O(1) aging of TinyLFU.
    fn age(&mut self) {
        for count in &mut self.counts {
            *count /= 2;
        }
        self.increments /= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_saturate_and_age() {
        let mut sketch = FrequencySketch::new(64);
        for _ in 0..20 {
            sketch.increment(7);
        }
        assert_eq!(sketch.estimate(7), MAX_COUNT);
        assert_eq!(sketch.estimate(8), 0);
        sketch.age();
        assert_eq!(sketch.estimate(7), MAX_COUNT / 2);
    }

    #[test]
    fn aging_triggers_after_sample_size_increments() {
        let mut sketch = FrequencySketch::new(64);
        for _ in 0..10 {
            sketch.increment(1);
        }
        // Other traffic up to one increment short of 10 × width.
        for _ in 10..sketch.sample_size - 1 {
            sketch.increment(2);
        }
        assert_eq!(sketch.estimate(1), 10);
        sketch.increment(2);
        assert_eq!(sketch.estimate(1), 5, "old popularity fades");
    }
}
