//! [`ImmutableBlocks`]: an ordered batch of registered-block handles that
//! shares one pool reference and takes the pool lock once per operation.

use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;

use super::{BlockInfo, ImmutableBlock, WeakBlock};
use crate::pool::Shared;
use crate::sync::Arc;
use crate::{BlockError, BlockId, BlockManager, Rejected};

/// An ordered run of registered blocks, each pinned as by an
/// [`ImmutableBlock`], such as a request's matched prefix or its block table.
///
/// Reading it is reading a slice of [`BlockInfo`] (it derefs to one). Cloning,
/// truncating and dropping it touch every block under a single pool lock, so
/// a batch costs O(1) synchronization however long it is.
///
/// ```
/// use kvbm_blocks::{BlockManager, SequenceHash};
/// # struct Gpu;
/// let manager = BlockManager::<Gpu>::builder().block_count(8).block_size(4).build()?;
/// let root = SequenceHash::root(1);
/// let hashes = [root, root.child(2), root.child(2).child(3)];
/// let staged = manager
///     .allocate_blocks(3)?
///     .into_iter()
///     .zip(hashes)
///     .map(|(block, hash)| block.stage(hash, 4))
///     .collect::<Result<Vec<_>, _>>()?;
/// let mut table = manager.register_blocks(staged)?;
/// assert_eq!(table.len(), 3);
/// let page_table: Vec<u32> = table.block_ids().map(|id| id.get()).collect();
/// assert_eq!(page_table, [0, 1, 2]);
///
/// table.truncate(1); // the last two blocks go to the cache, still matchable
/// assert_eq!(manager.metrics().inactive_blocks, 2);
/// assert_eq!(manager.match_blocks(&hashes).len(), 3);
/// # Ok::<(), kvbm_blocks::BlockError>(())
/// ```
pub struct ImmutableBlocks<M> {
    /// `None` only while empty and never attached to a manager.
    shared: Option<Arc<Shared>>,
    blocks: Vec<BlockInfo>,
    _tier: PhantomData<fn() -> M>,
}

impl<M> ImmutableBlocks<M> {
    /// An empty batch, attached to no manager until a block is added.
    pub fn new() -> Self {
        Self {
            shared: None,
            blocks: Vec::new(),
            _tier: PhantomData,
        }
    }

    /// Wraps references the caller has already taken in the pool.
    pub(crate) fn from_refs(shared: Arc<Shared>, blocks: Vec<BlockInfo>) -> Self {
        Self {
            shared: Some(shared),
            blocks,
            _tier: PhantomData,
        }
    }

    fn same_manager(&self, other: &Arc<Shared>) -> bool {
        self.shared
            .as_ref()
            .is_none_or(|shared| Arc::ptr_eq(shared, other))
    }

    /// Whether these blocks are registered in `manager` (or a clone of it).
    /// An empty batch never attached to a manager belongs to every manager.
    pub fn belongs_to(&self, manager: &BlockManager<M>) -> bool {
        self.shared
            .as_ref()
            .is_none_or(|shared| manager.owns(shared))
    }

    /// The manager these blocks are registered in; `None` for a batch never
    /// attached to one.
    pub fn manager(&self) -> Option<BlockManager<M>> {
        self.shared.clone().map(BlockManager::from_shared)
    }

    /// The block ids in order: the page table an attention kernel reads.
    pub fn block_ids(&self) -> impl ExactSizeIterator<Item = BlockId> + '_ {
        self.blocks.iter().map(BlockInfo::block_id)
    }

    /// Appends one block, taking over its reference.
    ///
    /// # Errors
    ///
    /// [`BlockError::ForeignManager`] (with the block back) if it comes from
    /// another manager than the blocks already here.
    pub fn push(&mut self, block: ImmutableBlock<M>) -> Result<(), Rejected<ImmutableBlock<M>>> {
        if !self.same_manager(block.shared()) {
            return Err(Rejected::new(BlockError::ForeignManager, block));
        }
        if self.shared.is_none() {
            self.shared = Some(block.shared().clone());
        }
        self.blocks.push(block.disown());
        Ok(())
    }

    /// Appends every block of `other`, taking over its references.
    ///
    /// # Errors
    ///
    /// [`BlockError::ForeignManager`] (with `other` back) if the two batches
    /// come from different managers.
    pub fn append(&mut self, mut other: Self) -> Result<(), Rejected<Self>> {
        let Some(other_shared) = other.shared.clone() else {
            return Ok(()); // never attached, so empty
        };
        if !self.same_manager(&other_shared) {
            return Err(Rejected::new(BlockError::ForeignManager, other));
        }
        self.shared.get_or_insert(other_shared);
        self.blocks.append(&mut other.blocks);
        Ok(())
    }

    /// Blocks the batch can hold before its buffer grows.
    pub fn capacity(&self) -> usize {
        self.blocks.capacity()
    }

    /// Makes room for at least `additional` more blocks, so that a block
    /// table about to grow grows once, to the size its caller expects,
    /// instead of doubling (and copying) as blocks arrive.
    pub fn reserve(&mut self, additional: usize) {
        self.blocks.reserve(additional);
    }

    /// The buffer to append references taken in `shared`'s pool to: this
    /// batch's, if it is that pool's or empty (an emptied batch holds
    /// nothing of its old pool); `None` if it holds another pool's blocks.
    /// The caller [`attach`](Self::attach)es it once it appended.
    pub(crate) fn refs_for(&mut self, shared: &Arc<Shared>) -> Option<&mut Vec<BlockInfo>> {
        (self.blocks.is_empty() || self.same_manager(shared)).then_some(&mut self.blocks)
    }

    /// Makes the batch `shared`'s, after references taken there were
    /// appended through [`refs_for`](Self::refs_for).
    pub(crate) fn attach(&mut self, shared: &Arc<Shared>) {
        if (self.shared.as_ref()).is_none_or(|own| !Arc::ptr_eq(own, shared)) {
            self.shared = Some(shared.clone());
        }
    }

    /// Removes the last block as a single handle (no reference changes hands).
    pub fn pop(&mut self) -> Option<ImmutableBlock<M>> {
        let info = self.blocks.pop()?;
        let shared = self.shared.clone()?;
        Some(ImmutableBlock::from_ref(shared, info))
    }

    /// A new handle to the block at `index` (one more reference).
    pub fn get(&self, index: usize) -> Option<ImmutableBlock<M>> {
        let info = *self.blocks.get(index)?;
        let shared = self.shared.as_ref()?;
        shared.lock().add_ref(info.block_id());
        Some(ImmutableBlock::from_ref(shared.clone(), info))
    }

    /// A new batch of the blocks at `range` (one more reference each, under
    /// one lock); the part of `range` past the end is left out.
    pub fn clone_range(&self, range: std::ops::Range<usize>) -> Self {
        let end = range.end.min(self.blocks.len());
        let start = range.start.min(end);
        let blocks = self.blocks[start..end].to_vec();
        if let Some(shared) = &self.shared
            && !blocks.is_empty()
        {
            let mut pool = shared.lock();
            for info in &blocks {
                pool.add_ref(info.block_id());
            }
        }
        Self {
            shared: self.shared.clone(),
            blocks,
            _tier: PhantomData,
        }
    }

    /// Every block's whole [`SequenceHash`](crate::SequenceHash) (lineage
    /// included, which [`BlockInfo`] leaves out), in order, read under one
    /// lock.
    pub fn sequence_hashes(&self) -> Vec<crate::SequenceHash> {
        let mut hashes = Vec::new();
        self.sequence_hashes_into(&mut hashes);
        hashes
    }

    /// [`sequence_hashes`](Self::sequence_hashes) into `out` (cleared
    /// first), for a caller that reuses one buffer.
    pub fn sequence_hashes_into(&self, out: &mut Vec<crate::SequenceHash>) {
        out.clear();
        let Some(shared) = &self.shared else {
            return;
        };
        let pool = shared.lock();
        pool.hashes_of(&self.blocks, out);
    }

    /// A non-owning handle to the block at `index`.
    pub fn downgrade(&self, index: usize) -> Option<WeakBlock<M>> {
        let info = *self.blocks.get(index)?;
        let shared = self.shared.clone()?;
        // Pinned by this batch, so its slot holds the whole hash.
        let hash = shared.lock().hash_of(info.block_id());
        Some(WeakBlock::new(shared, info, hash))
    }

    /// Keeps the first `len` blocks and releases the rest under one lock,
    /// last block first. Released blocks with no other handle become cached,
    /// deepest first, so LRU eviction takes the ends of chains before the
    /// prefixes they share (as vLLM frees a finished request).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.blocks.len() {
            return;
        }
        if let Some(shared) = &self.shared {
            let mut pool = shared.lock();
            pool.release_rev(&self.blocks[len..]);
        }
        self.blocks.truncate(len);
    }

    /// Releases every block, last first.
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Releases the first `count` blocks (all of them if fewer), last
    /// first, and moves the rest to the front: what
    /// [`split_off`](Self::split_off)`(count)` of the rest,
    /// [`clear`](Self::clear) and [`append`](Self::append)ing the rest
    /// back do, with no second batch. For a table whose head nothing reads
    /// any more (a sliding window moved past it).
    pub fn release_head(&mut self, count: usize) {
        let count = count.min(self.blocks.len());
        if count == 0 {
            return;
        }
        if let Some(shared) = &self.shared {
            shared.lock().release_rev(&self.blocks[..count]);
        }
        self.blocks.drain(..count);
    }

    /// Splits off the blocks from `at` on into a new batch. If `at` is past
    /// the end, the new batch is empty.
    pub fn split_off(&mut self, at: usize) -> Self {
        let at = at.min(self.blocks.len());
        Self {
            shared: self.shared.clone(),
            blocks: self.blocks.split_off(at),
            _tier: PhantomData,
        }
    }
}

impl<M> Deref for ImmutableBlocks<M> {
    type Target = [BlockInfo];

    fn deref(&self) -> &[BlockInfo] {
        &self.blocks
    }
}

impl<M> Default for ImmutableBlocks<M> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M> Clone for ImmutableBlocks<M> {
    fn clone(&self) -> Self {
        if let Some(shared) = &self.shared {
            let mut pool = shared.lock();
            for info in &self.blocks {
                pool.add_ref(info.block_id());
            }
        }
        Self {
            shared: self.shared.clone(),
            blocks: self.blocks.clone(),
            _tier: PhantomData,
        }
    }
}

impl<M> Drop for ImmutableBlocks<M> {
    /// Releases every block, last first, and gives the emptied buffer back
    /// to the pool under the same lock, for a later match to fill.
    ///
    /// Always inlined into the drop glue, which was a call of its own to
    /// this (with its own prologue and epilogue) before dropping the fields.
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(shared) = &self.shared
            && !self.blocks.is_empty()
        {
            let mut pool = shared.lock();
            pool.release_rev(&self.blocks);
            self.blocks.clear();
            shared.recycle(&mut pool, &mut self.blocks);
        }
    }
}

impl<M> From<ImmutableBlock<M>> for ImmutableBlocks<M> {
    fn from(block: ImmutableBlock<M>) -> Self {
        let shared = block.shared().clone();
        Self::from_refs(shared, vec![block.disown()])
    }
}

impl<M> fmt::Debug for ImmutableBlocks<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImmutableBlocks")
            .field(
                "block_ids",
                &self
                    .blocks
                    .iter()
                    .map(BlockInfo::block_id)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl<M> IntoIterator for ImmutableBlocks<M> {
    type Item = ImmutableBlock<M>;
    type IntoIter = IntoIter<M>;

    /// Splits the batch into single handles, moving each reference.
    fn into_iter(mut self) -> IntoIter<M> {
        IntoIter {
            shared: self.shared.take(),
            blocks: std::mem::take(&mut self.blocks).into_iter(),
            _tier: PhantomData,
        }
    }
}

/// The single handles of an [`ImmutableBlocks`]; what is not taken is
/// released when the iterator drops.
pub struct IntoIter<M> {
    shared: Option<Arc<Shared>>,
    blocks: std::vec::IntoIter<BlockInfo>,
    _tier: PhantomData<fn() -> M>,
}

impl<M> Iterator for IntoIter<M> {
    type Item = ImmutableBlock<M>;

    fn next(&mut self) -> Option<ImmutableBlock<M>> {
        let info = self.blocks.next()?;
        Some(ImmutableBlock::from_ref(self.shared.clone()?, info))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.blocks.size_hint()
    }
}

impl<M> ExactSizeIterator for IntoIter<M> {}

impl<M> Drop for IntoIter<M> {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared
            && self.blocks.len() > 0
        {
            let mut pool = shared.lock();
            for info in self.blocks.by_ref().rev() {
                pool.release(info.block_id());
            }
        }
    }
}

impl<M> fmt::Debug for IntoIter<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IntoIter")
            .field("remaining", &self.blocks.len())
            .finish()
    }
}
