//! Speculative decoding in the `Scheduler`: drafts planned within the token
//! and output budgets, 1 to k + 1 tokens accepted per step, rejected drafts'
//! blocks rolled back LIFO and reported, only KV-complete blocks registered,
//! and refused outputs changing nothing. Blocks hold 4 tokens.

use kvbm_queue::{
    EngineOutput, FinishReason, GenerationReserve, RequestId, Scheduler, SchedulerConfig,
    SchedulerError, StepPlan,
};

use super::scheduler::{Gpu, outputs, request, run, scheduler};

const ID: RequestId = RequestId(1);

fn config(drafts: usize) -> SchedulerConfig {
    SchedulerConfig::default()
        .with_reserve(GenerationReserve::Capped(0))
        .with_speculative_tokens(drafts)
}

/// A scheduler with request 1 (prompt `0..prompt`) past its prefill, so its
/// next step decodes.
fn decoding(drafts: usize, prompt: u32, max_new: u32) -> Scheduler<Gpu> {
    let mut s = scheduler(16, config(drafts));
    s.submit(request(1, 0..prompt, max_new)).unwrap();
    let (plan, _) = run(&mut s);
    assert_eq!(plan.prefill.len(), 1, "first step prefills");
    s
}

fn step(s: &mut Scheduler<Gpu>) -> StepPlan {
    let plan = s.step().unwrap();
    s.audit().unwrap();
    plan
}

#[test]
fn a_decode_verifies_the_configured_drafts_and_the_budget_counts_them() {
    let mut s = decoding(3, 6, 20);
    let plan = step(&mut s);
    let decode = &plan.decode[0];
    assert_eq!((decode.position, decode.draft_tokens), (6, 3));
    assert_eq!(plan.num_tokens(), 4);
    assert_eq!(plan.draft_tokens(), 3);
    let mut slots = Vec::new();
    s.slot_mapping(&plan, &mut slots).unwrap();
    assert_eq!(slots.len(), 4, "tail token and three drafts");
    // Every draft accepted, plus the bonus token: four tokens in one step.
    let report = s
        .apply(&[EngineOutput::speculative(ID, vec![21, 22, 23], 24)])
        .unwrap();
    s.audit().unwrap();
    assert_eq!(report.accepted_draft_tokens, 3);
    assert_eq!(report.generated_tokens, 4);
    assert!(report.rolled_back.is_empty());
    let tokens = s.tokens(ID).unwrap().to_vec();
    assert_eq!(&tokens[6..], &[1001, 21, 22, 23, 24]);
    let census = s.census();
    assert_eq!(
        (census.spec_proposed_tokens, census.spec_accepted_tokens),
        (3, 3)
    );
    // The next step starts where the bonus token is.
    assert_eq!(step(&mut s).decode[0].position, 10);
}

#[test]
fn rejected_drafts_give_back_their_blocks_last_first_and_the_report_names_them() {
    // 7-token prompt: after prefill the tail token sits at 7. Five drafts
    // (positions 8..=12) and the bonus slot (13) need blocks 2 and 3.
    let mut s = decoding(5, 7, 20);
    let registrations = s.manager().metrics().registrations;
    let plan = step(&mut s);
    let decode = &plan.decode[0];
    assert_eq!(decode.draft_tokens, 5);
    assert_eq!(decode.new_blocks.len(), 2);
    let table = s.block_table(ID).unwrap();
    assert_eq!(table.len(), 4);
    // Nothing accepted: the correction token lands at 8, in block 2; block
    // 3 held only rejected drafts.
    let report = s
        .apply(&[EngineOutput::speculative(ID, Vec::new(), 99)])
        .unwrap();
    s.audit().unwrap();
    let rolled_back: Vec<_> = (report.rolled_back.iter())
        .map(|r| (r.id, r.blocks.clone()))
        .collect();
    assert_eq!(rolled_back, [(ID, vec![table[3]])]);
    assert_eq!(s.block_table(ID).unwrap(), table[..3].to_vec());
    assert_eq!(s.tokens(ID).unwrap().len(), 9);
    // Only the block the computed tokens (0..8) fill was published: block 1.
    // Block 2 holds position 7's successor slots, not computed KV.
    assert_eq!(s.manager().metrics().registrations, registrations + 1);
    // Next step (tail at 8, drafts to 13, bonus slot 14) needs a fourth
    // block again, and the delta names exactly that one.
    let plan = step(&mut s);
    let table = s.block_table(ID).unwrap();
    assert_eq!(plan.decode[0].new_blocks, vec![table[3]]);
    assert!(!plan.decode[0].resumed);
}

#[test]
fn drafts_shrink_to_the_token_budget_and_the_output_budget() {
    let mut s = scheduler(16, config(5).with_token_budget(3));
    s.submit(request(1, 0..2, 20)).unwrap();
    run(&mut s);
    assert_eq!(step(&mut s).decode[0].draft_tokens, 2, "3-token budget");

    // Two tokens left to generate: at most one draft plus the bonus.
    let mut s = decoding(5, 6, 3);
    assert_eq!(step(&mut s).decode[0].draft_tokens, 1);
    let report = s
        .apply(&[EngineOutput::speculative(ID, vec![5], 6)])
        .unwrap();
    assert_eq!(report.finished.len(), 1);
    assert_eq!(report.finished[0].reason, FinishReason::MaxTokens);
    assert_eq!(report.finished[0].generated_tokens, 3);
    assert!(s.is_idle());
    assert_eq!(s.manager().metrics().in_use_blocks, 0);
}

#[test]
fn a_stop_in_a_speculative_step_finishes_the_request_with_its_tokens() {
    let mut s = decoding(4, 6, 50);
    step(&mut s);
    let report = s
        .apply(&[EngineOutput::speculative(ID, vec![7, 8], 2).with_stop()])
        .unwrap();
    assert_eq!(report.finished[0].reason, FinishReason::Stop);
    assert_eq!(report.finished[0].generated_tokens, 4);
    s.audit().unwrap();
    assert_eq!(s.manager().metrics().in_use_blocks, 0);
}

#[test]
fn accepting_more_drafts_than_verified_is_refused_and_changes_nothing() {
    let mut s = decoding(2, 6, 20);
    let plan = step(&mut s);
    let too_many = EngineOutput::speculative(ID, vec![1, 2, 3], 4);
    assert_eq!(
        s.apply(&[too_many]).unwrap_err(),
        SchedulerError::TooManyDrafts {
            id: ID,
            accepted: 3,
            drafts: 2
        }
    );
    s.audit().unwrap();
    s.apply(&outputs(&plan)).unwrap();
    s.audit().unwrap();

    // Without speculative decoding a decode verifies no draft.
    let mut s = decoding(0, 6, 20);
    let plan = step(&mut s);
    assert_eq!(plan.decode[0].draft_tokens, 0);
    assert_eq!(
        s.apply(&[EngineOutput::speculative(ID, vec![1], 2)])
            .unwrap_err(),
        SchedulerError::TooManyDrafts {
            id: ID,
            accepted: 1,
            drafts: 0
        }
    );
    s.apply(&outputs(&plan)).unwrap();
}

#[test]
fn speculative_requests_share_a_pool_and_finish_under_preemption() {
    // Eight blocks for three requests speculating four drafts each: blocks
    // run out, requests are preempted and resumed, and all finish.
    let mut s = scheduler(8, config(4).with_max_running(3));
    for id in 1..=3 {
        s.submit(request(id, id as u32 * 100..id as u32 * 100 + 6, 12))
            .unwrap();
    }
    let mut generated = 0;
    for _ in 0..200 {
        if s.is_idle() {
            break;
        }
        let plan = step(&mut s);
        // Every draft accepted, each request's tokens counting up.
        let mut outputs = outputs(&plan);
        for (output, d) in outputs
            .iter_mut()
            .skip(plan.prefill.len())
            .zip(&plan.decode)
        {
            assert!(d.draft_tokens <= 4);
            output.accepted_drafts = (0..d.draft_tokens as u32).collect();
        }
        let report = s.apply(&outputs).unwrap();
        s.audit().unwrap();
        generated += report
            .finished
            .iter()
            .map(|f| f.generated_tokens)
            .sum::<usize>();
    }
    assert!(s.is_idle());
    assert_eq!(generated, 36);
    assert_eq!(s.census().finished, 3);
    assert_eq!(s.manager().metrics().in_use_blocks, 0);
    assert!(s.census().spec_accepted_tokens > 0);
}
