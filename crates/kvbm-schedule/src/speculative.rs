//! Speculative decode steps: `schedule_speculative` /
//! `apply_speculative`.

use kvbm_blocks::BlockManager;
use tracing::trace;

use crate::{
    ApplyError, DecodeOutcome, SchedulableSequence, ScheduleError, SequenceEvent, SequenceState,
};

impl<M> SchedulableSequence<M> {
    /// Schedules a speculative step verifying `num_draft_tokens` draft
    /// tokens: the forward pass computes the KV of the tail token and of
    /// every draft, so the blocks covering all their slots are allocated,
    /// all or nothing.
    ///
    /// The draft count is clamped to the output budget
    /// ([`remaining_tokens`](Self::remaining_tokens)): drafts that could
    /// never be accepted get no blocks. The clamped count is in
    /// [`state`](Self::state) and in the
    /// [`SpeculativeScheduled`](crate::SequenceEvent::SpeculativeScheduled)
    /// event.
    ///
    /// # Errors
    ///
    /// As [`schedule_decode`](Self::schedule_decode); nothing changes on
    /// error.
    pub fn schedule_speculative(
        &mut self,
        num_draft_tokens: usize,
        manager: &BlockManager<M>,
    ) -> Result<(), ScheduleError> {
        self.check_decode_preconditions("schedule_speculative")?;
        self.check_manager(manager)?;
        let num_tokens = num_draft_tokens.min(self.inner.remaining_tokens());
        let kv_position = self.kv_position;
        // Saturating: with `max_output_tokens` near `usize::MAX` the sum can
        // overflow, and a saturated count can never be allocated, so it is
        // refused as `AllocationFailed` with nothing changed.
        let blocks_allocated = self.allocate_to_cover(
            self.inner.total_tokens().saturating_add(num_tokens),
            manager,
        )?;
        self.state = SequenceState::SpeculativeScheduled {
            num_tokens,
            blocks_allocated,
        };
        trace!(
            kv_position,
            num_tokens, blocks_allocated, "speculative scheduled"
        );
        self.record(SequenceEvent::SpeculativeScheduled {
            requested: num_draft_tokens,
            num_tokens,
            kv_position,
            blocks_allocated,
        });
        Ok(())
    }

    /// Commits the scheduled speculative step with the `accepted` tokens (a
    /// prefix of the drafts, optionally ending with the token sampled after
    /// them, at most as many as were scheduled).
    ///
    /// The accepted tokens are appended; `kv_position` advances by
    /// `accepted.len()`, so the last accepted token is the new tail token and
    /// every block before it that is now full is registered. The blocks the
    /// rejected drafts would have used are given back, last allocated first;
    /// the block of the new tail token's slot is kept (the step wrote it).
    /// With no token accepted the tail token stays the tail.
    ///
    /// # Errors
    ///
    /// The schedule stays pending and nothing changes:
    /// - [`ApplyError::WrongState`] if no speculative step is scheduled;
    /// - [`ApplyError::AcceptedExceedsScheduled`] if more tokens are given
    ///   than drafts were scheduled;
    /// - [`ApplyError::Sequence`] for a manager of another block size or
    ///   pool than the blocks held.
    pub fn apply_speculative(
        &mut self,
        accepted: &[u32],
        manager: &BlockManager<M>,
    ) -> Result<DecodeOutcome, ApplyError> {
        let SequenceState::SpeculativeScheduled {
            num_tokens: scheduled,
            ..
        } = self.state
        else {
            return Err(ApplyError::WrongState {
                operation: "apply_speculative",
                expected: "SpeculativeScheduled",
                actual: self.state,
            });
        };
        if accepted.len() > scheduled {
            return Err(ApplyError::AcceptedExceedsScheduled {
                accepted: accepted.len(),
                scheduled,
            });
        }
        self.check_manager(manager)?;
        let old_total = self.inner.total_tokens();
        // Cannot fail: `scheduled` was clamped to the output budget.
        let filled = self.inner.append_tokens(accepted)?;
        let kv_position = self.kv_position + accepted.len();
        // The blocks to register need the accepted tokens' hashes, so this
        // runs after the append. It cannot fail once the manager is checked;
        // if it did, the append is rolled back so the schedule stays pending.
        let blocks_registered = match self.register_computed(kv_position, manager) {
            Ok(registered) => registered,
            Err(error) => {
                // Truncating back within the output tokens cannot fail.
                let _ = self.inner.truncate(old_total);
                return Err(error.into());
            }
        };
        let blocks_released = self
            .inner
            .release_unassigned_beyond(self.inner.total_tokens());
        self.kv_position = kv_position;
        self.state = SequenceState::Idle;
        self.record(SequenceEvent::SpeculativeApplied {
            accepted: accepted.len(),
            scheduled,
            kv_position,
            blocks_registered,
            blocks_released,
        });
        Ok(DecodeOutcome::new(
            !filled.is_empty(),
            self.inner.is_complete(),
        ))
    }
}
