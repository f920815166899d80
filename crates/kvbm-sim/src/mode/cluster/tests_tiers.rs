//! Cluster mode with tiers: engines with host tiers whose events reach the
//! router under their medium, a pool shared by every engine that one engine
//! fills and another loads from, Mooncake's global cache-aware policy, and
//! determinism and validation with them.

use super::tests::timeless;
use super::*;
use crate::{Capacity, Link, ServeConfig, TierSetup, TraceRequest};

/// The same 8-block prompt twice, 5 s apart, then four cold prompts.
fn trace() -> Trace {
    let prompt = |timestamp, first: u64| TraceRequest {
        timestamp,
        input_length: 8 * 512,
        output_length: 4,
        hash_ids: (first..first + 8).collect(),
        priority: None,
    };
    let mut requests = vec![prompt(0, 0), prompt(5_000, 0)];
    requests.extend((1..5).map(|i| prompt(6_000 + i * 100, i * 100)));
    Trace::from_requests(requests).unwrap()
}

fn engine() -> ServeConfig {
    ServeConfig::new(16, Capacity::Tokens(40_000)).with_audit_every(1)
}

#[test]
fn engines_with_host_tiers_keep_the_router_in_sync_on_every_medium() {
    let engine = engine().with_tiers(TierSetup::default().with_host_tokens(1 << 20));
    let config = ClusterConfig::new(3, engine).with_policies(PolicyKind::ALL.to_vec());
    // check_router compares every engine's device and host blocks with the
    // router's, every medium counted: a medium lost on the way fails it.
    let report = replay(&trace(), &config).unwrap();
    for run in &report.runs {
        assert_eq!(run.finished_requests, 6, "{}", run.policy.name());
        assert!(run.tiers.is_some());
    }
}

#[test]
fn a_shared_pool_serves_one_engine_what_another_computed() {
    // Round-robin sends the repeated prompt to another engine, which loads
    // it from the pool the first engine stored it in.
    let config = ClusterConfig::new(2, engine())
        .with_policies(vec![PolicyKind::RoundRobin, PolicyKind::GlobalKv])
        .with_global_pool_tokens(1 << 20);
    let report = replay(&trace(), &config).unwrap();
    let [round_robin, global] = &report.runs[..] else {
        panic!("two runs")
    };
    assert_eq!(round_robin.routed, [3, 3]);
    let tiers = round_robin.tiers.unwrap();
    assert_eq!(
        tiers.remote_hit_tokens,
        8 * 512 - 16,
        "all but the last token's block"
    );
    assert_eq!(tiers.onboarded_requests, 1);
    assert!(round_robin.requests[1].hit_tokens >= 8 * 512 - 16);
    assert_eq!(global.finished_requests, 6);
    let json = report.to_json();
    assert_eq!(json["runs"][0]["tiers"]["onboarded_requests"], 1);
    // A shared pool steps the engines one after another: any thread count
    // gives the same replay.
    let again = replay(&trace(), &config.clone().with_threads(Some(4))).unwrap();
    assert_eq!(timeless(report), timeless(again));
}

#[test]
fn the_pool_may_be_global_kvs_alone() {
    let config = ClusterConfig::new(2, engine())
        .with_policies(vec![PolicyKind::RoundRobin, PolicyKind::GlobalKv])
        .with_global_pool_tokens(1 << 20)
        .with_pool_only_for_global_kv(true);
    let report = replay(&trace(), &config).unwrap();
    assert!(
        report.runs[0].tiers.is_none(),
        "round-robin keeps to local caches"
    );
    assert!(report.runs[1].tiers.is_some());
}

#[test]
fn without_tiers_cluster_runs_report_none() {
    let config = ClusterConfig::new(2, engine()).with_policies(vec![PolicyKind::KvAware]);
    let report = replay(&trace(), &config).unwrap();
    assert!(report.runs[0].tiers.is_none());
    assert!(report.to_json()["runs"][0].get("tiers").is_none());
}

#[test]
fn bad_shared_pools_are_refused() {
    for config in [
        ClusterConfig::new(2, engine()).with_global_pool_tokens(0),
        ClusterConfig::new(2, engine()).with_global_pool_tokens(u64::MAX),
        ClusterConfig::new(2, engine())
            .with_global_pool_tokens(1 << 20)
            .with_network(Link {
                gbps: 0.0,
                setup_us: 1.0,
            }),
        ClusterConfig::new(2, engine())
            .with_global_pool_tokens(1 << 20)
            .with_network(Link {
                gbps: 100.0,
                setup_us: f64::NAN,
            }),
    ] {
        let err = config.validate().unwrap_err();
        assert!(matches!(err, SimError::InvalidTiers(_)), "{err}");
    }
    assert_eq!(
        PolicyKind::parse("global-kv").unwrap(),
        PolicyKind::GlobalKv
    );
}
