//! [`PoolMetrics`] snapshots and [`PoolAudit`] recounts.

/// A consistent snapshot of a pool's occupancy and lifetime counters.
///
/// Occupancy (`free + inactive + in_use == total`) is read under the pool lock,
/// so it is exact at one instant; counters only grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolMetrics {
    /// Blocks in the pool.
    pub total_blocks: usize,
    /// Blocks in the free pool.
    pub free_blocks: usize,
    /// Registered blocks no handle holds: cached, matchable, evictable.
    pub inactive_blocks: usize,
    /// Blocks some handle holds (mutable, staged or registered).
    pub in_use_blocks: usize,
    /// Blocks handed out by allocations.
    pub allocations: u64,
    /// Blocks registered (including deduplicated and duplicate ones).
    pub registrations: u64,
    /// Registrations answered with an already registered block.
    pub deduplications: u64,
    /// Hashes passed to `match_blocks`.
    pub match_hashes_requested: u64,
    /// Of those, hashes that matched.
    pub match_hashes_hit: u64,
    /// Cached blocks evicted to satisfy allocations or `clear_cache`.
    pub evictions: u64,
}

/// Where every block is, recounted slot by slot by
/// [`BlockManager::audit`](crate::BlockManager::audit).
///
/// The five block counts partition the pool: they always sum to the total.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolAudit {
    /// Blocks on the free list.
    pub free_blocks: usize,
    /// Blocks owned by a `MutableBlock` or `CompleteBlock`.
    pub held_blocks: usize,
    /// Registered blocks pinned by at least one handle.
    pub active_blocks: usize,
    /// Registered blocks no handle pins (cached).
    pub inactive_blocks: usize,
    /// Second physical copies kept under `DuplicatePolicy::Allow`.
    pub duplicate_blocks: usize,
    /// Hashes in the registry (one per active or inactive block).
    pub registered_hashes: usize,
}

impl PoolAudit {
    /// Blocks some handle holds: held, active and duplicate.
    pub fn in_use_blocks(&self) -> usize {
        self.held_blocks + self.active_blocks + self.duplicate_blocks
    }

    /// All blocks counted.
    pub fn total_blocks(&self) -> usize {
        self.free_blocks + self.in_use_blocks() + self.inactive_blocks
    }
}
