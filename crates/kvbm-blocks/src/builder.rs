//! [`BlockManagerBuilder`]: validated construction of a [`BlockManager`].

use std::fmt;
use std::marker::PhantomData;

use crate::pool::Shared;
use crate::sync::Arc;
use crate::{BlockError, BlockManager, DuplicatePolicy, EvictionPolicy};

/// The largest pool a [`BlockId`](crate::BlockId) can address (ids are `u32`,
/// and `u32::MAX` is reserved as the lists' end marker).
pub const MAX_BLOCKS: usize = u32::MAX as usize;

/// Configures and builds a [`BlockManager`]; get one from
/// [`BlockManager::builder`].
///
/// ```
/// use kvbm_blocks::{BlockError, BlockManager, EvictionPolicy};
/// # struct Gpu;
/// let manager = BlockManager::<Gpu>::builder()
///     .block_count(1024)
///     .block_size(16)
///     .eviction(EvictionPolicy::Lineage)
///     .build()?;
/// assert_eq!(manager.total_blocks(), 1024);
///
/// let err = BlockManager::<Gpu>::builder().block_size(16).build().unwrap_err();
/// assert_eq!(err, BlockError::ZeroBlockCount);
/// # Ok::<(), BlockError>(())
/// ```
pub struct BlockManagerBuilder<M> {
    block_count: usize,
    block_size: usize,
    eviction: EvictionPolicy,
    duplicates: DuplicatePolicy,
    _tier: PhantomData<fn() -> M>,
}

impl<M> BlockManagerBuilder<M> {
    pub(crate) fn new() -> Self {
        Self {
            block_count: 0,
            block_size: 16,
            eviction: EvictionPolicy::default(),
            duplicates: DuplicatePolicy::default(),
            _tier: PhantomData,
        }
    }

    /// Blocks in the pool (required, at least 1, at most [`MAX_BLOCKS`]).
    pub fn block_count(mut self, count: usize) -> Self {
        self.block_count = count;
        self
    }

    /// Tokens per block (default 16, at least 1).
    pub fn block_size(mut self, tokens: usize) -> Self {
        self.block_size = tokens;
        self
    }

    /// Eviction order of cached blocks (default [`EvictionPolicy::Lru`]).
    pub fn eviction(mut self, policy: EvictionPolicy) -> Self {
        self.eviction = policy;
        self
    }

    /// What registering an already registered hash does (default
    /// [`DuplicatePolicy::Deduplicate`]).
    pub fn duplicates(mut self, policy: DuplicatePolicy) -> Self {
        self.duplicates = policy;
        self
    }

    /// Builds the manager with every block free.
    ///
    /// # Errors
    ///
    /// [`BlockError::ZeroBlockCount`], [`BlockError::ZeroBlockSize`],
    /// [`BlockError::TooManyBlocks`], or [`BlockError::OutOfMemory`] if the
    /// pool's bookkeeping cannot be allocated on this machine.
    pub fn build(self) -> Result<BlockManager<M>, BlockError> {
        if self.block_count == 0 {
            return Err(BlockError::ZeroBlockCount);
        }
        if self.block_count > MAX_BLOCKS {
            return Err(BlockError::TooManyBlocks {
                requested: self.block_count,
                max: MAX_BLOCKS,
            });
        }
        if self.block_size == 0 {
            return Err(BlockError::ZeroBlockSize);
        }
        let shared = Shared::new(
            self.block_count,
            self.block_size,
            self.eviction,
            self.duplicates,
        )?;
        Ok(BlockManager::from_shared(Arc::new(shared)))
    }
}

impl<M> fmt::Debug for BlockManagerBuilder<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockManagerBuilder")
            .field("block_count", &self.block_count)
            .field("block_size", &self.block_size)
            .field("eviction", &self.eviction)
            .field("duplicates", &self.duplicates)
            .finish()
    }
}
