//! [`ServeReport`]: what a serve-mode replay did, per request and in total.

use std::fmt;
use std::time::Duration;

use kvbm_queue::{Census, Priority, SchedulerConfig};
use serde_json::json;

use super::latency::ms;
use super::{KvReport, Latency, StepTime, TierReport};
use crate::format::{group, percent};
use crate::trace::ratio;
use crate::{Eviction, HitStats, KvEventCounts};

/// How a trace request left the simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ServeOutcome {
    /// Not arrived or not done yet (never in a finished replay's report).
    Pending,
    /// Generated all its `output_length` tokens.
    Finished,
    /// Refused at submission: an empty prompt.
    RejectedEmpty,
    /// Refused at submission: its prompt plus generation reserve is larger
    /// than the whole pool.
    RejectedTooLarge,
    /// Admitted, but its sequence outgrew the whole pool while generating.
    CapacityExceeded,
    /// Taken out by the scheduler for any other reason (a bug).
    Aborted,
}

impl ServeOutcome {
    /// Whether the scheduler accepted the request at submission.
    pub fn was_accepted(self) -> bool {
        !matches!(self, Self::RejectedEmpty | Self::RejectedTooLarge)
    }
}

/// One trace request's life in simulated time (every time from the start
/// of the trace).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestTimeline {
    /// Its trace timestamp.
    pub arrival: Duration,
    /// Start of the step that first admitted it.
    pub admitted: Option<Duration>,
    /// End of the step that emitted its first token.
    pub first_token: Option<Duration>,
    /// End of the step it finished in (start of the step that gave up on it,
    /// for [`ServeOutcome::CapacityExceeded`]).
    pub finished: Option<Duration>,
    /// Its place in the order of first admissions (0 first).
    pub admission_rank: Option<u64>,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Tokens to generate.
    pub output_tokens: u64,
    /// Prompt tokens served from the prefix cache at its first admission.
    pub hit_tokens: u64,
    /// Times it was preempted.
    pub preemptions: u32,
    /// The priority it was submitted at.
    pub priority: Priority,
    /// How it left.
    pub outcome: ServeOutcome,
}

impl RequestTimeline {
    /// Time to first token: arrival to the end of the step that emitted it.
    pub fn ttft(&self) -> Option<Duration> {
        self.first_token?.checked_sub(self.arrival)
    }

    /// Time per output token after the first:
    /// `(finished - first_token) / (output_tokens - 1)`, for finished
    /// requests with at least two output tokens.
    pub fn tpot(&self) -> Option<Duration> {
        if self.outcome != ServeOutcome::Finished || self.output_tokens < 2 {
            return None;
        }
        let decoding = self.finished?.checked_sub(self.first_token?)?;
        let nanos = decoding.as_nanos() / u128::from(self.output_tokens - 1);
        Some(Duration::from_nanos(
            u64::try_from(nanos).unwrap_or(u64::MAX),
        ))
    }

    /// End to end: arrival to the end of the step that finished it.
    pub fn e2e(&self) -> Option<Duration> {
        if self.outcome != ServeOutcome::Finished {
            return None;
        }
        self.finished?.checked_sub(self.arrival)
    }
}

/// Admissions as the scheduler's census counts them: every admission,
/// resumptions after preemption included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdmissionStats {
    /// Admissions (first ones and resumptions).
    pub admissions: u64,
    /// Tokens admitted: a first admission counts its prompt, a resumption
    /// its prompt and the tokens it had generated (`census.prompt_tokens`).
    pub admitted_tokens: u64,
    /// Of those, tokens found in the prefix cache
    /// (`census.prefix_hit_tokens`).
    pub admitted_hit_tokens: u64,
}

impl AdmissionStats {
    /// `admitted_hit_tokens / admitted_tokens` (0 with none).
    pub fn hit_rate(&self) -> f64 {
        ratio(self.admitted_hit_tokens, self.admitted_tokens)
    }
}

/// The result of a serve-mode replay. See [the module docs](super) for
/// exactly what each number counts.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ServeReport {
    /// Tokens per block.
    pub block_size: usize,
    /// The pool's size in blocks.
    pub capacity_blocks: usize,
    /// The eviction policy.
    pub eviction: Eviction,
    /// The scheduler's limits.
    pub scheduler: SchedulerConfig,
    /// The step-time model.
    pub step_time: StepTime,
    /// Accepted requests, their blocks and tokens, and the prefix hits at
    /// their first admission.
    pub hits: HitStats,
    /// Requests refused at submission (empty, or larger than the pool).
    pub rejected_requests: u64,
    /// Every admission, resumptions included.
    pub admissions: AdmissionStats,
    /// The scheduler's census at the end (balanced: nothing waits or runs).
    pub census: Census,
    /// Preemptions (a request may be preempted more than once).
    pub preemptions: u64,
    /// Cached blocks evicted to make room.
    pub evictions: u64,
    /// Engine steps (steps that ran something).
    pub steps: u64,
    /// Requests in the plans, summed over steps (a request prefilling or
    /// decoding in a step counts once): the denominator of the cost per
    /// scheduled request-step (`scheduler_ms × 1000 / scheduled_requests`
    /// µs for the scheduler's calls, `replay_ms` in place of
    /// `scheduler_ms` for the whole replay).
    pub scheduled_requests: u64,
    /// Tokens prefilled, prompt chunks and recomputation alike.
    pub prefill_tokens: u64,
    /// Decode work items (one per decoding request per step).
    pub decode_tokens: u64,
    /// Draft tokens verified by speculative decodes
    /// (`census.spec_proposed_tokens`).
    pub spec_proposed_tokens: u64,
    /// Of those, the ones accepted (`census.spec_accepted_tokens`).
    pub spec_accepted_tokens: u64,
    /// Tokens generated.
    pub output_tokens: u64,
    /// Time to first token over requests that emitted one.
    pub ttft: Latency,
    /// The same, per priority (most urgent first; priorities no request
    /// had are left out).
    pub ttft_by_priority: Vec<(Priority, Latency)>,
    /// Time per output token after the first, over finished requests with
    /// at least two output tokens.
    pub tpot: Latency,
    /// Arrival to finish, over finished requests.
    pub e2e: Latency,
    /// Most requests running at once.
    pub max_running: u64,
    /// Most requests waiting at once, as a step's planning found them.
    pub max_waiting: u64,
    /// First arrival to the end of the last step.
    pub sim_duration: Duration,
    /// Sum of step times: the engine's busy time.
    pub busy_time: Duration,
    /// Wall time of the replay, building the pool included.
    pub replay_time: Duration,
    /// Of it, the wall time inside the scheduler's step loop: planning
    /// steps and applying the engine's outputs, the calls vLLM's
    /// `schedule()` and `update_from_output()` make (`None` where it was
    /// not kept). `scheduler_ms × 1000 / scheduled_requests` is the
    /// scheduler's own cost per scheduled request-step.
    pub scheduler_time: Option<Duration>,
    /// The cache events published during the replay, when they were
    /// ([`replay_with_events`](super::replay_with_events)).
    pub kv_events: Option<KvEventCounts>,
    /// What the tiers below the GPU did, with any configured
    /// ([`ServeConfig::tiers`](super::ServeConfig::tiers)).
    pub tiers: Option<TierReport>,
    /// What the data plane moved and checked, with one
    /// ([`replay_with_data_plane`](super::replay_with_data_plane)).
    pub data_plane: Option<crate::DataPlaneReport>,
    /// What a model's KV cache groups took of the pool, with a model's
    /// layout ([`ServeConfig::kv`](super::ServeConfig::kv)).
    pub kv: Option<KvReport>,
    /// Every trace request, in trace order.
    pub requests: Vec<RequestTimeline>,
}

impl ServeReport {
    /// Clears the wall times (the replay's and the scheduler's), which no
    /// two runs share, so that tests can compare the rest.
    #[cfg(test)]
    pub(crate) fn clear_wall_times(&mut self) {
        self.replay_time = Duration::ZERO;
        self.scheduler_time = None;
    }

    /// Requests that finished, generating all their tokens.
    pub fn finished_requests(&self) -> u64 {
        self.count(ServeOutcome::Finished)
    }

    /// Admitted requests that outgrew the pool and were given up.
    pub fn capacity_exceeded(&self) -> u64 {
        self.count(ServeOutcome::CapacityExceeded)
    }

    fn count(&self, outcome: ServeOutcome) -> u64 {
        self.requests
            .iter()
            .filter(|r| r.outcome == outcome)
            .count() as u64
    }

    /// Tokens a decoding request gains per step: 1 without speculative
    /// decoding, `1 + accepted drafts / decodes` with it (0 without decodes).
    pub fn tokens_per_decode_step(&self) -> f64 {
        if self.decode_tokens == 0 {
            0.0
        } else {
            (self.decode_tokens + self.spec_accepted_tokens) as f64 / self.decode_tokens as f64
        }
    }

    /// Generated tokens per simulated second.
    pub fn output_tokens_per_s(&self) -> f64 {
        per_second(self.output_tokens, self.sim_duration)
    }

    /// Finished requests per simulated second.
    pub fn requests_per_s(&self) -> f64 {
        per_second(self.finished_requests(), self.sim_duration)
    }

    /// Busy time over simulated duration, in `0.0..=1.0`.
    pub fn utilization(&self) -> f64 {
        let total = self.sim_duration.as_secs_f64();
        if total == 0.0 {
            0.0
        } else {
            self.busy_time.as_secs_f64() / total
        }
    }

    /// The pool's size in tokens.
    pub fn capacity_tokens(&self) -> u64 {
        (self.capacity_blocks as u64).saturating_mul(self.block_size as u64)
    }

    /// The report as one JSON object (the `--json` output). With tiers
    /// below the GPU it gains `tiers` (one object per tier) and
    /// `onboarding`; without, it is exactly as before tiers existed. With a
    /// model's KV layout ([`kv`](Self::kv)) it gains `model`,
    /// `full_attention_only`, `capacity_bytes`, `layers_per_block`,
    /// `kv_block_bytes`, `kv_groups` (per group `kind`, `window`, `chunk`,
    /// `layers`, `peak_blocks`), `peak_blocks_in_use` and `peak_kv_bytes`
    /// (see [`KvReport`]).
    pub fn to_json(&self) -> serde_json::Value {
        let mut report = self.json_without_tiers();
        if let (Some(tiers), Some(map)) = (&self.tiers, report.as_object_mut()) {
            let (per_tier, onboarding) = tiers.to_json();
            map.insert("tiers".to_owned(), per_tier);
            map.insert("onboarding".to_owned(), onboarding);
        }
        if let (Some(data_plane), Some(map)) = (&self.data_plane, report.as_object_mut()) {
            map.insert(
                "data_plane".to_owned(),
                serde_json::to_value(data_plane).unwrap_or_default(),
            );
        }
        if let (Some(kv), Some(map)) = (&self.kv, report.as_object_mut()) {
            map.extend(kv.json_fields());
        }
        report
    }

    fn json_without_tiers(&self) -> serde_json::Value {
        json!({
            "mode": "serve",
            "block_size": self.block_size,
            "capacity_blocks": self.capacity_blocks,
            "capacity_tokens": self.capacity_tokens(),
            "eviction": self.eviction.name(),
            "max_running": self.scheduler.max_running,
            "token_budget": self.scheduler.token_budget,
            "chunk_size": self.scheduler.chunk_size,
            "watermark_blocks": self.scheduler.watermark_blocks,
            "step_ms": ms(self.step_time.per_step),
            "prefill_token_ms": ms(self.step_time.per_prefill_token),
            "decode_request_ms": ms(self.step_time.per_decode_request),
            "requests": self.hits.requests,
            "rejected_requests": self.rejected_requests,
            "finished_requests": self.finished_requests(),
            "capacity_exceeded": self.capacity_exceeded(),
            "input_blocks": self.hits.input_blocks,
            "hit_blocks": self.hits.hit_blocks,
            "input_tokens": self.hits.input_tokens,
            "hit_tokens": self.hits.hit_tokens,
            "block_hit_rate": self.hits.block_hit_rate(),
            "token_hit_rate": self.hits.token_hit_rate(),
            "admissions": self.admissions.admissions,
            "admitted_tokens": self.admissions.admitted_tokens,
            "admitted_hit_tokens": self.admissions.admitted_hit_tokens,
            "preemptions": self.preemptions,
            "evictions": self.evictions,
            "steps": self.steps,
            "scheduled_requests": self.scheduled_requests,
            "prefill_tokens": self.prefill_tokens,
            "decode_tokens": self.decode_tokens,
            "spec_tokens": self.scheduler.speculative_tokens,
            "spec_proposed_tokens": self.spec_proposed_tokens,
            "spec_accepted_tokens": self.spec_accepted_tokens,
            "tokens_per_decode_step": self.tokens_per_decode_step(),
            "priority_preemptions": self.census.priority_preemptions,
            "preemption_boost": self.scheduler.preemption_boost,
            "prefix_credit": self.scheduler.prefix_credit,
            "output_tokens": self.output_tokens,
            "output_tokens_per_s": self.output_tokens_per_s(),
            "requests_per_s": self.requests_per_s(),
            "ttft": self.ttft.to_json(),
            "ttft_by_priority": self
                .ttft_by_priority
                .iter()
                .map(|(priority, latency)| (priority.name().to_owned(), latency.to_json()))
                .collect::<serde_json::Map<_, _>>(),
            "tpot": self.tpot.to_json(),
            "e2e": self.e2e.to_json(),
            "max_running": self.max_running,
            "max_waiting": self.max_waiting,
            "sim_duration_s": self.sim_duration.as_secs_f64(),
            "utilization": self.utilization(),
            "replay_ms": ms(self.replay_time),
            "scheduler_ms": self.scheduler_time.map(ms),
            "kv_events": self.kv_events.map(|counts| counts.to_json()),
        })
    }
}

fn per_second(count: u64, duration: Duration) -> f64 {
    let seconds = duration.as_secs_f64();
    if seconds == 0.0 {
        0.0
    } else {
        count as f64 / seconds
    }
}

/// TTFT per priority, most urgent first, over the priorities present.
pub(super) fn ttft_by_priority(requests: &[RequestTimeline]) -> Vec<(Priority, Latency)> {
    Priority::ALL
        .iter()
        .rev()
        .filter_map(|&priority| {
            let of_priority = requests.iter().filter(|r| r.priority == priority);
            let latency = summarize(of_priority, RequestTimeline::ttft);
            (latency.count > 0).then_some((priority, latency))
        })
        .collect()
}

/// TTFT, TPOT and end-to-end latency over `requests`.
pub(crate) fn latencies(requests: &[RequestTimeline]) -> (Latency, Latency, Latency) {
    (
        summarize(requests.iter(), RequestTimeline::ttft),
        summarize(requests.iter(), RequestTimeline::tpot),
        summarize(requests.iter(), RequestTimeline::e2e),
    )
}

/// One latency, `pick`ed from each of `requests` that has it.
fn summarize<'a>(
    requests: impl Iterator<Item = &'a RequestTimeline>,
    pick: fn(&RequestTimeline) -> Option<Duration>,
) -> Latency {
    let mut samples: Vec<u64> = requests
        .filter_map(pick)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .collect();
    Latency::from_nanos(&mut samples)
}

impl fmt::Display for ServeReport {
    /// A readable summary, several lines, ending in a newline.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hits = &self.hits;
        writeln!(
            f,
            "serve mode: {} requests, block size {}, pool {} blocks = {} tokens, eviction {}",
            group(hits.requests),
            self.block_size,
            group(self.capacity_blocks as u64),
            group(self.capacity_tokens()),
            self.eviction
        )?;
        writeln!(
            f,
            "  scheduler: max running {}, token budget {}, chunk {}, watermark {}",
            self.scheduler.max_running,
            self.scheduler.token_budget,
            self.scheduler.chunk_size,
            match self.scheduler.watermark_blocks {
                Some(blocks) => format!("{blocks} blocks"),
                None => format!("1% ({} blocks)", self.capacity_blocks / 100),
            }
        )?;
        writeln!(f, "  step time: {}", self.step_time)?;
        hits.write_table(f, "prefix hits", "   (at first admission)")?;
        writeln!(
            f,
            "  finished {}, rejected {}, outgrew the pool {}",
            group(self.finished_requests()),
            group(self.rejected_requests),
            group(self.capacity_exceeded())
        )?;
        writeln!(
            f,
            "  preemptions {}, admissions {} (hit rate {} counting resumptions), evictions {}",
            group(self.preemptions),
            group(self.admissions.admissions),
            percent(self.admissions.hit_rate()),
            group(self.evictions)
        )?;
        writeln!(
            f,
            "  simulated {:.1} s in {} steps (engine busy {}), at most {} running and {} waiting",
            self.sim_duration.as_secs_f64(),
            group(self.steps),
            percent(self.utilization()),
            group(self.max_running),
            group(self.max_waiting)
        )?;
        writeln!(
            f,
            "  throughput {:.1} output tokens/s, {:.3} requests/s ({} prefilled, {} generated tokens)",
            self.output_tokens_per_s(),
            self.requests_per_s(),
            group(self.prefill_tokens),
            group(self.output_tokens)
        )?;
        writeln!(f, "  TTFT  {}", self.ttft)?;
        if self.ttft_by_priority.len() > 1 {
            for (priority, latency) in &self.ttft_by_priority {
                writeln!(f, "    {:<8} {latency}", priority.name())?;
            }
            writeln!(
                f,
                "    priority preemptions {}",
                group(self.census.priority_preemptions)
            )?;
        }
        if self.scheduler.speculative_tokens > 0 {
            writeln!(
                f,
                "  speculative: {} drafts per decode, {} of {} accepted, {:.2} tokens per decode step",
                self.scheduler.speculative_tokens,
                group(self.spec_accepted_tokens),
                group(self.spec_proposed_tokens),
                self.tokens_per_decode_step()
            )?;
        }
        writeln!(f, "  TPOT  {}", self.tpot)?;
        writeln!(f, "  E2E   {}", self.e2e)?;
        if let Some(tiers) = &self.tiers {
            write!(f, "{tiers}")?;
        }
        if let Some(data) = &self.data_plane {
            writeln!(
                f,
                "  data plane ({}): {} blocks loaded, {} verified, {} wrong, {} failed; \
                 {} bytes written, {} read; waited {:.3} s",
                data.store,
                data.loaded_blocks,
                data.verified_blocks,
                data.wrong_blocks,
                data.failed_blocks,
                data.bytes_written,
                data.bytes_read,
                data.wait_seconds
            )?;
        }
        if let Some(kv) = &self.kv {
            write!(f, "{kv}")?;
        }
        match self.scheduler_time {
            Some(scheduler) => writeln!(
                f,
                "  replay {:.1} ms ({:.1} ms in the scheduler's step loop)",
                ms(self.replay_time),
                ms(scheduler)
            ),
            None => writeln!(f, "  replay {:.1} ms", ms(self.replay_time)),
        }
    }
}
