//! [`BlockManager`]: the public face of a block pool.

use std::fmt;
use std::marker::PhantomData;

use tracing::{debug, trace};

use crate::handles::{ImmutableBlock, ImmutableBlocks, Lease, MutableBlock, MutableBlocks};
use crate::pool::Shared;
use crate::read_ahead::ReadAhead;
use crate::sync::Arc;
use crate::{
    BlockError, BlockId, BlockInfo, BlockManagerBuilder, CompleteBlock, DuplicatePolicy,
    EventSubscription, EvictionPolicy, PoolAudit, PoolMetrics, Rejected, SequenceHash,
};

/// A pool of KV blocks with a prefix cache, for one storage tier `M`.
///
/// `M` is a marker type (say `struct Gpu;`) that keeps handles of different
/// tiers from mixing at compile time; handles from two managers of the same
/// tier are told apart at run time ([`BlockError::ForeignManager`]).
///
/// Cloning the manager is cheap and every clone is the same pool. All
/// operations are safe to call from many threads; each takes the pool lock
/// once.
pub struct BlockManager<M> {
    shared: Arc<Shared>,
    _tier: PhantomData<fn() -> M>,
}

/// The blocks of an allocation and the cached hashes it evicted to make room.
#[derive(Debug)]
#[non_exhaustive]
pub struct Allocation<M> {
    /// The allocated blocks, empty as far as the pool knows.
    pub blocks: Vec<MutableBlock<M>>,
    /// Hashes that stopped being matchable because of this allocation.
    pub evicted: Vec<SequenceHash>,
}

impl<M> BlockManager<M> {
    /// Starts configuring a manager.
    pub fn builder() -> BlockManagerBuilder<M> {
        BlockManagerBuilder::new()
    }

    pub(crate) fn from_shared(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            _tier: PhantomData,
        }
    }

    pub(crate) fn owns(&self, shared: &Arc<Shared>) -> bool {
        Arc::ptr_eq(&self.shared, shared)
    }

    /// Allocates `count` blocks, all or nothing. Free blocks go first; when
    /// the free pool runs dry, cached blocks are evicted in policy order.
    ///
    /// # Errors
    ///
    /// [`BlockError::ExceedsCapacity`] if `count` exceeds the pool, or
    /// [`BlockError::InsufficientBlocks`] (with the available count) if not
    /// enough are free or evictable now. Nothing is allocated or evicted then.
    pub fn allocate_blocks(&self, count: usize) -> Result<Vec<MutableBlock<M>>, BlockError> {
        self.allocate_ids(count, |_| {}).map(|ids| self.leases(ids))
    }

    /// [`allocate_blocks`](Self::allocate_blocks) as one handle: the blocks
    /// of a [`MutableBlocks`] share one pool reference, and dropping it frees
    /// them all under one lock (see [`register_batch`](Self::register_batch)).
    ///
    /// # Errors
    ///
    /// As [`allocate_blocks`](Self::allocate_blocks); nothing is allocated
    /// or evicted then.
    pub fn allocate_batch(&self, count: usize) -> Result<MutableBlocks<M>, BlockError> {
        self.allocate_ids(count, |_| {})
            .map(|ids| MutableBlocks::from_ids(self.shared.clone(), ids))
    }

    /// [`allocate_batch`](Self::allocate_batch) onto the end of a run the
    /// caller keeps: with no pool reference taken when the run is this
    /// manager's already, allocation adds no per-block cost beyond the
    /// pool's own.
    ///
    /// ```
    /// use kvbm_blocks::{BlockManager, MutableBlocks};
    /// # struct Gpu;
    /// let manager = BlockManager::<Gpu>::builder().block_count(4).block_size(16).build()?;
    /// let mut run = MutableBlocks::new();
    /// manager.allocate_onto(&mut run, 2)?;
    /// manager.allocate_onto(&mut run, 1)?;
    /// assert_eq!(run.len(), 3);
    /// assert!(manager.allocate_onto(&mut run, 2).is_err()); // one left
    /// assert_eq!(run.len(), 3); // a refused call changes nothing
    /// # Ok::<(), kvbm_blocks::BlockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`allocate_blocks`](Self::allocate_blocks), and
    /// [`BlockError::ForeignManager`] if `blocks` holds another manager's
    /// blocks. Nothing is allocated or evicted then.
    pub fn allocate_onto(
        &self,
        blocks: &mut MutableBlocks<M>,
        count: usize,
    ) -> Result<(), BlockError> {
        let ids = blocks
            .ids_for(&self.shared)
            .ok_or(BlockError::ForeignManager)?;
        {
            let mut pool = self.shared.lock();
            let taken = pool.allocate_onto(count, ids);
            pool.flush_if_full();
            taken
        }
        .inspect_err(|err| debug!(count, %err, "allocation refused"))?;
        blocks.attach(&self.shared);
        Ok(())
    }

    /// Registers every block of `blocks` under its hash in `hashes` (in
    /// order, one lock): what staging each block with its hash and
    /// [`register_blocks`](Self::register_blocks) would do, with the same
    /// registrations, deduplications and events, and no handle per block.
    ///
    /// # Errors
    ///
    /// With `blocks` handed back, none registered:
    /// [`BlockError::ForeignManager`] if they came from another manager,
    /// [`BlockError::HashCountMismatch`] if `hashes` does not have one hash
    /// per block.
    pub fn register_batch(
        &self,
        mut blocks: MutableBlocks<M>,
        hashes: &[SequenceHash],
    ) -> Result<ImmutableBlocks<M>, Rejected<MutableBlocks<M>>> {
        if let Err(error) = self.check_batch(&blocks, hashes) {
            return Err(Rejected::new(error, blocks));
        }
        let ids = blocks.take_ids();
        let mut infos = Vec::new();
        self.shared.lock().register_held(&ids, hashes, &mut infos);
        trace!(count = infos.len(), "registered a batch");
        Ok(ImmutableBlocks::from_refs(self.shared.clone(), infos))
    }

    /// [`register_batch`](Self::register_batch), the blocks then left
    /// cached (matchable, evictable) as dropping the registered batch
    /// would leave them (released last first), under the same lock and
    /// with no handle in between; how many were registered.
    ///
    /// ```
    /// use kvbm_blocks::{BlockManager, SequenceHash};
    /// # struct Host;
    /// let host = BlockManager::<Host>::builder().block_count(2).build()?;
    /// let root = SequenceHash::root(3);
    /// let landed = host.allocate_batch(2)?;
    /// assert_eq!(host.cache_batch(landed, &[root, root.child(4)])?, 2);
    /// assert_eq!(host.metrics().inactive_blocks, 2);
    /// assert_eq!(host.registered_prefix(&[root, root.child(4)]), 2);
    /// # Ok::<(), kvbm_blocks::BlockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`register_batch`](Self::register_batch), with `blocks` handed
    /// back and nothing changed.
    pub fn cache_batch(
        &self,
        mut blocks: MutableBlocks<M>,
        hashes: &[SequenceHash],
    ) -> Result<usize, Rejected<MutableBlocks<M>>> {
        if let Err(error) = self.check_batch(&blocks, hashes) {
            return Err(Rejected::new(error, blocks));
        }
        let mut ids = blocks.take_ids();
        self.shared.lock().cache_held(&mut ids, hashes);
        trace!(count = ids.len(), "cached a batch");
        Ok(ids.len())
    }

    /// Like [`allocate_blocks`](Self::allocate_blocks), also reporting the
    /// hashes evicted to make room, so a KV-aware router can mirror the cache.
    ///
    /// # Errors
    ///
    /// As [`allocate_blocks`](Self::allocate_blocks).
    pub fn allocate_blocks_with_evictions(
        &self,
        count: usize,
    ) -> Result<Allocation<M>, BlockError> {
        let mut evicted = Vec::new();
        let ids = self.allocate_ids(count, |hash| evicted.push(hash))?;
        trace!(count, evicted = evicted.len(), "allocated");
        Ok(Allocation {
            blocks: self.leases(ids),
            evicted,
        })
    }

    /// Evicts up to `count` cached blocks in policy order *without reusing
    /// them*: each stops being matchable (a `Removed` event, as any
    /// eviction) and comes back held, with the hash it had and its KV
    /// untouched, so the caller can copy it to a lower tier before dropping
    /// it frees the block (write-back on eviction). Fewer come back when
    /// fewer are cached; none when `count` is 0.
    pub fn evict_blocks(&self, count: usize) -> Vec<(SequenceHash, MutableBlock<M>)> {
        let evicted = {
            let mut pool = self.shared.lock();
            let evicted = pool.evict_held(count);
            pool.flush_if_full();
            evicted
        };
        trace!(count, evicted = evicted.len(), "evicted into held blocks");
        evicted
            .into_iter()
            .map(|(id, hash)| (hash, MutableBlock::new(Lease::new(self.shared.clone(), id))))
            .collect()
    }

    /// [`evict_blocks`](Self::evict_blocks) as one handle: the evicted
    /// blocks' hashes, in eviction order, and the blocks themselves, held
    /// with their KV untouched in one [`MutableBlocks`] (dropping it frees
    /// them all under one lock).
    ///
    /// ```
    /// use kvbm_blocks::{BlockManager, SequenceHash};
    /// # struct Gpu;
    /// let gpu = BlockManager::<Gpu>::builder().block_count(2).build()?;
    /// let root = SequenceHash::root(5);
    /// drop(gpu.store_blocks(&[root])?); // cached
    /// let (hashes, blocks) = gpu.evict_batch(4);
    /// assert_eq!((hashes, blocks.len()), (vec![root], 1));
    /// assert!(gpu.match_blocks(&[root]).is_empty()); // no longer matchable
    /// drop(blocks); // copied below: freed
    /// assert_eq!(gpu.metrics().free_blocks, 2);
    /// # Ok::<(), kvbm_blocks::BlockError>(())
    /// ```
    pub fn evict_batch(&self, count: usize) -> (Vec<SequenceHash>, MutableBlocks<M>) {
        let evicted = {
            let mut pool = self.shared.lock();
            let evicted = pool.evict_held(count);
            pool.flush_if_full();
            evicted
        };
        trace!(count, evicted = evicted.len(), "evicted into a held batch");
        let (ids, hashes): (Vec<BlockId>, Vec<SequenceHash>) = evicted.into_iter().unzip();
        (hashes, MutableBlocks::from_ids(self.shared.clone(), ids))
    }

    /// Takes `count` block ids from the pool under one lock.
    fn allocate_ids(
        &self,
        count: usize,
        on_evicted: impl FnMut(SequenceHash),
    ) -> Result<Vec<BlockId>, BlockError> {
        let ids = {
            let mut pool = self.shared.lock();
            let ids = pool.allocate(count, on_evicted);
            pool.flush_if_full();
            ids
        };
        ids.inspect_err(|err| debug!(count, %err, "allocation refused"))
    }

    /// Wraps freshly allocated ids in handles that free them when dropped.
    fn leases(&self, ids: Vec<BlockId>) -> Vec<MutableBlock<M>> {
        ids.into_iter()
            .map(|id| MutableBlock::new(Lease::new(self.shared.clone(), id)))
            .collect()
    }

    /// Publishes a complete block: it becomes matchable by every request.
    ///
    /// If the hash is already registered, the default
    /// [`DuplicatePolicy::Deduplicate`] returns a handle to the registered
    /// block and frees this one.
    ///
    /// # Errors
    ///
    /// [`BlockError::ForeignManager`] (with the block back) if the block was
    /// allocated by another manager.
    pub fn register_block(
        &self,
        block: CompleteBlock<M>,
    ) -> Result<ImmutableBlock<M>, Rejected<CompleteBlock<M>>> {
        if !self.owns(block.lease.shared()) {
            return Err(Rejected::new(BlockError::ForeignManager, block));
        }
        let mut block = block;
        let info = self
            .shared
            .lock()
            .register(block.block_id(), block.sequence_hash(), &[]);
        block.lease.disarm();
        trace!(block = %info.block_id(), "registered");
        Ok(ImmutableBlock::from_ref(self.shared.clone(), info))
    }

    /// Publishes a batch of complete blocks under one lock, in order.
    ///
    /// # Errors
    ///
    /// [`BlockError::ForeignManager`] (with every block back, none
    /// registered) if any block was allocated by another manager.
    pub fn register_blocks(
        &self,
        blocks: Vec<CompleteBlock<M>>,
    ) -> Result<ImmutableBlocks<M>, Rejected<Vec<CompleteBlock<M>>>> {
        self.register_blocks_with_tokens(blocks, &[])
    }

    /// Like [`register_blocks`](Self::register_blocks), with the blocks'
    /// tokens (`block_size` per block, in order) for the
    /// [`CacheEvent::Stored`](crate::CacheEvent::Stored) events subscribers
    /// receive: routers that hash tokens themselves need them. The pool keeps
    /// no tokens; without subscribers they are not even read. Empty `tokens`
    /// means none.
    ///
    /// # Errors
    ///
    /// As [`register_blocks`](Self::register_blocks), and
    /// [`BlockError::TokenCountMismatch`] (every block back, none registered)
    /// if `tokens` is neither empty nor `block_size` per block.
    pub fn register_blocks_with_tokens(
        &self,
        mut blocks: Vec<CompleteBlock<M>>,
        tokens: &[u32],
    ) -> Result<ImmutableBlocks<M>, Rejected<Vec<CompleteBlock<M>>>> {
        let mut infos = Vec::with_capacity(blocks.len());
        match self.register_into(&mut blocks, tokens, &mut infos) {
            Ok(()) => Ok(ImmutableBlocks::from_refs(self.shared.clone(), infos)),
            Err(error) => Err(Rejected::new(error, blocks)),
        }
    }

    /// Like [`register_blocks_with_tokens`](Self::register_blocks_with_tokens),
    /// but the registered blocks are appended to `table` (a request's block
    /// table: no new batch, no copy into it) and `blocks` is left empty with
    /// its buffer kept for the next batch. Returns how many were registered.
    /// An empty `table` takes blocks of any manager.
    ///
    /// ```
    /// use kvbm_blocks::{BlockManager, ImmutableBlocks, SequenceHash};
    /// # struct Gpu;
    /// let manager = BlockManager::<Gpu>::builder().block_count(4).block_size(2).build()?;
    /// let root = SequenceHash::root(7);
    /// let mut table = ImmutableBlocks::new();
    /// table.reserve(4); // the table grows once, not per batch
    /// let mut free = manager.allocate_blocks(2)?.into_iter();
    /// let mut staged = vec![free.next().unwrap().stage(root, 2)?];
    /// assert_eq!(manager.register_blocks_onto(&mut table, &mut staged, &[1, 2])?, 1);
    /// staged.push(free.next().unwrap().stage(root.child(9), 2)?);
    /// assert_eq!(manager.register_blocks_onto(&mut table, &mut staged, &[])?, 1);
    /// assert!(staged.is_empty());
    /// assert_eq!(table.len(), 2);
    /// assert!(table.capacity() >= 4);
    /// # Ok::<(), kvbm_blocks::BlockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`register_blocks_with_tokens`](Self::register_blocks_with_tokens),
    /// and [`BlockError::ForeignManager`] if `table` holds another manager's
    /// blocks. Nothing changes on an error: every block stays in `blocks`.
    pub fn register_blocks_onto(
        &self,
        table: &mut ImmutableBlocks<M>,
        blocks: &mut Vec<CompleteBlock<M>>,
        tokens: &[u32],
    ) -> Result<usize, BlockError> {
        let count = blocks.len();
        let infos = table
            .refs_for(&self.shared)
            .ok_or(BlockError::ForeignManager)?;
        self.register_into(blocks, tokens, infos)?;
        // Only now: a refused call leaves an emptied table where it was.
        table.attach(&self.shared);
        Ok(count)
    }

    /// [`register_blocks_onto`](Self::register_blocks_onto), then the
    /// first `release` blocks of the grown `table` released (last first,
    /// into the cache if no one else pins them) and removed from it, under
    /// one lock: for a table whose leading blocks nothing reads any more
    /// (a sliding window moved past them), including blocks registered by
    /// this very call, which then never join the table. The registrations,
    /// events, releases and their order are exactly those of the two calls
    /// (`register_blocks_onto`, then
    /// [`split_off`](ImmutableBlocks::split_off) of the kept blocks and
    /// [`clear`](ImmutableBlocks::clear) of the rest). A `release` past the
    /// grown table's end releases it all. Returns how many were registered.
    ///
    /// ```
    /// use kvbm_blocks::{BlockManager, ImmutableBlocks, SequenceHash};
    /// # struct Gpu;
    /// let manager = BlockManager::<Gpu>::builder().block_count(4).block_size(2).build()?;
    /// let hashes = [SequenceHash::root(7), SequenceHash::root(7).child(9)];
    /// let mut table = ImmutableBlocks::new();
    /// let mut staged = Vec::new();
    /// for (block, hash) in manager.allocate_blocks(2)?.into_iter().zip(hashes) {
    ///     staged.push(block.stage(hash, 2)?);
    /// }
    /// // The first block is registered and released at once: only the
    /// // second joins the table.
    /// assert_eq!(manager.register_blocks_onto_releasing(&mut table, &mut staged, &[], 1)?, 2);
    /// assert_eq!(table.len(), 1);
    /// assert_eq!(manager.metrics().inactive_blocks, 1);
    /// assert_eq!(manager.match_blocks(&hashes).len(), 2); // both matchable
    /// # Ok::<(), kvbm_blocks::BlockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`register_blocks_onto`](Self::register_blocks_onto). Nothing
    /// changes on an error: every block stays in `blocks`, the table as it
    /// was.
    pub fn register_blocks_onto_releasing(
        &self,
        table: &mut ImmutableBlocks<M>,
        blocks: &mut Vec<CompleteBlock<M>>,
        tokens: &[u32],
        release: usize,
    ) -> Result<usize, BlockError> {
        let count = blocks.len();
        let infos = table
            .refs_for(&self.shared)
            .ok_or(BlockError::ForeignManager)?;
        if !blocks.iter().all(|block| self.owns(block.lease.shared())) {
            return Err(BlockError::ForeignManager);
        }
        self.check_tokens(count, tokens)?;
        let release =
            self.register_releasing(staged_entries(blocks), count, tokens, release, infos);
        trace!(count, release, "registered, head released");
        disarm_and_clear(blocks);
        table.attach(&self.shared);
        Ok(count)
    }

    /// [`register_blocks_onto_releasing`](Self::register_blocks_onto_releasing)
    /// for a step that releases everything before `blocks`: the first
    /// `hashes.len()` blocks of `passing` (allocated blocks, front first,
    /// each under its hash of `hashes`) are registered, then `blocks`; then
    /// the passing blocks are released (last first) and every block `table`
    /// held (last first), so the table ends holding `blocks`' registrations
    /// alone. The passing blocks are never staged: the registrations,
    /// events, releases and their order are those of staging them in front
    /// of `blocks` and releasing `table.len() + hashes.len()` blocks.
    /// `tokens` are the passing blocks' then `blocks`' (or empty). Returns
    /// how many were registered.
    ///
    /// ```
    /// use std::collections::VecDeque;
    /// use kvbm_blocks::{BlockManager, ImmutableBlocks, SequenceHash};
    /// # struct Gpu;
    /// let manager = BlockManager::<Gpu>::builder().block_count(4).block_size(2).build()?;
    /// let hashes = [SequenceHash::root(7), SequenceHash::root(7).child(9)];
    /// let mut allocated: VecDeque<_> = manager.allocate_blocks(2)?.into();
    /// let last = allocated.pop_back().unwrap();
    /// let mut staged = vec![last.stage(hashes[1], 2)?];
    /// let mut table = ImmutableBlocks::new();
    /// // The first block is registered and released at once.
    /// let registered =
    ///     manager.register_passing_onto(&mut table, &mut allocated, &hashes[..1], &mut staged, &[])?;
    /// assert_eq!((registered, table.len()), (2, 1));
    /// assert!(allocated.is_empty() && staged.is_empty());
    /// assert_eq!(manager.metrics().inactive_blocks, 1);
    /// # Ok::<(), kvbm_blocks::BlockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`register_blocks_onto`](Self::register_blocks_onto), counting
    /// the passing blocks among `blocks`, and
    /// [`BlockError::InsufficientBlocks`] if `passing` has fewer blocks
    /// than `hashes`. Nothing changes on an error: every block stays where
    /// it was, the table as it was.
    pub fn register_passing_onto(
        &self,
        table: &mut ImmutableBlocks<M>,
        passing: &mut std::collections::VecDeque<MutableBlock<M>>,
        hashes: &[SequenceHash],
        blocks: &mut Vec<CompleteBlock<M>>,
        tokens: &[u32],
    ) -> Result<usize, BlockError> {
        let fresh = hashes.len();
        if passing.len() < fresh {
            return Err(BlockError::InsufficientBlocks {
                requested: fresh,
                available: passing.len(),
            });
        }
        let count = fresh + blocks.len();
        let infos = table
            .refs_for(&self.shared)
            .ok_or(BlockError::ForeignManager)?;
        let ours = |lease: &Lease| self.owns(lease.shared());
        if !(passing.iter().take(fresh).all(|block| ours(&block.lease))
            && blocks.iter().all(|block| ours(&block.lease)))
        {
            return Err(BlockError::ForeignManager);
        }
        self.check_tokens(count, tokens)?;
        let held = infos.len();
        // The passing blocks first (walking the queue's two slices rather
        // than draining it), released at once with every block the table
        // held; then `blocks`.
        let (front, back) = passing.as_slices();
        let passed =
            (front.iter().chain(back).zip(hashes)).map(|(block, &hash)| (block.block_id(), hash));
        let entries = passed.chain(staged_entries(blocks));
        self.register_releasing(entries, count, tokens, held.saturating_add(fresh), infos);
        for mut block in passing.drain(..fresh) {
            block.lease.disarm();
        }
        trace!(count, fresh, held, "registered, passing and held released");
        disarm_and_clear(blocks);
        table.attach(&self.shared);
        Ok(count)
    }

    /// Registers the first `hashes.len()` blocks of the run `blocks` under
    /// `hashes` (in order) straight onto `table`, then releases the first
    /// `release` blocks of the grown table (last first), under one lock: the
    /// batch form of [`register_blocks_onto_releasing`](Self::register_blocks_onto_releasing)
    /// (`release` 0 for [`register_blocks_onto`](Self::register_blocks_onto)),
    /// with the same registrations, events, releases and their order, for a
    /// caller that keeps its unregistered blocks in one [`MutableBlocks`]
    /// rather than a handle (and a pool reference) per block. The registered
    /// blocks leave the front of `blocks`. Returns how many were registered.
    ///
    /// ```
    /// use kvbm_blocks::{BlockManager, ImmutableBlocks, MutableBlocks, SequenceHash};
    /// # struct Gpu;
    /// let manager = BlockManager::<Gpu>::builder().block_count(4).block_size(2).build()?;
    /// let mut run = MutableBlocks::new();
    /// manager.allocate_onto(&mut run, 3)?;
    /// let hashes = [SequenceHash::root(7), SequenceHash::root(7).child(9)];
    /// let mut table = ImmutableBlocks::new();
    /// // Both registered, the first released at once: one joins the table.
    /// assert_eq!(manager.register_front_onto(&mut table, &mut run, &hashes, &[], 1)?, 2);
    /// assert_eq!((table.len(), run.len()), (1, 1));
    /// assert_eq!(manager.match_blocks(&hashes).len(), 2); // both matchable
    /// # Ok::<(), kvbm_blocks::BlockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`register_blocks_onto`](Self::register_blocks_onto), and
    /// [`BlockError::InsufficientBlocks`] if `blocks` holds fewer blocks than
    /// `hashes`. Nothing changes on an error.
    pub fn register_front_onto(
        &self,
        table: &mut ImmutableBlocks<M>,
        blocks: &mut MutableBlocks<M>,
        hashes: &[SequenceHash],
        tokens: &[u32],
        release: usize,
    ) -> Result<usize, BlockError> {
        let count = hashes.len();
        let Some(ids) = blocks.block_ids().get(..count) else {
            return Err(BlockError::InsufficientBlocks {
                requested: count,
                available: blocks.len(),
            });
        };
        if count > 0 && !blocks.belongs_to(self) {
            return Err(BlockError::ForeignManager);
        }
        let infos = table
            .refs_for(&self.shared)
            .ok_or(BlockError::ForeignManager)?;
        self.check_tokens(count, tokens)?;
        let entries = ReadAhead::new(ids.iter().copied().zip(hashes.iter().copied()));
        let release = self.register_releasing(entries, count, tokens, release, infos);
        blocks.forget_front(count);
        trace!(count, release, "registered from a run");
        table.attach(&self.shared);
        Ok(count)
    }

    /// Whether `tokens` are none, or `block_size` for each of `blocks`
    /// blocks (their `Stored` events' tokens).
    fn check_tokens(&self, blocks: usize, tokens: &[u32]) -> Result<(), BlockError> {
        let expected = blocks.saturating_mul(self.shared.block_size);
        if tokens.is_empty() || tokens.len() == expected {
            return Ok(());
        }
        Err(BlockError::TokenCountMismatch {
            expected,
            actual: tokens.len(),
        })
    }

    /// Whether `blocks` can be registered under `hashes`: this manager's,
    /// one hash each ([`register_batch`](Self::register_batch)'s refusals).
    fn check_batch(
        &self,
        blocks: &MutableBlocks<M>,
        hashes: &[SequenceHash],
    ) -> Result<(), BlockError> {
        if !blocks.belongs_to(self) {
            return Err(BlockError::ForeignManager);
        }
        if hashes.len() != blocks.len() {
            return Err(BlockError::HashCountMismatch {
                blocks: blocks.len(),
                hashes: hashes.len(),
            });
        }
        Ok(())
    }

    /// Registers every block of `blocks` under one lock, appending each
    /// registered block's reference to `infos` and emptying `blocks`; on an
    /// error nothing changes.
    fn register_into(
        &self,
        blocks: &mut Vec<CompleteBlock<M>>,
        tokens: &[u32],
        infos: &mut Vec<BlockInfo>,
    ) -> Result<(), BlockError> {
        if !blocks.iter().all(|block| self.owns(block.lease.shared())) {
            return Err(BlockError::ForeignManager);
        }
        self.check_tokens(blocks.len(), tokens)?;
        self.register_releasing(staged_entries(blocks), blocks.len(), tokens, 0, infos);
        trace!(count = blocks.len(), "registered");
        disarm_and_clear(blocks);
        Ok(())
    }

    /// The locked half of every registration onto a table (`infos`, its
    /// blocks): registers the `count` `entries` in order under one lock,
    /// with `tokens` (a block's worth each, or none) for their `Stored`
    /// events, then releases the first `release` blocks of the grown table
    /// (at most all of them), last first, and returns how many that was.
    /// Released new blocks are released straight after registering and
    /// never join `infos`.
    fn register_releasing(
        &self,
        entries: impl Iterator<Item = (BlockId, SequenceHash)>,
        count: usize,
        tokens: &[u32],
        release: usize,
        infos: &mut Vec<BlockInfo>,
    ) -> usize {
        let held = infos.len();
        let release = release.min(held.saturating_add(count));
        // Released from what the table held, and from the new blocks.
        let from_table = release.min(held);
        let fresh = release - from_table;
        // Ids only, not `BlockInfo`s to hand to `release_rev`: the wider
        // copies cost the grouped replay 0.7% of its instructions.
        let mut released = Vec::with_capacity(fresh);
        infos.reserve(count.saturating_sub(fresh));
        {
            let mut pool = self.shared.lock();
            pool.expect_registration(count, tokens.len());
            let mut chunks = tokens.chunks_exact(self.shared.block_size);
            for (index, (id, hash)) in entries.enumerate() {
                let tokens = chunks.next().unwrap_or_default();
                let info = pool.register(id, hash, tokens);
                match index < fresh {
                    true => released.push(info.block_id()),
                    false => infos.push(info),
                }
            }
            pool.flush_if_full();
            for &id in released.iter().rev() {
                pool.release(id);
            }
            pool.release_rev(&infos[..from_table]);
        }
        infos.drain(..from_table);
        release
    }

    /// Allocates a block for each of `hashes` and registers it under that
    /// hash at once, under one lock: for blocks whose KV is in place by the
    /// time they are registered (a lower tier filled by a synchronous copy,
    /// a replay that moves no KV). The result is what
    /// [`allocate_blocks`](Self::allocate_blocks), staging each block and
    /// [`register_blocks`](Self::register_blocks) would give, in that order
    /// of evictions and registrations, without a handle per block on the
    /// way. A hash already registered is handled as `register_blocks`
    /// handles it ([`DuplicatePolicy`]).
    ///
    /// ```
    /// use kvbm_blocks::{BlockManager, SequenceHash};
    ///
    /// struct Host;
    /// let pool = BlockManager::<Host>::builder().block_count(4).build()?;
    /// let hashes = [SequenceHash::root(1), SequenceHash::root(2)];
    /// let stored = pool.store_blocks(&hashes)?;
    /// assert_eq!(stored.len(), 2);
    /// drop(stored);
    /// assert_eq!(pool.match_blocks(&hashes[..1]).len(), 1);
    /// # Ok::<(), kvbm_blocks::BlockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`allocate_blocks`](Self::allocate_blocks), with nothing
    /// allocated or registered.
    pub fn store_blocks(&self, hashes: &[SequenceHash]) -> Result<ImmutableBlocks<M>, BlockError> {
        let mut infos = Vec::new();
        let stored = self.shared.lock().store(hashes, &mut infos);
        stored.inspect_err(|err| debug!(count = hashes.len(), %err, "store refused"))?;
        trace!(count = infos.len(), "stored");
        Ok(ImmutableBlocks::from_refs(self.shared.clone(), infos))
    }

    /// Stores copies arriving in this pool (a lower tier's write-through)
    /// under one lock: each of `hashes`, in order, that is not registered
    /// when its turn comes gets a block, registered and left cached
    /// (matchable, evictable, not pinned), evicting cached blocks for room
    /// in policy order, while the blocks free or cached at the start last.
    /// (A block this batch's own stores evicted counts as missing again; a
    /// hash given twice is stored once.) `hashes` keeps the ones stored, in
    /// order; returns how many of the missing ones did not fit. The
    /// evictions and registrations are those of
    /// [`allocate_blocks`](Self::allocate_blocks) and
    /// [`register_blocks`](Self::register_blocks) of one block at a time,
    /// then dropping the handles, last first, without a handle per block;
    /// the events list every removal before the stores.
    ///
    /// ```
    /// use kvbm_blocks::{BlockManager, SequenceHash};
    ///
    /// struct Host;
    /// let pool = BlockManager::<Host>::builder().block_count(2).build()?;
    /// let (one, two, three) = (SequenceHash::root(1), SequenceHash::root(2), SequenceHash::root(3));
    /// let mut hashes = vec![one, two, three];
    /// assert_eq!(pool.cache_blocks(&mut hashes), 1, "the third does not fit");
    /// assert_eq!(hashes, [one, two]);
    /// let mut again = vec![two];
    /// assert_eq!(pool.cache_blocks(&mut again), 0);
    /// assert!(again.is_empty(), "cached already: nothing stored twice");
    /// assert_eq!(pool.match_blocks(&[one, two]).len(), 2);
    /// # Ok::<(), kvbm_blocks::BlockError>(())
    /// ```
    pub fn cache_blocks(&self, hashes: &mut Vec<SequenceHash>) -> usize {
        let skipped = self.shared.lock().cache(hashes);
        trace!(stored = hashes.len(), skipped, "cached");
        skipped
    }

    /// The longest prefix of `hashes` that is registered, pinned. Cached
    /// blocks in it are revived (they leave the inactive pool).
    pub fn match_blocks(&self, hashes: &[SequenceHash]) -> ImmutableBlocks<M> {
        self.match_blocks_with_capacity(hashes, 0)
    }

    /// [`match_blocks`](Self::match_blocks) into a batch with room for at
    /// least `capacity` blocks: the start of a block table that grows by
    /// registration ([`register_front_onto`](Self::register_front_onto))
    /// without reallocating and copying the matched blocks.
    ///
    /// ```
    /// use kvbm_blocks::{BlockManager, SequenceHash};
    /// # struct Gpu;
    /// let pool = BlockManager::<Gpu>::builder().block_count(8).build()?;
    /// let hashes = [SequenceHash::root(1)];
    /// drop(pool.store_blocks(&hashes)?);
    /// let table = pool.match_blocks_with_capacity(&hashes, 6);
    /// assert_eq!(table.len(), 1);
    /// # Ok::<(), kvbm_blocks::BlockError>(())
    /// ```
    pub fn match_blocks_with_capacity(
        &self,
        hashes: &[SequenceHash],
        capacity: usize,
    ) -> ImmutableBlocks<M> {
        // At most the pool's blocks: a caller's capacity is a hint, not an
        // allocation in proportion to what it declares.
        let room = capacity.min(self.total_blocks()).max(hashes.len());
        // A dropped batch's buffer if the pool keeps one: a held match of 8
        // blocks spent an eighth of its instructions allocating its buffer
        // and freeing it at the drop. With none kept, the buffer is
        // allocated before the lock, not under it.
        let mut pool;
        let mut infos = if self.shared.may_have_spare() {
            pool = self.shared.lock();
            self.shared.take_spare(&mut pool).unwrap_or_default()
        } else {
            let buffer = Vec::with_capacity(room);
            pool = self.shared.lock();
            buffer
        };
        infos.reserve(room);
        pool.match_prefix(hashes, &mut infos);
        drop(pool);
        trace!(requested = hashes.len(), matched = infos.len(), "matched");
        ImmutableBlocks::from_refs(self.shared.clone(), infos)
    }

    /// How many distinct blocks of `tables` no one else pins: those whose
    /// every reference is one of the listed entries (a block listed `k`
    /// times counts once if it has exactly `k` references). Dropping these
    /// tables would make exactly those blocks evictable; the others stay in
    /// use by other handles. What a scheduler weighs before preempting
    /// requests that share a prefix with ones that keep running. Tables of
    /// another manager count nothing.
    ///
    /// ```
    /// use kvbm_blocks::{BlockManager, SequenceHash};
    /// # struct Gpu;
    /// let manager = BlockManager::<Gpu>::builder().block_count(4).build()?;
    /// let hashes = [SequenceHash::root(1), SequenceHash::root(2)];
    /// let mine = manager.store_blocks(&hashes)?;
    /// let shared = manager.match_blocks(&hashes[..1]); // another request
    /// assert_eq!(manager.pinned_only_by([&mine]), 1);
    /// assert_eq!(manager.pinned_only_by([&mine, &shared]), 2);
    /// # Ok::<(), kvbm_blocks::BlockError>(())
    /// ```
    pub fn pinned_only_by<'a>(
        &self,
        tables: impl IntoIterator<Item = &'a ImmutableBlocks<M>>,
    ) -> usize
    where
        M: 'a,
    {
        let mut ids: Vec<BlockId> = (tables.into_iter())
            .filter(|table| table.belongs_to(self))
            .flat_map(|table| table.block_ids())
            .collect();
        ids.sort_unstable();
        let pool = self.shared.lock();
        ids.chunk_by(|a, b| a == b)
            .filter(|run| pool.references(run[0]) == run.len())
            .count()
    }

    /// The longest registered prefix of `hashes`, made most recently used
    /// as [`match_blocks`](Self::match_blocks) and dropping the match would
    /// (a cached block rejoins the end of the line, the deepest first; a
    /// pinned one stays pinned), under one lock and with no handle: what a
    /// lower tier does for blocks it serves a copy of at once. Returns its
    /// length; the pool's metrics count it as a match of that prefix.
    ///
    /// ```
    /// use kvbm_blocks::{BlockManager, SequenceHash};
    ///
    /// struct Host;
    /// let pool = BlockManager::<Host>::builder().block_count(2).build()?;
    /// let (one, two) = (SequenceHash::root(1), SequenceHash::root(2));
    /// pool.cache_blocks(&mut vec![one]);
    /// pool.cache_blocks(&mut vec![two]);
    /// // `one` is the oldest; touching it makes `two` the next victim.
    /// assert_eq!(pool.touch_prefix(&[one, SequenceHash::root(9)]), 1);
    /// pool.cache_blocks(&mut vec![SequenceHash::root(3)]);
    /// assert_eq!(pool.registered_prefix(&[one]), 1);
    /// assert_eq!(pool.registered_prefix(&[two]), 0);
    /// # Ok::<(), kvbm_blocks::BlockError>(())
    /// ```
    pub fn touch_prefix(&self, hashes: &[SequenceHash]) -> usize {
        let found = self.shared.lock().touch_prefix(hashes);
        trace!(requested = hashes.len(), touched = found, "touched");
        found
    }

    /// Which of `hashes` are registered right now, without the prefix rule,
    /// without pinning anything and without touching eviction order.
    pub fn scan_matches(&self, hashes: &[SequenceHash]) -> Vec<bool> {
        let pool = self.shared.lock();
        hashes.iter().map(|&hash| pool.contains(hash)).collect()
    }

    /// How many leading `hashes` are registered: the length of the prefix
    /// [`match_blocks`](Self::match_blocks) would pin, without pinning
    /// anything and without touching eviction order. Stops at the first
    /// hash that is not, so it costs the prefix, not the whole list.
    pub fn registered_prefix(&self, hashes: &[SequenceHash]) -> usize {
        let pool = self.shared.lock();
        hashes
            .iter()
            .take_while(|&&hash| pool.contains(hash))
            .count()
    }

    /// Blocks an allocation could get now: free plus cached (evictable).
    pub fn available_blocks(&self) -> usize {
        self.shared.lock().available()
    }

    /// Blocks in the pool.
    pub fn total_blocks(&self) -> usize {
        self.shared.total
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.shared.block_size
    }

    /// The eviction policy the pool was built with.
    pub fn eviction_policy(&self) -> EvictionPolicy {
        self.shared.eviction
    }

    /// The duplicate policy the pool was built with.
    pub fn duplicate_policy(&self) -> DuplicatePolicy {
        self.shared.duplicates
    }

    /// Occupancy and lifetime counters, read at one instant.
    pub fn metrics(&self) -> PoolMetrics {
        self.shared.lock().metrics()
    }

    /// Evicts every cached block to the free pool and returns their hashes.
    /// Blocks pinned by handles are untouched.
    pub fn clear_cache(&self) -> Vec<SequenceHash> {
        let evicted = {
            let mut pool = self.shared.lock();
            let evicted = pool.clear_cache();
            pool.flush_if_full();
            evicted
        };
        debug!(evicted = evicted.len(), "cache cleared");
        evicted
    }

    /// Subscribes to the pool's [`CacheEvent`](crate::CacheEvent)s, delivered
    /// in batches of at most `capacity` waiting (at least 1) at each
    /// [`flush_events`](Self::flush_events). The first message is a
    /// [`Resync`](crate::Resync) with everything registered now.
    ///
    /// Guarantees, for every subscriber: events arrive in the order the pool
    /// applied them; a hash's `Removed` never precedes its `Stored`; a batch
    /// the channel had no room for is counted
    /// ([`missed_batches`](EventSubscription::missed_batches)) and followed by
    /// a resync, never silently dropped. A `Stored` run's parent was announced
    /// before it (or is in the same batch) whenever it is registered at that
    /// moment, which holds for sequences registered in chain order while their
    /// prefix is pinned, as `kvbm-sequence` does.
    pub fn subscribe_events(&self, capacity: usize) -> EventSubscription {
        self.shared.subscribe(capacity)
    }

    /// Sends the events since the last flush as one batch to every
    /// subscriber (a scheduler calls this once per step). Without
    /// subscribers it costs one atomic load; with nothing pending it sends
    /// nothing (but delivers resyncs owed to lagging subscribers that have
    /// room again).
    pub fn flush_events(&self) {
        self.shared.flush_events();
    }

    /// Recounts every block slot by slot and cross-checks the free list,
    /// registry and cache: a diagnostic for tests and leak hunts, O(blocks).
    ///
    /// # Errors
    ///
    /// [`BlockError::InvariantViolated`] if the pool is inconsistent, which
    /// would be a bug in this crate.
    pub fn audit(&self) -> Result<PoolAudit, BlockError> {
        self.shared.lock().audit()
    }

    /// Whether `self` and `other` are handles to the same pool.
    pub fn same_pool(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

/// Staged blocks as the (block, hash) entries a registration takes.
fn staged_entries<M>(
    blocks: &[CompleteBlock<M>],
) -> impl Iterator<Item = (BlockId, SequenceHash)> + '_ {
    blocks
        .iter()
        .map(|block| (block.block_id(), block.sequence_hash()))
}

/// Empties a staged buffer whose blocks were registered: their leases are
/// disarmed first, so dropping them gives nothing back.
fn disarm_and_clear<M>(blocks: &mut Vec<CompleteBlock<M>>) {
    for block in blocks.iter_mut() {
        block.lease.disarm();
    }
    blocks.clear();
}

impl<M> Clone for BlockManager<M> {
    fn clone(&self) -> Self {
        Self::from_shared(self.shared.clone())
    }
}

impl<M> fmt::Debug for BlockManager<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockManager")
            .field("total_blocks", &self.shared.total)
            .field("block_size", &self.shared.block_size)
            .field("eviction", &self.shared.eviction)
            .field("duplicates", &self.shared.duplicates)
            .finish_non_exhaustive()
    }
}
