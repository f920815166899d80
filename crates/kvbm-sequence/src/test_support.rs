//! Fixtures shared by this crate's unit tests.

use kvbm_blocks::BlockManager;

/// The storage-tier marker of the unit tests.
#[derive(Debug)]
pub(crate) struct Gpu;

/// Tokens per block in the unit tests.
pub(crate) const BS: usize = 4;

/// An LRU pool of `blocks` blocks of [`BS`] tokens.
pub(crate) fn manager(blocks: usize) -> BlockManager<Gpu> {
    BlockManager::builder()
        .block_count(blocks)
        .block_size(BS)
        .build()
        .unwrap()
}
