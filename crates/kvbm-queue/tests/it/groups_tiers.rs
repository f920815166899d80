//! The Scheduler with KV cache groups and tiers below the device together:
//! every group's computed blocks go down (a window's too, though it
//! releases them in the same apply), a request onboards the longest prefix
//! every group serves from the device and the tiers together, each group
//! loading only what it needs for that hit (a window only the blocks it
//! reads), and failures, cancels and a fickle engine leave every tier
//! consistent.

use std::collections::HashSet;

use kvbm_blocks::{BlockManager, SequenceHash};
use kvbm_queue::{InferenceRequest, RequestId, Scheduler, SchedulerConfig, TiersConfig};
use kvbm_sequence::{BlockSequence, Salt};
use kvbm_tiers::{Outcome, TierConfig, TransferKind};
use proptest::prelude::*;

use super::fuzz_cases;
use super::groups::full_and_window;
use super::scheduler::{BS, Gpu, outputs};
use super::tiers::{Engine, engines, fuzzed_tiers, run_done, serve_with};

/// A 64-token prompt: 16 blocks, the hit capped at 15.
const PROMPT: u32 = 64;

fn scheduler(device: usize, tiers: TiersConfig) -> Scheduler<Gpu> {
    let pool = BlockManager::<Gpu>::builder()
        .block_count(device)
        .block_size(BS)
        .build()
        .expect("valid pool");
    Scheduler::with_kv_groups_and_tiers(pool, SchedulerConfig::default(), full_and_window(), tiers)
        .expect("valid")
}

fn host(blocks: usize) -> TiersConfig {
    TiersConfig::new(vec![TierConfig::new("CPU", blocks)])
}

fn prompt(id: u64) -> InferenceRequest {
    InferenceRequest::new(RequestId(id), (0..PROMPT).collect::<Vec<u32>>(), 1)
}

/// Other prompts, enough to push the first one's blocks out of the device
/// (they stay in the host tier).
fn evict_from_device(s: &mut Scheduler<Gpu>) {
    for i in 0..4u32 {
        let other: Vec<u32> = (0..PROMPT).map(|t| 10_000 * (i + 1) + t).collect();
        s.submit(InferenceRequest::new(
            RequestId(100 + u64::from(i)),
            other,
            1,
        ))
        .unwrap();
        run_done(s);
    }
}

/// Each group's hashes of the prompt, in group order.
fn group_hashes(s: &Scheduler<Gpu>) -> Vec<Vec<SequenceHash>> {
    let groups = s.kv_groups().expect("groups");
    let tokens: Vec<u32> = (0..PROMPT).collect();
    (0..groups.len())
        .map(|g| {
            let salt = Salt::NONE.for_group(g);
            BlockSequence::with_salt(tokens.clone(), BS, salt)
                .expect("valid")
                .sequence_hashes()
                .to_vec()
        })
        .collect()
}

/// The prompt computed, pushed out of the device and asked for again:
/// the step that onboards it, applied, and its loads.
fn onboarding(s: &mut Scheduler<Gpu>) -> Vec<kvbm_tiers::Transfer> {
    s.submit(prompt(1)).unwrap();
    run_done(s);
    evict_from_device(s);
    s.submit(prompt(2)).unwrap();
    let plan = s.step().unwrap();
    assert!(plan.prefill.is_empty(), "it waits for its loads first");
    assert_eq!(plan.onboarding, [RequestId(2)]);
    let loads: Vec<_> = (plan.transfers.iter())
        .filter(|t| t.kind == TransferKind::Load)
        .cloned()
        .collect();
    s.apply(&outputs(&plan)).unwrap();
    s.audit().unwrap();
    loads
}

#[test]
fn every_groups_blocks_go_down_even_those_a_window_released() {
    let mut s = scheduler(48, host(256));
    s.submit(prompt(1)).unwrap();
    let plans = run_done(&mut s);
    let stored: HashSet<u128> = (plans.iter().flat_map(|p| &p.transfers))
        .filter(|t| t.kind == TransferKind::Store)
        .flat_map(|t| t.hashes.iter().map(|h| h.value()))
        .collect();
    for (g, hashes) in group_hashes(&s).iter().enumerate() {
        for (i, hash) in hashes.iter().enumerate() {
            assert!(stored.contains(&hash.value()), "group {g} block {i}");
        }
    }
    s.audit().unwrap();
}

#[test]
fn a_grouped_prefix_is_onboarded_each_group_loading_only_what_it_reads() {
    let mut s = scheduler(48, host(256));
    let before = s.census();
    let loads = onboarding(&mut s);
    let hashes = group_hashes(&s);
    let loaded: Vec<u128> = (loads.iter().flat_map(|t| &t.hashes))
        .map(|h| h.value())
        .collect();
    // A hit of 15 blocks: the full group loads what the device lost of
    // blocks 0..15, the window only blocks 13 and 14 (its 8 tokens).
    let window: HashSet<u128> = hashes[1].iter().map(|h| h.value()).collect();
    let window_loads: Vec<usize> = (hashes[1].iter().enumerate())
        .filter(|(_, h)| loaded.contains(&h.value()))
        .map(|(i, _)| i)
        .collect();
    assert!(
        window_loads.iter().all(|i| (13..15).contains(i)),
        "the window loads only what it reads: {window_loads:?}"
    );
    let full_loads = loaded.iter().filter(|v| !window.contains(v)).count();
    assert!(full_loads > 0, "the full group's prefix was evicted");
    assert!(
        !loaded.contains(&hashes[0][15].value()),
        "never the last block"
    );
    assert_eq!(s.census().onboarding, 1);

    // Not ready until the engine reports the loads.
    let plan = s.step().unwrap();
    assert!(plan.prefill.is_empty());
    s.apply(&outputs(&plan)).unwrap();
    let reports: Vec<_> = loads.iter().map(|t| (t.id, Outcome::Completed)).collect();
    s.report_transfers(&reports).unwrap();
    let plan = s.step().unwrap();
    assert_eq!(plan.prefill.len(), 1);
    assert_eq!(plan.prefill[0].start, 60, "only the last block is computed");
    let (first, table) = s.group_block_table(RequestId(2), 1).unwrap();
    assert_eq!(first, 13, "the window holds only what it reads");
    assert_eq!(table.len(), 3);
    // The first prompt and the others hit nothing; this one its 60 tokens.
    assert_eq!(s.census().prefix_hit_tokens - before.prefix_hit_tokens, 60);
    s.apply(&outputs(&plan)).unwrap();
    run_done(&mut s);
    assert_eq!(s.onboard_stats().requests, 1);
    s.audit().unwrap();
}

#[test]
fn a_failed_grouped_load_recomputes_and_marks_nothing_loaded() {
    let mut s = scheduler(48, host(256));
    let loads = onboarding(&mut s);
    let reports: Vec<_> = loads.iter().map(|t| (t.id, Outcome::Failed)).collect();
    s.report_transfers(&reports).unwrap();
    let plan = s.step().unwrap();
    assert_eq!(plan.prefill.len(), 1);
    for load in &loads {
        let matched = s.manager().match_blocks(&load.hashes[..1]);
        assert!(matched.is_empty(), "a failed load is never a hit");
    }
    assert!(
        plan.prefill[0].start < 60,
        "it recomputes what did not arrive"
    );
    s.apply(&outputs(&plan)).unwrap();
    run_done(&mut s);
    s.audit().unwrap();
}

#[test]
fn a_cancel_while_onboarding_grouped_releases_everything() {
    let mut s = scheduler(48, host(256));
    let loads = onboarding(&mut s);
    assert!(s.cancel(RequestId(2)));
    let plan = s.step().unwrap();
    s.apply(&outputs(&plan)).unwrap();
    assert_eq!(s.census().onboarding, 0);
    s.audit().unwrap();
    let reports: Vec<_> = loads.iter().map(|t| (t.id, Outcome::Completed)).collect();
    s.report_transfers(&reports).unwrap();
    s.audit().unwrap();
    assert_eq!(s.manager().metrics().in_use_blocks, 0, "nothing held");
}

type Workload = (usize, usize, u64, Vec<(u8, u8)>, Engine);

fn workload() -> impl Strategy<Value = Workload> {
    (
        16usize..48,
        1usize..64,
        1u64..6,
        prop::collection::vec((0u8..4, 1u8..60), 1..20),
        engines(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fuzz_cases(48)))]

    /// Every request of a grouped model finishes, with every tier
    /// consistent after every call, whatever the engine does with the
    /// transfers (late, failed, never until the timeout).
    #[test]
    fn fuzz_grouped_requests_finish_with_tiers_and_a_fickle_engine(
        (device, host, timeout, requests, engine) in workload(),
    ) {
        let config = fuzzed_tiers(device, host, timeout);
        let mut s = scheduler(device, config);
        let mut submitted = 0;
        for (i, &(family, len)) in requests.iter().enumerate() {
            // Prompts of one family share their prefix.
            let tokens: Vec<u32> = (0..u32::from(len)).map(|t| u32::from(family) * 1000 + t).collect();
            // Both groups' whole tables fit: it never outgrows the pool.
            let fits = 2 * (tokens.len() + 2).div_ceil(BS) <= device;
            if fits && s.submit(InferenceRequest::new(RequestId(i as u64), tokens, 2)).is_ok() {
                submitted += 1;
            }
        }
        serve_with(&mut s, &engine, submitted)?;
    }
}
