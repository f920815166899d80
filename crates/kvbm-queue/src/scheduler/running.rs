//! [`Running`]: one admitted request, its sequence and what it owes the
//! engine this step.

use kvbm_blocks::{BlockId, BlockManager};
use kvbm_schedule::{ApplyError, SchedulableSequence, ScheduleError, SequenceState};

use super::kv::RequestKv;
use super::{
    DecodeWork, EngineOutput, FinishReason, GroupBlocks, InferenceRequest, PrefillWork, RequestId,
    RolledBack, StepPlan, StepReport,
};
use crate::{Admitted, Priority};

/// What a running request was scheduled to do this step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Work {
    Prefill {
        tokens: usize,
        emits: bool,
    },
    Decode,
    /// A decode that also verifies `drafts` draft tokens.
    Speculative {
        drafts: usize,
    },
}

impl Work {
    pub(super) fn tokens(self) -> usize {
        match self {
            Work::Prefill { tokens, .. } => tokens,
            Work::Decode => 1,
            Work::Speculative { drafts } => drafts.saturating_add(1),
        }
    }

    pub(super) fn samples_token(self) -> bool {
        match self {
            Work::Prefill { emits, .. } => emits,
            Work::Decode | Work::Speculative { .. } => true,
        }
    }

    /// Draft tokens the engine may accept.
    pub(super) fn drafts(self) -> usize {
        match self {
            Work::Speculative { drafts } => drafts,
            Work::Prefill { .. } | Work::Decode => 0,
        }
    }
}

/// What one request may be scheduled within this step.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// Tokens left in the step's budget.
    pub(super) budget: usize,
    /// Most prompt tokens in one prefill chunk.
    pub(super) chunk_size: usize,
    /// Draft tokens per decode (0: no speculative decoding).
    pub(super) draft_tokens: usize,
    /// Available blocks drafts leave alone (the watermark): draft slots
    /// only take blocks above it.
    pub(super) draft_floor: usize,
}

pub(super) struct Running<M> {
    /// Its place in the waiting queue, to go back to if preempted.
    pub(super) admitted: Admitted<InferenceRequest>,
    pub(super) seq: RequestKv<M>,
    /// Admission order: later admissions are preempted first.
    pub(super) admission: u64,
    pub(super) work: Option<Work>,
    /// Where `work` went in the plan: its place in the plan's prefill list
    /// or decode list (which one, `work` says).
    planned_at: usize,
    /// Blocks of its table the engine was told about.
    known_blocks: usize,
    /// The engine has no table for it yet (new, or resumed after preemption).
    resumed: bool,
}

impl<M> Running<M> {
    pub(super) fn new(
        admitted: Admitted<InferenceRequest>,
        seq: RequestKv<M>,
        admission: u64,
    ) -> Self {
        Self {
            admitted,
            seq,
            admission,
            work: None,
            planned_at: 0,
            known_blocks: 0,
            resumed: true,
        }
    }

    /// Where the engine's output for its planned work is among outputs in
    /// the plan's order, its `prefills` prefills then its decodes (`None`
    /// with no work planned). The caller checks the id found there: a
    /// plan changed after the work was listed moves it.
    pub(super) fn output_in_plan_order(&self, prefills: usize) -> Option<usize> {
        match self.work? {
            Work::Prefill { .. } => Some(self.planned_at),
            Work::Decode | Work::Speculative { .. } => self.planned_at.checked_add(prefills),
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
        limits: Limits,
    ) -> Result<Option<Work>, ScheduleError> {
        Self::schedule_seq(&mut self.seq, manager, limits)
    }

    /// Schedules a decode (speculative when drafts are configured), or the
    /// next prefill chunk while the prompt (or a recomputation) is
    /// incomplete; `None` if the budget allows nothing.
    pub(super) fn schedule_seq(
        seq: &mut RequestKv<M>,
        manager: &BlockManager<M>,
        limits: Limits,
    ) -> Result<Option<Work>, ScheduleError> {
        let Limits {
            budget, chunk_size, ..
        } = limits;
        if budget == 0 {
            return Ok(None);
        }
        if seq.is_prefill_complete() {
            let accepted_max = Self::speculation_room(seq, manager, limits);
            if accepted_max == 0 {
                seq.schedule_decode(manager)?;
                return Ok(Some(Work::Decode));
            }
            // The sequence further clamps to its output budget.
            seq.schedule_speculative(accepted_max, manager)?;
            let drafts = match seq.state() {
                SequenceState::SpeculativeScheduled { num_tokens, .. } => {
                    num_tokens.saturating_sub(1)
                }
                _ => 0,
            };
            return Ok(Some(Work::Speculative { drafts }));
        }
        let remaining = seq.remaining_prefill_tokens();
        let tokens = remaining.min(chunk_size).min(budget);
        let emits = tokens == remaining && seq.final_chunk_emits_token();
        seq.schedule_prefill(tokens, manager)?;
        Ok(Some(Work::Prefill { tokens, emits }))
    }

    /// How many tokens a speculative decode may gain (drafts plus the token
    /// sampled after them); 0 for a plain decode. The budget counts drafts;
    /// the sequence must cover a slot for each of those tokens (the last
    /// is where the next step's tail token goes). Drafts are opportunistic:
    /// they only take blocks above the watermark, and shrink (to none)
    /// rather than make anyone wait or be preempted. Reads the pool only
    /// when drafts are configured.
    fn speculation_room(seq: &RequestKv<M>, manager: &BlockManager<M>, limits: Limits) -> usize {
        if limits.draft_tokens == 0 || limits.budget == 0 {
            return 0;
        }
        let drafts = limits.draft_tokens.min(limits.budget - 1);
        let mut room = manager
            .available_blocks()
            .saturating_sub(limits.draft_floor);
        // Every group takes a block for each block of slots the drafts
        // reach, so the room is shared among them.
        let groups = seq.sequences().len();
        if groups > 1 {
            room /= groups;
        }
        let coverable = seq
            .covered_blocks()
            .saturating_add(room)
            .saturating_mul(seq.block_size());
        drafts
            .saturating_add(1)
            .min(coverable.saturating_sub(seq.total_tokens()))
    }

    /// Records the scheduled work in the plan, with the blocks the engine
    /// does not know yet: new allocations sit at the end of the table.
    /// The block lists come from the plan's spares, so a reused plan
    /// allocates none once warm.
    pub(super) fn push_work(&mut self, work: Work, plan: &mut StepPlan) {
        self.work = Some(work);
        self.planned_at = match work {
            Work::Prefill { .. } => plan.prefill.len(),
            Work::Decode | Work::Speculative { .. } => plan.decode.len(),
        };
        let resumed = self.resumed;
        let known = self.known_blocks;
        // Most steps (decodes within a block) learn no block: their lists
        // stay unallocated.
        let list = |plan: &mut StepPlan, fresh: usize| {
            if resumed || fresh > 0 {
                plan.spare.block_ids()
            } else {
                Vec::new()
            }
        };
        let mut new_blocks;
        let mut groups = Vec::new();
        let (covered, start) = match &self.seq {
            RequestKv::One(seq) => {
                let held = seq.held_blocks();
                let fresh = held.saturating_sub(known);
                new_blocks = list(plan, fresh);
                Self::table_update(seq, resumed, fresh, &mut new_blocks);
                (held, seq.kv_position())
            }
            RequestKv::Groups(seq) => {
                // Every group's table covers as many blocks (released plus
                // held): the fresh ones are the last unassigned of each.
                let covered = self.seq.covered_blocks();
                let fresh = covered.saturating_sub(known);
                new_blocks = list(plan, fresh);
                // Most steps (decodes within a block) grow no group's
                // table: the plan lists no group, as vLLM's `new_block_ids`
                // is `None`, and a window's releases show in the next
                // update's `first_block`.
                if resumed || fresh > 0 {
                    groups = plan.spare.groups();
                    Self::group_updates(seq.sequences(), resumed, fresh, plan, &mut groups);
                    // `new_blocks` repeats the first group's.
                    if let Some(first) = groups.first() {
                        new_blocks.extend_from_slice(&first.new_blocks);
                    }
                }
                (covered, seq.kv_position())
            }
        };
        self.known_blocks = covered;
        self.resumed = false;
        let id = self.id();
        match work {
            Work::Prefill { tokens, emits } => plan.prefill.push(PrefillWork {
                id,
                start,
                num_tokens: tokens,
                emits_token: emits,
                new_blocks,
                resumed,
                groups,
            }),
            Work::Decode | Work::Speculative { .. } => plan.decode.push(DecodeWork {
                id,
                position: start,
                draft_tokens: work.drafts(),
                new_blocks,
                resumed,
                groups,
            }),
        }
    }

    /// Fills `groups` (a spare list: its entries are overwritten in place,
    /// their block lists kept) with each group's table update.
    fn group_updates(
        sequences: &[SchedulableSequence<M>],
        resumed: bool,
        fresh: usize,
        plan: &mut StepPlan,
        groups: &mut Vec<GroupBlocks>,
    ) {
        groups.truncate(sequences.len());
        for (i, group) in sequences.iter().enumerate() {
            if i == groups.len() {
                groups.push(GroupBlocks::new(0, plan.spare.block_ids()));
            }
            let Some(update) = groups.get_mut(i) else {
                continue;
            };
            update.first_block = group.inner().skipped_blocks();
            update.new_blocks.clear();
            Self::table_update(group, resumed, fresh, &mut update.new_blocks);
        }
    }

    /// Appends to `out` the blocks the engine learns for one table: the
    /// whole held table when it starts fresh, else the `fresh` blocks
    /// allocated last.
    // Inlined into `push_work`, its one caller, which runs for every
    // scheduled request: left alone, the inliner dropped it as unrelated
    // code changed.
    #[inline]
    fn table_update(
        seq: &SchedulableSequence<M>,
        resumed: bool,
        fresh: usize,
        out: &mut Vec<BlockId>,
    ) {
        if resumed {
            out.extend(seq.block_ids());
            return;
        }
        if fresh == 0 {
            return;
        }
        let unassigned = seq.inner().assignments().unassigned_ids();
        let skip = unassigned.len().saturating_sub(fresh);
        out.extend_from_slice(&unassigned[skip..]);
    }

    /// Fills `ids` with the staged and unassigned blocks, in table order,
    /// that applying `work` may publish or give back: all of them for a
    /// speculative step (a rollback gives back the table's tail), else the
    /// first ones the step's tokens can complete. A decode step of a
    /// request with many blocks allocated ahead copies two ids, not all.
    /// (The caller asks only for a step that may register.)
    fn unregistered_block_ids(
        seq: &SchedulableSequence<M>,
        work: Work,
        block_size: usize,
        ids: &mut Vec<BlockId>,
    ) {
        ids.clear();
        let assignments = seq.inner().assignments();
        let limit = match work {
            Work::Speculative { .. } => usize::MAX,
            // Staged blocks, the blocks the tokens fill (the first maybe
            // partly filled before), and one for a sampled token.
            Work::Prefill { .. } | Work::Decode => (assignments.staged_count())
                .saturating_add(work.tokens().div_ceil(block_size.max(1)))
                .saturating_add(2),
        };
        let staged = assignments.staged_ids().iter();
        let unassigned = assignments.unassigned_ids().iter();
        ids.extend(staged.chain(unassigned).take(limit));
    }

    /// Whether applying `work` surely registers no block of `seq`. A
    /// speculative step's end depends on what is accepted, so it may.
    fn registers_nothing(seq: &SchedulableSequence<M>, work: Work) -> bool {
        !matches!(work, Work::Speculative { .. })
            && seq.registers_nothing_at(seq.kv_position().saturating_add(work.tokens()))
    }

    /// Whether publishing blocks replaced any of them: a block whose content
    /// another request registered first is deduplicated onto that request's
    /// block (same KV), and the table entry changes.
    /// `registered_end` is the table index where the registered blocks
    /// ended before the step, `before[k]` the block at table index
    /// `registered_end + k` then. A window group may have released blocks
    /// since, up to past some of these: a released entry is one the engine
    /// never reads again, so it counts as unchanged.
    fn registration_swapped_blocks(
        seq: &SchedulableSequence<M>,
        registered_end: usize,
        before: &[BlockId],
    ) -> bool {
        let assignments = seq.inner().assignments();
        let assigned: &[kvbm_blocks::BlockInfo] = assignments.assigned();
        let skipped = assignments.skipped_count();
        // Table index `i` is `assigned[i - skipped]` now.
        let released = skipped.saturating_sub(registered_end).min(before.len());
        // Past the end (every entry released) when none is left to compare.
        let start = (registered_end.saturating_add(released))
            .checked_sub(skipped)
            .unwrap_or(usize::MAX);
        let newly = assigned.get(start..).unwrap_or(&[]);
        newly
            .iter()
            .zip(&before[released..])
            .any(|(now, &was)| now.block_id() != was)
    }

    /// Lists the blocks a speculative apply gave back (the last entries of
    /// the tables before it, which covered `covered_before` blocks;
    /// `unregistered` is the first table's unregistered tail then,
    /// `others` every other group's) and forgets them as known to the
    /// engine. A window's releases at its head do not count: they leave
    /// the covered blocks as they were.
    fn report_rolled_back(
        &mut self,
        covered_before: usize,
        unregistered: &[BlockId],
        others: &[(usize, Vec<BlockId>)],
        report: &mut StepReport,
    ) {
        let released = covered_before.saturating_sub(self.seq.covered_blocks());
        if released == 0 {
            return;
        }
        let tail = |ids: &[BlockId]| -> Vec<BlockId> {
            let start = ids.len().saturating_sub(released);
            ids[start..].iter().rev().copied().collect()
        };
        let blocks = tail(unregistered);
        let followers = self.seq.followers().len();
        let groups = match followers {
            0 => Vec::new(),
            _ => std::iter::once(blocks.clone())
                .chain(others.iter().take(followers).map(|(_, ids)| tail(ids)))
                .collect(),
        };
        self.known_blocks = self.known_blocks.saturating_sub(released);
        report.rolled_back.push(RolledBack {
            id: self.id(),
            blocks,
            groups,
        });
    }

    /// Whether its next step may run in place
    /// ([`decode_in_place`](Self::decode_in_place)): a decode that needs
    /// no block ([`SchedulableSequence::can_decode_within_blocks`]) of a
    /// request [`in_place_allowed`](Self::in_place_allowed).
    pub(super) fn may_decode_in_place(&self) -> bool {
        self.in_place_allowed() && self.seq.lead().can_decode_within_blocks()
    }

    /// What in-place decoding asks of the request itself, its blocks
    /// aside: a single-group sequence whose table the engine knows whole,
    /// with no step pending, whose next token is not its last (that step
    /// finishes it).
    pub(super) fn in_place_allowed(&self) -> bool {
        let RequestKv::One(seq) = &self.seq else {
            return false;
        };
        self.work.is_none()
            && !self.resumed
            && self.known_blocks == seq.held_blocks()
            && seq.generated_tokens().saturating_add(1) < seq.max_output_tokens()
    }

    /// Runs its next decode step, sampling `token`, if that step only
    /// computes one token's KV inside the blocks it holds
    /// ([`SchedulableSequence::decode_within_blocks`]): the sequence's
    /// part of a `step` + `apply` pair, with nothing for the plan to say.
    /// Whether it ran; if not, nothing changed.
    pub(super) fn decode_in_place(&mut self, token: u32) -> bool {
        match &mut self.seq {
            RequestKv::One(seq) => seq.decode_within_blocks(token),
            RequestKv::Groups(_) => false,
        }
    }

    /// Applies the engine's output to the scheduled work; `Some` when the
    /// request is done.
    ///
    /// `scratch` holds buffers the caller keeps between calls, so committing
    /// allocates nothing (except to report rolled-back blocks).
    ///
    /// Inlined into `apply`, its one caller, which runs it for every
    /// scheduled request: left to itself the inliner kept or dropped it as
    /// unrelated code moved (1.4% of the all-at-once replay's instructions).
    #[inline]
    pub(super) fn commit(
        &mut self,
        output: &EngineOutput,
        manager: &BlockManager<M>,
        report: &mut StepReport,
        scratch: &mut Scratch,
    ) -> Result<Option<FinishReason>, ApplyError> {
        let Some(work) = self.work.take() else {
            return Ok(None);
        };
        let lead = self.seq.lead();
        let registered_before = lead.inner().assignments().assigned_end();
        // Only a speculative step gives blocks back (see `report_rolled_back`).
        let covered_before = match work {
            Work::Speculative { .. } => self.seq.covered_blocks(),
            Work::Prefill { .. } | Work::Decode => 0,
        };
        let block_size = manager.block_size();
        // Groups advance alike: a step that registers nothing in the first
        // group (most decodes) registers nothing in any, so no table can
        // change under registration and no group's tail is worth a copy.
        let registers = !Self::registers_nothing(lead, work);
        scratch.blocks.clear();
        if registers {
            Self::unregistered_block_ids(lead, work, block_size, &mut scratch.blocks);
            // The other groups' tables, to see whether registration swapped
            // any of their blocks too. Entries past them keep their buffers.
            let others = self.seq.followers();
            if scratch.other_groups.len() < others.len() {
                scratch
                    .other_groups
                    .resize_with(others.len(), Default::default);
            }
            for (group, (registered, ids)) in others.iter().zip(&mut scratch.other_groups) {
                *registered = group.inner().assignments().assigned_end();
                Self::unregistered_block_ids(group, work, block_size, ids);
            }
        }
        match (work, output.token) {
            (Work::Speculative { drafts }, Some(token)) => {
                scratch.tokens.clear();
                scratch.tokens.extend_from_slice(&output.accepted_drafts);
                scratch.tokens.push(token);
                self.seq.apply_speculative(&scratch.tokens, manager)?;
                report.generated_tokens += scratch.tokens.len();
                report.verified_draft_tokens += drafts;
                report.accepted_draft_tokens += output.accepted_drafts.len();
                self.report_rolled_back(
                    covered_before,
                    &scratch.blocks,
                    &scratch.other_groups,
                    report,
                );
            }
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
            (Work::Decode | Work::Speculative { .. }, None) => {
                // `check_outputs` requires a token for every decode.
                self.work = Some(work);
                return Ok(None);
            }
        }
        let swapped = registers
            && (Self::registration_swapped_blocks(
                self.seq.lead(),
                registered_before,
                &scratch.blocks,
            ) || (self.seq.followers().iter())
                .zip(&scratch.other_groups)
                .any(|(group, (registered, ids))| {
                    Self::registration_swapped_blocks(group, *registered, ids)
                }));
        if swapped {
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

/// Buffers `commit` reuses across requests and steps.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    /// The unregistered tail of a table before its step is applied.
    pub(super) blocks: Vec<BlockId>,
    /// With KV cache groups, each group's but the first's registered end
    /// (table index) and unregistered tail before its step is applied.
    pub(super) other_groups: Vec<(usize, Vec<BlockId>)>,
    /// A speculative step's tokens: accepted drafts, then the sampled token.
    pub(super) tokens: Vec<u32>,
    /// Requests `apply` found done, by index in `running`, with why.
    pub(super) done: Vec<(usize, FinishReason)>,
    /// With tiers below the device: requests committed, by index in
    /// `running`, with the blocks they had registered before.
    pub(super) registered: Vec<(usize, usize)>,
}
