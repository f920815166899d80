//! The metrics the `Scheduler` records through the `metrics` facade: after
//! a workload with preemptions, every series equals the census and the
//! pool's own counts, under the labels asked for.

use std::collections::HashMap;

use kvbm_queue::{GenerationReserve, SchedulerConfig, metric_names};
use metrics::{Key, Label};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use super::scheduler::{request, run, scheduler};

/// What was recorded under the label `engine="3"`, by name: counters summed
/// over snapshots (a snapshot takes what was counted since the last one),
/// gauges as last set.
#[derive(Default)]
struct Seen {
    counters: HashMap<String, u64>,
    gauges: HashMap<String, f64>,
}

impl Seen {
    fn take(&mut self, snapshotter: &Snapshotter) {
        let engine = [Label::new("engine", "3")];
        for (key, .., value) in snapshotter.snapshot().into_vec() {
            let key: &Key = key.key();
            assert!(key.labels().eq(engine.iter()), "{key:?} lacks its label");
            let name = key.name().to_owned();
            match value {
                DebugValue::Counter(n) => *self.counters.entry(name).or_default() += n,
                DebugValue::Gauge(x) => {
                    self.gauges.insert(name, x.into_inner());
                }
                DebugValue::Histogram(_) => {}
            }
        }
    }
}

#[test]
fn every_series_ends_equal_to_the_census_and_the_pool() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let config = SchedulerConfig::default().with_reserve(GenerationReserve::Capped(0));
    let mut s = scheduler(6, config);
    s.set_metric_labels([("engine".to_owned(), "3".to_owned())]);
    // Two requests that cannot both fit: one is preempted and resumes; a
    // third shares the first one's first block.
    s.submit(request(1, 0..8, 8)).unwrap();
    s.submit(request(2, 100..108, 8)).unwrap();
    s.submit(request(3, 0..10, 2)).unwrap();
    let mut seen = Seen::default();
    let mut most_running = 0.0f64;
    // The handles resolve at the first recording, with this recorder.
    metrics::with_local_recorder(&recorder, || run(&mut s));
    seen.take(&snapshotter);
    while !s.is_idle() {
        run(&mut s);
        seen.take(&snapshotter);
        most_running = most_running.max(seen.gauges[metric_names::REQUESTS_RUNNING]);
        let usage = seen.gauges[metric_names::KV_CACHE_USAGE];
        assert!((0.0..=1.0).contains(&usage), "{usage}");
    }
    let census = s.census();
    assert!(census.preemptions > 0, "the scenario preempts");
    let pool = s.manager().metrics();
    let expect = [
        (
            metric_names::PREFIX_CACHE_QUERIES,
            census.prefix_cache_queries,
        ),
        (metric_names::PREFIX_CACHE_HITS, census.prefix_cache_hits),
        (metric_names::PREEMPTIONS, census.preemptions),
        (metric_names::EVICTIONS, pool.evictions),
        (metric_names::GENERATION_TOKENS, census.generated_tokens),
    ];
    for (name, want) in expect {
        assert_eq!(seen.counters.get(name).copied(), Some(want), "{name}");
    }
    // First admissions only: 8 + 8 + 10 prompt tokens; request 3 found
    // request 1's first block (4 tokens) cached.
    assert_eq!(census.prefix_cache_queries, 26);
    assert!(census.prefix_cache_hits >= 4);
    assert!(
        census.prompt_tokens > census.prefix_cache_queries,
        "resumptions count there"
    );
    assert_eq!(census.generated_tokens, 18);
    for gauge in [
        metric_names::REQUESTS_RUNNING,
        metric_names::REQUESTS_WAITING,
        metric_names::KV_CACHE_USAGE,
    ] {
        assert_eq!(seen.gauges[gauge], 0.0, "{gauge}");
    }
}

/// With metrics off nothing is recorded, even with a recorder installed;
/// turned back on, the counters catch up to the totals at the next step.
#[test]
fn metrics_off_record_nothing_and_resume_at_the_totals() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let mut s = scheduler(6, SchedulerConfig::default());
    s.set_metric_labels([("engine".to_owned(), "3".to_owned())]);
    s.set_metrics_enabled(false);
    s.submit(request(1, 0..8, 4)).unwrap();
    metrics::with_local_recorder(&recorder, || run(&mut s));
    run(&mut s);
    let mut seen = Seen::default();
    seen.take(&snapshotter);
    assert!(seen.counters.is_empty() && seen.gauges.is_empty());
    let generated = s.census().generated_tokens;
    assert!(generated > 0, "the steps ran");
    s.set_metrics_enabled(true);
    metrics::with_local_recorder(&recorder, || run(&mut s));
    seen.take(&snapshotter);
    assert_eq!(
        seen.counters[metric_names::GENERATION_TOKENS],
        s.census().generated_tokens
    );
}
