//! [`Tiers`]: the device pool and the pools below it, and the transfers
//! between them.

use std::collections::{HashMap, HashSet};
use std::fmt;

use foldhash::fast::RandomState;
use kvbm_blocks::{BlockManager, FrequencySketch, SequenceHash};

use crate::flight::{Flight, Landings};
use crate::{
    OffloadPolicy, TierConfig, TierError, TierId, TierStats, Transfer, TransferCounts, TransferId,
};

/// The marker type of every lower tier's pool (the device pool has the
/// engine's own marker): handles of a lower tier can never be mixed with the
/// device's at compile time, and two lower tiers' at run time.
#[derive(Debug)]
pub enum Lower {}

/// One tier below the device.
#[derive(Debug)]
pub(crate) struct LowerTier {
    pub(crate) config: TierConfig,
    pub(crate) pool: BlockManager<Lower>,
    /// Hash values on their way into this tier (stores in flight).
    pub(crate) incoming: HashSet<u128, RandomState>,
    pub(crate) stats: TierStats,
}

/// A KV cache in tiers: the device pool (G1, the scheduler's) above one or
/// more lower tiers (host memory, disk), each a [`BlockManager`] of its own
/// with its own capacity and eviction policy, all keyed by the same
/// [`SequenceHash`]es.
///
/// It decides what to copy where and keeps every copy's blocks where they
/// are until the engine says the copy is done; the engine moves the bytes.
/// Copies are two-phase: planned ([`take_planned`](Self::take_planned)
/// hands them out as [`Transfer`]s), then completed or failed
/// ([`complete`](Self::complete), [`fail`](Self::fail)). A destination
/// block becomes matchable only when its copy completed; sources and
/// destinations in flight are pinned (never evicted, freed or reused); a
/// failed or abandoned copy leaves its destination absent. A hash present
/// or on its way into a tier is never copied to it again.
///
/// It knows nothing of requests: a scheduler calls
/// [`offload`](Self::offload) with blocks it registered,
/// [`record_hits`](Self::record_hits) with prefixes it matched,
/// [`lookup`](Self::lookup) and [`onboard`](Self::onboard) to bring a
/// prefix up from a lower tier, and [`write_back`](Self::write_back) once a
/// step.
pub struct Tiers<D> {
    pub(crate) device: BlockManager<D>,
    pub(crate) lower: Vec<LowerTier>,
    pub(crate) flights: HashMap<TransferId, Flight<D>, RandomState>,
    /// Planned, not yet handed to the engine.
    pub(crate) planned: Vec<Transfer>,
    /// Device-bound loads in flight: hash value to its transfer.
    pub(crate) loading: HashMap<u128, TransferId, RandomState>,
    /// Prefix hits per hash, when some tier offloads selectively.
    pub(crate) hits: Option<FrequencySketch>,
    pub(crate) next_id: u64,
    pub(crate) counts: TransferCounts,
    /// [`offload_now`](Self::offload_now)'s hashes, kept for its next call.
    pub(crate) offload_scratch: Vec<SequenceHash>,
}

impl<D> Tiers<D> {
    /// The device pool `device` above the lower tiers `lower`, in order
    /// (the first is G2, right below the device).
    ///
    /// # Errors
    ///
    /// [`TierError::InvalidTier`] for a tier of 0 blocks (or more than a pool
    /// may hold), an empty or over-long medium name, no room for incoming
    /// blocks, or a selective policy past what hits are counted to;
    /// [`TierError::DuplicateMedium`]; [`TierError::TooManyTiers`];
    /// [`TierError::Pool`] if a pool's bookkeeping cannot be allocated.
    pub fn new(device: BlockManager<D>, lower: Vec<TierConfig>) -> Result<Self, TierError> {
        if TierId::lower(lower.len().saturating_sub(1)).is_none() {
            return Err(TierError::TooManyTiers(lower.len()));
        }
        let mut media: Vec<&str> = Vec::with_capacity(lower.len());
        for config in &lower {
            config.validate()?;
            if media.contains(&config.medium.as_str()) {
                return Err(TierError::DuplicateMedium(config.medium.clone()));
            }
            media.push(&config.medium);
        }
        let selective = lower
            .iter()
            .any(|config| matches!(config.offload, OffloadPolicy::Selective { .. }));
        let tiers = lower
            .into_iter()
            .map(|config| {
                let pool = match config.shared_pool() {
                    Some(pool) if pool.block_size() == device.block_size() => pool.clone(),
                    Some(pool) => {
                        return Err(TierError::InvalidTier {
                            medium: config.medium.clone(),
                            reason: format!(
                                "a shared pool of {}-token blocks below {}-token device blocks",
                                pool.block_size(),
                                device.block_size()
                            ),
                        });
                    }
                    None => BlockManager::builder()
                        .block_count(config.blocks)
                        .block_size(device.block_size())
                        .eviction(config.eviction)
                        .build()
                        .map_err(|source| TierError::Pool {
                            medium: config.medium.clone(),
                            source,
                        })?,
                };
                Ok(LowerTier {
                    config,
                    pool,
                    incoming: HashSet::default(),
                    stats: TierStats::default(),
                })
            })
            .collect::<Result<Vec<_>, TierError>>()?;
        Ok(Self {
            hits: selective.then(|| FrequencySketch::new(device.total_blocks())),
            device,
            lower: tiers,
            flights: HashMap::default(),
            planned: Vec::new(),
            loading: HashMap::default(),
            next_id: 0,
            counts: TransferCounts::default(),
            offload_scratch: Vec::new(),
        })
    }

    /// The device pool.
    pub fn device(&self) -> &BlockManager<D> {
        &self.device
    }

    /// Lower tiers, counted.
    pub fn lower_tiers(&self) -> usize {
        self.lower.len()
    }

    /// Whether there is any tier below the device (with none, every call
    /// here returns at once: one tier costs nothing more).
    pub fn has_lower(&self) -> bool {
        !self.lower.is_empty()
    }

    /// Every lower tier's id, in order.
    pub fn lower_ids(&self) -> impl Iterator<Item = TierId> + '_ {
        (0..self.lower.len()).filter_map(TierId::lower)
    }

    /// A lower tier's pool (for its events, metrics, audit); `None` for the
    /// device or a tier that does not exist.
    pub fn pool(&self, tier: TierId) -> Option<&BlockManager<Lower>> {
        Some(&self.lower_tier(tier)?.pool)
    }

    /// A lower tier's configuration.
    pub fn config(&self, tier: TierId) -> Option<&TierConfig> {
        Some(&self.lower_tier(tier)?.config)
    }

    /// What a lower tier has done.
    pub fn stats(&self, tier: TierId) -> Option<TierStats> {
        let lower = self.lower_tier(tier)?;
        let mut stats = lower.stats;
        stats.evicted_blocks = lower.pool.metrics().evictions;
        Some(stats)
    }

    /// Transfers planned and settled.
    pub fn transfer_counts(&self) -> TransferCounts {
        let mut counts = self.counts;
        counts.in_flight = self.flights.len() as u64;
        counts
    }

    /// Whether a transfer is in flight (planned, not reported).
    pub fn in_flight(&self, id: TransferId) -> bool {
        self.flights.contains_key(&id)
    }

    /// Transfers in flight.
    pub fn in_flight_count(&self) -> usize {
        self.flights.len()
    }

    /// Device blocks the transfers in flight hold: sources of stores and
    /// destinations of loads (for a caller's own audit of who holds what).
    pub fn device_blocks_held(&self) -> Vec<kvbm_blocks::BlockId> {
        let mut held = Vec::new();
        for flight in self.flights.values() {
            if flight.pins.on_device() {
                held.extend(flight.pins.block_ids());
            }
            if let Landings::Device(_) = &flight.landings {
                held.extend(flight.landings.block_ids());
            }
        }
        held
    }

    /// Sends the cache events each lower tier's own pool has pending to its
    /// subscribers (one batch per pool), as a scheduler flushes the
    /// device's once a step; shared pools are left to whoever shares them.
    pub fn flush_events(&self) {
        for tier in self
            .lower
            .iter()
            .filter(|t| t.config.shared_pool().is_none())
        {
            tier.pool.flush_events();
        }
    }

    /// Hands out the transfers planned since the last call, in planning
    /// order, for the engine to run (appended to `out`).
    pub fn take_planned(&mut self, out: &mut Vec<Transfer>) {
        out.append(&mut self.planned);
    }

    /// How many of `hashes` (a request's prefix past what the device
    /// holds, never covering its last prompt token) the tiers below could
    /// bring up, by tier level: `[0]` already on their way to the device,
    /// `[k]` in lower tier `k`. A block counts under the highest tier that
    /// has it, and the walk stops at the first block no tier has, so the
    /// counts add up to one contiguous prefix. Pins nothing and leaves
    /// every tier's eviction order as it was.
    pub fn lookup(&self, hashes: &[SequenceHash]) -> Vec<usize> {
        let mut found = vec![0; self.lower.len() + 1];
        if self.lower.is_empty() || hashes.is_empty() {
            return found;
        }
        let present: Vec<Vec<bool>> = (self.lower.iter())
            .map(|tier| tier.pool.scan_matches(hashes))
            .collect();
        for (i, hash) in hashes.iter().enumerate() {
            let level = if self.loading.contains_key(&hash.value()) {
                Some(0)
            } else {
                present.iter().position(|tier| tier[i]).map(|k| k + 1)
            };
            match level {
                Some(level) => found[level] += 1,
                None => break,
            }
        }
        found
    }

    /// Which of `hashes` the tiers below could bring up, each block on its
    /// own (no prefix rule, unlike [`lookup`](Self::lookup)): on its way to
    /// the device already, or held by some lower tier. For a model whose
    /// layer groups need blocks that are not a prefix (a sliding window
    /// reads only the blocks right before its hit point). Pins nothing and
    /// leaves every tier's eviction order as it was.
    pub fn holds(&self, hashes: &[SequenceHash]) -> Vec<bool> {
        let mut held: Vec<bool> = (hashes.iter())
            .map(|hash| self.loading.contains_key(&hash.value()))
            .collect();
        for tier in &self.lower {
            if held.iter().all(|&found| found) {
                break;
            }
            for (found, here) in held.iter_mut().zip(tier.pool.scan_matches(hashes)) {
                *found |= here;
            }
        }
        held
    }

    pub(crate) fn lower_tier(&self, tier: TierId) -> Option<&LowerTier> {
        self.lower.get(tier.lower_index()?)
    }

    pub(crate) fn next_transfer_id(&mut self) -> TransferId {
        let id = TransferId::new(self.next_id);
        self.next_id = self.next_id.saturating_add(1);
        id
    }
}

impl<D> fmt::Debug for Tiers<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tiers")
            .field(
                "lower",
                &self
                    .lower
                    .iter()
                    .map(|t| &t.config.medium)
                    .collect::<Vec<_>>(),
            )
            .field("in_flight", &self.flights.len())
            .field("counts", &self.counts)
            .finish_non_exhaustive()
    }
}
