//! [`SchedulableSequence`]: its fields, construction, accessors and the
//! helpers every operation shares. The operations themselves live in
//! `prefill`, `decode`, `speculative`, `revert` and `acquire`.

use std::fmt;

use kvbm_blocks::{BlockError, BlockId, BlockManager};
use kvbm_sequence::{
    AttentionKind, HashedPrompt, PromptTokens, RequestSequence, Salt, SequenceError, Tokens,
};

use crate::{
    ApplyError, EventLog, HistoryPolicy, SchedulableSequenceBuilder, ScheduleError, SequenceEvent,
    SequenceState,
};

/// One request driven through a two-phase schedule/apply protocol for
/// prefill, decode and speculative decode, on top of a
/// [`RequestSequence`]: an engine plans a step (`schedule_*`, which
/// pre-allocates the step's blocks), runs the model, then commits it
/// (`apply_*`) or rolls it back ([`revert_schedule`](Self::revert_schedule)).
///
/// The crate documentation explains the state machine, `kv_position` and
/// the tail, registration timing and preemption, with examples; this page
/// lists the operations.
///
/// # Block accounting
///
/// When idle, a sequence holds exactly the blocks that back its computed KV:
/// `ceil(kv_position / block_size)` blocks, or `ceil(total_tokens /
/// block_size)` after a speculative step, which keeps the block of the tail
/// token's slot (the step wrote it). Of those, the `kv_position /
/// block_size` fully computed ones are registered, the rest (at most one) is
/// unassigned, none is staged. A schedule adds the blocks its step writes;
/// an apply registers what the step completed; a revert gives the
/// schedule's blocks back, last allocated first. The model-based test checks
/// these counts after every call.
///
/// # Key accessors
///
/// | Method                                          | Meaning                                            |
/// |-------------------------------------------------|----------------------------------------------------|
/// | [`state`](Self::state)                          | Idle or the pending step                           |
/// | [`kv_position`](Self::kv_position)              | Tokens whose KV is computed                        |
/// | [`tail_tokens`](Self::tail_tokens)              | `total_tokens - kv_position`                       |
/// | [`prefill_target`](Self::prefill_target)        | Tokens the prefill path computes before decoding   |
/// | [`prefill_position`](Self::prefill_position)    | `kv_position`, capped at the prefill target        |
/// | [`is_prefill_complete`](Self::is_prefill_complete) | `kv_position >= prefill_target`                 |
/// | [`history`](Self::history)                      | The event log                                      |
/// | [`block_ids`](Self::block_ids)                  | The page table                                     |
/// | [`inner`](Self::inner)                          | The underlying [`RequestSequence`]                 |
///
/// The [`RequestSequence`] counts (`total_tokens`, `num_input_tokens`,
/// `generated_tokens`, `is_complete`, `assigned_blocks`, ...) are forwarded.
pub struct SchedulableSequence<M> {
    pub(crate) inner: RequestSequence<M>,
    pub(crate) state: SequenceState,
    /// Tokens whose KV is computed (see the crate docs).
    pub(crate) kv_position: usize,
    /// The manager the held blocks come from, to refuse another pool before
    /// anything is mutated (meaningful only while blocks are held).
    pub(crate) bound: Option<BlockManager<M>>,
    pub(crate) history: EventLog,
}

impl<M> SchedulableSequence<M> {
    /// A sequence with prompt `tokens` that may generate up to
    /// `max_output_tokens` tokens, in blocks of `block_size` tokens: idle,
    /// holding no blocks, nothing computed, full history. Use
    /// [`builder`](Self::builder) for a salt or another history policy.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::Sequence`] (`ZeroBlockSize`) if `block_size` is 0.
    pub fn new(
        tokens: Vec<u32>,
        max_output_tokens: usize,
        block_size: usize,
    ) -> Result<Self, ScheduleError> {
        Self::builder(tokens, max_output_tokens, block_size).build()
    }

    /// Starts configuring a sequence; see [`SchedulableSequenceBuilder`].
    pub fn builder(
        tokens: Vec<u32>,
        max_output_tokens: usize,
        block_size: usize,
    ) -> SchedulableSequenceBuilder<M> {
        SchedulableSequenceBuilder::new(tokens.into(), max_output_tokens, block_size)
    }

    /// As [`builder`](Self::builder), from a prompt the sequence takes over
    /// or shares with its other holders ([`PromptTokens`]): a scheduler
    /// shares the request's prompt instead of copying it.
    pub fn builder_from_prompt(
        prompt: PromptTokens,
        max_output_tokens: usize,
        block_size: usize,
    ) -> SchedulableSequenceBuilder<M> {
        SchedulableSequenceBuilder::new(prompt, max_output_tokens, block_size)
    }

    /// A sequence of `prompt`, under its salt and block size, that takes
    /// the block hashes the prompt already has instead of hashing it again
    /// (see [`HashedPrompt`] for why those can be trusted); `headroom`
    /// tokens of the generation fit before its token buffer grows.
    pub fn from_hashed(
        prompt: &HashedPrompt,
        max_output_tokens: usize,
        headroom: usize,
        history: HistoryPolicy,
    ) -> Self {
        let inner = RequestSequence::from_hashed(prompt, max_output_tokens, headroom);
        Self::from_inner(inner, history)
    }

    pub(crate) fn from_inner(inner: RequestSequence<M>, policy: HistoryPolicy) -> Self {
        let mut history = EventLog::new(policy);
        history.record(SequenceEvent::Created {
            num_input_tokens: inner.num_input_tokens(),
            max_output_tokens: inner.max_output_tokens(),
            block_size: inner.block_size(),
        });
        Self {
            inner,
            state: SequenceState::Idle,
            kv_position: 0,
            bound: None,
            history,
        }
    }

    // ------------------------------------------------------------------
    // Scheduling state and positions
    // ------------------------------------------------------------------

    /// Idle, or the pending step.
    pub fn state(&self) -> SequenceState {
        self.state
    }

    /// Tokens whose KV is computed (by this request's steps or matched from
    /// the cache). Blocks below `kv_position / block_size` are registered.
    pub fn kv_position(&self) -> usize {
        self.kv_position
    }

    /// Tokens whose KV is not computed yet: `total_tokens - kv_position`.
    /// 1 while decoding (the tail token, fed to the next step).
    pub fn tail_tokens(&self) -> usize {
        self.inner.total_tokens() - self.kv_position
    }

    /// Tokens the prefill path computes before decoding can start: the
    /// prompt (`num_input_tokens`) before any token was generated, and
    /// everything but the tail token (`total_tokens - 1`) afterwards, which
    /// is what a preempted request recomputes.
    pub fn prefill_target(&self) -> usize {
        if self.inner.generated_tokens() == 0 {
            self.inner.num_input_tokens()
        } else {
            self.inner.total_tokens() - 1
        }
    }

    /// How far prefill got: `kv_position`, capped at the
    /// [`prefill_target`](Self::prefill_target).
    pub fn prefill_position(&self) -> usize {
        self.kv_position.min(self.prefill_target())
    }

    /// Tokens prefill (or recompute) still has to compute.
    pub fn remaining_prefill_tokens(&self) -> usize {
        self.prefill_target().saturating_sub(self.kv_position)
    }

    /// Whether `kv_position` reached the prefill target, so decode and
    /// speculative steps may be scheduled.
    pub fn is_prefill_complete(&self) -> bool {
        self.kv_position >= self.prefill_target()
    }

    /// Whether the chunk that completes prefill must carry the first
    /// generated token: nothing generated yet and output budget left. False
    /// for recompute after a preemption and for `max_output_tokens == 0`.
    pub fn final_chunk_emits_token(&self) -> bool {
        self.inner.generated_tokens() == 0 && self.inner.remaining_tokens() > 0
    }

    /// The event log.
    pub fn history(&self) -> &EventLog {
        &self.history
    }

    // ------------------------------------------------------------------
    // Forwarded from RequestSequence
    // ------------------------------------------------------------------

    /// Input plus generated tokens.
    pub fn total_tokens(&self) -> usize {
        self.inner.total_tokens()
    }

    /// Tokens the request was created with.
    pub fn num_input_tokens(&self) -> usize {
        self.inner.num_input_tokens()
    }

    /// Tokens generated so far.
    pub fn generated_tokens(&self) -> usize {
        self.inner.generated_tokens()
    }

    /// The output budget.
    pub fn max_output_tokens(&self) -> usize {
        self.inner.max_output_tokens()
    }

    /// Tokens that may still be generated.
    pub fn remaining_tokens(&self) -> usize {
        self.inner.remaining_tokens()
    }

    /// Whether the output budget is spent.
    pub fn is_complete(&self) -> bool {
        self.inner.is_complete()
    }

    /// Full token blocks in the sequence.
    pub fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }

    /// Registered or cache-matched blocks held.
    pub fn assigned_blocks(&self) -> usize {
        self.inner.assigned_blocks()
    }

    /// Staged blocks held (always 0 between calls: this layer stages and
    /// registers together).
    pub fn staged_blocks(&self) -> usize {
        self.inner.staged_blocks()
    }

    /// Allocated blocks not bound to a full, computed block yet.
    pub fn unassigned_blocks(&self) -> usize {
        self.inner.unassigned_blocks()
    }

    /// Every block held.
    pub fn held_blocks(&self) -> usize {
        self.inner.held_blocks()
    }

    /// Blocks matched from the cache by the current acquisition.
    pub fn prefix_matched_blocks(&self) -> usize {
        self.inner.prefix_matched_blocks()
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    /// The salt the block hashes are rooted in.
    pub fn salt(&self) -> Salt {
        self.inner.salt()
    }

    /// Every token, input then generated.
    pub fn tokens(&self) -> Tokens<'_> {
        self.inner.tokens()
    }

    /// The blocks backing the sequence in page order: the page table an
    /// attention kernel reads. While a step is scheduled it covers every
    /// slot the step writes.
    pub fn block_ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.inner.block_ids()
    }

    /// [`block_ids`](Self::block_ids) as raw page indices.
    pub fn page_indices(&self) -> Vec<u32> {
        self.inner.page_indices()
    }

    /// The underlying [`RequestSequence`] (tokens, hashes, block handles).
    /// There is deliberately no `inner_mut`: mutating it behind this layer's
    /// back would break `kv_position` and the block accounting.
    pub fn inner(&self) -> &RequestSequence<M> {
        &self.inner
    }

    // ------------------------------------------------------------------
    // Shared helpers
    // ------------------------------------------------------------------

    pub(crate) fn record(&mut self, event: SequenceEvent) {
        self.history.record(event);
    }

    pub(crate) fn require_idle(&self, operation: &'static str) -> Result<(), ScheduleError> {
        match self.state {
            SequenceState::Idle => Ok(()),
            state => Err(ScheduleError::NotIdle { operation, state }),
        }
    }

    pub(crate) fn require_idle_to_apply(&self, operation: &'static str) -> Result<(), ApplyError> {
        match self.state {
            SequenceState::Idle => Ok(()),
            actual => Err(ApplyError::WrongState {
                operation,
                expected: "Idle",
                actual,
            }),
        }
    }

    /// Refuses a manager whose blocks have another size, or (while blocks
    /// are held) another pool, before anything is mutated: the lower layer
    /// would notice too, but only after staging.
    pub(crate) fn check_manager(&self, manager: &BlockManager<M>) -> Result<(), SequenceError> {
        if manager.block_size() != self.inner.block_size() {
            return Err(SequenceError::BlockSizeMismatch {
                sequence: self.inner.block_size(),
                manager: manager.block_size(),
            });
        }
        match &self.bound {
            Some(bound) if self.inner.held_blocks() > 0 && !bound.same_pool(manager) => {
                Err(SequenceError::ForeignManager)
            }
            _ => Ok(()),
        }
    }

    /// Remembers `manager` as the one the held blocks come from (an `Arc`
    /// clone only when it changes).
    pub(crate) fn bind(&mut self, manager: &BlockManager<M>) {
        if !self.bound.as_ref().is_some_and(|b| b.same_pool(manager)) {
            self.bound = Some(manager.clone());
        }
    }

    /// Allocates the blocks needed to cover the first `num_tokens` slots, all
    /// or nothing; returns how many were allocated.
    pub(crate) fn allocate_to_cover(
        &mut self,
        num_tokens: usize,
        manager: &BlockManager<M>,
    ) -> Result<usize, ScheduleError> {
        let requested = self.inner.additional_blocks_needed(num_tokens);
        if requested == 0 {
            return Ok(0);
        }
        match self.inner.allocate_blocks(requested, manager) {
            Ok(()) => {
                self.bind(manager);
                Ok(requested)
            }
            Err(source @ SequenceError::AllocationFailed { .. }) => {
                let available = match &source {
                    SequenceError::AllocationFailed {
                        source: BlockError::InsufficientBlocks { available, .. },
                        ..
                    } => *available,
                    _ => manager.available_blocks(),
                };
                Err(ScheduleError::AllocationFailed {
                    requested,
                    available,
                    source,
                })
            }
            Err(other) => Err(ScheduleError::Sequence(other)),
        }
    }

    /// Stages and registers the blocks a `kv_position` of `kv_position`
    /// fully covers. Returns how many were registered.
    pub(crate) fn register_computed(
        &mut self,
        kv_position: usize,
        manager: &BlockManager<M>,
    ) -> Result<usize, SequenceError> {
        if self.registers_nothing_at(kv_position) {
            // Nothing newly computed to publish: most decode steps. Every
            // caller checked the manager already.
            return Ok(0);
        }
        self.inner
            .complete_and_register_up_to(kv_position / self.inner.block_size(), manager)
    }

    /// [`register_computed`](Self::register_computed), then the blocks
    /// layers of `kind` read no more once `kv_position` tokens are computed
    /// released, those registered just now straight into the cache.
    /// Returns how many were registered and how many released.
    pub(crate) fn register_computed_releasing(
        &mut self,
        kv_position: usize,
        kind: AttentionKind,
        manager: &BlockManager<M>,
    ) -> Result<(usize, usize), SequenceError> {
        let block_size = self.inner.block_size();
        let first = kind.first_needed_block(kv_position, block_size);
        if first <= self.inner.skipped_blocks() {
            // Nothing to release (`release_unread` would return early).
            return Ok((self.register_computed(kv_position, manager)?, 0));
        }
        if self.registers_nothing_at(kv_position) {
            // A window passing a block boundary inside a block.
            return Ok((0, self.inner.skip_to(first)));
        }
        self.inner
            .complete_register_and_skip_to(kv_position / block_size, first, manager)
    }

    /// Whether registering the computed blocks up to `kv_position` (what
    /// an apply reaching it does) would register nothing: every block it
    /// covers is registered already and none waits staged. A scheduler
    /// asks it to skip the bookkeeping of a registration that cannot
    /// happen, as most decode steps are.
    pub fn registers_nothing_at(&self, kv_position: usize) -> bool {
        let assignments = self.inner.assignments();
        kv_position / self.inner.block_size() <= assignments.assigned_end()
            && assignments.staged_count() == 0
    }
}

impl<M> fmt::Debug for SchedulableSequence<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SchedulableSequence")
            .field("state", &self.state)
            .field("kv_position", &self.kv_position)
            .field("total_tokens", &self.inner.total_tokens())
            .field("num_input_tokens", &self.inner.num_input_tokens())
            .field("max_output_tokens", &self.inner.max_output_tokens())
            .field("assigned", &self.inner.assigned_blocks())
            .field("unassigned", &self.inner.unassigned_blocks())
            .field("history", &self.history)
            .finish()
    }
}
