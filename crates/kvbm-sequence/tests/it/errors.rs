//! Every [`SequenceError`] variant, provoked through the public API, and what
//! each refusal leaves behind (nothing changed, nothing leaked).

use std::error::Error as _;

use kvbm_blocks::{BlockError, ImmutableBlocks};
use kvbm_sequence::{BlockSequence, LogicalBlockAssignments, RequestSequence, SequenceError};

use crate::{BLOCK_SIZE, Gpu, audit, check, manager, manager_with_block_size, request};

/// Registers the full blocks of `prompt` in `manager` and releases them (cached).
fn cache(manager: &kvbm_blocks::BlockManager<Gpu>, prompt: &[u32]) {
    let mut seq = request(prompt, 0);
    seq.allocate_blocks(seq.num_blocks(), manager).unwrap();
    seq.complete_and_register_pending(manager).unwrap();
}

#[test]
fn zero_block_size() {
    check(
        "request",
        RequestSequence::<Gpu>::new(vec![1, 2], 1, 0).unwrap_err(),
        SequenceError::ZeroBlockSize,
    );
    check(
        "sequence",
        BlockSequence::new(vec![1, 2], 0).unwrap_err(),
        SequenceError::ZeroBlockSize,
    );
}

#[test]
fn block_size_mismatch_on_every_manager_operation() {
    let wide = manager_with_block_size(8, 8);
    let mut seq = request(&[0; 8], 4);
    let expected = SequenceError::BlockSizeMismatch {
        sequence: BLOCK_SIZE,
        manager: 8,
    };
    check(
        "match",
        seq.match_prefix(&wide).unwrap_err(),
        expected.clone(),
    );
    check(
        "allocate",
        seq.allocate_blocks(1, &wide).unwrap_err(),
        expected.clone(),
    );
    check("reacquire", seq.reacquire(&wide).unwrap_err(), expected);
    assert_eq!(wide.available_blocks(), 8);
}

#[test]
fn foreign_manager() {
    let (first, second) = (manager(8), manager(8));
    let mut seq = request(&(0..8).collect::<Vec<_>>(), 4);
    seq.allocate_blocks(2, &first).unwrap();
    seq.stage_pending().unwrap();
    check(
        "allocate",
        seq.allocate_blocks(1, &second).unwrap_err(),
        SequenceError::ForeignManager,
    );
    check(
        "register",
        seq.register_staged(&second).unwrap_err(),
        SequenceError::ForeignManager,
    );
    check(
        "match",
        seq.match_prefix(&second).unwrap_err(),
        SequenceError::ForeignManager,
    );
    assert_eq!(seq.staged_blocks(), 2, "nothing moved");
    assert_eq!(second.available_blocks(), 8);
    assert_eq!(seq.register_staged(&first).unwrap(), 2);
}

#[test]
fn matched_blocks_that_are_not_a_prefix() {
    let m = manager(16);
    let prompt: Vec<u32> = (0..8).collect();
    cache(&m, &(0..12).collect::<Vec<_>>()); // prompt plus one more block
    cache(&m, &(100..108).collect::<Vec<_>>());

    // More blocks than the sequence has.
    let longer = request(&(0..12).collect::<Vec<_>>(), 0);
    let mut seq = request(&prompt, 4);
    let three = longer.match_prefix(&m).unwrap();
    assert_eq!(three.len(), 3);
    check(
        "beyond",
        seq.add_matched_blocks(three).unwrap_err(),
        SequenceError::MatchedBeyondSequence {
            position: 0,
            matched: 3,
            full_blocks: 2,
        },
    );

    // Another prompt's blocks.
    let other = request(&(100..108).collect::<Vec<_>>(), 0);
    let wrong = other.match_prefix(&m).unwrap();
    check(
        "mismatch",
        seq.add_matched_blocks(wrong).unwrap_err(),
        SequenceError::MatchedHashMismatch {
            position: 0,
            expected: seq.sequence().sequence_hashes()[0].value(),
            actual: other.sequence().sequence_hashes()[0].value(),
        },
    );
    assert_eq!((seq.assigned_blocks(), seq.prefix_matched_blocks()), (0, 0));
    let audit = audit(&m);
    assert_eq!(
        (audit.active_blocks, audit.inactive_blocks),
        (0, 5),
        "refused blocks stay cached"
    );
}

#[test]
fn matched_blocks_behind_staged_blocks() {
    let m = manager(16);
    let prompt: Vec<u32> = (0..8).collect();
    cache(&m, &prompt);
    let mut seq = request(&prompt, 4);
    let matched = seq.match_prefix(&m).unwrap();
    seq.allocate_blocks(1, &m).unwrap();
    seq.stage_pending().unwrap();
    check(
        "staged",
        seq.add_matched_blocks(matched).unwrap_err(),
        SequenceError::StagedBlocksPending { staged: 1 },
    );
    assert_eq!(seq.staged_blocks(), 1);
}

#[test]
fn appending_past_max_output_tokens() {
    let mut seq = request(&[1, 2, 3], 2);
    check(
        "batch too large",
        seq.append_tokens(&[4, 5, 6]).unwrap_err(),
        SequenceError::MaxOutputTokensExceeded {
            requested: 3,
            remaining: 2,
            max_output_tokens: 2,
        },
    );
    assert_eq!(seq.total_tokens(), 3, "all or nothing");
    seq.append_tokens(&[4, 5]).unwrap();
    check(
        "one more",
        seq.append_token(6).unwrap_err(),
        SequenceError::MaxOutputTokensExceeded {
            requested: 1,
            remaining: 0,
            max_output_tokens: 2,
        },
    );
    assert_eq!(seq.tokens(), [1, 2, 3, 4, 5]);
}

#[test]
fn truncate_out_of_range() {
    let mut seq = request(&[1, 2, 3, 4, 5], 4);
    seq.append_tokens(&[6, 7]).unwrap();
    check(
        "into the prompt",
        seq.truncate(4).unwrap_err(),
        SequenceError::TruncateOutOfRange {
            len: 4,
            min: 5,
            max: 7,
        },
    );
    check(
        "past the end",
        seq.truncate(8).unwrap_err(),
        SequenceError::TruncateOutOfRange {
            len: 8,
            min: 5,
            max: 7,
        },
    );
    let mut tokens = BlockSequence::new(vec![1, 2], 4).unwrap();
    check(
        "token level",
        tokens.truncate(3).unwrap_err(),
        SequenceError::TruncateOutOfRange {
            len: 3,
            min: 0,
            max: 2,
        },
    );
}

#[test]
fn reacquire_while_holding_blocks() {
    let m = manager(8);
    let mut seq = request(&[0; 8], 4);
    seq.allocate_blocks(3, &m).unwrap();
    seq.stage_up_to(1).unwrap();
    check(
        "held",
        seq.reacquire(&m).unwrap_err(),
        SequenceError::NotReleased { held: 3 },
    );
}

#[test]
fn allocation_failures_allocate_nothing() {
    let m = manager(4);
    let mut seq = request(&[0; 8], 4);
    check(
        "more than the pool",
        seq.allocate_blocks(5, &m).unwrap_err(),
        SequenceError::AllocationFailed {
            requested: 5,
            source: BlockError::ExceedsCapacity {
                requested: 5,
                total: 4,
            },
        },
    );
    let squatter = m.allocate_blocks(3).unwrap();
    let error = seq.allocate_blocks(2, &m).unwrap_err();
    check(
        "more than available",
        error.clone(),
        SequenceError::AllocationFailed {
            requested: 2,
            source: BlockError::InsufficientBlocks {
                requested: 2,
                available: 1,
            },
        },
    );
    let source = error.source().map(ToString::to_string);
    check(
        "source",
        source,
        Some("requested 2 blocks but only 1 are available".to_owned()),
    );
    assert_eq!(seq.held_blocks(), 0);
    assert_eq!(audit(&m).held_blocks, 3, "only the squatter's");
    drop(squatter);
    seq.allocate_blocks(2, &m).unwrap();
}

#[test]
fn lower_layer_refusals_pass_through() {
    // Blocks of another size, staged through the assignments directly.
    let wide = manager_with_block_size(2, 8);
    let sequence = BlockSequence::new((0..4).collect(), BLOCK_SIZE).unwrap();
    let mut blocks = LogicalBlockAssignments::<Gpu>::new();
    blocks
        .extend_blocks(wide.allocate_blocks(1).unwrap())
        .unwrap();
    check(
        "stage",
        blocks.stage(&sequence, usize::MAX).unwrap_err(),
        SequenceError::Block(BlockError::TokenCountMismatch {
            expected: 8,
            actual: 4,
        }),
    );
    // Staged blocks registered with a manager they do not come from.
    let (first, second) = (manager(2), manager(2));
    let mut blocks = LogicalBlockAssignments::<Gpu>::new();
    blocks
        .extend_blocks(first.allocate_blocks(1).unwrap())
        .unwrap();
    check(
        "extend",
        blocks.extend_blocks(second.allocate_blocks(1).unwrap()),
        Err(SequenceError::Block(BlockError::ForeignManager)),
    );
    check("refused blocks freed", second.available_blocks(), 2);
    blocks.stage(&sequence, usize::MAX).unwrap();
    check(
        "register",
        blocks.register(&second, &sequence).unwrap_err(),
        SequenceError::Block(BlockError::ForeignManager),
    );
    check("kept", blocks.staged_count(), 1);
    check(
        "empty batch",
        blocks.extend_assigned(ImmutableBlocks::new(), &sequence),
        Ok(0),
    );
}

#[test]
fn messages_are_lowercase_without_a_period() {
    let errors = [
        SequenceError::ZeroBlockSize,
        SequenceError::BlockSizeMismatch {
            sequence: 4,
            manager: 8,
        },
        SequenceError::ForeignManager,
        SequenceError::MatchedBeyondSequence {
            position: 1,
            matched: 3,
            full_blocks: 2,
        },
        SequenceError::StagedBlocksPending { staged: 1 },
        SequenceError::MaxOutputTokensExceeded {
            requested: 1,
            remaining: 0,
            max_output_tokens: 2,
        },
        SequenceError::TruncateOutOfRange {
            len: 1,
            min: 2,
            max: 3,
        },
        SequenceError::NotReleased { held: 2 },
        SequenceError::AllocationFailed {
            requested: 2,
            source: BlockError::InsufficientBlocks {
                requested: 2,
                available: 1,
            },
        },
        SequenceError::Block(BlockError::ForeignManager),
    ];
    for error in errors {
        let text = error.to_string();
        let first = text.chars().next().unwrap();
        assert!(!first.is_uppercase() && !text.ends_with('.'), "{text}");
    }
}
