//! Model-based test: random interleavings of append / allocate / stage /
//! register / match / truncate / release / reacquire on a few requests that
//! share prompt prefixes, against a small pool. After every step:
//!
//! - each request's assignments hold a prefix of its full blocks (the
//!   assignment invariant) and its counts add up;
//! - the pool conserves blocks, and what it reports as held (mutable or
//!   staged) and active (registered and pinned) is exactly what the requests
//!   hold;
//! - a refused operation changed nothing.
//!
//! At the end every request is released and no block is left in use.

use std::collections::BTreeSet;

use kvbm_blocks::BlockManager;
use kvbm_sequence::{RequestSequence, SequenceError};
use proptest::prelude::*;

use crate::{BLOCK_SIZE, Gpu, audit, manager};

const REQUESTS: usize = 3;
const POOL: usize = 12;

/// Prompts with shared prefixes (tokens from a tiny alphabet), so requests
/// match each other's blocks.
fn prompt(kind: u8) -> Vec<u32> {
    let base: Vec<u32> = vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
    match kind % 4 {
        0 => base[..8].to_vec(),
        1 => base.clone(),
        2 => [&base[..4], &[0, 0, 0]].concat(),
        _ => vec![9, 9, 9, 9, 9],
    }
}

#[derive(Clone, Debug)]
enum Op {
    New {
        req: usize,
        kind: u8,
        max_output: usize,
    },
    Append {
        req: usize,
        tokens: Vec<u32>,
    },
    Allocate {
        req: usize,
        count: usize,
    },
    Stage {
        req: usize,
        up_to: usize,
    },
    Register {
        req: usize,
    },
    CompleteUpTo {
        req: usize,
        up_to: usize,
    },
    Match {
        req: usize,
    },
    Truncate {
        req: usize,
        back: usize,
    },
    ReleaseUnassigned {
        req: usize,
        count: usize,
    },
    ReleaseBeyond {
        req: usize,
    },
    Release {
        req: usize,
    },
    Reacquire {
        req: usize,
    },
    ClearCache,
}

fn op() -> impl Strategy<Value = Op> {
    let req = 0..REQUESTS;
    prop_oneof![
        1 => (req.clone(), any::<u8>(), 0usize..12)
            .prop_map(|(req, kind, max_output)| Op::New { req, kind, max_output }),
        4 => (req.clone(), prop::collection::vec(0u32..3, 1..6))
            .prop_map(|(req, tokens)| Op::Append { req, tokens }),
        3 => (req.clone(), 0usize..5).prop_map(|(req, count)| Op::Allocate { req, count }),
        2 => (req.clone(), 0usize..6).prop_map(|(req, up_to)| Op::Stage { req, up_to }),
        2 => req.clone().prop_map(|req| Op::Register { req }),
        3 => (req.clone(), 0usize..8).prop_map(|(req, up_to)| Op::CompleteUpTo { req, up_to }),
        2 => req.clone().prop_map(|req| Op::Match { req }),
        2 => (req.clone(), 0usize..8).prop_map(|(req, back)| Op::Truncate { req, back }),
        1 => (req.clone(), 0usize..4).prop_map(|(req, count)| Op::ReleaseUnassigned { req, count }),
        1 => req.clone().prop_map(|req| Op::ReleaseBeyond { req }),
        2 => req.clone().prop_map(|req| Op::Release { req }),
        2 => req.prop_map(|req| Op::Reacquire { req }),
        1 => Just(Op::ClearCache),
    ]
}

/// What a request looks like from outside, to check refusals change nothing.
fn shape(seq: &RequestSequence<Gpu>) -> (Vec<u32>, Vec<u32>, [usize; 4]) {
    (
        seq.tokens().to_vec(),
        seq.page_indices(),
        [
            seq.assigned_blocks(),
            seq.staged_blocks(),
            seq.unassigned_blocks(),
            seq.prefix_matched_blocks(),
        ],
    )
}

fn apply(
    op: &Op,
    reqs: &mut [RequestSequence<Gpu>],
    m: &BlockManager<Gpu>,
) -> Result<(), TestCaseError> {
    let index = match op {
        Op::ClearCache => {
            m.clear_cache();
            return Ok(());
        }
        Op::New { req, .. }
        | Op::Append { req, .. }
        | Op::Allocate { req, .. }
        | Op::Stage { req, .. }
        | Op::Register { req }
        | Op::CompleteUpTo { req, .. }
        | Op::Match { req }
        | Op::Truncate { req, .. }
        | Op::ReleaseUnassigned { req, .. }
        | Op::ReleaseBeyond { req }
        | Op::Release { req }
        | Op::Reacquire { req } => *req,
    };
    let seq = &mut reqs[index];
    let before = shape(seq);
    let result = match op {
        Op::ClearCache => unreachable!("handled above"),
        Op::New {
            kind, max_output, ..
        } => {
            *seq = RequestSequence::new(prompt(*kind), *max_output, BLOCK_SIZE).unwrap();
            Ok(())
        }
        Op::Append { tokens, .. } => {
            let remaining = seq.remaining_tokens();
            let result = seq.append_tokens(tokens).map(drop);
            prop_assert_eq!(result.is_ok(), tokens.len() <= remaining);
            result
        }
        Op::Allocate { count, .. } => {
            let available = m.available_blocks();
            let result = seq.allocate_blocks(*count, m);
            prop_assert_eq!(result.is_ok(), *count <= available, "{:?}", result);
            result
        }
        Op::Stage { up_to, .. } => seq.stage_up_to(*up_to).map(drop),
        Op::Register { .. } => {
            let staged = seq.staged_blocks();
            prop_assert_eq!(seq.register_staged(m)?, staged);
            prop_assert_eq!(seq.staged_blocks(), 0);
            Ok(())
        }
        Op::CompleteUpTo { up_to, .. } => seq.complete_and_register_up_to(*up_to, m).map(drop),
        Op::Match { .. } => {
            let staged = seq.staged_blocks();
            let result = seq.match_and_add_prefix(m).map(drop);
            if staged > 0 {
                // Staged blocks sit where matched ones would go; only an
                // empty match gets through.
                let expected = matches!(
                    result,
                    Ok(()) | Err(SequenceError::StagedBlocksPending { .. })
                );
                prop_assert!(expected, "{:?}", result);
            } else {
                prop_assert!(result.is_ok(), "{:?}", result);
            }
            result
        }
        Op::Truncate { back, .. } => {
            let len = seq.total_tokens() - (*back).min(seq.generated_tokens());
            let block_size = seq.block_size();
            let cuts_registered =
                len < seq.assigned_blocks() * block_size && !len.is_multiple_of(block_size);
            let before: Vec<_> = seq.block_ids().collect();
            let result = seq.truncate(len);
            if cuts_registered {
                let refused = matches!(result, Err(SequenceError::TruncateIntoRegistered { .. }));
                prop_assert!(refused, "{:?}", result);
                prop_assert_eq!(seq.block_ids().collect::<Vec<_>>(), before);
                return Ok(());
            }
            result?;
            prop_assert_eq!(seq.total_tokens(), len);
            // The same tokens, hashes and block layout as a fresh sequence.
            let fresh = RequestSequence::<Gpu>::with_salt(
                seq.tokens().to_vec(),
                seq.max_output_tokens(),
                block_size,
                seq.salt(),
            )?;
            prop_assert_eq!(
                seq.sequence().sequence_hashes(),
                fresh.sequence().sequence_hashes()
            );
            prop_assert_eq!(seq.num_blocks(), fresh.num_blocks());
            Ok(())
        }
        Op::ReleaseUnassigned { count, .. } => {
            let unassigned = seq.unassigned_blocks();
            prop_assert_eq!(seq.release_unassigned(*count), (*count).min(unassigned));
            Ok(())
        }
        Op::ReleaseBeyond { .. } => {
            let total = seq.total_tokens();
            seq.release_unassigned_beyond(total);
            prop_assert!(
                seq.unassigned_blocks() == 0 || seq.held_blocks() <= total.div_ceil(BLOCK_SIZE)
            );
            Ok(())
        }
        Op::Release { .. } => {
            seq.release();
            prop_assert_eq!(seq.held_blocks(), 0);
            Ok(())
        }
        Op::Reacquire { .. } => {
            let held = seq.held_blocks();
            let result = seq.reacquire(m);
            match &result {
                Ok(hits) => {
                    prop_assert_eq!(*hits, seq.prefix_matched_blocks());
                    prop_assert_eq!(
                        seq.assigned_blocks() + seq.unassigned_blocks(),
                        seq.num_blocks()
                    );
                }
                Err(SequenceError::NotReleased { held: reported }) => {
                    prop_assert_eq!(*reported, held)
                }
                Err(SequenceError::AllocationFailed { .. }) => {
                    prop_assert_eq!(seq.held_blocks(), 0)
                }
                Err(other) => prop_assert!(false, "unexpected {:?}", other),
            }
            result.map(drop)
        }
    };
    if let Err(error) = result {
        match error {
            // A failed reacquire releases everything, by contract.
            SequenceError::AllocationFailed { .. } if matches!(op, Op::Reacquire { .. }) => {}
            _ => prop_assert_eq!(
                shape(seq),
                before,
                "{:?} failed with {:?} but changed state",
                op,
                error
            ),
        }
    }
    Ok(())
}

/// The assignment invariant per request, and the pool's conservation and
/// accounting against what the requests hold.
fn check_invariants(
    reqs: &[RequestSequence<Gpu>],
    m: &BlockManager<Gpu>,
) -> Result<(), TestCaseError> {
    let mut held = 0;
    let mut active = BTreeSet::new();
    for seq in reqs {
        prop_assert!(
            seq.assignments().is_consistent_with(seq.sequence()),
            "{:?}",
            seq
        );
        prop_assert_eq!(
            seq.assigned_blocks() + seq.staged_blocks() + seq.pending_blocks(),
            seq.num_blocks()
        );
        prop_assert!(seq.prefix_matched_blocks() <= seq.assigned_blocks());
        prop_assert!(seq.generated_tokens() <= seq.max_output_tokens());
        held += seq.staged_blocks() + seq.unassigned_blocks();
        active.extend(seq.assignments().assigned().block_ids());
    }
    let pool = audit(m);
    prop_assert_eq!(pool.held_blocks, held);
    prop_assert_eq!(pool.active_blocks, active.len());
    prop_assert_eq!(pool.duplicate_blocks, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_lifecycles_conserve_blocks_and_keep_the_invariant(
        kinds in prop::array::uniform3(any::<u8>()),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let m = manager(POOL);
        let mut reqs: Vec<RequestSequence<Gpu>> = kinds
            .iter()
            .map(|&kind| RequestSequence::new(prompt(kind), 8, BLOCK_SIZE).unwrap())
            .collect();
        for op in &ops {
            apply(op, &mut reqs, &m)?;
            check_invariants(&reqs, &m)?;
        }
        for seq in &mut reqs {
            seq.release();
        }
        let pool = audit(&m);
        prop_assert_eq!(pool.in_use_blocks(), 0);
        prop_assert_eq!(pool.free_blocks + pool.inactive_blocks, POOL);
    }
}
