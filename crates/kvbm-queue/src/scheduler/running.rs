//! [`Running`]: one admitted request, its sequence and what it owes the
//! engine this step.

use kvbm_blocks::{BlockId, BlockManager};
use kvbm_schedule::{ApplyError, SchedulableSequence, ScheduleError};

use super::{
    DecodeWork, EngineOutput, FinishReason, InferenceRequest, PrefillWork, RequestId, StepPlan,
    StepReport,
};
use crate::{Admitted, Priority};

/// What a running request was scheduled to do this step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Work {
    Prefill { tokens: usize, emits: bool },
    Decode,
}

impl Work {
    pub(super) fn tokens(self) -> usize {
        match self {
            Work::Prefill { tokens, .. } => tokens,
            Work::Decode => 1,
        }
    }

    pub(super) fn samples_token(self) -> bool {
        match self {
            Work::Prefill { emits, .. } => emits,
            Work::Decode => true,
        }
    }
}

pub(super) struct Running<M> {
    /// Its place in the waiting queue, to go back to if preempted.
    pub(super) admitted: Admitted<InferenceRequest>,
    pub(super) seq: SchedulableSequence<M>,
    /// Admission order: later admissions are preempted first.
    pub(super) admission: u64,
    pub(super) work: Option<Work>,
    /// Blocks of its table the engine was told about.
    known_blocks: usize,
    /// The engine has no table for it yet (new, or resumed after preemption).
    resumed: bool,
}

impl<M> Running<M> {
    pub(super) fn new(
        admitted: Admitted<InferenceRequest>,
        seq: SchedulableSequence<M>,
        admission: u64,
    ) -> Self {
        Self {
            admitted,
            seq,
            admission,
            work: None,
            known_blocks: 0,
            resumed: true,
        }
    }

    pub(super) fn id(&self) -> RequestId {
        self.admitted.id()
    }

    pub(super) fn priority(&self) -> Priority {
        self.admitted.priority()
    }

    pub(super) fn schedule(
        &mut self,
        manager: &BlockManager<M>,
        budget: usize,
        chunk_size: usize,
    ) -> Result<Option<Work>, ScheduleError> {
        Self::schedule_seq(&mut self.seq, manager, budget, chunk_size)
    }

    /// Schedules a decode, or the next prefill chunk while the prompt (or a
    /// recomputation) is incomplete; `None` if the budget allows nothing.
    pub(super) fn schedule_seq(
        seq: &mut SchedulableSequence<M>,
        manager: &BlockManager<M>,
        budget: usize,
        chunk_size: usize,
    ) -> Result<Option<Work>, ScheduleError> {
        if budget == 0 {
            return Ok(None);
        }
        if seq.is_prefill_complete() {
            seq.schedule_decode(manager)?;
            return Ok(Some(Work::Decode));
        }
        let remaining = seq.remaining_prefill_tokens();
        let tokens = remaining.min(chunk_size).min(budget);
        let emits = tokens == remaining && seq.final_chunk_emits_token();
        seq.schedule_prefill(tokens, manager)?;
        Ok(Some(Work::Prefill { tokens, emits }))
    }

    /// Records the scheduled work in the plan, with the blocks the engine
    /// does not know yet: new allocations sit at the end of the table.
    pub(super) fn push_work(&mut self, work: Work, plan: &mut StepPlan) {
        self.work = Some(work);
        let held = self.seq.held_blocks();
        let new_blocks: Vec<BlockId> = if self.resumed {
            self.seq.block_ids().collect()
        } else {
            let fresh = held.saturating_sub(self.known_blocks);
            let unassigned = self.seq.inner().assignments().unassigned();
            let skip = unassigned.len().saturating_sub(fresh);
            unassigned
                .skip(skip)
                .map(|block| block.block_id())
                .collect()
        };
        self.known_blocks = held;
        let resumed = std::mem::replace(&mut self.resumed, false);
        let id = self.id();
        match work {
            Work::Prefill { tokens, emits } => plan.prefill.push(PrefillWork {
                id,
                start: self.seq.kv_position(),
                num_tokens: tokens,
                emits_token: emits,
                new_blocks,
                resumed,
            }),
            Work::Decode => plan.decode.push(DecodeWork {
                id,
                position: self.seq.kv_position(),
                new_blocks,
                resumed,
            }),
        }
    }

    /// Fills `ids` with the staged and unassigned blocks, in table order:
    /// the ones a registration may publish.
    fn unregistered_block_ids(&self, ids: &mut Vec<BlockId>) {
        let assignments = self.seq.inner().assignments();
        ids.clear();
        ids.extend(assignments.staged().iter().map(|block| block.block_id()));
        ids.extend(assignments.unassigned().map(|block| block.block_id()));
    }

    /// Whether publishing blocks replaced any of them: a block whose content
    /// another request registered first is deduplicated onto that request's
    /// block (same KV), and the table entry changes.
    fn registration_swapped_blocks(&self, registered_before: usize, before: &[BlockId]) -> bool {
        let assigned: &[kvbm_blocks::BlockInfo] = self.seq.inner().assignments().assigned();
        let newly = assigned.get(registered_before..).unwrap_or(&[]);
        newly
            .iter()
            .zip(before)
            .any(|(now, &was)| now.block_id() != was)
    }

    /// Applies the engine's output to the scheduled work; `Some` when the
    /// request is done.
    ///
    /// `scratch` is a buffer the caller keeps between calls, so committing
    /// allocates nothing.
    pub(super) fn commit(
        &mut self,
        output: EngineOutput,
        manager: &BlockManager<M>,
        report: &mut StepReport,
        scratch: &mut Vec<BlockId>,
    ) -> Result<Option<FinishReason>, ApplyError> {
        let Some(work) = self.work.take() else {
            return Ok(None);
        };
        let registered_before = self.seq.assigned_blocks();
        self.unregistered_block_ids(scratch);
        match (work, output.token) {
            (Work::Prefill { emits, .. }, token) => {
                self.seq.apply_prefill(token, manager)?;
                if emits {
                    report.first_tokens.push(self.id());
                    report.generated_tokens += 1;
                }
            }
            (Work::Decode, Some(token)) => {
                self.seq.apply_decode(token, manager)?;
                report.generated_tokens += 1;
            }
            (Work::Decode, None) => {
                // `check_outputs` requires a token for every decode.
                self.work = Some(work);
                return Ok(None);
            }
        }
        if self.registration_swapped_blocks(registered_before, scratch) {
            // The engine must learn the new table before it runs us again.
            self.resumed = true;
        }
        let sampled = output.token.is_some();
        Ok(if sampled && output.stop {
            Some(FinishReason::Stop)
        } else if self.seq.is_prefill_complete() && self.seq.is_complete() {
            Some(FinishReason::MaxTokens)
        } else {
            None
        })
    }
}
