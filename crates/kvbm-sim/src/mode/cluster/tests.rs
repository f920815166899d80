//! Cluster mode against serve mode, on hand-made and excerpt traces, and a
//! property over arbitrary small traces: every request ends somewhere, the
//! router's index ends equal to the engines' pools.

use std::num::NonZeroUsize;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::{Capacity, RequestTimeline, ServeConfig, TraceRequest};

/// The conversation excerpt's first `requests` requests.
pub(super) fn excerpt(requests: usize) -> Trace {
    let mut trace = Trace::conversation_excerpt().unwrap();
    trace.truncate(NonZeroUsize::new(requests).unwrap());
    trace
}

/// A small engine that audits its pool every 50 steps.
pub(super) fn engine() -> ServeConfig {
    ServeConfig::new(16, Capacity::Tokens(400_000)).with_audit_every(50)
}

#[test]
fn policy_names_round_trip_and_unknown_ones_are_typed() {
    for policy in PolicyKind::ALL {
        assert_eq!(PolicyKind::parse(policy.name()).unwrap(), policy);
    }
    assert!(matches!(
        PolicyKind::parse("fastest"),
        Err(SimError::UnknownPolicy { name }) if name == "fastest"
    ));
}

#[test]
fn zero_engines_huge_clusters_and_bad_engine_configs_are_typed_errors() {
    let trace = excerpt(5);
    let none = ClusterConfig::new(0, engine());
    assert!(matches!(replay(&trace, &none), Err(SimError::ZeroEngines)));
    // More blocks in all than one pool may hold, however it is reached:
    // refused before anything is allocated.
    for (engines, blocks) in [
        (usize::MAX, 1),
        (2, kvbm_blocks::MAX_BLOCKS as u64),
        (1 << 20, 1 << 20),
    ] {
        let huge = ClusterConfig::new(engines, ServeConfig::new(16, Capacity::Blocks(blocks)));
        assert!(
            matches!(
                replay(&trace, &huge),
                Err(SimError::ClusterTooLarge { engines: e, .. }) if e == engines
            ),
            "{engines} x {blocks}"
        );
    }
    for value in [f64::NAN, f64::INFINITY, -1.0] {
        let weight = ClusterConfig::new(2, engine()).with_overlap_weight(value);
        assert!(matches!(
            replay(&trace, &weight),
            Err(SimError::InvalidRouting {
                name: "overlap weight",
                ..
            })
        ));
        let temperature = ClusterConfig::new(2, engine()).with_temperature(value);
        assert!(matches!(
            replay(&trace, &temperature),
            Err(SimError::InvalidRouting {
                name: "temperature",
                ..
            })
        ));
    }
    let bad_block = ClusterConfig::new(2, ServeConfig::new(7, Capacity::Tokens(1_000)));
    assert!(matches!(
        replay(&trace, &bad_block),
        Err(SimError::InvalidBlockSize { block_size: 7 })
    ));
}

#[test]
fn one_engine_cluster_is_serve_mode() {
    // With one engine every policy routes everything to it, and the replay
    // must be the serve-mode replay, request by request.
    let trace = excerpt(120);
    let serve = engine().run(&trace).unwrap();
    let cluster = replay(&trace, &ClusterConfig::new(1, engine())).unwrap();
    for run in &cluster.runs {
        assert_eq!(run.requests, serve.requests, "{}", run.policy.name());
        assert_eq!(run.hits, serve.hits);
        assert_eq!(
            (run.ttft, run.tpot, run.e2e),
            (serve.ttft, serve.tpot, serve.e2e)
        );
        assert_eq!(run.preemptions, serve.preemptions);
        assert_eq!(run.evictions, serve.evictions);
        assert_eq!(run.busy, vec![serve.busy_time]);
        assert_eq!(run.load_imbalance(), 1.0);
    }
}

/// `conversations` multi-turn conversations of `turns` turns, 2 s apart:
/// each turn's prompt is the previous one's plus two trace blocks.
fn conversations(conversations: u64, turns: u64) -> Trace {
    let mut requests = Vec::new();
    for turn in 0..turns {
        for conversation in 0..conversations {
            let blocks = 2 * (turn + 1);
            requests.push(TraceRequest {
                timestamp: turn * 2_000 + conversation * 10,
                input_length: blocks * 512,
                output_length: 8,
                hash_ids: (0..blocks).map(|b| conversation * 1_000 + b).collect(),
                priority: None,
            });
        }
    }
    Trace::from_requests(requests).unwrap()
}

/// Six turns of twelve conversations over four engines of `engine`,
/// random then kv-aware: kv-aware routing must find clearly more of the
/// cache, and every request must finish.
fn kv_aware_beats_random(engine: ServeConfig) {
    let trace = conversations(12, 6);
    let config =
        ClusterConfig::new(4, engine).with_policies(vec![PolicyKind::Random, PolicyKind::KvAware]);
    let report = replay(&trace, &config).unwrap();
    let [random, kv_aware] = &report.runs[..] else {
        panic!("two runs");
    };
    assert!(
        kv_aware.hits.token_hit_rate() > random.hits.token_hit_rate() + 0.05,
        "kv-aware {} vs random {}",
        kv_aware.hits.token_hit_rate(),
        random.hits.token_hit_rate()
    );
    for run in &report.runs {
        assert_eq!(run.routed.iter().sum::<u64>(), 72);
        assert_eq!(run.finished_requests, 72);
    }
}

#[test]
fn kv_aware_routing_finds_more_of_the_cache_than_random() {
    kv_aware_beats_random(engine());
}

#[test]
fn a_cluster_of_a_models_groups_routes_on_its_full_attention_blocks() {
    // gpt-oss-120b engines: their events name each block's group, the
    // router scores on the full-attention one, and kv-aware routing finds
    // the conversations' prefixes as it does for one group.
    let model = crate::KvModel::preset("gpt-oss-120b").unwrap();
    kv_aware_beats_random(engine().with_kv(crate::KvSetup::new(model, 2_000_000_000)));
}

/// The replay without its wall-clock time, to compare two replays.
pub(super) fn timeless(mut report: ClusterReport) -> ClusterReport {
    for run in &mut report.runs {
        run.replay_time = Duration::ZERO;
    }
    report
}

#[test]
fn round_robin_routes_in_turn_and_replays_are_deterministic() {
    let trace = excerpt(40);
    let config = ClusterConfig::new(4, engine());
    let first = timeless(replay(&trace, &config.clone().with_threads(Some(3))).unwrap());
    let second = timeless(replay(&trace, &config.with_threads(Some(1))).unwrap());
    // Threads change nothing: each engine steps on its own between arrivals.
    assert_eq!(first, second);
    let round_robin = &first.runs[1];
    assert_eq!(round_robin.policy, PolicyKind::RoundRobin);
    assert_eq!(round_robin.routed, vec![10; 4]);
    let json = first.to_json();
    assert_eq!(json["runs"].as_array().unwrap().len(), 4);
    for key in [
        "ttft",
        "tpot",
        "token_hit_rate",
        "finished_requests",
        "requests",
        "load_imbalance",
    ] {
        assert!(!json["runs"][3][key].is_null(), "{key}");
    }
    assert!(first.svg().unwrap().starts_with("<svg"));
}

fn arbitrary_request() -> impl Strategy<Value = TraceRequest> {
    (
        0u64..2_000,
        prop::collection::vec(0u64..12, 0..6),
        1u64..=512,
        0u64..40,
    )
        .prop_map(
            |(timestamp, hash_ids, last_block, output_length)| TraceRequest {
                timestamp,
                // Consistent with the blocks, as the trace requires.
                input_length: (hash_ids.len() as u64).saturating_sub(1) * 512
                    + if hash_ids.is_empty() { 0 } else { last_block },
                output_length,
                hash_ids,
                priority: None,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any trace, any engine count, any policy, small pools that preempt
    /// and evict: every request ends finished or refused, the routed counts
    /// add up, and (checked inside the replay) the router's index equals
    /// every engine's registry; stepping the engines on three threads
    /// replays exactly what one thread does.
    #[test]
    fn every_request_ends_and_the_router_stays_in_sync(
        requests in prop::collection::vec(arbitrary_request(), 1..30),
        engines in 1usize..5,
        capacity in 40u64..400,
        policy in prop::sample::select(PolicyKind::ALL.to_vec()),
    ) {
        let trace = Trace::from_requests(requests).unwrap();
        let config = ClusterConfig::new(
            engines,
            ServeConfig::new(16, Capacity::Blocks(capacity)).with_audit_every(1),
        )
        .with_policies(vec![policy]);
        let report = timeless(replay(&trace, &config.clone().with_threads(Some(1))).unwrap());
        let threaded = timeless(replay(&trace, &config.with_threads(Some(3))).unwrap());
        prop_assert_eq!(&report, &threaded, "threads changed the replay");
        let run = &report.runs[0];
        prop_assert_eq!(run.routed.iter().sum::<u64>(), trace.len() as u64);
        prop_assert!(run.requests.iter().all(|r| r.outcome != ServeOutcome::Pending));
        let refused = run.requests.iter().filter(|r| !r.outcome.was_accepted()).count() as u64;
        prop_assert_eq!(run.hits.requests + refused, trace.len() as u64);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Any small trace, engine count, policy, pool (tight ones preempt and
    /// evict) and audit schedule: the cluster replays the same with
    /// decodes in place (`ServeConfig`'s `in_place`) as without.
    #[test]
    fn cluster_replays_are_the_same_with_decodes_in_place(
        requests in prop::collection::vec(arbitrary_request(), 1..24),
        engines in 1usize..4,
        capacity in 40u64..600,
        block_size in prop::sample::select(vec![16usize, 64]),
        audit in prop::sample::select(vec![0u64, 1, 5]),
        policy in prop::sample::select(PolicyKind::ALL.to_vec()),
    ) {
        let trace = Trace::from_requests(requests).unwrap();
        let engine = ServeConfig::new(block_size, Capacity::Blocks(capacity))
            .with_audit_every(audit);
        let run = |in_place: bool| {
            let engine = ServeConfig { in_place, ..engine };
            let config = ClusterConfig::new(engines, engine)
                .with_policies(vec![policy])
                .with_threads(Some(1));
            timeless(replay(&trace, &config).unwrap())
        };
        prop_assert_eq!(run(false), run(true));
    }
}

#[test]
fn the_table_counts_every_request_and_the_refused_ones() {
    // 100-block pools refuse the excerpt's long prompts as too large.
    let trace = excerpt(10);
    let config = ClusterConfig::new(2, ServeConfig::new(16, Capacity::Blocks(100)))
        .with_policies(vec![PolicyKind::RoundRobin]);
    let report = replay(&trace, &config).unwrap();
    let run = &report.runs[0];
    assert_eq!(run.finished_requests + run.rejected_requests, 10);
    assert!(run.rejected_requests > 0);
    let table = report.to_string();
    assert!(table.contains("2 engines, 10 requests,"), "{table}");
    let row = table.lines().last().unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    // policy, TTFT mean/p50/p90/p99 and TPOT (value and unit each), hit
    // rate, then finished and refused.
    assert_eq!(cells[0], "round-robin", "{row}");
    assert_eq!(cells[12], run.finished_requests.to_string(), "{row}");
    assert_eq!(cells[13], run.rejected_requests.to_string(), "{row}");
}

#[test]
fn the_latest_timestamp_routes_and_replays_exactly() {
    // Serve mode's boundary trace through a cluster: both requests finish
    // with the same samples they have in serve mode.
    let trace = Trace::from_requests(
        [(0, 1), (crate::MAX_TIMESTAMP_MS, 2)]
            .map(|(timestamp, id)| TraceRequest {
                timestamp,
                input_length: 100,
                output_length: 4,
                hash_ids: vec![id],
                priority: None,
            })
            .to_vec(),
    )
    .unwrap();
    let serve = engine().run(&trace).unwrap();
    assert_eq!(serve.ttft.count, 2);
    let report = replay(&trace, &ClusterConfig::new(2, engine())).unwrap();
    let times = |r: &RequestTimeline| (r.arrival, r.first_token, r.finished, r.outcome);
    for run in &report.runs {
        // (Admission ranks count per engine.)
        assert!(
            run.requests
                .iter()
                .map(times)
                .eq(serve.requests.iter().map(times)),
            "{}",
            run.policy.name()
        );
        assert_eq!(
            (run.ttft, run.tpot, run.e2e),
            (serve.ttft, serve.tpot, serve.e2e)
        );
        assert_eq!(run.finished_requests, 2);
        assert_eq!(run.sim_duration, serve.sim_duration);
    }
}

/// A trace shaped like the full conversation trace (12,031 requests,
/// 144.8M prompt tokens, 24 trace blocks each on average): what the
/// README's 16-engine replay works on.
fn conversation_sized() -> Trace {
    let requests = (0..12_031u64)
        .map(|i| TraceRequest {
            timestamp: i * 300,
            input_length: 12_035,
            output_length: 343,
            hash_ids: (0..24).map(|b| i * 24 + b).collect(),
            priority: None,
        })
        .collect();
    Trace::from_requests(requests).unwrap()
}

#[test]
fn the_memory_estimate_admits_the_documented_clusters_and_refuses_typos() {
    let budget = ClusterConfig::DEFAULT_MEMORY_BUDGET;
    let excerpt = Trace::conversation_excerpt().unwrap();
    // The default cluster on the excerpt, and the README's 16 engines on
    // the full trace (measured: 241 MB and 421 MB at most), fit with room.
    let default = ClusterConfig::default();
    let estimate = default.memory_estimate(&excerpt).unwrap();
    assert!(
        estimate > 241_000_000 && estimate < budget / 10,
        "{estimate}"
    );
    let full = default.memory_estimate(&conversation_sized()).unwrap();
    assert!(full > 421_000_000 && full < budget / 4, "{full}");
    // Engines cost in proportion: twice the engines, about twice the bytes.
    let double = ClusterConfig::new(32, ServeConfig::default());
    let doubled = double.memory_estimate(&excerpt).unwrap();
    assert!(
        doubled > estimate * 7 / 5 && doubled < estimate * 2,
        "{doubled}"
    );
    // `--engines 20000` (for 20) and a million one-block engines: refused
    // before anything is built, naming the estimate and the budget.
    let typo = ClusterConfig::new(20_000, ServeConfig::default());
    let tiny = ClusterConfig::new(1_000_000, ServeConfig::new(16, Capacity::Blocks(1)));
    for config in [typo, tiny] {
        let estimate = config.memory_estimate(&excerpt).unwrap();
        assert!(estimate > budget, "{estimate}");
        match replay(&excerpt, &config) {
            Err(SimError::ClusterMemory {
                engines,
                estimate_bytes,
                budget_bytes,
                ..
            }) => {
                assert_eq!(engines, config.engines);
                assert_eq!((estimate_bytes, budget_bytes), (estimate, budget));
            }
            other => panic!("{other:?}"),
        }
        // A budget above the estimate lets the check through (not run here:
        // the machine could not hold it); the estimate never overflows.
        assert!(
            config
                .clone()
                .with_memory_budget(estimate)
                .validate()
                .is_ok()
        );
    }
    // Past what validation lets through, the estimate saturates.
    let most = ClusterConfig::new(usize::MAX, ServeConfig::default());
    assert_eq!(memory::estimate(&most, usize::MAX, &excerpt), u64::MAX);
    // A small cluster under a budget below its estimate is refused too.
    let small = ClusterConfig::new(2, engine()).with_memory_budget(1_000);
    assert!(matches!(
        replay(&excerpt, &small),
        Err(SimError::ClusterMemory {
            budget_bytes: 1_000,
            ..
        })
    ));
}

#[test]
fn memory_limits_are_validated() {
    for gigabytes in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e-10, 2e6, 1e300] {
        assert!(
            matches!(
                ClusterConfig::default().with_memory_limit_gb(gigabytes),
                Err(SimError::InvalidMemoryLimit { value }) if value.to_bits() == gigabytes.to_bits()
            ),
            "{gigabytes}"
        );
    }
    let config = ClusterConfig::default().with_memory_limit_gb(1.5).unwrap();
    assert_eq!(config.memory_budget, 1_500_000_000);
    let most = ClusterConfig::default().with_memory_limit_gb(1e6).unwrap();
    assert_eq!(most.memory_budget, ClusterConfig::MAX_MEMORY_BUDGET);
    for bytes in [0, ClusterConfig::MAX_MEMORY_BUDGET + 1] {
        let config = ClusterConfig::default().with_memory_budget(bytes);
        assert!(matches!(
            config.validate(),
            Err(SimError::InvalidMemoryLimit { .. })
        ));
    }
}
