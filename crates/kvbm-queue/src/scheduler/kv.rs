//! [`RequestKv`]: a request's KV bookkeeping, for a model of one
//! full-attention group (today's sequence, untouched) or of several KV
//! cache groups (a [`GroupedSequence`]).

use kvbm_blocks::{BlockId, BlockManager};
use kvbm_schedule::{
    ApplyError, DecodeOutcome, GroupedSequence, SchedulableSequence, ScheduleError, SequenceState,
};
use kvbm_sequence::{RequestSequence, Tokens};

/// One request's sequence. A single full-attention group keeps the plain
/// sequence, so such models pay one predictable branch per call and
/// nothing else for groups existing.
// The large variant is the common one, kept inline on purpose: boxing it
// would put a pointer chase on every single-group request's calls.
#[allow(clippy::large_enum_variant)]
pub(super) enum RequestKv<M> {
    One(SchedulableSequence<M>),
    Groups(GroupedSequence<M>),
}

/// Forwards a call to whichever sequence the request has.
macro_rules! forward {
    ($self:ident, $seq:ident => $call:expr) => {
        match $self {
            RequestKv::One($seq) => $call,
            RequestKv::Groups($seq) => $call,
        }
    };
}

impl<M> RequestKv<M> {
    /// One sequence per group, in group order (one for a plain sequence).
    pub(super) fn sequences(&self) -> &[SchedulableSequence<M>] {
        match self {
            Self::One(seq) => std::slice::from_ref(seq),
            Self::Groups(seq) => seq.sequences(),
        }
    }

    /// The first group's sequence: tokens, positions and state are the same
    /// in every group.
    pub(super) fn lead(&self) -> &SchedulableSequence<M> {
        match self {
            Self::One(seq) => seq,
            Self::Groups(seq) => &seq.sequences()[0],
        }
    }

    /// Every group's sequence but the first's, in group order (none for a
    /// plain sequence).
    pub(super) fn followers(&self) -> &[SchedulableSequence<M>] {
        match self {
            Self::One(_) => &[],
            Self::Groups(seq) => seq.sequences().get(1..).unwrap_or_default(),
        }
    }

    /// The first group's tokens, hashes and blocks (the tiers and the
    /// router's view: a model with groups has no tiers).
    pub(super) fn inner(&self) -> &RequestSequence<M> {
        self.lead().inner()
    }

    /// Blocks the first group's table covers: released (skipped) plus held.
    /// Every group covers as many (they allocate for the same slots), so
    /// this says how far the engine's tables reach.
    pub(super) fn covered_blocks(&self) -> usize {
        let lead = self.lead();
        lead.inner().skipped_blocks() + lead.held_blocks()
    }

    /// Every block id held, over all groups.
    pub(super) fn all_block_ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.sequences()
            .iter()
            .flat_map(SchedulableSequence::block_ids)
    }

    pub(super) fn held_blocks(&self) -> usize {
        forward!(self, seq => seq.held_blocks())
    }

    pub(super) fn kv_position(&self) -> usize {
        forward!(self, seq => seq.kv_position())
    }

    pub(super) fn total_tokens(&self) -> usize {
        forward!(self, seq => seq.total_tokens())
    }

    pub(super) fn generated_tokens(&self) -> usize {
        forward!(self, seq => seq.generated_tokens())
    }

    pub(super) fn remaining_tokens(&self) -> usize {
        forward!(self, seq => seq.remaining_tokens())
    }

    pub(super) fn remaining_prefill_tokens(&self) -> usize {
        forward!(self, seq => seq.remaining_prefill_tokens())
    }

    pub(super) fn is_prefill_complete(&self) -> bool {
        forward!(self, seq => seq.is_prefill_complete())
    }

    pub(super) fn is_complete(&self) -> bool {
        forward!(self, seq => seq.is_complete())
    }

    pub(super) fn final_chunk_emits_token(&self) -> bool {
        forward!(self, seq => seq.final_chunk_emits_token())
    }

    pub(super) fn block_size(&self) -> usize {
        forward!(self, seq => seq.block_size())
    }

    pub(super) fn state(&self) -> SequenceState {
        forward!(self, seq => seq.state())
    }

    pub(super) fn tokens(&self) -> Tokens<'_> {
        forward!(self, seq => seq.tokens())
    }

    pub(super) fn match_and_add_prefix(
        &mut self,
        manager: &BlockManager<M>,
    ) -> Result<usize, ScheduleError> {
        forward!(self, seq => seq.match_and_add_prefix(manager))
    }

    pub(super) fn reacquire(&mut self, manager: &BlockManager<M>) -> Result<usize, ScheduleError> {
        forward!(self, seq => seq.reacquire(manager))
    }

    pub(super) fn release(&mut self) -> Result<(), ApplyError> {
        forward!(self, seq => seq.release())
    }

    pub(super) fn revert_schedule(&mut self) -> Result<(), ApplyError> {
        forward!(self, seq => seq.revert_schedule())
    }

    pub(super) fn schedule_prefill(
        &mut self,
        num_tokens: usize,
        manager: &BlockManager<M>,
    ) -> Result<(), ScheduleError> {
        forward!(self, seq => seq.schedule_prefill(num_tokens, manager))
    }

    pub(super) fn schedule_decode(
        &mut self,
        manager: &BlockManager<M>,
    ) -> Result<(), ScheduleError> {
        forward!(self, seq => seq.schedule_decode(manager))
    }

    pub(super) fn schedule_speculative(
        &mut self,
        num_draft_tokens: usize,
        manager: &BlockManager<M>,
    ) -> Result<(), ScheduleError> {
        forward!(self, seq => seq.schedule_speculative(num_draft_tokens, manager))
    }

    pub(super) fn apply_prefill(
        &mut self,
        token: Option<u32>,
        manager: &BlockManager<M>,
    ) -> Result<(), ApplyError> {
        forward!(self, seq => seq.apply_prefill(token, manager))
    }

    pub(super) fn apply_decode(
        &mut self,
        token: u32,
        manager: &BlockManager<M>,
    ) -> Result<DecodeOutcome, ApplyError> {
        forward!(self, seq => seq.apply_decode(token, manager))
    }

    pub(super) fn apply_speculative(
        &mut self,
        accepted: &[u32],
        manager: &BlockManager<M>,
    ) -> Result<DecodeOutcome, ApplyError> {
        forward!(self, seq => seq.apply_speculative(accepted, manager))
    }
}
