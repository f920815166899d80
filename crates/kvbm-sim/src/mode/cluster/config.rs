//! [`ClusterConfig`]: a cluster's engines, routing policies and shared
//! pool, checked before anything is built; and [`PolicyKind`].

use std::sync::Arc;

use kvbm_blocks::MAX_BLOCKS;
use kvbm_router::{KvAware, LeastLoaded, Policy, PrefixIndex, Random, RoundRobin};

use super::global_kv::{GlobalCosts, GlobalKv};
use super::memory;
use crate::{Link, ServeConfig, SimError, Trace};

/// A routing policy of [`ClusterConfig::policies`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyKind {
    /// Uniformly at random (seeded).
    Random,
    /// Each engine in turn.
    RoundRobin,
    /// The engine with the least queued and active work.
    LeastLoaded,
    /// Dynamo's cost: overlap weight × prefill blocks + decode blocks.
    KvAware,
    /// Mooncake's global cache-aware scheduling: the shortest estimated
    /// time to first token, a prefix in the cluster's shared pool
    /// (`--global-pool-tokens`) fetched over the network.
    GlobalKv,
}

impl PolicyKind {
    /// All four, in the order reports list them.
    pub const ALL: [PolicyKind; 4] = [
        PolicyKind::Random,
        PolicyKind::RoundRobin,
        PolicyKind::LeastLoaded,
        PolicyKind::KvAware,
    ];

    /// Every policy, [`ALL`](Self::ALL) and then those that read a shared
    /// pool.
    pub const NAMED: [PolicyKind; 5] = [
        PolicyKind::Random,
        PolicyKind::RoundRobin,
        PolicyKind::LeastLoaded,
        PolicyKind::KvAware,
        PolicyKind::GlobalKv,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Random => "random",
            PolicyKind::RoundRobin => "round-robin",
            PolicyKind::LeastLoaded => "least-loaded",
            PolicyKind::KvAware => "kv-aware",
            PolicyKind::GlobalKv => "global-kv",
        }
    }

    /// The policy of a command-line name.
    ///
    /// # Errors
    ///
    /// [`SimError::UnknownPolicy`] for any other name.
    pub fn parse(name: &str) -> Result<Self, SimError> {
        (Self::NAMED.into_iter())
            .find(|policy| policy.name() == name.trim())
            .ok_or_else(|| SimError::UnknownPolicy {
                name: name.to_owned(),
            })
    }
}

/// What to replay in cluster mode.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ClusterConfig {
    /// Engines behind the router (default 16, the Mooncake paper's).
    pub engines: usize,
    /// Every engine's pool, scheduler and step-time model (serve mode's);
    /// `engine.capacity` is per engine.
    pub engine: ServeConfig,
    /// The policies to compare, one replay each.
    pub policies: Vec<PolicyKind>,
    /// The KV-aware policy's overlap weight (default 1, Dynamo's).
    pub overlap_weight: f64,
    /// The KV-aware policy's softmax temperature (default 0: greedy).
    pub temperature: f64,
    /// Threads the engines step on between arrivals (default `None`: one
    /// per core; `Some(0)` or `Some(1)`: the calling thread; never more
    /// than one per engine, nor more than 256). The replay is the same for
    /// any count.
    pub threads: Option<usize>,
    /// The most memory a replay may need, in bytes, by
    /// [`memory_estimate`](Self::memory_estimate): a larger cluster is
    /// refused before anything is built (default
    /// [`DEFAULT_MEMORY_BUDGET`](Self::DEFAULT_MEMORY_BUDGET); at most
    /// [`MAX_MEMORY_BUDGET`](Self::MAX_MEMORY_BUDGET)).
    pub memory_budget: u64,
    /// Tokens of a pool every engine shares below its own tiers, as
    /// Mooncake's store pools its nodes' DRAM and SSD (medium `"REMOTE"`):
    /// engines offload into it and load from it over their network link.
    /// `None` (the default): no shared pool.
    pub global_pool_tokens: Option<u64>,
    /// Each engine's network link to the shared pool (default
    /// [`Link::NETWORK_100G`]).
    pub network: Link,
    /// Whether only [`PolicyKind::GlobalKv`]'s replay has the shared pool,
    /// the other policies keeping to each engine's own caches (default
    /// `false`): Mooncake's Figure 5 compares them so, since moving a
    /// prefix between instances is what its global scheduling adds.
    pub pool_only_for_global_kv: bool,
    /// Copies of the trace replayed together ([`Trace::replicate`]: each
    /// with block ids of its own, all at the trace's arrival times), so a
    /// cluster N times larger carries the same load per engine (default
    /// 1: the trace as it is; at least 1).
    pub replicate: usize,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            engines: 16,
            engine: ServeConfig::default(),
            policies: PolicyKind::ALL.to_vec(),
            overlap_weight: 1.0,
            temperature: 0.0,
            threads: None,
            memory_budget: Self::DEFAULT_MEMORY_BUDGET,
            global_pool_tokens: None,
            network: Link::NETWORK_100G,
            pool_only_for_global_kv: false,
            replicate: 1,
        }
    }
}

impl ClusterConfig {
    /// The default [`memory_budget`](Self::memory_budget): 12 GB (12 × 10^9
    /// bytes), half of the 24 GB CI machine, leaving the other half to the
    /// system, the build and the tests that run beside a replay. The
    /// estimate is an upper bound (2.86 GB for the README's 16-engine
    /// replay of the full conversation trace, which holds at most 454 MB),
    /// so the replays it lets through hold less; about 470 such engines fit
    /// it on that trace.
    pub const DEFAULT_MEMORY_BUDGET: u64 = 12_000_000_000;

    /// The largest [`memory_budget`](Self::memory_budget) accepted: 10^15
    /// bytes (a petabyte), more than any machine this runs on has; a
    /// larger number is a typo, not a plan.
    pub const MAX_MEMORY_BUDGET: u64 = 1_000_000_000_000_000;

    /// `engines` engines, each configured as `engine`; the other settings
    /// at their defaults.
    pub fn new(engines: usize, engine: ServeConfig) -> Self {
        Self {
            engines,
            engine,
            ..Self::default()
        }
    }

    /// Sets [`global_pool_tokens`](Self::global_pool_tokens).
    pub fn with_global_pool_tokens(mut self, tokens: u64) -> Self {
        self.global_pool_tokens = Some(tokens);
        self
    }

    /// Sets [`pool_only_for_global_kv`](Self::pool_only_for_global_kv).
    pub fn with_pool_only_for_global_kv(mut self, only: bool) -> Self {
        self.pool_only_for_global_kv = only;
        self
    }

    /// Sets [`replicate`](Self::replicate): `copies` copies of the trace
    /// (checked by [`validate`](Self::validate), and against the trace by
    /// [`replay`](super::replay)).
    pub fn with_replicate(mut self, copies: usize) -> Self {
        self.replicate = copies;
        self
    }

    /// Sets [`network`](Self::network).
    pub fn with_network(mut self, link: Link) -> Self {
        self.network = link;
        self
    }

    /// The shared pool's size in blocks, checked (`None` without one).
    /// With a model's KV cache groups, tokens of its KV: a block per group
    /// per `block_size` tokens, as its engines' own tiers
    /// ([`ServeConfig::replay_tiers`]).
    pub(super) fn global_pool_blocks(&self) -> Result<Option<usize>, SimError> {
        let Some(tokens) = self.global_pool_tokens else {
            return Ok(None);
        };
        self.network.validate("network")?;
        let block_size = self.engine.block_size.max(1) as u64;
        let groups = self.engine.kv_group_count()? as u64;
        let blocks = (tokens / block_size).saturating_mul(groups);
        if blocks == 0 || blocks > MAX_BLOCKS as u64 {
            return Err(SimError::InvalidTiers(format!(
                "a shared pool of {tokens} tokens is {blocks} blocks of {block_size} (1 to {MAX_BLOCKS})"
            )));
        }
        Ok(Some(blocks as usize))
    }

    /// Compares `policies` (one replay each, in this order).
    pub fn with_policies(mut self, policies: Vec<PolicyKind>) -> Self {
        self.policies = policies;
        self
    }

    /// The KV-aware policy's overlap weight.
    pub fn with_overlap_weight(mut self, weight: f64) -> Self {
        self.overlap_weight = weight;
        self
    }

    /// The KV-aware policy's softmax temperature.
    pub fn with_temperature(mut self, temperature: f64) -> Self {
        self.temperature = temperature;
        self
    }

    /// Steps the engines on `threads` threads (`Some(1)`: the calling
    /// thread; `None`: one per core).
    pub fn with_threads(mut self, threads: Option<usize>) -> Self {
        self.threads = threads;
        self
    }

    /// Sets [`memory_budget`](Self::memory_budget), in bytes (checked by
    /// [`validate`](Self::validate)).
    pub fn with_memory_budget(mut self, bytes: u64) -> Self {
        self.memory_budget = bytes;
        self
    }

    /// Sets [`memory_budget`](Self::memory_budget) in gigabytes (10^9
    /// bytes), as `--memory-limit-gb` takes it; rounded down to whole bytes.
    ///
    /// # Errors
    ///
    /// [`SimError::InvalidMemoryLimit`] unless `gigabytes` is a finite
    /// number whose bytes are at least 1 and at most
    /// [`MAX_MEMORY_BUDGET`](Self::MAX_MEMORY_BUDGET).
    pub fn with_memory_limit_gb(self, gigabytes: f64) -> Result<Self, SimError> {
        let bytes = gigabytes * 1e9;
        // Checked as a float first, so the conversion below is exact
        // (`MAX_MEMORY_BUDGET` is below 2^53).
        if !(bytes.is_finite() && bytes >= 1.0 && bytes <= Self::MAX_MEMORY_BUDGET as f64) {
            return Err(SimError::InvalidMemoryLimit { value: gigabytes });
        }
        Ok(self.with_memory_budget(bytes as u64))
    }

    /// An upper bound of the memory, in bytes, a replay of `trace` (its
    /// [`replicate`](Self::replicate) copies) with this configuration
    /// allocates: per engine its pool's tables, its event subscription and
    /// fixed state; beside them the blocks the router and the running
    /// sequences hold, every prompt, and per request its record on the
    /// engine it is routed to and the trace-wide results. The terms and the
    /// measurements behind their constants are in `src/mode/cluster/memory.rs`.
    ///
    /// # Errors
    ///
    /// [`validate`](Self::validate)'s.
    pub fn memory_estimate(&self, trace: &Trace) -> Result<u64, SimError> {
        let capacity_blocks = self.capacity_blocks()?;
        Ok(memory::estimate(self, capacity_blocks, trace))
    }

    /// Checks what can be checked without the trace: some engines, a valid
    /// engine, all pools together no larger than one pool may be, and a
    /// memory budget in range. ([`replay`](super::replay) then checks the
    /// [`memory_estimate`](Self::memory_estimate) for its trace against the
    /// budget, so a typo in `--engines` is an error, not an exhausted
    /// machine.)
    ///
    /// # Errors
    ///
    /// [`SimError::ZeroEngines`], [`SimError::InvalidReplicate`] for no
    /// copies of the trace, [`SimError::InvalidRouting`] for a
    /// negative or non-finite overlap weight or temperature,
    /// [`SimError::ClusterTooLarge`], [`SimError::InvalidMemoryLimit`] for a
    /// budget of 0 or over [`MAX_MEMORY_BUDGET`](Self::MAX_MEMORY_BUDGET),
    /// and [`ServeConfig::validate`]'s and the capacity's errors.
    pub fn validate(&self) -> Result<(), SimError> {
        self.capacity_blocks().map(drop)
    }

    /// [`validate`](Self::validate), answering each engine's pool size.
    pub(super) fn capacity_blocks(&self) -> Result<usize, SimError> {
        if self.engines == 0 {
            return Err(SimError::ZeroEngines);
        }
        if self.replicate == 0 {
            return Err(SimError::InvalidReplicate {
                copies: 0,
                reason: "at least one copy is needed".to_owned(),
            });
        }
        for (name, value) in [
            ("overlap weight", self.overlap_weight),
            ("temperature", self.temperature),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(SimError::InvalidRouting { name, value });
            }
        }
        self.engine.validate()?;
        self.global_pool_blocks()?;
        let capacity_blocks = self.engine.capacity_blocks()?;
        match self.engines.checked_mul(capacity_blocks) {
            Some(total) if total <= MAX_BLOCKS => {}
            _ => {
                return Err(SimError::ClusterTooLarge {
                    engines: self.engines,
                    capacity_blocks,
                    max: MAX_BLOCKS,
                });
            }
        }
        if !(1..=Self::MAX_MEMORY_BUDGET).contains(&self.memory_budget) {
            return Err(SimError::InvalidMemoryLimit {
                value: self.memory_budget as f64 / 1e9,
            });
        }
        Ok(capacity_blocks)
    }

    pub(super) fn policy(
        &self,
        kind: PolicyKind,
        pool: &Arc<PrefixIndex>,
    ) -> Result<Box<dyn Policy + Send>, SimError> {
        let seed = self.engine.seed;
        Ok(match kind {
            PolicyKind::Random => Box::new(Random::new(seed)),
            PolicyKind::RoundRobin => Box::new(RoundRobin::new()),
            PolicyKind::LeastLoaded => Box::new(LeastLoaded),
            PolicyKind::KvAware => Box::new(
                KvAware::new(seed)
                    .with_overlap_weight(self.overlap_weight)
                    .with_temperature(self.temperature),
            ),
            PolicyKind::GlobalKv => {
                let block_bits =
                    (self.engine.replay_tiers()?).block_bytes(self.engine.block_size)? as f64 * 8.0;
                Box::new(GlobalKv::new(
                    Arc::clone(pool),
                    GlobalCosts {
                        prefill_token_s: self.engine.step_time.per_prefill_token.as_secs_f64(),
                        fetch_setup_s: self.network.setup_us / 1e6,
                        fetch_block_s: block_bits / (self.network.gbps * 1e9),
                    },
                ))
            }
        })
    }

    /// The weight a block in an engine's own lower tier has against one
    /// on its device, for routing: what loading it saves of computing it
    /// (`1 - load / compute`, per block, at least 0).
    pub(super) fn medium_weights(&self) -> Result<Vec<(&'static str, f64)>, SimError> {
        let block_size = self.engine.block_size;
        let tiers = self.engine.replay_tiers()?;
        let block_bits = tiers.block_bytes(block_size)? as f64 * 8.0;
        let compute_s = block_size as f64 * self.engine.step_time.per_prefill_token.as_secs_f64();
        let plans = tiers.plan(block_size)?;
        Ok((plans.iter())
            .map(|plan| {
                let load_s = plan.link.setup_us / 1e6 + block_bits / (plan.link.gbps * 1e9);
                let weight = if compute_s > 0.0 {
                    1.0 - load_s / compute_s
                } else {
                    0.0
                };
                (plan.medium, weight.clamp(0.0, 1.0))
            })
            .collect())
    }
}
