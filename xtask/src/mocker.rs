//! `cargo xtask mocker-compare`: NVIDIA Dynamo's cluster simulator (the
//! mocker, in `ai-dynamo-runtime`) and `kvbm-sim cluster` on the same trace
//! and cluster, side by side: wall time, its ratio, prefix-cache hit rates.
//!
//! kvbm-sim runs twice, its engines on one thread (the mocker steps its
//! workers on one) and on every core. Both replay with 16 engines of 16,384 blocks of 64 tokens (the mocker's
//! defaults, which `kvbm-sim` is told explicitly) and route with a KV-aware
//! and a round-robin policy. Their step-time models differ, so their TTFTs
//! are shown but not compared; round-robin hit rates must agree (the
//! routing is the same and the caches hold the same blocks).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use xshell::{Shell, cmd};

use crate::{DYNAMO_RUNTIME, cargo, interop_python, project_root};

/// Engines in both clusters (the Mooncake paper's and the issue's).
const ENGINES: &str = "16";
/// The mocker's default block size and blocks per worker.
const BLOCK_SIZE: &str = "64";
const CAPACITY_TOKENS: &str = "1048576";

/// One policy, as each simulator names it.
const PAIRS: [(&str, &str); 2] = [("kv-aware", "kv_router"), ("round-robin", "round_robin")];

/// One simulator's replay under one policy.
#[derive(Clone, Debug)]
struct Side {
    wall_ms: f64,
    hit_rate: f64,
    mean_ttft_ms: f64,
    finished: u64,
}

/// The trace to compare on: `--trace FILE`, else the full conversation
/// trace beside the checkout (`../shared/traces`).
fn trace_path(trace: Option<&str>) -> Result<PathBuf> {
    let path = match trace {
        Some(path) => PathBuf::from(path),
        None => project_root().join("../shared/traces/conversation_trace.jsonl"),
    };
    if !path.is_file() {
        bail!(
            "no trace at {} (pass --trace FILE, a Mooncake-format JSONL trace)",
            path.display()
        );
    }
    path.canonicalize()
        .with_context(|| format!("resolving {}", path.display()))
}

pub(crate) fn compare(sh: &Shell, trace: Option<&str>) -> Result<()> {
    let trace = trace_path(trace)?;
    let python = interop_python(sh, DYNAMO_RUNTIME)?;
    // The mocker steps its workers on one thread: ours on one, and on all.
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let one = kvbm_sim(sh, &trace, 1)?;
    let all = kvbm_sim(sh, &trace, cores)?;
    let script = project_root().join("xtask/interop/mocker_replay.py");
    let mut rows = Vec::new();
    for (policy, mode) in PAIRS {
        eprintln!("mocker: {mode} ...");
        let line = cmd!(sh, "{python} {script} {trace} {mode} {ENGINES}")
            .env("DYN_LOG", "warn")
            .read()?;
        let mocker = mocker_side(&line)?;
        let find = |runs: &[(String, Side)]| {
            (runs.iter().find(|(name, _)| name == policy))
                .map(|(_, side)| side.clone())
                .with_context(|| format!("kvbm-sim reported no {policy} run"))
        };
        let kvbm = (find(&one)?, find(&all)?);
        rows.push((policy, mocker, kvbm.0, kvbm.1));
    }
    eprintln!(
        "\n{} engines, block {BLOCK_SIZE}, {CAPACITY_TOKENS} tokens per engine, {}",
        ENGINES,
        trace.display()
    );
    eprintln!(
        "  {:<12} {:>11} {:>17} {:>17} {:>13} {:>9} {:>12} {:>10}",
        "policy",
        "mocker wall",
        "kvbm 1 thread",
        format!("kvbm {cores} threads"),
        "mocker reuse",
        "kvbm hit",
        "mocker TTFT",
        "kvbm TTFT"
    );
    for (policy, mocker, one, all) in &rows {
        eprintln!(
            "  {:<12} {:>9.2} s {:>7.2} s ({:>4.1}×) {:>7.2} s ({:>4.1}×) {:>12.2}% {:>8.2}% {:>9.0} ms {:>7.0} ms",
            policy,
            mocker.wall_ms / 1e3,
            one.wall_ms / 1e3,
            mocker.wall_ms / one.wall_ms,
            all.wall_ms / 1e3,
            mocker.wall_ms / all.wall_ms,
            mocker.hit_rate * 100.0,
            all.hit_rate * 100.0,
            mocker.mean_ttft_ms,
            all.mean_ttft_ms,
        );
        if mocker.finished != all.finished {
            eprintln!(
                "  note: {policy}: the mocker finished {} requests, kvbm-sim {}",
                mocker.finished, all.finished
            );
        }
    }
    Ok(())
}

/// `kvbm-sim cluster` in release on `trace`, its engines stepping on
/// `threads` threads: each policy's run.
fn kvbm_sim(sh: &Shell, trace: &Path, threads: usize) -> Result<Vec<(String, Side)>> {
    let cargo = cargo();
    cmd!(sh, "{cargo} build --quiet --release -p kvbm-sim").run()?;
    let binary = project_root().join("target/release/kvbm-sim");
    let policies = PAIRS.map(|(policy, _)| policy).join(",");
    let threads = threads.to_string();
    eprintln!("kvbm-sim cluster: {policies}, {threads} thread(s) ...");
    let report = cmd!(
        sh,
        "{binary} cluster --trace {trace} --engines {ENGINES} --policies {policies} --block-size {BLOCK_SIZE} --capacity-tokens {CAPACITY_TOKENS} --threads {threads} --json"
    )
    .read()?;
    let report: Value = serde_json::from_str(&report).context("kvbm-sim's JSON report")?;
    let runs = report["runs"]
        .as_array()
        .context("kvbm-sim's report has no runs")?;
    runs.iter()
        .map(|run| {
            let policy = run["policy"].as_str().context("a run without a policy")?;
            let side = Side {
                wall_ms: number(&run["replay_ms"], "replay_ms")?,
                hit_rate: number(&run["token_hit_rate"], "token_hit_rate")?,
                mean_ttft_ms: number(&run["ttft"]["mean_ms"], "ttft.mean_ms")?,
                finished: run["finished_requests"]
                    .as_u64()
                    .context("finished_requests")?,
            };
            Ok((policy.to_owned(), side))
        })
        .collect()
}

/// The mocker's summary line from `mocker_replay.py`.
fn mocker_side(line: &str) -> Result<Side> {
    let summary: Value = serde_json::from_str(line.trim())
        .with_context(|| format!("the mocker's summary: {line}"))?;
    Ok(Side {
        wall_ms: number(&summary["wall_time_ms"], "wall_time_ms")?,
        hit_rate: number(
            &summary["prefix_cache_reused_ratio"],
            "prefix_cache_reused_ratio",
        )?,
        mean_ttft_ms: number(&summary["mean_ttft_ms"], "mean_ttft_ms")?,
        finished: summary["completed_requests"]
            .as_u64()
            .context("completed_requests")?,
    })
}

fn number(value: &Value, name: &str) -> Result<f64> {
    value
        .as_f64()
        .with_context(|| format!("`{name}` is missing or not a number"))
}
