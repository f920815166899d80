//! The Scheduler with tiers below the device: blocks go down as computed,
//! a request whose prefix a lower tier holds is onboarded (waits, holding
//! device blocks, while the engine loads it) and then computes only the
//! rest; failures, timeouts, cancels and bad reports leave every tier
//! consistent; and a fuzzer runs arbitrary workloads with an engine that
//! completes, fails and delays transfers at random, to completion.

use std::collections::VecDeque;

use kvbm_blocks::BlockManager;
use kvbm_queue::{
    FinishReason, InferenceRequest, LinkCost, LoadCost, RequestId, Scheduler, SchedulerConfig,
    SchedulerError, StepPlan, TiersConfig,
};
use kvbm_tiers::{Outcome, TierConfig, TierError, TierId, TransferId, TransferKind};
use proptest::prelude::*;

use super::fuzz_cases;
use super::scheduler::outputs;
use super::scheduler::{BS, Gpu};

fn tiered(device_blocks: usize, host_blocks: usize, config: TiersConfig) -> Scheduler<Gpu> {
    let manager = BlockManager::<Gpu>::builder()
        .block_count(device_blocks)
        .block_size(BS)
        .build()
        .unwrap();
    let mut config = config;
    if config.lower.is_empty() {
        config.lower = vec![TierConfig::new("CPU", host_blocks)];
    }
    Scheduler::with_tiers(manager, SchedulerConfig::default(), config).unwrap()
}

fn prompt(id: u64, tokens: u32) -> InferenceRequest {
    // The same tokens for every id: prompts share their whole prefix.
    InferenceRequest::new(RequestId(id), (0..tokens).collect::<Vec<u32>>(), 1)
}

/// Runs steps, completing every transfer as soon as it is planned (those
/// `apply` plans too), until the scheduler is idle with nothing in flight;
/// the plans, each with the transfers planned after it.
pub(super) fn run_done(s: &mut Scheduler<Gpu>) -> Vec<StepPlan> {
    let mut plans = Vec::new();
    for _ in 0..200 {
        if s.is_idle() && s.transfers_in_flight() == 0 {
            return plans;
        }
        let mut plan = s.step().unwrap();
        s.audit().unwrap();
        s.apply(&outputs(&plan)).unwrap();
        s.take_transfers(&mut plan.transfers);
        let reports: Vec<(TransferId, Outcome)> = plan
            .transfers
            .iter()
            .map(|t| (t.id, Outcome::Completed))
            .collect();
        s.report_transfers(&reports).unwrap();
        s.audit().unwrap();
        plans.push(plan);
    }
    panic!("not idle after 200 steps");
}

/// Fills the device with other prompts so the first one's blocks are
/// evicted there (they stay in the host tier).
fn evict_from_device(s: &mut Scheduler<Gpu>, first_id: u64) {
    for i in 0..4 {
        let other: Vec<u32> = (0..64).map(|t| 10_000 * (i + 1) + t).collect();
        s.submit(InferenceRequest::new(
            RequestId(first_id + u64::from(i)),
            other,
            1,
        ))
        .unwrap();
        run_done(s);
    }
}

/// A 64-token prompt computed, pushed out of the device (still in the
/// host tier), and asked for again: the step that onboards it, applied,
/// and its load.
fn onboarding(s: &mut Scheduler<Gpu>) -> kvbm_tiers::Transfer {
    s.submit(prompt(1, 64)).unwrap();
    run_done(s);
    evict_from_device(s, 100);
    s.submit(prompt(2, 64)).unwrap();
    let plan = s.step().unwrap();
    let load = (plan.transfers.iter())
        .find(|t| t.kind == TransferKind::Load)
        .expect("a load")
        .clone();
    s.apply(&outputs(&plan)).unwrap();
    load
}

#[test]
fn a_prefix_evicted_from_the_device_is_onboarded_from_the_host() {
    let mut s = tiered(24, 256, TiersConfig::new(Vec::new()));
    s.submit(prompt(1, 64)).unwrap(); // 16 blocks of 4
    let plans = run_done(&mut s);
    let stores: usize = (plans.iter().flat_map(|p| &p.transfers))
        .filter(|t| t.kind == TransferKind::Store)
        .map(|t| t.blocks())
        .sum();
    assert_eq!(stores, 16, "write-through: every computed block went down");
    evict_from_device(&mut s, 100);
    let hashes_on_device = s.manager().metrics();
    assert!(hashes_on_device.evictions > 0);

    let before = s.census();
    s.submit(prompt(2, 64)).unwrap();
    let plan = s.step().unwrap();
    assert!(plan.prefill.is_empty(), "it waits for its loads first");
    let loads: Vec<_> = plan
        .transfers
        .iter()
        .filter(|t| t.kind == TransferKind::Load)
        .collect();
    assert_eq!(loads.len(), 1);
    assert_eq!(
        (loads[0].source, loads[0].destination),
        (TierId::lower(0).unwrap(), TierId::DEVICE)
    );
    let loaded = loads[0].blocks();
    assert!(
        loaded > 0 && loaded <= 15,
        "never the last token's block: {loaded}"
    );
    assert_eq!(s.census().onboarding, 1);
    assert_eq!(plan.onboarding, [RequestId(2)]);
    s.audit().unwrap();
    s.apply(&outputs(&plan)).unwrap();
    // Not ready until the engine reports the load.
    let plan = s.step().unwrap();
    assert!(plan.prefill.is_empty());
    s.apply(&outputs(&plan)).unwrap();
    s.report_transfers(&[(loads[0].id, Outcome::Completed)])
        .unwrap();
    let plan = s.step().unwrap();
    assert_eq!(plan.prefill.len(), 1);
    let hits = s.census().prefix_hit_tokens - before.prefix_hit_tokens;
    assert!(
        hits >= (loaded * BS) as u64,
        "the loaded prefix is credited"
    );
    assert_eq!(
        plan.prefill[0].start, hits as usize,
        "only the rest is computed"
    );
    s.apply(&outputs(&plan)).unwrap();
    run_done(&mut s);
    let stats = s.onboard_stats();
    assert_eq!((stats.requests, stats.timeouts), (1, 0));
    s.audit().unwrap();
}

#[test]
fn a_failed_load_recomputes_and_marks_nothing_loaded() {
    let mut s = tiered(24, 256, TiersConfig::new(Vec::new()));
    let load = onboarding(&mut s);
    s.report_transfers(&[(load.id, Outcome::Failed)]).unwrap();
    let plan = s.step().unwrap();
    assert_eq!(plan.prefill.len(), 1);
    let matched = s.manager().match_blocks(&load.hashes);
    assert!(matched.is_empty(), "a failed load is never a hit");
    drop(matched);
    s.apply(&outputs(&plan)).unwrap();
    run_done(&mut s);
    s.audit().unwrap();
}

#[test]
fn a_load_that_never_ends_times_out_and_the_request_recomputes() {
    // Room to recompute beside the abandoned load's destinations, which
    // stay pinned until the engine reports it (it may still be writing).
    let config = TiersConfig::new(Vec::new()).with_load_timeout_steps(3);
    let mut s = tiered(40, 256, config);
    s.submit(prompt(1, 64)).unwrap();
    run_done(&mut s);
    evict_from_device(&mut s, 100);
    s.submit(prompt(2, 64)).unwrap();
    let mut load = None;
    let mut started = None;
    for step in 0..10 {
        let plan = s.step().unwrap();
        if load.is_none() {
            load = plan
                .transfers
                .iter()
                .find(|t| t.kind == TransferKind::Load)
                .map(|t| t.id);
        }
        if started.is_none() && !plan.prefill.is_empty() {
            started = Some(step);
        }
        s.apply(&outputs(&plan)).unwrap();
        s.audit().unwrap();
    }
    assert_eq!(started, Some(3), "waited three steps, then recomputed");
    assert_eq!(s.onboard_stats().timeouts, 1);
    // The engine reports it at last: thrown away, never a hit.
    s.report_transfers(&[(load.unwrap(), Outcome::Completed)])
        .unwrap();
    s.audit().unwrap();
}

#[test]
fn a_cancel_while_onboarding_releases_everything() {
    let mut s = tiered(24, 256, TiersConfig::new(Vec::new()));
    let load = onboarding(&mut s).id;
    assert!(s.cancel(RequestId(2)));
    let plan = s.step().unwrap();
    s.apply(&outputs(&plan)).unwrap();
    assert_eq!(s.census().onboarding, 0);
    s.audit().unwrap();
    // Its load is abandoned: completing it later registers nothing.
    s.report_transfers(&[(load, Outcome::Completed)]).unwrap();
    s.audit().unwrap();
    assert_eq!(s.manager().metrics().in_use_blocks, 0, "nothing held");
}

#[test]
fn the_cost_model_declines_a_load_slower_than_recomputing() {
    // Recomputing a token takes 1 ns; a block from the host 1 s.
    let slow = LoadCost::new(
        1e-9,
        vec![LinkCost {
            setup_s: 0.0,
            block_s: 1.0,
        }],
    );
    let mut s = tiered(24, 256, TiersConfig::new(Vec::new()).with_cost(slow));
    s.submit(prompt(1, 64)).unwrap();
    run_done(&mut s);
    evict_from_device(&mut s, 100);
    s.submit(prompt(2, 64)).unwrap();
    let plan = s.step().unwrap();
    assert_eq!(plan.prefill.len(), 1, "recomputed at once");
    assert!(plan.transfers.iter().all(|t| t.kind == TransferKind::Store));
    assert_eq!(s.onboard_stats().declined, 1);
    s.apply(&outputs(&plan)).unwrap();
    run_done(&mut s);
}

#[test]
fn bad_reports_are_refused_and_change_nothing() {
    let mut s = tiered(24, 256, TiersConfig::new(Vec::new()));
    s.submit(prompt(1, 8)).unwrap();
    let plan = s.step().unwrap();
    s.apply(&outputs(&plan)).unwrap();
    let plan = s.step().unwrap();
    let store = plan.transfers[0].id;
    s.apply(&outputs(&plan)).unwrap();
    let census = s.census();
    let never = TransferId::from_raw(1_000);
    assert_eq!(
        s.report_transfers(&[(store, Outcome::Completed), (never, Outcome::Completed)]),
        Err(SchedulerError::Tier(TierError::UnknownTransfer(never)))
    );
    assert_eq!(
        s.report_transfers(&[(store, Outcome::Completed), (store, Outcome::Failed)]),
        Err(SchedulerError::Tier(TierError::DuplicateReport(store)))
    );
    assert!(s.tiers().unwrap().in_flight(store), "nothing settled");
    s.report_transfers(&[(store, Outcome::Completed)]).unwrap();
    assert_eq!(
        s.report_transfers(&[(store, Outcome::Completed)]),
        Err(SchedulerError::Tier(TierError::UnknownTransfer(store))),
        "twice"
    );
    assert_eq!(s.census(), census);
    s.audit().unwrap();
}

#[test]
fn invalid_tier_settings_are_refused() {
    let manager = BlockManager::<Gpu>::builder()
        .block_count(8)
        .block_size(BS)
        .build()
        .unwrap();
    let cases = [
        TiersConfig::new(vec![TierConfig::new("CPU", 0)]),
        TiersConfig::new(vec![TierConfig::new("CPU", 8)]).with_max_onboarding_blocks(0),
        TiersConfig::new(vec![TierConfig::new("CPU", 8)]).with_cost(LoadCost::new(
            f64::NAN,
            vec![LinkCost {
                setup_s: 0.0,
                block_s: 0.0,
            }],
        )),
        TiersConfig::new(vec![TierConfig::new("CPU", 8)]).with_cost(LoadCost::new(
            1.0,
            vec![LinkCost {
                setup_s: -1.0,
                block_s: 0.0,
            }],
        )),
        TiersConfig::new(vec![TierConfig::new("CPU", 8)]).with_cost(LoadCost::new(1.0, vec![])),
    ];
    for config in cases {
        assert!(
            Scheduler::with_tiers(manager.clone(), SchedulerConfig::default(), config).is_err()
        );
    }
}

/// The engine's side in the fuzzers: each transfer ends after a delay of
/// some steps, completed or failed.
#[derive(Clone, Debug)]
pub(super) struct Engine {
    delays: Vec<u8>,
    failures: Vec<bool>,
}

/// Engines whose transfers end late, fail, or never before a timeout.
pub(super) fn engines() -> impl Strategy<Value = Engine> {
    (
        prop::collection::vec(0u8..6, 1..16),
        prop::collection::vec(prop::bool::weighted(0.2), 1..16),
    )
        .prop_map(|(delays, failures)| Engine { delays, failures })
}

/// The fuzzers' tiers: a host tier of `host` blocks over a disk twice as
/// large, loads timing out after `timeout` steps, at most a device's worth
/// onboarding at once.
pub(super) fn fuzzed_tiers(device: usize, host: usize, timeout: u64) -> TiersConfig {
    TiersConfig::new(vec![
        TierConfig::new("CPU", host),
        TierConfig::new("DISK", host * 2),
    ])
    .with_load_timeout_steps(timeout)
    .with_max_onboarding_blocks(device)
}

/// Serves `s` to the end with `engine` running the transfers: every one of
/// the `submitted` requests must finish (by its tokens), every transfer be
/// reported, and the audit pass after every call.
pub(super) fn serve_with(
    s: &mut Scheduler<Gpu>,
    engine: &Engine,
    submitted: usize,
) -> Result<(), TestCaseError> {
    let mut pending: VecDeque<(u64, TransferId, Outcome)> = VecDeque::new();
    let mut n = 0usize;
    let mut finished = 0;
    for step in 0..2_000u64 {
        if s.is_idle() && s.transfers_in_flight() == 0 {
            break;
        }
        let mut plan = s.step().map_err(|e| TestCaseError::fail(e.to_string()))?;
        s.audit().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let report = s
            .apply(&outputs(&plan))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        if step % 2 == 0 {
            s.take_transfers(&mut plan.transfers);
        }
        for transfer in &plan.transfers {
            let delay = u64::from(engine.delays[n % engine.delays.len()]);
            let failed = engine.failures[n % engine.failures.len()];
            n += 1;
            let outcome = if failed {
                Outcome::Failed
            } else {
                Outcome::Completed
            };
            pending.push_back((step + delay, transfer.id, outcome));
        }
        for done in &report.finished {
            prop_assert!(
                matches!(done.reason, FinishReason::MaxTokens | FinishReason::Stop),
                "{done:?}"
            );
        }
        finished += report.finished.len();
        let due: Vec<(TransferId, Outcome)> = (pending.iter())
            .filter(|(at, _, _)| *at <= step)
            .map(|&(_, id, o)| (id, o))
            .collect();
        pending.retain(|(at, _, _)| *at > step);
        s.report_transfers(&due)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        s.audit().map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    prop_assert_eq!(finished, submitted, "every request finished");
    prop_assert!(s.is_idle());
    let tiers = s.tiers().expect("tiers");
    prop_assert_eq!(tiers.in_flight_count(), 0, "every transfer reported");
    Ok(())
}

fn workload() -> impl Strategy<Value = (usize, usize, u64, Vec<(u8, u8)>, Engine)> {
    (
        8usize..40,
        1usize..48,
        1u64..6,
        prop::collection::vec((0u8..4, 1u8..40), 1..24),
        engines(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fuzz_cases(64)))]

    /// Every request finishes, with every tier consistent after every call,
    /// whatever the engine does with the transfers (late, failed, never
    /// until the timeout).
    #[test]
    fn fuzz_every_request_finishes_with_tiers_and_a_fickle_engine(
        (device, host, timeout, requests, engine) in workload(),
    ) {
        let config = fuzzed_tiers(device, host, timeout);
        let manager = BlockManager::<Gpu>::builder().block_count(device).block_size(BS).build().unwrap();
        let mut s = Scheduler::with_tiers(manager, SchedulerConfig::default(), config).unwrap();
        let mut submitted = 0;
        for (i, &(family, len)) in requests.iter().enumerate() {
            // Prompts of one family share their prefix.
            let tokens: Vec<u32> = (0..u32::from(len)).map(|t| u32::from(family) * 1000 + t).collect();
            let fits = (tokens.len() + 1).div_ceil(BS) <= device;
            if fits && s.submit(InferenceRequest::new(RequestId(i as u64), tokens, 2)).is_ok() {
                submitted += 1;
            }
        }
        serve_with(&mut s, &engine, submitted)?;
        drop(s);
    }
}
