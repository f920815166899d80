//! One test per error variant: each provokes it, checks the context it
//! carries, checks that nothing changed (state, positions, tokens, blocks,
//! page table, history, the pool's audit), then shows that the corrected call
//! works.

use std::fmt::Debug;

use kvbm_blocks::{BlockError, BlockManager};
use kvbm_schedule::{ApplyError, SchedulableSequence, ScheduleError, SequenceState};
use kvbm_sequence::SequenceError;

use crate::{BLOCK_SIZE, Gpu, audit, manager, request, snapshot};

/// Runs a call that must be refused and checks it changed nothing.
#[track_caller]
fn refused<T: Debug, E: Debug>(
    seq: &mut SchedulableSequence<Gpu>,
    manager: &BlockManager<Gpu>,
    call: impl FnOnce(&mut SchedulableSequence<Gpu>) -> Result<T, E>,
) -> E {
    let before = snapshot(seq, manager);
    let error = call(seq).expect_err("the call must be refused");
    assert_eq!(
        snapshot(seq, manager),
        before,
        "refused call changed something: {error:?}"
    );
    error
}

/// A request of `prompt` tokens whose prompt is prefilled in one chunk.
fn prefilled(
    prompt: u32,
    max_output: usize,
    manager: &BlockManager<Gpu>,
) -> SchedulableSequence<Gpu> {
    let mut seq = request(prompt, max_output);
    seq.schedule_prefill(prompt as usize, manager).unwrap();
    let token = seq.final_chunk_emits_token().then_some(1000);
    seq.apply_prefill(token, manager).unwrap();
    seq
}

// ----------------------------------------------------------------------
// ScheduleError
// ----------------------------------------------------------------------

#[test]
fn not_idle_refuses_every_schedule_while_a_step_is_pending() {
    let m = manager(8);
    let mut seq = request(8, 4);
    seq.schedule_prefill(4, &m).unwrap();
    let pending = SequenceState::PrefillScheduled {
        num_tokens: 4,
        blocks_allocated: 1,
    };
    let not_idle = |operation| ScheduleError::NotIdle {
        operation,
        state: pending,
    };
    assert_eq!(
        refused(&mut seq, &m, |s| s.schedule_prefill(4, &m)),
        not_idle("schedule_prefill")
    );
    assert_eq!(
        refused(&mut seq, &m, |s| s.schedule_decode(&m)),
        not_idle("schedule_decode")
    );
    assert_eq!(
        refused(&mut seq, &m, |s| s.schedule_speculative(2, &m)),
        not_idle("schedule_speculative")
    );
    assert_eq!(
        refused(&mut seq, &m, |s| s.match_and_add_prefix(&m)),
        not_idle("match_and_add_prefix")
    );
    assert_eq!(
        refused(&mut seq, &m, |s| s.reacquire(&m)),
        not_idle("reacquire")
    );
    seq.apply_prefill(None, &m).unwrap();
    seq.schedule_prefill(4, &m).unwrap(); // idle again
}

#[test]
fn prefill_not_complete_refuses_decode_mid_prefill_and_mid_recompute() {
    let m = manager(8);
    let mut seq = request(8, 4);
    seq.schedule_prefill(4, &m).unwrap();
    seq.apply_prefill(None, &m).unwrap();
    let expected = ScheduleError::PrefillNotComplete {
        kv_position: 4,
        prefill_target: 8,
    };
    assert_eq!(refused(&mut seq, &m, |s| s.schedule_decode(&m)), expected);
    assert_eq!(
        refused(&mut seq, &m, |s| s.schedule_speculative(3, &m)),
        expected
    );

    // After a preemption that lost everything, decode waits for recompute
    // up to everything but the tail token.
    drop(seq); // (it pins block 0, which would stay matchable)
    let mut seq = prefilled(8, 4, &m);
    seq.schedule_decode(&m).unwrap();
    seq.apply_decode(1001, &m).unwrap(); // 10 tokens, 9 computed
    seq.release().unwrap();
    m.clear_cache();
    assert_eq!(seq.reacquire(&m).unwrap(), 0);
    let error = refused(&mut seq, &m, |s| s.schedule_decode(&m));
    assert_eq!(
        error,
        ScheduleError::PrefillNotComplete {
            kv_position: 0,
            prefill_target: 9
        }
    );
    seq.schedule_prefill(9, &m).unwrap();
    seq.apply_prefill(None, &m).unwrap();
    seq.schedule_decode(&m).unwrap();
}

#[test]
fn prefill_complete_refuses_a_chunk_with_nothing_left() {
    let m = manager(8);
    let mut seq = prefilled(8, 4, &m);
    let error = refused(&mut seq, &m, |s| s.schedule_prefill(1, &m));
    assert_eq!(
        error,
        ScheduleError::PrefillComplete {
            kv_position: 8,
            prefill_target: 8
        }
    );
    // An empty prompt has nothing to prefill from the start.
    let mut empty = request(0, 4);
    assert!(matches!(
        refused(&mut empty, &m, |s| s.schedule_prefill(0, &m)),
        ScheduleError::PrefillComplete {
            kv_position: 0,
            prefill_target: 0
        }
    ));
    seq.schedule_decode(&m).unwrap();
}

#[test]
fn prefill_overrun_refuses_a_chunk_past_the_target_even_near_usize_max() {
    let m = manager(8);
    let mut seq = request(8, 4);
    seq.schedule_prefill(3, &m).unwrap();
    seq.apply_prefill(None, &m).unwrap();
    for num_tokens in [6, usize::MAX] {
        let error = refused(&mut seq, &m, |s| s.schedule_prefill(num_tokens, &m));
        assert_eq!(
            error,
            ScheduleError::PrefillOverrun {
                kv_position: 3,
                num_tokens,
                prefill_target: 8
            }
        );
    }
    seq.schedule_prefill(5, &m).unwrap();
}

#[test]
fn allocation_failed_allocates_nothing_and_says_what_was_missing() {
    // More than the pool holds at all.
    let m = manager(2);
    let mut seq = request(12, 4);
    let error = refused(&mut seq, &m, |s| s.schedule_prefill(12, &m));
    assert!(matches!(
        error,
        ScheduleError::AllocationFailed {
            requested: 3,
            available: 2,
            ..
        }
    ));
    assert_eq!(
        error.block_error(),
        Some(&BlockError::ExceedsCapacity {
            requested: 3,
            total: 2
        })
    );
    assert!(std::error::Error::source(&error).is_some());
    seq.schedule_prefill(8, &m).unwrap(); // a smaller chunk fits

    // Not enough right now: another request holds most of the pool.
    let m = manager(4);
    let mut other = prefilled(11, 4, &m); // holds 3 blocks
    let mut seq = request(8, 4);
    let error = refused(&mut seq, &m, |s| s.schedule_prefill(8, &m));
    assert!(matches!(
        error,
        ScheduleError::AllocationFailed {
            requested: 2,
            available: 1,
            ..
        }
    ));
    assert_eq!(
        error.block_error(),
        Some(&BlockError::InsufficientBlocks {
            requested: 2,
            available: 1
        })
    );

    // A decode step whose tail token starts a block, in a full pool.
    // (A prompt of its own: sharing block 0 would deduplicate it and free one.)
    let mut full =
        SchedulableSequence::<Gpu>::new(vec![100, 101, 102, 103], 4, BLOCK_SIZE).unwrap();
    full.schedule_prefill(4, &m).unwrap();
    full.apply_prefill(Some(9), &m).unwrap(); // the tail token starts block 1
    assert_eq!(m.available_blocks(), 0);
    let error = refused(&mut full, &m, |s| s.schedule_decode(&m));
    assert!(matches!(
        error,
        ScheduleError::AllocationFailed {
            requested: 1,
            available: 0,
            ..
        }
    ));
    other.release().unwrap(); // frees its partial block, caches the rest
    full.schedule_decode(&m).unwrap();
}

#[test]
fn generation_complete_refuses_decode_and_speculative_once_the_budget_is_spent() {
    let m = manager(8);
    let mut seq = prefilled(8, 1, &m); // the first token spends the budget
    assert!(seq.is_complete());
    let expected = ScheduleError::GenerationComplete {
        generated_tokens: 1,
        max_output_tokens: 1,
    };
    assert_eq!(refused(&mut seq, &m, |s| s.schedule_decode(&m)), expected);
    assert_eq!(
        refused(&mut seq, &m, |s| s.schedule_speculative(4, &m)),
        expected
    );
    // A prefill-only request (no output budget) is complete after prefill.
    let mut prefill_only = prefilled(8, 0, &m);
    assert!(matches!(
        refused(&mut prefill_only, &m, |s| s.schedule_decode(&m)),
        ScheduleError::GenerationComplete {
            generated_tokens: 0,
            max_output_tokens: 0
        }
    ));
    seq.release().unwrap();
}

#[test]
fn wrong_dangling_count_refuses_decode_without_exactly_one_tail_token() {
    let m = manager(8);
    let mut seq = request(0, 4); // an empty prompt: no token to feed the model
    assert_eq!(seq.tail_tokens(), 0);
    let expected = ScheduleError::WrongDanglingCount {
        expected: 1,
        actual: 0,
    };
    assert_eq!(refused(&mut seq, &m, |s| s.schedule_decode(&m)), expected);
    assert_eq!(
        refused(&mut seq, &m, |s| s.schedule_speculative(2, &m)),
        expected
    );
}

#[test]
fn not_released_refuses_reacquire_while_blocks_are_held() {
    let m = manager(8);
    let mut seq = prefilled(8, 4, &m);
    let error = refused(&mut seq, &m, |s| s.reacquire(&m));
    assert_eq!(error, ScheduleError::NotReleased { held: 2 });
    seq.release().unwrap();
    assert_eq!(seq.reacquire(&m).unwrap(), 2);
}

#[test]
fn sequence_errors_refuse_other_block_sizes_and_other_pools() {
    let m = manager(8);
    let big = BlockManager::<Gpu>::builder()
        .block_count(8)
        .block_size(2 * BLOCK_SIZE)
        .build()
        .unwrap();
    let mismatch = SequenceError::BlockSizeMismatch {
        sequence: BLOCK_SIZE,
        manager: 2 * BLOCK_SIZE,
    };
    let mut seq = request(8, 4);
    for error in [
        refused(&mut seq, &m, |s| s.schedule_prefill(4, &big)),
        refused(&mut seq, &m, |s| s.match_and_add_prefix(&big)),
        refused(&mut seq, &m, |s| s.reacquire(&big)),
    ] {
        assert_eq!(error, ScheduleError::Sequence(mismatch.clone()));
    }

    // Holding blocks of `m`, another pool is refused before anything moves.
    let other = manager(8);
    seq.schedule_prefill(8, &m).unwrap();
    let before_other = audit(&other);
    assert_eq!(
        refused(&mut seq, &m, |s| s.apply_prefill(Some(1), &other)),
        ApplyError::Sequence(SequenceError::ForeignManager)
    );
    seq.apply_prefill(Some(1), &m).unwrap();
    assert_eq!(
        refused(&mut seq, &m, |s| s.schedule_decode(&other)),
        ScheduleError::Sequence(SequenceError::ForeignManager)
    );
    assert_eq!(
        refused(&mut seq, &m, |s| s.match_and_add_prefix(&other)),
        ScheduleError::Sequence(SequenceError::ForeignManager)
    );
    seq.schedule_decode(&m).unwrap();
    assert_eq!(
        refused(&mut seq, &m, |s| s.apply_decode(2, &other)),
        ApplyError::Sequence(SequenceError::ForeignManager)
    );
    seq.apply_decode(2, &m).unwrap();
    seq.schedule_speculative(3, &m).unwrap();
    assert_eq!(
        refused(&mut seq, &m, |s| s.apply_speculative(&[3, 4], &other)),
        ApplyError::Sequence(SequenceError::ForeignManager)
    );
    seq.apply_speculative(&[3, 4], &m).unwrap();
    assert_eq!(audit(&other), before_other);

    // Once released, the sequence may move to another pool.
    seq.release().unwrap();
    seq.reacquire(&other).unwrap();

    assert!(matches!(
        SchedulableSequence::<Gpu>::new(vec![1], 1, 0),
        Err(ScheduleError::Sequence(SequenceError::ZeroBlockSize))
    ));
}

// ----------------------------------------------------------------------
// ApplyError
// ----------------------------------------------------------------------

#[test]
fn wrong_state_refuses_applies_reverts_and_releases_that_do_not_match() {
    let m = manager(8);
    let mut seq = request(8, 4);
    let idle = |operation, expected| ApplyError::WrongState {
        operation,
        expected,
        actual: SequenceState::Idle,
    };
    assert_eq!(
        refused(&mut seq, &m, |s| s.apply_prefill(None, &m)),
        idle("apply_prefill", "PrefillScheduled")
    );
    assert_eq!(
        refused(&mut seq, &m, |s| s.apply_decode(1, &m)),
        idle("apply_decode", "DecodeScheduled")
    );
    assert_eq!(
        refused(&mut seq, &m, |s| s.apply_speculative(&[], &m)),
        idle("apply_speculative", "SpeculativeScheduled")
    );
    assert_eq!(
        refused(&mut seq, &m, |s| s.revert_schedule()),
        idle("revert_schedule", "a scheduled state")
    );

    seq.schedule_prefill(8, &m).unwrap();
    let pending = SequenceState::PrefillScheduled {
        num_tokens: 8,
        blocks_allocated: 2,
    };
    assert_eq!(
        refused(&mut seq, &m, |s| s.apply_decode(1, &m)),
        ApplyError::WrongState {
            operation: "apply_decode",
            expected: "DecodeScheduled",
            actual: pending
        }
    );
    assert_eq!(
        refused(&mut seq, &m, |s| s.release()),
        ApplyError::WrongState {
            operation: "release",
            expected: "Idle",
            actual: pending
        }
    );
    seq.apply_prefill(Some(9), &m).unwrap();

    seq.schedule_decode(&m).unwrap();
    assert!(matches!(
        refused(&mut seq, &m, |s| s.apply_speculative(&[1], &m)),
        ApplyError::WrongState {
            actual: SequenceState::DecodeScheduled { .. },
            ..
        }
    ));
    seq.apply_decode(10, &m).unwrap();
}

#[test]
fn token_on_non_final_chunk_refuses_tokens_on_chunks_that_emit_none() {
    let m = manager(8);
    // A chunk that does not reach the end of the prompt.
    let mut seq = request(8, 4);
    seq.schedule_prefill(4, &m).unwrap();
    let error = refused(&mut seq, &m, |s| s.apply_prefill(Some(7), &m));
    assert_eq!(
        error,
        ApplyError::TokenOnNonFinalChunk {
            chunk_end: 4,
            prefill_target: 8,
            generated_tokens: 0,
            max_output_tokens: 4
        }
    );
    seq.apply_prefill(None, &m).unwrap();

    // A recompute chunk after a preemption: the tokens were generated already.
    let mut seq = prefilled(6, 4, &m);
    seq.release().unwrap();
    seq.reacquire(&m).unwrap(); // block 0 cached: kv 4, target 6
    seq.schedule_prefill(2, &m).unwrap();
    let error = refused(&mut seq, &m, |s| s.apply_prefill(Some(7), &m));
    assert_eq!(
        error,
        ApplyError::TokenOnNonFinalChunk {
            chunk_end: 6,
            prefill_target: 6,
            generated_tokens: 1,
            max_output_tokens: 4
        }
    );
    seq.apply_prefill(None, &m).unwrap();
    assert_eq!(seq.tail_tokens(), 1);

    // The final chunk of a request without output budget emits nothing.
    let mut seq = request(4, 0);
    seq.schedule_prefill(4, &m).unwrap();
    assert!(matches!(
        refused(&mut seq, &m, |s| s.apply_prefill(Some(7), &m)),
        ApplyError::TokenOnNonFinalChunk {
            chunk_end: 4,
            max_output_tokens: 0,
            ..
        }
    ));
    seq.apply_prefill(None, &m).unwrap();
    assert_eq!((seq.kv_position(), seq.tail_tokens()), (4, 0));
}

#[test]
fn missing_token_on_final_chunk_refuses_a_prompt_end_without_a_token() {
    let m = manager(8);
    let mut seq = request(8, 4);
    seq.schedule_prefill(4, &m).unwrap();
    seq.apply_prefill(None, &m).unwrap();
    seq.schedule_prefill(4, &m).unwrap();
    let error = refused(&mut seq, &m, |s| s.apply_prefill(None, &m));
    assert_eq!(
        error,
        ApplyError::MissingTokenOnFinalChunk { prefill_target: 8 }
    );
    seq.apply_prefill(Some(8), &m).unwrap();
    assert_eq!(seq.tail_tokens(), 1);
}

#[test]
fn accepted_exceeds_scheduled_refuses_more_tokens_than_drafts_even_after_clamping() {
    let m = manager(8);
    let mut seq = prefilled(8, 8, &m);
    seq.schedule_speculative(2, &m).unwrap();
    let error = refused(&mut seq, &m, |s| s.apply_speculative(&[1, 2, 3], &m));
    assert_eq!(
        error,
        ApplyError::AcceptedExceedsScheduled {
            accepted: 3,
            scheduled: 2
        }
    );
    seq.apply_speculative(&[1, 2], &m).unwrap();

    // 5 drafts asked with 2 tokens of budget left: 2 scheduled.
    let mut seq = prefilled(8, 3, &m);
    seq.schedule_speculative(5, &m).unwrap();
    assert!(matches!(
        seq.state(),
        SequenceState::SpeculativeScheduled { num_tokens: 2, .. }
    ));
    let error = refused(&mut seq, &m, |s| s.apply_speculative(&[1, 2, 3], &m));
    assert_eq!(
        error,
        ApplyError::AcceptedExceedsScheduled {
            accepted: 3,
            scheduled: 2
        }
    );
    assert!(seq.apply_speculative(&[1, 2], &m).unwrap().is_max_length());
}

/// Issue 11, defect 5: with an output budget near `usize::MAX`, the slots of
/// `usize::MAX` drafts used to overflow `total + drafts` (a panic in debug, a
/// wrapped, tiny allocation in release). Now it is a refused allocation.
#[test]
fn speculative_drafts_near_usize_max_are_refused_not_overflowed() {
    let manager = manager(16);
    let mut seq = prefilled(5, usize::MAX, &manager);
    for drafts in [usize::MAX, usize::MAX - 5, usize::MAX / 2] {
        let error = refused(&mut seq, &manager, |seq| {
            seq.schedule_speculative(drafts, &manager)
        });
        assert!(
            matches!(error, ScheduleError::AllocationFailed { .. }),
            "{error:?}"
        );
    }
    seq.schedule_speculative(3, &manager).unwrap();
    audit(&manager);
}

/// Issue 11, defect 4: a released sequence used to stay tied to its first
/// manager. Reacquired on another one, its first registration failed with
/// `ForeignManager` after the blocks had left the sequence (lost, half
/// applied), and the revert that followed hit a debug assertion.
#[test]
fn a_released_sequence_moves_to_another_manager() {
    let (a, b) = (manager(16), manager(16));
    let mut seq = prefilled(10, 8, &a);
    seq.schedule_decode(&a).unwrap();
    seq.apply_decode(2, &a).unwrap();
    seq.release().unwrap();
    assert_eq!(seq.reacquire(&b).unwrap(), 0, "nothing cached in b");
    seq.schedule_prefill(seq.remaining_prefill_tokens(), &b)
        .unwrap();
    seq.apply_prefill(None, &b).unwrap();
    seq.schedule_decode(&b).unwrap();
    seq.apply_decode(3, &b).unwrap();
    assert_eq!(seq.held_blocks(), 3);
    assert_eq!(audit(&b).in_use_blocks(), 3);
    assert_eq!(audit(&a).in_use_blocks(), 0);

    // Applying with the old manager is refused and changes nothing; the
    // schedule can still be reverted or applied with the right one.
    seq.schedule_decode(&b).unwrap();
    let error = refused(&mut seq, &a, |seq| seq.apply_decode(4, &a));
    assert!(matches!(
        error,
        ApplyError::Sequence(SequenceError::ForeignManager)
    ));
    seq.revert_schedule().unwrap();
    assert_eq!(audit(&b).in_use_blocks(), 3);
}
