//! Random drives of the `Scheduler`: submissions with shared prefixes,
//! steps with random engine stops and (with speculative decoding) random
//! numbers of accepted drafts, aborts (also between plan and apply) and
//! cancellations. After every operation both conservation laws must hold
//! (`audit`), every planned request must be running exactly once, and the
//! engine's block tables, rebuilt only from the plans' deltas, must equal
//! the scheduler's (rolled-back blocks included). Every run then drains: everything submitted finishes or
//! is aborted, and every block is back.

use std::collections::HashMap;

use kvbm_blocks::BlockId;
use kvbm_queue::{
    EngineOutput, GenerationReserve, InferenceRequest, Priority, RequestId, Scheduler,
    SchedulerConfig, StepPlan, StepReport,
};
use proptest::prelude::*;

use super::scheduler::{BS, Gpu, scheduler};

#[derive(Clone, Debug)]
enum Op {
    Submit {
        id: u64,
        family: u32,
        extra: u32,
        max_new: u32,
        priority: Priority,
    },
    Step {
        stops: u16,
    },
    StepAbortingMidway {
        victim: usize,
        stops: u16,
    },
    Abort(u64),
    Cancel(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let priority = prop_oneof![
        Just(Priority::Low),
        Just(Priority::Normal),
        Just(Priority::High),
        Just(Priority::Critical)
    ];
    prop_oneof![
        3 => (0u64..12, 0u32..3, 0u32..14, 0u32..12, priority)
            .prop_map(|(id, family, extra, max_new, priority)| Op::Submit { id, family, extra, max_new, priority }),
        6 => any::<u16>().prop_map(|stops| Op::Step { stops }),
        1 => (any::<usize>(), any::<u16>()).prop_map(|(victim, stops)| Op::StepAbortingMidway { victim, stops }),
        1 => (0u64..12).prop_map(Op::Abort),
        1 => (0u64..12).prop_map(Op::Cancel),
    ]
}

/// Requests of one family share an 8-token prefix.
fn prompt(family: u32, extra: u32, id: u64) -> Vec<u32> {
    let mut tokens: Vec<u32> = (family * 1000..family * 1000 + 8).collect();
    tokens.extend((0..extra).map(|i| 500_000 + id as u32 * 100 + i));
    tokens
}

/// The engine's side: block tables rebuilt from deltas alone.
#[derive(Default)]
struct Engine {
    tables: HashMap<RequestId, Vec<BlockId>>,
}

impl Engine {
    fn outputs(&mut self, plan: &StepPlan, stops: u16) -> Vec<EngineOutput> {
        let mut out = Vec::new();
        for (k, p) in plan.prefill.iter().enumerate() {
            self.extend(p.id, &p.new_blocks, p.resumed);
            out.push(match p.emits_token {
                true if stops >> (k % 16) & 1 == 1 => EngineOutput::stop(p.id, 7),
                true => EngineOutput::token(p.id, 7),
                false => EngineOutput::no_token(p.id),
            });
        }
        for (k, d) in plan.decode.iter().enumerate() {
            self.extend(d.id, &d.new_blocks, d.resumed);
            let stop = stops >> ((k + 5) % 16) & 1 == 1 && stops & 0b11 == 0;
            // Accept a pseudo-random prefix of the drafts: none to all.
            let accepted = (usize::from(stops) >> (k % 8)) % (d.draft_tokens + 1);
            let output = EngineOutput::speculative(d.id, vec![11; accepted], 9);
            out.push(if stop { output.with_stop() } else { output });
        }
        out
    }

    /// Drops the blocks a speculative step gave back from the tables' ends.
    fn roll_back(&mut self, report: &StepReport) -> Result<(), TestCaseError> {
        for rolled in &report.rolled_back {
            let table = self.tables.entry(rolled.id).or_default();
            for block in &rolled.blocks {
                prop_assert_eq!(
                    table.pop(),
                    Some(*block),
                    "{} rolled back out of order",
                    rolled.id
                );
            }
        }
        Ok(())
    }

    fn extend(&mut self, id: RequestId, blocks: &[BlockId], resumed: bool) {
        let table = self.tables.entry(id).or_default();
        if resumed {
            table.clear();
        }
        table.extend_from_slice(blocks);
    }
}

fn check(
    s: &Scheduler<Gpu>,
    plan: Option<&StepPlan>,
    engine: &Engine,
) -> Result<(), TestCaseError> {
    let census = s.audit().map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert!(census.is_balanced(), "{:?}", census);
    if let Some(plan) = plan {
        let mut seen = std::collections::HashSet::new();
        let running: Vec<RequestId> = s.running_ids().collect();
        for id in plan
            .prefill
            .iter()
            .map(|p| p.id)
            .chain(plan.decode.iter().map(|d| d.id))
        {
            prop_assert!(seen.insert(id), "{} planned twice", id);
            prop_assert!(running.contains(&id), "{} planned but not running", id);
            let table = s.block_table(id).unwrap_or_default();
            prop_assert_eq!(engine.tables.get(&id), Some(&table), "{} table drifted", id);
        }
        prop_assert!(plan.num_tokens() <= s.config().token_budget);
        for d in &plan.decode {
            prop_assert!(d.draft_tokens <= s.config().speculative_tokens);
        }
        // The slot mapping agrees with the tables the engine rebuilt.
        let ranges = plan.prefill.iter().map(|p| (p.id, p.start, p.num_tokens));
        let decodes = plan
            .decode
            .iter()
            .map(|d| (d.id, d.position, d.num_tokens()));
        let mut expected = Vec::new();
        for (id, start, tokens) in ranges.chain(decodes) {
            let table = &engine.tables[&id];
            expected.extend(
                (start..start + tokens)
                    .map(|pos| u64::from(table[pos / BS].get()) * BS as u64 + (pos % BS) as u64),
            );
        }
        let mut slots = Vec::new();
        s.slot_mapping(plan, &mut slots)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(slots, expected);
    }
    Ok(())
}

/// Applies `outputs`, then checks the report against them: tokens gained,
/// drafts accepted, and the engine's tables after the rollbacks.
fn apply(
    s: &mut Scheduler<Gpu>,
    engine: &mut Engine,
    outputs: &[EngineOutput],
) -> Result<(), TestCaseError> {
    let before: HashMap<RequestId, usize> = outputs
        .iter()
        .filter_map(|o| Some((o.id, s.tokens(o.id)?.len())))
        .collect();
    let report = s
        .apply(outputs)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    engine.roll_back(&report)?;
    let mut accepted = 0;
    for output in outputs {
        let Some(&len) = before.get(&output.id) else {
            continue;
        };
        accepted += output.accepted_drafts.len();
        let Some(tokens) = s.tokens(output.id) else {
            continue;
        };
        prop_assert_eq!(tokens.len(), len + output.num_tokens());
        if output.token.is_some() {
            let table = s.block_table(output.id).unwrap_or_default();
            // Blocks cover the computed tokens (all but the new tail), and
            // none lies beyond the tail's slot.
            prop_assert!(table.len() * BS >= tokens.len() - 1);
            prop_assert!(
                table.len() <= tokens.len() / BS + 1,
                "{} kept rejected blocks",
                output.id
            );
        }
    }
    prop_assert_eq!(report.accepted_draft_tokens, accepted);
    Ok(())
}

fn drive(blocks: usize, capped: bool, spec: usize, ops: &[Op]) -> Result<(), TestCaseError> {
    let reserve = if capped {
        GenerationReserve::Capped(0)
    } else {
        GenerationReserve::default()
    };
    let config = SchedulerConfig::default()
        .with_chunk_size(6)
        .with_token_budget(16)
        .with_max_running(3)
        .with_reserve(reserve)
        .with_speculative_tokens(spec);
    let mut s = scheduler(blocks, config);
    let mut engine = Engine::default();
    for op in ops {
        match *op {
            Op::Submit {
                id,
                family,
                extra,
                max_new,
                priority,
            } => {
                let request =
                    InferenceRequest::new(RequestId(id), prompt(family, extra, id), max_new)
                        .with_priority(priority);
                let _ = s.submit(request);
                check(&s, None, &engine)?;
            }
            Op::Step { stops } => {
                let plan = s.step().map_err(|e| TestCaseError::fail(e.to_string()))?;
                let outputs = engine.outputs(&plan, stops);
                check(&s, Some(&plan), &engine)?;
                apply(&mut s, &mut engine, &outputs)?;
                check(&s, None, &engine)?;
            }
            Op::StepAbortingMidway { victim, stops } => {
                let plan = s.step().map_err(|e| TestCaseError::fail(e.to_string()))?;
                let outputs = engine.outputs(&plan, stops);
                let running: Vec<RequestId> = s.running_ids().collect();
                if !running.is_empty() {
                    s.abort(running[victim % running.len()])
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    check(&s, None, &engine)?;
                }
                apply(&mut s, &mut engine, &outputs)?;
                check(&s, None, &engine)?;
            }
            Op::Abort(id) => {
                let _ = s.abort(RequestId(id));
                check(&s, None, &engine)?;
            }
            Op::Cancel(id) => {
                s.submit_handle().cancel(RequestId(id));
                check(&s, None, &engine)?;
            }
        }
    }
    // Drain: with nothing new arriving, everything must finish.
    for _ in 0..2_000 {
        if s.is_idle() {
            break;
        }
        let plan = s.step().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let outputs = engine.outputs(&plan, 0);
        check(&s, Some(&plan), &engine)?;
        apply(&mut s, &mut engine, &outputs)?;
    }
    prop_assert!(s.is_idle(), "did not drain: {:?}", s);
    let census = s.audit().map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(census.submitted, census.finished + census.aborted);
    prop_assert_eq!(s.manager().metrics().in_use_blocks, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn scheduler_conserves_requests_and_blocks(
        blocks in 6usize..24,
        capped in any::<bool>(),
        spec in prop_oneof![2 => Just(0usize), 1 => 1usize..6],
        ops in prop::collection::vec(op(), 1..60),
    ) {
        prop_assume!(blocks * BS >= 8);
        drive(blocks, capped, spec, &ops)?;
    }
}
