//! `MutableBlocks`: a batch of held blocks behaves exactly as the same
//! blocks handled one by one (`allocate_blocks`, `stage`, `register_blocks`,
//! dropping them; `cache_batch` as registering and dropping at once;
//! `evict_batch` as `evict_blocks`; `retain` as filtering them; a kept
//! run's `allocate_onto`, `register_front_onto`, `truncate`, `pop` and
//! `append` as the same on a `Vec` of handles), and a refused registration
//! changes nothing.

use kvbm_blocks::{
    BlockError, BlockManager, DuplicatePolicy, EvictionPolicy, ImmutableBlocks, MutableBlock,
    MutableBlocks, SequenceHash,
};
use proptest::prelude::*;

use crate::{BLOCK_SIZE, Gpu, chain, manager, manager_with};

/// Hash `value` as the `index`-th block of a chain of small values: equal
/// values stand for equal content, so runs collide and deduplicate.
fn hashes(values: &[u8]) -> Vec<SequenceHash> {
    let mut out: Vec<SequenceHash> = Vec::with_capacity(values.len());
    for &value in values {
        let hash = match out.last() {
            Some(parent) => parent.child(u128::from(value)),
            None => SequenceHash::root(u128::from(value)),
        };
        out.push(hash);
    }
    // Collapse the chain onto few keys, so later runs hit earlier ones.
    out.iter()
        .map(|hash| SequenceHash::root(hash.value() % 23))
        .collect()
}

#[derive(Clone, Debug)]
enum Op {
    /// Allocate a batch of this many blocks (refused when too many).
    Allocate(usize),
    /// Register batch `handle` under hashes of these values (`cache`:
    /// and leave the blocks cached, `cache_batch` against registering and
    /// dropping).
    Register {
        handle: usize,
        values: Vec<u8>,
        cache: bool,
    },
    /// Drop batch `handle` unregistered (a failed copy).
    DropHeld(usize),
    /// Split batch `handle` at `at`.
    Split { handle: usize, at: usize },
    /// Keep the blocks of batch `handle` whose flag is set.
    Retain { handle: usize, keep: Vec<bool> },
    /// Evict up to this many cached blocks into a held batch.
    Evict(usize),
    /// Drop registered batch `handle` (its blocks become cached).
    DropRegistered(usize),
    /// Match a run of hashes (revives cached blocks, pins them until the
    /// next op).
    Match(Vec<u8>),
    /// Allocate this many more blocks onto the end of batch `handle`.
    AllocateOnto { handle: usize, count: usize },
    /// Register the first blocks of batch `handle` under hashes of these
    /// values onto a new table (`register_front_onto`).
    RegisterFront { handle: usize, values: Vec<u8> },
    /// Free the blocks of batch `handle` from `len` on, last first.
    Truncate { handle: usize, len: usize },
    /// Pop the last block of batch `handle` as a handle, and drop it.
    Pop(usize),
    /// Move every block of batch `from` onto the end of batch `to`.
    Append { from: usize, to: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..7).prop_map(Op::Allocate),
        6 => (any::<usize>(), prop::collection::vec(0u8..6, 0..7), any::<bool>())
            .prop_map(|(handle, values, cache)| Op::Register { handle, values, cache }),
        2 => any::<usize>().prop_map(Op::DropHeld),
        1 => (any::<usize>(), 0usize..8).prop_map(|(handle, at)| Op::Split { handle, at }),
        1 => (any::<usize>(), prop::collection::vec(any::<bool>(), 0..8))
            .prop_map(|(handle, keep)| Op::Retain { handle, keep }),
        2 => (0usize..5).prop_map(Op::Evict),
        2 => any::<usize>().prop_map(Op::DropRegistered),
        2 => prop::collection::vec(0u8..6, 1..5).prop_map(Op::Match),
        2 => (any::<usize>(), 0usize..4)
            .prop_map(|(handle, count)| Op::AllocateOnto { handle, count }),
        3 => (any::<usize>(), prop::collection::vec(0u8..6, 0..5))
            .prop_map(|(handle, values)| Op::RegisterFront { handle, values }),
        1 => (any::<usize>(), 0usize..6).prop_map(|(handle, len)| Op::Truncate { handle, len }),
        1 => any::<usize>().prop_map(Op::Pop),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(from, to)| Op::Append { from, to }),
    ]
}

/// The same pool driven by batches (`batched`) and by one handle per block
/// (`single`).
struct Pair {
    batched: BlockManager<Gpu>,
    single: BlockManager<Gpu>,
    held_batches: Vec<MutableBlocks<Gpu>>,
    held_singles: Vec<Vec<MutableBlock<Gpu>>>,
    registered: Vec<(ImmutableBlocks<Gpu>, ImmutableBlocks<Gpu>)>,
}

impl Pair {
    fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Allocate(count) => {
                let batch = self.batched.allocate_batch(count);
                let single = self.single.allocate_blocks(count);
                match (batch, single) {
                    (Ok(batch), Ok(single)) => {
                        let ids: Vec<_> = single.iter().map(MutableBlock::block_id).collect();
                        prop_assert_eq!(batch.block_ids(), &ids[..]);
                        self.held_batches.push(batch);
                        self.held_singles.push(single);
                    }
                    (Err(a), Err(b)) => prop_assert_eq!(a, b),
                    (a, b) => prop_assert!(false, "batch {a:?} but single {b:?}"),
                }
            }
            Op::Register {
                handle,
                values,
                cache,
            } => {
                if self.held_batches.is_empty() {
                    return Ok(());
                }
                let at = handle % self.held_batches.len();
                let batch = self.held_batches.remove(at);
                let single = self.held_singles.remove(at);
                let hashes = hashes(&values);
                if hashes.len() != batch.len() {
                    // Refused, handed back, nothing changed.
                    let before = self.batched.metrics();
                    let rejected = match cache {
                        true => self.batched.cache_batch(batch, &hashes).unwrap_err(),
                        false => self.batched.register_batch(batch, &hashes).unwrap_err(),
                    };
                    prop_assert_eq!(
                        rejected.error(),
                        &BlockError::HashCountMismatch {
                            blocks: single.len(),
                            hashes: hashes.len()
                        }
                    );
                    prop_assert_eq!(self.batched.metrics(), before);
                    self.held_batches.insert(at, rejected.into_inner());
                    self.held_singles.insert(at, single);
                    return Ok(());
                }
                let staged = (single.into_iter().zip(&hashes))
                    .map(|(block, &hash)| block.stage(hash, BLOCK_SIZE).unwrap())
                    .collect();
                let expected = self.single.register_blocks(staged).unwrap();
                if cache {
                    let cached = self.batched.cache_batch(batch, &hashes).unwrap();
                    prop_assert_eq!(cached, expected.len());
                } else {
                    let registered = self.batched.register_batch(batch, &hashes).unwrap();
                    prop_assert_eq!(&registered[..], &expected[..]);
                    self.registered.push((registered, expected));
                }
            }
            Op::DropHeld(handle) => {
                if !self.held_batches.is_empty() {
                    let at = handle % self.held_batches.len();
                    drop(self.held_batches.remove(at));
                    drop(self.held_singles.remove(at));
                }
            }
            Op::Split { handle, at } => {
                if !self.held_batches.is_empty() {
                    let index = handle % self.held_batches.len();
                    let tail = self.held_batches[index].split_off(at);
                    let single = &mut self.held_singles[index];
                    let tail_single = single.split_off(at.min(single.len()));
                    self.held_batches.push(tail);
                    self.held_singles.push(tail_single);
                }
            }
            Op::Retain { handle, keep } => {
                if !self.held_batches.is_empty() {
                    let index = handle % self.held_batches.len();
                    self.held_batches[index].retain(&keep);
                    let single = std::mem::take(&mut self.held_singles[index]);
                    self.held_singles[index] = (single.into_iter().enumerate())
                        .filter_map(|(i, block)| {
                            keep.get(i).copied().unwrap_or(true).then_some(block)
                        })
                        .collect();
                    let ids: Vec<_> = self.held_singles[index]
                        .iter()
                        .map(MutableBlock::block_id)
                        .collect();
                    prop_assert_eq!(self.held_batches[index].block_ids(), &ids[..]);
                }
            }
            Op::Evict(count) => {
                let (hashes, batch) = self.batched.evict_batch(count);
                let (expected, single): (Vec<_>, Vec<_>) =
                    self.single.evict_blocks(count).into_iter().unzip();
                prop_assert_eq!(hashes, expected);
                let ids: Vec<_> = single.iter().map(MutableBlock::block_id).collect();
                prop_assert_eq!(batch.block_ids(), &ids[..]);
                self.held_batches.push(batch);
                self.held_singles.push(single);
            }
            Op::DropRegistered(handle) => {
                if !self.registered.is_empty() {
                    let (a, b) = self.registered.remove(handle % self.registered.len());
                    drop(a);
                    drop(b);
                }
            }
            Op::Match(values) => {
                let hashes = hashes(&values);
                let a = self.batched.match_blocks(&hashes);
                let b = self.single.match_blocks(&hashes);
                prop_assert_eq!(&a[..], &b[..]);
            }
            Op::AllocateOnto { handle, count } => {
                if self.held_batches.is_empty() {
                    return Ok(());
                }
                let at = handle % self.held_batches.len();
                let before = self.held_batches[at].block_ids().to_vec();
                let batch = self
                    .batched
                    .allocate_onto(&mut self.held_batches[at], count);
                let single = self.single.allocate_blocks(count);
                match (batch, single) {
                    (Ok(()), Ok(single)) => self.held_singles[at].extend(single),
                    (Err(a), Err(b)) => {
                        prop_assert_eq!(a, b);
                        prop_assert_eq!(self.held_batches[at].block_ids(), &before[..]);
                    }
                    (a, b) => prop_assert!(false, "onto {a:?} but single {b:?}"),
                }
                self.same_held(at)?;
            }
            Op::RegisterFront { handle, values } => {
                if self.held_batches.is_empty() {
                    return Ok(());
                }
                let at = handle % self.held_batches.len();
                let hashes = hashes(&values);
                let mut table = ImmutableBlocks::new();
                let batch = &mut self.held_batches[at];
                let result = self
                    .batched
                    .register_front_onto(&mut table, batch, &hashes, &[], 0);
                let single = &mut self.held_singles[at];
                if hashes.len() > single.len() {
                    prop_assert_eq!(
                        result,
                        Err(BlockError::InsufficientBlocks {
                            requested: hashes.len(),
                            available: single.len()
                        })
                    );
                    return self.same_held(at);
                }
                prop_assert_eq!(result, Ok(hashes.len()));
                let staged = (single.drain(..hashes.len()).zip(&hashes))
                    .map(|(block, &hash)| block.stage(hash, BLOCK_SIZE).unwrap())
                    .collect();
                let expected = self.single.register_blocks(staged).unwrap();
                prop_assert_eq!(&table[..], &expected[..]);
                self.registered.push((table, expected));
                self.same_held(at)?;
            }
            Op::Truncate { handle, len } => {
                if self.held_batches.is_empty() {
                    return Ok(());
                }
                let at = handle % self.held_batches.len();
                self.held_batches[at].truncate(len);
                // Last first, as the batch frees them.
                let single = &mut self.held_singles[at];
                while single.len() > len {
                    drop(single.pop());
                }
                self.same_held(at)?;
            }
            Op::Pop(handle) => {
                if self.held_batches.is_empty() {
                    return Ok(());
                }
                let at = handle % self.held_batches.len();
                let popped = self.held_batches[at].pop().map(|block| block.block_id());
                let expected = self.held_singles[at].pop().map(|block| block.block_id());
                prop_assert_eq!(popped, expected);
                self.same_held(at)?;
            }
            Op::Append { from, to } => {
                let n = self.held_batches.len();
                if n < 2 || from % n == to % n {
                    return Ok(());
                }
                let (from, to) = (from % n, to % n);
                let mut moved = std::mem::take(&mut self.held_batches[from]);
                self.held_batches[to].append(&mut moved).unwrap();
                prop_assert!(moved.is_empty());
                self.held_batches[from] = moved;
                let single = std::mem::take(&mut self.held_singles[from]);
                self.held_singles[to].extend(single);
                self.same_held(to)?;
            }
        }
        Ok(())
    }

    /// Batch `at` holds what its single handles hold, in order.
    fn same_held(&self, at: usize) -> Result<(), TestCaseError> {
        let ids: Vec<_> = (self.held_singles[at].iter())
            .map(MutableBlock::block_id)
            .collect();
        prop_assert_eq!(self.held_batches[at].block_ids(), &ids[..]);
        Ok(())
    }

    fn check(&self) -> Result<(), TestCaseError> {
        prop_assert_eq!(self.batched.metrics(), self.single.metrics());
        let audit = self
            .batched
            .audit()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let expected = self
            .single
            .audit()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(audit, expected);
        for value in 0..23u128 {
            let hash = [SequenceHash::root(value)];
            prop_assert_eq!(
                self.batched.scan_matches(&hash),
                self.single.scan_matches(&hash)
            );
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::fuzz::cases()))]

    /// Any sequence of batch allocations (also onto a kept run),
    /// registrations (some refused; also from a run's front onto a table),
    /// splits, truncations, pops, appends and drops leaves the pool, its
    /// events and every later allocation exactly as the same blocks handled
    /// one by one would.
    #[test]
    fn fuzz_a_batch_is_its_blocks_one_by_one(
        ops in prop::collection::vec(op(), 1..40),
        policy in prop_oneof![
            Just(EvictionPolicy::Lru),
            Just(EvictionPolicy::MultiLevelLru),
            Just(EvictionPolicy::Lineage),
        ],
        allow_duplicates in any::<bool>(),
    ) {
        let duplicates = if allow_duplicates {
            DuplicatePolicy::Allow
        } else {
            DuplicatePolicy::Deduplicate
        };
        let build = || {
            BlockManager::<Gpu>::builder()
                .block_count(8)
                .block_size(BLOCK_SIZE)
                .eviction(policy)
                .duplicates(duplicates)
                .build()
                .unwrap()
        };
        let mut pair = Pair {
            batched: build(),
            single: build(),
            held_batches: Vec::new(),
            held_singles: Vec::new(),
            registered: Vec::new(),
        };
        let events = (pair.batched.subscribe_events(1 << 16), pair.single.subscribe_events(1 << 16));
        for op in ops {
            pair.apply(op)?;
            pair.batched.flush_events();
            pair.single.flush_events();
            pair.check()?;
        }
        prop_assert_eq!(events.0.drain(), events.1.drain());
        drop(pair.held_batches);
        drop(pair.held_singles);
        drop(pair.registered);
        prop_assert_eq!(pair.batched.metrics(), pair.single.metrics());
    }
}

#[test]
fn a_batch_of_another_manager_is_handed_back_unregistered() {
    let ours = manager(4);
    let theirs = manager(4);
    let batch = theirs.allocate_batch(2).unwrap();
    assert!(!batch.belongs_to(&ours) && batch.belongs_to(&theirs));
    let before = (ours.metrics(), theirs.metrics());
    let rejected = ours.register_batch(batch, &chain(1, 2)).unwrap_err();
    assert_eq!(rejected.error(), &BlockError::ForeignManager);
    assert_eq!((ours.metrics(), theirs.metrics()), before);
    // Still theirs, and still registrable there.
    let batch = rejected.into_inner();
    assert_eq!(batch.len(), 2);
    assert_eq!(theirs.register_batch(batch, &chain(1, 2)).unwrap().len(), 2);
}

#[test]
fn an_empty_batch_belongs_anywhere_and_registers_nothing() {
    let pool = manager(2);
    let empty = MutableBlocks::<Gpu>::new();
    assert!(empty.is_empty() && empty.belongs_to(&pool));
    assert!(pool.register_batch(empty, &[]).unwrap().is_empty());
    let none = pool.allocate_batch(0).unwrap();
    assert!(none.is_empty());
    assert_eq!(pool.metrics().free_blocks, 2);
    // Too many: refused, nothing taken.
    assert_eq!(
        pool.allocate_batch(3).unwrap_err(),
        BlockError::ExceedsCapacity {
            requested: 3,
            total: 2
        }
    );
}

#[test]
fn a_split_batch_frees_and_registers_each_part_on_its_own() {
    let pool = manager_with(6, EvictionPolicy::Lru);
    let mut head = pool.allocate_batch(5).unwrap();
    let ids = head.block_ids().to_vec();
    let tail = head.split_off(2);
    assert_eq!(head.block_ids(), &ids[..2]);
    assert_eq!(tail.block_ids(), &ids[2..]);
    // Past the end: an empty part, the rest untouched.
    let mut tail = tail;
    assert!(tail.split_off(9).is_empty());
    assert_eq!(tail.len(), 3);
    drop(tail); // a failed copy: three blocks back
    assert_eq!(pool.metrics().free_blocks, 4);
    let registered = pool.register_batch(head, &chain(7, 2)).unwrap();
    assert_eq!(registered.block_ids().collect::<Vec<_>>(), ids[..2]);
    assert!(pool.audit().is_ok());
}

#[test]
fn allocate_onto_extends_a_run_and_a_refusal_changes_nothing() {
    let (gpu, other) = (manager(4), manager(4));
    let mut run = MutableBlocks::new();
    assert_eq!(run.block_size(), None);
    gpu.allocate_onto(&mut run, 2).unwrap();
    gpu.allocate_onto(&mut run, 1).unwrap();
    assert_eq!((run.len(), run.block_size()), (3, Some(BLOCK_SIZE)));
    let before = run.block_ids().to_vec();
    assert_eq!(
        gpu.allocate_onto(&mut run, 2).unwrap_err(),
        BlockError::InsufficientBlocks {
            requested: 2,
            available: 1
        }
    );
    assert_eq!(
        other.allocate_onto(&mut run, 1).unwrap_err(),
        BlockError::ForeignManager
    );
    assert_eq!(run.block_ids(), before);
    assert_eq!((gpu.available_blocks(), other.available_blocks()), (1, 4));
    assert_eq!(crate::audit(&gpu).held_blocks, 3);
    drop(run);
    assert_eq!(gpu.available_blocks(), 4);
}

#[test]
fn a_run_trades_blocks_with_single_handles_and_other_runs() {
    let (gpu, other) = (manager(6), manager(2));
    let mut run = MutableBlocks::new();
    // An empty run takes any manager's blocks.
    for block in gpu.allocate_blocks(3).unwrap() {
        run.push(block).unwrap();
    }
    let ids = run.block_ids().to_vec();
    let foreign = other.allocate_blocks(1).unwrap().pop().unwrap();
    let foreign_id = foreign.block_id();
    let rejected = run.push(foreign).unwrap_err();
    let (error, foreign) = rejected.into_parts();
    assert_eq!(
        (error, foreign.block_id()),
        (BlockError::ForeignManager, foreign_id)
    );
    // Popped last first, as a handle that frees its block when dropped.
    let last: MutableBlock<Gpu> = run.pop().unwrap();
    assert_eq!(last.block_id(), ids[2]);
    drop(last);
    assert_eq!(gpu.available_blocks(), 4);
    // Appending moves every block; another manager's run is refused whole.
    let mut more = gpu.allocate_batch(2).unwrap();
    let more_ids = more.block_ids().to_vec();
    run.append(&mut more).unwrap();
    assert!(more.is_empty());
    assert_eq!(run.block_ids(), [&ids[..2], &more_ids[..]].concat());
    let mut theirs = other.allocate_batch(1).unwrap();
    assert_eq!(
        run.append(&mut theirs).unwrap_err(),
        BlockError::ForeignManager
    );
    assert_eq!((run.len(), theirs.len()), (4, 1));
    // Truncating frees the tail.
    run.truncate(1);
    assert_eq!(run.block_ids(), &ids[..1]);
    assert_eq!(gpu.available_blocks(), 5);
    run.truncate(5);
    assert_eq!(run.len(), 1);
    drop((run, foreign, theirs));
    assert_eq!((gpu.available_blocks(), other.available_blocks()), (6, 2));
}

#[test]
fn register_front_onto_refused_changes_nothing() {
    let (gpu, other) = (manager(8), manager(8));
    let hashes = chain(1, 3);
    let mut run = MutableBlocks::new();
    gpu.allocate_onto(&mut run, 2).unwrap();
    let before = run.block_ids().to_vec();
    let mut table = ImmutableBlocks::new();
    let tokens: Vec<u32> = (0..(2 * BLOCK_SIZE) as u32).collect();
    // More hashes than blocks.
    assert_eq!(
        gpu.register_front_onto(&mut table, &mut run, &hashes, &[], 0)
            .unwrap_err(),
        BlockError::InsufficientBlocks {
            requested: 3,
            available: 2
        }
    );
    // Tokens for another count of blocks.
    assert!(matches!(
        gpu.register_front_onto(&mut table, &mut run, &hashes[..2], &tokens[1..], 0),
        Err(BlockError::TokenCountMismatch { .. })
    ));
    // Another manager's run, or a table of another manager.
    assert_eq!(
        other
            .register_front_onto(&mut table, &mut run, &hashes[..2], &[], 0)
            .unwrap_err(),
        BlockError::ForeignManager
    );
    let mut foreign = crate::register(&other, &chain(9, 1));
    assert_eq!(
        gpu.register_front_onto(&mut foreign, &mut run, &hashes[..2], &[], 0)
            .unwrap_err(),
        BlockError::ForeignManager
    );
    assert_eq!(
        (run.block_ids(), table.len(), foreign.len()),
        (&before[..], 0, 1)
    );
    let audit = crate::audit(&gpu);
    assert_eq!((audit.held_blocks, audit.active_blocks), (2, 0));
    assert!(gpu.match_blocks(&hashes).is_empty());
    // Accepted: both registered onto the table, the run emptied.
    assert_eq!(
        gpu.register_front_onto(&mut table, &mut run, &hashes[..2], &tokens, 0),
        Ok(2)
    );
    assert_eq!(
        (run.len(), table.block_ids().collect::<Vec<_>>()),
        (0, before)
    );
}
