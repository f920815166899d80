//! [`MutableBlocks`]: many allocated, unregistered blocks behind one handle.

use std::fmt;
use std::marker::PhantomData;

use crate::handles::lease::Lease;
use crate::pool::Shared;
use crate::sync::Arc;
use crate::{BlockError, BlockId, BlockManager, MutableBlock, Rejected};

/// An ordered run of freshly allocated blocks, each owned as by a
/// [`MutableBlock`], such as the destinations of a copy
/// between tiers.
///
/// One handle for the run: allocating it
/// ([`BlockManager::allocate_batch`]), registering it
/// ([`BlockManager::register_batch`]) and dropping it (which frees every
/// block) each take the pool lock once and share one pool reference, where
/// a `Vec` of `MutableBlock`s takes a reference per block and a lock per
/// block dropped.
///
/// ```
/// use kvbm_blocks::{BlockManager, SequenceHash};
/// # struct Host;
/// let host = BlockManager::<Host>::builder().block_count(4).block_size(16).build()?;
/// let landings = host.allocate_batch(2)?;
/// assert_eq!(host.available_blocks(), 2);
/// // ... the copy into blocks `landings.block_ids()` completes ...
/// let root = SequenceHash::root(1);
/// let stored = host.register_batch(landings, &[root, root.child(2)])?;
/// assert_eq!(stored.len(), 2);
/// drop(stored); // cached, still matchable
/// assert_eq!(host.match_blocks(&[root]).len(), 1);
///
/// let failed = host.allocate_batch(3)?;
/// drop(failed); // a failed copy: its blocks go back to the free pool
/// assert_eq!(host.available_blocks(), 4);
/// # Ok::<(), kvbm_blocks::BlockError>(())
/// ```
pub struct MutableBlocks<M> {
    /// `None` only while empty and never attached to a manager.
    shared: Option<Arc<Shared>>,
    ids: Vec<BlockId>,
    _tier: PhantomData<fn() -> M>,
}

impl<M> MutableBlocks<M> {
    /// An empty run, attached to no manager.
    pub fn new() -> Self {
        Self {
            shared: None,
            ids: Vec::new(),
            _tier: PhantomData,
        }
    }

    /// Owns blocks the pool has just handed out in the `Held` state.
    pub(crate) fn from_ids(shared: Arc<Shared>, ids: Vec<BlockId>) -> Self {
        Self {
            shared: Some(shared),
            ids,
            _tier: PhantomData,
        }
    }

    /// How many blocks it owns.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether it owns no block.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The blocks' slots (page indices), in order.
    pub fn block_ids(&self) -> &[BlockId] {
        &self.ids
    }

    /// Whether its blocks came from `manager` (or a clone of it); an empty
    /// run belongs to every manager.
    pub fn belongs_to(&self, manager: &BlockManager<M>) -> bool {
        self.is_empty()
            || self
                .shared
                .as_ref()
                .is_some_and(|shared| manager.owns(shared))
    }

    /// Splits off the blocks from index `at` on into a run of their own
    /// (all of them if `at` is 0, none if `at` is at or past the end).
    pub fn split_off(&mut self, at: usize) -> Self {
        let at = at.min(self.ids.len());
        Self {
            shared: self.shared.clone(),
            ids: self.ids.split_off(at),
            _tier: PhantomData,
        }
    }

    /// Keeps the blocks whose `keep` is true, in order, and frees the
    /// others under one lock (in order); a block past the end of `keep` is
    /// kept.
    pub fn retain(&mut self, keep: &[bool]) {
        if keep.iter().all(|&k| k) {
            return;
        }
        let Some(shared) = &self.shared else {
            return;
        };
        let mut pool = shared.lock();
        let mut index = 0;
        self.ids.retain(|&id| {
            let kept = keep.get(index).copied().unwrap_or(true);
            index += 1;
            if !kept {
                pool.free_held(id);
            }
            kept
        });
    }

    /// The block size of the manager its blocks came from; `None` for a
    /// run never attached to one.
    pub fn block_size(&self) -> Option<usize> {
        self.shared.as_ref().map(|shared| shared.block_size)
    }

    /// Frees the blocks from index `len` on, last first, under one lock
    /// (nothing if it holds `len` or fewer).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.ids.len() {
            return;
        }
        if let Some(shared) = &self.shared {
            let mut pool = shared.lock();
            for &id in self.ids[len..].iter().rev() {
                pool.free_held(id);
            }
        }
        self.ids.truncate(len);
    }

    /// Removes the last block as a handle of its own.
    pub fn pop(&mut self) -> Option<MutableBlock<M>> {
        let shared = self.shared.clone()?;
        let id = self.ids.pop()?;
        Some(MutableBlock::new(Lease::new(shared, id)))
    }

    /// Appends a block held by a handle of its own, which it takes over.
    ///
    /// # Errors
    ///
    /// [`BlockError::ForeignManager`], with the block back, if the run holds
    /// blocks of another manager (an empty run takes any manager's).
    pub fn push(&mut self, block: MutableBlock<M>) -> Result<(), Rejected<MutableBlock<M>>> {
        let mut block = block;
        let Some(ids) = self.ids_for(block.lease.shared()) else {
            return Err(Rejected::new(BlockError::ForeignManager, block));
        };
        ids.push(block.block_id());
        self.attach(block.lease.shared());
        block.lease.disarm();
        Ok(())
    }

    /// Moves every block of `other` to the end of this run, leaving `other`
    /// empty.
    ///
    /// # Errors
    ///
    /// [`BlockError::ForeignManager`] if both hold blocks, of different
    /// managers: nothing moves then.
    pub fn append(&mut self, other: &mut MutableBlocks<M>) -> Result<(), BlockError> {
        if other.ids.is_empty() {
            return Ok(());
        }
        let Some(theirs) = other.shared.clone() else {
            return Ok(()); // unreachable: blocks always come with their pool
        };
        let ids = self.ids_for(&theirs).ok_or(BlockError::ForeignManager)?;
        ids.append(&mut other.ids);
        self.attach(&theirs);
        Ok(())
    }

    /// The id buffer, for blocks of `shared` to be appended to it: `None`
    /// if the run holds blocks of another manager. Call
    /// [`attach`](Self::attach) once they are in.
    pub(crate) fn ids_for(&mut self, shared: &Arc<Shared>) -> Option<&mut Vec<BlockId>> {
        let ours = (self.shared.as_ref()).is_some_and(|own| Arc::ptr_eq(own, shared));
        (ours || self.ids.is_empty()).then_some(&mut self.ids)
    }

    /// Makes the run `shared`'s, after blocks allocated there were appended
    /// through [`ids_for`](Self::ids_for).
    pub(crate) fn attach(&mut self, shared: &Arc<Shared>) {
        if (self.shared.as_ref()).is_none_or(|own| !Arc::ptr_eq(own, shared)) {
            self.shared = Some(shared.clone());
        }
    }

    /// Gives up ownership of the first `count` blocks (their state has moved
    /// on: they were registered).
    pub(crate) fn forget_front(&mut self, count: usize) {
        self.ids.drain(..count.min(self.ids.len()));
    }

    /// Gives up ownership of the blocks (their state has moved on: they
    /// were registered), returning their ids.
    pub(crate) fn take_ids(&mut self) -> Vec<BlockId> {
        std::mem::take(&mut self.ids)
    }
}

impl<M> Default for MutableBlocks<M> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M> Drop for MutableBlocks<M> {
    /// Frees every block under one lock, in order.
    fn drop(&mut self) {
        if let Some(shared) = &self.shared
            && !self.ids.is_empty()
        {
            let mut pool = shared.lock();
            for &id in &self.ids {
                pool.free_held(id);
            }
        }
    }
}

impl<M> fmt::Debug for MutableBlocks<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutableBlocks")
            .field("block_ids", &self.ids)
            .finish()
    }
}
