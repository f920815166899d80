//! API fuzzer: arbitrary sequences of `RequestSequence` calls over two
//! managers (and a managers' block size that does not match), with extreme
//! counts, lengths and budgets: match, add blocks matched in either manager,
//! allocate, stage, register, append, truncate anywhere, release, reacquire
//! on either manager, give blocks back.
//!
//! After every call: nothing panicked, a refused call changed nothing
//! (tokens, page table, counts, both pools), the assignments are consistent
//! with the tokens, both audits pass, and the blocks in use are exactly the
//! blocks the sequence holds. `cargo xtask fuzz` runs it long.

use kvbm_blocks::{BlockId, BlockManager, PoolAudit};
use kvbm_sequence::{RequestSequence, SequenceError};
use proptest::prelude::*;

use crate::{BLOCK_SIZE, Gpu, manager, manager_with_block_size};

/// Cases per fuzz test: `KVBM_FUZZ_CASES` (as `cargo xtask fuzz --cases N`
/// sets it), else a CI-sized default.
fn cases() -> u32 {
    std::env::var("KVBM_FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(1024)
}

fn extreme_usize() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 0usize..8,
        1 => Just(usize::MAX),
        1 => Just(usize::MAX / 2),
        1 => any::<usize>(),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    MatchAndAdd {
        on: usize,
    },
    /// Blocks matched directly in manager `on`, then added.
    AddMatched {
        on: usize,
    },
    Allocate {
        on: usize,
        count: usize,
    },
    StageUpTo(usize),
    StagePending,
    Register {
        on: usize,
    },
    CompleteAndRegister {
        on: usize,
    },
    Append {
        count: usize,
        value: u32,
    },
    /// Truncates to `total - back` (or to an out-of-range length).
    Truncate {
        back: usize,
        out_of_range: bool,
    },
    Release,
    Reacquire {
        on: usize,
    },
    ReleaseUnassigned(usize),
    DropExcessUnassigned(usize),
    ReleaseBeyond(usize),
    PopUnassigned,
}

fn op() -> impl Strategy<Value = Op> {
    // 0 and 1 are the two managers; 2 has another block size.
    let on = || prop_oneof![4 => 0usize..2, 1 => Just(2usize)];
    prop_oneof![
        2 => on().prop_map(|on| Op::MatchAndAdd { on }),
        1 => on().prop_map(|on| Op::AddMatched { on }),
        3 => (on(), extreme_usize()).prop_map(|(on, count)| Op::Allocate { on, count }),
        1 => extreme_usize().prop_map(Op::StageUpTo),
        1 => Just(Op::StagePending),
        1 => on().prop_map(|on| Op::Register { on }),
        3 => on().prop_map(|on| Op::CompleteAndRegister { on }),
        3 => (prop_oneof![4 => 0usize..9, 1 => Just(usize::MAX)], 0u32..3)
            .prop_map(|(count, value)| Op::Append { count, value }),
        2 => (extreme_usize(), prop::bool::weighted(0.2))
            .prop_map(|(back, out_of_range)| Op::Truncate { back, out_of_range }),
        1 => Just(Op::Release),
        2 => on().prop_map(|on| Op::Reacquire { on }),
        1 => extreme_usize().prop_map(Op::ReleaseUnassigned),
        1 => extreme_usize().prop_map(Op::DropExcessUnassigned),
        1 => extreme_usize().prop_map(Op::ReleaseBeyond),
        1 => Just(Op::PopUnassigned),
    ]
}

/// What a refused call must leave as it was.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    tokens: Vec<u32>,
    table: Vec<BlockId>,
    counts: [usize; 6],
    pools: Vec<PoolAudit>,
}

fn snapshot(seq: &RequestSequence<Gpu>, managers: &[BlockManager<Gpu>]) -> Snapshot {
    Snapshot {
        tokens: seq.tokens().to_vec(),
        table: seq.block_ids().collect(),
        counts: [
            seq.assigned_blocks(),
            seq.staged_blocks(),
            seq.unassigned_blocks(),
            seq.prefix_matched_blocks(),
            seq.generated_tokens(),
            seq.num_blocks(),
        ],
        pools: managers.iter().map(|m| m.audit().unwrap()).collect(),
    }
}

fn is_typed(error: &SequenceError) -> bool {
    matches!(
        error,
        SequenceError::AllocationFailed { .. }
            | SequenceError::BlockSizeMismatch { .. }
            | SequenceError::ForeignManager
            | SequenceError::MatchedHashMismatch { .. }
            | SequenceError::MatchedBeyondSequence { .. }
            | SequenceError::StagedBlocksPending { .. }
            | SequenceError::MaxOutputTokensExceeded { .. }
            | SequenceError::TruncateOutOfRange { .. }
            | SequenceError::TruncateIntoRegistered { .. }
            | SequenceError::NotReleased { .. }
            | SequenceError::Block(_)
    )
}

fn apply(
    seq: &mut RequestSequence<Gpu>,
    managers: &[BlockManager<Gpu>],
    op: &Op,
) -> Result<(), SequenceError> {
    match *op {
        Op::MatchAndAdd { on } => seq.match_and_add_prefix(&managers[on]).map(drop),
        Op::AddMatched { on } => {
            let from = seq.assigned_blocks();
            let hashes = seq.sequence().sequence_hashes().get(from..).unwrap_or(&[]);
            let matched = managers[on].match_blocks(hashes);
            seq.add_matched_blocks(matched).map(drop)
        }
        Op::Allocate { on, count } => seq.allocate_blocks(count, &managers[on]),
        Op::StageUpTo(n) => seq.stage_up_to(n).map(drop),
        Op::StagePending => seq.stage_pending().map(drop),
        Op::Register { on } => seq.register_staged(&managers[on]).map(drop),
        Op::CompleteAndRegister { on } => {
            seq.complete_and_register_pending(&managers[on]).map(drop)
        }
        Op::Append { count, value } => {
            // Never materialize a huge request: `usize::MAX` stands for "more
            // than the budget", which must be refused before allocating.
            let tokens = vec![value; count.min(seq.remaining_tokens().saturating_add(1)).min(64)];
            seq.append_tokens(&tokens).map(drop)
        }
        Op::Truncate { back, out_of_range } => {
            let len = if out_of_range {
                seq.total_tokens().saturating_add(back.max(1))
            } else {
                seq.total_tokens() - back.min(seq.generated_tokens())
            };
            seq.truncate(len)
        }
        Op::Release => {
            seq.release();
            Ok(())
        }
        Op::Reacquire { on } => seq.reacquire(&managers[on]).map(drop),
        Op::ReleaseUnassigned(n) => {
            seq.release_unassigned(n);
            Ok(())
        }
        Op::DropExcessUnassigned(keep) => {
            seq.drop_excess_unassigned(keep);
            Ok(())
        }
        Op::ReleaseBeyond(tokens) => {
            seq.release_unassigned_beyond(tokens);
            Ok(())
        }
        Op::PopUnassigned => {
            drop(seq.pop_unassigned());
            Ok(())
        }
    }
}

/// The sequence's blocks are exactly the blocks in use (the other requests
/// left theirs cached), and the layout matches the tokens.
fn check(seq: &RequestSequence<Gpu>, managers: &[BlockManager<Gpu>]) -> Result<(), TestCaseError> {
    prop_assert!(seq.assignments().is_consistent_with(seq.sequence()));
    let in_use: usize = managers
        .iter()
        .map(|m| m.audit().unwrap().in_use_blocks())
        .sum();
    prop_assert_eq!(in_use, seq.held_blocks());
    let held_in = managers
        .iter()
        .filter(|m| m.audit().unwrap().in_use_blocks() > 0)
        .count();
    prop_assert!(held_in <= 1, "blocks of two managers held at once");
    // Every accessor, at any state, without panicking.
    let _ = (
        seq.total_tokens(),
        seq.remaining_tokens(),
        seq.is_complete(),
        seq.pending_blocks(),
        seq.new_tokens_for_prefill(),
        seq.additional_blocks_needed(usize::MAX),
        seq.page_indices(),
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn fuzz_request_sequence_calls(
        prompt in prop_oneof![3 => 1usize..14, 1 => Just(0usize)],
        max_output in prop_oneof![3 => 0usize..12, 1 => Just(usize::MAX)],
        donor_blocks in 0usize..3,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let managers = [manager(12), manager(12), manager_with_block_size(12, BLOCK_SIZE * 2)];
        let tokens: Vec<u32> = (0..prompt as u32).map(|t| t % 3).collect();
        // Another request cached a prefix of the prompt in the first manager.
        let mut donor = RequestSequence::<Gpu>::new(tokens.clone(), 0, BLOCK_SIZE).unwrap();
        if donor.allocate_blocks(donor_blocks.min(donor.num_blocks()), &managers[0]).is_ok() {
            donor.complete_and_register_pending(&managers[0]).unwrap();
        }
        drop(donor);
        let mut seq = RequestSequence::<Gpu>::new(tokens, max_output, BLOCK_SIZE).unwrap();
        prop_assert!(seq.tokens().len() == prompt);
        for op in &ops {
            let before = snapshot(&seq, &managers);
            if let Err(error) = apply(&mut seq, &managers, op) {
                prop_assert!(is_typed(&error), "{op:?}: {error:?}");
                prop_assert_eq!(snapshot(&seq, &managers), before, "{:?} refused with {:?} but changed", op, error);
            }
            check(&seq, &managers)?;
        }
        drop(seq);
        for manager in &managers {
            prop_assert_eq!(manager.audit().unwrap().in_use_blocks(), 0);
        }
    }
}
