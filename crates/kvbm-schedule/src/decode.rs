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
        self.schedule_decode_checked(manager)
    }

    /// [`schedule_decode`](Self::schedule_decode) past its checks: also
    /// what a group following a lead that passed them runs (see
    /// `GroupedSequence`).
    #[inline(always)]
    pub(crate) fn schedule_decode_checked(
        &mut self,
        manager: &BlockManager<M>,
    ) -> Result<(), ScheduleError> {
        let kv_position = self.kv_position;
        // The tail token sits at slot `kv_position`, so cover
        // `kv_position + 1 == total_tokens` slots.
        let blocks_allocated = self.allocate_to_cover(self.inner.total_tokens(), manager)?;
        trace!(kv_position, blocks_allocated, "decode scheduled");
        self.decode_scheduled(blocks_allocated);
        Ok(())
    }

    /// [`schedule_decode_checked`](Self::schedule_decode_checked) of a
    /// group whose lead allocated nothing for the step: every group's table
    /// covers as many slots, so this one needs no block either (see
    /// `GroupedSequence`).
    #[inline(always)]
    pub(crate) fn schedule_decode_covered(&mut self) {
        debug_assert_eq!(
            (self.inner).additional_blocks_needed(self.inner.total_tokens()),
            0
        );
        self.decode_scheduled(0);
    }

    /// The end of every scheduled decode: the state and its record, with
    /// `blocks_allocated` for the tail token's slot.
    #[inline(always)]
    fn decode_scheduled(&mut self, blocks_allocated: usize) {
        self.state = SequenceState::DecodeScheduled { blocks_allocated };
        self.record(SequenceEvent::DecodeScheduled {
            kv_position: self.kv_position,
            blocks_allocated,
        });
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
        self.apply_decode_checked(token, manager)
    }

    /// [`apply_decode`](Self::apply_decode) past its checks: also what a
    /// group following a lead that passed them runs (see
    /// `GroupedSequence`).
    #[inline(always)]
    pub(crate) fn apply_decode_checked(
        &mut self,
        token: u32,
        manager: &BlockManager<M>,
    ) -> Result<DecodeOutcome, ApplyError> {
        let kv_position = self.kv_position + 1;
        let blocks_registered = self.register_computed(kv_position, manager)?;
        let block_completed = self.finish_decode(token, kv_position, blocks_registered)?;
        Ok(DecodeOutcome::new(
            block_completed,
            self.inner.is_complete(),
        ))
    }

    /// [`apply_decode_checked`](Self::apply_decode_checked) of a group
    /// whose lead's step registered nothing: groups register alike, so
    /// this one registers nothing either (see `GroupedSequence`).
    #[inline(always)]
    pub(crate) fn apply_decode_unregistered(&mut self, token: u32) -> Result<(), ApplyError> {
        let kv_position = self.kv_position + 1;
        debug_assert!(self.registers_nothing_at(kv_position));
        self.finish_decode(token, kv_position, 0)?;
        Ok(())
    }

    /// The end of every applied decode, its blocks registered: `token`
    /// appended, KV computed up to `kv_position`, recorded; whether a block
    /// filled.
    #[inline(always)]
    fn finish_decode(
        &mut self,
        token: u32,
        kv_position: usize,
        blocks_registered: usize,
    ) -> Result<bool, ApplyError> {
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
        Ok(block_completed)
    }

    /// A decode step that needs no block, in one call:
    /// [`schedule_decode`](Self::schedule_decode) then
    /// [`apply_decode`](Self::apply_decode) of `token`, with the same
    /// effects and history, when the tail token's slot lies in a held block
    /// and computing its KV completes no block (nothing to allocate or
    /// register, so no manager is needed). Returns whether it ran; if not,
    /// nothing changed, and the pair (or the refusal it gives) is what to
    /// use.
    ///
    /// A simulator steps most decodes this way (`kvbm-queue`'s
    /// `Scheduler::run_decodes_in_place`): the pair's checks of the manager,
    /// its allocation and registration passes are most of a decode's cost
    /// and find nothing to do here.
    ///
    /// ```
    /// # use kvbm_blocks::BlockManager;
    /// # use kvbm_schedule::SchedulableSequence;
    /// let manager = BlockManager::<()>::builder().block_count(8).block_size(4).build()?;
    /// let mut seq = SchedulableSequence::<()>::new(vec![1, 2], 8, 4)?;
    /// seq.schedule_prefill(2, &manager)?;
    /// seq.apply_prefill(Some(3), &manager)?;
    /// // Slot 2 is in the held block; computing it completes nothing.
    /// assert!(seq.decode_within_blocks(4));
    /// assert_eq!(seq.kv_position(), 3);
    /// // Slot 3 completes the block: that step registers it.
    /// assert!(!seq.decode_within_blocks(5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decode_within_blocks(&mut self, token: u32) -> bool {
        if !self.can_decode_within_blocks() {
            return false;
        }
        let kv_position = self.kv_position;
        let next = kv_position.saturating_add(1);
        // The budget was checked above: this cannot fail.
        let Ok(filled) = self.inner.append_token(token) else {
            return false;
        };
        self.record(SequenceEvent::DecodeScheduled {
            kv_position,
            blocks_allocated: 0,
        });
        self.kv_position = next;
        trace!(kv_position = next, "decoded within its blocks");
        self.record(SequenceEvent::DecodeApplied {
            token,
            kv_position: next,
            blocks_registered: 0,
            block_completed: filled.is_some(),
        });
        true
    }

    /// Whether [`decode_within_blocks`](Self::decode_within_blocks) would
    /// run now: a decode may be scheduled, its slot lies in a held block,
    /// and computing it completes no block. Changes nothing.
    pub fn can_decode_within_blocks(&self) -> bool {
        if self
            .check_decode_preconditions("decode_within_blocks")
            .is_err()
        {
            return false;
        }
        self.inner
            .additional_blocks_needed(self.inner.total_tokens())
            == 0
            && self.registers_nothing_at(self.kv_position.saturating_add(1))
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
