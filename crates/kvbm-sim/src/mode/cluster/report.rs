//! [`ClusterReport`]: one [`ClusterRun`] per routing policy, each merged
//! from its engines' serve-mode reports.

use std::fmt;
use std::time::{Duration, Instant};

use serde_json::json;

use super::PolicyKind;
use crate::format::{group, percent};
use crate::mode::serve::{ServeSim, latencies};
use crate::{HitStats, Latency, RequestTimeline, ServeOutcome, SimError, Trace};

/// One policy's replay over the whole cluster.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ClusterRun {
    /// The routing policy.
    pub policy: PolicyKind,
    /// Accepted requests, their blocks and tokens, and the prefix hits at
    /// their first admission, summed over engines.
    pub hits: HitStats,
    /// Requests refused at submission (empty, or larger than an engine's
    /// pool).
    pub rejected_requests: u64,
    /// Requests that generated all their tokens.
    pub finished_requests: u64,
    /// Time to first token over requests that emitted one.
    pub ttft: Latency,
    /// Time per output token after the first.
    pub tpot: Latency,
    /// Arrival to finish.
    pub e2e: Latency,
    /// Preemptions, summed over engines.
    pub preemptions: u64,
    /// Cached blocks evicted, summed over engines.
    pub evictions: u64,
    /// Engine steps, summed over engines.
    pub steps: u64,
    /// Requests in the engines' plans, summed over steps and engines (the
    /// denominator of the cost per scheduled request-step).
    pub scheduled_requests: u64,
    /// Requests routed to each engine, in engine order.
    pub routed: Vec<u64>,
    /// Each engine's busy time (sum of its step times), in engine order.
    pub busy: Vec<Duration>,
    /// First arrival to the end of the last engine's last step.
    pub sim_duration: Duration,
    /// Wall time of the replay, building the engines included.
    pub replay_time: Duration,
    /// With tiers below the engines' GPUs (their own, or a shared pool):
    /// what the tiers served, summed over engines.
    pub tiers: Option<ClusterTiers>,
    /// Every trace request, in trace order, as the engine it went to saw it.
    pub requests: Vec<RequestTimeline>,
}

/// What the tiers below the engines did in one run, summed over engines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterTiers {
    /// Prompt tokens loaded from a lower tier (an engine's own, or the
    /// shared pool) instead of computed.
    pub hit_tokens: u64,
    /// Of those, from the shared pool.
    pub remote_hit_tokens: u64,
    /// Requests that waited for loads.
    pub onboarded_requests: u64,
    /// Bytes moved to and from the lower tiers.
    pub bytes_moved: u64,
}

impl ClusterRun {
    /// The busiest engine's busy time over the mean engine's: 1 is a
    /// perfectly balanced cluster, `engines` is all work on one engine
    /// (1 with no work at all).
    pub fn load_imbalance(&self) -> f64 {
        let total: f64 = self.busy.iter().map(Duration::as_secs_f64).sum();
        let max = self
            .busy
            .iter()
            .map(Duration::as_secs_f64)
            .fold(0.0, f64::max);
        if total == 0.0 {
            1.0
        } else {
            max * self.busy.len() as f64 / total
        }
    }

    /// The run as one JSON object (an element of `--json`'s `runs`); with
    /// tiers it gains `tiers`, without it is as before.
    pub fn to_json(&self) -> serde_json::Value {
        let mut run = json!({
            "policy": self.policy.name(),
            "requests": self.hits.requests,
            "rejected_requests": self.rejected_requests,
            "finished_requests": self.finished_requests,
            "input_blocks": self.hits.input_blocks,
            "hit_blocks": self.hits.hit_blocks,
            "input_tokens": self.hits.input_tokens,
            "hit_tokens": self.hits.hit_tokens,
            "token_hit_rate": self.hits.token_hit_rate(),
            "block_hit_rate": self.hits.block_hit_rate(),
            "ttft": self.ttft.to_json(),
            "tpot": self.tpot.to_json(),
            "e2e": self.e2e.to_json(),
            "preemptions": self.preemptions,
            "evictions": self.evictions,
            "load_imbalance": self.load_imbalance(),
            "steps": self.steps,
            "scheduled_requests": self.scheduled_requests,
            "routed": self.routed,
            "busy_s": self.busy.iter().map(Duration::as_secs_f64).collect::<Vec<_>>(),
            "sim_duration_s": self.sim_duration.as_secs_f64(),
            "replay_ms": self.replay_time.as_secs_f64() * 1e3,
        });
        if let (Some(tiers), Some(map)) = (&self.tiers, run.as_object_mut()) {
            map.insert(
                "tiers".to_owned(),
                json!({
                    "hit_tokens": tiers.hit_tokens,
                    "remote_hit_tokens": tiers.remote_hit_tokens,
                    "onboarded_requests": tiers.onboarded_requests,
                    "bytes_moved": tiers.bytes_moved,
                }),
            );
        }
        run
    }
}

/// The result of a cluster-mode replay: one run per policy, in the order
/// they were asked for.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ClusterReport {
    /// Engines behind the router.
    pub engines: usize,
    /// Copies of the trace replayed ([`ClusterConfig::replicate`](crate::ClusterConfig::replicate)).
    pub replicate: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Each engine's pool, in blocks.
    pub capacity_blocks: usize,
    /// One replay per policy.
    pub runs: Vec<ClusterRun>,
}

impl ClusterReport {
    /// The report as one JSON object (the `--json` output):
    /// `{"mode": "cluster", "engines": .., "runs": [..]}`, and
    /// `"replicate": N` for more than one copy of the trace.
    pub fn to_json(&self) -> serde_json::Value {
        let mut report = json!({
            "mode": "cluster",
            "engines": self.engines,
            "block_size": self.block_size,
            "capacity_blocks": self.capacity_blocks,
            "runs": self.runs.iter().map(ClusterRun::to_json).collect::<Vec<_>>(),
        });
        if let (true, Some(map)) = (self.replicate > 1, report.as_object_mut()) {
            map.insert("replicate".to_owned(), self.replicate.into());
        }
        report
    }
}

impl fmt::Display for ClusterReport {
    /// A table with one row per policy, ending in a newline.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let requests = self.runs.first().map_or(0, |run| run.requests.len() as u64);
        let copies = match self.replicate {
            1 => String::new(),
            copies => format!(" ({copies} copies of the trace)"),
        };
        writeln!(
            f,
            "cluster mode: {} engines, {} requests{copies}, block size {}, {} blocks per engine",
            self.engines,
            group(requests),
            self.block_size,
            group(self.capacity_blocks as u64)
        )?;
        writeln!(
            f,
            "  {:<13}{:>11}{:>11}{:>11}{:>11}{:>10}{:>10}{:>10}{:>9}{:>11}{:>10}",
            "policy",
            "TTFT mean",
            "p50",
            "p90",
            "p99",
            "TPOT",
            "hit rate",
            "finished",
            "refused",
            "imbalance",
            "replay"
        )?;
        for run in &self.runs {
            let secs = |d: Duration| format!("{:.3} s", d.as_secs_f64());
            writeln!(
                f,
                "  {:<13}{:>11}{:>11}{:>11}{:>11}{:>10}{:>10}{:>10}{:>9}{:>11}{:>10}",
                run.policy.name(),
                secs(run.ttft.mean),
                secs(run.ttft.p50),
                secs(run.ttft.p90),
                secs(run.ttft.p99),
                format!("{:.1} ms", run.tpot.mean.as_secs_f64() * 1e3),
                percent(run.hits.token_hit_rate()),
                group(run.finished_requests),
                group(run.rejected_requests),
                format!("{:.2}", run.load_imbalance()),
                format!("{:.2} s", run.replay_time.as_secs_f64()),
            )?;
        }
        Ok(())
    }
}

/// Merges the engines of one policy's replay: each request as the engine
/// it was `assigned` to saw it.
///
/// Engine by engine: each one's report (a timeline per request routed to
/// it) is taken apart as soon as it is made, so the merge holds one
/// engine's timelines at a time beside the merged ones.
pub(super) fn merge<'a>(
    trace: &Trace,
    policy: PolicyKind,
    engines: impl ExactSizeIterator<Item = ServeSim<'a>>,
    assigned: &[usize],
    capacity_blocks: usize,
    started: Instant,
) -> Result<ClusterRun, SimError> {
    let count = engines.len();
    let out_of_memory = |what, bytes: usize| SimError::OutOfMemory {
        what,
        bytes: bytes as u64,
    };
    let mut routed: Vec<u64> = Vec::new();
    let mut busy: Vec<Duration> = Vec::new();
    (routed.try_reserve_exact(count))
        .map_err(|_| out_of_memory("the engines' request counts", count * size_of::<u64>()))?;
    (busy.try_reserve_exact(count))
        .map_err(|_| out_of_memory("the engines' busy times", count * size_of::<Duration>()))?;
    routed.resize(count, 0);
    let mut slots: Vec<Option<RequestTimeline>> = vec![None; trace.len()];
    let mut block_size = None;
    let (mut rejected_requests, mut preemptions, mut evictions) = (0u64, 0u64, 0u64);
    let (mut steps, mut scheduled_requests) = (0u64, 0u64);
    let mut last_step = Duration::ZERO;
    let mut tiers: Option<ClusterTiers> = None;
    for (engine, sim) in engines.enumerate() {
        let indices = sim.request_indices();
        let report = sim.report(capacity_blocks)?;
        if let Some(engine_tiers) = &report.tiers {
            let sum = tiers.get_or_insert_default();
            for tier in &engine_tiers.tiers {
                sum.hit_tokens = sum.hit_tokens.saturating_add(tier.hit_tokens);
                if tier.medium == crate::tiers::REMOTE {
                    sum.remote_hit_tokens = sum.remote_hit_tokens.saturating_add(tier.hit_tokens);
                }
                sum.bytes_moved = (sum.bytes_moved)
                    .saturating_add(tier.bytes_stored)
                    .saturating_add(tier.bytes_loaded);
            }
            sum.onboarded_requests =
                (sum.onboarded_requests).saturating_add(engine_tiers.onboarding.requests);
        }
        block_size.get_or_insert(report.block_size);
        rejected_requests = rejected_requests.saturating_add(report.rejected_requests);
        preemptions = preemptions.saturating_add(report.preemptions);
        evictions = evictions.saturating_add(report.evictions);
        steps = steps.saturating_add(report.steps);
        scheduled_requests = scheduled_requests.saturating_add(report.scheduled_requests);
        busy.push(report.busy_time);
        last_step = last_step.max(report.sim_duration);
        // The engine knows the requests routed to it, no others.
        for (index, timeline) in indices.into_iter().zip(report.requests) {
            if let (Some(slot), Some(&to)) = (slots.get_mut(index), assigned.get(index))
                && to == engine
            {
                *slot = Some(timeline);
            }
        }
    }
    for &engine in assigned {
        if let Some(routed) = routed.get_mut(engine) {
            *routed = routed.saturating_add(1);
        }
    }
    let requests: Vec<RequestTimeline> = slots.into_iter().flatten().collect();
    let block_size = block_size.unwrap_or(1);
    let mut hits = HitStats::default();
    for request in requests.iter().filter(|r| r.outcome.was_accepted()) {
        hits.record_tokens(
            request.input_tokens,
            request.input_tokens.div_ceil(block_size as u64),
            request.hit_tokens,
            block_size,
        );
    }
    let count = |outcome: ServeOutcome| requests.iter().filter(|r| r.outcome == outcome).count();
    let first_arrival = requests.iter().map(|r| r.arrival).min().unwrap_or_default();
    let (ttft, tpot, e2e) = latencies(&requests);
    Ok(ClusterRun {
        policy,
        hits,
        rejected_requests,
        finished_requests: count(ServeOutcome::Finished) as u64,
        ttft,
        tpot,
        e2e,
        preemptions,
        evictions,
        steps,
        scheduled_requests,
        routed,
        busy,
        // Engines' clocks start at the trace's origin, not its first arrival.
        sim_duration: last_step.saturating_sub(first_arrival),
        replay_time: started.elapsed(),
        tiers,
        requests,
    })
}
