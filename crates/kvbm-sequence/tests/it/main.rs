//! Integration tests for kvbm-sequence, through the public API only.

mod errors;
#[cfg(not(kvbm_loom))]
mod fuzz;
#[cfg(not(kvbm_loom))]
mod hashing;
mod lifecycle;
#[cfg(not(kvbm_loom))]
mod model;
mod send_sync;

use std::fmt::Debug;

use kvbm_blocks::{BlockManager, PoolAudit};
use kvbm_sequence::RequestSequence;

/// The storage-tier marker used throughout the tests.
#[derive(Debug)]
pub(crate) struct Gpu;

pub(crate) const BLOCK_SIZE: usize = 4;

pub(crate) fn manager(blocks: usize) -> BlockManager<Gpu> {
    manager_with_block_size(blocks, BLOCK_SIZE)
}

pub(crate) fn manager_with_block_size(blocks: usize, block_size: usize) -> BlockManager<Gpu> {
    BlockManager::builder()
        .block_count(blocks)
        .block_size(block_size)
        .build()
        .expect("valid test configuration")
}

/// A request whose prompt is `prompt`, in `BLOCK_SIZE`-token blocks.
pub(crate) fn request(prompt: &[u32], max_output_tokens: usize) -> RequestSequence<Gpu> {
    RequestSequence::new(prompt.to_vec(), max_output_tokens, BLOCK_SIZE)
        .expect("non-zero block size")
}

/// Audits the pool and checks that the partition adds up to the total.
pub(crate) fn audit(manager: &BlockManager<Gpu>) -> PoolAudit {
    let audit = manager.audit().expect("pool is consistent");
    assert_eq!(audit.total_blocks(), manager.total_blocks(), "{audit:?}");
    audit
}

/// Table-test helper: `actual` must equal `expected`, labelled by `case`.
#[track_caller]
pub(crate) fn check<T: PartialEq + Debug>(case: &str, actual: T, expected: T) {
    assert_eq!(actual, expected, "case: {case}");
}
