//! Model-based test: random operation sequences run against the real pool and
//! a plain reference model of it (Vecs and a HashMap, LRU order, exact block
//! ids). After every step the pool's audit must match the model, and no block
//! may be held by two owners. The other eviction policies run the same
//! sequences against the conservation checks alone (their victim choice is
//! theirs).

use std::collections::HashMap;

use kvbm_blocks::{
    BlockError, CompleteBlock, EvictionPolicy, ImmutableBlocks, MutableBlock, SequenceHash,
    WeakBlock,
};
use proptest::prelude::*;

use crate::{BLOCK_SIZE, Gpu, manager_with};

/// Hash values chain in runs of four (0 <- 1 <- 2 <- 3, 4 <- 5 ...), so
/// lineage sees parents while the registry key stays the plain value.
fn hash_of(value: u64) -> SequenceHash {
    let value = u128::from(value);
    match value % 4 {
        0 => SequenceHash::root(value),
        position => SequenceHash::from_parts(value, Some(value - 1), position as u32).unwrap(),
    }
}

#[derive(Clone, Debug)]
enum Op {
    Allocate(usize),
    Stage {
        handle: usize,
        value: u64,
        wrong_size: bool,
    },
    Reset(usize),
    Register(usize),
    RegisterAll,
    Match {
        first: u64,
        len: u64,
    },
    Drop(usize),
    Clone(usize),
    Truncate {
        handle: usize,
        len: usize,
    },
    Downgrade {
        handle: usize,
        index: usize,
    },
    Upgrade(usize),
    ClearCache,
    /// `store_blocks` of a run of hashes (pinned until dropped).
    Store {
        first: u64,
        len: u64,
    },
    /// `cache_blocks` of a run of hashes (left cached).
    Cache {
        first: u64,
        len: u64,
    },
    /// `registered_prefix` of a run of hashes (changes nothing).
    Prefix {
        first: u64,
        len: u64,
    },
    /// `touch_prefix` of a run of hashes (as matching it and dropping the
    /// match).
    Touch {
        first: u64,
        len: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..8).prop_map(Op::Allocate),
        4 => (any::<usize>(), 0u64..12, prop::bool::weighted(0.1))
            .prop_map(|(handle, value, wrong_size)| Op::Stage { handle, value, wrong_size }),
        1 => any::<usize>().prop_map(Op::Reset),
        3 => any::<usize>().prop_map(Op::Register),
        1 => Just(Op::RegisterAll),
        3 => (0u64..12, 1u64..5).prop_map(|(first, len)| Op::Match { first, len }),
        4 => any::<usize>().prop_map(Op::Drop),
        1 => any::<usize>().prop_map(Op::Clone),
        1 => (any::<usize>(), 0usize..4).prop_map(|(handle, len)| Op::Truncate { handle, len }),
        1 => (any::<usize>(), 0usize..4).prop_map(|(handle, index)| Op::Downgrade { handle, index }),
        1 => any::<usize>().prop_map(Op::Upgrade),
        1 => Just(Op::ClearCache),
        2 => (0u64..12, 0u64..5).prop_map(|(first, len)| Op::Store { first, len }),
        2 => (0u64..12, 0u64..5).prop_map(|(first, len)| Op::Cache { first, len }),
        1 => (0u64..12, 0u64..5).prop_map(|(first, len)| Op::Prefix { first, len }),
        2 => (0u64..12, 0u64..5).prop_map(|(first, len)| Op::Touch { first, len }),
    ]
}

enum Real {
    Mutable(MutableBlock<Gpu>),
    Complete(CompleteBlock<Gpu>),
    Registered(ImmutableBlocks<Gpu>),
    Weak(WeakBlock<Gpu>),
}

/// The reference: the pool written the obvious way.
#[derive(Debug, Default)]
struct Model {
    free: Vec<u32>,
    slots: Vec<Slot>,
    registry: HashMap<u64, u32>,
    /// Cached blocks, oldest first.
    lru: Vec<u32>,
    handles: Vec<Handle>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    Held,
    Registered,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    state: State,
    refs: u32,
    value: u64,
    epoch: u32,
}

#[derive(Debug, Clone)]
enum Handle {
    Mutable(u32),
    Complete(u32, u64),
    Registered(Vec<u32>),
    Weak { id: u32, epoch: u32, value: u64 },
}

impl Model {
    fn new(total: usize) -> Self {
        let slot = Slot {
            state: State::Free,
            refs: 0,
            value: 0,
            epoch: 0,
        };
        Self {
            free: (0..total as u32).rev().collect(),
            slots: vec![slot; total],
            ..Self::default()
        }
    }

    fn allocate(&mut self, n: usize) -> Result<Vec<u32>, BlockError> {
        let total = self.slots.len();
        if n > total {
            return Err(BlockError::ExceedsCapacity {
                requested: n,
                total,
            });
        }
        let available = self.free.len() + self.lru.len();
        if n > available {
            return Err(BlockError::InsufficientBlocks {
                requested: n,
                available,
            });
        }
        let mut ids = Vec::new();
        while ids.len() < n {
            let id = match self.free.pop() {
                Some(id) => id,
                None => self.evict().expect("counted as available"),
            };
            self.slots[id as usize].state = State::Held;
            ids.push(id);
        }
        Ok(ids)
    }

    fn evict(&mut self) -> Option<u32> {
        if self.lru.is_empty() {
            return None;
        }
        let id = self.lru.remove(0);
        let slot = &mut self.slots[id as usize];
        self.registry.remove(&slot.value);
        slot.state = State::Free;
        slot.epoch += 1;
        Some(id)
    }

    fn free_held(&mut self, id: u32) {
        self.slots[id as usize].state = State::Free;
        self.free.push(id);
    }

    fn acquire(&mut self, id: u32) {
        if self.slots[id as usize].refs == 0 {
            self.lru.retain(|&cached| cached != id);
        }
        self.slots[id as usize].refs += 1;
    }

    fn release(&mut self, id: u32) {
        let slot = &mut self.slots[id as usize];
        slot.refs -= 1;
        if slot.refs == 0 {
            self.lru.push(id);
        }
    }

    fn register(&mut self, id: u32, value: u64) -> u32 {
        if let Some(&existing) = self.registry.get(&value) {
            self.free_held(id);
            self.acquire(existing);
            return existing;
        }
        self.registry.insert(value, id);
        let slot = &mut self.slots[id as usize];
        (slot.state, slot.refs, slot.value) = (State::Registered, 1, value);
        id
    }

    fn count(&self, state: State, pinned: bool) -> usize {
        self.slots
            .iter()
            .filter(|s| s.state == state && (s.refs > 0) == pinned)
            .count()
    }
}

/// Runs `ops` on a pool of `blocks` with `policy`; the model checks exact
/// behaviour only under LRU.
fn run(blocks: usize, policy: EvictionPolicy, ops: &[Op]) -> Result<(), TestCaseError> {
    let manager = manager_with(blocks, policy);
    let mut real: Vec<Real> = Vec::new();
    let mut model = (policy == EvictionPolicy::Lru).then(|| Model::new(blocks));

    for op in ops {
        let pick = |handle: usize, len: usize| (len > 0).then(|| handle % len);
        match *op {
            Op::Allocate(n) => {
                let got = manager.allocate_blocks(n);
                if let Some(model) = &mut model {
                    let expected = model.allocate(n);
                    let ids = got
                        .as_ref()
                        .map(|b| b.iter().map(|b| b.block_id().get()).collect::<Vec<_>>())
                        .map_err(Clone::clone);
                    prop_assert_eq!(&ids, &expected);
                    for id in expected.into_iter().flatten() {
                        model.handles.push(Handle::Mutable(id));
                    }
                }
                real.extend(got.into_iter().flatten().map(Real::Mutable));
            }
            Op::Stage {
                handle,
                value,
                wrong_size,
            } => {
                let Some(i) = pick(handle, real.len()) else {
                    continue;
                };
                let Real::Mutable(_) = real[i] else { continue };
                let Real::Mutable(block) = real.swap_remove(i) else {
                    unreachable!()
                };
                let size = if wrong_size {
                    BLOCK_SIZE + 1
                } else {
                    BLOCK_SIZE
                };
                let staged = block.stage(hash_of(value), size);
                prop_assert_eq!(staged.is_err(), wrong_size);
                let next = match staged {
                    Ok(complete) => Real::Complete(complete),
                    Err(rejected) => Real::Mutable(rejected.into_inner()),
                };
                real.push(next);
                if let Some(model) = &mut model {
                    let Handle::Mutable(id) = model.handles.swap_remove(i) else {
                        unreachable!()
                    };
                    model.handles.push(if wrong_size {
                        Handle::Mutable(id)
                    } else {
                        Handle::Complete(id, value)
                    });
                }
            }
            Op::Reset(handle) => {
                let Some(i) = pick(handle, real.len()) else {
                    continue;
                };
                let Real::Complete(_) = real[i] else { continue };
                let Real::Complete(block) = real.swap_remove(i) else {
                    unreachable!()
                };
                real.push(Real::Mutable(block.reset()));
                if let Some(model) = &mut model {
                    let Handle::Complete(id, _) = model.handles.swap_remove(i) else {
                        unreachable!()
                    };
                    model.handles.push(Handle::Mutable(id));
                }
            }
            Op::Register(handle) => {
                let Some(i) = pick(handle, real.len()) else {
                    continue;
                };
                let Real::Complete(_) = real[i] else { continue };
                let Real::Complete(block) = real.swap_remove(i) else {
                    unreachable!()
                };
                let registered = manager
                    .register_block(block)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let id = registered.block_id().get();
                real.push(Real::Registered(registered.into()));
                if let Some(model) = &mut model {
                    let Handle::Complete(held, value) = model.handles.swap_remove(i) else {
                        unreachable!()
                    };
                    prop_assert_eq!(id, model.register(held, value));
                    model.handles.push(Handle::Registered(vec![id]));
                }
            }
            Op::RegisterAll => {
                let mut batch = Vec::new();
                let mut expected = Vec::new();
                let mut i = 0;
                while i < real.len() {
                    if let Real::Complete(_) = real[i] {
                        let Real::Complete(block) = real.remove(i) else {
                            unreachable!()
                        };
                        batch.push(block);
                        if let Some(model) = &mut model {
                            let Handle::Complete(held, value) = model.handles.remove(i) else {
                                unreachable!()
                            };
                            expected.push((held, value));
                        }
                    } else {
                        i += 1;
                    }
                }
                let registered = manager
                    .register_blocks(batch)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                if let Some(model) = &mut model {
                    let ids: Vec<u32> = expected
                        .into_iter()
                        .map(|(id, v)| model.register(id, v))
                        .collect();
                    prop_assert_eq!(
                        registered
                            .block_ids()
                            .map(|id| id.get())
                            .collect::<Vec<_>>(),
                        ids.clone()
                    );
                    model.handles.push(Handle::Registered(ids));
                }
                real.push(Real::Registered(registered));
            }
            Op::Match { first, len } => {
                let hashes: Vec<SequenceHash> = (first..first + len).map(hash_of).collect();
                let matched = manager.match_blocks(&hashes);
                if let Some(model) = &mut model {
                    let mut ids = Vec::new();
                    for value in first..first + len {
                        let Some(&id) = model.registry.get(&value) else {
                            break;
                        };
                        model.acquire(id);
                        ids.push(id);
                    }
                    prop_assert_eq!(
                        matched.block_ids().map(|id| id.get()).collect::<Vec<_>>(),
                        ids.clone()
                    );
                    model.handles.push(Handle::Registered(ids));
                }
                real.push(Real::Registered(matched));
            }
            Op::Drop(handle) => {
                let Some(i) = pick(handle, real.len()) else {
                    continue;
                };
                drop(real.swap_remove(i));
                if let Some(model) = &mut model {
                    match model.handles.swap_remove(i) {
                        Handle::Mutable(id) | Handle::Complete(id, _) => model.free_held(id),
                        Handle::Registered(ids) => {
                            ids.iter().rev().for_each(|&id| model.release(id))
                        }
                        Handle::Weak { .. } => {}
                    }
                }
            }
            Op::Clone(handle) => {
                let Some(i) = pick(handle, real.len()) else {
                    continue;
                };
                let copy = match &real[i] {
                    Real::Registered(blocks) => Real::Registered(blocks.clone()),
                    Real::Weak(weak) => Real::Weak(weak.clone()),
                    _ => continue,
                };
                real.push(copy);
                if let Some(model) = &mut model {
                    let copy = model.handles[i].clone();
                    if let Handle::Registered(ids) = &copy {
                        for &id in ids {
                            model.slots[id as usize].refs += 1;
                        }
                    }
                    model.handles.push(copy);
                }
            }
            Op::Truncate { handle, len } => {
                let Some(i) = pick(handle, real.len()) else {
                    continue;
                };
                let Real::Registered(blocks) = &mut real[i] else {
                    continue;
                };
                blocks.truncate(len);
                if let Some(model) = &mut model {
                    let Handle::Registered(ids) = &mut model.handles[i] else {
                        unreachable!()
                    };
                    let tail = ids.split_off(len.min(ids.len()));
                    tail.iter().rev().for_each(|&id| model.release(id));
                }
            }
            Op::Downgrade { handle, index } => {
                let Some(i) = pick(handle, real.len()) else {
                    continue;
                };
                let Real::Registered(blocks) = &real[i] else {
                    continue;
                };
                let Some(weak) = blocks.downgrade(index) else {
                    continue;
                };
                real.push(Real::Weak(weak));
                if let Some(model) = &mut model {
                    let Handle::Registered(ids) = &model.handles[i] else {
                        unreachable!()
                    };
                    let slot = model.slots[ids[index] as usize];
                    model.handles.push(Handle::Weak {
                        id: ids[index],
                        epoch: slot.epoch,
                        value: slot.value,
                    });
                }
            }
            Op::Upgrade(handle) => {
                let Some(i) = pick(handle, real.len()) else {
                    continue;
                };
                let Real::Weak(weak) = &real[i] else { continue };
                let upgraded = weak.upgrade();
                if let Some(model) = &mut model {
                    let Handle::Weak { id, epoch, value } = model.handles[i] else {
                        unreachable!()
                    };
                    let slot = model.slots[id as usize];
                    let live = slot.state == State::Registered
                        && slot.epoch == epoch
                        && slot.value == value;
                    prop_assert_eq!(upgraded.is_some(), live);
                    if live {
                        model.acquire(id);
                        model.handles.push(Handle::Registered(vec![id]));
                    }
                }
                if let Some(block) = upgraded {
                    real.push(Real::Registered(block.into()));
                }
            }
            Op::Store { first, len } => {
                let hashes: Vec<SequenceHash> = (first..first + len).map(hash_of).collect();
                let stored = manager.store_blocks(&hashes);
                if let Some(model) = &mut model {
                    let expected = model.allocate(hashes.len()).map(|ids| {
                        (ids.into_iter().zip(first..))
                            .map(|(id, value)| model.register(id, value))
                            .collect::<Vec<_>>()
                    });
                    let ids = (stored.as_ref())
                        .map(|b| b.block_ids().map(|id| id.get()).collect::<Vec<_>>())
                        .map_err(Clone::clone);
                    prop_assert_eq!(&ids, &expected);
                    if let Ok(ids) = expected {
                        model.handles.push(Handle::Registered(ids));
                    }
                }
                if let Ok(blocks) = stored {
                    real.push(Real::Registered(blocks));
                }
            }
            Op::Cache { first, len } => {
                let mut hashes: Vec<SequenceHash> = (first..first + len).map(hash_of).collect();
                let skipped = manager.cache_blocks(&mut hashes);
                if let Some(model) = &mut model {
                    // In order: a hash missing when its turn comes (even
                    // one an earlier store of this batch just evicted) takes
                    // a block while the room at the start lasts.
                    let room = model.free.len() + model.lru.len();
                    let (mut values, mut ids, mut expected_skipped) = (Vec::new(), Vec::new(), 0);
                    for value in first..first + len {
                        if model.registry.contains_key(&value) {
                            continue;
                        }
                        if ids.len() == room {
                            expected_skipped += 1;
                            continue;
                        }
                        let id = model.allocate(1).expect("within the room")[0];
                        ids.push(model.register(id, value));
                        values.push(value);
                    }
                    ids.iter().rev().for_each(|&id| model.release(id));
                    prop_assert_eq!(skipped, expected_skipped);
                    let stored: Vec<u64> = hashes.iter().map(|h| h.value() as u64).collect();
                    prop_assert_eq!(stored, values);
                }
            }
            Op::Prefix { first, len } => {
                let hashes: Vec<SequenceHash> = (first..first + len).map(hash_of).collect();
                let prefix = manager.registered_prefix(&hashes);
                if let Some(model) = &model {
                    let expected = (first..first + len)
                        .take_while(|value| model.registry.contains_key(value))
                        .count();
                    prop_assert_eq!(prefix, expected);
                }
            }
            Op::Touch { first, len } => {
                let hashes: Vec<SequenceHash> = (first..first + len).map(hash_of).collect();
                let touched = manager.touch_prefix(&hashes);
                if let Some(model) = &mut model {
                    let ids: Vec<u32> = (first..first + len)
                        .map_while(|value| model.registry.get(&value).copied())
                        .collect();
                    ids.iter().for_each(|&id| model.acquire(id));
                    ids.iter().rev().for_each(|&id| model.release(id));
                    prop_assert_eq!(touched, ids.len());
                }
            }
            Op::ClearCache => {
                let cleared: Vec<u128> = manager.clear_cache().iter().map(|h| h.value()).collect();
                if let Some(model) = &mut model {
                    let mut expected = Vec::new();
                    while let Some(id) = model.evict() {
                        expected.push(u128::from(model.slots[id as usize].value));
                        model.free.push(id);
                    }
                    prop_assert_eq!(cleared, expected);
                }
            }
        }
        check(&manager, &real, model.as_ref())?;
    }
    drop(real);
    let audit = manager
        .audit()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(
        audit.free_blocks + audit.inactive_blocks,
        blocks,
        "all handles dropped: nothing in use"
    );
    Ok(())
}

/// Conservation and exclusivity after every step.
fn check(
    manager: &kvbm_blocks::BlockManager<Gpu>,
    real: &[Real],
    model: Option<&Model>,
) -> Result<(), TestCaseError> {
    let audit = manager
        .audit()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(audit.total_blocks(), manager.total_blocks());
    let metrics = manager.metrics();
    prop_assert_eq!(
        metrics.free_blocks + metrics.inactive_blocks + metrics.in_use_blocks,
        metrics.total_blocks
    );
    // A held (mutable or staged) block has exactly one owner, and no
    // registered handle points at it.
    let mut owners = vec![0usize; manager.total_blocks()];
    let mut registered = vec![false; manager.total_blocks()];
    for handle in real {
        match handle {
            Real::Mutable(b) => owners[b.block_id().index()] += 1,
            Real::Complete(b) => owners[b.block_id().index()] += 1,
            Real::Registered(blocks) => blocks
                .block_ids()
                .for_each(|id| registered[id.index()] = true),
            Real::Weak(_) => {}
        }
    }
    for (id, (&owners, &registered)) in owners.iter().zip(&registered).enumerate() {
        prop_assert!(owners <= 1, "block {} held by {} owners", id, owners);
        prop_assert!(
            !(owners == 1 && registered),
            "block {} both held and registered",
            id
        );
    }
    prop_assert_eq!(audit.held_blocks, owners.iter().sum::<usize>());
    pinned_only_by_counts_every_reference(manager, real)?;
    if let Some(model) = model {
        prop_assert_eq!(audit.free_blocks, model.free.len());
        prop_assert_eq!(audit.inactive_blocks, model.lru.len());
        prop_assert_eq!(audit.held_blocks, model.count(State::Held, false));
        prop_assert_eq!(audit.active_blocks, model.count(State::Registered, true));
        prop_assert_eq!(audit.registered_hashes, model.registry.len());
    }
    Ok(())
}

/// `pinned_only_by` against the handles themselves: every reference to a
/// registered block is an entry of some registered handle here, so a block
/// is pinned only by some handles when all its entries are theirs.
fn pinned_only_by_counts_every_reference(
    manager: &kvbm_blocks::BlockManager<Gpu>,
    real: &[Real],
) -> Result<(), TestCaseError> {
    let tables: Vec<&ImmutableBlocks<Gpu>> = (real.iter())
        .filter_map(|handle| match handle {
            Real::Registered(blocks) => Some(blocks),
            _ => None,
        })
        .collect();
    let mut references = vec![0usize; manager.total_blocks()];
    for table in &tables {
        table.block_ids().for_each(|id| references[id.index()] += 1);
    }
    for table in &tables {
        let mut listed = vec![0usize; manager.total_blocks()];
        table.block_ids().for_each(|id| listed[id.index()] += 1);
        let alone = (listed.iter().zip(&references))
            .filter(|&(&listed, &all)| listed > 0 && listed == all)
            .count();
        prop_assert_eq!(manager.pinned_only_by([*table]), alone);
    }
    let pinned = references.iter().filter(|&&all| all > 0).count();
    prop_assert_eq!(manager.pinned_only_by(tables.iter().copied()), pinned);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn lru_pool_matches_the_reference_model(blocks in 1usize..7, ops in prop::collection::vec(op(), 1..64)) {
        run(blocks, EvictionPolicy::Lru, &ops)?;
    }

    #[test]
    fn multi_level_pool_conserves_blocks(blocks in 1usize..7, ops in prop::collection::vec(op(), 1..64)) {
        run(blocks, EvictionPolicy::MultiLevelLru, &ops)?;
    }

    #[test]
    fn lineage_pool_conserves_blocks(blocks in 1usize..7, ops in prop::collection::vec(op(), 1..64)) {
        run(blocks, EvictionPolicy::Lineage, &ops)?;
    }
}
