//! Lookups by request id, O(1) through the position index, and what an
//! engine's attention kernels need for the pending step: block tables and
//! slot mappings.

use kvbm_blocks::BlockId;
use kvbm_sequence::Tokens;

use super::running::Running;
use super::{RequestId, Scheduler, SchedulerError, StepPlan};

/// The slot written for a planned token whose request left after planning
/// (aborted or cancelled mid-step): vLLM's `PAD_SLOT_ID` (-1) as unsigned.
pub const PAD_SLOT: u64 = u64::MAX;

impl<M> Scheduler<M> {
    /// Where `id` is in `running`.
    pub(super) fn position(&self, id: RequestId) -> Option<usize> {
        self.running.position(id)
    }

    fn find(&self, id: RequestId) -> Option<&Running<M>> {
        self.running
            .get(self.position(id)?)
            .map(|running| &**running)
    }

    /// The ids of the running requests (`len()` is how many run).
    pub fn running_ids(&self) -> impl ExactSizeIterator<Item = RequestId> + '_ {
        self.running.iter().map(|running| running.id())
    }

    /// Whether `id` is running (admitted and holding blocks).
    pub fn is_running(&self, id: RequestId) -> bool {
        self.find(id).is_some()
    }

    /// The full block table of a running request (its page indices in
    /// order); with KV cache groups, the first group's held entries (see
    /// [`group_block_table`](Self::group_block_table)).
    pub fn block_table(&self, id: RequestId) -> Option<Vec<BlockId>> {
        Some(self.find(id)?.seq.lead().block_ids().collect())
    }

    /// A running request's table in KV cache group `group`
    /// ([`with_kv_groups`](Self::with_kv_groups)): the index of its first
    /// held entry (a window group released those before) and the blocks
    /// from there on. Group 0 of a model without groups is
    /// [`block_table`](Self::block_table) from entry 0.
    pub fn group_block_table(&self, id: RequestId, group: usize) -> Option<(usize, Vec<BlockId>)> {
        let seq = self.find(id)?.seq.sequences().get(group)?;
        Some((seq.inner().skipped_blocks(), seq.block_ids().collect()))
    }

    /// Blocks the running requests hold in each KV cache group (one entry
    /// without groups): what each group's layers take of the pool now.
    /// [`held_blocks_by_group_into`](Self::held_blocks_by_group_into)
    /// fills a buffer instead of allocating.
    pub fn held_blocks_by_group(&self) -> Vec<usize> {
        let mut held = Vec::new();
        self.held_blocks_by_group_into(&mut held);
        held
    }

    /// [`held_blocks_by_group`](Self::held_blocks_by_group) written to
    /// `held` (cleared first, then one entry per group), allocating
    /// nothing once `held` is large enough: for a caller that reads it
    /// every step.
    pub fn held_blocks_by_group_into(&self, held: &mut Vec<usize>) {
        let groups = self.groups.as_ref().map_or(1, |groups| groups.len());
        held.clear();
        held.resize(groups, 0);
        for running in &self.running {
            for (count, seq) in held.iter_mut().zip(running.seq.sequences()) {
                *count += seq.held_blocks();
            }
        }
    }

    /// Tokens of a running request so far (prompt and generated).
    pub fn tokens(&self, id: RequestId) -> Option<Tokens<'_>> {
        Some(self.find(id)?.seq.tokens())
    }

    /// Appends the KV slots (`block id × block size + offset in block`) of the
    /// tokens `id` computes in the pending step, in position order, and
    /// returns how many; `None` if it is not running or has no work this
    /// step.
    pub fn request_slots(&self, id: RequestId, out: &mut Vec<u64>) -> Option<usize> {
        let running = self.find(id)?;
        let tokens = running.work?.tokens();
        self.push_slots(running, 0, tokens, out);
        Some(tokens)
    }

    /// The flat slot mapping of the pending step (vLLM's `slot_mapping`):
    /// the KV slot of every token `plan` computes, in the plan's order
    /// (prefill entries, then decodes), written to `out` (cleared first).
    /// Tokens of a request that left after planning get [`PAD_SLOT`].
    ///
    /// O(tokens + blocks touched), with no allocation once `out` is large
    /// enough.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::NoStepPending`] if no step awaits `apply`, and
    /// [`SchedulerError::StalePlan`] if `plan` is not the pending step's.
    pub fn slot_mapping(&self, plan: &StepPlan, out: &mut Vec<u64>) -> Result<(), SchedulerError> {
        self.group_slot_mapping(plan, 0, out)
    }

    /// [`slot_mapping`](Self::slot_mapping) in KV cache group `group`
    /// ([`with_kv_groups`](Self::with_kv_groups)): each group's layers write
    /// their KV into that group's blocks. Group 0 is `slot_mapping`; a group
    /// the model does not have pads every token with [`PAD_SLOT`].
    ///
    /// # Errors
    ///
    /// As [`slot_mapping`](Self::slot_mapping).
    pub fn group_slot_mapping(
        &self,
        plan: &StepPlan,
        group: usize,
        out: &mut Vec<u64>,
    ) -> Result<(), SchedulerError> {
        let Some(pending) = self.pending.as_ref() else {
            return Err(SchedulerError::NoStepPending);
        };
        if plan.step != pending.step {
            return Err(SchedulerError::StalePlan {
                plan: plan.step,
                pending: pending.step,
            });
        }
        out.clear();
        let prefill = plan.prefill.iter().map(|p| (p.id, p.num_tokens));
        let decode = plan.decode.iter().map(|d| (d.id, d.num_tokens()));
        for (id, tokens) in prefill.chain(decode) {
            match self.find(id).filter(|running| running.work.is_some()) {
                Some(running) => self.push_slots(running, group, tokens, out),
                None => out.extend(std::iter::repeat_n(PAD_SLOT, tokens)),
            }
        }
        Ok(())
    }

    fn push_slots(&self, running: &Running<M>, group: usize, tokens: usize, out: &mut Vec<u64>) {
        let block_size = self.manager.block_size();
        let start = running.seq.kv_position();
        let end = start.saturating_add(tokens);
        let mut position = start;
        // Scheduled work always has its blocks allocated; a table shorter
        // than the work (never expected) pads instead of panicking.
        let Some(seq) = running.seq.sequences().get(group) else {
            out.extend(std::iter::repeat_n(PAD_SLOT, tokens));
            return;
        };
        let first = seq.inner().skipped_blocks();
        let mut pages = (seq.block_ids()).skip((start / block_size).saturating_sub(first));
        while position < end {
            let page_end = (position / block_size + 1)
                .saturating_mul(block_size)
                .min(end);
            let Some(block) = pages.next() else {
                out.extend(std::iter::repeat_n(PAD_SLOT, end - position));
                return;
            };
            let base = u64::from(block.get()).saturating_mul(block_size as u64);
            out.extend(
                (position % block_size..(page_end - 1) % block_size + 1)
                    .map(|offset| base.saturating_add(offset as u64)),
            );
            position = page_end;
        }
    }
}
