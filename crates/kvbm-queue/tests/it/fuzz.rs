//! API fuzzers: arbitrary sequences of public operations with extreme values
//! (0, 1, `u32::MAX`, `u64::MAX`, `usize::MAX`, empty and huge prompts,
//! invalid configurations, foreign queues, garbage engine outputs).
//!
//! After every operation: nothing panicked, every refusal is a typed error,
//! a refused call changed nothing, and conservation holds (the queue's
//! counters balance; the scheduler's `audit` passes). `cargo xtask fuzz`
//! runs these long (`KVBM_FUZZ_CASES`).

use std::collections::HashSet;
use std::sync::Arc;

use kvbm_queue::{
    Aging, EngineOutput, GenerationReserve, InferenceRequest, KvLayout, Preemption, Priority,
    QueueConfig, QueueError, Request, RequestId, RequestQueue, Scheduler, SchedulerConfig,
    SchedulerError, Selection, StepPlan, Ticket,
};
use kvbm_sequence::{KvCacheGroups, Salt};
use proptest::prelude::*;

use super::scheduler::Gpu;
use super::{Req, fuzz_cases, kv_groups};

fn priority() -> impl Strategy<Value = Priority> {
    prop_oneof![
        Just(Priority::Low),
        Just(Priority::Normal),
        Just(Priority::High),
        Just(Priority::Critical)
    ]
}

/// Small values, the edges around them, and the type's extremes.
fn extreme_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => 0u32..40,
        1 => Just(u32::MAX),
        1 => Just(u32::MAX - 1),
        1 => any::<u32>(),
    ]
}

fn extreme_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..200,
        1 => Just(u64::MAX),
        1 => any::<u64>(),
    ]
}

fn extreme_usize() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 0usize..40,
        1 => Just(usize::MAX),
        1 => any::<usize>(),
    ]
}

fn queue_config() -> impl Strategy<Value = QueueConfig> {
    let reserve = prop_oneof![
        Just(GenerationReserve::Full),
        extreme_u32().prop_map(GenerationReserve::Capped)
    ];
    let selection = prop_oneof![
        Just(Selection::HeadOfLine),
        (extreme_usize(), extreme_u32()).prop_map(|(max_scan, max_bypass)| Selection::SkipAhead {
            max_scan,
            max_bypass
        })
    ];
    let aging = prop_oneof![
        Just(Aging::Strict),
        extreme_u64().prop_map(Aging::Window),
        extreme_u64().prop_map(|ns| Aging::Timed {
            step: std::time::Duration::from_nanos(ns)
        }),
    ];
    let layout = prop::option::of((extreme_u32(), extreme_u32(), extreme_u32(), extreme_u32()));
    (
        extreme_u32(),
        extreme_u64(),
        reserve,
        selection,
        aging,
        layout,
        extreme_usize(),
    )
        .prop_map(
            |(block_tokens, pool, reserve, selection, aging, layout, capacity)| {
                let mut config = QueueConfig::new(block_tokens, pool)
                    .with_reserve(reserve)
                    .with_selection(selection)
                    .with_aging(aging)
                    .with_capacity(capacity);
                if let Some(layout) = layout.and_then(|(l, h, d, b)| KvLayout::new(l, h, d, b).ok())
                {
                    config = config.with_layout(layout);
                }
                config
            },
        )
}

#[derive(Clone, Debug)]
enum QueueOp {
    Enqueue {
        id: u32,
        priority: Priority,
        prompt: u32,
        max_new: u32,
    },
    TryDequeue,
    Remove(u32),
    /// Cancels through the ticket of the `n`th enqueue (stale ones included).
    Cancel(usize),
    SelectAndRestore {
        max_count: usize,
        budget: u64,
        keep: usize,
        /// Restore into the other queue (refused as foreign).
        foreign: bool,
        /// Priority steps of preemption boost on the way back.
        boost: u32,
    },
    SelectBytes {
        max_count: usize,
        bytes: u64,
    },
    Clear,
    Close,
}

fn queue_op() -> impl Strategy<Value = QueueOp> {
    prop_oneof![
        6 => (0u32..16, priority(), extreme_u32(), extreme_u32())
            .prop_map(|(id, priority, prompt, max_new)| QueueOp::Enqueue { id, priority, prompt, max_new }),
        2 => Just(QueueOp::TryDequeue),
        2 => (0u32..16).prop_map(QueueOp::Remove),
        2 => any::<usize>().prop_map(QueueOp::Cancel),
        3 => (extreme_usize(), extreme_u64(), 0usize..8, any::<bool>(), extreme_u32())
            .prop_map(|(max_count, budget, keep, foreign, boost)| QueueOp::SelectAndRestore { max_count, budget, keep, foreign, boost }),
        1 => (extreme_usize(), extreme_u64()).prop_map(|(max_count, bytes)| QueueOp::SelectBytes { max_count, bytes }),
        1 => Just(QueueOp::Clear),
        1 => Just(QueueOp::Close),
    ]
}

/// Applies one operation, checking what can be checked locally; `queued` is
/// the reference set of queued ids.
fn apply_queue_op(
    queue: &RequestQueue<Req>,
    other: &RequestQueue<Req>,
    tickets: &mut Vec<Ticket<u32>>,
    queued: &mut HashSet<u32>,
    op: QueueOp,
) -> Result<(), TestCaseError> {
    let before = queue.stats();
    match op {
        QueueOp::Enqueue {
            id,
            priority,
            prompt,
            max_new,
        } => {
            let request = Req {
                id,
                priority,
                prompt,
                max_new,
            };
            match queue.enqueue(request.clone()) {
                Ok(ticket) => {
                    prop_assert!(queued.insert(id), "{id} accepted twice");
                    tickets.push(ticket);
                }
                Err(rejected) => {
                    prop_assert!(
                        matches!(
                            rejected.error(),
                            QueueError::Duplicate
                                | QueueError::Closed
                                | QueueError::TooLarge { .. }
                                | QueueError::EmptyPrompt
                        ),
                        "unexpected outcome"
                    );
                    prop_assert_eq!(rejected.into_inner(), request);
                    prop_assert_eq!(queue.stats(), before, "a refused enqueue changed the queue");
                }
            }
        }
        QueueOp::TryDequeue => match queue.try_dequeue() {
            Ok(request) => prop_assert!(queued.remove(&request.id)),
            Err(error) => {
                prop_assert!(matches!(error, QueueError::Empty | QueueError::Closed));
                prop_assert!(queued.is_empty());
            }
        },
        QueueOp::Remove(id) => {
            let removed = queue.remove(id).map(|r| r.id);
            prop_assert_eq!(removed.is_some(), queued.remove(&id));
        }
        QueueOp::Cancel(n) => {
            if let Some(&ticket) = tickets.get(n % tickets.len().max(1)) {
                let was_queued = queue.is_queued(ticket);
                let cancelled = queue.cancel(ticket);
                prop_assert_eq!(cancelled.is_some(), was_queued);
                if cancelled.is_some() {
                    prop_assert!(queued.remove(&ticket.id()));
                }
            }
        }
        QueueOp::SelectAndRestore {
            max_count,
            budget,
            keep,
            foreign,
            boost,
        } => {
            let mut batch = queue.select_batch(max_count, budget);
            prop_assert!(batch.len() <= max_count);
            prop_assert!(batch.blocks() <= budget);
            let back = batch.split_off(keep);
            for request in batch.into_requests() {
                prop_assert!(queued.remove(&request.id));
            }
            for admitted in back {
                let target = if foreign { other } else { queue };
                if let Err(rejected) = target.restore_boosted(admitted, boost) {
                    let (error, admitted) = rejected.into_parts();
                    prop_assert!(matches!(
                        error,
                        QueueError::ForeignQueue | QueueError::Closed | QueueError::Duplicate
                    ));
                    // Refused: the request is the caller's, out of the queue.
                    prop_assert!(queued.remove(&admitted.id()));
                }
            }
        }
        QueueOp::SelectBytes { max_count, bytes } => {
            match queue.select_batch_bytes(max_count, bytes) {
                Ok(batch) => {
                    for request in batch.into_requests() {
                        prop_assert!(queued.remove(&request.id));
                    }
                }
                Err(error) => {
                    prop_assert_eq!(error, QueueError::NoKvLayout);
                    prop_assert_eq!(queue.stats(), before);
                }
            }
        }
        QueueOp::Clear => {
            for request in queue.clear() {
                prop_assert!(queued.remove(&request.id));
            }
        }
        QueueOp::Close => {
            queue.close();
        }
    }
    let stats = queue.stats();
    prop_assert!(stats.is_balanced(), "{stats:?}");
    prop_assert_eq!(stats.len, queued.len());
    for id in 0..16 {
        prop_assert_eq!(queue.contains(id), queued.contains(&id), "contains({})", id);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fuzz_cases(1024)))]

    /// Any configuration is either refused with a typed error or builds a
    /// queue that survives any sequence of operations.
    #[test]
    fn fuzz_queue_operations(
        config in queue_config(),
        ops in prop::collection::vec(queue_op(), 0..60),
    ) {
        let queue = match RequestQueue::<Req>::new(config) {
            Ok(queue) => queue,
            Err(error) => {
                prop_assert!(matches!(
                    error,
                    QueueError::Zero { .. } | QueueError::LayoutOverflow { .. }
                ), "unexpected outcome");
                return Ok(());
            }
        };
        let other = RequestQueue::<Req>::new(QueueConfig::new(16, 64)).unwrap();
        let mut tickets = Vec::new();
        let mut queued = HashSet::new();
        for op in ops {
            apply_queue_op(&queue, &other, &mut tickets, &mut queued, op)?;
        }
    }
}

#[derive(Clone, Debug)]
enum SchedOp {
    Submit {
        id: u64,
        prompt: usize,
        /// Shares a prefix with other requests of its family.
        family: u32,
        max_new: u32,
        priority: Priority,
        salted: bool,
    },
    Cancel(u64),
    Abort(u64),
    /// Plans and applies a step; `stops` picks which outputs stop, `turn`
    /// how far the outputs are rotated out of the plan's order.
    Step {
        stops: u32,
        turn: u8,
    },
    /// Plans a step, then offers a corrupted output set (refused, nothing
    /// changes), then the right one.
    StepWithBadOutputs {
        corruption: u8,
        stops: u32,
    },
    /// Plans a step, aborts or cancels the `victim`th planned request, then
    /// applies the full output set.
    StepAbortingMidway {
        victim: usize,
        cancel: bool,
    },
    /// Calls `apply` with no step pending, or `step` twice.
    OutOfOrder,
}

fn sched_op() -> impl Strategy<Value = SchedOp> {
    let prompt = prop_oneof![
        4 => 0usize..24,
        1 => 24usize..200,
        1 => Just(4096usize),
    ];
    let max_new = prop_oneof![
        4 => 0u32..40,
        1 => Just(u32::MAX),
        1 => any::<u32>(),
    ];
    prop_oneof![
        6 => (0u64..10, prompt, 0u32..3, max_new, priority(), any::<bool>())
            .prop_map(|(id, prompt, family, max_new, priority, salted)| SchedOp::Submit { id, prompt, family, max_new, priority, salted }),
        1 => (0u64..12).prop_map(SchedOp::Cancel),
        1 => (0u64..12).prop_map(SchedOp::Abort),
        // Sparse stops (one sampled token in 16), so requests live long enough to grow.
        12 => (any::<u32>(), any::<u8>()).prop_map(|(s, turn)| SchedOp::Step { stops: s & s >> 5 & s >> 11 & s >> 17, turn }),
        1 => (any::<u8>(), any::<u32>()).prop_map(|(corruption, stops)| SchedOp::StepWithBadOutputs { corruption, stops }),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(victim, cancel)| SchedOp::StepAbortingMidway { victim, cancel }),
        1 => Just(SchedOp::OutOfOrder),
    ]
}

fn sched_config() -> impl Strategy<Value = (usize, usize, SchedulerConfig)> {
    let block_size = prop_oneof![2 => Just(1usize), 2 => Just(2), 2 => Just(4), 1 => Just(16)];
    // Mostly pools a few requests overflow, so they grow into preemption.
    let blocks = prop_oneof![4 => 1usize..16, 1 => 16usize..64];
    let limit = || prop_oneof![1 => 1usize..4, 3 => 4usize..64, 1 => Just(usize::MAX)];
    // Small reserves overcommit the pool, so requests grow into preemption.
    let reserve = prop_oneof![
        1 => Just(GenerationReserve::Full),
        1 => extreme_u32().prop_map(GenerationReserve::Capped),
        3 => (0u32..4).prop_map(GenerationReserve::Capped),
    ];
    let watermark = prop_oneof![
        Just(None),
        (0usize..8).prop_map(Some),
        Just(Some(usize::MAX))
    ];
    let policies = (
        reserve,
        watermark,
        prop_oneof![Just(Preemption::Never), Just(Preemption::ByPriority)],
        prop_oneof![
            Just(Aging::Strict),
            extreme_u64().prop_map(Aging::Window),
            extreme_u64().prop_map(|ns| Aging::Timed {
                step: std::time::Duration::from_nanos(ns)
            }),
        ],
    );
    let drafts = prop_oneof![2 => Just(0usize), 1 => limit()];
    let boost = prop_oneof![Just(0u32), 1u32..4, Just(u32::MAX)];
    (
        block_size,
        blocks,
        (limit(), limit(), limit(), drafts, boost),
        policies,
    )
        .prop_map(
            |(
                bs,
                blocks,
                (max_running, budget, chunk, drafts, boost),
                (reserve, watermark, preemption, aging),
            )| {
                let mut config = SchedulerConfig::default()
                    .with_max_running(max_running)
                    .with_token_budget(budget)
                    .with_chunk_size(chunk)
                    .with_reserve(reserve)
                    .with_preemption(preemption)
                    .with_aging(aging)
                    .with_speculative_tokens(drafts)
                    .with_preemption_boost(boost);
                if let Some(watermark) = watermark {
                    config = config.with_watermark_blocks(watermark);
                }
                (bs, blocks, config)
            },
        )
}

/// Outputs that match `plan`; the `k`th sampled token stops if bit `k` of
/// `stops` is set, and speculative decodes accept all, none or some of
/// their drafts.
fn engine_outputs(plan: &StepPlan, stops: u32) -> Vec<EngineOutput> {
    let prefill = plan.prefill.iter().map(|p| (p.id, p.emits_token, 0));
    let decode = plan.decode.iter().map(|d| (d.id, true, d.draft_tokens));
    prefill
        .chain(decode)
        .enumerate()
        .map(|(k, (id, samples, drafts))| {
            let accepted = match stops >> (k % 32) & 3 {
                0 => 0,
                1 => drafts,
                _ => (stops as usize >> (k % 16)) % (drafts.min(64) + 1),
            };
            let output = match samples {
                true => EngineOutput::speculative(id, vec![5; accepted.min(drafts)], 7 + k as u32),
                false => EngineOutput::no_token(id),
            };
            match samples && stops >> (k % 32) & 1 == 1 {
                true => output.with_stop(),
                false => output,
            }
        })
        .collect()
}

/// What a refused call must leave unchanged: the census and every running
/// request's block table in every KV cache group.
type Snapshot = (kvbm_queue::Census, Vec<(RequestId, Vec<(usize, Vec<u32>)>)>);

fn snapshot(s: &Scheduler<Gpu>) -> Snapshot {
    let mut running: Vec<_> = s.running_ids().collect();
    running.sort();
    let groups = s.kv_groups().map_or(1, |groups| groups.len());
    let tables = running
        .into_iter()
        .map(|id| {
            let tables = (0..groups)
                .filter_map(|g| s.group_block_table(id, g))
                .map(|(first, t)| (first, t.iter().map(|b| b.get()).collect()))
                .collect();
            (id, tables)
        })
        .collect();
    (s.census(), tables)
}

fn audited(s: &Scheduler<Gpu>) -> Result<(), TestCaseError> {
    match s.audit() {
        Ok(census) => prop_assert!(census.is_balanced()),
        Err(error) => prop_assert!(false, "audit failed: {error}"),
    }
    Ok(())
}

fn apply_sched_op(s: &mut Scheduler<Gpu>, op: SchedOp) -> Result<(), TestCaseError> {
    match op {
        SchedOp::Submit {
            id,
            prompt,
            family,
            max_new,
            priority,
            salted,
        } => {
            let tokens: Vec<u32> = (0..prompt as u32)
                .map(|i| if i < 8 { family * 100 + i } else { 10_000 + i })
                .collect();
            let mut request =
                InferenceRequest::new(RequestId(id), tokens, max_new).with_priority(priority);
            if salted {
                request = request.with_salt(Salt::from_bytes(b"tenant"));
            }
            let before = snapshot(s);
            if let Err(rejected) = s.submit(request) {
                prop_assert!(
                    matches!(
                        rejected.error(),
                        QueueError::Duplicate
                            | QueueError::TooLarge { .. }
                            | QueueError::EmptyPrompt
                    ),
                    "unexpected outcome"
                );
                prop_assert_eq!(rejected.into_inner().id(), RequestId(id));
                prop_assert_eq!(
                    snapshot(s),
                    before,
                    "a refused submit changed the scheduler"
                );
            }
        }
        SchedOp::Cancel(id) => {
            s.cancel(RequestId(id));
        }
        SchedOp::Abort(id) => {
            let before = snapshot(s);
            match s.abort(RequestId(id)) {
                Ok(done) => prop_assert_eq!(done.id, RequestId(id)),
                Err(error) => {
                    prop_assert!(
                        matches!(error, SchedulerError::UnknownRequest { .. }),
                        "unexpected outcome"
                    );
                    prop_assert_eq!(snapshot(s), before);
                }
            }
        }
        SchedOp::Step { stops, turn } => {
            let plan = s.step().map_err(|e| TestCaseError::fail(e.to_string()))?;
            audited(s)?;
            // In the plan's order, or rotated (any order is accepted; the
            // plan's needs no index).
            let mut outputs = engine_outputs(&plan, stops);
            // Half the steps in the plan's order.
            let turn = usize::from(turn.saturating_sub(128)) % outputs.len().max(1);
            outputs.rotate_left(turn);
            s.apply(&outputs)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        SchedOp::StepWithBadOutputs { corruption, stops } => {
            let plan = s.step().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let good = engine_outputs(&plan, stops);
            let mut bad = good.clone();
            match corruption % 4 {
                0 => {
                    bad.pop();
                }
                1 => bad.extend(good.first().cloned()),
                2 => bad.push(EngineOutput::token(RequestId(u64::MAX), 1)),
                _ => {
                    if let Some(first) = bad.first_mut() {
                        first.token = match first.token {
                            Some(_) => None,
                            None => Some(u32::MAX),
                        };
                    }
                }
            }
            let before = snapshot(s);
            if let Err(error) = s.apply(&bad) {
                prop_assert!(
                    matches!(
                        error,
                        SchedulerError::MissingOutput { .. }
                            | SchedulerError::DuplicateOutput { .. }
                            | SchedulerError::UnexpectedOutput { .. }
                            | SchedulerError::MissingToken { .. }
                            | SchedulerError::UnexpectedToken { .. }
                    ),
                    "unexpected outcome"
                );
                prop_assert_eq!(snapshot(s), before, "a refused apply changed the scheduler");
                audited(s)?;
                s.apply(&good)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
            } else {
                // Only an empty plan accepts its corrupted (still empty) set.
                prop_assert!(good.is_empty() && bad.is_empty(), "bad outputs accepted");
            }
        }
        SchedOp::StepAbortingMidway { victim, cancel } => {
            let plan = s.step().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let outputs = engine_outputs(&plan, 0);
            if let Some(target) = outputs.get(victim % outputs.len().max(1)) {
                if cancel {
                    prop_assert!(s.cancel(target.id));
                } else {
                    s.abort(target.id)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
            }
            audited(s)?;
            s.apply(&outputs)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        SchedOp::OutOfOrder => {
            let before = snapshot(s);
            prop_assert!(matches!(s.apply(&[]), Err(SchedulerError::NoStepPending)));
            prop_assert_eq!(snapshot(s), before);
            let plan = s.step().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let before = snapshot(s);
            prop_assert!(
                matches!(s.step(), Err(SchedulerError::StepPending { .. })),
                "unexpected outcome"
            );
            prop_assert_eq!(snapshot(s), before);
            s.apply(&engine_outputs(&plan, 0))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
    }
    audited(s)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fuzz_cases(512)))]

    /// Any configuration is refused with a typed error or builds a scheduler
    /// that survives any sequence of calls; at the end, aborting whatever is
    /// left gives every block back.
    #[test]
    fn fuzz_scheduler_operations(
        (block_size, blocks, config) in sched_config(),
        ops in prop::collection::vec(sched_op(), 20..150),
    ) {
        run_scheduler_ops(block_size, blocks, config, None, ops)?;
    }

    /// The same with a model of several KV cache groups.
    #[test]
    fn fuzz_grouped_scheduler_operations(
        ((block_size, blocks, config), groups) in sched_config()
            .prop_flat_map(|(bs, blocks, config)| (Just((bs, blocks, config)), kv_groups(bs))),
        ops in prop::collection::vec(sched_op(), 20..150),
    ) {
        run_scheduler_ops(block_size, blocks, config, Some(groups), ops)?;
    }
}

/// Any configuration is refused with a typed error or builds a scheduler
/// that survives `ops`; at the end, aborting whatever is left gives every
/// block back.
fn run_scheduler_ops(
    block_size: usize,
    blocks: usize,
    config: SchedulerConfig,
    groups: Option<Arc<KvCacheGroups>>,
    ops: Vec<SchedOp>,
) -> Result<(), TestCaseError> {
    let manager = kvbm_blocks::BlockManager::<Gpu>::builder()
        .block_count(blocks)
        .block_size(block_size)
        .build()
        .unwrap();
    let built = match groups {
        None => Scheduler::new(manager, config),
        Some(groups) => Scheduler::with_kv_groups(manager, config, groups),
    };
    let mut s = match built {
        Ok(s) => s,
        Err(error) => {
            prop_assert!(
                matches!(
                    error,
                    SchedulerError::ZeroLimit { .. }
                        | SchedulerError::Queue(_)
                        | SchedulerError::InvalidGroups { .. }
                ),
                "unexpected outcome"
            );
            return Ok(());
        }
    };
    for op in ops {
        apply_sched_op(&mut s, op)?;
    }
    // Drain: cancellations get reported, then abort what is left.
    let plan = s.step().map_err(|e| TestCaseError::fail(e.to_string()))?;
    s.apply(&engine_outputs(&plan, 0))
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let live: Vec<RequestId> = s.running_ids().collect();
    for id in live {
        s.abort(id)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    for id in 0..10 {
        let _ = s.abort(RequestId(id));
    }
    prop_assert!(s.is_idle(), "{:?}", s.census());
    audited(&s)?;
    prop_assert_eq!(s.manager().audit().unwrap().in_use_blocks(), 0);
    Ok(())
}
