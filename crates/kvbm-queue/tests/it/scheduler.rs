//! The `Scheduler` on small hand-made workloads whose right schedule can be
//! worked out by hand: chunk boundaries, admission order, the token budget,
//! preemption and resumption from the cache, aborts, and refused calls.
//! Both conservation laws are audited after every call.

use kvbm_blocks::{BlockId, BlockManager};
use kvbm_queue::{
    EngineOutput, FinishReason, GenerationReserve, InferenceRequest, Priority, QueueError,
    RequestId, Scheduler, SchedulerConfig, SchedulerError, StepPlan, StepReport,
};

#[derive(Debug)]
pub(crate) struct Gpu;

pub(crate) const BS: usize = 4;

pub(crate) fn scheduler(blocks: usize, config: SchedulerConfig) -> Scheduler<Gpu> {
    let manager = BlockManager::<Gpu>::builder()
        .block_count(blocks)
        .block_size(BS)
        .build()
        .expect("valid pool");
    Scheduler::new(manager, config).expect("valid config")
}

pub(crate) fn request(id: u64, prompt: std::ops::Range<u32>, max_new: u32) -> InferenceRequest {
    InferenceRequest::new(RequestId(id), prompt.collect::<Vec<u32>>(), max_new)
}

/// What a deterministic engine samples: a token wherever one is due.
pub(crate) fn outputs(plan: &StepPlan) -> Vec<EngineOutput> {
    let prefill = plan.prefill.iter().map(|p| match p.emits_token {
        true => EngineOutput::token(p.id, 1000 + p.id.0 as u32),
        false => EngineOutput::no_token(p.id),
    });
    let decode = plan
        .decode
        .iter()
        .map(|d| EngineOutput::token(d.id, 2000 + d.position as u32));
    prefill.chain(decode).collect()
}

/// Plans, runs and applies one step, auditing before and after.
pub(crate) fn run(s: &mut Scheduler<Gpu>) -> (StepPlan, StepReport) {
    s.audit().expect("consistent before the step");
    let plan = s.step().expect("no step pending");
    s.audit().expect("consistent after planning");
    let report = s.apply(&outputs(&plan)).expect("outputs match the plan");
    s.audit().expect("consistent after applying");
    (plan, report)
}

fn ids(xs: impl IntoIterator<Item = RequestId>) -> Vec<u64> {
    xs.into_iter().map(|id| id.0).collect()
}

fn blocks(xs: &[BlockId]) -> Vec<u32> {
    xs.iter().map(|b| b.get()).collect()
}

/// Pool of 6 blocks (24 tokens); requests 1 and 2 each have 8 prompt tokens
/// and generate 8, so together they need 8 blocks: one gets preempted. No
/// generation reserve, so both are admitted at once.
pub(crate) fn two_requests_in_a_small_pool() -> Scheduler<Gpu> {
    let config = SchedulerConfig::default().with_reserve(GenerationReserve::Capped(0));
    let s = scheduler(6, config);
    s.submit(request(1, 0..8, 8)).unwrap();
    s.submit(request(2, 100..108, 8)).unwrap();
    s
}

/// Runs audited steps until `id` is preempted.
pub(crate) fn run_until_preempted(s: &mut Scheduler<Gpu>, id: RequestId) {
    loop {
        let (plan, _) = run(s);
        if plan.preempted.contains(&id) {
            return;
        }
    }
}

#[test]
fn outputs_in_any_order_apply_as_outputs_in_the_plans_order() {
    // Prefills, decodes and preemptions in one workload: eight requests
    // of several lengths sharing prefixes, in a pool too small for all.
    let setup = || {
        let s = scheduler(24, SchedulerConfig::default().with_token_budget(40));
        for id in 0..8u64 {
            let start = (id % 3) as u32 * 100;
            let len = 6 + (id as u32 * 5) % 23;
            s.submit(request(id, start..start + len, 5 + id as u32 % 4))
                .unwrap();
        }
        s
    };
    let (mut in_order, mut reversed) = (setup(), setup());
    let mut preempted = 0;
    for step in 0.. {
        assert!(step < 500, "the workload finishes");
        let plan = in_order.step().unwrap();
        assert_eq!(reversed.step().unwrap(), plan, "step {step}");
        preempted += plan.preempted.len();
        let outputs = outputs(&plan);
        let mut backwards = outputs.clone();
        backwards.reverse();
        let report = in_order.apply(&outputs).unwrap();
        assert_eq!(reversed.apply(&backwards).unwrap(), report, "step {step}");
        reversed.audit().unwrap();
        assert_eq!(reversed.census(), in_order.census(), "step {step}");
        if in_order.is_idle() {
            break;
        }
    }
    assert!(preempted > 0, "the workload preempts");
    assert_eq!(in_order.census().finished, 8);
}

#[test]
fn a_prompt_prefills_in_chunks_then_decodes_to_max_tokens() {
    let config = SchedulerConfig::default().with_chunk_size(4);
    let mut s = scheduler(16, config);
    s.submit(request(1, 0..10, 3)).unwrap();

    // Chunks of 4, 4, 2: only the last samples the first token.
    let mut starts = vec![];
    for (start, len, emits) in [(0, 4, false), (4, 4, false), (8, 2, true)] {
        let (plan, report) = run(&mut s);
        let chunk = &plan.prefill[0];
        assert_eq!(
            (chunk.start, chunk.num_tokens, chunk.emits_token),
            (start, len, emits)
        );
        assert_eq!(
            chunk.resumed,
            start == 0,
            "only the first chunk sends a fresh table"
        );
        assert_eq!(report.first_tokens.len(), usize::from(emits));
        starts.push(blocks(&chunk.new_blocks));
    }
    assert_eq!(
        starts,
        [vec![0], vec![1], vec![2]],
        "one new block per chunk"
    );

    // Two decodes compute positions 10 and 11; the third token ends it.
    let (plan, report) = run(&mut s);
    assert_eq!((plan.decode[0].position, report.generated_tokens), (10, 1));
    let (plan, report) = run(&mut s);
    assert_eq!(plan.decode[0].position, 11);
    assert_eq!(report.finished.len(), 1);
    let done = report.finished[0];
    assert_eq!(
        (done.reason, done.generated_tokens),
        (FinishReason::MaxTokens, 3)
    );
    assert!(s.is_idle());
    let census = s.audit().unwrap();
    assert_eq!(
        (census.submitted, census.finished, census.running),
        (1, 1, 0)
    );
    // Everything went back: the prompt's computed blocks are cached.
    let metrics = s.manager().metrics();
    assert_eq!(metrics.in_use_blocks, 0);
    assert_eq!(
        metrics.inactive_blocks, 3,
        "blocks 0..12 had their KV computed"
    );
}

#[test]
fn admission_follows_priority_then_arrival() {
    let mut s = scheduler(64, SchedulerConfig::default());
    s.submit(request(1, 0..4, 1)).unwrap();
    s.submit(request(2, 10..14, 1).with_priority(Priority::High))
        .unwrap();
    s.submit(request(3, 20..24, 1)).unwrap();
    s.submit(request(4, 30..34, 1).with_priority(Priority::Low))
        .unwrap();
    let (plan, _) = run(&mut s);
    assert_eq!(ids(plan.prefill.iter().map(|p| p.id)), [2, 1, 3, 4]);
}

#[test]
fn the_token_budget_splits_chunks_and_stops_admission() {
    let config = SchedulerConfig::default()
        .with_token_budget(6)
        .with_chunk_size(4);
    let mut s = scheduler(64, config);
    for id in 1..=3 {
        s.submit(request(id, (id as u32 * 100)..(id as u32 * 100 + 8), 2))
            .unwrap();
    }
    let (plan, _) = run(&mut s);
    let chunks: Vec<_> = plan
        .prefill
        .iter()
        .map(|p| (p.id.0, p.num_tokens))
        .collect();
    assert_eq!(
        chunks,
        [(1, 4), (2, 2)],
        "the second chunk takes what is left"
    );
    assert_eq!(plan.num_tokens(), 6);
    assert_eq!(s.census().waiting, 1, "request 3 waits for budget");
    // Next step: running requests first (4 + 2 tokens), nothing admitted.
    let (plan, _) = run(&mut s);
    let chunks: Vec<_> = plan
        .prefill
        .iter()
        .map(|p| (p.id.0, p.start, p.num_tokens))
        .collect();
    assert_eq!(chunks, [(1, 4, 4), (2, 2, 2)]);
}

#[test]
fn max_running_caps_admission() {
    let config = SchedulerConfig::default().with_max_running(2);
    let mut s = scheduler(64, config);
    for id in 1..=3 {
        s.submit(request(id, 0..4, 5)).unwrap();
    }
    let (plan, _) = run(&mut s);
    assert_eq!(plan.prefill.len(), 2);
    assert_eq!(s.census().running, 2);
}

#[test]
fn a_second_request_reuses_the_cached_prompt_prefix() {
    let mut s = scheduler(64, SchedulerConfig::default());
    s.submit(request(1, 0..12, 1)).unwrap();
    while !s.is_idle() {
        run(&mut s);
    }
    // Same 8-token prefix, different tail.
    let mut prompt: Vec<u32> = (0..8).collect();
    prompt.extend(50..56);
    s.submit(InferenceRequest::new(RequestId(2), prompt, 1))
        .unwrap();
    let (plan, _) = run(&mut s);
    assert_eq!(plan.prefill[0].start, 8, "two blocks came from the cache");
    assert_eq!(plan.prefill[0].num_tokens, 6);
    assert_eq!(
        blocks(&plan.prefill[0].new_blocks)[..2],
        [0, 1],
        "the cached blocks, resumed table"
    );
    let census = s.census();
    assert_eq!(
        (census.prompt_tokens, census.prefix_hit_tokens),
        (12 + 14, 8)
    );
}

/// Pool of 6 blocks (24 tokens). Two requests of 8 prompt tokens generate 8
/// each: together they need 8 blocks, so the later one is preempted when the
/// earlier needs its fifth... and resumes from its cached prefix afterwards.
#[test]
fn running_out_of_blocks_preempts_the_latest_admission_which_resumes_from_cache() {
    let mut s = two_requests_in_a_small_pool();
    let mut preempted_at = None;
    let mut resumed_start = None;
    let mut finished = vec![];
    for step in 0..100 {
        if s.is_idle() {
            break;
        }
        let (plan, report) = run(&mut s);
        if !plan.preempted.is_empty() {
            assert_eq!(
                ids(plan.preempted.iter().copied()),
                [2],
                "the later admission goes"
            );
            assert!(
                plan.decode.iter().any(|d| d.id == RequestId(1)),
                "request 1 keeps running"
            );
            preempted_at.get_or_insert(step);
        }
        if let Some(p) = plan
            .prefill
            .iter()
            .find(|p| p.id == RequestId(2) && p.resumed && p.start > 0)
        {
            resumed_start.get_or_insert(p.start);
            assert!(
                !p.emits_token || p.start + p.num_tokens > 8,
                "recompute samples nothing new"
            );
        }
        finished.extend(
            report
                .finished
                .iter()
                .map(|f| (f.id.0, f.reason, f.generated_tokens)),
        );
    }
    assert!(preempted_at.is_some(), "the pool was too small for both");
    assert!(
        resumed_start.unwrap_or(0) >= 8,
        "request 2 reacquired at least its prompt blocks"
    );
    finished.sort_unstable_by_key(|f| f.0);
    assert_eq!(
        finished,
        [
            (1, FinishReason::MaxTokens, 8),
            (2, FinishReason::MaxTokens, 8)
        ]
    );
    let census = s.audit().unwrap();
    assert!(census.preemptions >= 1);
    assert_eq!((census.finished, census.aborted), (2, 0));
}

#[test]
fn preempted_requests_keep_their_generated_tokens() {
    let mut s = two_requests_in_a_small_pool();
    let tokens_before = loop {
        let before = s.tokens(RequestId(2)).map(|tokens| tokens.to_vec());
        let (plan, _) = run(&mut s);
        if plan.preempted.contains(&RequestId(2)) {
            break before.unwrap();
        }
    };
    assert!(
        tokens_before.len() > 8,
        "it had generated before being preempted"
    );
    while s.tokens(RequestId(2)).is_none() {
        run(&mut s);
    }
    let resumed = s.tokens(RequestId(2)).unwrap().to_vec();
    assert_eq!(&resumed[..tokens_before.len()], &tokens_before[..]);
}

#[test]
fn a_request_longer_than_the_pool_finishes_with_capacity_exceeded() {
    let config = SchedulerConfig::default().with_reserve(GenerationReserve::Capped(0));
    let mut s = scheduler(4, config);
    s.submit(request(1, 0..8, 100)).unwrap();
    let mut outcome = None;
    for _ in 0..50 {
        let plan = s.step().unwrap();
        if let Some(done) = plan.finished.first() {
            outcome = Some((done.reason, done.generated_tokens));
        }
        s.apply(&outputs(&plan)).unwrap();
        s.audit().unwrap();
        if outcome.is_some() {
            break;
        }
    }
    // 4 blocks hold the KV of positions 0..16: the forward pass at position
    // 15 samples the 9th generated token (position 16), whose own KV would
    // need a fifth block.
    assert_eq!(outcome, Some((FinishReason::CapacityExceeded, 9)));
    assert!(s.is_idle());
    assert_eq!(s.census().aborted, 1);
}

#[test]
fn an_engine_stop_finishes_early() {
    let mut s = scheduler(16, SchedulerConfig::default());
    s.submit(request(1, 0..4, 50)).unwrap();
    let plan = s.step().unwrap();
    s.apply(&outputs(&plan)).unwrap();
    let plan = s.step().unwrap();
    let report = s.apply(&[EngineOutput::stop(RequestId(1), 7)]).unwrap();
    assert_eq!(plan.decode.len(), 1);
    assert_eq!(report.finished[0].reason, FinishReason::Stop);
    assert_eq!(report.finished[0].generated_tokens, 2);
    assert!(s.is_idle());
    s.audit().unwrap();
}

#[test]
fn aborting_in_any_state_gives_everything_back() {
    let mut s = two_requests_in_a_small_pool();
    s.submit(request(3, 200..204, 8)).unwrap();
    run(&mut s);
    // Waiting: request 3 was not admitted? Abort whatever waits.
    let _ = s.abort(RequestId(3));
    assert!(matches!(
        s.abort(RequestId(3)),
        Err(SchedulerError::UnknownRequest { .. })
    ));
    s.audit().unwrap();
    // Running, mid-step: its output is ignored.
    let plan = s.step().unwrap();
    let done = s.abort(RequestId(1)).unwrap();
    assert_eq!(done.reason, FinishReason::Aborted);
    s.apply(&outputs(&plan)).unwrap();
    s.audit().unwrap();
    // Drive request 2 to completion; nothing of 1 or 3 remains.
    while !s.is_idle() {
        run(&mut s);
    }
    let census = s.audit().unwrap();
    assert_eq!(
        (census.submitted, census.finished, census.aborted),
        (3, 1, 2)
    );
    assert_eq!(s.manager().metrics().in_use_blocks, 0);
}

#[test]
fn aborting_a_preempted_request_drops_its_parked_sequence() {
    let mut s = two_requests_in_a_small_pool();
    run_until_preempted(&mut s, RequestId(2));
    let done = s.abort(RequestId(2)).unwrap();
    assert!(done.generated_tokens > 0);
    let census = s.audit().unwrap();
    assert_eq!((census.waiting, census.aborted), (0, 1));
}

#[test]
fn apply_refuses_outputs_that_do_not_match_the_plan_and_changes_nothing() {
    let mut s = scheduler(16, SchedulerConfig::default().with_chunk_size(4));
    assert_eq!(s.apply(&[]).unwrap_err(), SchedulerError::NoStepPending);
    s.submit(request(1, 0..6, 4)).unwrap();
    s.submit(request(2, 10..14, 4)).unwrap();
    let plan = s.step().unwrap(); // 1: chunk 0..4 (no token); 2: all 4 (token)
    assert_eq!(
        s.step().unwrap_err(),
        SchedulerError::StepPending { step: 0 }
    );
    let good = outputs(&plan);
    let (one, two) = (RequestId(1), RequestId(2));
    let cases = [
        (
            vec![good[0].clone()],
            SchedulerError::MissingOutput { id: two },
        ),
        (
            vec![good[0].clone(), good[1].clone(), good[1].clone()],
            SchedulerError::DuplicateOutput { id: two },
        ),
        (
            vec![
                good[0].clone(),
                good[1].clone(),
                EngineOutput::token(RequestId(9), 1),
            ],
            SchedulerError::UnexpectedOutput { id: RequestId(9) },
        ),
        (
            vec![EngineOutput::token(one, 1), good[1].clone()],
            SchedulerError::UnexpectedToken { id: one },
        ),
        (
            vec![good[0].clone(), EngineOutput::no_token(two)],
            SchedulerError::MissingToken { id: two },
        ),
    ];
    let before = s.audit().unwrap();
    for (outputs, error) in cases {
        assert_eq!(s.apply(&outputs).unwrap_err(), error);
        assert_eq!(s.audit().unwrap(), before, "nothing changed");
    }
    let report = s.apply(&good).unwrap();
    assert_eq!(ids(report.first_tokens), [2]);
}

#[test]
fn bad_configurations_and_requests_are_refused() {
    let manager = BlockManager::<Gpu>::builder()
        .block_count(4)
        .block_size(BS)
        .build()
        .unwrap();
    for (config, field) in [
        (
            SchedulerConfig::default().with_max_running(0),
            "max_running",
        ),
        (
            SchedulerConfig::default().with_token_budget(0),
            "token_budget",
        ),
        (SchedulerConfig::default().with_chunk_size(0), "chunk_size"),
    ] {
        let err = Scheduler::new(manager.clone(), config).unwrap_err();
        assert_eq!(err, SchedulerError::ZeroLimit { field });
    }
    let s = scheduler(4, SchedulerConfig::default());
    let empty = s.submit(request(1, 0..0, 4)).unwrap_err();
    assert_eq!(empty.error(), &QueueError::EmptyPrompt);
    // 4 blocks of 4 tokens cannot hold 10 prompt tokens plus the default
    // 256-token generation reserve.
    let large = s.submit(request(2, 0..10, 300)).unwrap_err();
    assert!(matches!(large.error(), QueueError::TooLarge { .. }));
    s.submit(request(3, 0..4, 1)).unwrap();
    let duplicate = s.submit(request(3, 0..4, 1)).unwrap_err();
    assert_eq!(duplicate.error(), &QueueError::Duplicate);
    assert_eq!(duplicate.into_inner().prompt(), &[0, 1, 2, 3]);
}

#[test]
fn submit_handles_work_from_other_threads() {
    let mut s = scheduler(64, SchedulerConfig::default());
    let handle = s.submit_handle();
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let handle = handle.clone();
            scope.spawn(move || {
                for i in 0..5 {
                    handle.submit(request(t * 10 + i, 0..4, 1)).unwrap();
                }
            });
        }
    });
    assert!(handle.cancel(RequestId(0)));
    // Still known until a step reports it.
    assert!(handle.cancel(RequestId(0)));
    let mut cancelled = Vec::new();
    while !s.is_idle() {
        let (_, report) = run(&mut s);
        cancelled.extend(
            report
                .finished
                .iter()
                .filter(|f| f.reason == FinishReason::Cancelled)
                .map(|f| f.id),
        );
    }
    assert_eq!(cancelled, [RequestId(0)]);
    assert!(!handle.cancel(RequestId(0)));
    let census = s.audit().unwrap();
    assert_eq!(
        (census.submitted, census.finished, census.aborted),
        (20, 19, 1)
    );
}

/// A preempted request is charged its current length (prompt plus generated
/// tokens), not its original estimate, so while that does not fit it waits
/// without being reacquired and released every step (which would also keep
/// refreshing its cached prefix's recency). Prefix-credited admission may
/// match it once to learn what its cached prefix is worth, and not again
/// until the room grows.
#[test]
fn a_preempted_request_waits_without_churning_the_cache() {
    for credit in [false, true] {
        let config = SchedulerConfig::default()
            .with_reserve(GenerationReserve::Capped(0))
            .with_prefix_credit(credit);
        let mut s = scheduler(6, config);
        s.submit(request(1, 0..8, 8)).unwrap();
        s.submit(request(2, 100..108, 8)).unwrap();
        run_until_preempted(&mut s, RequestId(2));
        let mut probes = Vec::new();
        let mut last = s.manager().metrics().match_hashes_requested;
        while s.running_ids().any(|id| id == RequestId(1)) {
            let (plan, _) = run(&mut s);
            assert!(
                plan.prefill.iter().all(|p| p.id != RequestId(2)),
                "no room to resume yet"
            );
            let matches = s.manager().metrics().match_hashes_requested;
            if matches != last {
                probes.push(plan.step);
            }
            last = matches;
        }
        let allowed = usize::from(credit);
        assert!(
            probes.len() <= allowed,
            "request 2 was reacquired while it could not fit, at steps {probes:?} (credit {credit})"
        );
        while !s.is_idle() {
            run(&mut s);
        }
        assert_eq!(s.census().finished, 2);
    }
}

#[test]
fn a_reused_plan_is_the_plan_step_returns() {
    // Two schedulers fed the same requests, one planning into a plan it
    // keeps (with leftovers from a foreign plan), one with fresh plans:
    // every step plans the same, preemptions included.
    let mut fresh = two_requests_in_a_small_pool();
    let mut reused = two_requests_in_a_small_pool();
    let mut plan = StepPlan::default();
    plan.step = 99;
    plan.preempted = vec![RequestId(7)];
    let mut preempted = 0;
    while !fresh.is_idle() {
        let expected = fresh.step().unwrap();
        reused.step_into(&mut plan).unwrap();
        assert_eq!(plan, expected);
        preempted += plan.preempted.len();
        // A second plan before the apply is refused and leaves it alone.
        let before = plan.clone();
        assert!(matches!(
            reused.step_into(&mut plan),
            Err(SchedulerError::StepPending { .. })
        ));
        assert_eq!(plan, before);
        fresh.apply(&outputs(&expected)).unwrap();
        reused.apply(&outputs(&plan)).unwrap();
    }
    assert!(reused.is_idle());
    assert!(preempted > 0, "the scenario preempts");
}
