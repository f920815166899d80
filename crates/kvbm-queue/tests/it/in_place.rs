//! `Scheduler::run_decodes_in_place` against the steps it stands for: two
//! schedulers run the same random workload, one only through `step` +
//! `apply`, the other running decodes in place wherever it can. After each
//! run in place the first runs as many steps, each of which must be that
//! run's kind (a decode of every running request, no table update, nothing
//! reported but their tokens); then both must agree on everything
//! observable: census, tokens, block tables, cache events, metrics of the
//! pool, and the next plan and report, step numbers included.

use kvbm_blocks::EventSubscription;
use kvbm_queue::{
    EngineOutput, FinishReason, InferenceRequest, RequestId, Scheduler, SchedulerConfig, StepPlan,
    StepReport,
};
use proptest::prelude::*;

use super::fuzz_cases;
use super::scheduler::{Gpu, scheduler};

/// The token a deterministic engine samples computing slot `position`.
fn token(id: RequestId, position: usize) -> u32 {
    (id.0 as u32).wrapping_mul(7919) ^ position as u32
}

/// That engine's outputs for a plan; a stop where `stops` says so.
fn outputs(plan: &StepPlan, stops: u64) -> Vec<EngineOutput> {
    let prefill = plan.prefill.iter().map(|p| match p.emits_token {
        true => EngineOutput::token(p.id, token(p.id, p.start + p.num_tokens)),
        false => EngineOutput::no_token(p.id),
    });
    let decode = plan.decode.iter().map(|d| {
        let output = EngineOutput::token(d.id, token(d.id, d.position));
        match stops >> (d.position % 64) & 1 == 1 && d.position % 5 == 0 {
            true => output.with_stop(),
            false => output,
        }
    });
    prefill.chain(decode).collect()
}

#[derive(Clone, Debug)]
struct Workload {
    blocks: usize,
    config: SchedulerConfig,
    /// (step to arrive at, prompt length, shared prefix length, max new).
    arrivals: Vec<(u64, u32, u32, u32)>,
    /// Caps of successive runs in place.
    caps: Vec<u64>,
    stops: u64,
}

fn workload() -> impl Strategy<Value = Workload> {
    let limits = (1usize..4, 1usize..40, 1usize..40, 0usize..3);
    let arrival = (0u64..120, 1u32..40, 0u32..16, 1u32..60);
    (
        4usize..40,
        limits,
        prop::collection::vec(arrival, 1..6),
        prop::collection::vec(0u64..40, 1..8),
        prop_oneof![Just(0u64), any::<u64>()],
    )
        .prop_map(
            |(blocks, (max_running, budget, chunk, watermark), arrivals, caps, stops)| Workload {
                blocks,
                config: SchedulerConfig::default()
                    .with_max_running(max_running)
                    .with_token_budget(budget)
                    .with_chunk_size(chunk)
                    .with_watermark_blocks(watermark),
                arrivals,
                caps,
                stops,
            },
        )
}

fn prompt(i: usize, len: u32, shared: u32) -> Vec<u32> {
    (0..len)
        .map(|t| match t < shared {
            true => t,
            false => 10_000 * (i as u32 + 1) + t,
        })
        .collect()
}

/// Submits to both every arrival due by step `now` not yet submitted.
fn submit_due(
    w: &Workload,
    now: u64,
    submitted: &mut [bool],
    both: [&Scheduler<Gpu>; 2],
) -> Result<(), TestCaseError> {
    for (i, &(at, len, shared, max_new)) in w.arrivals.iter().enumerate() {
        if at > now || submitted[i] {
            continue;
        }
        submitted[i] = true;
        let results = both.map(|s| {
            s.submit(InferenceRequest::new(
                RequestId(i as u64),
                prompt(i, len, shared),
                max_new,
            ))
            .is_ok()
        });
        prop_assert_eq!(results[0], results[1]);
    }
    Ok(())
}

/// Everything a caller can observe of a scheduler and its pool's events.
fn observe(
    s: &Scheduler<Gpu>,
    events: &EventSubscription,
    ids: usize,
) -> (String, Vec<String>, String) {
    let requests = (0..ids as u64)
        .map(RequestId)
        .map(|id| format!("{:?} {:?}", s.tokens(id), s.block_table(id)))
        .collect();
    let events = format!("{:?}", events.drain());
    (format!("{:?}", s.census()), requests, events)
}

fn run_both(w: &Workload) -> Result<u64, TestCaseError> {
    let mut plain = scheduler(w.blocks, w.config);
    let mut fused = scheduler(w.blocks, w.config);
    let plain_events = plain.manager().subscribe_events(1 << 16);
    let fused_events = fused.manager().subscribe_events(1 << 16);
    let mut submitted = vec![false; w.arrivals.len()];
    let mut in_place = 0u64;
    let mut now = 0u64;
    for round in 0..2_000usize {
        submit_due(w, now, &mut submitted, [&plain, &fused])?;
        let all_in = submitted.iter().all(|&s| s);
        if all_in && plain.is_idle() && fused.is_idle() {
            return Ok(in_place);
        }
        // Never past the next arrival, so both see it at the same step.
        let next_arrival = (w.arrivals.iter().zip(&submitted))
            .filter(|&(_, &done)| !done)
            .map(|(a, _)| a.0)
            .min();
        let cap = w.caps[round % w.caps.len()]
            .min(next_arrival.map_or(u64::MAX, |at| at.saturating_sub(now)));
        let ran = fused.run_decodes_in_place(cap, |id, position| {
            (w.stops >> (position % 64) & 1 == 0 || position % 5 != 0).then(|| token(id, position))
        });
        prop_assert!(ran.steps <= cap);
        for _ in 0..ran.steps {
            let plan = plain
                .step()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(plan.prefill.is_empty() && plan.preempted.is_empty());
            prop_assert!(plan.finished.is_empty() && plan.transfers.is_empty());
            prop_assert_eq!(plan.decode.len(), ran.requests);
            for decode in &plan.decode {
                prop_assert!(!decode.resumed && decode.new_blocks.is_empty());
                prop_assert_eq!(decode.draft_tokens, 0);
            }
            let report = (plain.apply(&outputs(&plan, w.stops)))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(report.finished.is_empty() && report.first_tokens.is_empty());
            prop_assert_eq!(report.generated_tokens, ran.requests);
        }
        in_place += ran.steps;
        now += ran.steps;
        prop_assert_eq!(
            observe(&plain, &plain_events, w.arrivals.len()),
            observe(&fused, &fused_events, w.arrivals.len())
        );
        prop_assert_eq!(plain.manager().metrics(), fused.manager().metrics());
        // One ordinary step of both, if there is anything to run.
        submit_due(w, now, &mut submitted, [&plain, &fused])?;
        let step = |s: &mut Scheduler<Gpu>| -> Result<(StepPlan, StepReport), TestCaseError> {
            let plan = s.step().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let report = (s.apply(&outputs(&plan, w.stops)))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            s.audit().map_err(|e| TestCaseError::fail(e.to_string()))?;
            Ok((plan, report))
        };
        let (a, b) = (step(&mut plain)?, step(&mut fused)?);
        prop_assert_eq!(&a, &b);
        if !a.0.is_empty() || !a.0.finished.is_empty() || !a.0.preempted.is_empty() {
            now += 1;
        } else if let Some(at) = next_arrival {
            // Idle until the next arrival.
            now = now.max(at);
        }
    }
    Err(TestCaseError::fail("no end after 2,000 rounds"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fuzz_cases(96)))]

    /// Running decodes in place changes nothing a caller can see.
    #[test]
    fn fuzz_decodes_in_place_match_their_steps(w in workload()) {
        run_both(&w)?;
    }
}

/// A lone request's decodes run in place between its block boundaries: 64
/// tokens of a 3-token prompt in 4-token blocks take the prompt's step,
/// then runs of at most 3 in place, each ended by the step that
/// registers or allocates a block, and the last token's step.
#[test]
fn a_lone_request_decodes_in_place_between_block_boundaries() {
    let mut s = scheduler(64, SchedulerConfig::default());
    s.submit(InferenceRequest::new(RequestId(1), vec![1, 2, 3], 64))
        .unwrap();
    let mut in_place = 0;
    let mut steps = 0;
    let finished = loop {
        in_place +=
            (s.run_decodes_in_place(u64::MAX, |id, position| Some(token(id, position)))).steps;
        let plan = s.step().unwrap();
        steps += 1;
        let report = s.apply(&outputs(&plan, 0)).unwrap();
        if let Some(done) = report.finished.first() {
            break *done;
        }
    };
    assert_eq!(finished.reason, FinishReason::MaxTokens);
    assert_eq!(finished.generated_tokens, 64);
    // Slots 3..66 are computed by 63 decodes after the prompt's step. A
    // decode whose slot opens a block allocates it, and the one before
    // registers the block it completes: of each block's four slots two
    // decode in place.
    assert_eq!(in_place + steps, 64);
    assert!(in_place >= 28, "{in_place} of 63 decodes in place");
}

/// A request submitted from another handle while decodes run in place
/// stops them before the next step: the run notices the arrival without
/// locking the queue each step, and the plain step that follows admits it.
#[test]
fn an_arrival_during_a_run_in_place_ends_it_at_the_next_step() {
    // A 5-token prompt in 4-token blocks: slots 5 and 6 decode in place.
    let prefilled = || {
        let mut s = scheduler(64, SchedulerConfig::default());
        s.submit(InferenceRequest::new(RequestId(1), vec![1, 2, 3, 4, 5], 64))
            .unwrap();
        let plan = s.step().unwrap();
        s.apply(&outputs(&plan, 0)).unwrap();
        s
    };
    let mut alone = prefilled();
    let ran = alone.run_decodes_in_place(u64::MAX, |id, position| Some(token(id, position)));
    assert_eq!(ran.steps, 2, "the run without an arrival");

    let mut s = prefilled();
    let handle = s.submit_handle();
    let mut samples = 0;
    let ran = s.run_decodes_in_place(u64::MAX, |id, position| {
        samples += 1;
        handle
            .submit(InferenceRequest::new(RequestId(2), vec![5, 6, 7], 4))
            .unwrap();
        Some(token(id, position))
    });
    // The step that sampled when the request came still ran; the next did not.
    assert_eq!((ran.steps, samples), (1, 1));
    let plan = s.step().unwrap();
    assert!(
        plan.prefill.iter().any(|p| p.id == RequestId(2)),
        "{plan:?}"
    );
}

/// Nothing runs in place, and nothing changes, unless every running
/// request decodes within its blocks: one waiting, a pending step, a
/// cancellation, speculative decoding, an engine that would stop, or one
/// request whose slot completes a block stops it; two requests mid-block
/// run together.
#[test]
fn nothing_runs_in_place_unless_every_request_decodes_within_its_blocks() {
    let decode_ready = |config: SchedulerConfig, prompts: &[(u64, usize)]| {
        let mut s = scheduler(64, config);
        for &(id, len) in prompts {
            s.submit(InferenceRequest::new(
                RequestId(id),
                vec![id as u32; len],
                40,
            ))
            .unwrap();
        }
        let plan = s.step().unwrap();
        s.apply(&outputs(&plan, 0)).unwrap();
        s
    };
    let any = |_: RequestId, position: usize| Some(position as u32);
    let steps = |s: &mut Scheduler<Gpu>, max: u64| s.run_decodes_in_place(max, any).steps;

    // Two 5-token prompts in 4-token blocks: slots 5 and 6 of both decode
    // in place together; slot 7 completes their second blocks.
    let two = SchedulerConfig::default();
    let mut s = decode_ready(two, &[(1, 5), (2, 5)]);
    let ran = s.run_decodes_in_place(10, any);
    assert_eq!((ran.steps, ran.requests), (2, 2), "two mid-block");
    // A 7-token prompt's slot 7 completes its block at once.
    let mut s = decode_ready(two, &[(1, 5), (2, 7)]);
    let ran = s.run_decodes_in_place(10, any);
    assert_eq!((ran.steps, ran.requests), (0, 0), "one at a block's end");

    let one = SchedulerConfig::default().with_max_running(1);
    let mut s = decode_ready(one, &[(1, 5), (2, 5)]);
    assert_eq!(steps(&mut s, 10), 0, "one waiting");

    let mut s = decode_ready(one, &[(1, 5)]);
    let census = s.census();
    let _plan = s.step().unwrap();
    assert_eq!(steps(&mut s, 10), 0, "a step pending");
    assert_eq!(s.census(), census);

    let mut s = decode_ready(one, &[(1, 5)]);
    assert!(s.cancel(RequestId(1)));
    assert_eq!(steps(&mut s, 10), 0, "cancelled");

    let spec = SchedulerConfig::default().with_speculative_tokens(2);
    let mut s = decode_ready(spec, &[(1, 5)]);
    assert_eq!(steps(&mut s, 10), 0, "speculative decoding");

    let mut s = decode_ready(one, &[(1, 5)]);
    let tokens = s.tokens(RequestId(1)).unwrap().to_vec();
    assert_eq!(
        s.run_decodes_in_place(10, |_, _| None).steps,
        0,
        "the engine stops"
    );
    assert_eq!(s.tokens(RequestId(1)).unwrap(), tokens);
    assert_eq!(steps(&mut s, 0), 0, "no steps asked for");
    assert_eq!(steps(&mut s, 10), 2, "slots 5 and 6, then 7 registers");
}
