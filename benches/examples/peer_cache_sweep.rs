//! Cache-mode sweep, kvbm beside kvbm-logical 1.6.1: the same workload
//! replayed the same way through both block managers.
//!
//! Each request, in trace order: match the longest cached prefix (hits),
//! allocate the misses (evicting), stage and register them under the same
//! chained hashes, then release every block deepest first. kvbm's side is
//! `kvbm_sim::mode::cache::replay`; kvbm-logical's side is [`replay_logical`]
//! below, step for step the same.
//!
//! ```text
//! cargo run --release -p kvbm-benches --example peer_cache_sweep -- \
//!     [--trace FILE] [--block-size 512] [--capacities 1k,2k,4k,6k,10k,20k,50k] \
//!     [--evictions lru,multi-level,lineage] [--duplicates allow|reject]
//! ```
//!
//! The trace defaults to `../shared/traces/conversation_trace.jsonl` beside
//! the workspace root, then to kvbm-sim's embedded excerpt.
//!
//! The criterion bench `benches/sim.rs` includes this file as a module to
//! time [`replay_logical`] beside kvbm's replay.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use kvbm_logical::blocks::{BlockDuplicationPolicy, ImmutableBlock};
use kvbm_logical::manager::FrequencyTrackingCapacity;
use kvbm_logical::{BlockManager, BlockRegistry, SequenceHash as LogicalHash};
use kvbm_sim::{CacheConfig, Capacity, Eviction, Trace, Workload};

/// The metadata type of kvbm-logical's pool (it carries none).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerTier;

/// What a kvbm-logical replay counted.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PeerReport {
    pub(crate) input_blocks: u64,
    pub(crate) hit_blocks: u64,
    pub(crate) evictions: u64,
    pub(crate) replay_time: Duration,
}

impl PeerReport {
    pub(crate) fn block_hit_rate(&self) -> f64 {
        if self.input_blocks == 0 {
            0.0
        } else {
            self.hit_blocks as f64 / self.input_blocks as f64
        }
    }
}

/// kvbm's chained hashes as kvbm-logical's positional lineage hashes: the
/// same value, parent and position, so both pools key the same blocks.
pub(crate) fn logical_hashes(workload: &Workload) -> Vec<Vec<LogicalHash>> {
    workload
        .requests()
        .map(|request| {
            request
                .blocks
                .iter()
                .map(|hash| {
                    // kvbm-logical's lineage hash takes 64-bit values: the
                    // low halves of ours, distinct on every trace we replay.
                    let low = |value: u128| value as u64;
                    LogicalHash::new(
                        low(hash.value()),
                        hash.parent().map(low),
                        u64::from(hash.position()),
                    )
                })
                .collect()
        })
        .collect()
}

/// A fresh kvbm-logical pool with the backend matching `eviction`.
pub(crate) fn logical_manager(
    capacity_blocks: usize,
    block_size: usize,
    eviction: Eviction,
    duplicates: BlockDuplicationPolicy,
) -> Result<BlockManager<PeerTier>> {
    let builder = BlockManager::<PeerTier>::builder()
        .block_count(capacity_blocks)
        .block_size(block_size)
        .duplication_policy(duplicates);
    let builder = match eviction {
        Eviction::Lru => builder.registry(BlockRegistry::new()).with_lru_backend(),
        Eviction::MultiLevel => builder
            .registry(
                BlockRegistry::builder()
                    .frequency_tracker(FrequencyTrackingCapacity::default().create_tracker())
                    .build(),
            )
            .with_multi_lru_backend(),
        Eviction::Lineage => builder
            .registry(BlockRegistry::new())
            .with_lineage_backend(),
        other => bail!("kvbm-logical has no counterpart of eviction {other}"),
    };
    builder.build().context("building the kvbm-logical pool")
}

/// Replays `requests` (from [`logical_hashes`]) through `manager` as kvbm's
/// cache mode does.
pub(crate) fn replay_logical(
    manager: &BlockManager<PeerTier>,
    requests: &[Vec<LogicalHash>],
) -> Result<PeerReport> {
    let started = Instant::now();
    let total = manager.total_blocks();
    let block_size = manager.block_size();
    let mut report = PeerReport::default();
    for hashes in requests {
        let mut held: Vec<ImmutableBlock<PeerTier>> = manager.match_blocks(hashes);
        let hits = held.len();
        report.input_blocks += hashes.len() as u64;
        report.hit_blocks += hits as u64;
        let misses = &hashes[hits..];
        let store = misses.len().min(total - hits);
        if store > 0 {
            let (fresh, evicted) = manager
                .allocate_blocks_with_evictions(store)
                .ok_or_else(|| anyhow!("kvbm-logical refused {store} blocks"))?;
            report.evictions += evicted.len() as u64;
            let staged = fresh
                .into_iter()
                .zip(misses)
                .map(|(block, &hash)| block.stage(hash, block_size))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|err| anyhow!("staging failed: {err}"))?;
            held.extend(manager.register_blocks(staged));
        }
        // Deepest block first, as kvbm's replay releases them.
        while let Some(block) = held.pop() {
            drop(block);
        }
    }
    report.replay_time = started.elapsed();
    Ok(report)
}

/// The full conversation trace beside the workspace, if present.
pub(crate) fn default_trace_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/traces/conversation_trace.jsonl");
    std::fs::canonicalize(&path).unwrap_or(path)
}

struct Options {
    trace: Option<PathBuf>,
    block_size: usize,
    capacities: Vec<u64>,
    evictions: Vec<Eviction>,
    duplicates: BlockDuplicationPolicy,
}

fn parse_options() -> Result<Options> {
    let mut options = Options {
        trace: None,
        block_size: 512,
        capacities: vec![1_000, 2_000, 4_000, 6_000, 10_000, 20_000, 50_000],
        evictions: vec![Eviction::Lru],
        duplicates: BlockDuplicationPolicy::Allow,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--trace" => options.trace = Some(PathBuf::from(value()?)),
            "--block-size" => options.block_size = value()?.parse()?,
            "--capacities" => {
                options.capacities = value()?
                    .split(',')
                    .map(Capacity::parse_count)
                    .collect::<Result<_, _>>()?;
            }
            "--evictions" => {
                options.evictions = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?;
            }
            "--duplicates" => {
                options.duplicates = match value()?.as_str() {
                    "allow" => BlockDuplicationPolicy::Allow,
                    "reject" => BlockDuplicationPolicy::Reject,
                    other => bail!("--duplicates allow|reject, not {other}"),
                }
            }
            other => bail!("unknown argument {other} (see the file's header for usage)"),
        }
    }
    Ok(options)
}

#[allow(dead_code)] // the bench includes this file as a module and has its own main
fn main() -> Result<()> {
    let options = parse_options()?;
    let trace_path = options
        .trace
        .clone()
        .or_else(|| Some(default_trace_path()).filter(|path| path.exists()));
    let trace = match &trace_path {
        Some(path) => Trace::from_path(path)?,
        None => Trace::conversation_excerpt()?,
    };
    let workload = Workload::new(&trace, options.block_size)?;
    let requests = logical_hashes(&workload);
    let unbounded = CacheConfig::new(Capacity::Unbounded, Eviction::Lru).run(&workload)?;
    // Each tool's prints are its output; this is an example binary.
    #[allow(clippy::print_stdout)]
    {
        println!(
            "trace: {} ({} requests, block size {}), kvbm-logical duplicates: {:?}",
            trace_path.map_or_else(
                || "embedded excerpt".to_owned(),
                |p| p.display().to_string()
            ),
            workload.len(),
            workload.block_size(),
            options.duplicates,
        );
        println!(
            "unbounded block hit rate: {:.2}%\n",
            unbounded.hits.block_hit_rate() * 100.0
        );
        println!(
            "| eviction | capacity (blocks) | capacity (tokens) | kvbm | kvbm-logical | Δ (points) | kvbm evictions | kvbm-logical evictions | kvbm replay | kvbm-logical replay |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for &eviction in &options.evictions {
            for &capacity in &options.capacities {
                let ours = CacheConfig::new(Capacity::Blocks(capacity), eviction).run(&workload)?;
                let manager = logical_manager(
                    ours.capacity_blocks,
                    workload.block_size(),
                    eviction,
                    options.duplicates,
                )?;
                let peer = replay_logical(&manager, &requests)?;
                let (kvbm, logical) = (
                    ours.hits.block_hit_rate() * 100.0,
                    peer.block_hit_rate() * 100.0,
                );
                println!(
                    "| {eviction} | {capacity} | {} | {kvbm:.2}% | {logical:.2}% | {:+.2} | {} | {} | {:.1} ms | {:.1} ms |",
                    ours.capacity_tokens(),
                    kvbm - logical,
                    ours.evictions,
                    peer.evictions,
                    ours.replay_time.as_secs_f64() * 1e3,
                    peer.replay_time.as_secs_f64() * 1e3,
                );
            }
        }
    }
    Ok(())
}
