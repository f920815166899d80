//! [`LogicalBlockAssignments`]: which block handle backs which block of one
//! sequence, in the three lifecycle states a request's blocks go through.

use std::fmt;

use kvbm_blocks::{
    BlockError, BlockId, BlockManager, ImmutableBlocks, MutableBlock, MutableBlocks, SequenceHash,
};

use crate::{BlockSequence, SequenceError};

/// The block handles of one sequence, in page-table order:
///
/// ```text
///  skipped        assigned (ImmutableBlocks)  staged                   unassigned
///  blocks 0 .. k  blocks k .. k+a             k+a .. k+a+s             k+a+s .. (no tokens bound yet)
///  released       registered or prefix-matched full, not yet published allocated ahead of tokens
/// ```
///
/// The skipped blocks are the leading ones a layer group no longer reads (a
/// sliding window moved past them, see [`skip_to`](Self::skip_to)): their
/// handles were released into the cache, and the page table has no block
/// there. For full attention `k` is always 0.
///
/// **Invariant** (checked by [`is_consistent_with`](Self::is_consistent_with)):
/// assigned block `i` holds the sequence's block `k + i` (same
/// [`SequenceHash`]), staged block `j` is bound to block `k + a + j` (it is
/// registered under that block's hash), `k + a + s` never exceeds the full
/// blocks of the sequence, and no block id appears twice. Every mutation
/// here keeps it, given the sequence it is checked against.
///
/// Assigned blocks are kept as one [`ImmutableBlocks`] batch, so matching,
/// registering and releasing a whole prefix takes the pool lock once. Staged
/// and unassigned blocks are one [`MutableBlocks`] run, the staged ones first:
/// staging a block only counts it (its hash is the sequence's at its
/// position), and no block holds a pool reference of its own, so allocating
/// and registering cost no reference count per block.
/// Dropping the assignments drops every handle: mutable and staged blocks go
/// back to the free pool, registered ones to the cache.
///
/// ```
/// use kvbm_blocks::BlockManager;
/// use kvbm_sequence::{BlockSequence, LogicalBlockAssignments};
/// # #[derive(Debug)] struct Gpu;
///
/// let manager = BlockManager::<Gpu>::builder().block_count(8).block_size(4).build()?;
/// let seq = BlockSequence::new((0..10).collect(), 4)?; // 2 full blocks + 2 tokens
/// let mut blocks = LogicalBlockAssignments::new();
///
/// blocks.allocate(&manager, 3)?;
/// assert_eq!(blocks.stage(&seq, usize::MAX)?, 2); // the tail block stays unassigned
/// assert_eq!(blocks.register(&manager, &seq)?, 2);
/// assert_eq!((blocks.assigned_count(), blocks.staged_count(), blocks.unassigned_count()), (2, 0, 1));
/// assert!(blocks.is_consistent_with(&seq));
/// assert_eq!(blocks.block_ids().count(), 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// [`SequenceHash`]: kvbm_blocks::SequenceHash
pub struct LogicalBlockAssignments<M> {
    /// Leading blocks released because nothing reads them any more.
    skipped: usize,
    assigned: ImmutableBlocks<M>,
    /// The staged blocks, then the unassigned ones, in page order. Staged
    /// from the front (FIFO); unassigned ones released from the back (LIFO,
    /// so the latest pre-allocation goes first).
    pending: MutableBlocks<M>,
    /// How many of `pending` are staged: bound to the sequence's blocks
    /// from `assigned_end()` on.
    staged: usize,
}

impl<M> LogicalBlockAssignments<M> {
    /// No blocks.
    pub fn new() -> Self {
        Self {
            skipped: 0,
            assigned: ImmutableBlocks::new(),
            pending: MutableBlocks::new(),
            staged: 0,
        }
    }

    /// Registered or prefix-matched blocks.
    pub fn assigned_count(&self) -> usize {
        self.assigned.len()
    }

    /// Leading blocks given back because nothing reads them any more (see
    /// [`skip_to`](Self::skip_to)): the page table starts at this index.
    pub fn skipped_count(&self) -> usize {
        self.skipped
    }

    /// The index of the first block neither skipped nor assigned: where a
    /// prefix match continues.
    pub fn assigned_end(&self) -> usize {
        self.skipped + self.assigned.len()
    }

    /// Releases the assigned blocks below block index `first_needed` (they
    /// stay cached, still matchable) and counts them as skipped; returns how
    /// many were released. Staged and unassigned blocks are never released
    /// here. With no assigned or staged block held, the skipped prefix may
    /// also move past blocks that were never held (a sliding-window hit
    /// takes only the blocks before its hit point that the window reads).
    pub fn skip_to(&mut self, first_needed: usize) -> usize {
        let released = first_needed
            .saturating_sub(self.skipped)
            .min(self.assigned.len());
        if released > 0 {
            // The head is released last block first, the order of vLLM's
            // `remove_skipped_blocks`; the kept blocks move to the front of
            // the table's own buffer, so the next registration appends
            // without growing a buffer cut to the kept length.
            self.assigned.release_head(released);
            self.skipped += released;
        }
        if self.assigned.is_empty() && self.staged == 0 {
            self.skipped = self.skipped.max(first_needed);
        }
        released
    }

    /// Full blocks bound to their hash but not yet registered.
    pub fn staged_count(&self) -> usize {
        self.staged
    }

    /// Allocated blocks not yet bound to a full block.
    pub fn unassigned_count(&self) -> usize {
        self.pending.len() - self.staged
    }

    /// Every block held, in all three states.
    pub fn len(&self) -> usize {
        self.assigned.len() + self.pending.len()
    }

    /// Whether no block is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The assigned blocks, in order (a slice of
    /// [`BlockInfo`](kvbm_blocks::BlockInfo) through `Deref`).
    pub fn assigned(&self) -> &ImmutableBlocks<M> {
        &self.assigned
    }

    /// The staged blocks' ids, in order (block `assigned_end() + j` is the
    /// `j`th).
    pub fn staged_ids(&self) -> &[BlockId] {
        &self.pending.block_ids()[..self.staged]
    }

    /// The unassigned blocks' ids, in the order they will be staged.
    pub fn unassigned_ids(&self) -> &[BlockId] {
        &self.pending.block_ids()[self.staged..]
    }

    /// Every block id in page-table order: assigned, staged, unassigned.
    pub fn block_ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        (self.assigned.block_ids()).chain(self.pending.block_ids().iter().copied())
    }

    /// Whether `id` is held in any state (a linear scan).
    pub fn contains(&self, id: BlockId) -> bool {
        self.block_ids().any(|held| held == id)
    }

    /// Allocates `count` blocks from `manager` onto the back of the
    /// unassigned queue, all or nothing.
    ///
    /// # Errors
    ///
    /// As [`BlockManager::allocate_onto`], whose error it returns:
    /// `ForeignManager` if the staged or unassigned blocks are another
    /// manager's. Nothing is allocated then.
    pub fn allocate(&mut self, manager: &BlockManager<M>, count: usize) -> Result<(), BlockError> {
        manager.allocate_onto(&mut self.pending, count)
    }

    /// Adds blocks allocated elsewhere to the back of the unassigned queue.
    ///
    /// Mutable blocks are uniquely owned, so they cannot already be here.
    ///
    /// # Errors
    ///
    /// [`SequenceError::Block`] (`ForeignManager`) if they are not all of one
    /// manager, the one whose blocks are staged or unassigned here (if any):
    /// the blocks are then dropped (back to their free pools) and nothing
    /// changes.
    pub fn extend_blocks(
        &mut self,
        blocks: impl IntoIterator<Item = MutableBlock<M>>,
    ) -> Result<(), SequenceError> {
        let mut incoming = MutableBlocks::new();
        for block in blocks {
            incoming
                .push(block)
                .map_err(|rejected| rejected.into_parts().0)?;
        }
        self.pending.append(&mut incoming)?;
        Ok(())
    }

    /// Appends prefix-matched blocks to the assigned prefix, after checking
    /// that they hold exactly the sequence's next full blocks. Returns how many
    /// were added.
    ///
    /// # Errors
    ///
    /// The blocks are dropped (still cached) and nothing changes when:
    /// [`SequenceError::StagedBlocksPending`] if staged blocks occupy the
    /// next positions; [`SequenceError::MatchedBeyondSequence`] if there are
    /// more blocks than remaining full blocks;
    /// [`SequenceError::MatchedHashMismatch`] at the first block that holds
    /// something else; [`SequenceError::ForeignManager`] if they come from
    /// another manager than the assigned blocks.
    pub fn extend_assigned(
        &mut self,
        blocks: ImmutableBlocks<M>,
        sequence: &BlockSequence,
    ) -> Result<usize, SequenceError> {
        if blocks.is_empty() {
            return Ok(0);
        }
        if self.staged > 0 {
            return Err(SequenceError::StagedBlocksPending {
                staged: self.staged,
            });
        }
        let start = self.assigned_end();
        let expected = sequence
            .sequence_hashes()
            .get(start..start + blocks.len())
            .ok_or(SequenceError::MatchedBeyondSequence {
                position: start,
                matched: blocks.len(),
                full_blocks: sequence.num_blocks(),
            })?;
        for (offset, (block, &expected)) in blocks.iter().zip(expected).enumerate() {
            if !block.holds(expected) {
                return Err(SequenceError::MatchedHashMismatch {
                    position: start + offset,
                    expected: expected.value(),
                    actual: block.hash_value(),
                });
            }
        }
        let count = blocks.len();
        self.append_assigned(blocks)?;
        Ok(count)
    }

    /// Appends to the assigned prefix. An empty prefix takes blocks of any
    /// manager (an emptied batch stays attached to its old one, so it is
    /// replaced rather than appended to).
    fn append_assigned(&mut self, blocks: ImmutableBlocks<M>) -> Result<(), SequenceError> {
        if self.assigned.is_empty() {
            self.assigned = blocks;
            return Ok(());
        }
        self.assigned
            .append(blocks)
            .map_err(|_| SequenceError::ForeignManager)
    }

    /// Binds unassigned blocks, front first, to the sequence's next full
    /// blocks that have none, stopping before block index `up_to` (pass
    /// `usize::MAX` for all). Returns how many were staged: fewer than asked
    /// when unassigned blocks run out.
    ///
    /// # Errors
    ///
    /// [`SequenceError::Block`] (`TokenCountMismatch`) if the blocks' size is
    /// not the sequence's; nothing is staged then.
    pub fn stage(
        &mut self,
        sequence: &BlockSequence,
        up_to: usize,
    ) -> Result<usize, SequenceError> {
        let start = self.assigned_end() + self.staged;
        let end = (up_to.min(sequence.num_blocks())).min(start + self.unassigned_count());
        let count = end.saturating_sub(start);
        if count == 0 {
            return Ok(0);
        }
        if let Some(expected) = self.pending.block_size()
            && expected != sequence.block_size()
        {
            return Err(SequenceError::Block(BlockError::TokenCountMismatch {
                expected,
                actual: sequence.block_size(),
            }));
        }
        self.staged += count;
        Ok(count)
    }

    /// The staged blocks' hashes: the sequence's at their positions.
    fn staged_hashes<'s>(
        &self,
        sequence: &'s BlockSequence,
    ) -> Result<&'s [SequenceHash], SequenceError> {
        let start = self.assigned_end();
        (sequence.sequence_hashes())
            .get(start..start + self.staged)
            .ok_or(SequenceError::MatchedBeyondSequence {
                position: start,
                matched: self.staged,
                full_blocks: sequence.num_blocks(),
            })
    }

    /// Registers every staged block with `manager` (one lock) and appends the
    /// results to the assigned prefix. Returns how many were registered.
    ///
    /// The blocks' tokens, read from `sequence` (the one they were staged
    /// from), go with them into the manager's `Stored` events.
    ///
    /// Under deduplication a block whose hash is already registered comes back
    /// as the existing block (another id, same content).
    ///
    /// # Errors
    ///
    /// [`SequenceError::Block`] (`ForeignManager`) with the blocks still
    /// staged if they come from another manager;
    /// [`SequenceError::ForeignManager`] if the assigned blocks come from
    /// another manager than `manager` (the new registrations are then
    /// dropped into `manager`'s cache).
    pub fn register(
        &mut self,
        manager: &BlockManager<M>,
        sequence: &BlockSequence,
    ) -> Result<usize, SequenceError> {
        if self.staged == 0 {
            return Ok(0);
        }
        let tokens = self.staged_tokens(manager, sequence)?;
        let hashes = self.staged_hashes(sequence)?;
        let incoming = self.staged;
        if self.assigned.len() + incoming > self.assigned.capacity() {
            // Grows once, to every block the sequence has room for (the
            // rest of its prompt and the generation reserved for), rather
            // than doubling, and copying the table, batch after batch.
            let room = (sequence.block_capacity())
                .saturating_sub(self.skipped)
                .saturating_sub(self.assigned.len());
            self.assigned.reserve(room.max(incoming));
        }
        // Registered straight onto the table. Checked above that the
        // assigned blocks are the manager's (or none), so an error is the
        // staged blocks', which stay staged.
        manager.register_front_onto(&mut self.assigned, &mut self.pending, hashes, &tokens, 0)?;
        self.staged = 0;
        Ok(incoming)
    }

    /// The staged blocks' tokens for their `Stored` events, once the
    /// registration into `manager` is known to be able to join the
    /// assigned blocks (checked before anything moves: blocks registered
    /// into one manager could not join another's, and would be lost).
    fn staged_tokens<'s>(
        &self,
        manager: &BlockManager<M>,
        sequence: &'s BlockSequence,
    ) -> Result<std::borrow::Cow<'s, [u32]>, SequenceError> {
        if !self.assigned.is_empty() && !self.assigned.belongs_to(manager) {
            return Err(SequenceError::ForeignManager);
        }
        let block_size = sequence.block_size();
        let first = self.assigned_end().saturating_mul(block_size);
        // Borrowed in place (copied only for a batch straddling a shared
        // prompt and the sequence's own tokens, as a prefill after a
        // preemption may).
        Ok((sequence.tokens())
            .range(first..first.saturating_add(self.staged.saturating_mul(block_size)))
            .unwrap_or_default())
    }

    /// [`register`](Self::register) then [`skip_to`](Self::skip_to)`(first_needed)`
    /// in one pass: blocks registered here that fall below `first_needed`
    /// go straight into the cache and never join the assigned prefix (a
    /// sliding window that a prefill chunk moved past most of its new
    /// blocks). The pool sees the same registrations, events and releases,
    /// in the same order, as the two calls. Returns how many blocks were
    /// registered and how many released.
    ///
    /// # Errors
    ///
    /// As [`register`](Self::register); nothing is released then.
    pub fn register_and_skip_to(
        &mut self,
        manager: &BlockManager<M>,
        sequence: &BlockSequence,
        first_needed: usize,
    ) -> Result<(usize, usize), SequenceError> {
        if self.staged == 0 {
            return Ok((0, self.skip_to(first_needed)));
        }
        let tokens = self.staged_tokens(manager, sequence)?;
        let hashes = self.staged_hashes(sequence)?;
        let incoming = self.staged;
        // What `skip_to` would release once the staged blocks are assigned.
        let release = first_needed
            .saturating_sub(self.skipped)
            .min(self.assigned.len() + incoming);
        manager.register_front_onto(
            &mut self.assigned,
            &mut self.pending,
            hashes,
            &tokens,
            release,
        )?;
        self.staged = 0;
        self.skipped += release;
        if self.assigned.is_empty() {
            self.skipped = self.skipped.max(first_needed);
        }
        Ok((incoming, release))
    }

    /// [`stage`](Self::stage)`(sequence, up_to)` then
    /// [`register_and_skip_to`](Self::register_and_skip_to)`(manager, sequence, first_needed)`:
    /// the blocks released at once go from the unassigned queue straight
    /// into the cache, never joining the table. Returns how many blocks were
    /// registered and how many released.
    ///
    /// # Errors
    ///
    /// As `stage` and `register_and_skip_to`, and
    /// [`SequenceError::BlockSizeMismatch`] if `manager`'s block size is
    /// not `sequence`'s. Nothing changes on an error: blocks this call
    /// staged are unstaged.
    pub fn stage_register_and_skip_to(
        &mut self,
        manager: &BlockManager<M>,
        sequence: &BlockSequence,
        up_to: usize,
        first_needed: usize,
    ) -> Result<(usize, usize), SequenceError> {
        if manager.block_size() != sequence.block_size() {
            return Err(SequenceError::BlockSizeMismatch {
                sequence: sequence.block_size(),
                manager: manager.block_size(),
            });
        }
        let staged = self.staged;
        self.stage(sequence, up_to)?;
        (self.register_and_skip_to(manager, sequence, first_needed))
            .inspect_err(|_| self.staged = staged)
    }

    /// Removes the most recently added unassigned block (LIFO), for the
    /// caller to drop (back to the free pool) or keep.
    pub fn pop_unassigned(&mut self) -> Option<MutableBlock<M>> {
        match self.unassigned_count() {
            0 => None,
            _ => self.pending.pop(),
        }
    }

    /// Frees up to `count` unassigned blocks, most recently added first
    /// (LIFO), under one lock. Returns how many were freed.
    pub fn release_unassigned(&mut self, count: usize) -> usize {
        let released = count.min(self.unassigned_count());
        self.pending.truncate(self.pending.len() - released);
        released
    }

    /// Shrinks to a sequence of `num_blocks` full blocks: assigned blocks
    /// past it are released (registered, so they stay cached) and staged
    /// blocks past it are reset and returned to the front of the unassigned
    /// queue, in order, still ours. A cut inside the skipped prefix moves
    /// it back to the cut.
    pub fn truncate(&mut self, num_blocks: usize) {
        self.skipped = self.skipped.min(num_blocks);
        let keep_assigned = (num_blocks - self.skipped).min(self.assigned.len());
        let keep_staged = (num_blocks - self.skipped - keep_assigned).min(self.staged);
        // A released assigned block would leave a hole below the staged
        // ones, so staged blocks past `keep_staged` all step back (to the
        // front of the unassigned queue, in order: where they are).
        self.staged = keep_staged;
        self.assigned.truncate(keep_assigned);
    }

    /// Drops every handle: unassigned and staged blocks are freed, assigned
    /// ones released (cached if no one else holds them).
    ///
    /// Afterwards nothing ties the assignments to a manager: blocks of any
    /// manager may be added (an emptied batch would stay attached to its
    /// old manager and refuse the new one's blocks).
    pub fn clear(&mut self) {
        self.skipped = 0;
        self.pending = MutableBlocks::new();
        self.staged = 0;
        self.assigned = ImmutableBlocks::new();
    }

    /// Checks the invariant against `sequence`: past the skipped prefix,
    /// assigned then staged blocks hold its full blocks in order, and no
    /// block id repeats.
    pub fn is_consistent_with(&self, sequence: &BlockSequence) -> bool {
        let Some(hashes) = sequence.sequence_hashes().get(self.skipped..) else {
            return false;
        };
        let Some((assigned, rest)) = hashes.split_at_checked(self.assigned.len()) else {
            return false;
        };
        // Staged blocks are bound to the sequence's blocks by position: they
        // must exist. Assigned blocks are known by value and position.
        if rest.len() < self.staged {
            return false;
        }
        let bound = (self.assigned.iter().zip(assigned)).all(|(info, &hash)| info.holds(hash));
        let mut ids: Vec<BlockId> = self.block_ids().collect();
        ids.sort_unstable();
        ids.dedup();
        bound && ids.len() == self.len()
    }
}

impl<M> Default for LogicalBlockAssignments<M> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M> fmt::Debug for LogicalBlockAssignments<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogicalBlockAssignments")
            .field("skipped", &self.skipped)
            .field("assigned", &self.assigned.len())
            .field("staged", &self.staged)
            .field("unassigned", &self.unassigned_count())
            .finish()
    }
}

#[cfg(test)]
mod tests;
