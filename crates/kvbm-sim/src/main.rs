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
//!          [--model gpt-oss-120b|gpt-oss-20b|gemma-3-27b|llama-3.1-8b|llama-4-scout
//!           | --groups KIND[:SPAN]:LAYERS,... --kv-bytes-per-token-layer B]
//!          [--capacity-bytes B] [--full-attention-only]
//! kvbm-sim cluster --trace FILE --engines 16 [--replicate N]
//!          --policies random,round-robin,least-loaded,kv-aware [engine flags as serve]
//!          [--memory-limit-gb GB] [--json] [--out DIR]
//! ```
//!
//! Cargo features add flags (without them the flags fail, naming the
//! feature): `kv-events` (`serve --kv-events`, builds libzmq), `redis`
//! (`serve --data-plane redis:URL`), `prometheus` (`--prometheus`,
//! `--metrics-out`); `full` is all three.
//!
//! Reports go to stdout (that is this program's job; it writes through a
//! locked handle rather than `println!`, so a closed pipe ends it quietly
//! instead of panicking). Progress bars and errors go to stderr.
#![forbid(unsafe_code)]

mod bar;
mod cli;
mod exporter;

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use kvbm_sim::{CacheConfig, Capacity, Eviction, SimError, SweepConfig, Trace, Workload};

use crate::bar::Bar;
use crate::cli::{
    CacheArgs, CapacityArgs, Cli, ClusterArgs, Command, LowerTierArgs, MetricsArgs, ServeArgs,
    SweepArgs, TraceArgs,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut progress = Bar::new(!cli.quiet);
    let mut out = io::stdout().lock();
    let result = match cli.command {
        None => run_default(&mut out, &mut progress),
        Some(Command::Cache(args)) => run_cache(&args, &mut out, &mut progress),
        Some(Command::Sweep(args)) => run_sweep(&args, &mut out, &mut progress),
        Some(Command::Serve(args)) => run_serve(&args, &mut out, &mut progress),
        Some(Command::Cluster(args)) => run_cluster(&args, &mut out, &mut progress),
        Some(Command::TierSweep(args)) => run_tier_sweep(&args, &mut out, &mut progress),
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
        tiers: LowerTierArgs {
            host_tier_tokens: None,
            disk_tier_tokens: None,
            offload: kvbm_sim::Offload::WriteThrough,
        },
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
    let config = CacheConfig::new(args.capacity.capacity(), args.eviction)
        .with_tiers(args.tiers.cache_tiers());
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
    let capacities = args.capacities.iter().copied().map(Capacity::Blocks);
    let config = SweepConfig::new(capacities.collect(), args.evictions.clone());
    let sweep = kvbm_sim::sweep(&workload, &config, progress)?;
    let files = sweep.write_to(&args.out)?;
    if args.json {
        let runs: Vec<_> = sweep.runs.iter().map(|run| run.to_json()).collect();
        let json = serde_json::json!({
            "mode": "sweep",
            "trace": loaded.source,
            "unbounded": sweep.unbounded.to_json(),
            "runs": runs,
            "files": files.to_json(),
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
        "\n{} replays in {:.1} ms; wrote {files}",
        sweep.runs.len() + 1,
        millis(replay),
    )?;
    Ok(())
}

fn run_serve(args: &ServeArgs, out: &mut impl Write, progress: &mut Bar) -> Result<(), Failure> {
    check_features(args)?;
    let exporter = install_exporter(&args.metrics)?;
    let config = args.config()?.with_metrics(exporter.is_some());
    let loaded = load_replay(&args.trace, progress)?;
    let mut sink = event_sink(args, &config)?;
    let events = sink
        .as_mut()
        .map(|sink| sink as &mut dyn kvbm_sim::EventSink);
    let report = kvbm_sim::mode::serve::replay_with_data_plane(
        &loaded.trace,
        &config,
        progress,
        events,
        args.data_plane.as_ref(),
    )?;
    if let Some(sink) = sink {
        close_sink(sink);
    }
    finish_exporter(exporter, &args.metrics)?;
    write_replay(out, args.json, &loaded, report.to_json(), &report)
}

fn run_cluster(
    args: &ClusterArgs,
    out: &mut impl Write,
    progress: &mut Bar,
) -> Result<(), Failure> {
    let exporter = install_exporter(&args.metrics)?;
    let mut config = args.config()?;
    config.engine = config.engine.with_metrics(exporter.is_some());
    let loaded = load_replay(&args.trace, progress)?;
    let report = kvbm_sim::mode::cluster::replay(&loaded.trace, &config)?;
    finish_exporter(exporter, &args.metrics)?;
    if let Some(dir) = &args.out {
        report.write_to(dir)?;
    }
    write_replay(out, args.json, &loaded, report.to_json(), &report)
}

fn run_tier_sweep(
    args: &cli::TierSweepArgs,
    out: &mut impl Write,
    progress: &mut Bar,
) -> Result<(), Failure> {
    let config = args.config()?;
    // Refuse bad sizes before loading the trace.
    config.host_tokens()?;
    let loaded = load_replay(&args.trace, progress)?;
    let sweep = kvbm_sim::tier_sweep(&loaded.trace, &config, progress)?;
    let files = sweep.write_to(&args.out)?;
    if args.json {
        let mut json = with_source(sweep.to_json(), &loaded);
        if let Some(object) = json.as_object_mut() {
            object.insert("files".to_owned(), files.to_json());
        }
        writeln!(out, "{json}")?;
        return Ok(());
    }
    write_trace_summary(out, &loaded, None)?;
    let engine = &config.engine;
    // A model's blocks have its own bytes (`--kv-bytes-per-token` is not
    // read with one).
    let kv = match &engine.kv {
        None => format!("{} KV bytes per token", engine.tiers.kv_bytes_per_token),
        Some(kv) if kv.full_attention_only => format!("{}, full attention only", kv.model),
        Some(kv) => kv.model.to_string(),
    };
    writeln!(
        out,
        "serve mode by host-tier size: GPU pool {} tokens, block size {}, offload {}, \
         {kv}, host link {} Gbit/s\n",
        sweep.gpu_tokens, sweep.block_size, engine.tiers.offload, engine.tiers.host_link.gbps,
    )?;
    write!(out, "{}", sweep.to_markdown())?;
    let replays: Vec<String> = (sweep.points.iter())
        .map(|point| {
            format!(
                "{} {:.1} s",
                point.label(),
                point.report.replay_time.as_secs_f64()
            )
        })
        .collect();
    writeln!(
        out,
        "\n{} replays on {} threads in {:.1} s ({}); wrote {files}",
        sweep.points.len(),
        sweep.threads,
        sweep.wall_time.as_secs_f64(),
        replays.join(", "),
    )?;
    Ok(())
}

/// A serve or cluster report: its JSON (with where the trace came from), or
/// the trace summary and the report's table.
fn write_replay(
    out: &mut impl Write,
    json: bool,
    loaded: &Loaded,
    report_json: serde_json::Value,
    report: &impl std::fmt::Display,
) -> Result<(), Failure> {
    if json {
        writeln!(out, "{}", with_source(report_json, loaded))?;
        return Ok(());
    }
    write_trace_summary(out, loaded, None)?;
    write!(out, "{report}")?;
    Ok(())
}

/// The trace of a serve or cluster replay, cut to `--limit`.
fn load_replay(args: &cli::ReplayTraceArgs, progress: &mut Bar) -> Result<Loaded, SimError> {
    let mut loaded = load_path(args.trace.as_ref(), progress)?;
    if let Some(limit) = args.limit {
        loaded.trace.truncate(limit);
    }
    Ok(loaded)
}

/// A report's JSON with where its trace came from and how long loading took.
fn with_source(mut json: serde_json::Value, loaded: &Loaded) -> serde_json::Value {
    if let Some(object) = json.as_object_mut() {
        object.insert("trace".to_owned(), loaded.source.clone().into());
        object.insert("load_ms".to_owned(), millis(loaded.load_time).into());
    }
    json
}

/// The Prometheus recorder, when `--prometheus` or `--metrics-out` asks
/// for one (installed before the replay, so it sees every update).
fn install_exporter(args: &MetricsArgs) -> Result<Option<exporter::Exporter>, Failure> {
    match (args.prometheus, &args.metrics_out) {
        (None, None) => Ok(None),
        (listen, _) => Ok(Some(exporter::Exporter::install(listen)?)),
    }
}

/// Writes `--metrics-out` and holds the endpoint open for `--prometheus-hold-s`.
fn finish_exporter(
    exporter: Option<exporter::Exporter>,
    args: &MetricsArgs,
) -> Result<(), Failure> {
    if let Some(exporter) = &exporter {
        if let Some(path) = &args.metrics_out {
            exporter.write(path)?;
        }
        exporter.hold(Duration::from_secs(args.prometheus_hold_s));
    }
    Ok(())
}

/// Refuses, before anything is loaded, a serve flag whose Cargo feature
/// this build lacks (`--prometheus` and `--metrics-out` are refused by
/// [`install_exporter`], first thing too).
fn check_features(args: &ServeArgs) -> Result<(), SimError> {
    #[cfg(not(feature = "kv-events"))]
    if args.kv_events.is_some() {
        cli::check_subscribers(args.kv_events_subscribers)?;
        return Err(SimError::FeatureDisabled {
            flag: "--kv-events",
            feature: "kv-events",
        });
    }
    #[cfg(not(feature = "redis"))]
    if let Some(kvbm_sim::DataPlaneSpec::Redis(_)) = args.data_plane {
        return Err(SimError::FeatureDisabled {
            flag: "--data-plane redis:URL",
            feature: "redis",
        });
    }
    let _ = args;
    Ok(())
}

/// The `--kv-events` publisher, if asked for.
#[cfg(feature = "kv-events")]
fn event_sink(
    args: &ServeArgs,
    config: &kvbm_sim::ServeConfig,
) -> Result<Option<kvbm_sim::ZmqEventSink>, Failure> {
    use kvbm_events::{HashForm, PublisherConfig};
    let Some(endpoint) = &args.kv_events else {
        return Ok(None);
    };
    let format = config.wire_format()?.with_hash_form(HashForm::Int64);
    let mut config =
        PublisherConfig::new(endpoint.clone()).with_topic(args.kv_events_topic.clone());
    if let Some(replay) = &args.kv_events_replay {
        config = config.with_replay(replay.clone());
    }
    let wanted = cli::check_subscribers(args.kv_events_subscribers)?;
    let mut sink = kvbm_sim::ZmqEventSink::new(&config, format)?;
    if args.kv_events_wait_ms > 0 && wanted > 0 {
        let wait = Duration::from_millis(args.kv_events_wait_ms);
        let joined = sink.wait_for_subscribers(wanted, wait)?;
        if joined < wanted {
            // Not an error (vLLM does not wait at all), but a consumer that
            // joins late misses the first batches: say so where it shows.
            eprintln!(
                "warning: {joined} of {wanted} KV event subscribers joined within {} ms; \
                 replaying anyway",
                args.kv_events_wait_ms
            );
        }
    }
    Ok(Some(sink))
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
fn event_sink(
    args: &ServeArgs,
    _config: &kvbm_sim::ServeConfig,
) -> Result<Option<NoSink>, Failure> {
    cli::check_subscribers(args.kv_events_subscribers)?;
    match args.kv_events {
        Some(_) => Err(SimError::FeatureDisabled {
            flag: "--kv-events",
            feature: "kv-events",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_defaults_on_the_command_line_are_the_library_defaults() {
        let cli = Cli::try_parse_from(["kvbm-sim", "serve"]).unwrap();
        let Some(Command::Serve(args)) = cli.command else {
            panic!("not serve");
        };
        assert_eq!(
            args.engine.config().unwrap(),
            kvbm_sim::ServeConfig::default()
        );
        assert_eq!(
            cli::parse_reserve("FULL"),
            Ok(kvbm_queue::GenerationReserve::Full)
        );
        assert!(cli::parse_reserve("-1").is_err());
    }
}
