//! API fuzzer: arbitrary sequences of `SchedulableSequence` calls over two
//! managers, with extreme chunk sizes, draft counts, accepted-token lists and
//! output budgets, in any order (apply without schedule, schedule twice,
//! revert anywhere, release and reacquire on either manager, a cached prefix
//! in one of them).
//!
//! After every call: nothing panicked, every refusal is a typed error that
//! changed nothing (the crate's `Snapshot`, for both pools), both audits
//! pass, the blocks in use are exactly the blocks the sequence holds and
//! come from one pool, and `kv_position` never passes the tokens.
//! `cargo xtask fuzz` runs it long.

use kvbm_blocks::BlockManager;
use kvbm_schedule::{ApplyError, SchedulableSequence, ScheduleError, SequenceState};
use proptest::prelude::*;

use crate::{Gpu, audit, manager, request, snapshot};

/// Cases per fuzz test: `KVBM_FUZZ_CASES` (as `cargo xtask fuzz --cases N`
/// sets it), else a CI-sized default.
fn cases() -> u32 {
    crate::fuzz_cases(1024)
}

fn extreme_usize() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 0usize..10,
        1 => Just(usize::MAX),
        1 => Just(usize::MAX - 1),
        1 => any::<usize>(),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    /// `tokens`, or (when `None`) what is left of the prompt.
    SchedulePrefill {
        tokens: Option<usize>,
        on: usize,
    },
    /// `token`, or (when `None`) whatever the scheduled chunk calls for.
    ApplyPrefill {
        token: Option<Option<u32>>,
        on: usize,
    },
    ScheduleDecode {
        on: usize,
    },
    ApplyDecode {
        on: usize,
    },
    ScheduleSpeculative {
        drafts: usize,
        on: usize,
    },
    ApplySpeculative {
        accepted: usize,
        on: usize,
    },
    Revert,
    Release,
    Reacquire {
        on: usize,
    },
    MatchAndAdd {
        on: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let on = || prop_oneof![5 => Just(0usize), 1 => Just(1usize)];
    prop_oneof![
        // Mostly the right calls, so runs reach decoding and speculation.
        3 => (prop::option::weighted(0.3, extreme_usize()), on())
            .prop_map(|(tokens, on)| Op::SchedulePrefill { tokens, on }),
        3 => (prop::option::weighted(0.3, prop::option::of(0u32..4)), on())
            .prop_map(|(token, on)| Op::ApplyPrefill { token, on }),
        3 => on().prop_map(|on| Op::ScheduleDecode { on }),
        3 => on().prop_map(|on| Op::ApplyDecode { on }),
        2 => (extreme_usize(), on()).prop_map(|(drafts, on)| Op::ScheduleSpeculative { drafts, on }),
        2 => (prop_oneof![4 => 0usize..4, 1 => extreme_usize()], on())
            .prop_map(|(accepted, on)| Op::ApplySpeculative { accepted, on }),
        1 => Just(Op::Revert),
        1 => Just(Op::Release),
        1 => on().prop_map(|on| Op::Reacquire { on }),
        1 => on().prop_map(|on| Op::MatchAndAdd { on }),
    ]
}

/// Either refusal, typed.
#[derive(Debug)]
enum Refusal {
    Schedule(ScheduleError),
    Apply(ApplyError),
}

fn is_typed(refusal: &Refusal) -> bool {
    match refusal {
        Refusal::Schedule(error) => matches!(
            error,
            ScheduleError::NotIdle { .. }
                | ScheduleError::PrefillNotComplete { .. }
                | ScheduleError::PrefillComplete { .. }
                | ScheduleError::PrefillOverrun { .. }
                | ScheduleError::AllocationFailed { .. }
                | ScheduleError::GenerationComplete { .. }
                | ScheduleError::WrongDanglingCount { .. }
                | ScheduleError::NotReleased { .. }
                | ScheduleError::Sequence(_)
        ),
        Refusal::Apply(error) => matches!(
            error,
            ApplyError::WrongState { .. }
                | ApplyError::TokenOnNonFinalChunk { .. }
                | ApplyError::MissingTokenOnFinalChunk { .. }
                | ApplyError::AcceptedExceedsScheduled { .. }
                | ApplyError::Sequence(_)
        ),
    }
}

fn apply(
    seq: &mut SchedulableSequence<Gpu>,
    managers: &[BlockManager<Gpu>; 2],
    op: &Op,
) -> Result<(), Refusal> {
    use Refusal::{Apply, Schedule};
    match *op {
        Op::SchedulePrefill { tokens, on } => {
            let tokens = tokens.unwrap_or(seq.remaining_prefill_tokens());
            seq.schedule_prefill(tokens, &managers[on])
                .map_err(Schedule)
        }
        Op::ApplyPrefill { token, on } => {
            let token = token.unwrap_or_else(|| right_token(seq));
            seq.apply_prefill(token, &managers[on]).map_err(Apply)
        }
        Op::ScheduleDecode { on } => seq.schedule_decode(&managers[on]).map_err(Schedule),
        Op::ApplyDecode { on } => seq.apply_decode(7, &managers[on]).map(drop).map_err(Apply),
        Op::ScheduleSpeculative { drafts, on } => seq
            .schedule_speculative(drafts, &managers[on])
            .map_err(Schedule),
        Op::ApplySpeculative { accepted, on } => {
            // Never materialize a huge list: past 64 it is too many anyway.
            let tokens = vec![3; accepted.min(64)];
            seq.apply_speculative(&tokens, &managers[on])
                .map(drop)
                .map_err(Apply)
        }
        Op::Revert => seq.revert_schedule().map_err(Apply),
        Op::Release => seq.release().map_err(Apply),
        Op::Reacquire { on } => seq.reacquire(&managers[on]).map(drop).map_err(Schedule),
        Op::MatchAndAdd { on } => seq
            .match_and_add_prefix(&managers[on])
            .map(drop)
            .map_err(Schedule),
    }
}

/// The token a scheduled prefill chunk's apply calls for.
fn right_token(seq: &SchedulableSequence<Gpu>) -> Option<u32> {
    let SequenceState::PrefillScheduled { num_tokens, .. } = seq.state() else {
        return None;
    };
    let ends_prompt = seq.kv_position().saturating_add(num_tokens) >= seq.prefill_target();
    (ends_prompt && seq.final_chunk_emits_token()).then_some(1)
}

fn check(
    seq: &SchedulableSequence<Gpu>,
    managers: &[BlockManager<Gpu>; 2],
) -> Result<(), TestCaseError> {
    let in_use: Vec<usize> = managers.iter().map(|m| audit(m).in_use_blocks()).collect();
    prop_assert_eq!(in_use.iter().sum::<usize>(), seq.held_blocks());
    prop_assert!(
        in_use.iter().filter(|&&n| n > 0).count() <= 1,
        "two pools held: {:?}",
        in_use
    );
    prop_assert!(seq.kv_position() <= seq.total_tokens());
    prop_assert!(
        seq.inner()
            .assignments()
            .is_consistent_with(seq.inner().sequence())
    );
    let _ = (
        seq.remaining_prefill_tokens(),
        seq.prefill_target(),
        seq.remaining_tokens(),
        seq.is_complete(),
        seq.final_chunk_emits_token(),
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn fuzz_schedulable_sequence_calls(
        prompt in 1u32..14,
        max_output in prop_oneof![3 => 0usize..10, 1 => Just(usize::MAX)],
        cached in 0usize..3,
        pool in 2usize..10,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let managers = [manager(pool), manager(pool)];
        // Another request left `cached` blocks of the same prompt in the
        // second pool.
        let mut donor = request(prompt, 0);
        let cached_tokens = (cached * crate::BLOCK_SIZE).min(prompt as usize);
        if cached_tokens > 0 && donor.schedule_prefill(cached_tokens, &managers[1]).is_ok() {
            let token = donor.final_chunk_emits_token().then_some(0);
            let last = cached_tokens == prompt as usize;
            donor.apply_prefill(token.filter(|_| last), &managers[1]).ok();
        }
        drop(donor);
        let mut seq = request(prompt, max_output);
        for op in &ops {
            let before = [snapshot(&seq, &managers[0]), snapshot(&seq, &managers[1])];
            if let Err(refusal) = apply(&mut seq, &managers, op) {
                prop_assert!(is_typed(&refusal), "{:?}: {:?}", op, refusal);
                let after = [snapshot(&seq, &managers[0]), snapshot(&seq, &managers[1])];
                prop_assert_eq!(after, before, "{:?} refused with {:?} but changed", op, refusal);
            }
            check(&seq, &managers)?;
        }
        drop(seq);
        for manager in &managers {
            prop_assert_eq!(audit(manager).in_use_blocks(), 0);
        }
    }
}
