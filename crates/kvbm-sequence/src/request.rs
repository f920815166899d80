//! [`RequestSequence`]: one request's tokens and the blocks backing them,
//! driven through their lifecycle one explicit operation at a time.

use std::fmt;
use std::ops::Range;

use kvbm_blocks::{BlockId, BlockManager, ImmutableBlocks, MutableBlock};
use tracing::{debug, instrument};

use crate::{
    BlockSequence, HashedPrompt, LogicalBlockAssignments, PromptTokens, Salt, SequenceError, Tokens,
};

/// A request's tokens ([`BlockSequence`]) together with the blocks that back
/// them ([`LogicalBlockAssignments`]), with no scheduling policy of its own:
/// every block operation is an explicit call, so a scheduler decides when
/// blocks are allocated, published and given back.
///
/// # Block lifecycle
///
/// Blocks flow through three phases:
///
/// 1. **Unassigned**: allocated [`MutableBlock`]s not yet paired with token
///    data ([`allocate_blocks`](Self::allocate_blocks)).
/// 2. **Staged**: paired with a full block's hash but not yet visible to other
///    requests ([`stage_pending`](Self::stage_pending)).
/// 3. **Assigned**: registered in the block manager and matchable, or matched
///    from its cache ([`register_staged`](Self::register_staged),
///    [`add_matched_blocks`](Self::add_matched_blocks)).
///
/// # Basic usage
///
/// ```
/// use kvbm_blocks::BlockManager;
/// use kvbm_sequence::RequestSequence;
///
/// struct Gpu; // the storage tier of the manager
/// let manager = BlockManager::<Gpu>::builder().block_count(16).block_size(4).build()?;
///
/// // 1. Construct with tokens only (no manager interaction)
/// let tokens: Vec<u32> = (0..8).collect();
/// let mut seq = RequestSequence::<Gpu>::new(tokens, 10, 4)?;
/// assert_eq!((seq.total_tokens(), seq.num_blocks(), seq.held_blocks()), (8, 2, 0));
///
/// // 2. Prefix match against the cache
/// let matched = seq.match_prefix(&manager)?;
/// let matched_count = matched.len();
/// if !matched.is_empty() {
///     seq.add_matched_blocks(matched)?;
/// }
///
/// // 3. Allocate blocks for the rest
/// let remaining = seq.num_blocks() - matched_count;
/// seq.allocate_blocks(remaining, &manager)?;
///
/// // 4. Stage and register
/// seq.complete_and_register_pending(&manager)?;
/// assert_eq!(seq.assigned_blocks(), seq.num_blocks());
/// assert_eq!(seq.block_ids().count(), 2); // the page table
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Generation loop
///
/// After the prompt, generate tokens one at a time. Each
/// [`append_token`](Self::append_token) returns `Some(block_index)` when the
/// token fills a block: register it with
/// [`complete_and_register_pending`](Self::complete_and_register_pending) and
/// allocate the next generation block. Appending past `max_output_tokens` is
/// an error, not a panic.
///
/// ```
/// # use kvbm_blocks::BlockManager;
/// # use kvbm_sequence::RequestSequence;
/// use kvbm_sequence::SequenceError;
/// # struct Gpu;
/// # let manager = BlockManager::<Gpu>::builder().block_count(16).block_size(4).build()?;
/// # let mut seq = RequestSequence::<Gpu>::new((0..8).collect(), 10, 4)?;
/// # seq.allocate_blocks(2, &manager)?;
/// # seq.complete_and_register_pending(&manager)?;
/// # let mut next_token = 100;
/// # let mut forward = |_: &RequestSequence<Gpu>| { next_token += 1; next_token };
/// seq.allocate_blocks(1, &manager)?; // the first generation block
/// while !seq.is_complete() {
///     let token = forward(&seq); // the model
///     let crossed = seq.append_token(token)?;
///     if crossed.is_some() {
///         seq.complete_and_register_pending(&manager)?;
///         seq.allocate_blocks(1, &manager)?;
///     }
/// }
/// assert_eq!((seq.generated_tokens(), seq.total_tokens()), (10, 18));
/// assert_eq!((seq.assigned_blocks(), seq.unassigned_blocks()), (4, 1));
/// assert!(matches!(
///     seq.append_token(0),
///     Err(SequenceError::MaxOutputTokensExceeded { remaining: 0, .. })
/// ));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Preemption and reacquire
///
/// [`release`](Self::release) gives every block back (registered ones stay
/// cached); [`reacquire`](Self::reacquire) later re-matches the cached prefix,
/// saving its recomputation, and reports the hits in
/// [`prefix_matched_blocks`](Self::prefix_matched_blocks).
///
/// ```
/// # use kvbm_blocks::BlockManager;
/// # use kvbm_sequence::RequestSequence;
/// # struct Gpu;
/// # let manager = BlockManager::<Gpu>::builder().block_count(16).block_size(4).build()?;
/// # let mut seq = RequestSequence::<Gpu>::new((0..8).collect(), 10, 4)?;
/// # seq.allocate_blocks(3, &manager)?;
/// # seq.complete_and_register_pending(&manager)?;
/// # seq.append_tokens(&[8, 9])?;
/// // Preempt
/// seq.release();
/// assert_eq!(seq.assigned_blocks(), 0);
/// assert_eq!(manager.metrics().inactive_blocks, 2); // cached, not freed
///
/// // Later: reacquire
/// let hits = seq.reacquire(&manager)?;
/// assert_eq!((hits, seq.prefix_matched_blocks()), (2, 2));
/// assert_eq!(seq.new_tokens_for_prefill(), 2); // only the partial tail is recomputed
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Key accessors
///
/// | Method                      | Description                                       |
/// |-----------------------------|---------------------------------------------------|
/// | [`total_tokens`]            | Input + generated token count                     |
/// | [`num_input_tokens`]        | Original input token count                        |
/// | [`generated_tokens`]        | Tokens appended after the input                   |
/// | [`num_blocks`]              | Full token blocks in the sequence                 |
/// | [`assigned_blocks`]         | Registered or cache-matched blocks                |
/// | [`staged_blocks`]           | Completed but not yet registered                  |
/// | [`unassigned_blocks`]       | Allocated but not yet paired with token data      |
/// | [`prefix_matched_blocks`]   | Blocks matched from cache by the last acquisition |
/// | [`is_complete`]             | `generated_tokens >= max_output_tokens`           |
/// | [`new_tokens_for_prefill`]  | Tokens not covered by cache hits                  |
/// | [`block_size`]              | Tokens per block                                  |
/// | [`block_ids`]               | The blocks backing the sequence, in page order    |
///
/// [`total_tokens`]: Self::total_tokens
/// [`num_input_tokens`]: Self::num_input_tokens
/// [`generated_tokens`]: Self::generated_tokens
/// [`num_blocks`]: Self::num_blocks
/// [`assigned_blocks`]: Self::assigned_blocks
/// [`staged_blocks`]: Self::staged_blocks
/// [`unassigned_blocks`]: Self::unassigned_blocks
/// [`prefix_matched_blocks`]: Self::prefix_matched_blocks
/// [`is_complete`]: Self::is_complete
/// [`new_tokens_for_prefill`]: Self::new_tokens_for_prefill
/// [`block_size`]: Self::block_size
/// [`block_ids`]: Self::block_ids
///
/// # Building a scheduler on top
///
/// A schedule/apply layer that tracks which tokens have their KV computed
/// (`kv_position`) uses these primitives:
///
/// - publish only computed blocks:
///   [`complete_and_register_up_to(kv_position / block_size, ..)`](Self::complete_and_register_up_to);
///   [`pending_blocks`](Self::pending_blocks) counts full blocks still waiting;
/// - pre-allocate for a step: [`additional_blocks_needed`](Self::additional_blocks_needed)
///   then [`allocate_blocks`](Self::allocate_blocks) (all or nothing);
/// - revert it: [`release_unassigned`](Self::release_unassigned) (LIFO) or
///   [`drop_excess_unassigned`](Self::drop_excess_unassigned);
/// - give back what rejected drafts no longer need:
///   [`release_unassigned_beyond`](Self::release_unassigned_beyond);
/// - roll back rejected draft tokens: [`truncate`](Self::truncate);
/// - append a batch of accepted tokens: [`append_tokens`](Self::append_tokens).
///
/// # Managers
///
/// A sequence uses one [`BlockManager`] while it holds blocks: passing another
/// one is [`SequenceError::ForeignManager`]. After [`release`](Self::release)
/// it may move to any manager with the same block size.
pub struct RequestSequence<M> {
    sequence: BlockSequence,
    assignments: LogicalBlockAssignments<M>,
    num_input_tokens: usize,
    max_output_tokens: usize,
    prefix_matched_blocks: usize,
    /// The manager the held blocks come from; meaningful only while some are held.
    manager: Option<BlockManager<M>>,
}

impl<M> RequestSequence<M> {
    /// A request with prompt `tokens` that may generate up to
    /// `max_output_tokens` more, in blocks of `block_size` tokens. No blocks
    /// are matched or allocated yet.
    ///
    /// # Errors
    ///
    /// [`SequenceError::ZeroBlockSize`] if `block_size` is 0.
    pub fn new(
        tokens: Vec<u32>,
        max_output_tokens: usize,
        block_size: usize,
    ) -> Result<Self, SequenceError> {
        Self::with_salt(tokens, max_output_tokens, block_size, Salt::NONE)
    }

    /// Like [`new`](Self::new), with every block hash rooted in `salt`, so
    /// the request shares cached blocks only with requests of the same salt.
    ///
    /// # Errors
    ///
    /// [`SequenceError::ZeroBlockSize`] if `block_size` is 0.
    pub fn with_salt(
        tokens: Vec<u32>,
        max_output_tokens: usize,
        block_size: usize,
        salt: Salt,
    ) -> Result<Self, SequenceError> {
        Self::from_prompt(tokens.into(), max_output_tokens, block_size, salt)
    }

    /// Like [`with_salt`](Self::with_salt), from a prompt the sequence
    /// takes over or shares with its other holders ([`PromptTokens`]).
    ///
    /// # Errors
    ///
    /// [`SequenceError::ZeroBlockSize`] if `block_size` is 0.
    pub fn from_prompt(
        prompt: PromptTokens,
        max_output_tokens: usize,
        block_size: usize,
        salt: Salt,
    ) -> Result<Self, SequenceError> {
        let sequence = BlockSequence::from_prompt(prompt, block_size, salt)?;
        Ok(Self::from_sequence(sequence, max_output_tokens))
    }

    /// One request of `tokens` per salt of `salts`, in order, as
    /// [`with_salt`](Self::with_salt) builds each, with the prompt's blocks
    /// hashed once for all salts ([`BlockSequence::with_salts`]): the
    /// sequences of one request's KV cache groups.
    ///
    /// # Errors
    ///
    /// [`SequenceError::ZeroBlockSize`] if `block_size` is 0.
    pub fn with_salts(
        tokens: impl Into<PromptTokens>,
        max_output_tokens: usize,
        block_size: usize,
        salts: &[Salt],
    ) -> Result<Vec<Self>, SequenceError> {
        Ok(BlockSequence::with_salts(tokens, block_size, salts)?
            .into_iter()
            .map(|sequence| Self::from_sequence(sequence, max_output_tokens))
            .collect())
    }

    /// A request for `prompt` (its salt and block size), taking the hashes
    /// the prompt already has instead of hashing it again; `headroom`
    /// tokens of the generation fit before its buffer grows.
    pub fn from_hashed(prompt: &HashedPrompt, max_output_tokens: usize, headroom: usize) -> Self {
        Self::from_sequence(
            BlockSequence::from_hashed(prompt, headroom),
            max_output_tokens,
        )
    }

    fn from_sequence(sequence: BlockSequence, max_output_tokens: usize) -> Self {
        Self {
            num_input_tokens: sequence.total_tokens(),
            sequence,
            assignments: LogicalBlockAssignments::new(),
            max_output_tokens,
            prefix_matched_blocks: 0,
            manager: None,
        }
    }

    // ------------------------------------------------------------------
    // Prefix matching
    // ------------------------------------------------------------------

    /// Looks up the sequence's full blocks after the assigned ones (all of
    /// them, on a fresh sequence) in `manager`'s cache and returns the longest
    /// registered run, pinned. Pass it to
    /// [`add_matched_blocks`](Self::add_matched_blocks), or drop it.
    ///
    /// # Errors
    ///
    /// [`SequenceError::BlockSizeMismatch`] or
    /// [`SequenceError::ForeignManager`] (see [`allocate_blocks`](Self::allocate_blocks)).
    #[instrument(level = "debug", skip_all)]
    pub fn match_prefix(
        &self,
        manager: &BlockManager<M>,
    ) -> Result<ImmutableBlocks<M>, SequenceError> {
        self.check_manager(manager)?;
        let from = self.assignments.assigned_end();
        let hashes = self
            .sequence
            .sequence_hashes()
            .get(from..)
            .unwrap_or_default();
        let matched = manager.match_blocks(hashes);
        debug!(
            requested = hashes.len(),
            matched = matched.len(),
            "prefix matched"
        );
        Ok(matched)
    }

    /// Appends blocks from [`match_prefix`](Self::match_prefix) to the
    /// assigned prefix and counts them in
    /// [`prefix_matched_blocks`](Self::prefix_matched_blocks). Returns how
    /// many were added.
    ///
    /// # Errors
    ///
    /// When the blocks are not exactly the sequence's next full blocks:
    /// [`SequenceError::MatchedHashMismatch`],
    /// [`SequenceError::MatchedBeyondSequence`],
    /// [`SequenceError::StagedBlocksPending`] or
    /// [`SequenceError::ForeignManager`]. The blocks are then dropped (they
    /// stay cached) and the sequence is unchanged.
    pub fn add_matched_blocks(
        &mut self,
        matched: ImmutableBlocks<M>,
    ) -> Result<usize, SequenceError> {
        // Held blocks of one manager and matched blocks of another would
        // leave a table no single pool can serve.
        let owner = matched.manager();
        if let (Some(bound), Some(owner)) = (&self.manager, &owner)
            && !self.assignments.is_empty()
            && !bound.same_pool(owner)
        {
            return Err(SequenceError::ForeignManager);
        }
        let count = self.assignments.extend_assigned(matched, &self.sequence)?;
        if let Some(owner) = owner.filter(|_| count > 0) {
            self.bind(&owner);
        }
        self.prefix_matched_blocks += count;
        Ok(count)
    }

    /// [`match_prefix`](Self::match_prefix) then
    /// [`add_matched_blocks`](Self::add_matched_blocks); returns the hits.
    ///
    /// # Errors
    ///
    /// As those two.
    pub fn match_and_add_prefix(
        &mut self,
        manager: &BlockManager<M>,
    ) -> Result<usize, SequenceError> {
        let matched = self.match_prefix(manager)?;
        let count = self.add_matched_blocks(matched)?;
        self.bind(manager);
        Ok(count)
    }

    // ------------------------------------------------------------------
    // Allocation
    // ------------------------------------------------------------------

    /// Allocates `count` blocks from `manager` into the unassigned queue, all
    /// or nothing.
    ///
    /// # Errors
    ///
    /// [`SequenceError::AllocationFailed`] if the manager cannot supply them
    /// (nothing is allocated); [`SequenceError::BlockSizeMismatch`] if the
    /// manager's block size differs from the sequence's;
    /// [`SequenceError::ForeignManager`] if the sequence holds blocks of
    /// another manager.
    #[instrument(level = "debug", skip_all, fields(count = count))]
    pub fn allocate_blocks(
        &mut self,
        count: usize,
        manager: &BlockManager<M>,
    ) -> Result<(), SequenceError> {
        self.check_manager(manager)?;
        if count == 0 {
            return Ok(());
        }
        (self.assignments)
            .allocate(manager, count)
            .map_err(|source| SequenceError::AllocationFailed {
                requested: count,
                source,
            })?;
        self.bind(manager);
        Ok(())
    }

    /// How many more blocks must be allocated for the held blocks to cover
    /// the first `num_tokens` token positions (0 if they already do).
    pub fn additional_blocks_needed(&self, num_tokens: usize) -> usize {
        num_tokens
            .div_ceil(self.block_size())
            .saturating_sub(self.covered_blocks())
    }

    /// Gives back up to `count` unassigned blocks, most recently allocated
    /// first (LIFO), to the free pool. Returns how many were released.
    pub fn release_unassigned(&mut self, count: usize) -> usize {
        self.assignments.release_unassigned(count)
    }

    /// Releases unassigned blocks (LIFO) until at most `keep` remain.
    /// Returns how many were released.
    pub fn drop_excess_unassigned(&mut self, keep: usize) -> usize {
        let excess = self.assignments.unassigned_count().saturating_sub(keep);
        self.release_unassigned(excess)
    }

    /// Releases unassigned blocks (LIFO) that covering the first
    /// `num_tokens` token positions does not need: after rejected draft
    /// tokens, say. Returns how many were released.
    pub fn release_unassigned_beyond(&mut self, num_tokens: usize) -> usize {
        let needed = num_tokens.div_ceil(self.block_size());
        let excess = self.covered_blocks().saturating_sub(needed);
        self.release_unassigned(excess)
    }

    /// Removes the most recently allocated unassigned block (LIFO) and hands
    /// it to the caller.
    pub fn pop_unassigned(&mut self) -> Option<MutableBlock<M>> {
        self.assignments.pop_unassigned()
    }

    // ------------------------------------------------------------------
    // Staging and registration
    // ------------------------------------------------------------------

    /// Pairs unassigned blocks with every full block that has none yet, in
    /// order, as far as unassigned blocks last. Returns how many were staged.
    ///
    /// # Errors
    ///
    /// [`SequenceError::Block`] if a block does not hold `block_size` tokens,
    /// which cannot happen for blocks from [`allocate_blocks`](Self::allocate_blocks).
    pub fn stage_pending(&mut self) -> Result<usize, SequenceError> {
        self.stage_up_to(usize::MAX)
    }

    /// Like [`stage_pending`](Self::stage_pending), but only for full blocks
    /// with index below `num_blocks`: those whose KV is computed.
    ///
    /// # Errors
    ///
    /// As [`stage_pending`](Self::stage_pending).
    pub fn stage_up_to(&mut self, num_blocks: usize) -> Result<usize, SequenceError> {
        self.assignments.stage(&self.sequence, num_blocks)
    }

    /// Registers every staged block with `manager`, making it matchable by
    /// other requests. Returns how many were registered.
    ///
    /// # Errors
    ///
    /// [`SequenceError::ForeignManager`] or [`SequenceError::Block`]
    /// (`ForeignManager`) if the blocks come from another manager; they stay
    /// staged in the latter case.
    #[instrument(level = "debug", skip_all, fields(staged = self.assignments.staged_count()))]
    pub fn register_staged(&mut self, manager: &BlockManager<M>) -> Result<usize, SequenceError> {
        if self.assignments.staged_count() == 0 {
            return Ok(0);
        }
        self.check_manager(manager)?;
        self.assignments.register(manager, &self.sequence)
    }

    /// Stages and registers every full block that an unassigned block can
    /// back ([`stage_pending`](Self::stage_pending) then
    /// [`register_staged`](Self::register_staged)). The partial tail's block
    /// stays unassigned. Returns how many blocks were registered.
    ///
    /// # Errors
    ///
    /// As those two.
    pub fn complete_and_register_pending(
        &mut self,
        manager: &BlockManager<M>,
    ) -> Result<usize, SequenceError> {
        self.complete_and_register_up_to(usize::MAX, manager)
    }

    /// Like [`complete_and_register_pending`](Self::complete_and_register_pending),
    /// for full blocks with index below `num_blocks` only: a scheduler passes
    /// `kv_position / block_size` so that no block is published before its KV
    /// is computed.
    ///
    /// # Errors
    ///
    /// As [`stage_pending`](Self::stage_pending) and
    /// [`register_staged`](Self::register_staged).
    pub fn complete_and_register_up_to(
        &mut self,
        num_blocks: usize,
        manager: &BlockManager<M>,
    ) -> Result<usize, SequenceError> {
        // Checked before staging, so a refusal changes nothing.
        self.check_manager(manager)?;
        self.stage_up_to(num_blocks)?;
        self.register_staged(manager)
    }

    // ------------------------------------------------------------------
    // Tokens
    // ------------------------------------------------------------------

    /// Appends one generated token. Returns `Some(block_index)` when it fills
    /// that block. Blocks are not touched: stage, register and allocate as
    /// the caller sees fit.
    ///
    /// # Errors
    ///
    /// [`SequenceError::MaxOutputTokensExceeded`] once `max_output_tokens`
    /// tokens were generated; nothing is appended.
    pub fn append_token(&mut self, token: u32) -> Result<Option<usize>, SequenceError> {
        self.check_budget(1)?;
        Ok(self.sequence.append(token))
    }

    /// Appends generated tokens, all or none. Returns the indices of the
    /// blocks they filled (empty if none).
    ///
    /// # Errors
    ///
    /// [`SequenceError::MaxOutputTokensExceeded`] if they do not all fit in
    /// the output budget; nothing is appended.
    pub fn append_tokens(&mut self, tokens: &[u32]) -> Result<Range<usize>, SequenceError> {
        self.check_budget(tokens.len())?;
        Ok(self.sequence.extend(tokens))
    }

    /// Rolls the sequence back to its first `len` tokens (rejected draft
    /// tokens, say). Full blocks that stay keep their hashes and blocks;
    /// registered blocks past the new end are released (they stay cached);
    /// staged blocks past it return, still held, to the front of the
    /// unassigned queue, so the page table keeps its order and every kept
    /// token stays in the block that held it. Afterwards the sequence's
    /// tokens, hashes and block layout are those of a sequence built fresh
    /// from the kept tokens.
    ///
    /// # Errors
    ///
    /// Nothing changes on error:
    /// - [`SequenceError::TruncateOutOfRange`] unless
    ///   `num_input_tokens() <= len <= total_tokens()`;
    /// - [`SequenceError::TruncateIntoRegistered`] if `len` cuts a registered
    ///   block (the kept tokens of an immutable block would lose their
    ///   block); a cut at a block boundary is fine.
    #[instrument(level = "debug", skip_all, fields(len = len))]
    pub fn truncate(&mut self, len: usize) -> Result<(), SequenceError> {
        if len < self.num_input_tokens || len > self.sequence.total_tokens() {
            return Err(SequenceError::TruncateOutOfRange {
                len,
                min: self.num_input_tokens,
                max: self.sequence.total_tokens(),
            });
        }
        let block_size = self.block_size();
        let registered_tokens = self.assignments.assigned_end().saturating_mul(block_size);
        if len < registered_tokens && !len.is_multiple_of(block_size) {
            return Err(SequenceError::TruncateIntoRegistered {
                len,
                block: len / block_size,
                registered_tokens,
                block_size,
            });
        }
        self.sequence.truncate(len)?;
        self.assignments.truncate(self.sequence.num_blocks());
        self.prefix_matched_blocks = self
            .prefix_matched_blocks
            .min(self.assignments.assigned_count());
        Ok(())
    }

    // ------------------------------------------------------------------
    // Release / reacquire
    // ------------------------------------------------------------------

    /// Gives every block back: unassigned and staged ones to the free pool,
    /// registered ones to the cache (still matchable). The tokens stay.
    #[instrument(level = "debug", skip_all, fields(held = self.assignments.len()))]
    pub fn release(&mut self) {
        self.assignments.clear();
        self.prefix_matched_blocks = 0;
        self.manager = None;
    }

    /// After [`release`](Self::release), takes blocks again for every full
    /// block: the longest cached prefix is matched (counted in
    /// [`prefix_matched_blocks`](Self::prefix_matched_blocks), and returned),
    /// and the rest are allocated as unassigned blocks, to be registered once
    /// their KV is recomputed. No block is allocated for the partial tail.
    ///
    /// # Errors
    ///
    /// [`SequenceError::NotReleased`] if blocks are still held;
    /// [`SequenceError::AllocationFailed`] if the rest cannot be allocated, in
    /// which case nothing is held (as after `release`);
    /// [`SequenceError::BlockSizeMismatch`].
    #[instrument(level = "debug", skip_all, fields(blocks = self.sequence.num_blocks()))]
    pub fn reacquire(&mut self, manager: &BlockManager<M>) -> Result<usize, SequenceError> {
        if !self.assignments.is_empty() {
            return Err(SequenceError::NotReleased {
                held: self.assignments.len(),
            });
        }
        self.prefix_matched_blocks = 0;
        let hits = self.match_and_add_prefix(manager)?;
        let rest = self.sequence.num_blocks() - hits;
        if let Err(error) = self.allocate_blocks(rest, manager) {
            self.release();
            return Err(error);
        }
        debug!(hits, allocated = rest, "reacquired");
        Ok(hits)
    }

    // ------------------------------------------------------------------
    // Accessors
    // ------------------------------------------------------------------

    /// Input plus generated tokens.
    pub fn total_tokens(&self) -> usize {
        self.sequence.total_tokens()
    }

    /// Tokens the request was created with.
    pub fn num_input_tokens(&self) -> usize {
        self.num_input_tokens
    }

    /// Tokens appended after the input.
    pub fn generated_tokens(&self) -> usize {
        self.sequence.total_tokens() - self.num_input_tokens
    }

    /// The output budget.
    pub fn max_output_tokens(&self) -> usize {
        self.max_output_tokens
    }

    /// Tokens that may still be generated.
    pub fn remaining_tokens(&self) -> usize {
        self.max_output_tokens
            .saturating_sub(self.generated_tokens())
    }

    /// Whether `generated_tokens() >= max_output_tokens()`.
    pub fn is_complete(&self) -> bool {
        self.generated_tokens() >= self.max_output_tokens
    }

    /// Full token blocks in the sequence.
    pub fn num_blocks(&self) -> usize {
        self.sequence.num_blocks()
    }

    /// Registered or cache-matched blocks.
    pub fn assigned_blocks(&self) -> usize {
        self.assignments.assigned_count()
    }

    /// Full blocks paired with a block but not yet registered.
    pub fn staged_blocks(&self) -> usize {
        self.assignments.staged_count()
    }

    /// Allocated blocks not yet paired with a full block (the partial tail's
    /// and any allocated ahead).
    pub fn unassigned_blocks(&self) -> usize {
        self.assignments.unassigned_count()
    }

    /// Full blocks with neither an assigned nor a staged block yet, nor
    /// skipped.
    pub fn pending_blocks(&self) -> usize {
        self.num_blocks() - self.assignments.assigned_end() - self.assignments.staged_count()
    }

    /// Leading blocks released because this layer group reads them no more
    /// (see [`skip_to`](Self::skip_to)); always 0 for full attention. The
    /// page table ([`block_ids`](Self::block_ids)) starts at this block.
    pub fn skipped_blocks(&self) -> usize {
        self.assignments.skipped_count()
    }

    /// Releases the registered blocks below block index `first_needed`
    /// into the cache (still matchable, now evictable): a sliding window or
    /// a local chunk moved past them. Returns how many were released. With
    /// nothing registered or staged, it moves the start of the page table to
    /// `first_needed` (a window hit takes only the blocks its window reads).
    /// Never releases staged or unassigned blocks. See
    /// [`AttentionKind::first_needed_block`](crate::AttentionKind::first_needed_block).
    pub fn skip_to(&mut self, first_needed: usize) -> usize {
        let first_needed = first_needed.min(self.num_blocks());
        self.assignments.skip_to(first_needed)
    }

    /// [`complete_and_register_up_to`](Self::complete_and_register_up_to)`(num_blocks, ..)`
    /// then [`skip_to`](Self::skip_to)`(first_needed)`, with the blocks
    /// registered below `first_needed` released straight into the cache
    /// ([`LogicalBlockAssignments::register_and_skip_to`]): what a sliding
    /// window's step does. Returns how many blocks were registered and how
    /// many released.
    ///
    /// # Errors
    ///
    /// As [`complete_and_register_up_to`](Self::complete_and_register_up_to);
    /// nothing is released then.
    pub fn complete_register_and_skip_to(
        &mut self,
        num_blocks: usize,
        first_needed: usize,
        manager: &BlockManager<M>,
    ) -> Result<(usize, usize), SequenceError> {
        self.check_manager(manager)?;
        let first_needed = first_needed.min(self.num_blocks());
        self.assignments.stage_register_and_skip_to(
            manager,
            &self.sequence,
            num_blocks,
            first_needed,
        )
    }

    /// Skipped plus held blocks: the token slots the page table covers,
    /// in blocks.
    fn covered_blocks(&self) -> usize {
        self.assignments.skipped_count() + self.assignments.len()
    }

    /// Every block held: assigned, staged and unassigned.
    pub fn held_blocks(&self) -> usize {
        self.assignments.len()
    }

    /// Blocks matched from the cache by the current acquisition (the first
    /// ones of the assigned prefix). Zero after [`release`](Self::release).
    pub fn prefix_matched_blocks(&self) -> usize {
        self.prefix_matched_blocks
    }

    /// Tokens whose KV must be computed: those not covered by cache hits.
    pub fn new_tokens_for_prefill(&self) -> usize {
        let cached = self.prefix_matched_blocks * self.block_size();
        self.total_tokens().saturating_sub(cached)
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.sequence.block_size()
    }

    /// The salt the block hashes are rooted in.
    pub fn salt(&self) -> Salt {
        self.sequence.salt()
    }

    /// Every token, input then generated.
    pub fn tokens(&self) -> Tokens<'_> {
        self.sequence.tokens()
    }

    /// The block ids backing the sequence, in page order (assigned, staged,
    /// unassigned): the page table an attention kernel reads, from block
    /// [`skipped_blocks`](Self::skipped_blocks) on.
    pub fn block_ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.assignments.block_ids()
    }

    /// [`block_ids`](Self::block_ids) as raw page indices.
    pub fn page_indices(&self) -> Vec<u32> {
        self.block_ids().map(BlockId::get).collect()
    }

    /// The tokens and their block hashes.
    pub fn sequence(&self) -> &BlockSequence {
        &self.sequence
    }

    /// The block handles.
    pub fn assignments(&self) -> &LogicalBlockAssignments<M> {
        &self.assignments
    }

    // ------------------------------------------------------------------
    // Internals
    // ------------------------------------------------------------------

    fn check_budget(&self, requested: usize) -> Result<(), SequenceError> {
        let remaining = self.remaining_tokens();
        if requested > remaining {
            return Err(SequenceError::MaxOutputTokensExceeded {
                requested,
                remaining,
                max_output_tokens: self.max_output_tokens,
            });
        }
        Ok(())
    }

    fn check_manager(&self, manager: &BlockManager<M>) -> Result<(), SequenceError> {
        if manager.block_size() != self.block_size() {
            return Err(SequenceError::BlockSizeMismatch {
                sequence: self.block_size(),
                manager: manager.block_size(),
            });
        }
        // Every call that adds blocks binds their manager, so held blocks
        // always have one.
        match &self.manager {
            Some(bound) if !self.assignments.is_empty() && !bound.same_pool(manager) => {
                Err(SequenceError::ForeignManager)
            }
            _ => Ok(()),
        }
    }

    /// Remembers the manager the held blocks come from (one `Arc` clone when
    /// it changes).
    fn bind(&mut self, manager: &BlockManager<M>) {
        if !self
            .manager
            .as_ref()
            .is_some_and(|bound| bound.same_pool(manager))
        {
            self.manager = Some(manager.clone());
        }
    }
}

impl<M> fmt::Debug for RequestSequence<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestSequence")
            .field("total_tokens", &self.total_tokens())
            .field("num_input_tokens", &self.num_input_tokens)
            .field("max_output_tokens", &self.max_output_tokens)
            .field("num_blocks", &self.num_blocks())
            .field("assigned", &self.assignments.assigned_count())
            .field("staged", &self.assignments.staged_count())
            .field("unassigned", &self.assignments.unassigned_count())
            .field("prefix_matched_blocks", &self.prefix_matched_blocks)
            .finish()
    }
}

#[cfg(test)]
mod tests;
