//! [`ServeConfig`]: what a serve-mode replay runs, its builder and its
//! checks.

use std::sync::Arc;

use kvbm_blocks::BlockManager;
use kvbm_events::{WireFormat, WireGroup};
use kvbm_queue::{Scheduler, SchedulerConfig, TiersConfig};

use super::{PriorityMix, Simulated, StepTime, replay};
use crate::{Capacity, Eviction, KvSetup, NoProgress, ServeReport, SimError, TierSetup, Trace};

/// What to replay in serve mode.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct ServeConfig {
    /// Tokens per KV block (default 16, vLLM's; must divide 512).
    pub block_size: usize,
    /// Size of the KV pool; must be bounded (default 3M tokens, the
    /// Mooncake paper's smallest cache). Not read with [`kv`](Self::kv),
    /// whose bytes size the pool.
    pub capacity: Capacity,
    /// Which cached block to evict first (default LRU).
    pub eviction: Eviction,
    /// The scheduler's limits (default: [`SchedulerConfig::default`]).
    pub scheduler: SchedulerConfig,
    /// Simulated cost of a step (default: [`StepTime::default`]).
    pub step_time: StepTime,
    /// Run [`Scheduler::audit`] every this many scheduler steps (`None`:
    /// only once, at the end). O(pool blocks) each time: for tests and
    /// debugging.
    pub audit_every: Option<u64>,
    /// With speculative decoding (`scheduler.speculative_tokens` drafts per
    /// decode), the probability that the stand-in engine accepts each draft
    /// token, independently, until the first rejection (default 0.7, a
    /// typical EAGLE acceptance rate).
    pub spec_accept: f64,
    /// Seed of every random draw: priorities from `priorities`, draft
    /// acceptances (default 0).
    pub seed: u64,
    /// Priorities of the requests whose trace line has none, drawn by
    /// share; `None` (the default) makes them all `Normal`.
    pub priorities: Option<PriorityMix>,
    /// Whether the scheduler records its metrics (default `true`; see
    /// [`Scheduler::set_metrics_enabled`]). The command line turns them off
    /// unless `--prometheus` or `--metrics-out` asks for them: a step then
    /// skips reading counts under the queue's and the pool's locks.
    pub metrics: bool,
    /// Tiers below the GPU (host, disk) and their links; none by default.
    pub tiers: TierSetup,
    /// A model's KV layout and memory (`None`, the default: one
    /// full-attention group over [`capacity`](Self::capacity), and no
    /// bytes counted). With it the pool holds the blocks its bytes buy, the
    /// scheduler runs the model's KV cache groups
    /// ([`Scheduler::with_kv_groups`]), and the report gains
    /// [`ServeReport::kv`]. With [`tiers`](Self::tiers), every group's
    /// blocks go down and come back up
    /// ([`Scheduler::with_kv_groups_and_tiers`]), the tiers sized and priced
    /// in the model's blocks; [`tiers`](Self::tiers)' own
    /// `kv_bytes_per_token` is not read then.
    pub kv: Option<KvSetup>,
    /// Whether decodes run in place
    /// ([`Scheduler::run_decodes_in_place`]); the results are the same either
    /// way, which the tests check by turning it off.
    pub(crate) in_place: bool,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            capacity: Capacity::Tokens(3_000_000),
            eviction: Eviction::Lru,
            scheduler: SchedulerConfig::default(),
            step_time: StepTime::default(),
            audit_every: None,
            spec_accept: 0.7,
            seed: 0,
            priorities: None,
            metrics: true,
            tiers: TierSetup::default(),
            kv: None,
            in_place: true,
        }
    }
}

impl ServeConfig {
    /// The defaults with another block size and capacity.
    pub fn new(block_size: usize, capacity: Capacity) -> Self {
        Self {
            block_size,
            capacity,
            ..Self::default()
        }
    }

    /// Sets [`eviction`](Self::eviction).
    pub fn with_eviction(mut self, eviction: Eviction) -> Self {
        self.eviction = eviction;
        self
    }

    /// Sets [`scheduler`](Self::scheduler).
    pub fn with_scheduler(mut self, scheduler: SchedulerConfig) -> Self {
        self.scheduler = scheduler;
        self
    }

    /// Sets [`step_time`](Self::step_time).
    pub fn with_step_time(mut self, step_time: StepTime) -> Self {
        self.step_time = step_time;
        self
    }

    /// Sets [`audit_every`](Self::audit_every) (0 means only at the end).
    pub fn with_audit_every(mut self, steps: u64) -> Self {
        self.audit_every = (steps > 0).then_some(steps);
        self
    }

    /// Sets [`spec_accept`](Self::spec_accept).
    pub fn with_spec_accept(mut self, probability: f64) -> Self {
        self.spec_accept = probability;
        self
    }

    /// Sets [`seed`](Self::seed).
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets [`priorities`](Self::priorities).
    pub fn with_priorities(mut self, mix: PriorityMix) -> Self {
        self.priorities = Some(mix);
        self
    }

    /// Sets [`metrics`](Self::metrics).
    pub fn with_metrics(mut self, metrics: bool) -> Self {
        self.metrics = metrics;
        self
    }

    /// Sets [`tiers`](Self::tiers).
    pub fn with_tiers(mut self, tiers: TierSetup) -> Self {
        self.tiers = tiers;
        self
    }

    /// Sets [`kv`](Self::kv).
    pub fn with_kv(mut self, kv: KvSetup) -> Self {
        self.kv = Some(kv);
        self
    }

    /// [`with_kv`](Self::with_kv), refusing at once a configuration the
    /// layout does not fit and a pool that cannot be built (before a
    /// front end loads a trace for it).
    ///
    /// # Errors
    ///
    /// As [`validate`](Self::validate) and
    /// [`capacity_blocks`](Self::capacity_blocks).
    pub fn with_checked_kv(self, kv: KvSetup) -> Result<Self, SimError> {
        let config = self.with_kv(kv);
        config.validate()?;
        config.capacity_blocks()?;
        Ok(config)
    }

    /// The pool's size in blocks: [`capacity`](Self::capacity)'s, or what
    /// [`kv`](Self::kv)'s bytes buy.
    ///
    /// # Errors
    ///
    /// [`SimError::UnboundedServe`], [`SimError::ZeroCapacity`],
    /// [`SimError::CapacityTooLarge`] or [`SimError::CapacityBelowBlock`]
    /// for a pool that cannot be built.
    pub fn capacity_blocks(&self) -> Result<usize, SimError> {
        match &self.kv {
            None => self.capacity.resolve_bounded(self.block_size),
            Some(kv) => kv.capacity_blocks(self.block_size),
        }
    }

    /// The scheduler of one engine over `manager`, with the lower tiers
    /// configured, or with the model's KV cache groups.
    pub(crate) fn build_scheduler(
        &self,
        manager: BlockManager<Simulated>,
    ) -> Result<Scheduler<Simulated>, SimError> {
        let tiers = (self.replay_tiers()?).scheduler_config(self.block_size, &self.step_time)?;
        self.scheduler_with(manager, tiers)
    }

    /// The scheduler of one engine over `manager` with `tiers` below it (if
    /// any), and the model's KV cache groups (if [`kv`](Self::kv)).
    pub(crate) fn scheduler_with(
        &self,
        manager: BlockManager<Simulated>,
        tiers: Option<TiersConfig>,
    ) -> Result<Scheduler<Simulated>, SimError> {
        // No lower tier is `with_tiers` of none, which is `new` (and
        // `with_kv_groups_and_tiers` of none is `with_kv_groups`).
        let tiers = tiers.unwrap_or_default();
        let scheduler = match &self.kv {
            Some(kv) => {
                let groups = Arc::new(kv.groups(self.block_size)?);
                Scheduler::with_kv_groups_and_tiers(manager, self.scheduler, groups, tiers)?
            }
            None => Scheduler::with_tiers(manager, self.scheduler, tiers)?,
        };
        Ok(scheduler)
    }

    /// How the engine's KV events go on vLLM's wire: blocks of
    /// [`block_size`](Self::block_size) tokens, and with a model's KV cache
    /// groups ([`kv`](Self::kv)) each event's group, as vLLM 0.33 sends it
    /// (`group_idx`, `kv_cache_spec_kind`, `kv_cache_spec_sliding_window`).
    ///
    /// # Errors
    ///
    /// As [`KvSetup::groups`].
    pub fn wire_format(&self) -> Result<WireFormat, SimError> {
        let format = WireFormat::new(u32::try_from(self.block_size).unwrap_or(u32::MAX));
        let Some(kv) = &self.kv else {
            return Ok(format);
        };
        let groups = kv.groups(self.block_size)?;
        Ok(format.with_kv_groups(
            (groups.groups().iter())
                .map(|group| WireGroup::from_attention(group.kind()))
                .collect(),
        ))
    }

    /// The blocks `block_size` tokens of KV take in the pool: one per KV
    /// cache group of the model ([`kv`](Self::kv)), 1 without one. What
    /// sizes anything counted in tokens of KV (lower tiers, a cluster's
    /// shared pool) in the model's blocks.
    ///
    /// # Errors
    ///
    /// As [`KvSetup::groups`].
    pub(crate) fn kv_group_count(&self) -> Result<usize, SimError> {
        match &self.kv {
            Some(kv) => Ok(kv.groups(self.block_size)?.len()),
            None => Ok(1),
        }
    }

    /// The tiers as the replay builds them: [`tiers`](Self::tiers), or with
    /// a model ([`kv`](Self::kv)) in the model's blocks. A tier's tokens are
    /// then tokens of the model's KV: each group keeps a block of its own
    /// per `block_size` tokens, so a tier of `T` tokens holds `T /
    /// block_size` blocks per group, each of [`KvSetup::block_bytes`] bytes
    /// (the same bytes whether or not the layout is
    /// [`full_attention_only`](KvSetup::full_attention_only)), and the
    /// links carry blocks of that size.
    ///
    /// # Errors
    ///
    /// As [`KvSetup::groups`] and [`KvSetup::block_bytes`];
    /// [`SimError::InvalidTiers`] for a tier whose blocks overflow.
    pub(crate) fn replay_tiers(&self) -> Result<TierSetup, SimError> {
        let Some(kv) = &self.kv else {
            return Ok(self.tiers);
        };
        let mut tiers = self.tiers;
        if !tiers.is_enabled() {
            return Ok(tiers);
        }
        let groups = self.kv_group_count()? as u64;
        let per_group = |tokens: Option<u64>| {
            tokens
                .map(|tokens| {
                    tokens.checked_mul(groups).ok_or_else(|| {
                        SimError::InvalidTiers(format!(
                            "a tier of {tokens} tokens in {groups} KV cache groups overflows"
                        ))
                    })
                })
                .transpose()
        };
        tiers.host_tokens = per_group(tiers.host_tokens)?;
        tiers.disk_tokens = per_group(tiers.disk_tokens)?;
        // A block's bytes are `block_size` tokens of its group's layers.
        tiers.kv_bytes_per_token = kv.block_bytes(self.block_size)? / self.block_size.max(1) as u64;
        Ok(tiers)
    }

    /// Checks what a replay checks before it builds anything.
    ///
    /// # Errors
    ///
    /// [`SimError::InvalidBlockSize`] unless the block size divides 512;
    /// [`SimError::InvalidAcceptance`] unless `spec_accept` is in `0..=1`;
    /// with [`kv`](Self::kv), [`SimError::Groups`] for groups the block
    /// size does not fit (a window not a multiple of it) and
    /// [`SimError::InvalidTiers`] for tiers the model's blocks overflow.
    pub fn validate(&self) -> Result<(), SimError> {
        let block_size = self.block_size;
        if block_size == 0 || !crate::TRACE_BLOCK_TOKENS.is_multiple_of(block_size) {
            return Err(SimError::InvalidBlockSize { block_size });
        }
        if !(0.0..=1.0).contains(&self.spec_accept) {
            return Err(SimError::InvalidAcceptance {
                value: self.spec_accept,
            });
        }
        self.tiers.plan(block_size)?;
        if let Some(kv) = &self.kv {
            kv.groups(block_size)?;
            kv.block_bytes(block_size)?;
            self.replay_tiers()?.plan(block_size)?;
        }
        Ok(())
    }

    /// Replays `trace` through a fresh scheduler.
    ///
    /// # Errors
    ///
    /// As [`replay`].
    pub fn run(&self, trace: &Trace) -> Result<ServeReport, SimError> {
        replay(trace, self, &mut NoProgress)
    }
}
