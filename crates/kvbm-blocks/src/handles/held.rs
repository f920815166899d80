//! [`MutableBlock`] and [`CompleteBlock`]: blocks allocated to one owner and
//! not yet visible to anyone else.

use std::fmt;
use std::marker::PhantomData;

use super::lease::Lease;
use crate::{BlockError, BlockId, BlockManager, Rejected, SequenceHash};

/// A freshly allocated block, empty as far as the pool knows.
///
/// Fill its KV memory, then [`stage`](Self::stage) it with the hash of the
/// tokens it holds. Dropping it returns the block to the free pool.
pub struct MutableBlock<M> {
    pub(crate) lease: Lease,
    _tier: PhantomData<fn() -> M>,
}

impl<M> MutableBlock<M> {
    pub(crate) fn new(lease: Lease) -> Self {
        Self {
            lease,
            _tier: PhantomData,
        }
    }

    /// The slot (page index) of this block.
    pub fn block_id(&self) -> BlockId {
        self.lease.id()
    }

    /// Tokens this block holds when full.
    pub fn block_size(&self) -> usize {
        self.lease.shared().block_size
    }

    /// Whether this block was allocated by `manager` (or a clone of it).
    pub fn belongs_to(&self, manager: &BlockManager<M>) -> bool {
        manager.owns(self.lease.shared())
    }

    /// Marks the block full with the tokens identified by `hash`;
    /// `num_tokens` must equal the block size.
    ///
    /// # Errors
    ///
    /// [`BlockError::TokenCountMismatch`] with the block handed back.
    pub fn stage(
        self,
        hash: SequenceHash,
        num_tokens: usize,
    ) -> Result<CompleteBlock<M>, Rejected<Self>> {
        let expected = self.block_size();
        if num_tokens != expected {
            let error = BlockError::TokenCountMismatch {
                expected,
                actual: num_tokens,
            };
            return Err(Rejected::new(error, self));
        }
        Ok(CompleteBlock {
            lease: self.lease,
            hash,
            _tier: PhantomData,
        })
    }
}

impl<M> fmt::Debug for MutableBlock<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutableBlock")
            .field("block_id", &self.block_id())
            .finish()
    }
}

/// A full block with its content hash, ready to register.
///
/// Not matchable yet: [`BlockManager::register_block`] publishes it.
/// Dropping it returns the block to the free pool.
///
/// [`BlockManager::register_block`]: crate::BlockManager::register_block
pub struct CompleteBlock<M> {
    pub(crate) lease: Lease,
    hash: SequenceHash,
    _tier: PhantomData<fn() -> M>,
}

impl<M> CompleteBlock<M> {
    /// The slot (page index) of this block.
    pub fn block_id(&self) -> BlockId {
        self.lease.id()
    }

    /// The content and prefix identity staged into this block.
    pub fn sequence_hash(&self) -> SequenceHash {
        self.hash
    }

    /// Tokens this block holds.
    pub fn block_size(&self) -> usize {
        self.lease.shared().block_size
    }

    /// Whether this block was allocated by `manager` (or a clone of it).
    pub fn belongs_to(&self, manager: &BlockManager<M>) -> bool {
        manager.owns(self.lease.shared())
    }

    /// Takes the content back off: the block is mutable again, still ours.
    pub fn reset(self) -> MutableBlock<M> {
        MutableBlock::new(self.lease)
    }
}

impl<M> fmt::Debug for CompleteBlock<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompleteBlock")
            .field("block_id", &self.block_id())
            .field("sequence_hash", &self.hash)
            .finish()
    }
}
