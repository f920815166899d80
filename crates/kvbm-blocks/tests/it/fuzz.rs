//! API fuzzer: arbitrary sequences of public operations over two managers
//! (any eviction policy, tiny to small pools), with extreme counts, indices
//! and token counts, and every handle offered to the *other* manager
//! wherever the API takes one.
//!
//! After every operation: nothing panicked, refusals are typed and hand the
//! handle back (or change nothing), both audits pass, and each manager's
//! blocks in use are exactly the distinct blocks the test's handles hold.
//! The reference model of single-manager behaviour is `model.rs`; this is
//! about the edges. `cargo xtask fuzz` runs it long (`KVBM_FUZZ_CASES`).

use std::collections::HashSet;

use kvbm_blocks::{
    BlockError, BlockId, BlockManager, CompleteBlock, EvictionPolicy, ImmutableBlocks,
    MutableBlock, SequenceHash, WeakBlock,
};
use proptest::prelude::*;

use crate::{BLOCK_SIZE, Gpu};

/// Cases per fuzz test: `KVBM_FUZZ_CASES` (as `cargo xtask fuzz --cases N`
/// sets it), else a CI-sized default.
pub(crate) fn cases() -> u32 {
    std::env::var("KVBM_FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(1024)
}

fn extreme_usize() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 0usize..6,
        1 => Just(BLOCK_SIZE + 1),
        1 => Just(usize::MAX),
        1 => any::<usize>(),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Allocate {
        on: usize,
        count: usize,
    },
    Stage {
        handle: usize,
        value: u64,
        tokens: usize,
    },
    Register {
        handle: usize,
        into: usize,
    },
    RegisterAll {
        into: usize,
    },
    Match {
        on: usize,
        first: u64,
        len: usize,
    },
    Append {
        to: usize,
        from: usize,
    },
    Push {
        batch: usize,
        from: usize,
        index: usize,
    },
    Truncate {
        batch: usize,
        len: usize,
    },
    SplitOff {
        batch: usize,
        at: usize,
    },
    Downgrade {
        batch: usize,
        index: usize,
    },
    Upgrade(usize),
    Reset(usize),
    Drop {
        kind: u8,
        index: usize,
    },
    EvictHeld {
        on: usize,
        count: usize,
    },
    ClearCache {
        on: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let on = || 0usize..2;
    prop_oneof![
        4 => (on(), extreme_usize()).prop_map(|(on, count)| Op::Allocate { on, count }),
        4 => (any::<usize>(), 0u64..10, prop_oneof![4 => Just(BLOCK_SIZE), 1 => extreme_usize()])
            .prop_map(|(handle, value, tokens)| Op::Stage { handle, value, tokens }),
        3 => (any::<usize>(), on()).prop_map(|(handle, into)| Op::Register { handle, into }),
        1 => on().prop_map(|into| Op::RegisterAll { into }),
        3 => (on(), 0u64..10, extreme_usize()).prop_map(|(on, first, len)| Op::Match { on, first, len }),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(to, from)| Op::Append { to, from }),
        1 => (any::<usize>(), any::<usize>(), extreme_usize())
            .prop_map(|(batch, from, index)| Op::Push { batch, from, index }),
        1 => (any::<usize>(), extreme_usize()).prop_map(|(batch, len)| Op::Truncate { batch, len }),
        1 => (any::<usize>(), extreme_usize()).prop_map(|(batch, at)| Op::SplitOff { batch, at }),
        1 => (any::<usize>(), extreme_usize()).prop_map(|(batch, index)| Op::Downgrade { batch, index }),
        1 => any::<usize>().prop_map(Op::Upgrade),
        1 => any::<usize>().prop_map(Op::Reset),
        3 => (any::<u8>(), any::<usize>()).prop_map(|(kind, index)| Op::Drop { kind, index }),
        1 => on().prop_map(|on| Op::ClearCache { on }),
        1 => (on(), extreme_usize()).prop_map(|(on, count)| Op::EvictHeld { on, count }),
    ]
}

/// A chain of hashes whose values start at `first` (values collide across
/// runs on purpose: registrations deduplicate).
fn hashes(first: u64, len: usize) -> Vec<SequenceHash> {
    let mut out: Vec<SequenceHash> = Vec::new();
    for value in first..first.saturating_add(len.min(12) as u64) {
        out.push(match out.last() {
            None => SequenceHash::root(value.into()),
            Some(parent) => parent.child(value.into()),
        });
    }
    out
}

/// Everything the test holds.
#[derive(Default)]
struct Held {
    mutable: Vec<MutableBlock<Gpu>>,
    complete: Vec<CompleteBlock<Gpu>>,
    batches: Vec<ImmutableBlocks<Gpu>>,
    weak: Vec<WeakBlock<Gpu>>,
}

/// Picks an element index, if any.
fn pick<T>(items: &[T], index: usize) -> Option<usize> {
    (!items.is_empty()).then(|| index % items.len())
}

fn apply(managers: &[BlockManager<Gpu>; 2], held: &mut Held, op: Op) -> Result<(), TestCaseError> {
    match op {
        Op::Allocate { on, count } => {
            let before = managers[on].audit().unwrap();
            match managers[on].allocate_blocks(count) {
                Ok(blocks) => {
                    prop_assert_eq!(blocks.len(), count);
                    held.mutable.extend(blocks);
                }
                Err(error) => {
                    prop_assert!(
                        matches!(
                            error,
                            BlockError::InsufficientBlocks { .. }
                                | BlockError::ExceedsCapacity { .. }
                        ),
                        "{error:?}"
                    );
                    prop_assert_eq!(managers[on].audit().unwrap(), before);
                }
            }
        }
        Op::Stage {
            handle,
            value,
            tokens,
        } => {
            if let Some(i) = pick(&held.mutable, handle) {
                let block = held.mutable.swap_remove(i);
                let id = block.block_id();
                match block.stage(SequenceHash::root(value.into()), tokens) {
                    Ok(complete) => held.complete.push(complete),
                    Err(rejected) => {
                        let (error, block) = rejected.into_parts();
                        prop_assert!(
                            matches!(error, BlockError::TokenCountMismatch { .. }),
                            "{error:?}"
                        );
                        prop_assert_eq!(block.block_id(), id);
                        held.mutable.push(block);
                    }
                }
            }
        }
        Op::Register { handle, into } => {
            if let Some(i) = pick(&held.complete, handle) {
                let block = held.complete.swap_remove(i);
                let owned = block.belongs_to(&managers[into]);
                match managers[into].register_block(block) {
                    Ok(registered) => {
                        prop_assert!(owned);
                        let mut batch = ImmutableBlocks::new();
                        prop_assert!(batch.push(registered).is_ok());
                        held.batches.push(batch);
                    }
                    Err(rejected) => {
                        prop_assert!(!owned);
                        let (error, block) = rejected.into_parts();
                        prop_assert_eq!(error, BlockError::ForeignManager);
                        held.complete.push(block);
                    }
                }
            }
        }
        Op::RegisterAll { into } => {
            let blocks = std::mem::take(&mut held.complete);
            let all_owned = blocks.iter().all(|b| b.belongs_to(&managers[into]));
            match managers[into].register_blocks(blocks) {
                Ok(batch) => {
                    prop_assert!(all_owned);
                    held.batches.push(batch);
                }
                Err(rejected) => {
                    prop_assert!(!all_owned);
                    let (error, blocks) = rejected.into_parts();
                    prop_assert_eq!(error, BlockError::ForeignManager);
                    held.complete = blocks;
                }
            }
        }
        Op::Match { on, first, len } => {
            let matched = managers[on].match_blocks(&hashes(first, len));
            prop_assert!(matched.belongs_to(&managers[on]));
            held.batches.push(matched);
        }
        Op::Append { to, from } => {
            if let (Some(to), Some(from)) = (pick(&held.batches, to), pick(&held.batches, from))
                && to != from
            {
                let other = held.batches.swap_remove(from);
                let to = if to == held.batches.len() { from } else { to };
                let len_before = held.batches[to].len();
                let other_len = other.len();
                if let Err(rejected) = held.batches[to].append(other) {
                    let (error, other) = rejected.into_parts();
                    prop_assert_eq!(error, BlockError::ForeignManager);
                    prop_assert_eq!(held.batches[to].len(), len_before);
                    prop_assert_eq!(other.len(), other_len);
                    held.batches.push(other);
                } else {
                    prop_assert_eq!(held.batches[to].len(), len_before + other_len);
                }
            }
        }
        Op::Push { batch, from, index } => {
            if let (Some(batch), Some(from)) =
                (pick(&held.batches, batch), pick(&held.batches, from))
                && let Some(block) = held.batches[from].get(index)
                && let Err(rejected) = held.batches[batch].push(block)
            {
                prop_assert_eq!(rejected.into_parts().0, BlockError::ForeignManager);
            }
        }
        Op::Truncate { batch, len } => {
            if let Some(i) = pick(&held.batches, batch) {
                let before = held.batches[i].len();
                held.batches[i].truncate(len);
                prop_assert_eq!(held.batches[i].len(), before.min(len));
            }
        }
        Op::SplitOff { batch, at } => {
            if let Some(i) = pick(&held.batches, batch) {
                let before = held.batches[i].len();
                let tail = held.batches[i].split_off(at);
                prop_assert_eq!(held.batches[i].len() + tail.len(), before);
                held.batches.push(tail);
            }
        }
        Op::Downgrade { batch, index } => {
            if let Some(i) = pick(&held.batches, batch) {
                let weak = held.batches[i].downgrade(index);
                prop_assert_eq!(weak.is_some(), index < held.batches[i].len());
                held.weak.extend(weak);
            }
        }
        Op::Upgrade(index) => {
            if let Some(i) = pick(&held.weak, index)
                && let Some(block) = held.weak[i].upgrade()
            {
                let mut batch = ImmutableBlocks::new();
                prop_assert!(batch.push(block).is_ok());
                held.batches.push(batch);
            }
        }
        Op::Reset(index) => {
            if let Some(i) = pick(&held.complete, index) {
                let block = held.complete.swap_remove(i);
                held.mutable.push(block.reset());
            }
        }
        Op::Drop { kind, index } => match kind % 4 {
            0 => drop(pick(&held.mutable, index).map(|i| held.mutable.swap_remove(i))),
            1 => drop(pick(&held.complete, index).map(|i| held.complete.swap_remove(i))),
            2 => drop(pick(&held.batches, index).map(|i| held.batches.swap_remove(i))),
            _ => drop(pick(&held.weak, index).map(|i| held.weak.swap_remove(i))),
        },
        Op::ClearCache { on } => {
            managers[on].clear_cache();
        }
        Op::EvictHeld { on, count } => {
            let before = managers[on].metrics();
            let evicted = managers[on].evict_blocks(count);
            prop_assert_eq!(evicted.len(), count.min(before.inactive_blocks));
            let after = managers[on].metrics();
            prop_assert_eq!(
                after.inactive_blocks,
                before.inactive_blocks - evicted.len()
            );
            prop_assert_eq!(after.free_blocks, before.free_blocks, "held, not freed");
            for (hash, block) in evicted {
                prop_assert!(
                    managers[on].scan_matches(&[hash]) == [false],
                    "no longer matchable"
                );
                held.mutable.push(block);
            }
        }
    }
    check(managers, held)
}

/// Both audits pass, and the blocks in use are the distinct blocks held.
fn check(managers: &[BlockManager<Gpu>; 2], held: &Held) -> Result<(), TestCaseError> {
    for manager in managers {
        let audit = manager
            .audit()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut ids: HashSet<BlockId> = HashSet::new();
        let mut exclusive = 0;
        for block in held.mutable.iter().filter(|b| b.belongs_to(manager)) {
            prop_assert!(
                ids.insert(block.block_id()),
                "{} held twice",
                block.block_id()
            );
            exclusive += 1;
        }
        for block in held.complete.iter().filter(|b| b.belongs_to(manager)) {
            prop_assert!(
                ids.insert(block.block_id()),
                "{} held twice",
                block.block_id()
            );
            exclusive += 1;
        }
        let mut shared = HashSet::new();
        for batch in held
            .batches
            .iter()
            .filter(|b| !b.is_empty() && b.belongs_to(manager))
        {
            shared.extend(batch.block_ids());
        }
        prop_assert!(
            shared.is_disjoint(&ids),
            "a registered block is also held mutable"
        );
        prop_assert_eq!(audit.in_use_blocks(), exclusive + shared.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn fuzz_two_managers_under_arbitrary_calls(
        sizes in (1usize..8, 1usize..8),
        policies in (0u8..3, 0u8..3),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let policy = |p: u8| match p {
            0 => EvictionPolicy::Lru,
            1 => EvictionPolicy::MultiLevelLru,
            _ => EvictionPolicy::Lineage,
        };
        let managers = [
            crate::manager_with(sizes.0, policy(policies.0)),
            crate::manager_with(sizes.1, policy(policies.1)),
        ];
        let mut held = Held::default();
        for op in ops {
            apply(&managers, &mut held, op)?;
        }
        drop(held);
        for manager in &managers {
            prop_assert_eq!(manager.audit().unwrap().in_use_blocks(), 0);
        }
    }

    /// Builder values at and past every edge: a typed error or a pool.
    #[test]
    fn fuzz_builder_edges(count in extreme_usize(), size in extreme_usize()) {
        let count = count.min(1 << 16); // larger pools are the OutOfMemory test's
        match BlockManager::<Gpu>::builder().block_count(count).block_size(size).build() {
            Ok(manager) => prop_assert_eq!(manager.total_blocks(), count),
            Err(error) => prop_assert!(
                matches!(error, BlockError::ZeroBlockCount | BlockError::ZeroBlockSize),
                "{error:?}"
            ),
        }
    }
}
