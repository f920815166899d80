//! Single-token decode steps: `schedule_decode` / `apply_decode`, and the
//! preconditions decode and speculative steps share.

use kvbm_blocks::BlockManager;
use tracing::trace;

use crate::{
    ApplyError, DecodeOutcome, SchedulableSequence, ScheduleError, SequenceEvent, SequenceState,
};

impl<M> SchedulableSequence<M> {
    /// Schedules one decode step: the forward pass computes the KV of the
    /// tail token and samples the next token. Allocates the block of the
    /// tail token's slot if it starts a new block (the "generation block";
    /// after a [`reacquire`](Self::reacquire) this is where it comes from).
    ///
    /// # Errors
    ///
    /// Nothing changes on error:
    /// - [`ScheduleError::NotIdle`] if a step is pending;
    /// - [`ScheduleError::PrefillNotComplete`] if prefill or recompute
    ///   chunks are still due;
    /// - [`ScheduleError::GenerationComplete`] if the output budget is spent;
    /// - [`ScheduleError::WrongDanglingCount`] unless exactly one tail token
    ///   waits (0 for an empty prompt);
    /// - [`ScheduleError::AllocationFailed`] if the manager cannot supply the
    ///   block;
    /// - [`ScheduleError::Sequence`] for a manager of another block size or
    ///   pool.
    pub fn schedule_decode(&mut self, manager: &BlockManager<M>) -> Result<(), ScheduleError> {
        self.check_decode_preconditions("schedule_decode")?;
        self.check_manager(manager)?;
        let kv_position = self.kv_position;
        // The tail token sits at slot `kv_position`, so cover
        // `kv_position + 1 == total_tokens` slots.
        let blocks_allocated = self.allocate_to_cover(self.inner.total_tokens(), manager)?;
        self.state = SequenceState::DecodeScheduled { blocks_allocated };
        trace!(kv_position, blocks_allocated, "decode scheduled");
        self.record(SequenceEvent::DecodeScheduled {
            kv_position,
            blocks_allocated,
        });
        Ok(())
    }

    /// Commits the scheduled decode step: the tail token's KV is computed
    /// (`kv_position` advances by one, registering the block it completes,
    /// if any) and `token`, the sampled one, becomes the new tail token.
    ///
    /// Returns whether `token` filled a block (registered by the next step,
    /// see [`DecodeOutcome`]) and whether the output budget is now spent.
    ///
    /// # Errors
    ///
    /// The schedule stays pending and nothing changes:
    /// - [`ApplyError::WrongState`] if no decode step is scheduled;
    /// - [`ApplyError::Sequence`] for a manager of another block size or
    ///   pool than the blocks held.
    pub fn apply_decode(
        &mut self,
        token: u32,
        manager: &BlockManager<M>,
    ) -> Result<DecodeOutcome, ApplyError> {
        if !matches!(self.state, SequenceState::DecodeScheduled { .. }) {
            return Err(ApplyError::WrongState {
                operation: "apply_decode",
                expected: "DecodeScheduled",
                actual: self.state,
            });
        }
        self.check_manager(manager)?;
        let kv_position = self.kv_position + 1;
        let blocks_registered = self.register_computed(kv_position, manager)?;
        // Cannot fail: the schedule checked that budget is left.
        let block_completed = self.inner.append_token(token)?.is_some();
        self.kv_position = kv_position;
        self.state = SequenceState::Idle;
        self.record(SequenceEvent::DecodeApplied {
            token,
            kv_position,
            blocks_registered,
            block_completed,
        });
        Ok(DecodeOutcome::new(
            block_completed,
            self.inner.is_complete(),
        ))
    }

    /// What decode and speculative steps need: idle, prefill done, budget
    /// left, exactly one tail token.
    pub(crate) fn check_decode_preconditions(
        &self,
        operation: &'static str,
    ) -> Result<(), ScheduleError> {
        self.require_idle(operation)?;
        if !self.is_prefill_complete() {
            return Err(ScheduleError::PrefillNotComplete {
                kv_position: self.kv_position,
                prefill_target: self.prefill_target(),
            });
        }
        if self.inner.is_complete() {
            return Err(ScheduleError::GenerationComplete {
                generated_tokens: self.inner.generated_tokens(),
                max_output_tokens: self.inner.max_output_tokens(),
            });
        }
        match self.tail_tokens() {
            1 => Ok(()),
            actual => Err(ScheduleError::WrongDanglingCount {
                expected: 1,
                actual,
            }),
        }
    }
}
