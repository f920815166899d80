//! Integration tests for kvbm-blocks, through the public API only.

mod batch;
mod errors;
mod events;
mod eviction;
#[cfg(not(kvbm_loom))]
mod fuzz;
#[cfg(not(kvbm_loom))]
mod held_batch;
mod lifecycle;
#[cfg(not(kvbm_loom))]
mod model;
mod send_sync;
#[cfg(not(kvbm_loom))]
mod stress;

use kvbm_blocks::{
    BlockManager, CompleteBlock, EvictionPolicy, ImmutableBlocks, PoolAudit, SequenceHash,
};

/// The storage-tier marker used throughout the tests.
#[derive(Debug)]
pub(crate) struct Gpu;

pub(crate) const BLOCK_SIZE: usize = 4;

pub(crate) fn manager(blocks: usize) -> BlockManager<Gpu> {
    manager_with(blocks, EvictionPolicy::Lru)
}

pub(crate) fn manager_with(blocks: usize, eviction: EvictionPolicy) -> BlockManager<Gpu> {
    BlockManager::builder()
        .block_count(blocks)
        .block_size(BLOCK_SIZE)
        .eviction(eviction)
        .build()
        .expect("valid test configuration")
}

/// A chain of `len` hashes whose values start at `first`.
pub(crate) fn chain(first: u64, len: usize) -> Vec<SequenceHash> {
    let mut hashes: Vec<SequenceHash> = Vec::with_capacity(len);
    for value in first..first + len as u64 {
        let next = match hashes.last() {
            Some(parent) => parent.child(value.into()),
            None => SequenceHash::root(value.into()),
        };
        hashes.push(next);
    }
    hashes
}

/// Allocates and stages one block per hash.
pub(crate) fn stage(
    manager: &BlockManager<Gpu>,
    hashes: &[SequenceHash],
) -> Vec<CompleteBlock<Gpu>> {
    manager
        .allocate_blocks(hashes.len())
        .expect("enough blocks")
        .into_iter()
        .zip(hashes)
        .map(|(block, &hash)| block.stage(hash, BLOCK_SIZE).expect("right size"))
        .collect()
}

/// Allocates, stages and registers one block per hash.
pub(crate) fn register(
    manager: &BlockManager<Gpu>,
    hashes: &[SequenceHash],
) -> ImmutableBlocks<Gpu> {
    manager
        .register_blocks(stage(manager, hashes))
        .expect("same manager")
}

/// Audits the pool and checks the partition adds up.
pub(crate) fn audit(manager: &BlockManager<Gpu>) -> PoolAudit {
    let audit = manager.audit().expect("pool is consistent");
    assert_eq!(audit.total_blocks(), manager.total_blocks(), "{audit:?}");
    let metrics = manager.metrics();
    assert_eq!(metrics.free_blocks, audit.free_blocks);
    assert_eq!(metrics.inactive_blocks, audit.inactive_blocks);
    assert_eq!(metrics.in_use_blocks, audit.in_use_blocks());
    audit
}
