//! What the [`Scheduler`] records through the [`metrics`] facade.
//!
//! A library only records; the application installs a recorder (an exporter
//! such as `metrics-exporter-prometheus`) before the scheduler's first step,
//! when it resolves its handles.
//! With none installed every handle is a no-op, and the scheduler records a
//! handful of values per step, never per block, so the hot paths cost what
//! they cost without metrics.

use metrics::{Counter, Gauge, Label};

use super::{Census, Scheduler};

/// The series' names, with the meaning of vLLM's series of the same role
/// (`vllm:` prefix there), so dashboards built for vLLM map one to one.
pub mod names {
    /// Counter: prompt tokens looked up in the prefix cache, at each
    /// request's first admission (vLLM `prefix_cache_queries`).
    pub const PREFIX_CACHE_QUERIES: &str = "kvbm_prefix_cache_queries_total";
    /// Counter: of those, tokens found cached (vLLM `prefix_cache_hits`).
    pub const PREFIX_CACHE_HITS: &str = "kvbm_prefix_cache_hits_total";
    /// Gauge, 0 to 1: blocks in use over all blocks (vLLM
    /// `kv_cache_usage_perc`; cached blocks no request holds count as free,
    /// as there).
    pub const KV_CACHE_USAGE: &str = "kvbm_kv_cache_usage_ratio";
    /// Counter: preemptions (vLLM `num_preemptions`).
    pub const PREEMPTIONS: &str = "kvbm_num_preemptions_total";
    /// Counter: cached blocks evicted to make room (no vLLM counterpart).
    pub const EVICTIONS: &str = "kvbm_evictions_total";
    /// Gauge: requests running (vLLM `num_requests_running`).
    pub const REQUESTS_RUNNING: &str = "kvbm_requests_running";
    /// Gauge: requests waiting, new or preempted (vLLM
    /// `num_requests_waiting`).
    pub const REQUESTS_WAITING: &str = "kvbm_requests_waiting";
    /// Histogram, seconds: arrival to first token (vLLM
    /// `time_to_first_token_seconds`). The scheduler has no clock; the
    /// application records it (kvbm-sim in simulated time).
    pub const TIME_TO_FIRST_TOKEN: &str = "kvbm_time_to_first_token_seconds";
    /// Counter: tokens generated (vLLM `generation_tokens`).
    pub const GENERATION_TOKENS: &str = "kvbm_request_generation_tokens_total";

    /// vLLM's bucket bounds for `time_to_first_token_seconds`.
    pub const TTFT_BUCKETS: &[f64] = &[
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
    ];
}

/// Registers each series' unit and description with the installed recorder
/// (an exporter prints them as `# HELP`). Call once, after installing it.
pub fn describe_metrics() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        names::PREFIX_CACHE_QUERIES,
        Unit::Count,
        "Prompt tokens looked up in the prefix cache at first admission."
    );
    describe_counter!(
        names::PREFIX_CACHE_HITS,
        Unit::Count,
        "Prompt tokens found in the prefix cache at first admission."
    );
    describe_gauge!(
        names::KV_CACHE_USAGE,
        Unit::Count,
        "Fraction of KV blocks in use (0-1)."
    );
    describe_counter!(names::PREEMPTIONS, Unit::Count, "Preemptions.");
    describe_counter!(
        names::EVICTIONS,
        Unit::Count,
        "Cached blocks evicted to make room."
    );
    describe_gauge!(names::REQUESTS_RUNNING, Unit::Count, "Requests running.");
    describe_gauge!(names::REQUESTS_WAITING, Unit::Count, "Requests waiting.");
    describe_histogram!(
        names::TIME_TO_FIRST_TOKEN,
        Unit::Seconds,
        "Arrival to first token."
    );
    describe_counter!(names::GENERATION_TOKENS, Unit::Count, "Tokens generated.");
}

/// The scheduler's metric labels, its handles (resolved at its first
/// recording, with the labels), and the totals it last reported, so each
/// step records only deltas.
#[derive(Debug, Default)]
pub(super) struct Telemetry {
    labels: Vec<Label>,
    handles: Option<Handles>,
    recorded: Recorded,
    /// Turned off by the application: no recording at all.
    off: bool,
}

#[derive(Debug)]
struct Handles {
    queries: Counter,
    hits: Counter,
    usage: Gauge,
    preemptions: Counter,
    evictions: Counter,
    running: Gauge,
    waiting: Gauge,
    generation_tokens: Counter,
}

#[derive(Clone, Copy, Debug, Default)]
struct Recorded {
    queries: u64,
    hits: u64,
    preemptions: u64,
    evictions: u64,
    generation_tokens: u64,
}

impl Handles {
    /// Handles from the recorder installed now, every series with `labels`.
    fn new(labels: &[Label]) -> Self {
        let labels = labels.to_vec();
        Self {
            queries: metrics::counter!(names::PREFIX_CACHE_QUERIES, labels.clone()),
            hits: metrics::counter!(names::PREFIX_CACHE_HITS, labels.clone()),
            usage: metrics::gauge!(names::KV_CACHE_USAGE, labels.clone()),
            preemptions: metrics::counter!(names::PREEMPTIONS, labels.clone()),
            evictions: metrics::counter!(names::EVICTIONS, labels.clone()),
            running: metrics::gauge!(names::REQUESTS_RUNNING, labels.clone()),
            waiting: metrics::gauge!(names::REQUESTS_WAITING, labels.clone()),
            generation_tokens: metrics::counter!(names::GENERATION_TOKENS, labels),
        }
    }
}

impl Telemetry {
    /// Brings every series up to `census` and the pool's counts.
    fn record(&mut self, census: &Census, in_use: usize, total: usize, evictions: u64) {
        let handles = self
            .handles
            .get_or_insert_with(|| Handles::new(&self.labels));
        let recorded = &mut self.recorded;
        let advance = |counter: &Counter, seen: &mut u64, now: u64| {
            counter.increment(now.saturating_sub(*seen));
            *seen = now;
        };
        advance(
            &handles.queries,
            &mut recorded.queries,
            census.prefix_cache_queries,
        );
        advance(&handles.hits, &mut recorded.hits, census.prefix_cache_hits);
        advance(
            &handles.preemptions,
            &mut recorded.preemptions,
            census.preemptions,
        );
        advance(&handles.evictions, &mut recorded.evictions, evictions);
        advance(
            &handles.generation_tokens,
            &mut recorded.generation_tokens,
            census.generated_tokens,
        );
        handles.running.set(census.running as f64);
        handles.waiting.set(census.waiting as f64);
        handles.usage.set(if total == 0 {
            0.0
        } else {
            in_use as f64 / total as f64
        });
    }
}

impl<M> Scheduler<M> {
    /// Records every series with `labels` (cluster simulations label each
    /// engine: `engine="3"`). The handles are resolved at the next
    /// recording (the end of the next `step` or `apply`), from the recorder
    /// installed then; what was counted before goes on under the old labels.
    pub fn set_metric_labels(&mut self, labels: impl IntoIterator<Item = (String, String)>) {
        self.telemetry.labels = labels
            .into_iter()
            .map(|(key, value)| Label::new(key, value))
            .collect();
        self.telemetry.handles = None;
    }

    /// Records metrics (the default) or not. Off, a step skips reading the
    /// queue's and the pool's counts under their locks, which it does even
    /// when no recorder is installed (the `metrics` facade cannot tell a
    /// no-op recorder): for an application that exports no metrics and
    /// steps millions of times, as a cluster simulation does. Turned back
    /// on, counters resume from the totals at the next step.
    pub fn set_metrics_enabled(&mut self, enabled: bool) {
        self.telemetry.off = !enabled;
    }

    /// Records the census and the pool's state, once per step, after
    /// `apply`: admissions, preemptions, finishes and evictions of the step
    /// all show then. (Twice per step cost a light-load replay, one request
    /// per step, 3.7% of its instructions with no recorder installed.)
    pub(super) fn record_metrics(&mut self) {
        if self.telemetry.off {
            return;
        }
        let census = self.census();
        let pool = self.manager.metrics();
        self.telemetry.record(
            &census,
            pool.in_use_blocks,
            pool.total_blocks,
            pool.evictions,
        );
    }
}
