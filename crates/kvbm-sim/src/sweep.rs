//! [`Sweep`]: cache-mode hit rate across capacities and eviction policies,
//! as a table (CSV, markdown) and a plot (SVG): the picture of the Mooncake
//! paper's Figure 9.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use tracing::instrument;

use crate::format::{group, percent};
use crate::mode::cache::{self, CacheConfig, CacheReport};
use crate::output::FigureFiles;
use crate::progress::Nested;
use crate::{Capacity, Eviction, Progress, SimError, Workload};

/// What a sweep runs: every capacity under every eviction policy, plus one
/// unbounded run as the ceiling.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SweepConfig {
    /// Cache sizes to try (order and duplicates do not matter).
    pub capacities: Vec<Capacity>,
    /// Eviction policies to try.
    pub evictions: Vec<Eviction>,
}

impl SweepConfig {
    /// Every capacity in `capacities` under every policy in `evictions`.
    pub fn new(capacities: Vec<Capacity>, evictions: Vec<Eviction>) -> Self {
        Self {
            capacities,
            evictions,
        }
    }

    /// The capacities the sweep runs when none are given: 1k to 50k blocks,
    /// around the 6k blocks (3M tokens at block size 512) of the paper's
    /// smallest cache.
    pub fn default_capacities() -> Vec<Capacity> {
        [1_000, 2_000, 4_000, 6_000, 10_000, 20_000, 50_000]
            .into_iter()
            .map(Capacity::Blocks)
            .collect()
    }
}

impl Default for SweepConfig {
    /// [`default_capacities`](Self::default_capacities) under every policy.
    fn default() -> Self {
        Self {
            capacities: Self::default_capacities(),
            evictions: Eviction::ALL.to_vec(),
        }
    }
}

/// The results of a sweep.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Sweep {
    /// The unbounded run: the hit-rate ceiling.
    pub unbounded: CacheReport,
    /// One run per eviction policy and capacity, policy-major, capacities
    /// ascending.
    pub runs: Vec<CacheReport>,
}

/// The files [`Sweep::write_to`] wrote.
pub type SweepFiles = FigureFiles;

/// Runs every capacity of `config` under every policy, and once unbounded.
///
/// Capacities are resolved first (so a bad one fails before any replay),
/// then sorted and deduplicated by their size in blocks.
///
/// # Errors
///
/// [`SimError::EmptySweep`] with no capacity or no policy, the capacity
/// errors of [`Capacity::resolve`], and the errors of [`cache::replay`].
#[instrument(level = "debug", skip_all, fields(capacities = config.capacities.len(), evictions = config.evictions.len()))]
pub fn sweep(
    workload: &Workload,
    config: &SweepConfig,
    progress: &mut dyn Progress,
) -> Result<Sweep, SimError> {
    if config.capacities.is_empty() || config.evictions.is_empty() {
        return Err(SimError::EmptySweep);
    }
    let mut blocks = BTreeSet::new();
    for capacity in &config.capacities {
        blocks.insert(capacity.resolve(workload)?);
    }
    let evictions: BTreeSet<Eviction> = config.evictions.iter().copied().collect();
    let runs = blocks.len() * evictions.len() + 1;
    progress.start("sweeping", (runs * workload.len()) as u64);
    let mut nested = Nested(progress);
    let unbounded = cache::replay(
        workload,
        &CacheConfig::new(Capacity::Unbounded, Eviction::Lru),
        &mut nested,
    )?;
    let mut reports = Vec::with_capacity(runs - 1);
    for &eviction in &evictions {
        for &count in &blocks {
            let config = CacheConfig::new(Capacity::Blocks(count as u64), eviction);
            reports.push(cache::replay(workload, &config, &mut nested)?);
        }
    }
    progress.finish();
    Ok(Sweep {
        unbounded,
        runs: reports,
    })
}

impl Sweep {
    /// The policies swept, in order.
    pub fn evictions(&self) -> Vec<Eviction> {
        let mut evictions: Vec<Eviction> = self.runs.iter().map(|run| run.eviction).collect();
        evictions.dedup();
        evictions
    }

    /// The capacities swept in blocks, ascending.
    pub fn capacities(&self) -> Vec<usize> {
        let set: BTreeSet<usize> = self.runs.iter().map(|run| run.capacity_blocks).collect();
        set.into_iter().collect()
    }

    /// The run of `eviction` at `capacity_blocks`, if swept.
    pub fn run(&self, eviction: Eviction, capacity_blocks: usize) -> Option<&CacheReport> {
        self.runs
            .iter()
            .find(|run| run.eviction == eviction && run.capacity_blocks == capacity_blocks)
    }

    /// Every run (the unbounded one last) as CSV with a header row.
    pub fn to_csv(&self) -> String {
        let mut csv = String::from(
            "eviction,unbounded,block_size,capacity_blocks,capacity_tokens,requests,\
             input_blocks,hit_blocks,block_hit_rate,input_tokens,hit_tokens,token_hit_rate,\
             evictions,oversized_requests\n",
        );
        for run in self.runs.iter().chain([&self.unbounded]) {
            let hits = &run.hits;
            // Writing to a String cannot fail.
            let _ = writeln!(
                csv,
                "{},{},{},{},{},{},{},{},{:.6},{},{},{:.6},{},{}",
                if run.unbounded {
                    "none"
                } else {
                    run.eviction.name()
                },
                run.unbounded,
                run.block_size,
                run.capacity_blocks,
                run.capacity_tokens(),
                hits.requests,
                hits.input_blocks,
                hits.hit_blocks,
                hits.block_hit_rate(),
                hits.input_tokens,
                hits.hit_tokens,
                hits.token_hit_rate(),
                run.evictions,
                run.oversized_requests,
            );
        }
        csv
    }

    /// Block hit rate by capacity (rows) and policy (columns), with the
    /// unbounded ceiling as the last row, as a markdown table.
    pub fn to_markdown(&self) -> String {
        let evictions = self.evictions();
        let mut table = String::from("| capacity (blocks) | capacity (tokens) |");
        let mut rule = String::from("|---:|---:|");
        for eviction in &evictions {
            let _ = write!(table, " {eviction} |");
            rule.push_str("---:|");
        }
        let _ = writeln!(table, "\n{rule}");
        for blocks in self.capacities() {
            let tokens = (blocks as u64).saturating_mul(self.unbounded.block_size as u64);
            let _ = write!(table, "| {} | {} |", group(blocks as u64), group(tokens));
            for &eviction in &evictions {
                let cell = self
                    .run(eviction, blocks)
                    .map_or_else(|| "–".to_owned(), |run| percent(run.hits.block_hit_rate()));
                let _ = write!(table, " {cell} |");
            }
            table.push('\n');
        }
        let _ = write!(
            table,
            "| unbounded ({}) | {} |",
            group(self.unbounded.capacity_blocks as u64),
            group(self.unbounded.capacity_tokens())
        );
        let ceiling = percent(self.unbounded.hits.block_hit_rate());
        for _ in &evictions {
            let _ = write!(table, " {ceiling} |");
        }
        table.push('\n');
        table
    }

    /// The plot as an SVG document.
    ///
    /// # Errors
    ///
    /// [`SimError::Plot`] if drawing fails.
    pub fn to_svg(&self) -> Result<String, SimError> {
        crate::plot::hit_rate_svg(self)
    }

    /// Writes `sweep.csv`, `sweep.md` and `sweep.svg` into `dir`, creating it
    /// if needed.
    ///
    /// # Errors
    ///
    /// [`SimError::WriteOutput`] naming the path that failed, or
    /// [`SimError::Plot`].
    pub fn write_to(&self, dir: &Path) -> Result<SweepFiles, SimError> {
        let svg = self.to_svg()?;
        FigureFiles::write(dir, "sweep", &self.to_csv(), &self.to_markdown(), &svg)
    }
}
