//! Requests carrying their prompt's block hashes (`InferenceRequest::hashed`)
//! schedule exactly as requests whose sequences hash the prompt themselves,
//! whether the hashes fit the scheduler (taken) or not (another block size
//! or salt: hashed again).

use kvbm_queue::{InferenceRequest, RequestId, SchedulerConfig, StepPlan, StepReport};
use kvbm_sequence::{HashedPrompt, Salt};
use proptest::prelude::*;

use super::scheduler::{BS, run, scheduler};

/// How a request of the workload is built.
#[derive(Clone, Copy, Debug)]
enum Build {
    /// `InferenceRequest::new`.
    Plain,
    /// Hashed for the scheduler's block size: its hashes are taken.
    Hashed,
    /// Hashed for another block size: hashed again.
    OtherBlockSize,
    /// Hashed, then given another salt: hashed again under it.
    Resalted,
}

fn build() -> impl Strategy<Value = Build> {
    prop_oneof![
        Just(Build::Plain),
        Just(Build::Hashed),
        Just(Build::OtherBlockSize),
        Just(Build::Resalted),
    ]
}

/// Request `id` as `how` builds it; `plain` the same request built the
/// plain way (the reference).
fn requests(
    id: u64,
    prompt: &[u32],
    max_new: u32,
    how: Build,
) -> (InferenceRequest, InferenceRequest) {
    let id = RequestId(id);
    let salt = Salt::new(9);
    let hashed = |block_size, salt| HashedPrompt::new(prompt.to_vec(), block_size, salt).unwrap();
    match how {
        Build::Plain => {
            let request = InferenceRequest::new(id, prompt.to_vec(), max_new);
            (request.clone(), request)
        }
        Build::Hashed => (
            InferenceRequest::hashed(id, hashed(BS, salt), max_new),
            InferenceRequest::new(id, prompt.to_vec(), max_new).with_salt(salt),
        ),
        Build::OtherBlockSize => (
            InferenceRequest::hashed(id, hashed(BS + 1, salt), max_new),
            InferenceRequest::new(id, prompt.to_vec(), max_new).with_salt(salt),
        ),
        Build::Resalted => (
            InferenceRequest::hashed(id, hashed(BS, Salt::NONE), max_new).with_salt(salt),
            InferenceRequest::new(id, prompt.to_vec(), max_new).with_salt(salt),
        ),
    }
}

/// Every step's plan and report until the scheduler is idle (bounded).
fn replay(requests: Vec<InferenceRequest>) -> Vec<(StepPlan, StepReport)> {
    let mut s = scheduler(24, SchedulerConfig::default().with_chunk_size(6));
    for request in requests {
        s.submit(request).unwrap();
    }
    let mut steps = Vec::new();
    while !s.is_idle() && steps.len() < 400 {
        steps.push(run(&mut s));
    }
    assert!(s.is_idle(), "every request finishes");
    steps
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(super::fuzz_cases(256)))]

    /// Prompts over a small alphabet share prefixes, so hashes decide
    /// prefix hits: a hashed request whose hashes named other tokens would
    /// hit (or miss) where the plain one does not, and the steps differ.
    #[test]
    fn fuzz_hashed_requests_schedule_as_plain_ones(
        workload in prop::collection::vec(
            (prop::collection::vec(0u32..2, 1..20), 1u32..6, build()),
            1..6,
        ),
    ) {
        let (built, reference): (Vec<_>, Vec<_>) = (workload.iter().enumerate())
            .map(|(i, (prompt, max_new, how))| requests(i as u64, prompt, *max_new, *how))
            .unzip();
        prop_assert_eq!(replay(built), replay(reference));
    }
}

#[test]
fn a_hashed_request_shares_its_prompt_and_keeps_its_hashes() {
    let prompt = HashedPrompt::new(vec![1, 2, 3, 4, 5], BS, Salt::new(3)).unwrap();
    let request = InferenceRequest::hashed(RequestId(1), prompt.clone(), 4);
    assert_eq!(request.prompt(), &[1, 2, 3, 4, 5]);
    assert_eq!(request.salt(), Salt::new(3));
    assert_eq!(request.hashed_prompt(), Some(&prompt));
    assert!(
        InferenceRequest::new(RequestId(2), vec![1], 1)
            .hashed_prompt()
            .is_none()
    );
}
