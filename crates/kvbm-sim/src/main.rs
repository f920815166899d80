//! `kvbm-sim`: replay a request trace through kvbm and report what the cache did.
//!
//! ```text
//! kvbm-sim                                   # summary of the embedded excerpt
//! kvbm-sim cache --trace FILE [--block-size N]
//!          [--capacity-blocks N | --capacity-tokens N | --unbounded]
//!          [--eviction lru|multi-level|lineage] [--json]
//! kvbm-sim sweep --trace FILE --capacities 1k,2k,6k --evictions lru,lineage --out DIR
//! kvbm-sim serve --trace FILE [--block-size N] [--capacity-blocks N | --capacity-tokens N]
//!          [--eviction ...] [--max-running N] [--token-budget N] [--chunk-size N]
//!          [--watermark-blocks N] [--reserve N|full] [--step-ms F]
//!          [--prefill-token-ms F] [--decode-request-ms F] [--limit N]
//!          [--audit-every N] [--json]
//! ```
//!
//! Reports go to stdout (that is this program's job; it writes through a
//! locked handle rather than `println!`, so a closed pipe ends it quietly
//! instead of panicking). Progress bars and errors go to stderr.
#![forbid(unsafe_code)]

mod exporter;

use std::io::{self, Write};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvbm_queue::{Aging, GenerationReserve, Preemption, SchedulerConfig};
use kvbm_sim::{
    CacheConfig, Capacity, Eviction, PriorityMix, Progress, ServeConfig, SimError, StepTime,
    SweepConfig, Trace, Workload,
};

/// Replays Mooncake-format request traces through kvbm's block manager.
///
/// With no command, replays the embedded excerpt of the Mooncake FAST'25
/// conversation trace (500 requests) through an unbounded prefix cache and
/// prints a summary.
#[derive(Debug, Parser)]
#[command(name = "kvbm-sim", version)]
struct Cli {
    /// Never draw progress bars (they are also hidden when stderr is not a terminal).
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay requests one after another through a prefix cache and report hits.
    Cache(CacheArgs),
    /// Run cache mode over capacities and policies; write a table and an SVG plot.
    Sweep(SweepArgs),
    /// Replay arrivals through the continuous-batching scheduler in simulated
    /// time; report latencies, throughput, preemptions and hits.
    Serve(Box<ServeArgs>),
}

#[derive(Debug, Args)]
struct TraceArgs {
    /// Mooncake-format JSONL trace [default: the embedded conversation excerpt].
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Tokens per simulated block; must divide the trace's 512.
    #[arg(long, value_name = "N", default_value_t = 512)]
    block_size: usize,
}

#[derive(Debug, Args)]
#[group(multiple = false)]
struct CapacityArgs {
    /// Cache size in blocks (6000, 6k, 1.5M).
    #[arg(long, value_name = "N", value_parser = Capacity::parse_count)]
    capacity_blocks: Option<u64>,
    /// Cache size in tokens, rounded down to whole blocks (3M).
    #[arg(long, value_name = "N", value_parser = Capacity::parse_count)]
    capacity_tokens: Option<u64>,
    /// Room for every distinct block: nothing is evicted [default].
    #[arg(long)]
    unbounded: bool,
}

impl CapacityArgs {
    fn capacity(&self) -> Capacity {
        match (self.capacity_blocks, self.capacity_tokens) {
            (Some(blocks), _) => Capacity::Blocks(blocks),
            (None, Some(tokens)) => Capacity::Tokens(tokens),
            (None, None) => Capacity::Unbounded,
        }
    }
}

#[derive(Debug, Args)]
struct CacheArgs {
    #[command(flatten)]
    trace: TraceArgs,
    #[command(flatten)]
    capacity: CapacityArgs,
    /// Which cached block to evict first.
    #[arg(long, value_name = "POLICY", default_value = "lru", value_parser = eviction_parser())]
    eviction: Eviction,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct SweepArgs {
    #[command(flatten)]
    trace: TraceArgs,
    /// Cache sizes in blocks, comma-separated (k and M suffixes allowed).
    #[arg(
        long,
        value_name = "N,...",
        value_delimiter = ',',
        value_parser = Capacity::parse_count,
        default_value = "1k,2k,4k,6k,10k,20k,50k"
    )]
    capacities: Vec<u64>,
    /// Eviction policies, comma-separated.
    #[arg(
        long,
        value_name = "POLICY,...",
        value_delimiter = ',',
        value_parser = eviction_parser(),
        default_value = "lru,multi-level,lineage"
    )]
    evictions: Vec<Eviction>,
    /// Directory for sweep.csv, sweep.md and sweep.svg (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Print the results as one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
#[group(multiple = false)]
struct ServeCapacityArgs {
    /// KV pool size in blocks (6000, 6k, 1.5M).
    #[arg(long, value_name = "N", value_parser = Capacity::parse_count)]
    capacity_blocks: Option<u64>,
    /// KV pool size in tokens, rounded down to whole blocks [default: 3M].
    #[arg(long, value_name = "N", value_parser = Capacity::parse_count)]
    capacity_tokens: Option<u64>,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Mooncake-format JSONL trace [default: the embedded conversation excerpt].
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Replay only the first N requests of the trace (in file order).
    #[arg(long, value_name = "N")]
    limit: Option<NonZeroUsize>,
    /// Tokens per KV block; must divide the trace's 512.
    #[arg(long, value_name = "N", default_value_t = ServeConfig::default().block_size)]
    block_size: usize,
    #[command(flatten)]
    capacity: ServeCapacityArgs,
    /// Which cached block to evict first.
    #[arg(long, value_name = "POLICY", default_value = "lru", value_parser = eviction_parser())]
    eviction: Eviction,
    /// Most requests running at once.
    #[arg(long, value_name = "N", default_value_t = SchedulerConfig::default().max_running)]
    max_running: usize,
    /// Most tokens one step computes (prefill chunks plus one per decode).
    #[arg(long, value_name = "N", default_value_t = SchedulerConfig::default().token_budget)]
    token_budget: usize,
    /// Most prompt tokens one request prefills per step.
    #[arg(long, value_name = "N", default_value_t = SchedulerConfig::default().chunk_size)]
    chunk_size: usize,
    /// Blocks admission keeps free for running requests to grow into [default: 1% of the pool].
    #[arg(long, value_name = "N")]
    watermark_blocks: Option<usize>,
    /// Generated tokens admission reserves per request: a cap, or `full`.
    #[arg(long, value_name = "N|full", default_value = "256", value_parser = parse_reserve)]
    reserve: GenerationReserve,
    /// Charge admission for a request's whole prompt, without credit for
    /// the prefix it finds cached.
    #[arg(long)]
    no_prefix_credit: bool,
    /// Draft tokens each decode verifies (speculative decoding; 0: off).
    #[arg(long, value_name = "K", default_value_t = 0)]
    spec_tokens: usize,
    /// Probability the engine accepts each draft token (until the first
    /// rejection).
    #[arg(long, value_name = "P", default_value_t = ServeConfig::default().spec_accept)]
    spec_accept: f64,
    /// Seed of the random draws (priorities, draft acceptance).
    #[arg(long, value_name = "S", default_value_t = 0)]
    seed: u64,
    /// Priorities of requests whose trace line has none, as vLLM priority
    /// values (lower is more urgent) and their shares, e.g. `0:0.1,1:0.9`
    /// [default: all normal].
    #[arg(long, value_name = "P:SHARE,...")]
    priorities: Option<String>,
    /// Let a waiting request preempt running requests less urgent than it.
    #[arg(long)]
    priority_preemption: bool,
    /// Priority steps a request's urgency rises per second of waiting
    /// (0: strict priority).
    #[arg(long, value_name = "F", default_value_t = 0.0)]
    aging_per_s: f64,
    /// Priority steps a request's urgency rises each time it is preempted
    /// (at most 3 in all).
    #[arg(long, value_name = "N", default_value_t = 0)]
    preemption_boost: u32,
    /// Simulated fixed cost of a step, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 5.0)]
    step_ms: f64,
    /// Simulated cost per prefilled token, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 0.05)]
    prefill_token_ms: f64,
    /// Simulated cost per decoding request in a step, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 0.1)]
    decode_request_ms: f64,
    /// Check the scheduler's conservation laws every N steps (0: only at the end).
    #[arg(long, value_name = "N", default_value_t = 0)]
    audit_every: u64,
    /// Serve the metrics in Prometheus text format at http://ADDR/metrics
    /// while replaying (e.g. 127.0.0.1:9090).
    #[arg(long, value_name = "ADDR")]
    prometheus: Option<std::net::SocketAddr>,
    /// With --prometheus, keep serving this many seconds after the replay.
    #[arg(long, value_name = "S", default_value_t = 0, requires = "prometheus")]
    prometheus_hold_s: u64,
    /// Write the final Prometheus exposition to FILE.
    #[arg(long, value_name = "FILE")]
    metrics_out: Option<PathBuf>,
    /// Publish the engine's KV events on vLLM's ZeroMQ wire (msgpack
    /// KVEventBatch, hashes as 64-bit ints) at ENDPOINT. As in vLLM, an
    /// endpoint with `*` is bound (tcp://*:5557, for routers to connect),
    /// any other is connected to.
    #[arg(long, value_name = "ENDPOINT")]
    kv_events: Option<String>,
    /// With --kv-events, also answer replay requests at ENDPOINT (a ROUTER
    /// socket keeping the last 10,000 batches).
    #[arg(long, value_name = "ENDPOINT", requires = "kv_events")]
    kv_events_replay: Option<String>,
    /// With --kv-events, the topic frame of every message.
    #[arg(long, value_name = "T", default_value = "", requires = "kv_events")]
    kv_events_topic: String,
    /// With --kv-events, wait up to MS for a first subscriber before
    /// replaying.
    #[arg(long, value_name = "MS", default_value_t = 0, requires = "kv_events")]
    kv_events_wait_ms: u64,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
}

impl ServeArgs {
    fn config(&self) -> Result<ServeConfig, SimError> {
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
            .with_seed(self.seed);
        match &self.priorities {
            Some(mix) => Ok(config.with_priorities(PriorityMix::parse(mix)?)),
            None => Ok(config),
        }
    }
}

/// Time-based aging at `per_second` priority steps per second of waiting;
/// strict priority at 0.
fn aging(per_second: f64) -> Result<Aging, SimError> {
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

/// `full`, or a cap in tokens.
fn parse_reserve(text: &str) -> Result<GenerationReserve, String> {
    if text.trim().eq_ignore_ascii_case("full") {
        return Ok(GenerationReserve::Full);
    }
    text.trim()
        .parse::<u32>()
        .map(GenerationReserve::Capped)
        .map_err(|_| format!("`{text}` is neither `full` nor a token count"))
}

/// Lists the policy names in `--help` and parses them with the library.
fn eviction_parser() -> impl TypedValueParser<Value = Eviction> {
    PossibleValuesParser::new(Eviction::ALL.map(Eviction::name))
        .try_map(|name| name.parse::<Eviction>())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut progress = Bar::new(!cli.quiet);
    let mut out = io::stdout().lock();
    let result = match cli.command {
        None => run_default(&mut out, &mut progress),
        Some(Command::Cache(args)) => run_cache(&args, &mut out, &mut progress),
        Some(Command::Sweep(args)) => run_sweep(&args, &mut out, &mut progress),
        Some(Command::Serve(args)) => run_serve(&args, &mut out, &mut progress),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that stopped reading (`| head`) is not a failure.
        Err(Failure::Output(err)) if err.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("error: {failure}");
            ExitCode::FAILURE
        }
    }
}

/// Why a run stopped: the simulation refused, or stdout did.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Sim(#[from] SimError),
    #[error("cannot write the report: {0}")]
    Output(#[from] io::Error),
}

/// A trace, where it came from, and how long loading took.
struct Loaded {
    trace: Trace,
    source: String,
    load_time: Duration,
}

fn load(args: &TraceArgs, progress: &mut Bar) -> Result<Loaded, SimError> {
    load_path(args.trace.as_ref(), progress)
}

fn load_path(path: Option<&PathBuf>, progress: &mut Bar) -> Result<Loaded, SimError> {
    let started = Instant::now();
    let (trace, source) = match path {
        Some(path) => (
            Trace::from_path_with_progress(path, progress)?,
            path.display().to_string(),
        ),
        None => (
            Trace::conversation_excerpt()?,
            "embedded excerpt of the Mooncake conversation trace".to_owned(),
        ),
    };
    Ok(Loaded {
        trace,
        source,
        load_time: started.elapsed(),
    })
}

fn run_default(out: &mut impl Write, progress: &mut Bar) -> Result<(), Failure> {
    let args = CacheArgs {
        trace: TraceArgs {
            trace: None,
            block_size: 512,
        },
        capacity: CapacityArgs {
            capacity_blocks: None,
            capacity_tokens: None,
            unbounded: true,
        },
        eviction: Eviction::Lru,
        json: false,
    };
    run_cache(&args, out, progress)?;
    writeln!(
        out,
        "\nnext: kvbm-sim cache --trace FILE --capacity-tokens 3M --eviction lineage\n      \
         kvbm-sim sweep --trace FILE --out DIR\n      \
         kvbm-sim serve --trace FILE --capacity-tokens 3M   (kvbm-sim --help for more)"
    )?;
    Ok(())
}

fn run_cache(args: &CacheArgs, out: &mut impl Write, progress: &mut Bar) -> Result<(), Failure> {
    let loaded = load(&args.trace, progress)?;
    let started = Instant::now();
    let workload = Workload::new(&loaded.trace, args.trace.block_size)?;
    let split_time = started.elapsed();
    let config = CacheConfig::new(args.capacity.capacity(), args.eviction);
    let report = kvbm_sim::mode::cache::replay(&workload, &config, progress)?;
    if args.json {
        let mut json = report.to_json();
        if let Some(object) = json.as_object_mut() {
            object.insert("trace".to_owned(), loaded.source.into());
            object.insert("load_ms".to_owned(), millis(loaded.load_time).into());
            object.insert("split_ms".to_owned(), millis(split_time).into());
        }
        writeln!(out, "{json}")?;
        return Ok(());
    }
    write_trace_summary(out, &loaded, Some(split_time))?;
    write!(out, "{report}")?;
    Ok(())
}

fn run_sweep(args: &SweepArgs, out: &mut impl Write, progress: &mut Bar) -> Result<(), Failure> {
    let loaded = load(&args.trace, progress)?;
    let started = Instant::now();
    let workload = Workload::new(&loaded.trace, args.trace.block_size)?;
    let split_time = started.elapsed();
    let config = SweepConfig {
        capacities: args
            .capacities
            .iter()
            .copied()
            .map(Capacity::Blocks)
            .collect(),
        evictions: args.evictions.clone(),
    };
    let sweep = kvbm_sim::sweep(&workload, &config, progress)?;
    let files = sweep.write_to(&args.out)?;
    if args.json {
        let runs: Vec<_> = sweep.runs.iter().map(|run| run.to_json()).collect();
        let json = serde_json::json!({
            "mode": "sweep",
            "trace": loaded.source,
            "unbounded": sweep.unbounded.to_json(),
            "runs": runs,
            "files": [files.csv, files.markdown, files.svg],
        });
        writeln!(out, "{json}")?;
        return Ok(());
    }
    write_trace_summary(out, &loaded, Some(split_time))?;
    writeln!(
        out,
        "block hit rate by cache capacity and eviction policy (block size {}):\n",
        workload.block_size()
    )?;
    write!(out, "{}", sweep.to_markdown())?;
    let replay: Duration = sweep
        .runs
        .iter()
        .map(|run| run.replay_time)
        .chain([sweep.unbounded.replay_time])
        .sum();
    writeln!(
        out,
        "\n{} replays in {:.1} ms; wrote {}, {} and {}",
        sweep.runs.len() + 1,
        millis(replay),
        files.csv.display(),
        files.markdown.display(),
        files.svg.display()
    )?;
    Ok(())
}

fn run_serve(args: &ServeArgs, out: &mut impl Write, progress: &mut Bar) -> Result<(), Failure> {
    let config = args.config()?;
    let exporter = match (args.prometheus, &args.metrics_out) {
        (None, None) => None,
        (listen, _) => Some(exporter::Exporter::install(listen)?),
    };
    let mut loaded = load_path(args.trace.as_ref(), progress)?;
    if let Some(limit) = args.limit {
        loaded.trace.truncate(limit);
    }
    let mut sink = event_sink(args, config.block_size)?;
    let events = sink
        .as_mut()
        .map(|sink| sink as &mut dyn kvbm_sim::EventSink);
    let report =
        kvbm_sim::mode::serve::replay_with_events(&loaded.trace, &config, progress, events)?;
    if let Some(sink) = sink {
        close_sink(sink);
    }
    if let Some(exporter) = &exporter {
        if let Some(path) = &args.metrics_out {
            exporter.write(path)?;
        }
        exporter.hold(Duration::from_secs(args.prometheus_hold_s));
    }
    if args.json {
        let mut json = report.to_json();
        if let Some(object) = json.as_object_mut() {
            object.insert("trace".to_owned(), loaded.source.into());
            object.insert("load_ms".to_owned(), millis(loaded.load_time).into());
        }
        writeln!(out, "{json}")?;
        return Ok(());
    }
    write_trace_summary(out, &loaded, None)?;
    write!(out, "{report}")?;
    Ok(())
}

/// The `--kv-events` publisher, if asked for.
#[cfg(feature = "kv-events")]
fn event_sink(
    args: &ServeArgs,
    block_size: usize,
) -> Result<Option<kvbm_sim::ZmqEventSink>, Failure> {
    use kvbm_events::{HashForm, PublisherConfig, WireFormat};
    let Some(endpoint) = &args.kv_events else {
        return Ok(None);
    };
    let mut config =
        PublisherConfig::new(endpoint.clone()).with_topic(args.kv_events_topic.clone());
    if let Some(replay) = &args.kv_events_replay {
        config = config.with_replay(replay.clone());
    }
    let block_size = u32::try_from(block_size).unwrap_or(u32::MAX);
    let format = WireFormat::new(block_size).with_hash_form(HashForm::Int64);
    let wait = Duration::from_millis(args.kv_events_wait_ms);
    Ok(Some(kvbm_sim::ZmqEventSink::new(&config, format, wait)?))
}

/// Gives the last batches a moment to reach the subscribers.
#[cfg(feature = "kv-events")]
fn close_sink(sink: kvbm_sim::ZmqEventSink) {
    sink.close(Duration::from_secs(1));
}

#[cfg(not(feature = "kv-events"))]
fn close_sink(_: NoSink) {}

/// Without the `kv-events` feature, `--kv-events` is refused.
#[cfg(not(feature = "kv-events"))]
fn event_sink(args: &ServeArgs, _block_size: usize) -> Result<Option<NoSink>, Failure> {
    match args.kv_events {
        Some(_) => Err(SimError::Events {
            reason: "--kv-events needs kvbm-sim built with the kv-events feature".to_owned(),
        }
        .into()),
        None => Ok(None),
    }
}

#[cfg(not(feature = "kv-events"))]
struct NoSink;

#[cfg(not(feature = "kv-events"))]
impl kvbm_sim::EventSink for NoSink {
    fn publish(&mut self, _: &kvbm_blocks::EventMessage) -> Result<(), kvbm_sim::SimError> {
        Ok(())
    }
}

fn write_trace_summary(
    out: &mut impl Write,
    loaded: &Loaded,
    split_time: Option<Duration>,
) -> io::Result<()> {
    let summary = loaded.trace.summary();
    writeln!(out, "trace: {}", loaded.source)?;
    writeln!(
        out,
        "  {} requests over {:.1} s, mean input {:.0} tokens, mean output {:.0} tokens",
        summary.requests,
        summary.duration_ms as f64 / 1e3,
        summary.mean_input_tokens(),
        summary.mean_output_tokens()
    )?;
    match split_time {
        Some(split_time) => writeln!(
            out,
            "  parsed in {:.1} ms, split into blocks in {:.1} ms\n",
            millis(loaded.load_time),
            millis(split_time)
        ),
        None => writeln!(out, "  parsed in {:.1} ms\n", millis(loaded.load_time)),
    }
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// A terminal progress bar that appears only once a phase has run for
/// [`Bar::DELAY`]: quick replays print nothing, slow ones show how far they are.
struct Bar {
    enabled: bool,
    bar: Option<ProgressBar>,
    label: String,
    total: u64,
    position: u64,
    started: Instant,
}

impl Bar {
    const DELAY: Duration = Duration::from_millis(300);

    fn new(enabled: bool) -> Self {
        Self {
            enabled,
            bar: None,
            label: String::new(),
            total: 0,
            position: 0,
            started: Instant::now(),
        }
    }

    fn show(&self) -> ProgressBar {
        let style = ProgressStyle::with_template(
            "{msg:>10} [{bar:40}] {percent:>3}% {elapsed_precise} (eta {eta})",
        )
        .map(|style| style.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        // Set up hidden, then shown, so the first frame is already right.
        let bar = ProgressBar::with_draw_target(Some(self.total), ProgressDrawTarget::hidden())
            .with_style(style)
            .with_message(self.label.clone())
            .with_position(self.position)
            .with_elapsed(self.started.elapsed());
        // stderr() hides itself when stderr is not a terminal.
        bar.set_draw_target(ProgressDrawTarget::stderr());
        bar
    }
}

impl Progress for Bar {
    fn start(&mut self, label: &str, total: u64) {
        self.finish();
        label.clone_into(&mut self.label);
        self.total = total;
        self.position = 0;
        self.started = Instant::now();
    }

    fn advance(&mut self, amount: u64) {
        self.position = self.position.saturating_add(amount);
        if self.bar.is_none() && self.enabled && self.started.elapsed() >= Self::DELAY {
            self.bar = Some(self.show());
        }
        if let Some(bar) = &self.bar {
            bar.set_position(self.position);
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_defaults_on_the_command_line_are_the_library_defaults() {
        let cli = Cli::try_parse_from(["kvbm-sim", "serve"]).unwrap();
        let Some(Command::Serve(args)) = cli.command else {
            panic!("not serve");
        };
        assert_eq!(args.config().unwrap(), ServeConfig::default());
        assert_eq!(parse_reserve("FULL"), Ok(GenerationReserve::Full));
        assert!(parse_reserve("-1").is_err());
    }
}
