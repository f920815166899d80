//! [`LogicalBlockAssignments`]: which block handle backs which block of one
//! sequence, in the three lifecycle states a request's blocks go through.

use std::collections::VecDeque;
use std::fmt;

use kvbm_blocks::{BlockId, BlockManager, CompleteBlock, ImmutableBlocks, MutableBlock};

use crate::{BlockSequence, SequenceError};

/// The block handles of one sequence, in page-table order:
///
/// ```text
///  skipped        assigned (ImmutableBlocks)  staged (CompleteBlock)   unassigned (MutableBlock)
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
/// [`SequenceHash`]), staged block `j` holds block `k + a + j`, `k + a + s`
/// never exceeds the full blocks of the sequence, and no block id appears
/// twice. Every mutation here keeps it, given the sequence it is checked
/// against.
///
/// Assigned blocks are kept as one [`ImmutableBlocks`] batch, so matching,
/// registering and releasing a whole prefix takes the pool lock once.
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
/// blocks.extend_blocks(manager.allocate_blocks(3)?);
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
    staged: Vec<CompleteBlock<M>>,
    /// Staged from the front (FIFO, in page order); released from the back
    /// (LIFO, so the latest pre-allocation goes first).
    unassigned: VecDeque<MutableBlock<M>>,
}

impl<M> LogicalBlockAssignments<M> {
    /// No blocks.
    pub fn new() -> Self {
        Self {
            skipped: 0,
            assigned: ImmutableBlocks::new(),
            staged: Vec::new(),
            unassigned: VecDeque::new(),
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
        if self.assigned.is_empty() && self.staged.is_empty() {
            self.skipped = self.skipped.max(first_needed);
        }
        released
    }

    /// Full blocks bound to their hash but not yet registered.
    pub fn staged_count(&self) -> usize {
        self.staged.len()
    }

    /// Allocated blocks not yet bound to a full block.
    pub fn unassigned_count(&self) -> usize {
        self.unassigned.len()
    }

    /// Every block held, in all three states.
    pub fn len(&self) -> usize {
        self.assigned.len() + self.staged.len() + self.unassigned.len()
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

    /// The staged blocks, in order.
    pub fn staged(&self) -> &[CompleteBlock<M>] {
        &self.staged
    }

    /// The unassigned blocks, in the order they will be staged.
    pub fn unassigned(&self) -> impl ExactSizeIterator<Item = &MutableBlock<M>> + '_ {
        self.unassigned.iter()
    }

    /// Every block id in page-table order: assigned, staged, unassigned.
    pub fn block_ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.assigned
            .block_ids()
            .chain(self.staged.iter().map(CompleteBlock::block_id))
            .chain(self.unassigned.iter().map(MutableBlock::block_id))
    }

    /// Whether `id` is held in any state (a linear scan).
    pub fn contains(&self, id: BlockId) -> bool {
        self.block_ids().any(|held| held == id)
    }

    /// Adds freshly allocated blocks to the back of the unassigned queue.
    ///
    /// Mutable blocks are uniquely owned, so they cannot already be here
    /// (blocks of *another* manager are refused later, when registering).
    pub fn extend_blocks(&mut self, blocks: impl IntoIterator<Item = MutableBlock<M>>) {
        self.unassigned.extend(blocks);
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
        if !self.staged.is_empty() {
            return Err(SequenceError::StagedBlocksPending {
                staged: self.staged.len(),
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
    /// [`SequenceError::Block`] (`TokenCountMismatch`) if a block's size is
    /// not the sequence's; that block goes back to the front of the queue and
    /// the blocks staged before it stay staged.
    pub fn stage(
        &mut self,
        sequence: &BlockSequence,
        up_to: usize,
    ) -> Result<usize, SequenceError> {
        self.stage_from(self.assigned_end() + self.staged.len(), sequence, up_to)
    }

    /// [`stage`](Self::stage) with the first unassigned block bound to
    /// block index `start` (`stage` passes the first index with no block).
    fn stage_from(
        &mut self,
        start: usize,
        sequence: &BlockSequence,
        up_to: usize,
    ) -> Result<usize, SequenceError> {
        let end = up_to
            .min(sequence.num_blocks())
            .min(start + self.unassigned.len());
        let hashes = sequence
            .sequence_hashes()
            .get(start..end)
            .unwrap_or_default();
        self.staged.reserve(hashes.len());
        for &hash in hashes {
            let Some(block) = self.unassigned.pop_front() else {
                break; // unreachable: `end` is bounded by the unassigned count
            };
            match block.stage(hash, sequence.block_size()) {
                Ok(complete) => self.staged.push(complete),
                Err(rejected) => {
                    let (error, block) = rejected.into_parts();
                    self.unassigned.push_front(block);
                    return Err(error.into());
                }
            }
        }
        Ok(hashes.len())
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
        if self.staged.is_empty() {
            return Ok(0);
        }
        let tokens = self.staged_tokens(manager, sequence)?;
        let incoming = self.staged.len();
        if self.assigned.len() + incoming > self.assigned.capacity() {
            // Grows once, to every block the sequence has room for (the
            // rest of its prompt and the generation reserved for), rather
            // than doubling, and copying the table, batch after batch.
            let room = (sequence.block_capacity())
                .saturating_sub(self.skipped)
                .saturating_sub(self.assigned.len());
            self.assigned.reserve(room.max(incoming));
        }
        // Registered straight onto the table; the staged buffer is kept.
        // Checked above that the assigned blocks are the manager's (or
        // none), so an error is the staged blocks', which stay staged.
        manager.register_blocks_onto(&mut self.assigned, &mut self.staged, &tokens)?;
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
            .range(first..first.saturating_add(self.staged.len().saturating_mul(block_size)))
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
        if self.staged.is_empty() {
            return Ok((0, self.skip_to(first_needed)));
        }
        let tokens = self.staged_tokens(manager, sequence)?;
        let incoming = self.staged.len();
        // What `skip_to` would release once the staged blocks are assigned.
        let release = first_needed
            .saturating_sub(self.skipped)
            .min(self.assigned.len() + incoming);
        manager.register_blocks_onto_releasing(
            &mut self.assigned,
            &mut self.staged,
            &tokens,
            release,
        )?;
        self.skipped += release;
        if self.assigned.is_empty() {
            self.skipped = self.skipped.max(first_needed);
        }
        Ok((incoming, release))
    }

    /// [`stage`](Self::stage)`(sequence, up_to)` then
    /// [`register_and_skip_to`](Self::register_and_skip_to)`(manager, sequence, first_needed)`,
    /// without staging the blocks that would be released at once: those
    /// go from the unassigned queue straight into the cache
    /// ([`BlockManager::register_passing_onto`]), in the same order of
    /// registrations and releases. Returns how many blocks were registered
    /// and how many released.
    ///
    /// # Errors
    ///
    /// As `stage` and `register_and_skip_to` when those blocks would not
    /// be released at once (it is then those two calls). Otherwise nothing
    /// changes on error: [`SequenceError::ForeignManager`] or
    /// [`SequenceError::Block`] (`ForeignManager`) if the assigned or the
    /// unassigned blocks are another manager's, or
    /// [`SequenceError::BlockSizeMismatch`] if `manager`'s block size is
    /// not `sequence`'s.
    pub fn stage_register_and_skip_to(
        &mut self,
        manager: &BlockManager<M>,
        sequence: &BlockSequence,
        up_to: usize,
        first_needed: usize,
    ) -> Result<(usize, usize), SequenceError> {
        let start = self.assigned_end();
        let end = (up_to.min(sequence.num_blocks())).min(start + self.unassigned.len());
        let passing = first_needed.min(end).saturating_sub(start);
        if passing == 0 || !self.staged.is_empty() {
            self.stage(sequence, up_to)?;
            return self.register_and_skip_to(manager, sequence, first_needed);
        }
        // Everything the registration could refuse, checked first.
        let block_size = sequence.block_size();
        if manager.block_size() != block_size {
            return Err(SequenceError::BlockSizeMismatch {
                sequence: block_size,
                manager: manager.block_size(),
            });
        }
        if !self.assigned.is_empty() && !self.assigned.belongs_to(manager) {
            return Err(SequenceError::ForeignManager);
        }
        if !(self.unassigned.iter().take(end - start)).all(|block| block.belongs_to(manager)) {
            return Err(SequenceError::Block(
                kvbm_blocks::BlockError::ForeignManager,
            ));
        }
        let hashes = sequence.sequence_hashes();
        let (Some(passed), Some(_)) = (hashes.get(start..start + passing), hashes.get(start..end))
        else {
            // Unreachable: `end` is bounded by the sequence's blocks.
            return Err(SequenceError::MatchedBeyondSequence {
                position: start,
                matched: end - start,
                full_blocks: sequence.num_blocks(),
            });
        };
        // The passing blocks leave the queue; the ones after them are
        // staged as usual.
        let rest = self.unassigned.split_off(passing);
        let mut passing_blocks = std::mem::replace(&mut self.unassigned, rest);
        self.stage_from(start + passing, sequence, up_to)?;
        let first = start.saturating_mul(block_size);
        let tokens = (sequence.tokens())
            .range(first..end.saturating_mul(block_size))
            .unwrap_or_default();
        let held = self.assigned.len();
        match manager.register_passing_onto(
            &mut self.assigned,
            &mut passing_blocks,
            passed,
            &mut self.staged,
            &tokens,
        ) {
            Ok(registered) => {
                self.skipped += held + passing;
                if self.assigned.is_empty() {
                    self.skipped = self.skipped.max(first_needed);
                }
                Ok((registered, held + passing))
            }
            Err(error) => {
                // Unreachable after the checks above; still, nothing moved:
                // every block goes back to the queue, in order.
                for block in self.staged.drain(..).rev() {
                    self.unassigned.push_front(block.reset());
                }
                for block in passing_blocks.into_iter().rev() {
                    self.unassigned.push_front(block);
                }
                Err(error.into())
            }
        }
    }

    /// Removes the most recently added unassigned block (LIFO), for the
    /// caller to drop (back to the free pool) or keep.
    pub fn pop_unassigned(&mut self) -> Option<MutableBlock<M>> {
        self.unassigned.pop_back()
    }

    /// Shrinks to a sequence of `num_blocks` full blocks: assigned blocks
    /// past it are released (registered, so they stay cached) and staged
    /// blocks past it are reset and returned to the front of the unassigned
    /// queue, in order, still ours. A cut inside the skipped prefix moves
    /// it back to the cut.
    pub fn truncate(&mut self, num_blocks: usize) {
        self.skipped = self.skipped.min(num_blocks);
        let keep_assigned = (num_blocks - self.skipped).min(self.assigned.len());
        let keep_staged = (num_blocks - keep_assigned).min(self.staged.len());
        // A released assigned block would leave a hole below the staged
        // ones, so staged blocks past `keep_staged` all step back.
        for block in self.staged.drain(keep_staged..).rev() {
            self.unassigned.push_front(block.reset());
        }
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
        self.unassigned.clear();
        self.staged.clear();
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
        let Some(staged) = rest.get(..self.staged.len()) else {
            return false;
        };
        // Assigned blocks are known by value and position, staged ones by
        // their whole hash.
        let bound = self
            .assigned
            .iter()
            .zip(assigned)
            .all(|(info, &hash)| info.holds(hash))
            && (self.staged.iter().map(CompleteBlock::sequence_hash)).eq(staged.iter().copied());
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
            .field("staged", &self.staged.len())
            .field("unassigned", &self.unassigned.len())
            .finish()
    }
}

#[cfg(test)]
mod tests;
