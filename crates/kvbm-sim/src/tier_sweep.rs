//! [`TierSweep`]: serve mode once without a host tier and once per host-tier
//! size, as a table (CSV, markdown) and a plot (SVG) of mean time to first
//! token and token hit rate against the host tier's size.
//!
//! Every run replays the same trace through the same engine
//! ([`TierSweepConfig::engine`]: pool, scheduler, step-time model, offload
//! policy, links, any disk tier); only the host tier changes. Sizes are
//! given as multiples of the GPU pool ([`HostTierSize::Multiple`]) or in
//! tokens ([`HostTierSize::Tokens`]), and every point reports both. The
//! runs are independent, so they replay side by side on a small thread
//! pool; the results do not depend on how many threads there are.

mod plot;
#[cfg(test)]
mod tests;

use std::fmt::{self, Write as _};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::json;
use tracing::instrument;

use crate::format::{group, percent};
use crate::mode::serve::{self, ServeConfig, ServeReport};
use crate::output::FigureFiles;
use crate::progress::Nested;
use crate::{Progress, SimError, Trace};

/// One host-tier size of a [`TierSweep`].
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum HostTierSize {
    /// This many times the GPU pool (`4.0`: four times its tokens), rounded
    /// down to whole blocks.
    Multiple(f64),
    /// This many tokens, rounded down to whole blocks.
    Tokens(u64),
}

impl fmt::Display for HostTierSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Multiple(multiple) => write!(f, "{multiple}× the GPU pool"),
            Self::Tokens(tokens) => write!(f, "{} tokens", group(*tokens)),
        }
    }
}

/// What a tier sweep runs: `engine` with no host tier, then with a host
/// tier of each of `sizes`.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TierSweepConfig {
    /// The engine of every run. Its host tier must be unset (the sweep sets
    /// it); everything else, a disk tier included, is kept.
    pub engine: ServeConfig,
    /// Host-tier sizes (order and duplicates do not matter); at most
    /// [`MAX_POINTS`](Self::MAX_POINTS).
    pub sizes: Vec<HostTierSize>,
    /// Runs replayed at once (`None`: one per core, at most one per run).
    pub threads: Option<usize>,
}

impl TierSweepConfig {
    /// The host-tier sizes swept when none are given: 1, 2, 4, 8 and 16
    /// times the GPU pool.
    pub const DEFAULT_MULTIPLES: [f64; 5] = [1.0, 2.0, 4.0, 8.0, 16.0];

    /// The most host-tier sizes one sweep runs.
    pub const MAX_POINTS: usize = 64;

    /// The largest host tier, as a multiple of the GPU pool. A host tier
    /// costs about 50 bytes per block in the simulator, and several runs
    /// are under way at once: 256 times a 3M-token pool is 48M blocks,
    /// some 2.4 GB per run (and 100 TB of real host memory for an 8B
    /// model).
    pub const MAX_MULTIPLE: f64 = 256.0;

    /// The most threads a sweep starts, whatever it is asked for.
    pub const MAX_THREADS: usize = 64;

    /// `engine` at the [default multiples](Self::DEFAULT_MULTIPLES), one
    /// thread per core.
    pub fn new(engine: ServeConfig) -> Self {
        Self {
            engine,
            sizes: Self::DEFAULT_MULTIPLES
                .into_iter()
                .map(HostTierSize::Multiple)
                .collect(),
            threads: None,
        }
    }

    /// Sets [`sizes`](Self::sizes).
    pub fn with_sizes(mut self, sizes: Vec<HostTierSize>) -> Self {
        self.sizes = sizes;
        self
    }

    /// Sets [`threads`](Self::threads).
    pub fn with_threads(mut self, threads: Option<usize>) -> Self {
        self.threads = threads;
        self
    }

    /// The GPU pool in tokens: its size in whole blocks times the block
    /// size. With a model's KV layout ([`ServeConfig::kv`]), tokens of the
    /// model's KV: its blocks over its groups (each group keeps a block per
    /// `block_size` tokens), times the block size, which is how a host tier
    /// of that many tokens holds as many bytes as the GPU
    /// ([`ServeConfig::tiers`] with a model).
    ///
    /// # Errors
    ///
    /// As [`ServeConfig::validate`], and the capacity errors of serve mode.
    pub fn gpu_tokens(&self) -> Result<u64, SimError> {
        self.engine.validate()?;
        let blocks = self.engine.capacity_blocks()?;
        let per_group = blocks / self.engine.kv_group_count()?.max(1);
        Ok((per_group as u64).saturating_mul(self.engine.block_size as u64))
    }

    /// The host tiers the sweep runs, in tokens (whole blocks), ascending
    /// and without duplicates; the run without a host tier is not among
    /// them.
    ///
    /// # Errors
    ///
    /// [`SimError::InvalidTiers`] for no size, more than
    /// [`MAX_POINTS`](Self::MAX_POINTS), an engine that already has a host
    /// tier, or a size that is not above 0 and at most
    /// [`MAX_MULTIPLE`](Self::MAX_MULTIPLE) times the GPU pool (or under
    /// one block); the errors of [`gpu_tokens`](Self::gpu_tokens) and of
    /// [`ServeConfig::validate`] for each run.
    pub fn host_tokens(&self) -> Result<Vec<u64>, SimError> {
        let invalid = |reason: String| Err(SimError::InvalidTiers(reason));
        if self.sizes.is_empty() {
            return invalid("a tier sweep needs at least one host-tier size".to_owned());
        }
        if self.sizes.len() > Self::MAX_POINTS {
            return invalid(format!(
                "{} host-tier sizes to sweep (at most {})",
                self.sizes.len(),
                Self::MAX_POINTS
            ));
        }
        if let Some(tokens) = self.engine.tiers.host_tokens {
            return invalid(format!(
                "the engine already has a host tier of {} tokens; a tier sweep sets it \
                 (give the sizes with --host-multiples or --host-tokens)",
                group(tokens)
            ));
        }
        let gpu_tokens = self.gpu_tokens()?;
        let block_size = self.engine.block_size as u64;
        let gpu_blocks = gpu_tokens / block_size.max(1);
        let mut host = Vec::with_capacity(self.sizes.len());
        for &size in &self.sizes {
            let blocks = match size {
                HostTierSize::Multiple(multiple) => {
                    if !(multiple.is_finite() && multiple > 0.0 && multiple <= Self::MAX_MULTIPLE) {
                        return invalid(format!(
                            "a host tier of {multiple} times the GPU pool (must be above 0 \
                             and at most {})",
                            Self::MAX_MULTIPLE
                        ));
                    }
                    // At most 256 × a u32 block count: exact in f64.
                    (multiple * gpu_blocks as f64).floor() as u64
                }
                HostTierSize::Tokens(tokens) => {
                    let most = (Self::MAX_MULTIPLE as u64).saturating_mul(gpu_tokens);
                    if tokens == 0 || tokens > most {
                        return invalid(format!(
                            "a host tier of {} tokens (must be above 0 and at most {} times \
                             the GPU pool, {} tokens)",
                            group(tokens),
                            Self::MAX_MULTIPLE,
                            group(most)
                        ));
                    }
                    tokens / block_size.max(1)
                }
            };
            if blocks == 0 {
                return invalid(format!(
                    "a host tier of {size} is under one block of {block_size} tokens"
                ));
            }
            host.push(blocks.saturating_mul(block_size));
        }
        host.sort_unstable();
        host.dedup();
        for &tokens in &host {
            self.run_config(Some(tokens)).validate()?;
        }
        Ok(host)
    }

    /// The engine of one run: with a host tier of `host_tokens`, or none.
    fn run_config(&self, host_tokens: Option<u64>) -> ServeConfig {
        let mut tiers = self.engine.tiers;
        tiers.host_tokens = host_tokens;
        self.engine.with_tiers(tiers)
    }

    /// Threads for `runs` runs.
    fn thread_count(&self, runs: usize) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .min(runs)
            .clamp(1, Self::MAX_THREADS)
    }
}

/// One run of a [`TierSweep`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TierPoint {
    /// The host tier in tokens (whole blocks); 0 without one.
    pub host_tokens: u64,
    /// The host tier as a multiple of the GPU pool; 0 without one.
    pub multiple: f64,
    /// What the run did.
    pub report: ServeReport,
}

impl TierPoint {
    /// Mean time to first token.
    pub fn mean_ttft(&self) -> Duration {
        self.report.ttft.mean
    }

    /// Prompt tokens served from any cache (the GPU's or a lower tier's)
    /// at first admission, over all prompt tokens.
    pub fn token_hit_rate(&self) -> f64 {
        self.report.hits.token_hit_rate()
    }

    /// The host tier's size in blocks (0 without one): `host_tokens` over
    /// the block size, times a model's groups.
    pub fn host_blocks(&self) -> usize {
        (self.report.tiers.iter())
            .flat_map(|t| &t.tiers)
            .find(|t| t.medium == crate::tiers::HOST)
            .map_or(0, |t| t.capacity_blocks)
    }

    /// Prompt tokens loaded from the tiers below the GPU.
    pub fn tier_hit_tokens(&self) -> u64 {
        self.report.tiers.as_ref().map_or(0, |t| t.hit_tokens())
    }

    /// Requests that waited for loads from a lower tier.
    pub fn onboarded_requests(&self) -> u64 {
        self.report
            .tiers
            .as_ref()
            .map_or(0, |t| t.onboarding.requests)
    }

    /// Their mean wait for those loads.
    pub fn mean_stall(&self) -> Duration {
        (self.report.tiers.as_ref()).map_or(Duration::ZERO, |t| t.onboarding.mean_stall)
    }

    /// `1×`, `0.5×`, or `none` without a host tier.
    pub fn label(&self) -> String {
        if self.host_tokens == 0 {
            "none".to_owned()
        } else {
            format!("{}×", short_multiple(self.multiple))
        }
    }
}

/// The results of a tier sweep.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TierSweep {
    /// The GPU pool in tokens.
    pub gpu_tokens: u64,
    /// Tokens per block.
    pub block_size: usize,
    /// Threads the runs were spread over.
    pub threads: usize,
    /// Wall time of the whole sweep.
    pub wall_time: Duration,
    /// The run without a host tier first, then one per host-tier size,
    /// ascending.
    pub points: Vec<TierPoint>,
}

/// The files [`TierSweep::write_to`] wrote.
pub type TierSweepFiles = FigureFiles;

/// A message from a run to the thread that reports progress.
enum Message {
    Advance(u64),
    Done(usize, Box<Result<ServeReport, SimError>>),
}

/// Forwards a run's progress over a channel.
struct Forward(mpsc::Sender<Message>);

impl Progress for Forward {
    fn start(&mut self, _label: &str, _total: u64) {}
    fn advance(&mut self, amount: u64) {
        // The receiver outlives every run; a failed send loses a report.
        let _ = self.0.send(Message::Advance(amount));
    }
    fn finish(&mut self) {}
}

/// Replays `trace` in serve mode with `config.engine`, once without a host
/// tier and once per host-tier size, the runs spread over
/// `config.threads` threads; `progress` counts requests over all runs.
///
/// Every size is checked before any replay starts.
///
/// # Errors
///
/// As [`TierSweepConfig::host_tokens`]; [`SimError::Threads`] if the thread
/// pool cannot start; the errors of [`serve::replay`] (the first failing
/// run's, by host-tier size).
#[instrument(level = "debug", skip_all, fields(sizes = config.sizes.len()))]
pub fn tier_sweep(
    trace: &Trace,
    config: &TierSweepConfig,
    progress: &mut dyn Progress,
) -> Result<TierSweep, SimError> {
    let started = Instant::now();
    let hosts = config.host_tokens()?;
    let gpu_tokens = config.gpu_tokens()?;
    // The baseline (no host tier) first.
    let runs: Vec<Option<u64>> = [None]
        .into_iter()
        .chain(hosts.into_iter().map(Some))
        .collect();
    let threads = config.thread_count(runs.len());
    progress.start("tier sweep", (runs.len() * trace.len()) as u64);
    let reports = if threads <= 1 {
        let mut nested = Nested(progress);
        (runs.iter())
            .map(|&host| serve::replay(trace, &config.run_config(host), &mut nested))
            .collect::<Vec<_>>()
    } else {
        run_parallel(trace, config, &runs, threads, progress)?
    };
    progress.finish();
    let mut points = Vec::with_capacity(runs.len());
    for (host, report) in runs.into_iter().zip(reports) {
        let host_tokens = host.unwrap_or(0);
        points.push(TierPoint {
            host_tokens,
            multiple: host_tokens as f64 / gpu_tokens.max(1) as f64,
            report: report?,
        });
    }
    Ok(TierSweep {
        gpu_tokens,
        block_size: config.engine.block_size,
        threads,
        wall_time: started.elapsed(),
        points,
    })
}

/// The runs of `runs` on a pool of `threads`, the largest host tiers (the
/// slowest runs) first; results in the order of `runs`.
fn run_parallel(
    trace: &Trace,
    config: &TierSweepConfig,
    runs: &[Option<u64>],
    threads: usize,
    progress: &mut dyn Progress,
) -> Result<Vec<Result<ServeReport, SimError>>, SimError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|index| format!("tier-sweep-{index}"))
        .build()
        .map_err(|error| SimError::Threads {
            reason: error.to_string(),
        })?;
    let mut results: Vec<Option<Result<ServeReport, SimError>>> =
        std::iter::repeat_with(|| None).take(runs.len()).collect();
    let (sender, receiver) = mpsc::channel();
    pool.in_place_scope_fifo(|scope| {
        for (index, &host) in runs.iter().enumerate().rev() {
            let sender = sender.clone();
            let engine = config.run_config(host);
            scope.spawn_fifo(move |_| {
                let mut forward = Forward(sender.clone());
                let report = serve::replay(trace, &engine, &mut forward);
                let _ = sender.send(Message::Done(index, Box::new(report)));
            });
        }
        // Every run holds a sender; the loop ends when the last one is done.
        drop(sender);
        for message in receiver {
            match message {
                Message::Advance(amount) => progress.advance(amount),
                Message::Done(index, report) => {
                    if let Some(slot) = results.get_mut(index) {
                        *slot = Some(*report);
                    }
                }
            }
        }
    });
    Ok(results
        .into_iter()
        .map(|result| {
            // A run that panicked re-raised its panic out of the scope.
            result.unwrap_or(Err(SimError::Threads {
                reason: "a run ended without a report".to_owned(),
            }))
        })
        .collect())
}

/// `4`, `0.5`, `3.33`: a multiple with at most two decimals.
fn short_multiple(multiple: f64) -> String {
    let text = format!("{multiple:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// A latency in seconds: `1666.1 s`, `1.16 s`, `0.055 s`.
fn seconds(duration: Duration) -> String {
    let s = duration.as_secs_f64();
    if s >= 10.0 {
        format!("{s:.1} s")
    } else if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{s:.3} s")
    }
}

/// `after` against `before`, as a signed percentage: `-36.1%`.
fn change(before: f64, after: f64) -> String {
    if before == 0.0 {
        "–".to_owned()
    } else {
        format!("{:+.1}%", (after / before - 1.0) * 100.0)
    }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

impl TierSweep {
    /// The run without a host tier.
    pub fn baseline(&self) -> Option<&TierPoint> {
        self.points.first()
    }

    /// The run whose host tier is `multiple` times the GPU pool (to two
    /// decimals), if swept.
    pub fn at_multiple(&self, multiple: f64) -> Option<&TierPoint> {
        (self.points.iter()).find(|point| (point.multiple - multiple).abs() < 0.005)
    }

    /// How `point` compares with the run without a host tier: the relative
    /// change of its mean TTFT (`-0.36`: 36% lower) and the change of its
    /// token hit rate in points of `0.0..=1.0` (`0.17`: 17 points higher).
    pub fn gain(&self, point: &TierPoint) -> Option<(f64, f64)> {
        let baseline = self.baseline()?;
        let before = baseline.mean_ttft().as_secs_f64();
        let ttft = if before == 0.0 {
            0.0
        } else {
            point.mean_ttft().as_secs_f64() / before - 1.0
        };
        Some((ttft, point.token_hit_rate() - baseline.token_hit_rate()))
    }

    /// Every run as CSV with a header row.
    pub fn to_csv(&self) -> String {
        let mut csv = String::from(
            "host_tokens,host_blocks,multiple,gpu_tokens,block_size,requests,finished_requests,\
             mean_ttft_ms,p50_ttft_ms,p90_ttft_ms,p99_ttft_ms,mean_tpot_ms,input_tokens,\
             hit_tokens,token_hit_rate,tier_hit_tokens,onboarded_requests,onboarded_blocks,\
             mean_stall_ms,preemptions,replay_ms\n",
        );
        for point in &self.points {
            let report = &point.report;
            let onboarded_blocks = (report.tiers.as_ref()).map_or(0, |t| t.onboarding.blocks);
            // Writing to a String cannot fail.
            let _ = writeln!(
                csv,
                "{},{},{:.6},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{},{},{:.6},{},{},{},{:.3},{},{:.1}",
                point.host_tokens,
                point.host_blocks(),
                point.multiple,
                self.gpu_tokens,
                self.block_size,
                report.hits.requests,
                report.finished_requests(),
                ms(report.ttft.mean),
                ms(report.ttft.p50),
                ms(report.ttft.p90),
                ms(report.ttft.p99),
                ms(report.tpot.mean),
                report.hits.input_tokens,
                report.hits.hit_tokens,
                report.hits.token_hit_rate(),
                point.tier_hit_tokens(),
                point.onboarded_requests(),
                onboarded_blocks,
                ms(point.mean_stall()),
                report.preemptions,
                ms(report.replay_time),
            );
        }
        csv
    }

    /// The results as a markdown table, one row per run: latencies, hit
    /// rates and the change against the run without a host tier. Nothing
    /// in it depends on the machine (replay times are in the CSV).
    pub fn to_markdown(&self) -> String {
        let mut table = String::from(
            "| host tier | tokens | mean TTFT | vs none | p50 TTFT | p99 TTFT | token hit rate \
             | vs none | lower-tier hits (tokens) | onboarded requests | mean stall |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        let baseline = self.baseline();
        for point in &self.points {
            let report = &point.report;
            let (ttft_change, rate_change) = match baseline {
                Some(base) if !std::ptr::eq(base, point) => (
                    change(
                        base.mean_ttft().as_secs_f64(),
                        point.mean_ttft().as_secs_f64(),
                    ),
                    format!(
                        "{:+.2} pts",
                        (point.token_hit_rate() - base.token_hit_rate()) * 100.0
                    ),
                ),
                _ => ("–".to_owned(), "–".to_owned()),
            };
            let _ = writeln!(
                table,
                "| {} | {} | {} | {ttft_change} | {} | {} | {} | {rate_change} | {} | {} | {:.1} ms |",
                point.label(),
                group(point.host_tokens),
                seconds(report.ttft.mean),
                seconds(report.ttft.p50),
                seconds(report.ttft.p99),
                percent(point.token_hit_rate()),
                group(point.tier_hit_tokens()),
                group(point.onboarded_requests()),
                ms(point.mean_stall()),
            );
        }
        table
    }

    /// The sweep as one JSON object: the GPU pool, and per run its host
    /// tier, summary figures and full serve report.
    pub fn to_json(&self) -> serde_json::Value {
        let points: Vec<_> = (self.points.iter())
            .map(|point| {
                let report = &point.report;
                json!({
                    "host_tokens": point.host_tokens,
                    "multiple": point.multiple,
                    "mean_ttft_ms": ms(report.ttft.mean),
                    "p50_ttft_ms": ms(report.ttft.p50),
                    "p99_ttft_ms": ms(report.ttft.p99),
                    "token_hit_rate": point.token_hit_rate(),
                    "tier_hit_tokens": point.tier_hit_tokens(),
                    "onboarded_requests": point.onboarded_requests(),
                    "mean_stall_ms": ms(point.mean_stall()),
                    "replay_ms": ms(report.replay_time),
                    "serve": report.to_json(),
                })
            })
            .collect();
        json!({
            "mode": "tier-sweep",
            "gpu_tokens": self.gpu_tokens,
            "block_size": self.block_size,
            "threads": self.threads,
            "wall_ms": ms(self.wall_time),
            "points": points,
        })
    }

    /// The plot as an SVG document: mean TTFT (left) and token hit rate
    /// (right) against the host tier as a multiple of the GPU pool.
    ///
    /// # Errors
    ///
    /// [`SimError::Plot`] if drawing fails.
    pub fn to_svg(&self) -> Result<String, SimError> {
        plot::tier_sweep_svg(self)
    }

    /// Writes `tier_sweep.csv`, `tier_sweep.md` and `tier_sweep.svg` into
    /// `dir`, creating it if needed.
    ///
    /// # Errors
    ///
    /// [`SimError::WriteOutput`] naming the path that failed, or
    /// [`SimError::Plot`].
    pub fn write_to(&self, dir: &Path) -> Result<TierSweepFiles, SimError> {
        let svg = self.to_svg()?;
        FigureFiles::write(dir, "tier_sweep", &self.to_csv(), &self.to_markdown(), &svg)
    }
}
