//! The command line: subcommands and their arguments, parsed by clap into
//! the library's configurations.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};
use kvbm_queue::{Aging, GenerationReserve, Preemption, SchedulerConfig};
use kvbm_sim::{
    Capacity, ClusterConfig, Eviction, Link, PolicyKind, PriorityMix, ServeConfig, SimError,
    StepTime, TierSetup,
};

/// Replays Mooncake-format request traces through kvbm's block manager.
///
/// With no command, replays the embedded excerpt of the Mooncake FAST'25
/// conversation trace (500 requests) through an unbounded prefix cache and
/// prints a summary.
#[derive(Debug, Parser)]
#[command(name = "kvbm-sim", version, after_help = features_help())]
pub(crate) struct Cli {
    /// Never draw progress bars (they are also hidden when stderr is not a terminal).
    #[arg(long, short, global = true)]
    pub(crate) quiet: bool,
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Replay requests one after another through a prefix cache and report hits.
    Cache(CacheArgs),
    /// Run cache mode over capacities and policies; write a table and an SVG plot.
    Sweep(SweepArgs),
    /// Replay arrivals through the continuous-batching scheduler in simulated
    /// time; report latencies, throughput, preemptions and hits.
    Serve(Box<ServeArgs>),
    /// Route arrivals over N serve-mode engines, once per routing policy;
    /// compare latencies, hit rates and load balance.
    Cluster(Box<ClusterArgs>),
    /// Serve once without a host tier and once per host-tier size; write a
    /// table and an SVG plot of mean TTFT and hit rate against its size.
    TierSweep(Box<TierSweepArgs>),
}

#[derive(Debug, Args)]
pub(crate) struct TraceArgs {
    /// Mooncake-format JSONL trace [default: the embedded conversation excerpt].
    #[arg(long, value_name = "FILE")]
    pub(crate) trace: Option<PathBuf>,
    /// Tokens per simulated block; must divide the trace's 512.
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub(crate) block_size: usize,
}

#[derive(Debug, Args)]
#[group(multiple = false)]
pub(crate) struct CapacityArgs {
    /// Cache size in blocks (6000, 6k, 1.5M).
    #[arg(long, value_name = "N", value_parser = Capacity::parse_count)]
    pub(crate) capacity_blocks: Option<u64>,
    /// Cache size in tokens, rounded down to whole blocks (3M).
    #[arg(long, value_name = "N", value_parser = Capacity::parse_count)]
    pub(crate) capacity_tokens: Option<u64>,
    /// Room for every distinct block: nothing is evicted [default].
    #[arg(long)]
    pub(crate) unbounded: bool,
}

impl CapacityArgs {
    pub(crate) fn capacity(&self) -> Capacity {
        match (self.capacity_blocks, self.capacity_tokens) {
            (Some(blocks), _) => Capacity::Blocks(blocks),
            (None, Some(tokens)) => Capacity::Tokens(tokens),
            (None, None) => Capacity::Unbounded,
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct CacheArgs {
    #[command(flatten)]
    pub(crate) trace: TraceArgs,
    #[command(flatten)]
    pub(crate) capacity: CapacityArgs,
    /// Which cached block to evict first.
    #[arg(long, value_name = "POLICY", default_value = "lru", value_parser = eviction_parser())]
    pub(crate) eviction: Eviction,
    #[command(flatten)]
    pub(crate) tiers: LowerTierArgs,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Lower tiers' sizes and offload policy (cache mode takes these alone;
/// serve and cluster add links, [`TierArgs`]).
#[derive(Debug, Args)]
pub(crate) struct LowerTierArgs {
    /// A host-memory tier of N tokens below the GPU [default: none].
    #[arg(long, value_name = "N")]
    pub(crate) host_tier_tokens: Option<u64>,
    /// A disk tier of N tokens (below the host tier, if any) [default: none].
    #[arg(long, value_name = "N")]
    pub(crate) disk_tier_tokens: Option<u64>,
    /// What a lower tier takes from the one above it: write-through,
    /// write-back, or selective:K (blocks hit K times).
    #[arg(long, value_name = "POLICY", default_value = "write-through")]
    pub(crate) offload: kvbm_sim::Offload,
}

impl LowerTierArgs {
    pub(crate) fn cache_tiers(&self) -> kvbm_sim::CacheTiers {
        let mut tiers = kvbm_sim::CacheTiers::default().with_offload(self.offload);
        if let Some(tokens) = self.host_tier_tokens {
            tiers = tiers.with_host_tokens(tokens);
        }
        if let Some(tokens) = self.disk_tier_tokens {
            tiers = tiers.with_disk_tokens(tokens);
        }
        tiers
    }
}

#[derive(Debug, Args)]
pub(crate) struct SweepArgs {
    #[command(flatten)]
    pub(crate) trace: TraceArgs,
    /// Cache sizes in blocks, comma-separated (k and M suffixes allowed).
    #[arg(
        long,
        value_name = "N,...",
        value_delimiter = ',',
        value_parser = Capacity::parse_count,
        default_value = "1k,2k,4k,6k,10k,20k,50k"
    )]
    pub(crate) capacities: Vec<u64>,
    /// Eviction policies, comma-separated.
    #[arg(
        long,
        value_name = "POLICY,...",
        value_delimiter = ',',
        value_parser = eviction_parser(),
        default_value = "lru,multi-level,lineage"
    )]
    pub(crate) evictions: Vec<Eviction>,
    /// Directory for sweep.csv, sweep.md and sweep.svg (created if missing).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: PathBuf,
    /// Print the results as one JSON object instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct TierSweepArgs {
    #[command(flatten)]
    pub(crate) trace: ReplayTraceArgs,
    /// Host-tier sizes as multiples of the GPU pool, comma-separated
    /// (one run each, after one without a host tier).
    #[arg(
        long,
        value_name = "X,...",
        value_delimiter = ',',
        default_value = "1,2,4,8,16",
        conflicts_with = "host_tokens"
    )]
    pub(crate) host_multiples: Vec<f64>,
    /// Host-tier sizes in tokens instead, comma-separated (12M, 48M).
    #[arg(long, value_name = "N,...", value_delimiter = ',', value_parser = Capacity::parse_count)]
    pub(crate) host_tokens: Option<Vec<u64>>,
    /// Runs replayed at once [default: one per core].
    #[arg(long, value_name = "N")]
    pub(crate) threads: Option<usize>,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Directory for tier_sweep.csv, tier_sweep.md and tier_sweep.svg
    /// (created if missing).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: PathBuf,
    /// Print the results as one JSON object instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
}

impl TierSweepArgs {
    pub(crate) fn config(&self) -> Result<kvbm_sim::TierSweepConfig, SimError> {
        use kvbm_sim::HostTierSize;
        let sizes = match &self.host_tokens {
            Some(tokens) => tokens.iter().map(|&t| HostTierSize::Tokens(t)).collect(),
            None => (self.host_multiples.iter())
                .map(|&m| HostTierSize::Multiple(m))
                .collect(),
        };
        let engine = self.model.engine_config(&self.engine)?.with_metrics(false);
        Ok(kvbm_sim::TierSweepConfig::new(engine)
            .with_sizes(sizes)
            .with_threads(self.threads))
    }
}

#[derive(Debug, Args)]
#[group(multiple = false)]
pub(crate) struct ServeCapacityArgs {
    /// KV pool size in blocks (6000, 6k, 1.5M).
    #[arg(long, value_name = "N", value_parser = Capacity::parse_count)]
    pub(crate) capacity_blocks: Option<u64>,
    /// KV pool size in tokens, rounded down to whole blocks [default: 3M].
    #[arg(long, value_name = "N", value_parser = Capacity::parse_count)]
    pub(crate) capacity_tokens: Option<u64>,
}

#[derive(Debug, Args)]
pub(crate) struct ReplayTraceArgs {
    /// Mooncake-format JSONL trace [default: the embedded conversation excerpt].
    #[arg(long, value_name = "FILE")]
    pub(crate) trace: Option<PathBuf>,
    /// Replay only the first N requests of the trace (in file order).
    #[arg(long, value_name = "N")]
    pub(crate) limit: Option<NonZeroUsize>,
}

/// One engine's pool, scheduler and step-time model (serve mode's engine,
/// and every engine of a cluster).
#[derive(Debug, Args)]
pub(crate) struct EngineArgs {
    /// Tokens per KV block; must divide the trace's 512.
    #[arg(long, value_name = "N", default_value_t = ServeConfig::default().block_size)]
    pub(crate) block_size: usize,
    #[command(flatten)]
    pub(crate) capacity: ServeCapacityArgs,
    /// Which cached block to evict first.
    #[arg(long, value_name = "POLICY", default_value = "lru", value_parser = eviction_parser())]
    pub(crate) eviction: Eviction,
    /// Most requests running at once.
    #[arg(long, value_name = "N", default_value_t = SchedulerConfig::default().max_running)]
    pub(crate) max_running: usize,
    /// Most tokens one step computes (prefill chunks plus one per decode).
    #[arg(long, value_name = "N", default_value_t = SchedulerConfig::default().token_budget)]
    pub(crate) token_budget: usize,
    /// Most prompt tokens one request prefills per step.
    #[arg(long, value_name = "N", default_value_t = SchedulerConfig::default().chunk_size)]
    pub(crate) chunk_size: usize,
    /// Blocks admission keeps free for running requests to grow into [default: 1% of the pool].
    #[arg(long, value_name = "N")]
    pub(crate) watermark_blocks: Option<usize>,
    /// Generated tokens admission reserves per request: a cap, or `full`.
    #[arg(long, value_name = "N|full", default_value = "256", value_parser = parse_reserve)]
    pub(crate) reserve: GenerationReserve,
    /// Charge admission for a request's whole prompt, without credit for
    /// the prefix it finds cached.
    #[arg(long)]
    pub(crate) no_prefix_credit: bool,
    /// Draft tokens each decode verifies (speculative decoding; 0: off).
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub(crate) spec_tokens: usize,
    /// Probability the engine accepts each draft token (until the first
    /// rejection).
    #[arg(long, value_name = "P", default_value_t = ServeConfig::default().spec_accept)]
    pub(crate) spec_accept: f64,
    /// Seed of the random draws (priorities, draft acceptance).
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub(crate) seed: u64,
    /// Priorities of requests whose trace line has none, as vLLM priority
    /// values (lower is more urgent) and their shares, e.g. `0:0.1,1:0.9`
    /// [default: all normal].
    #[arg(long, value_name = "P:SHARE,...")]
    pub(crate) priorities: Option<String>,
    /// Let a waiting request preempt running requests less urgent than it.
    #[arg(long)]
    pub(crate) priority_preemption: bool,
    /// Priority steps a request's urgency rises per second of waiting
    /// (0: strict priority).
    #[arg(long, value_name = "F", default_value_t = 0.0)]
    pub(crate) aging_per_s: f64,
    /// Priority steps a request's urgency rises each time it is preempted
    /// (at most 3 in all).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) preemption_boost: u32,
    /// Simulated fixed cost of a step, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 5.0)]
    pub(crate) step_ms: f64,
    /// Simulated cost per prefilled token, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 0.05)]
    pub(crate) prefill_token_ms: f64,
    /// Simulated cost per decoding request in a step, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 0.1)]
    pub(crate) decode_request_ms: f64,
    /// Check the scheduler's conservation laws every N steps (0: only at the end).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) audit_every: u64,
    #[command(flatten)]
    pub(crate) tiers: TierArgs,
}

/// Tiers below the GPU and their links (all off by default).
#[derive(Debug, Args)]
pub(crate) struct TierArgs {
    #[command(flatten)]
    pub(crate) lower: LowerTierArgs,
    /// KV bytes per token, which sizes the blocks the tiers' links carry
    /// [default: 131072, an 8B model; with --model or --groups, the model's
    /// own].
    #[arg(long, value_name = "B")]
    pub(crate) kv_bytes_per_token: Option<u64>,
    /// The host tier's link in Gbit/s per direction [default: PCIe 5.0 x16].
    #[arg(long, value_name = "GBPS", default_value_t = Link::PCIE5_X16.gbps)]
    pub(crate) host_link_gbps: f64,
    /// Setup time of each host-link transfer, in microseconds.
    #[arg(long, value_name = "US", default_value_t = Link::PCIE5_X16.setup_us)]
    pub(crate) host_link_setup_us: f64,
    /// The disk tier's link in Gbit/s per direction [default: one NVMe drive].
    #[arg(long, value_name = "GBPS", default_value_t = Link::NVME_GEN4.gbps)]
    pub(crate) disk_link_gbps: f64,
    /// Setup time of each disk-link transfer, in microseconds.
    #[arg(long, value_name = "US", default_value_t = Link::NVME_GEN4.setup_us)]
    pub(crate) disk_link_setup_us: f64,
}

impl TierArgs {
    pub(crate) fn setup(&self) -> TierSetup {
        let mut setup = TierSetup::default().with_offload(self.lower.offload);
        setup.host_tokens = self.lower.host_tier_tokens;
        setup.disk_tokens = self.lower.disk_tier_tokens;
        if let Some(bytes) = self.kv_bytes_per_token {
            setup.kv_bytes_per_token = bytes;
        }
        setup.host_link = Link {
            gbps: self.host_link_gbps,
            setup_us: self.host_link_setup_us,
        };
        setup.disk_link = Link {
            gbps: self.disk_link_gbps,
            setup_us: self.disk_link_setup_us,
        };
        setup
    }
}

#[derive(Debug, Args)]
pub(crate) struct MetricsArgs {
    /// Serve the metrics in Prometheus text format at http://ADDR/metrics
    /// while replaying (e.g. 127.0.0.1:9090). Needs the `prometheus`
    /// feature.
    #[arg(long, value_name = "ADDR")]
    pub(crate) prometheus: Option<std::net::SocketAddr>,
    /// With --prometheus, keep serving this many seconds after the replay.
    #[arg(long, value_name = "S", default_value_t = 0, requires = "prometheus")]
    pub(crate) prometheus_hold_s: u64,
    /// Write the final Prometheus exposition to FILE. Needs the
    /// `prometheus` feature.
    #[arg(long, value_name = "FILE")]
    pub(crate) metrics_out: Option<PathBuf>,
}

/// A model's KV layout and memory (serve mode only).
#[derive(Debug, Args)]
pub(crate) struct ModelArgs {
    /// A model's KV layout, from its published config.json: gpt-oss-120b,
    /// gpt-oss-20b, gemma-3-27b, llama-3.1-8b or llama-4-scout. Its layers
    /// run as KV cache groups (sliding-window, chunked-local and full
    /// attention) in one pool of --capacity-bytes; the JSON report gains
    /// `kv_groups` and `peak_kv_bytes`.
    #[arg(long, value_name = "NAME")]
    pub(crate) model: Option<String>,
    /// A model's layers by attention kind instead of --model:
    /// comma-separated full:LAYERS, sliding_window:WINDOW:LAYERS and
    /// chunked_local:CHUNK:LAYERS (e.g. sliding_window:128:18,full:18),
    /// grouped as vLLM groups them. Needs --kv-bytes-per-token-layer.
    #[arg(long, value_name = "DESC")]
    pub(crate) groups: Option<String>,
    /// With --groups, KV bytes of one token in one layer (2 x KV heads x
    /// head dim x bytes per element; 2048 for gpt-oss).
    #[arg(long, value_name = "B")]
    pub(crate) kv_bytes_per_token_layer: Option<String>,
    /// With --model or --groups, the KV memory in bytes (40000000000, 40G
    /// or 40e9): the pool gets floor(B / bytes per block) blocks.
    #[arg(long, value_name = "B")]
    pub(crate) capacity_bytes: Option<String>,
    /// With --model or --groups, treat every layer as full attention (one
    /// group of all the layers, every token's KV kept: kvbm without KV
    /// cache groups) in the same --capacity-bytes, for comparison.
    #[arg(long)]
    pub(crate) full_attention_only: bool,
}

impl ModelArgs {
    /// `engine`'s configuration with the KV layout these flags ask for, if
    /// any (a model's blocks have their own bytes, so --kv-bytes-per-token
    /// does not go with one).
    pub(crate) fn engine_config(&self, engine: &EngineArgs) -> Result<ServeConfig, SimError> {
        let config = engine.config()?;
        let Some(kv) = self.setup(&engine.capacity)? else {
            return Ok(config);
        };
        if engine.tiers.kv_bytes_per_token.is_some() {
            return Err(SimError::ConflictingFlags {
                flag: "--kv-bytes-per-token",
                other: "--model or --groups",
                reason: "a model's blocks have its own bytes (--kv-bytes-per-token-layer)",
            });
        }
        config.with_checked_kv(kv)
    }

    /// The KV layout these flags ask for (`None` without --model or
    /// --groups), refusing flags that do not go together; `capacity` is
    /// the engine's own capacity flags, which a model's bytes replace.
    pub(crate) fn setup(
        &self,
        capacity: &ServeCapacityArgs,
    ) -> Result<Option<kvbm_sim::KvSetup>, SimError> {
        let sized_by = [
            (capacity.capacity_blocks.is_some(), "--capacity-blocks"),
            (capacity.capacity_tokens.is_some(), "--capacity-tokens"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag));
        kvbm_sim::KvFlags {
            model: self.model.as_deref(),
            groups: self.groups.as_deref(),
            kv_bytes_per_token_layer: self.kv_bytes_per_token_layer.as_deref(),
            capacity_bytes: self.capacity_bytes.as_deref(),
            full_attention_only: self.full_attention_only,
        }
        .setup(sized_by)
    }
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub(crate) trace: ReplayTraceArgs,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    #[command(flatten)]
    pub(crate) metrics: MetricsArgs,
    /// Publish the engine's KV events on vLLM's ZeroMQ wire (msgpack
    /// KVEventBatch, hashes as 64-bit ints) at ENDPOINT. As in vLLM, an
    /// endpoint with `*` is bound (tcp://*:5557, for routers to connect),
    /// any other is connected to. Needs the `kv-events` feature.
    #[arg(long, value_name = "ENDPOINT")]
    pub(crate) kv_events: Option<String>,
    /// With --kv-events, also answer replay requests at ENDPOINT (a ROUTER
    /// socket keeping the last 10,000 batches).
    #[arg(long, value_name = "ENDPOINT", requires = "kv_events")]
    pub(crate) kv_events_replay: Option<String>,
    /// With --kv-events, the topic frame of every message.
    #[arg(long, value_name = "T", default_value = "", requires = "kv_events")]
    pub(crate) kv_events_topic: String,
    /// With --kv-events, wait up to MS for the subscribers
    /// (--kv-events-subscribers) before replaying, so none misses the first
    /// batches.
    #[arg(long, value_name = "MS", default_value_t = 0, requires = "kv_events")]
    pub(crate) kv_events_wait_ms: u64,
    /// With --kv-events-wait-ms, how many subscribers to wait for (a router
    /// and a monitor: 2; each SUB socket counts once; at most 1024). 0 does
    /// not wait.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        requires = "kv_events_wait_ms"
    )]
    pub(crate) kv_events_subscribers: usize,
    /// Move real bytes behind the lower tiers: `host` (host-memory arenas),
    /// `disk:DIR` (the lowest tier in a disk store in DIR), or
    /// `redis:URL[,URL...]` (the lowest tier in a Redis Cluster; needs the
    /// `redis` feature). Each
    /// block is --kv-bytes-per-token x block size bytes of a fake engine's
    /// KV (with --model or --groups, the model's block), checked byte for
    /// byte when it comes back; keep them small (the device's memory is
    /// allocated too). The JSON report gains `data_plane`.
    #[arg(long, value_name = "STORE")]
    pub(crate) data_plane: Option<kvbm_sim::DataPlaneSpec>,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ClusterArgs {
    #[command(flatten)]
    pub(crate) trace: ReplayTraceArgs,
    /// Engines behind the router.
    #[arg(long, value_name = "N", default_value_t = ClusterConfig::default().engines)]
    pub(crate) engines: usize,
    /// Replay N copies of the trace at once, each with block ids of its
    /// own (no copy shares a cached prefix with another) and the trace's
    /// arrival times: N times the load, for N times the engines (1,024
    /// engines with --replicate 64 carry the load per engine of 16 with
    /// the trace itself). Applied after --limit.
    #[arg(long, value_name = "N", default_value_t = ClusterConfig::default().replicate)]
    pub(crate) replicate: usize,
    /// Routing policies to compare, comma-separated; one replay each.
    #[arg(
        long,
        value_name = "POLICY,...",
        value_delimiter = ',',
        value_parser = policy_parser(),
        default_value = "random,round-robin,least-loaded,kv-aware"
    )]
    pub(crate) policies: Vec<PolicyKind>,
    /// The kv-aware policy's weight on prefill blocks against decode blocks.
    #[arg(long, value_name = "W", default_value_t = ClusterConfig::default().overlap_weight)]
    pub(crate) overlap_weight: f64,
    /// The kv-aware policy's softmax temperature (0: always the cheapest).
    #[arg(long, value_name = "T", default_value_t = ClusterConfig::default().temperature)]
    pub(crate) temperature: f64,
    /// Threads the engines step on between arrivals (default: one per
    /// core, at most one per engine and 256; 1 steps them in turn). The
    /// results do not depend on it.
    #[arg(long, value_name = "N")]
    pub(crate) threads: Option<usize>,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    #[command(flatten)]
    pub(crate) metrics: MetricsArgs,
    /// Refuse a cluster whose estimated memory for the trace exceeds this
    /// many gigabytes (10^9 bytes), before building anything.
    #[arg(
        long,
        value_name = "GB",
        default_value_t = ClusterConfig::DEFAULT_MEMORY_BUDGET as f64 / 1e9
    )]
    pub(crate) memory_limit_gb: f64,
    /// A pool of N tokens every engine shares below its own tiers
    /// (Mooncake's store), reached over the network [default: none].
    #[arg(long, value_name = "N")]
    pub(crate) global_pool_tokens: Option<u64>,
    /// Each engine's network link to the shared pool, Gbit/s per direction.
    #[arg(long, value_name = "GBPS", default_value_t = Link::NETWORK_100G.gbps)]
    pub(crate) network_gbps: f64,
    /// Setup time of each network transfer, in microseconds.
    #[arg(long, value_name = "US", default_value_t = Link::NETWORK_100G.setup_us)]
    pub(crate) network_setup_us: f64,
    /// Give the shared pool to global-kv's replay only, the other policies
    /// keeping to each engine's own caches (Mooncake's Figure 5).
    #[arg(long, requires = "global_pool_tokens")]
    pub(crate) pool_only_for_global_kv: bool,
    /// Directory for cluster.svg and cluster.json (created if missing).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
}

impl ServeArgs {
    /// The engine's configuration, with the model's KV layout if one is
    /// asked for.
    pub(crate) fn config(&self) -> Result<ServeConfig, SimError> {
        self.model.engine_config(&self.engine)
    }
}

impl ClusterArgs {
    pub(crate) fn config(&self) -> Result<ClusterConfig, SimError> {
        let engine = self.model.engine_config(&self.engine)?;
        let mut config = ClusterConfig::new(self.engines, engine)
            .with_replicate(self.replicate)
            .with_policies(self.policies.clone())
            .with_overlap_weight(self.overlap_weight)
            .with_temperature(self.temperature)
            .with_threads(self.threads)
            .with_network(Link {
                gbps: self.network_gbps,
                setup_us: self.network_setup_us,
            })
            .with_pool_only_for_global_kv(self.pool_only_for_global_kv)
            .with_memory_limit_gb(self.memory_limit_gb)?;
        if let Some(tokens) = self.global_pool_tokens {
            config = config.with_global_pool_tokens(tokens);
        }
        config.validate()?;
        Ok(config)
    }
}

impl EngineArgs {
    pub(crate) fn config(&self) -> Result<ServeConfig, SimError> {
        let capacity = match (self.capacity.capacity_blocks, self.capacity.capacity_tokens) {
            (Some(blocks), _) => Capacity::Blocks(blocks),
            (None, Some(tokens)) => Capacity::Tokens(tokens),
            (None, None) => ServeConfig::default().capacity,
        };
        let mut scheduler = SchedulerConfig::default()
            .with_max_running(self.max_running)
            .with_token_budget(self.token_budget)
            .with_chunk_size(self.chunk_size)
            .with_reserve(self.reserve)
            .with_prefix_credit(!self.no_prefix_credit)
            .with_speculative_tokens(self.spec_tokens)
            .with_aging(aging(self.aging_per_s)?)
            .with_preemption_boost(self.preemption_boost);
        if self.priority_preemption {
            scheduler = scheduler.with_preemption(Preemption::ByPriority);
        }
        if let Some(blocks) = self.watermark_blocks {
            scheduler = scheduler.with_watermark_blocks(blocks);
        }
        let step_time =
            StepTime::from_millis(self.step_ms, self.prefill_token_ms, self.decode_request_ms)?;
        let config = ServeConfig::new(self.block_size, capacity)
            .with_eviction(self.eviction)
            .with_scheduler(scheduler)
            .with_step_time(step_time)
            .with_audit_every(self.audit_every)
            .with_spec_accept(self.spec_accept)
            .with_seed(self.seed)
            .with_tiers(self.tiers.setup());
        config.validate()?;
        match &self.priorities {
            Some(mix) => Ok(config.with_priorities(PriorityMix::parse(mix)?)),
            None => Ok(config),
        }
    }
}

/// Time-based aging at `per_second` priority steps per second of waiting;
/// strict priority at 0.
pub(crate) fn aging(per_second: f64) -> Result<Aging, SimError> {
    if !per_second.is_finite() || per_second < 0.0 {
        return Err(SimError::InvalidAgingRate { value: per_second });
    }
    if per_second == 0.0 {
        return Ok(Aging::Strict);
    }
    // Rates too small for a step to fit a `Duration` age nothing.
    let step = Duration::try_from_secs_f64(1.0 / per_second).unwrap_or(Duration::MAX);
    Ok(Aging::Timed { step })
}

/// The most `--kv-events` subscribers to wait for: each is a connection,
/// and a process may hold 1,024 file descriptors by default (Linux's soft
/// limit), so more could never all join.
pub(crate) const MAX_SUBSCRIBERS: usize = 1024;

/// `count` if it is at most [`MAX_SUBSCRIBERS`].
pub(crate) fn check_subscribers(count: usize) -> Result<usize, SimError> {
    if count > MAX_SUBSCRIBERS {
        return Err(SimError::TooManySubscribers {
            count,
            max: MAX_SUBSCRIBERS,
        });
    }
    Ok(count)
}

/// The optional Cargo features, each with the flags it adds and whether
/// this build has it: the end of `--help`.
pub(crate) fn features_help() -> String {
    let features = [
        (
            "kv-events",
            "serve --kv-events",
            cfg!(feature = "kv-events"),
        ),
        (
            "redis",
            "serve --data-plane redis:URL",
            cfg!(feature = "redis"),
        ),
        (
            "prometheus",
            "--prometheus, --metrics-out",
            cfg!(feature = "prometheus"),
        ),
    ];
    let mut help =
        "Cargo features (build with --features NAME, or --features full for all):".to_owned();
    for (name, flags, on) in features {
        let state = if on { "on" } else { "off" };
        help.push_str(&format!("\n  {name:<11} {state:<4} {flags}"));
    }
    help
}

/// `full`, or a cap in tokens.
pub(crate) fn parse_reserve(text: &str) -> Result<GenerationReserve, String> {
    if text.trim().eq_ignore_ascii_case("full") {
        return Ok(GenerationReserve::Full);
    }
    text.trim()
        .parse::<u32>()
        .map(GenerationReserve::Capped)
        .map_err(|_| format!("`{text}` is neither `full` nor a token count"))
}

/// Lists the routing policy names in `--help` and parses them with the library.
fn policy_parser() -> impl TypedValueParser<Value = PolicyKind> {
    PossibleValuesParser::new(PolicyKind::NAMED.map(PolicyKind::name))
        .try_map(|name| PolicyKind::parse(&name))
}

/// Lists the eviction policy names in `--help` and parses them with the library.
fn eviction_parser() -> impl TypedValueParser<Value = Eviction> {
    PossibleValuesParser::new(Eviction::ALL.map(Eviction::name))
        .try_map(|name| name.parse::<Eviction>())
}
