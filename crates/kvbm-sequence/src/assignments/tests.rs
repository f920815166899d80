//! Unit tests for [`LogicalBlockAssignments`]: the three lists, the prefix
//! invariant, and what every refusal leaves behind.

use kvbm_blocks::{BlockError, BlockId, BlockManager, ImmutableBlocks};

use super::LogicalBlockAssignments;
use crate::{BlockSequence, SequenceError};

use crate::test_support::{BS, Gpu, manager};

fn seq(first: u32, len: u32) -> BlockSequence {
    BlockSequence::new((first..first + len).collect(), BS).unwrap()
}

fn counts(a: &LogicalBlockAssignments<Gpu>) -> (usize, usize, usize) {
    (a.assigned_count(), a.staged_count(), a.unassigned_count())
}

/// Registers every full block of `sequence` in `manager` and returns them.
fn registered(manager: &BlockManager<Gpu>, sequence: &BlockSequence) -> ImmutableBlocks<Gpu> {
    let mut a = LogicalBlockAssignments::new();
    a.extend_blocks(manager.allocate_blocks(sequence.num_blocks()).unwrap())
        .unwrap();
    a.stage(sequence, usize::MAX).unwrap();
    a.register(manager, sequence).unwrap();
    a.assigned().clone()
}

#[test]
fn starts_empty() {
    let a = LogicalBlockAssignments::<Gpu>::default();
    assert!(a.is_empty());
    assert_eq!((a.len(), counts(&a)), (0, (0, 0, 0)));
    assert_eq!(a.block_ids().count(), 0);
    assert!(a.is_consistent_with(&seq(0, 8)));
    assert!(format!("{a:?}").contains("assigned: 0"));
}

#[test]
fn stage_binds_unassigned_blocks_front_first_to_full_blocks_only() {
    let m = manager(8);
    let s = seq(0, 10); // two full blocks and a partial tail
    let mut a = LogicalBlockAssignments::new();
    let blocks = m.allocate_blocks(3).unwrap();
    let ids: Vec<BlockId> = blocks.iter().map(|b| b.block_id()).collect();
    a.extend_blocks(blocks).unwrap();
    assert_eq!(a.unassigned_ids(), ids);

    assert_eq!(a.stage(&s, usize::MAX).unwrap(), 2);
    assert_eq!(counts(&a), (0, 2, 1));
    assert_eq!(a.staged_ids(), &ids[..2], "the first two, in order");
    assert_eq!(a.block_ids().collect::<Vec<_>>(), ids, "page order kept");
    assert_eq!(a.stage(&s, usize::MAX).unwrap(), 0, "nothing left to stage");
    assert!(a.is_consistent_with(&s));
}

#[test]
fn stage_stops_at_the_limit_and_when_blocks_run_out() {
    let m = manager(8);
    let s = seq(0, 16); // four full blocks
    let mut a = LogicalBlockAssignments::new();
    a.extend_blocks(m.allocate_blocks(3).unwrap()).unwrap();
    assert_eq!(a.stage(&s, 1).unwrap(), 1);
    assert_eq!(a.stage(&s, 1).unwrap(), 0, "block 1 is past the limit");
    assert_eq!(
        a.stage(&s, 0).unwrap(),
        0,
        "a limit below the staged prefix stages nothing"
    );
    assert_eq!(a.stage(&s, usize::MAX).unwrap(), 2, "only two blocks left");
    assert_eq!(counts(&a), (0, 3, 0));
    assert!(a.is_consistent_with(&s));
}

#[test]
fn register_publishes_staged_blocks_in_order() {
    let m = manager(8);
    let s = seq(0, 8);
    let mut a = LogicalBlockAssignments::new();
    assert_eq!(a.register(&m, &s).unwrap(), 0, "nothing staged");
    a.extend_blocks(m.allocate_blocks(2).unwrap()).unwrap();
    a.stage(&s, usize::MAX).unwrap();
    assert_eq!(a.register(&m, &s).unwrap(), 2);
    assert_eq!(counts(&a), (2, 0, 0));
    assert!(
        a.assigned()
            .iter()
            .zip(s.sequence_hashes())
            .all(|(i, &h)| i.holds(h))
    );
    assert_eq!(a.assigned().len(), s.sequence_hashes().len());
    assert_eq!(m.match_blocks(s.sequence_hashes()).len(), 2);
    assert!(a.is_consistent_with(&s));
}

#[test]
fn register_deduplicates_against_the_cache() {
    let m = manager(8);
    let s = seq(0, 8);
    let first = registered(&m, &s);
    let mut a = LogicalBlockAssignments::new();
    a.extend_blocks(m.allocate_blocks(2).unwrap()).unwrap();
    a.stage(&s, usize::MAX).unwrap();
    a.register(&m, &s).unwrap();
    assert_eq!(
        a.assigned().block_ids().collect::<Vec<_>>(),
        first.block_ids().collect::<Vec<_>>(),
        "the existing blocks come back, the new ones are freed"
    );
    drop((a, first));
    let audit = m.audit().unwrap();
    assert_eq!((audit.free_blocks, audit.inactive_blocks), (6, 2));
}

#[test]
fn extend_assigned_accepts_exactly_the_next_blocks() {
    let m = manager(8);
    let s = seq(0, 12);
    let cached = registered(&m, &s);
    let mut a = LogicalBlockAssignments::new();
    let first_two = m.match_blocks(&s.sequence_hashes()[..2]);
    assert_eq!(a.extend_assigned(first_two, &s).unwrap(), 2);
    let third = m.match_blocks(&s.sequence_hashes()[2..]);
    assert_eq!(a.extend_assigned(third, &s).unwrap(), 1);
    assert_eq!(a.extend_assigned(ImmutableBlocks::new(), &s).unwrap(), 0);
    assert_eq!(counts(&a), (3, 0, 0));
    assert!(a.is_consistent_with(&s));
    drop(cached);
}

#[test]
fn extend_assigned_refuses_blocks_that_are_not_the_prefix() {
    let m = manager(12);
    let s = seq(0, 8);
    let other = seq(100, 8);
    let longer = seq(0, 12);
    registered(&m, &other);
    registered(&m, &longer); // its first two blocks are s's

    let mut a = LogicalBlockAssignments::new();
    let wrong = m.match_blocks(other.sequence_hashes());
    assert_eq!(
        a.extend_assigned(wrong, &s).unwrap_err(),
        SequenceError::MatchedHashMismatch {
            position: 0,
            expected: s.sequence_hashes()[0].value(),
            actual: other.sequence_hashes()[0].value(),
        }
    );
    let too_many = m.match_blocks(longer.sequence_hashes());
    assert_eq!(
        a.extend_assigned(too_many, &s).unwrap_err(),
        SequenceError::MatchedBeyondSequence {
            position: 0,
            matched: 3,
            full_blocks: 2
        }
    );
    // Skipping block 0: block 1 offered at position 0.
    let skipped = m.match_blocks(&s.sequence_hashes()[1..]);
    assert!(matches!(
        a.extend_assigned(skipped, &s),
        Err(SequenceError::MatchedHashMismatch { position: 0, .. })
    ));
    assert!(a.is_empty());
    let audit = m.audit().unwrap();
    assert_eq!(audit.active_blocks, 0, "refused blocks are released");
    assert_eq!(audit.inactive_blocks, 5);
}

#[test]
fn extend_assigned_refuses_while_blocks_are_staged() {
    let m = manager(8);
    let s = seq(0, 8);
    let cached = registered(&m, &s);
    let mut a = LogicalBlockAssignments::new();
    a.extend_blocks(m.allocate_blocks(1).unwrap()).unwrap();
    a.stage(&s, usize::MAX).unwrap();
    let matched = m.match_blocks(s.sequence_hashes());
    assert_eq!(
        a.extend_assigned(matched, &s).unwrap_err(),
        SequenceError::StagedBlocksPending { staged: 1 }
    );
    assert_eq!(counts(&a), (0, 1, 0));
    drop(cached);
}

#[test]
fn extend_assigned_refuses_blocks_of_another_manager() {
    let (m1, m2) = (manager(8), manager(8));
    let s = seq(0, 8);
    registered(&m1, &s);
    registered(&m2, &s);
    let mut a = LogicalBlockAssignments::new();
    a.extend_assigned(m1.match_blocks(&s.sequence_hashes()[..1]), &s)
        .unwrap();
    let foreign = m2.match_blocks(&s.sequence_hashes()[1..]);
    assert_eq!(
        a.extend_assigned(foreign, &s).unwrap_err(),
        SequenceError::ForeignManager
    );
    assert_eq!(counts(&a), (1, 0, 0));
    assert_eq!(m2.audit().unwrap().active_blocks, 0);
}

#[test]
fn stage_with_the_wrong_block_size_hands_the_block_back() {
    let wide = BlockManager::<Gpu>::builder()
        .block_count(4)
        .block_size(8)
        .build()
        .unwrap();
    let s = seq(0, 8);
    let mut a = LogicalBlockAssignments::new();
    let blocks = wide.allocate_blocks(2).unwrap();
    let first = blocks[0].block_id();
    a.extend_blocks(blocks).unwrap();
    assert_eq!(
        a.stage(&s, usize::MAX).unwrap_err(),
        SequenceError::Block(BlockError::TokenCountMismatch {
            expected: 8,
            actual: 4
        })
    );
    assert_eq!(counts(&a), (0, 0, 2));
    assert_eq!(a.unassigned_ids().first(), Some(&first));
}

#[test]
fn register_with_another_manager_keeps_the_blocks_staged() {
    let (m1, m2) = (manager(4), manager(4));
    let s = seq(0, 4);
    let mut a = LogicalBlockAssignments::new();
    a.extend_blocks(m1.allocate_blocks(1).unwrap()).unwrap();
    a.stage(&s, usize::MAX).unwrap();
    assert_eq!(
        a.register(&m2, &s).unwrap_err(),
        SequenceError::Block(BlockError::ForeignManager)
    );
    assert_eq!(counts(&a), (0, 1, 0));
    assert_eq!(a.register(&m1, &s).unwrap(), 1);
}

/// Two managers, a sequence of `len` tokens registered in the first, and
/// a table whose first block is the first manager's (matched) and whose
/// next block, staged, is the second's.
fn staged_over_a_foreign_prefix(
    len: u32,
) -> (
    BlockManager<Gpu>,
    BlockManager<Gpu>,
    BlockSequence,
    LogicalBlockAssignments<Gpu>,
) {
    let (m1, m2) = (manager(4), manager(4));
    let s = seq(0, len);
    registered(&m1, &s);
    let mut a = LogicalBlockAssignments::new();
    a.extend_assigned(m1.match_blocks(&s.sequence_hashes()[..1]), &s)
        .unwrap();
    a.extend_blocks(m2.allocate_blocks(1).unwrap()).unwrap();
    a.stage(&s, usize::MAX).unwrap();
    (m1, m2, s, a)
}

#[test]
fn register_into_an_assigned_prefix_of_another_manager_is_refused() {
    let (_m1, m2, s, mut a) = staged_over_a_foreign_prefix(8);
    // Refused before anything moves: the staged block stays staged (it used
    // to be registered into m2 and dropped from the sequence).
    assert_eq!(
        a.register(&m2, &s).unwrap_err(),
        SequenceError::ForeignManager
    );
    assert_eq!(counts(&a), (1, 1, 0));
    let audit = m2.audit().unwrap();
    assert_eq!(
        (audit.held_blocks, audit.inactive_blocks),
        (1, 0),
        "still held by the sequence, not registered"
    );
}

#[test]
fn pop_unassigned_is_lifo() {
    let m = manager(4);
    let mut a = LogicalBlockAssignments::new();
    let blocks = m.allocate_blocks(3).unwrap();
    let ids: Vec<BlockId> = blocks.iter().map(|b| b.block_id()).collect();
    a.extend_blocks(blocks).unwrap();
    assert_eq!(a.pop_unassigned().map(|b| b.block_id()), Some(ids[2]));
    assert_eq!(a.pop_unassigned().map(|b| b.block_id()), Some(ids[1]));
    assert_eq!(a.unassigned_count(), 1);
    assert_eq!(m.available_blocks(), 3, "popped blocks were dropped, freed");
}

#[test]
fn truncate_below_a_skipped_prefix_counts_the_skipped_blocks() {
    let m = manager(8);
    let s = seq(0, (6 * BS) as u32);
    let mut a = LogicalBlockAssignments::new();
    a.allocate(&m, 3).unwrap();
    a.stage(&s, 3).unwrap();
    a.register(&m, &s).unwrap();
    a.skip_to(2); // a window moved past blocks 0 and 1
    a.allocate(&m, 2).unwrap();
    a.stage(&s, usize::MAX).unwrap();
    assert_eq!((a.skipped_count(), counts(&a)), (2, (1, 2, 0)));
    // Four blocks left: skipped 0-1, assigned 2, staged 3; block 4's
    // staged block steps back (it once stayed staged past the end).
    a.truncate(4);
    assert_eq!((a.skipped_count(), counts(&a)), (2, (1, 1, 1)));
    let mut short = s.clone();
    short.truncate(4 * BS).unwrap();
    assert!(a.is_consistent_with(&short));
}

#[test]
fn truncate_releases_assigned_and_resets_staged_blocks_in_order() {
    let m = manager(8);
    let s = seq(0, 20); // five full blocks
    let mut a = LogicalBlockAssignments::new();
    a.extend_blocks(m.allocate_blocks(6).unwrap()).unwrap();
    a.stage(&s, 3).unwrap();
    a.register(&m, &s).unwrap();
    a.stage(&s, usize::MAX).unwrap();
    assert_eq!(counts(&a), (3, 2, 1));
    let ids: Vec<BlockId> = a.block_ids().collect();

    a.truncate(4); // the last staged block steps back
    assert_eq!(counts(&a), (3, 1, 2));
    assert_eq!(a.block_ids().collect::<Vec<_>>(), ids, "page order kept");

    a.truncate(2); // an assigned block goes; every staged one steps back
    assert_eq!(counts(&a), (2, 0, 3));
    let mut expected = ids[..2].to_vec();
    expected.extend_from_slice(&ids[3..]);
    assert_eq!(a.block_ids().collect::<Vec<_>>(), expected);
    assert_eq!(
        m.metrics().inactive_blocks,
        1,
        "the released block stays cached"
    );

    a.truncate(10);
    assert_eq!(counts(&a), (2, 0, 3), "truncating beyond is a no-op");
    let mut short = s.clone();
    short.truncate(9).unwrap();
    assert!(a.is_consistent_with(&short));
}

#[test]
fn clear_gives_everything_back() {
    let m = manager(8);
    let s = seq(0, 12);
    let mut a = LogicalBlockAssignments::new();
    a.extend_blocks(m.allocate_blocks(5).unwrap()).unwrap();
    a.stage(&s, 2).unwrap();
    a.register(&m, &s).unwrap();
    a.stage(&s, usize::MAX).unwrap();
    assert_eq!(counts(&a), (2, 1, 2));
    a.clear();
    assert!(a.is_empty());
    let audit = m.audit().unwrap();
    assert_eq!(audit.in_use_blocks(), 0);
    assert_eq!((audit.free_blocks, audit.inactive_blocks), (6, 2));
}

#[test]
fn contains_and_block_ids_span_all_three_lists() {
    let m = manager(8);
    let s = seq(0, 8);
    let mut a = LogicalBlockAssignments::new();
    a.extend_blocks(m.allocate_blocks(3).unwrap()).unwrap();
    a.stage(&s, 1).unwrap();
    a.register(&m, &s).unwrap();
    a.stage(&s, usize::MAX).unwrap();
    let ids: Vec<BlockId> = a.block_ids().collect();
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().all(|&id| a.contains(id)));
    let outsider = m.allocate_blocks(1).unwrap();
    assert!(!a.contains(outsider[0].block_id()));
}

#[test]
fn consistency_fails_against_another_sequence() {
    let m = manager(8);
    let s = seq(0, 8);
    let mut a = LogicalBlockAssignments::new();
    a.extend_blocks(m.allocate_blocks(2).unwrap()).unwrap();
    a.stage(&s, 1).unwrap();
    a.register(&m, &s).unwrap();
    a.stage(&s, usize::MAX).unwrap();
    assert_eq!(counts(&a), (1, 1, 0));
    assert!(a.is_consistent_with(&s));
    assert!(!a.is_consistent_with(&seq(1, 8)), "other tokens");
    assert!(!a.is_consistent_with(&seq(0, 7)), "fewer full blocks");
}

/// How [`register_skip_case`] registers and skips.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    /// `stage`, `register`, then `skip_to`.
    Unfused,
    /// `stage`, then `register_and_skip_to`.
    Fused,
    /// `stage_register_and_skip_to`.
    Passing,
}

/// Stages and registers a window of `held` assigned blocks after `skipped`
/// skipped ones and `staged` more, then skips to `first_needed` through
/// `path`, with part of the sequence cached by another request; returns
/// the counts, the table, and the pool's eviction order afterwards.
/// (`first_needed` stays within the sequence's blocks, as
/// `RequestSequence::skip_to` clamps it.)
fn register_skip_case(
    skipped: usize,
    held: usize,
    staged: usize,
    cached: usize,
    first_needed: usize,
    path: Path,
) -> (
    usize,
    usize,
    Vec<BlockId>,
    usize,
    Vec<kvbm_blocks::SequenceHash>,
) {
    let m = manager(24);
    let s = seq(0, ((skipped + held + staged) * BS + 2) as u32);
    // Another request cached some of the blocks (registration
    // deduplicates onto them, reviving them from the cache).
    let prefix = BlockSequence::new(s.tokens().to_vec()[..cached * BS].to_vec(), BS).unwrap();
    drop(registered(&m, &prefix));
    let mut a = LogicalBlockAssignments::new();
    a.extend_blocks(m.allocate_blocks(skipped + held).unwrap())
        .unwrap();
    a.stage(&s, usize::MAX).unwrap();
    a.register(&m, &s).unwrap();
    a.skip_to(skipped);
    a.extend_blocks(m.allocate_blocks(staged + 1).unwrap())
        .unwrap();
    if path != Path::Passing {
        a.stage(&s, usize::MAX).unwrap();
    }
    let (registered, released) = match path {
        Path::Passing => a
            .stage_register_and_skip_to(&m, &s, usize::MAX, first_needed)
            .unwrap(),
        Path::Fused => a.register_and_skip_to(&m, &s, first_needed).unwrap(),
        Path::Unfused => {
            let registered = a.register(&m, &s).unwrap();
            (registered, a.skip_to(first_needed))
        }
    };
    assert!(a.is_consistent_with(&s));
    let table = a.block_ids().collect();
    let skipped = a.skipped_count();
    drop(a);
    let evicted = m
        .allocate_blocks_with_evictions(m.available_blocks())
        .unwrap()
        .evicted;
    (registered, released, table, skipped, evicted)
}

#[test]
fn register_and_skip_to_and_stage_register_and_skip_to_are_register_then_skip_to() {
    for skipped in 0..2 {
        for held in 0..3 {
            for staged in 0..4 {
                for cached in 0..=(skipped + held + staged) {
                    for first_needed in 0..=(skipped + held + staged) {
                        let case = |path| {
                            register_skip_case(skipped, held, staged, cached, first_needed, path)
                        };
                        let unfused = case(Path::Unfused);
                        for path in [Path::Fused, Path::Passing] {
                            assert_eq!(
                                case(path),
                                unfused,
                                "{path:?}: skipped {skipped}, held {held}, staged {staged}, \
                                 cached {cached}, first needed {first_needed}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn register_and_skip_to_refused_changes_nothing() {
    let (m1, m2, s, mut a) = staged_over_a_foreign_prefix(12);
    // The assigned prefix is another manager's: refused before anything
    // moves, nothing released.
    assert_eq!(
        a.register_and_skip_to(&m2, &s, 2).unwrap_err(),
        SequenceError::ForeignManager
    );
    assert_eq!((counts(&a), a.skipped_count()), ((1, 1, 0), 0));
    // Staged blocks of another manager: refused, still staged.
    let mut b = LogicalBlockAssignments::new();
    b.extend_blocks(m2.allocate_blocks(1).unwrap()).unwrap();
    b.stage(&s, usize::MAX).unwrap();
    assert_eq!(
        b.register_and_skip_to(&m1, &s, 1).unwrap_err(),
        SequenceError::Block(BlockError::ForeignManager)
    );
    assert_eq!((counts(&b), b.skipped_count()), ((0, 1, 0), 0));
    let audit = m2.audit().unwrap();
    assert_eq!((audit.held_blocks, audit.inactive_blocks), (2, 0));
    // Accepted: registered and released at once.
    assert_eq!(b.register_and_skip_to(&m2, &s, 1).unwrap(), (1, 1));
    assert_eq!((counts(&b), b.skipped_count()), ((0, 0, 0), 1));
    assert_eq!(m2.match_blocks(&s.sequence_hashes()[..1]).len(), 1);
}

#[test]
fn stage_register_and_skip_to_refused_changes_nothing() {
    let (m1, m2) = (manager(8), manager(8));
    let s = seq(0, 14);
    // Blocks of another manager never join the queue: refused (and freed).
    let mut a = LogicalBlockAssignments::new();
    a.extend_blocks(m1.allocate_blocks(1).unwrap()).unwrap();
    assert_eq!(
        a.extend_blocks(m2.allocate_blocks(2).unwrap()).unwrap_err(),
        SequenceError::Block(BlockError::ForeignManager)
    );
    assert_eq!(m2.available_blocks(), 8);
    a.extend_blocks(m1.allocate_blocks(2).unwrap()).unwrap();
    assert_eq!((counts(&a), a.skipped_count()), ((0, 0, 3), 0));
    // A manager of another block size: refused.
    let other_size = BlockManager::<Gpu>::builder()
        .block_count(4)
        .block_size(BS * 2)
        .build()
        .unwrap();
    assert!(matches!(
        a.stage_register_and_skip_to(&other_size, &s, usize::MAX, 2),
        Err(SequenceError::BlockSizeMismatch { .. })
    ));
    assert_eq!((counts(&a), a.skipped_count()), ((0, 0, 3), 0));
    assert_eq!(m1.audit().unwrap().held_blocks, 3);
    // An assigned prefix of another manager: refused.
    let mut b = LogicalBlockAssignments::new();
    b.extend_blocks(m2.allocate_blocks(1).unwrap()).unwrap();
    b.stage(&s, usize::MAX).unwrap();
    b.register(&m2, &s).unwrap();
    b.extend_blocks(m1.allocate_blocks(2).unwrap()).unwrap();
    assert_eq!(
        b.stage_register_and_skip_to(&m1, &s, usize::MAX, 2)
            .unwrap_err(),
        SequenceError::ForeignManager
    );
    assert_eq!((counts(&b), b.skipped_count()), ((1, 0, 2), 0));
    // Accepted: the first block registered and released at once.
    let mut c = LogicalBlockAssignments::new();
    c.extend_blocks(m1.allocate_blocks(3).unwrap()).unwrap();
    assert_eq!(
        c.stage_register_and_skip_to(&m1, &s, usize::MAX, 1)
            .unwrap(),
        (3, 1)
    );
    assert_eq!((counts(&c), c.skipped_count()), ((2, 0, 0), 1));
    assert!(c.is_consistent_with(&s));
}
