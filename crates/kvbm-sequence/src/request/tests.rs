//! Unit tests for [`RequestSequence`]: every accessor at every phase of a
//! request's life, and the primitives a scheduler builds on.

use kvbm_blocks::BlockId;

use super::RequestSequence;
use crate::{Salt, SequenceError};

use crate::test_support::{BS, Gpu, manager};

fn request(input: u32, max_output: usize) -> RequestSequence<Gpu> {
    RequestSequence::new((0..input).collect(), max_output, BS).unwrap()
}

/// Every counting accessor at once, so each phase is one comparison.
#[derive(Debug, PartialEq, Eq)]
struct Counts {
    total: usize,
    input: usize,
    generated: usize,
    remaining: usize,
    complete: bool,
    blocks: usize,
    assigned: usize,
    staged: usize,
    unassigned: usize,
    pending: usize,
    held: usize,
    matched: usize,
    prefill: usize,
}

fn counts(seq: &RequestSequence<Gpu>) -> Counts {
    let counts = Counts {
        total: seq.total_tokens(),
        input: seq.num_input_tokens(),
        generated: seq.generated_tokens(),
        remaining: seq.remaining_tokens(),
        complete: seq.is_complete(),
        blocks: seq.num_blocks(),
        assigned: seq.assigned_blocks(),
        staged: seq.staged_blocks(),
        unassigned: seq.unassigned_blocks(),
        pending: seq.pending_blocks(),
        held: seq.held_blocks(),
        matched: seq.prefix_matched_blocks(),
        prefill: seq.new_tokens_for_prefill(),
    };
    // Accessors that must agree with the ones above.
    assert_eq!(seq.block_ids().count(), counts.held);
    assert_eq!(seq.page_indices().len(), counts.held);
    assert_eq!(seq.tokens().len(), counts.total);
    assert_eq!(seq.sequence().num_blocks(), counts.blocks);
    assert_eq!(seq.assignments().len(), counts.held);
    assert!(seq.assignments().is_consistent_with(seq.sequence()));
    counts
}

/// A fresh request of `input` tokens, nothing generated or held.
fn fresh(input: usize, max: usize) -> Counts {
    Counts {
        total: input,
        input,
        generated: 0,
        remaining: max,
        complete: max == 0,
        blocks: input / BS,
        assigned: 0,
        staged: 0,
        unassigned: 0,
        pending: input / BS,
        held: 0,
        matched: 0,
        prefill: input,
    }
}

#[test]
fn new_does_not_touch_any_manager() {
    let seq = request(10, 5);
    assert_eq!(counts(&seq), fresh(10, 5));
    assert_eq!(seq.block_size(), BS);
    assert_eq!(seq.max_output_tokens(), 5);
    assert_eq!(seq.salt(), Salt::NONE);
    assert_eq!(seq.tokens(), (0..10).collect::<Vec<_>>());
    assert!(format!("{seq:?}").contains("total_tokens: 10"));
}

#[test]
fn new_rejects_a_zero_block_size() {
    assert_eq!(
        RequestSequence::<Gpu>::new(vec![1], 1, 0).unwrap_err(),
        SequenceError::ZeroBlockSize
    );
}

#[test]
fn zero_output_budget_is_complete_from_the_start() {
    let mut seq = request(4, 0);
    assert!(seq.is_complete());
    assert!(matches!(
        seq.append_token(1),
        Err(SequenceError::MaxOutputTokensExceeded {
            requested: 1,
            remaining: 0,
            max_output_tokens: 0
        })
    ));
}

#[test]
fn accessors_through_a_cold_prefill() {
    let m = manager(16);
    let mut seq = request(10, 6);

    // Cold cache: nothing matches.
    let matched = seq.match_prefix(&m).unwrap();
    assert!(matched.is_empty());
    assert_eq!(seq.add_matched_blocks(matched).unwrap(), 0);
    assert_eq!(counts(&seq), fresh(10, 6));

    // Allocate for all three blocks (two full, one partial).
    assert_eq!(seq.additional_blocks_needed(10), 3);
    seq.allocate_blocks(3, &m).unwrap();
    assert_eq!(seq.additional_blocks_needed(10), 0);
    assert_eq!(seq.additional_blocks_needed(13), 1);
    assert_eq!(
        counts(&seq),
        Counts {
            unassigned: 3,
            held: 3,
            ..fresh(10, 6)
        }
    );

    // Stage.
    assert_eq!(seq.stage_pending().unwrap(), 2);
    assert_eq!(
        counts(&seq),
        Counts {
            staged: 2,
            unassigned: 1,
            pending: 0,
            held: 3,
            ..fresh(10, 6)
        }
    );

    // Register.
    assert_eq!(seq.register_staged(&m).unwrap(), 2);
    assert_eq!(seq.register_staged(&m).unwrap(), 0);
    assert_eq!(
        counts(&seq),
        Counts {
            assigned: 2,
            unassigned: 1,
            pending: 0,
            held: 3,
            ..fresh(10, 6)
        }
    );
    assert_eq!(m.metrics().in_use_blocks, 3);
}

#[test]
fn accessors_through_generation() {
    let m = manager(16);
    let mut seq = request(10, 6);
    seq.allocate_blocks(3, &m).unwrap();
    seq.complete_and_register_pending(&m).unwrap();

    // Tokens 10 and 11: block 2 fills up.
    assert_eq!(seq.append_token(10).unwrap(), None);
    assert_eq!(seq.append_token(11).unwrap(), Some(2));
    assert_eq!(
        counts(&seq),
        Counts {
            total: 12,
            input: 10,
            generated: 2,
            remaining: 4,
            complete: false,
            blocks: 3,
            assigned: 2,
            staged: 0,
            unassigned: 1,
            pending: 1,
            held: 3,
            matched: 0,
            prefill: 12,
        }
    );
    assert_eq!(seq.complete_and_register_pending(&m).unwrap(), 1);
    assert_eq!(
        (
            seq.assigned_blocks(),
            seq.unassigned_blocks(),
            seq.pending_blocks()
        ),
        (3, 0, 0)
    );

    // Four more tokens fill block 3 and exhaust the budget; no block backs it yet.
    assert_eq!(seq.append_tokens(&[12, 13, 14, 15]).unwrap(), 3..4);
    assert_eq!(
        counts(&seq),
        Counts {
            total: 16,
            input: 10,
            generated: 6,
            remaining: 0,
            complete: true,
            blocks: 4,
            assigned: 3,
            staged: 0,
            unassigned: 0,
            pending: 1,
            held: 3,
            matched: 0,
            prefill: 16,
        }
    );
    assert_eq!(
        seq.complete_and_register_pending(&m).unwrap(),
        0,
        "no block to stage"
    );
    seq.allocate_blocks(1, &m).unwrap();
    assert_eq!(seq.complete_and_register_pending(&m).unwrap(), 1);
    assert_eq!((seq.assigned_blocks(), seq.pending_blocks()), (4, 0));
}

#[test]
fn accessors_through_a_warm_prefill() {
    let m = manager(16);
    let mut first = request(10, 0);
    first.allocate_blocks(2, &m).unwrap();
    first.complete_and_register_pending(&m).unwrap();
    first.release();

    let mut seq = request(10, 3);
    assert_eq!(seq.match_and_add_prefix(&m).unwrap(), 2);
    assert_eq!(
        counts(&seq),
        Counts {
            assigned: 2,
            pending: 0,
            held: 2,
            matched: 2,
            prefill: 2,
            ..fresh(10, 3)
        }
    );
    assert_eq!(seq.additional_blocks_needed(10), 1);
    assert_eq!(m.metrics().inactive_blocks, 0, "matched blocks are revived");
}

#[test]
fn page_table_lists_assigned_staged_then_unassigned() {
    let m = manager(16);
    let mut seq = request(12, 4);
    seq.allocate_blocks(4, &m).unwrap();
    let allocated: Vec<BlockId> = seq.block_ids().collect();
    seq.complete_and_register_up_to(1, &m).unwrap();
    seq.stage_up_to(2).unwrap();
    assert_eq!(
        (
            seq.assigned_blocks(),
            seq.staged_blocks(),
            seq.unassigned_blocks()
        ),
        (1, 1, 2)
    );
    assert_eq!(seq.block_ids().collect::<Vec<_>>(), allocated);
    assert_eq!(
        seq.page_indices(),
        allocated.iter().map(|id| id.get()).collect::<Vec<_>>()
    );
}

#[test]
fn registration_can_wait_for_kv() {
    // A scheduler registers only blocks below kv_position / block_size.
    let m = manager(16);
    let mut seq = request(12, 4);
    seq.allocate_blocks(4, &m).unwrap();
    assert_eq!(seq.complete_and_register_up_to(8 / BS, &m).unwrap(), 2);
    assert_eq!((seq.assigned_blocks(), seq.pending_blocks()), (2, 1));
    let matchable = m.match_blocks(seq.sequence().sequence_hashes()).len();
    assert_eq!(
        matchable, 2,
        "block 2 is not published before its KV exists"
    );
    assert_eq!(seq.complete_and_register_up_to(12 / BS, &m).unwrap(), 1);
    assert_eq!(seq.pending_blocks(), 0);
}

#[test]
fn unassigned_blocks_are_released_lifo() {
    let m = manager(16);
    let mut seq = request(4, 8);
    seq.allocate_blocks(2, &m).unwrap();
    let early: Vec<BlockId> = seq.block_ids().collect();
    seq.allocate_blocks(3, &m).unwrap(); // a step's pre-allocation
    assert_eq!(seq.release_unassigned(3), 3, "revert the step");
    assert_eq!(seq.block_ids().collect::<Vec<_>>(), early);
    assert_eq!(seq.release_unassigned(5), 2, "only two were left");
    assert_eq!(seq.release_unassigned(1), 0);

    seq.allocate_blocks(4, &m).unwrap();
    assert_eq!(seq.drop_excess_unassigned(1), 3);
    assert_eq!(seq.drop_excess_unassigned(1), 0);
    assert_eq!(seq.unassigned_blocks(), 1);
    let last = seq.pop_unassigned().unwrap();
    assert_eq!(seq.unassigned_blocks(), 0);
    drop(last);
    assert_eq!(m.available_blocks(), 16);
}

#[test]
fn truncate_rolls_back_generated_tokens_and_their_blocks() {
    let m = manager(16);
    let mut seq = request(4, 12);
    seq.allocate_blocks(1, &m).unwrap();
    seq.complete_and_register_pending(&m).unwrap();
    // Drafted tokens 4..14: blocks 1 and 2 fill; pre-allocate for them.
    seq.append_tokens(&(4..14).collect::<Vec<_>>()).unwrap();
    seq.allocate_blocks(seq.additional_blocks_needed(14), &m)
        .unwrap();
    seq.stage_pending().unwrap();
    assert_eq!(
        (
            seq.assigned_blocks(),
            seq.staged_blocks(),
            seq.unassigned_blocks()
        ),
        (1, 2, 1)
    );
    let pages: Vec<BlockId> = seq.block_ids().collect();

    // Only three drafts accepted: back to 7 tokens, block 1 partial again.
    seq.truncate(7).unwrap();
    assert_eq!(
        counts(&seq),
        Counts {
            total: 7,
            input: 4,
            generated: 3,
            remaining: 9,
            complete: false,
            blocks: 1,
            assigned: 1,
            staged: 0,
            unassigned: 3,
            pending: 0,
            held: 4,
            matched: 0,
            prefill: 7,
        }
    );
    assert_eq!(
        seq.block_ids().collect::<Vec<_>>(),
        pages,
        "same blocks, same order"
    );
    assert_eq!(seq.drop_excess_unassigned(1), 2);
    assert_eq!(seq.tokens(), (0..7).collect::<Vec<_>>());
}

/// Issue 11, defect 7: cutting a registered block used to release it and
/// map its kept tokens to the next unassigned block, whose KV is not theirs.
/// The cut is refused; a cut at the block's start releases it whole.
#[test]
fn truncate_refuses_to_cut_a_registered_block_and_releases_whole_ones() {
    let m = manager(16);
    let mut seq = request(4, 8);
    seq.append_tokens(&[4, 5, 6, 7, 8]).unwrap();
    seq.allocate_blocks(3, &m).unwrap();
    seq.complete_and_register_pending(&m).unwrap();
    assert_eq!(seq.assigned_blocks(), 2);
    let table: Vec<BlockId> = seq.block_ids().collect();
    assert_eq!(
        seq.truncate(5).unwrap_err(),
        SequenceError::TruncateIntoRegistered {
            len: 5,
            block: 1,
            registered_tokens: 8,
            block_size: BS
        }
    );
    assert_eq!(seq.block_ids().collect::<Vec<_>>(), table);
    assert_eq!(seq.total_tokens(), 9);

    seq.truncate(4).unwrap();
    assert_eq!((seq.assigned_blocks(), seq.unassigned_blocks()), (1, 1));
    assert_eq!(m.metrics().inactive_blocks, 1, "still cached");
    let fresh = RequestSequence::<Gpu>::new((0..4).collect(), 8, BS).unwrap();
    assert_eq!(
        seq.sequence().sequence_hashes(),
        fresh.sequence().sequence_hashes()
    );
    assert!(seq.assignments().is_consistent_with(seq.sequence()));
}

#[test]
fn truncate_keeps_prefix_matched_blocks_within_the_assigned_prefix() {
    let m = manager(16);
    let mut donor = request(12, 0);
    donor.allocate_blocks(3, &m).unwrap();
    donor.complete_and_register_pending(&m).unwrap();
    donor.release();
    // The second request's prompt is the donor's first block; it generates the rest.
    let mut seq = request(4, 8);
    seq.append_tokens(&(4..12).collect::<Vec<_>>()).unwrap();
    assert_eq!(seq.match_and_add_prefix(&m).unwrap(), 3);
    // Cutting the second registered block is refused; its start is fine.
    assert!(seq.truncate(6).is_err());
    seq.truncate(4).unwrap();
    assert_eq!((seq.prefix_matched_blocks(), seq.assigned_blocks()), (1, 1));
    assert_eq!(seq.new_tokens_for_prefill(), 0);
}

#[test]
fn truncate_out_of_range_changes_nothing() {
    let mut seq = request(6, 4);
    seq.append_tokens(&[6, 7]).unwrap();
    for len in [5, 9] {
        assert_eq!(
            seq.truncate(len).unwrap_err(),
            SequenceError::TruncateOutOfRange {
                len,
                min: 6,
                max: 8
            }
        );
    }
    assert_eq!(seq.total_tokens(), 8);
    seq.truncate(6).unwrap();
    assert_eq!(seq.generated_tokens(), 0);
}

#[test]
fn accessors_after_release_and_reacquire() {
    let m = manager(16);
    let mut seq = request(8, 10);
    seq.allocate_blocks(3, &m).unwrap();
    seq.complete_and_register_pending(&m).unwrap();
    seq.append_tokens(&[8, 9, 10, 11, 12]).unwrap();
    seq.complete_and_register_pending(&m).unwrap(); // block 2
    assert_eq!((seq.assigned_blocks(), seq.unassigned_blocks()), (3, 0));

    seq.release();
    let released = Counts {
        total: 13,
        input: 8,
        generated: 5,
        remaining: 5,
        complete: false,
        blocks: 3,
        assigned: 0,
        staged: 0,
        unassigned: 0,
        pending: 3,
        held: 0,
        matched: 0,
        prefill: 13,
    };
    assert_eq!(counts(&seq), released);
    assert_eq!(m.metrics().inactive_blocks, 3);

    assert_eq!(seq.reacquire(&m).unwrap(), 3);
    assert_eq!(
        counts(&seq),
        Counts {
            assigned: 3,
            pending: 0,
            held: 3,
            matched: 3,
            prefill: 1,
            ..released
        }
    );
}

#[test]
fn reacquire_allocates_what_the_cache_lost() {
    let m = manager(16);
    let mut seq = request(12, 4);
    seq.allocate_blocks(3, &m).unwrap();
    seq.complete_and_register_pending(&m).unwrap();
    seq.release();
    // Evict the cache: nothing is left to match.
    m.clear_cache();
    assert_eq!(seq.reacquire(&m).unwrap(), 0);
    assert_eq!(
        (
            seq.assigned_blocks(),
            seq.unassigned_blocks(),
            seq.pending_blocks()
        ),
        (0, 3, 3)
    );
    assert_eq!(seq.new_tokens_for_prefill(), 12);
    // After recomputation the caller registers them.
    assert_eq!(seq.complete_and_register_pending(&m).unwrap(), 3);
}

#[test]
fn reacquire_needs_a_released_sequence() {
    let m = manager(16);
    let mut seq = request(8, 4);
    seq.allocate_blocks(1, &m).unwrap();
    assert_eq!(
        seq.reacquire(&m).unwrap_err(),
        SequenceError::NotReleased { held: 1 }
    );
    assert_eq!(seq.unassigned_blocks(), 1);
}

#[test]
fn failed_reacquire_holds_nothing() {
    let m = manager(4);
    let mut seq = request(16, 4);
    seq.allocate_blocks(4, &m).unwrap();
    seq.stage_up_to(1).unwrap();
    seq.register_staged(&m).unwrap();
    seq.release();
    m.clear_cache();
    let _squatter = m.allocate_blocks(1).unwrap();
    assert!(matches!(
        seq.reacquire(&m),
        Err(SequenceError::AllocationFailed { requested: 4, .. })
    ));
    assert_eq!((seq.held_blocks(), seq.prefix_matched_blocks()), (0, 0));
    assert_eq!(m.available_blocks(), 3);
}

#[test]
fn a_released_sequence_may_move_to_another_manager() {
    let (m1, m2) = (manager(8), manager(8));
    let mut seq = request(8, 4);
    seq.allocate_blocks(2, &m1).unwrap();
    assert_eq!(
        seq.allocate_blocks(1, &m2).unwrap_err(),
        SequenceError::ForeignManager
    );
    assert_eq!(
        seq.match_prefix(&m2).unwrap_err(),
        SequenceError::ForeignManager
    );
    seq.release();
    assert_eq!(seq.reacquire(&m2).unwrap(), 0);
    assert_eq!(seq.complete_and_register_pending(&m2).unwrap(), 2);
    assert_eq!(m1.available_blocks(), 8);
    assert_eq!(m2.metrics().in_use_blocks, 2);
}

#[test]
fn salted_requests_do_not_share_blocks() {
    let m = manager(16);
    let mut plain = request(8, 0);
    plain.allocate_blocks(2, &m).unwrap();
    plain.complete_and_register_pending(&m).unwrap();
    let mut salted =
        RequestSequence::<Gpu>::with_salt((0..8).collect(), 0, BS, Salt::from_bytes(b"lora-a"))
            .unwrap();
    assert_eq!(salted.salt(), Salt::from_bytes(b"lora-a"));
    assert_eq!(salted.match_and_add_prefix(&m).unwrap(), 0);
}

#[test]
fn release_unassigned_beyond_keeps_what_the_tokens_need() {
    let m = manager(16);
    let mut seq = request(4, 16);
    seq.allocate_blocks(5, &m).unwrap();
    seq.complete_and_register_pending(&m).unwrap();
    assert_eq!(
        seq.release_unassigned_beyond(9),
        2,
        "9 tokens need 3 blocks of 5"
    );
    assert_eq!(seq.held_blocks(), 3);
    assert_eq!(seq.release_unassigned_beyond(12), 0);
    assert_eq!(
        seq.release_unassigned_beyond(0),
        2,
        "assigned blocks are never released"
    );
    assert_eq!((seq.assigned_blocks(), seq.unassigned_blocks()), (1, 0));
}

/// Issue 11, defect 4: matched blocks of another manager than the one whose
/// blocks the sequence holds used to be accepted, leaving a table no single
/// pool serves. They are refused (and stay cached); after `release` the
/// sequence takes another manager's blocks.
#[test]
fn matched_blocks_of_another_manager_are_refused_while_blocks_are_held() {
    let (a, b) = (manager(16), manager(16));
    // b caches the first two blocks of the prompt.
    let mut donor = request(8, 0);
    donor.allocate_blocks(2, &b).unwrap();
    donor.complete_and_register_pending(&b).unwrap();
    donor.release();

    let mut seq = request(9, 4);
    seq.allocate_blocks(1, &a).unwrap();
    // `match_prefix(&b)` refuses already; blocks matched directly in b are
    // refused when added.
    assert_eq!(
        seq.match_prefix(&b).unwrap_err(),
        SequenceError::ForeignManager
    );
    let matched = b.match_blocks(&seq.sequence().sequence_hashes()[..2]);
    assert_eq!(matched.len(), 2);
    let table: Vec<BlockId> = seq.block_ids().collect();
    assert_eq!(
        seq.add_matched_blocks(matched).unwrap_err(),
        SequenceError::ForeignManager
    );
    assert_eq!(seq.block_ids().collect::<Vec<_>>(), table);
    assert_eq!(b.metrics().inactive_blocks, 2, "still cached in b");
    assert_eq!(
        seq.match_and_add_prefix(&b).unwrap_err(),
        SequenceError::ForeignManager
    );

    seq.release();
    assert_eq!(seq.reacquire(&b).unwrap(), 2);
    seq.allocate_blocks(1, &b).unwrap(); // the partial tail's block
    assert_eq!(a.metrics().in_use_blocks, 0);
    assert_eq!(b.metrics().in_use_blocks, 3);
}

/// Found by the fuzzer: registering into a foreign manager staged the
/// pending blocks before refusing, so the refusal changed the sequence.
#[test]
fn a_refused_complete_and_register_stages_nothing() {
    let (a, b) = (manager(8), manager(8));
    let mut seq = request(4, 4);
    seq.allocate_blocks(1, &a).unwrap();
    assert_eq!(
        seq.complete_and_register_pending(&b).unwrap_err(),
        SequenceError::ForeignManager
    );
    assert_eq!((seq.staged_blocks(), seq.unassigned_blocks()), (0, 1));
    assert_eq!(seq.complete_and_register_pending(&a).unwrap(), 1);
}

/// Found by the fuzzer: a sequence whose registered blocks were all
/// truncated away kept an empty batch tied to their manager, so after moving
/// to another manager its first registration was refused half-way.
#[test]
fn truncating_away_every_registered_block_detaches_the_sequence() {
    let (a, b) = (manager(8), manager(8));
    let mut seq = request(0, 8);
    seq.append_tokens(&[1, 2, 3, 4]).unwrap();
    seq.allocate_blocks(1, &a).unwrap();
    seq.complete_and_register_pending(&a).unwrap();
    seq.truncate(0).unwrap();
    seq.append_tokens(&[5, 6, 7, 8]).unwrap();
    assert_eq!(seq.reacquire(&b).unwrap(), 0);
    assert_eq!(seq.complete_and_register_pending(&b).unwrap(), 1);
    assert_eq!(b.metrics().in_use_blocks, 1);
    assert_eq!(a.metrics().in_use_blocks, 0);
}

/// Found by the fuzzer: a binding left by a match that found nothing made
/// blocks matched in another manager look like the bound one's, and the
/// next allocation mixed two pools in one table.
#[test]
fn blocks_matched_elsewhere_are_checked_against_their_own_manager() {
    let (a, b) = (manager(8), manager(8));
    let mut donor = request(4, 0);
    donor.allocate_blocks(1, &a).unwrap();
    donor.complete_and_register_pending(&a).unwrap();
    drop(donor);
    let mut seq = request(5, 0);
    assert_eq!(seq.match_and_add_prefix(&b).unwrap(), 0);
    let matched = a.match_blocks(&seq.sequence().sequence_hashes()[..1]);
    assert_eq!(seq.add_matched_blocks(matched).unwrap(), 1);
    assert_eq!(
        seq.allocate_blocks(1, &b).unwrap_err(),
        SequenceError::ForeignManager
    );
    seq.allocate_blocks(1, &a).unwrap();
    assert!(seq.assignments().is_consistent_with(seq.sequence()));
}
