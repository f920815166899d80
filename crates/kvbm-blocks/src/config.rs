//! The choices a pool is built with: eviction order and duplicate handling.

/// Which cached (inactive) block an allocation evicts when the free pool is dry.
///
/// Every policy is O(1) per operation (amortized for the frequency sketch's
/// periodic aging); none scans the pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EvictionPolicy {
    /// Least recently released first. O(1) insert, remove and evict on an
    /// intrusive list; no memory beyond two links per block.
    #[default]
    Lru,
    /// Frequency-aware multi-level LRU (TinyLFU-style). A count-min sketch
    /// (4 rows of counts saturating at 15, 256 counters per pool block up to
    /// 2 Mi, halved every `10 × width` increments) counts registrations and
    /// hits per hash, and remembers them across evictions. A released block
    /// joins one of four LRU levels by its count (0–2, 3–7, 8–14, 15);
    /// eviction takes the coldest non-empty level's oldest block. O(1) per
    /// operation: 4 sketch updates per hit, at most 4 list probes per
    /// eviction, and the aging pass amortized over `10 × width` updates.
    MultiLevelLru,
    /// Lineage-aware: evicts leaves (blocks no registered block extends)
    /// before their parents, so shared prefixes outlive the suffixes that
    /// hang off them. Each block counts its registered children; a parent
    /// whose last child is evicted becomes a leaf at the cold end, where the
    /// evicted child was. When no cached leaf exists, the oldest cached
    /// parent goes. O(1) per operation (one registry lookup at registration).
    Lineage,
}

/// What `register_block` does when the hash is already registered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DuplicatePolicy {
    /// Return a handle to the block already registered and give the new one
    /// back to the free pool: one physical block per hash.
    #[default]
    Deduplicate,
    /// Keep the new block as a second physical copy. The copy is usable
    /// through its handles but never matched, and goes straight back to the
    /// free pool (not the cache) when its last handle drops.
    Allow,
}
