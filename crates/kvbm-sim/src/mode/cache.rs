//! `cache` mode: requests one after another through a [`BlockManager`] used
//! as a prefix cache.
//!
//! For each request, in trace order:
//!
//! 1. **match** the longest cached prefix of its blocks (those are the hits;
//!    matching pins them, so they cannot be evicted under the request);
//! 2. **allocate** blocks for the misses, evicting cached blocks in the
//!    policy's order when the free pool runs dry;
//! 3. **stage and register** the misses under their hashes, so later
//!    requests can match them (a miss that is still cached deeper in some
//!    chain deduplicates onto the cached block);
//! 4. **release** everything, deepest block first, so the end of a chain
//!    becomes evictable before the prefix it shares with other chains, as
//!    vLLM's free-block queue does.
//!
//! Only the current request holds blocks, so a request with more blocks than
//! the cache has room for (beyond its hits) stores the misses that fit, in
//! prefix order, and leaves the rest uncached; the report counts such
//! requests as `oversized_requests`.

use std::fmt;
use std::time::{Duration, Instant};

use kvbm_blocks::{BlockError, BlockManager, ImmutableBlocks};
use kvbm_tiers::Tiers;
use serde_json::json;
use tracing::instrument;

use crate::format::group;
use crate::{
    Capacity, Eviction, HitStats, NoProgress, Offload, Progress, SimError, TierSetup, Workload,
    WorkloadRequest,
};

/// Requests between two progress reports.
const PROGRESS_EVERY: u64 = 256;

/// The storage-tier marker of the simulated pool.
#[derive(Debug)]
struct Simulated;

/// What to replay in cache mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct CacheConfig {
    /// Size of the cache (default unbounded).
    pub capacity: Capacity,
    /// Eviction order (default LRU).
    pub eviction: Eviction,
    /// Tiers below the cache (none by default): a miss on the device is
    /// looked up there and loaded, and computed blocks are offloaded. Cache
    /// mode has no clock: every copy completes at once.
    pub tiers: CacheTiers,
}

/// Lower tiers in cache mode: their sizes and offload policy (cache mode
/// moves no bytes in time, so no links).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct CacheTiers {
    /// Tokens of a host tier below the device.
    pub host_tokens: Option<u64>,
    /// Tokens of a disk tier (below the host tier, if any).
    pub disk_tokens: Option<u64>,
    /// What each lower tier takes from the one above.
    pub offload: Offload,
}

impl CacheTiers {
    /// Sets [`host_tokens`](Self::host_tokens).
    pub fn with_host_tokens(mut self, tokens: u64) -> Self {
        self.host_tokens = Some(tokens);
        self
    }

    /// Sets [`disk_tokens`](Self::disk_tokens).
    pub fn with_disk_tokens(mut self, tokens: u64) -> Self {
        self.disk_tokens = Some(tokens);
        self
    }

    /// Sets [`offload`](Self::offload).
    pub fn with_offload(mut self, offload: Offload) -> Self {
        self.offload = offload;
        self
    }

    /// Whether any lower tier is configured.
    pub fn is_enabled(&self) -> bool {
        self.host_tokens.is_some() || self.disk_tokens.is_some()
    }

    fn setup(&self) -> TierSetup {
        let mut setup = TierSetup::default().with_offload(self.offload);
        setup.host_tokens = self.host_tokens;
        setup.disk_tokens = self.disk_tokens;
        setup
    }
}

impl CacheConfig {
    /// A config for `capacity` and `eviction`.
    pub fn new(capacity: Capacity, eviction: Eviction) -> Self {
        Self {
            capacity,
            eviction,
            tiers: CacheTiers::default(),
        }
    }

    /// Sets [`tiers`](Self::tiers).
    pub fn with_tiers(mut self, tiers: CacheTiers) -> Self {
        self.tiers = tiers;
        self
    }

    /// Replays `workload` through a fresh cache.
    ///
    /// # Errors
    ///
    /// As [`replay`].
    pub fn run(&self, workload: &Workload) -> Result<CacheReport, SimError> {
        replay(workload, self, &mut NoProgress)
    }
}

/// Replays every request of `workload` through a fresh cache built from
/// `config`, reporting each batch of requests to `progress`.
///
/// # Errors
///
/// [`SimError::ZeroCapacity`] or [`SimError::CapacityTooLarge`] for a
/// capacity that cannot be built; [`SimError::Blocks`] if the block layer
/// refuses an operation (a bug).
#[instrument(level = "debug", skip_all, fields(capacity = %config.capacity, eviction = %config.eviction))]
pub fn replay(
    workload: &Workload,
    config: &CacheConfig,
    progress: &mut dyn Progress,
) -> Result<CacheReport, SimError> {
    let capacity_blocks = config.capacity.resolve(workload)?;
    let started = Instant::now();
    let mut sim = CacheSim::new(workload.block_size(), capacity_blocks, config.eviction)?;
    if config.tiers.is_enabled() {
        sim.add_tiers(&config.tiers)?;
    }
    progress.start("replaying", workload.len() as u64);
    let mut since_report = 0;
    for request in workload.requests() {
        sim.replay_request(&request)?;
        since_report += 1;
        if since_report == PROGRESS_EVERY {
            progress.advance(since_report);
            since_report = 0;
        }
    }
    progress.advance(since_report);
    progress.finish();
    let mut report = sim.report();
    report.unbounded = config.capacity.is_unbounded();
    report.replay_time = started.elapsed();
    Ok(report)
}

/// What one request did to the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestOutcome {
    /// Leading blocks found in the cache.
    pub hit_blocks: usize,
    /// Missed blocks now cached.
    pub stored_blocks: usize,
    /// Missed blocks that did not fit (the request exceeds the cache).
    pub uncached_blocks: usize,
}

/// Where the cache's blocks are, recounted block by block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheOccupancy {
    /// Blocks in the cache.
    pub total_blocks: usize,
    /// Blocks holding a cached, matchable prefix block.
    pub cached_blocks: usize,
    /// Blocks holding nothing.
    pub free_blocks: usize,
    /// Blocks pinned by a request (zero between requests).
    pub in_use_blocks: usize,
}

/// A prefix cache replaying requests one at a time: the engine behind
/// [`replay`], usable step by step.
pub struct CacheSim {
    manager: BlockManager<Simulated>,
    eviction: Eviction,
    hits: HitStats,
    oversized_requests: u64,
    uncached_blocks: u64,
    /// Lower tiers, when configured, with the blocks each served.
    tiers: Option<(Tiers<Simulated>, [u64; 2])>,
    /// Transfers, reused from request to request.
    transfers: Vec<kvbm_tiers::Transfer>,
    /// Blocks loaded per tier level, reused from request to request.
    loaded_from: Vec<usize>,
}

impl CacheSim {
    /// An empty cache of `capacity_blocks` blocks of `block_size` tokens.
    ///
    /// # Errors
    ///
    /// [`SimError::Blocks`] when the block layer refuses the pool (zero or
    /// too many blocks, zero block size).
    pub fn new(
        block_size: usize,
        capacity_blocks: usize,
        eviction: Eviction,
    ) -> Result<Self, SimError> {
        let manager = BlockManager::builder()
            .block_count(capacity_blocks)
            .block_size(block_size)
            .eviction(eviction.policy())
            .build()?;
        Ok(Self {
            manager,
            eviction,
            hits: HitStats::default(),
            oversized_requests: 0,
            uncached_blocks: 0,
            tiers: None,
            transfers: Vec::new(),
            loaded_from: Vec::new(),
        })
    }

    /// Puts lower tiers below the cache.
    ///
    /// # Errors
    ///
    /// [`SimError::InvalidTiers`] for a tier smaller than a block or larger
    /// than a pool may be.
    pub fn add_tiers(&mut self, tiers: &CacheTiers) -> Result<(), SimError> {
        let setup = tiers.setup();
        let plans = setup.plan(self.manager.block_size())?;
        let lower = (plans.iter())
            .map(|plan| {
                kvbm_tiers::TierConfig::new(plan.medium, plan.blocks)
                    .with_offload(setup.offload.policy())
            })
            .collect();
        let tiers = Tiers::new(self.manager.clone(), lower)
            .map_err(|err| SimError::InvalidTiers(err.to_string()))?;
        self.tiers = Some((tiers, [0; 2]));
        Ok(())
    }

    /// Runs every planned transfer to completion at once (and those they
    /// plan in turn); the loads' blocks, registered on the device.
    fn complete_transfers(&mut self) -> Result<Vec<ImmutableBlocks<Simulated>>, SimError> {
        let mut loaded = Vec::new();
        let Some((tiers, _)) = &mut self.tiers else {
            return Ok(loaded);
        };
        loop {
            self.transfers.clear();
            tiers.take_planned(&mut self.transfers);
            if self.transfers.is_empty() {
                return Ok(loaded);
            }
            for transfer in &self.transfers {
                let settled = (tiers.complete(transfer.id))
                    .map_err(|err| SimError::InvalidTiers(err.to_string()))?;
                if let kvbm_tiers::Settled::Loaded { blocks, .. } = settled {
                    loaded.push(blocks);
                }
            }
        }
    }

    /// With lower tiers: brings the request's prefix past `held` (its
    /// device hits) up from them at once, appending the loaded blocks to
    /// `held`.
    fn onboard(
        &mut self,
        request: &WorkloadRequest<'_>,
        held: &mut ImmutableBlocks<Simulated>,
    ) -> Result<(), SimError> {
        let Some((tiers, served)) = &mut self.tiers else {
            return Ok(());
        };
        let rest = request.blocks.get(held.len()..).unwrap_or_default();
        if rest.is_empty() {
            return Ok(());
        }
        let loaded = tiers.onboard_now_into(rest, rest.len(), &mut self.loaded_from);
        for (level, &blocks) in self.loaded_from.iter().enumerate().skip(1) {
            if let Some(slot) = served.get_mut(level - 1) {
                *slot += blocks as u64;
            }
        }
        held.append(loaded).map_err(BlockError::from)?;
        Ok(())
    }

    /// Replays one request: match, allocate, register, release tail first.
    ///
    /// # Errors
    ///
    /// [`SimError::Blocks`] if the block layer refuses an operation, which
    /// would be a bug: only this request pins blocks, so its misses always
    /// fit in what the matched prefix leaves.
    pub fn replay_request(
        &mut self,
        request: &WorkloadRequest<'_>,
    ) -> Result<RequestOutcome, SimError> {
        let block_size = self.manager.block_size();
        let mut held = self.manager.match_blocks(request.blocks);
        if let Some((tiers, _)) = &mut self.tiers {
            tiers.record_hits(&held);
            tiers.write_back();
            self.complete_transfers()?;
            self.onboard(request, &mut held)?;
        }
        let hit_blocks = held.len();
        self.hits.record(request, hit_blocks, block_size);

        let misses = request.blocks.get(hit_blocks..).unwrap_or_default();
        // Everything but the matched prefix is free or evictable.
        let room = self.manager.total_blocks().saturating_sub(hit_blocks);
        let stored_blocks = misses.len().min(room);
        let uncached_blocks = misses.len() - stored_blocks;
        if uncached_blocks > 0 {
            self.oversized_requests += 1;
            self.uncached_blocks += uncached_blocks as u64;
        }
        if stored_blocks > 0 {
            // No KV moves in a replay: allocated and registered at once.
            let stored = self.manager.store_blocks(&misses[..stored_blocks])?;
            if let Some((tiers, _)) = &mut self.tiers {
                tiers.offload_now(&stored);
            }
            held.append(stored).map_err(BlockError::from)?;
        }
        // Dropping the batch releases it under one lock, last block first:
        // the deepest block becomes evictable before the prefix other chains
        // may still share (ImmutableBlocks' documented release order).
        drop(held);
        // One batch per request for subscribers (an atomic load without).
        self.manager.flush_events();
        Ok(RequestOutcome {
            hit_blocks,
            stored_blocks,
            uncached_blocks,
        })
    }

    /// Subscribes to the cache's events: one batch per replayed request
    /// (see [`BlockManager::subscribe_events`]). Stored runs carry no token
    /// ids: cache mode replays block hashes, not tokens.
    pub fn subscribe_events(&self, capacity: usize) -> kvbm_blocks::EventSubscription {
        self.manager.subscribe_events(capacity)
    }

    /// The hit accounting so far.
    pub fn hits(&self) -> HitStats {
        self.hits
    }

    /// Cached blocks evicted so far.
    pub fn evictions(&self) -> u64 {
        self.manager.metrics().evictions
    }

    /// Whether a block with this hash is cached or pinned, without touching
    /// its eviction order.
    pub fn contains(&self, hash: kvbm_blocks::SequenceHash) -> bool {
        self.manager.scan_matches(&[hash]).first() == Some(&true)
    }

    /// Recounts every block of the cache.
    ///
    /// # Errors
    ///
    /// [`SimError::Blocks`] if the block layer finds itself inconsistent (a bug).
    pub fn audit(&self) -> Result<CacheOccupancy, SimError> {
        let audit = self.manager.audit()?;
        Ok(CacheOccupancy {
            total_blocks: audit.total_blocks(),
            cached_blocks: audit.inactive_blocks,
            free_blocks: audit.free_blocks,
            in_use_blocks: audit.in_use_blocks(),
        })
    }

    /// The report so far (with zero replay time and `unbounded` unset:
    /// [`replay`] fills both in).
    pub fn report(&self) -> CacheReport {
        CacheReport {
            block_size: self.manager.block_size(),
            capacity_blocks: self.manager.total_blocks(),
            unbounded: false,
            eviction: self.eviction,
            hits: self.hits,
            evictions: self.evictions(),
            oversized_requests: self.oversized_requests,
            uncached_blocks: self.uncached_blocks,
            tiers: self.tier_figures(),
            replay_time: Duration::ZERO,
        }
    }

    /// What the lower tiers did (`None` without them).
    fn tier_figures(&self) -> Option<CacheTierFigures> {
        let (tiers, served) = self.tiers.as_ref()?;
        let block_size = self.manager.block_size() as u64;
        let mut figures = CacheTierFigures::default();
        for (index, tier) in tiers.lower_ids().enumerate().take(2) {
            let stats = tiers.stats(tier).unwrap_or_default();
            let medium = tiers.config(tier).map_or("", |c| c.medium.as_str());
            let tier_figures = TierHits {
                blocks: tiers.config(tier).map_or(0, |c| c.blocks),
                hit_blocks: served[index],
                hit_tokens: served[index].saturating_mul(block_size),
                stored_blocks: stats.stored_blocks,
                evicted_blocks: stats.evicted_blocks,
            };
            if medium == "CPU" {
                figures.host = Some(tier_figures);
            } else {
                figures.disk = Some(tier_figures);
            }
        }
        Some(figures)
    }
}

impl fmt::Debug for CacheSim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheSim")
            .field("manager", &self.manager)
            .field("hits", &self.hits)
            .field("oversized_requests", &self.oversized_requests)
            .finish_non_exhaustive()
    }
}

/// The result of a cache-mode replay.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct CacheReport {
    /// Tokens per block.
    pub block_size: usize,
    /// The cache's size in blocks (for an unbounded run, the workload's
    /// distinct blocks).
    pub capacity_blocks: usize,
    /// Whether the capacity was [`Capacity::Unbounded`].
    pub unbounded: bool,
    /// The eviction policy.
    pub eviction: Eviction,
    /// Requests, blocks, tokens and their hits.
    pub hits: HitStats,
    /// Cached blocks evicted to make room.
    pub evictions: u64,
    /// Requests with more missed blocks than the cache had room for.
    pub oversized_requests: u64,
    /// Missed blocks of oversized requests that were not cached.
    pub uncached_blocks: u64,
    /// What the tiers below did, with any configured. Their hits are part
    /// of [`hits`](Self::hits) too.
    pub tiers: Option<CacheTierFigures>,
    /// Wall time of the replay, building the cache included.
    pub replay_time: Duration,
}

/// The lower tiers of a cache-mode replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheTierFigures {
    /// The host tier, if any.
    pub host: Option<TierHits>,
    /// The disk tier, if any.
    pub disk: Option<TierHits>,
}

/// What one lower tier did in cache mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierHits {
    /// Its size in blocks.
    pub blocks: usize,
    /// Blocks of request prefixes it served (loaded onto the device).
    pub hit_blocks: u64,
    /// The same in tokens.
    pub hit_tokens: u64,
    /// Blocks stored into it.
    pub stored_blocks: u64,
    /// Blocks it evicted.
    pub evicted_blocks: u64,
}

impl TierHits {
    fn to_json(self) -> serde_json::Value {
        json!({
            "capacity_blocks": self.blocks,
            "hit_blocks": self.hit_blocks,
            "hit_tokens": self.hit_tokens,
            "stored_blocks": self.stored_blocks,
            "evicted_blocks": self.evicted_blocks,
        })
    }
}

impl CacheReport {
    /// The cache's size in tokens.
    pub fn capacity_tokens(&self) -> u64 {
        (self.capacity_blocks as u64).saturating_mul(self.block_size as u64)
    }

    /// The report as one JSON object (the `--json` output); with lower
    /// tiers it gains `tiers` (`host`, `disk`), without it is as before.
    pub fn to_json(&self) -> serde_json::Value {
        let mut report = self.json_without_tiers();
        if let (Some(tiers), Some(map)) = (&self.tiers, report.as_object_mut()) {
            let mut per_tier = serde_json::Map::new();
            for (name, tier) in [("host", tiers.host), ("disk", tiers.disk)] {
                if let Some(tier) = tier {
                    per_tier.insert(name.to_owned(), tier.to_json());
                }
            }
            map.insert("tiers".to_owned(), per_tier.into());
        }
        report
    }

    fn json_without_tiers(&self) -> serde_json::Value {
        json!({
            "mode": "cache",
            "block_size": self.block_size,
            "capacity_blocks": self.capacity_blocks,
            "capacity_tokens": self.capacity_tokens(),
            "unbounded": self.unbounded,
            "eviction": self.eviction.name(),
            "requests": self.hits.requests,
            "input_blocks": self.hits.input_blocks,
            "hit_blocks": self.hits.hit_blocks,
            "input_tokens": self.hits.input_tokens,
            "hit_tokens": self.hits.hit_tokens,
            "block_hit_rate": self.hits.block_hit_rate(),
            "token_hit_rate": self.hits.token_hit_rate(),
            "evictions": self.evictions,
            "preemptions": 0,
            "oversized_requests": self.oversized_requests,
            "uncached_blocks": self.uncached_blocks,
            "replay_ms": self.replay_time.as_secs_f64() * 1e3,
        })
    }
}

impl fmt::Display for CacheReport {
    /// A readable summary, several lines, ending in a newline.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let capacity = if self.unbounded {
            format!("unbounded ({} blocks)", group(self.capacity_blocks as u64))
        } else {
            format!(
                "{} blocks = {} tokens",
                group(self.capacity_blocks as u64),
                group(self.capacity_tokens())
            )
        };
        let hits = &self.hits;
        writeln!(
            f,
            "cache mode: {} requests, block size {}, capacity {capacity}, eviction {}",
            group(hits.requests),
            self.block_size,
            self.eviction
        )?;
        hits.write_table(f, "hit", "")?;
        if let Some(tiers) = &self.tiers {
            for (name, tier) in [("host", tiers.host), ("disk", tiers.disk)] {
                if let Some(tier) = tier {
                    writeln!(
                        f,
                        "  {name} tier {} blocks: served {} blocks ({} tokens), stored {}, evicted {}",
                        group(tier.blocks as u64),
                        group(tier.hit_blocks),
                        group(tier.hit_tokens),
                        group(tier.stored_blocks),
                        group(tier.evicted_blocks)
                    )?;
                }
            }
        }
        writeln!(
            f,
            "  evictions {}, preemptions 0, oversized requests {}, replay {:.1} ms",
            group(self.evictions),
            group(self.oversized_requests),
            self.replay_time.as_secs_f64() * 1e3
        )
    }
}

#[cfg(test)]
mod tests;
