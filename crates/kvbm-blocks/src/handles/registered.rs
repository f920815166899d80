//! [`ImmutableBlock`] and [`WeakBlock`]: one registered block, shared.

use std::fmt;
use std::marker::PhantomData;

use super::BlockInfo;
use crate::pool::Shared;
use crate::sync::Arc;
use crate::{BlockId, BlockManager, SequenceHash};

/// A shared handle to one registered block: its KV content is final and any
/// request may match it.
///
/// `Clone` takes one more reference (a short pool lock, no allocation).
/// Dropping the last handle moves the block to the inactive pool, where it
/// stays matchable until evicted. For many blocks at once, prefer
/// [`ImmutableBlocks`](crate::ImmutableBlocks): one lock per batch.
pub struct ImmutableBlock<M> {
    shared: Arc<Shared>,
    info: BlockInfo,
    /// False once the reference moved into an `ImmutableBlocks`.
    owns_ref: bool,
    _tier: PhantomData<fn() -> M>,
}

impl<M> ImmutableBlock<M> {
    /// Wraps a reference the caller has already taken in the pool.
    pub(crate) fn from_ref(shared: Arc<Shared>, info: BlockInfo) -> Self {
        Self {
            shared,
            info,
            owns_ref: true,
            _tier: PhantomData,
        }
    }

    /// Gives up the handle without releasing its reference, which the caller
    /// now owns.
    pub(crate) fn disown(mut self) -> BlockInfo {
        self.owns_ref = false;
        self.info
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The slot (page index) holding the block.
    pub fn block_id(&self) -> BlockId {
        self.info.block_id()
    }

    /// The content and prefix identity of the block, read from the pool
    /// (a short lock): the handle pins the block, so its slot holds it.
    pub fn sequence_hash(&self) -> SequenceHash {
        self.shared.lock().hash_of(self.info.block_id())
    }

    /// Block id and hash value together.
    pub fn info(&self) -> BlockInfo {
        self.info
    }

    /// Whether this block is registered in `manager` (or a clone of it).
    pub fn belongs_to(&self, manager: &BlockManager<M>) -> bool {
        manager.owns(&self.shared)
    }

    /// A handle that does not keep the block alive.
    pub fn downgrade(&self) -> WeakBlock<M> {
        WeakBlock::new(self.shared.clone(), self.info, self.sequence_hash())
    }
}

impl<M> Clone for ImmutableBlock<M> {
    fn clone(&self) -> Self {
        self.shared.lock().add_ref(self.info.block_id());
        Self::from_ref(self.shared.clone(), self.info)
    }
}

impl<M> Drop for ImmutableBlock<M> {
    fn drop(&mut self) {
        if self.owns_ref {
            self.shared.lock().release(self.info.block_id());
        }
    }
}

impl<M> fmt::Debug for ImmutableBlock<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImmutableBlock")
            .field("block_id", &self.block_id())
            .field("sequence_hash", &self.sequence_hash())
            .finish()
    }
}

/// A handle to a registered block that does not keep it alive.
///
/// [`upgrade`](Self::upgrade) succeeds while the block still holds the same
/// registered content, whether some handle pins it or it sits in the cache
/// (upgrading revives it); once evicted it returns `None`. A `WeakBlock` keeps
/// the pool's memory alive, not the block.
pub struct WeakBlock<M> {
    shared: Arc<Shared>,
    info: BlockInfo,
    /// The whole hash, kept: the slot may hold something else by now.
    hash: SequenceHash,
    _tier: PhantomData<fn() -> M>,
}

impl<M> WeakBlock<M> {
    pub(crate) fn new(shared: Arc<Shared>, info: BlockInfo, hash: SequenceHash) -> Self {
        Self {
            shared,
            info,
            hash,
            _tier: PhantomData,
        }
    }

    /// A strong handle, if the block was not evicted since.
    pub fn upgrade(&self) -> Option<ImmutableBlock<M>> {
        let live = self.shared.lock().upgrade(&self.info);
        live.then(|| ImmutableBlock::from_ref(self.shared.clone(), self.info))
    }

    /// Whether the block was registered in `manager` (or a clone of it).
    pub fn belongs_to(&self, manager: &BlockManager<M>) -> bool {
        manager.owns(&self.shared)
    }

    /// The slot the block was in.
    pub fn block_id(&self) -> BlockId {
        self.info.block_id()
    }

    /// The content and prefix identity the block had.
    pub fn sequence_hash(&self) -> SequenceHash {
        self.hash
    }
}

impl<M> Clone for WeakBlock<M> {
    fn clone(&self) -> Self {
        Self::new(self.shared.clone(), self.info, self.hash)
    }
}

impl<M> fmt::Debug for WeakBlock<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeakBlock")
            .field("block_id", &self.block_id())
            .field("sequence_hash", &self.sequence_hash())
            .finish()
    }
}
