//! `replicate`: one copy is the trace itself, N copies on N times the
//! engines replay each copy as the trace alone, and counts that cannot be
//! made are typed errors.

use kvbm_queue::SchedulerConfig;

use super::tests::{engine, excerpt, timeless};
use super::*;
use crate::{Latency, TraceRequest};

#[test]
fn one_copy_is_the_trace_itself() {
    let trace = excerpt(60);
    let config = ClusterConfig::new(3, engine());
    assert_eq!(config.replicate, 1);
    let plain = timeless(replay(&trace, &config).unwrap());
    let one = timeless(replay(&trace, &config.clone().with_replicate(1)).unwrap());
    assert_eq!(plain, one);
    // The same JSON and table, byte for byte, without a `replicate` key.
    assert_eq!(plain.to_json().to_string(), one.to_json().to_string());
    assert_eq!(plain.to_string(), one.to_string());
    assert!(one.to_json().get("replicate").is_none());
    assert!(!one.to_string().contains("copies"));
    assert_eq!(trace.replicate(1).unwrap(), trace);
}

#[test]
fn copies_on_as_many_times_the_engines_replay_as_the_trace_alone() {
    let trace = excerpt(80);
    let original = replay(&trace, &ClusterConfig::new(3, engine())).unwrap();
    let doubled = replay(&trace, &ClusterConfig::new(6, engine()).with_replicate(2)).unwrap();
    assert_eq!(doubled.replicate, 2);
    assert_eq!(doubled.to_json()["replicate"], 2);
    assert!(
        (doubled.to_string()).contains("6 engines, 160 requests (2 copies of the trace)"),
        "{doubled}"
    );
    for (run, alone) in doubled.runs.iter().zip(&original.runs) {
        let name = run.policy.name();
        // Twice the requests, tokens and blocks, every one routed.
        assert_eq!(run.requests.len(), 160, "{name}");
        assert_eq!(run.hits.requests, 2 * alone.hits.requests, "{name}");
        assert_eq!(run.hits.input_tokens, 2 * alone.hits.input_tokens, "{name}");
        assert_eq!(run.hits.input_blocks, 2 * alone.hits.input_blocks, "{name}");
        assert_eq!(run.routed.iter().sum::<u64>(), 160, "{name}");
        assert_eq!(run.finished_requests + run.rejected_requests, 160, "{name}");
    }
    // Round-robin over twice the engines sends copy k of the trace's j-th
    // arrival to engine 2 (j mod 3) + k: each engine is given what engine
    // j mod 3 was given alone, at the same times. No block is shared
    // between copies, so each copy replays exactly as the trace alone:
    // the same hits, request by request, and the same latencies.
    let (alone, run) = (&original.runs[1], &doubled.runs[1]);
    assert_eq!(run.policy, PolicyKind::RoundRobin);
    for copy in 0..2 {
        let copy_requests: Vec<_> = run.requests.iter().skip(copy).step_by(2).collect();
        assert!(
            copy_requests.iter().copied().eq(&alone.requests),
            "copy {copy}"
        );
        let hit_tokens: u64 = copy_requests.iter().map(|r| r.hit_tokens).sum();
        assert_eq!(hit_tokens, alone.hits.hit_tokens, "copy {copy}");
        let routed: Vec<u64> = run.routed.iter().skip(copy).step_by(2).copied().collect();
        assert_eq!(routed, alone.routed, "copy {copy}");
    }
    assert_eq!(run.hits.hit_tokens, 2 * alone.hits.hit_tokens);
    assert_eq!(run.hits.token_hit_rate(), alone.hits.token_hit_rate());
    // The same distributions, of twice the samples.
    for (twice, once) in [
        (run.ttft, alone.ttft),
        (run.tpot, alone.tpot),
        (run.e2e, alone.e2e),
    ] {
        assert_eq!(twice.count, 2 * once.count);
        let shape = |l: Latency| (l.mean, l.p50, l.p90, l.p99, l.max);
        assert_eq!(shape(twice), shape(once));
    }
    assert_eq!(run.sim_duration, alone.sim_duration);
}

#[test]
fn copies_share_no_block_even_with_one_engine() {
    // Three copies of one request on one engine that runs one request at
    // a time: had the copies shared ids (or tokens), the second and third
    // would find the first's blocks cached.
    let trace = Trace::from_requests(vec![TraceRequest {
        timestamp: 0,
        input_length: 4 * 512,
        output_length: 2,
        hash_ids: vec![0, 1, 2, 3],
        priority: None,
    }])
    .unwrap();
    let copies = trace.replicate(3).unwrap();
    let ids: Vec<&[u64]> = (copies.requests().iter())
        .map(|r| r.hash_ids.as_slice())
        .collect();
    assert_eq!(ids, [&[0, 1, 2, 3][..], &[4, 5, 6, 7], &[8, 9, 10, 11]]);
    let one_at_a_time = engine().with_scheduler(SchedulerConfig::default().with_max_running(1));
    let config = ClusterConfig::new(1, one_at_a_time)
        .with_replicate(3)
        .with_policies(vec![PolicyKind::KvAware]);
    let run = &replay(&trace, &config).unwrap().runs[0];
    assert_eq!(run.finished_requests, 3);
    assert_eq!(run.hits.hit_tokens, 0, "{:?}", run.requests);
}

#[test]
fn counts_that_cannot_be_made_are_typed_errors() {
    let trace = excerpt(5);
    // No copies: refused by validation, before the trace is looked at.
    let none = ClusterConfig::new(2, engine()).with_replicate(0);
    assert!(matches!(
        none.validate(),
        Err(SimError::InvalidReplicate { copies: 0, .. })
    ));
    assert!(matches!(
        replay(&trace, &none),
        Err(SimError::InvalidReplicate { copies: 0, .. })
    ));
    assert!(matches!(
        trace.replicate(0),
        Err(SimError::InvalidReplicate { copies: 0, .. })
    ));
    // Ids past 2^32 (where different ids may give equal tokens), however
    // reached: refused before anything is made or estimated.
    let largest = |id: u64| {
        Trace::from_requests(vec![TraceRequest {
            timestamp: 0,
            input_length: 10,
            output_length: 1,
            hash_ids: vec![id],
            priority: None,
        }])
        .unwrap()
    };
    for (id, copies) in [
        (u64::MAX, 2),
        ((1 << 31) - 1, 3),
        ((1 << 32) - 1, 2),
        (0, usize::MAX),
        (1_000, 1 << 30),
    ] {
        let trace = largest(id);
        let config = ClusterConfig::new(2, engine()).with_replicate(copies);
        match replay(&trace, &config) {
            Err(SimError::InvalidReplicate { copies: c, reason }) => {
                assert_eq!(c, copies);
                assert!(reason.contains("2^32"), "{reason}");
            }
            other => panic!("{id} x {copies}: {other:?}"),
        }
        assert!(trace.replicate(copies).is_err(), "{id} x {copies}");
    }
    // Right at the edge: ids up to 2^32 - 1 in all.
    assert!(largest((1 << 31) - 1).replicate(2).is_ok());
    assert!(largest(0).replicate(1 << 10).is_ok());
    // The message names the flag.
    let message = trace.replicate(0).unwrap_err().to_string();
    assert_eq!(message, "--replicate 0: at least one copy is needed");
}

#[test]
fn the_memory_estimate_counts_the_copies() {
    let trace = excerpt(200);
    let config = ClusterConfig::new(16, engine()).with_policies(vec![PolicyKind::RoundRobin]);
    let one = config.memory_estimate(&trace).unwrap();
    let copies = config
        .clone()
        .with_replicate(8)
        .memory_estimate(&trace)
        .unwrap();
    // The trace-wide terms grow eightfold; the engines' do not.
    assert!(copies > one && copies < 8 * one, "{one} -> {copies}");
    // Refused by the estimate of the copies, before they are made.
    let short = (config.clone().with_replicate(8)).with_memory_budget(copies - 1);
    assert!(matches!(
        replay(&trace, &short),
        Err(SimError::ClusterMemory { estimate_bytes, .. }) if estimate_bytes == copies
    ));
    // Saturating, never overflowing.
    let most = ClusterConfig::new(2, engine()).with_replicate(usize::MAX);
    assert_eq!(most.memory_estimate(&trace).unwrap(), u64::MAX);
}
