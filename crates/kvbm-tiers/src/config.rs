//! [`TierConfig`] and [`OffloadPolicy`]: what a lower tier holds and what it
//! takes from the tier above.

use kvbm_blocks::{BlockManager, EvictionPolicy, FrequencySketch, MAX_BLOCKS};

use crate::{Lower, TierError};

/// A lower tier's pool that several [`Tiers`](crate::Tiers) share (a
/// cluster-wide store, as Mooncake's pools its nodes' memory): two
/// configurations are equal when they name the same pool.
#[derive(Clone, Debug)]
pub(crate) struct SharedPool(pub(crate) BlockManager<Lower>);

impl PartialEq for SharedPool {
    fn eq(&self, other: &Self) -> bool {
        self.0.same_pool(&other.0)
    }
}

impl Eq for SharedPool {}

/// When a lower tier takes a copy of a block from the tier above it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OffloadPolicy {
    /// Every block as soon as the tier above has it (registered on the
    /// device, or stored in the tier above): the default of Dynamo's KVBM,
    /// vLLM's offloading connector and LMCache.
    WriteThrough,
    /// Blocks seen in at least `min_hits` request prefixes (SGLang HiCache's
    /// `write_through_selective`, Dynamo's frequency filter for disk). Hits
    /// are counted in a [`FrequencySketch`], so `min_hits` is at most
    /// [`FrequencySketch::MAX_COUNT`]; 0 or 1 take every block that is hit.
    Selective {
        /// Prefix hits before a block is copied down.
        min_hits: u8,
    },
    /// Blocks the tier above is about to evict (HiCache `write_back`,
    /// Mooncake `offload_on_evict`): the tier above keeps
    /// [`TierConfig::write_back_headroom`] blocks free by writing its
    /// coldest cached blocks down before it needs their room.
    WriteBack,
}

/// One tier below the device (host memory, a disk).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierConfig {
    /// The medium its KV events name (vLLM's `"CPU"`, or a storage tier's
    /// name); also how reports name the tier.
    pub medium: String,
    /// Blocks it holds.
    pub blocks: usize,
    /// Which of its blocks go when it is full.
    pub eviction: EvictionPolicy,
    /// What it takes from the tier above.
    pub offload: OffloadPolicy,
    /// Blocks that may be on their way into it at once; stores past it are
    /// skipped (counted), so a slow tier never builds a backlog without end.
    pub max_incoming_blocks: usize,
    /// Under [`OffloadPolicy::WriteBack`], the free blocks the tier above
    /// keeps by writing its coldest cached blocks down.
    pub write_back_headroom: usize,
    /// The pool, when it is shared with other `Tiers` ([`shared`](Self::shared)).
    pub(crate) pool: Option<SharedPool>,
}

impl TierConfig {
    /// A tier of `blocks` blocks named `medium`, write-through, LRU, up to
    /// 4,096 blocks incoming and a write-back headroom of 64 blocks.
    pub fn new(medium: impl Into<String>, blocks: usize) -> Self {
        Self {
            medium: medium.into(),
            blocks,
            eviction: EvictionPolicy::Lru,
            offload: OffloadPolicy::WriteThrough,
            max_incoming_blocks: 4096,
            write_back_headroom: 64,
            pool: None,
        }
    }

    /// A tier named `medium` whose pool is `pool`, shared with every other
    /// [`Tiers`](crate::Tiers) given it (engines sharing a cluster-wide
    /// store): what one stores, all can load. Each `Tiers` keeps its own
    /// books of what it has on the way in, so two may store the same block
    /// at once; the second registration then finds the first and frees its
    /// copy. Its size is the pool's; its eviction policy the pool's own.
    pub fn shared(medium: impl Into<String>, pool: &BlockManager<Lower>) -> Self {
        Self {
            pool: Some(SharedPool(pool.clone())),
            ..Self::new(medium, pool.total_blocks())
        }
    }

    /// The pool of a [`shared`](Self::shared) tier.
    pub fn shared_pool(&self) -> Option<&BlockManager<Lower>> {
        self.pool.as_ref().map(|pool| &pool.0)
    }

    /// Sets [`offload`](Self::offload).
    pub fn with_offload(mut self, offload: OffloadPolicy) -> Self {
        self.offload = offload;
        self
    }

    /// Sets [`eviction`](Self::eviction).
    pub fn with_eviction(mut self, eviction: EvictionPolicy) -> Self {
        self.eviction = eviction;
        self
    }

    /// Sets [`max_incoming_blocks`](Self::max_incoming_blocks).
    pub fn with_max_incoming_blocks(mut self, blocks: usize) -> Self {
        self.max_incoming_blocks = blocks;
        self
    }

    /// Sets [`write_back_headroom`](Self::write_back_headroom).
    pub fn with_write_back_headroom(mut self, blocks: usize) -> Self {
        self.write_back_headroom = blocks;
        self
    }

    /// Checks what the builder of its pool cannot.
    pub(crate) fn validate(&self) -> Result<(), TierError> {
        let invalid = |reason: String| {
            Err(TierError::InvalidTier {
                medium: self.medium.clone(),
                reason,
            })
        };
        if self.medium.is_empty() || self.medium.len() > 64 {
            return invalid("the medium's name must be 1 to 64 bytes".to_owned());
        }
        if self.blocks == 0 || self.blocks > MAX_BLOCKS {
            return invalid(format!(
                "{} blocks (a tier holds 1 to {MAX_BLOCKS})",
                self.blocks
            ));
        }
        if self.max_incoming_blocks == 0 {
            return invalid("max_incoming_blocks 0 would take nothing".to_owned());
        }
        if let OffloadPolicy::Selective { min_hits } = self.offload
            && min_hits > FrequencySketch::MAX_COUNT
        {
            return invalid(format!(
                "selective offload after {min_hits} hits (hits are counted up to {})",
                FrequencySketch::MAX_COUNT
            ));
        }
        Ok(())
    }
}
