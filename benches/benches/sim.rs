//! kvbm-sim's replay loops: cache mode beside kvbm-logical 1.6.1, and serve
//! mode (kvbm alone: the peer has no scheduler).
//!
//! Each iteration replays a whole workload through a fresh, empty cache
//! (built in the untimed setup): match, allocate with eviction, stage,
//! register, release tail first, for every request. Parsing the trace and
//! splitting it into blocks happen once, outside the timing; the
//! `sim_trace_load` group times them separately.
//!
//! Workloads: kvbm-sim's embedded excerpt (500 requests) always, and the
//! full Mooncake conversation trace (12,031 requests) when it is present at
//! `../shared/traces/conversation_trace.jsonl` beside the workspace root and
//! the run is a real `cargo bench` (the `cargo test --benches` smoke run
//! stays quick on the excerpt alone).
//!
//! Serve mode (`sim_serve_*` groups) replays the same traces through the
//! continuous-batching `Scheduler` in simulated time with the default
//! scheduler limits and step-time model, at block size 16: with a 3M-token
//! pool (the trace fits: no preemption) and a 1M-token pool (preemptions).
//! Each iteration builds a fresh pool and scheduler and replays every
//! request to completion: prompt synthesis, admission, chunked prefill,
//! decode, preemption, finish. The issue's target is the full conversation
//! trace in under 5 s.
//!
//! ```text
//! cargo bench -p kvbm-benches --bench sim
//! ```

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvbm_benches::is_smoke_test;
use kvbm_blocks::EventMessage;
use kvbm_sim::mode::serve;
use kvbm_sim::{
    CacheSim, Capacity, EventSink, Eviction, KvEventCounts, NoProgress, ServeConfig, SimError,
    Trace, Workload,
};

#[path = "../examples/peer_cache_sweep.rs"]
#[allow(dead_code)] // the example's `main` and option parsing
mod peer;

use kvbm_logical::blocks::BlockDuplicationPolicy;

const BLOCK_SIZE: usize = 512;
/// The Mooncake paper's smallest cache: 6,000 blocks of 512 tokens = 3M tokens.
const CAPACITY_BLOCKS: usize = 6_000;

/// A workload to replay, with what the peer needs of it.
struct Case {
    name: &'static str,
    trace: Option<std::path::PathBuf>,
    requests: Trace,
    workload: Workload,
    peer_requests: Vec<Vec<kvbm_logical::SequenceHash>>,
    distinct_blocks: usize,
}

fn cases() -> Vec<Case> {
    let mut traces: Vec<(&'static str, Option<std::path::PathBuf>)> = vec![("excerpt", None)];
    let full = peer::default_trace_path();
    if !is_smoke_test() && full.exists() {
        traces.push(("conversation", Some(full)));
    }
    traces
        .into_iter()
        .filter_map(|(name, path)| {
            let trace = match &path {
                Some(path) => Trace::from_path(path),
                None => Trace::conversation_excerpt(),
            };
            let loaded = trace.and_then(|trace| {
                let workload = Workload::new(&trace, BLOCK_SIZE)?;
                Ok((trace, workload))
            });
            match loaded {
                Ok((requests, workload)) => Some(Case {
                    name,
                    trace: path,
                    requests,
                    peer_requests: peer::logical_hashes(&workload),
                    distinct_blocks: workload.distinct_blocks(),
                    workload,
                }),
                Err(err) => {
                    eprintln!("skipping the {name} trace: {err}");
                    None
                }
            }
        })
        .collect()
}

fn replay_kvbm(sim: &mut CacheSim, workload: &Workload) -> u64 {
    replay_each(sim, workload, || {});
    sim.hits().hit_blocks
}

/// Replays every request of `workload`, calling `after` after each.
fn replay_each(sim: &mut CacheSim, workload: &Workload, mut after: impl FnMut()) {
    for request in workload.requests() {
        if let Err(err) = sim.replay_request(&request) {
            panic!("kvbm replay failed: {err}");
        }
        after();
    }
}

/// The replay with a subscriber counting every batch, drained after each
/// request as a publisher would; returns the stored blocks it saw.
fn replay_kvbm_with_events(sim: &mut CacheSim, workload: &Workload) -> u64 {
    let subscription = sim.subscribe_events(EVENT_CAPACITY);
    let mut counts = KvEventCounts::default();
    replay_each(sim, workload, || {
        while let Some(message) = subscription.try_recv() {
            counts.record(&message);
        }
    });
    assert_eq!(subscription.missed_batches(), 0);
    counts.stored_blocks
}

/// A subscription's bound in the event benches (kvbm-sim's own).
const EVENT_CAPACITY: usize = 1024;

/// A serve replay's events, counted as they come (one message per step).
#[derive(Default)]
struct CountingSink(KvEventCounts);

impl EventSink for CountingSink {
    fn publish(&mut self, message: &EventMessage) -> Result<(), SimError> {
        self.0.record(message);
        Ok(())
    }
}

fn bench_replay(c: &mut Criterion, cases: &[Case], label: &str, capacity: impl Fn(&Case) -> usize) {
    let mut group = c.benchmark_group(format!("sim_cache_replay_{label}"));
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    for case in cases {
        let blocks = capacity(case);
        group.throughput(Throughput::Elements(case.workload.len() as u64));
        group.bench_function(BenchmarkId::new("kvbm", case.name), |b| {
            b.iter_batched(
                || CacheSim::new(BLOCK_SIZE, blocks, Eviction::Lru).expect("cache"),
                |mut sim| black_box(replay_kvbm(&mut sim, &case.workload)),
                BatchSize::PerIteration,
            );
        });
        // With a subscriber drained after every request: what events cost.
        group.bench_function(BenchmarkId::new("kvbm+events", case.name), |b| {
            b.iter_batched(
                || CacheSim::new(BLOCK_SIZE, blocks, Eviction::Lru).expect("cache"),
                |mut sim| black_box(replay_kvbm_with_events(&mut sim, &case.workload)),
                BatchSize::PerIteration,
            );
        });
        group.bench_function(BenchmarkId::new("kvbm-logical", case.name), |b| {
            b.iter_batched(
                || {
                    peer::logical_manager(
                        blocks,
                        BLOCK_SIZE,
                        Eviction::Lru,
                        BlockDuplicationPolicy::Allow,
                    )
                    .expect("kvbm-logical pool")
                },
                |manager| {
                    let report = peer::replay_logical(&manager, &case.peer_requests)
                        .expect("kvbm-logical replay");
                    black_box(report.hit_blocks)
                },
                BatchSize::PerIteration,
            );
        });
    }
    group.finish();
}

fn bench_cache_replay(c: &mut Criterion) {
    let cases = cases();
    bench_replay(c, &cases, "lru_6k", |_| CAPACITY_BLOCKS);
    // Unbounded: room for every distinct block, so nothing is evicted.
    bench_replay(c, &cases, "unbounded", |case| case.distinct_blocks);

    // What the replay numbers leave out: reading the JSONL and splitting it.
    let mut group = c.benchmark_group("sim_trace_load");
    group.sample_size(10);
    for case in &cases {
        group.throughput(Throughput::Elements(case.workload.len() as u64));
        group.bench_function(BenchmarkId::new("parse", case.name), |b| {
            b.iter(|| match &case.trace {
                Some(path) => Trace::from_path(path).expect("trace"),
                None => Trace::conversation_excerpt().expect("excerpt"),
            });
        });
        let trace = match &case.trace {
            Some(path) => Trace::from_path(path).expect("trace"),
            None => Trace::conversation_excerpt().expect("excerpt"),
        };
        group.bench_function(BenchmarkId::new("split", case.name), |b| {
            b.iter(|| Workload::new(black_box(&trace), BLOCK_SIZE).expect("workload"));
        });
    }
    group.finish();
}

/// Block size of the serve-mode benches: vLLM's default page size.
const SERVE_BLOCK_SIZE: usize = 16;

fn bench_serve(c: &mut Criterion, cases: &[Case], label: &str, capacity_tokens: u64) {
    let mut group = c.benchmark_group(format!("sim_serve_{label}"));
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    let config = ServeConfig::new(SERVE_BLOCK_SIZE, Capacity::Tokens(capacity_tokens));
    for case in cases {
        group.throughput(Throughput::Elements(case.requests.len() as u64));
        // A full-trace iteration takes seconds: give criterion room for ten.
        if case.requests.len() > 1_000 {
            group.measurement_time(Duration::from_secs(60));
        }
        group.bench_function(BenchmarkId::new("kvbm", case.name), |b| {
            b.iter(|| {
                let report = config.run(&case.requests).expect("serve replay");
                assert_eq!(report.finished_requests(), case.requests.len() as u64);
                black_box(report.output_tokens)
            });
        });
        // With the pool's events subscribed to and drained every step (the
        // replay thread's share of `--kv-events`; encoding and the socket
        // run on a thread of their own there).
        group.bench_function(BenchmarkId::new("kvbm+events", case.name), |b| {
            b.iter(|| {
                let mut sink = CountingSink::default();
                let report = serve::replay_with_events(
                    &case.requests,
                    &config,
                    &mut NoProgress,
                    Some(&mut sink),
                )
                .expect("serve replay");
                assert_eq!(report.finished_requests(), case.requests.len() as u64);
                black_box((report.output_tokens, sink.0.stored_blocks))
            });
        });
    }
    group.finish();
}

fn bench_serve_replay(c: &mut Criterion) {
    let cases = cases();
    bench_serve(c, &cases, "3M_bs16", 3_000_000);
    bench_serve(c, &cases, "1M_bs16", 1_000_000);
}

criterion_group!(benches, bench_cache_replay, bench_serve_replay);
criterion_main!(benches);
