//! Admission: waiting requests become running ones, in queue order, within the step's limits.

use kvbm_schedule::{GroupedSequence, HistoryPolicy, SchedulableSequence, ScheduleError};
use kvbm_sequence::PromptTokens;
use tracing::{debug, debug_span};

use super::kv::RequestKv;
use super::running::Running;
use super::{FinishReason, InferenceRequest, Parked, Preemption, Scheduler, StepPlan};
use crate::{Admitted, Request, Selection};

/// Generated tokens a new sequence has room for before its token buffer
/// grows (at most this many, however many it may generate). Growing copies
/// the whole prompt, so the room is sized for most chat outputs (on the
/// conversation trace 99% of requests generate at most 1,120 tokens, the
/// longest 2,000; with room for 512, 39% of requests copied their prompt):
/// 8 KiB of tokens and 128 block slots per request, whatever it generates.
const GENERATION_HEADROOM: usize = 2048;

impl<M> Scheduler<M> {
    /// Admits waiting requests in queue order while slots, tokens and blocks
    /// allow; then, under [`Preemption::ByPriority`], the blocked head of the
    /// queue by preempting less urgent running requests.
    pub(super) fn admit(&mut self, budget: &mut usize, plan: &mut StepPlan) {
        let admitted_before = self.running.len();
        if self.config.prefix_credit && self.config.selection == Selection::HeadOfLine {
            self.admit_with_credit(budget, plan);
        } else {
            self.admit_in_order(budget, plan);
        }
        if self.config.preemption == Preemption::ByPriority {
            self.admit_by_priority(admitted_before, budget, plan);
        }
    }

    /// Blocks admission may hand out: the available ones above the watermark.
    pub(super) fn admission_room(&self) -> u64 {
        // The watermark keeps room for running requests to grow into; with
        // none running it would only keep a large request waiting forever.
        let watermark = if self.running.is_empty() {
            0
        } else {
            self.config.watermark(self.manager.total_blocks())
        };
        self.manager.available_blocks().saturating_sub(watermark) as u64
    }

    /// The slots left under `max_running` (onboarding requests hold
    /// theirs).
    pub(super) fn free_slots(&self) -> usize {
        (self.config.max_running)
            .saturating_sub(self.running.len())
            .saturating_sub(self.onboarding.len())
    }

    fn admit_in_order(&mut self, budget: &mut usize, plan: &mut StepPlan) {
        let slots = self.free_slots();
        if slots == 0 || *budget == 0 {
            return;
        }
        let blocks = self.admission_room();
        // With groups the queue's estimates are not the groups' needs:
        // `admission_cost` judges each candidate.
        let select = if self.groups.is_some() {
            u64::MAX
        } else {
            blocks
        };
        let mut candidates = self
            .queue
            .select_batch(slots, select)
            .split_off(0)
            .into_iter();
        let mut room = blocks;
        while let Some(admitted) = candidates.next() {
            let Some(cost) = self.admission_cost(&admitted, plan) else {
                continue;
            };
            if *budget == 0 || cost > room {
                // Head of line: it and everyone behind it keep their places,
                // and a preempted one is not reacquired just to be released.
                self.requeue(admitted, None);
                for admitted in candidates.by_ref() {
                    self.requeue(admitted, None);
                }
                break;
            }
            room -= cost;
            if self.start(admitted, budget, plan).is_none() {
                // Head of line again: everyone behind it keeps their place.
                for admitted in candidates.by_ref() {
                    self.requeue(admitted, None);
                }
            }
        }
    }

    /// The blocks a candidate is charged: the queue's estimate (prompt plus a
    /// generation reserve) for a new request; for a preempted one, what it
    /// must recompute too. `None` if it was finished instead (a preempted
    /// request that outgrew the whole pool).
    pub(super) fn admission_cost(
        &mut self,
        admitted: &Admitted<InferenceRequest>,
        plan: &mut StepPlan,
    ) -> Option<u64> {
        let id = admitted.id();
        match self.parked.get(&id).map(|p| self.resume_blocks(&p.seq)) {
            None if self.groups.is_some() => {
                let request = admitted.request();
                let tokens = request.prompt().len() as u64;
                let cost = self.grouped_blocks(tokens, request.max_new_tokens());
                if cost.is_none() {
                    debug!(%id, "request does not fit the block pool in its KV cache groups");
                    plan.finished
                        .push(self.exit(id, FinishReason::CapacityExceeded, 0));
                }
                cost
            }
            None => Some(admitted.blocks()),
            Some(Some(cost)) => Some(cost),
            Some(None) => {
                // Preempted after outgrowing the whole pool: it can never
                // run again, and waiting would block the line behind it.
                let generated = (self.parked.remove(&id)).map_or(0, |p| p.seq.generated_tokens());
                debug!(%id, "preempted request outgrew the block pool");
                plan.finished
                    .push(self.exit(id, FinishReason::CapacityExceeded, generated));
                None
            }
        }
    }

    /// Starts (or resumes) a candidate and schedules its first chunk, or
    /// onboards it; the blocks it took beyond its matched prefix, or `None`
    /// if its first chunk could not be allocated, in which case the
    /// candidate is back at its queue place.
    pub(super) fn start(
        &mut self,
        admitted: Admitted<InferenceRequest>,
        budget: &mut usize,
        plan: &mut StepPlan,
    ) -> Option<usize> {
        match self.candidate(&admitted, plan) {
            Some(candidate) => self.start_seq(admitted, candidate, budget, plan, true),
            None => Some(0),
        }
    }

    /// The sequence of an admitted request, holding its cached prefix; `None`
    /// if it cannot start at all (unreachable for requests `submit`
    /// accepts), in which case it has left, reported in `plan`.
    fn candidate(
        &mut self,
        admitted: &Admitted<InferenceRequest>,
        plan: &mut StepPlan,
    ) -> Option<Parked<M>> {
        match self.resume_or_start(admitted) {
            Ok(candidate) => Some(candidate),
            Err(err) => {
                debug!(id = %admitted.id(), %err, "request cannot start");
                plan.finished
                    .push(self.exit(admitted.id(), FinishReason::Aborted, 0));
                None
            }
        }
    }

    /// Puts a candidate that was not started back at its queue place, its
    /// blocks released (the registered ones stay cached) and its sequence
    /// parked for the next try.
    fn put_back(&mut self, admitted: Admitted<InferenceRequest>, mut parked: Parked<M>) {
        let _ = parked.seq.release();
        self.requeue(admitted, Some(parked));
    }

    /// Schedules the first chunk of a candidate whose sequence holds its
    /// cached prefix, or (with `onboard` and tiers below the device that
    /// hold more of its prefix) has it wait for loads; as
    /// [`start`](Self::start).
    pub(super) fn start_seq(
        &mut self,
        admitted: Admitted<InferenceRequest>,
        candidate: Parked<M>,
        budget: &mut usize,
        plan: &mut StepPlan,
        onboard: bool,
    ) -> Option<usize> {
        if onboard && let Some(tiers) = &mut self.tiers {
            for group in candidate.seq.sequences() {
                tiers.record_hits(group.inner().assignments().assigned());
            }
        }
        let (admitted, mut candidate) = if onboard && candidate.onboard && self.tiers.is_some() {
            let id = admitted.id();
            match self.try_onboard(admitted, candidate) {
                Ok(loading) => {
                    plan.onboarding.push(id);
                    return Some(loading);
                }
                Err(back) => back,
            }
        } else {
            (admitted, candidate)
        };
        let id = admitted.id();
        let matched = candidate.seq.held_blocks();
        let admitted_before = candidate.admitted_before;
        let prompt = candidate.seq.total_tokens() as u64;
        let hits = candidate.seq.kv_position() as u64;
        let limits = self.config.limits(*budget, self.manager.total_blocks());
        match Running::schedule_seq(&mut candidate.seq, &self.manager, limits) {
            Ok(Some(work)) => {
                *budget -= work.tokens();
                self.counters.prompt_tokens += prompt;
                self.counters.prefix_hit_tokens += hits;
                if !admitted_before {
                    self.counters.prefix_cache_queries += prompt;
                    self.counters.prefix_cache_hits += hits;
                }
                let _span =
                    debug_span!("admitted", %id, prompt, hits, resumed = admitted_before).entered();
                let mut running = Running::new(admitted, candidate.seq, self.next_admission);
                self.next_admission += 1;
                running.push_work(work, plan);
                let taken = running.seq.held_blocks().saturating_sub(matched);
                self.running.push(running);
                Some(taken)
            }
            Err(ScheduleError::AllocationFailed { .. }) => {
                // Its first chunk does not fit: back to its place.
                self.put_back(admitted, candidate);
                None
            }
            Ok(None) | Err(_) => {
                // Cannot run at all (unreachable for prompts `submit`
                // accepts); never requeue what would block the line.
                debug!(%id, "request cannot be scheduled");
                plan.finished.push(self.exit(
                    id,
                    FinishReason::Aborted,
                    candidate.seq.generated_tokens(),
                ));
                Some(0)
            }
        }
    }

    /// Head-of-line admission with prefix credit: each candidate, taken
    /// from the head of the queue one at a time, is charged only the blocks
    /// its cached prefix does not cover. Matching takes those blocks out of
    /// the evictable pool (so `admission_room` already counts them), and a
    /// block another running request holds costs nothing. The blocks
    /// admitted requests were charged but have not allocated yet stay
    /// reserved for them (`outstanding`).
    fn admit_with_credit(&mut self, budget: &mut usize, plan: &mut StepPlan) {
        let block_size = self.manager.block_size() as u64;
        let mut outstanding = 0u64;
        while self.free_slots() > 0 && *budget > 0 {
            let Some(head) = self.queue.select_batch(1, u64::MAX).split_off(0).pop() else {
                return;
            };
            let Some(cost) = self.admission_cost(&head, plan) else {
                continue;
            };
            // The match never covers the last token, so no more credit
            // than the blocks before it: hopeless candidates are not matched.
            let tokens = self.parked.get(&head.id()).map_or_else(
                || head.request().prompt().len() as u64,
                |parked| parked.seq.total_tokens() as u64,
            );
            let most_credit = tokens.saturating_sub(1) / block_size;
            let room = self.admission_room().saturating_sub(outstanding);
            // Nor is the head matched again while the room has not grown
            // since it last did not fit: that would only churn the cache.
            let tried = self
                .blocked_head
                .is_some_and(|(id, then)| id == head.id() && room <= then);
            if cost.saturating_sub(most_credit) > room || tried {
                self.requeue(head, None);
                return;
            }
            let Some(candidate) = self.candidate(&head, plan) else {
                continue;
            };
            let matched = candidate.seq.held_blocks() as u64;
            let charged = cost.saturating_sub(matched);
            if charged > self.admission_room().saturating_sub(outstanding) {
                // Parked with its prompt hashed; its blocks go back to the
                // cache until it is tried again.
                self.blocked_head = Some((head.id(), room));
                self.put_back(head, candidate);
                return;
            }
            self.blocked_head = None;
            let Some(allocated) = self.start_seq(head, candidate, budget, plan, true) else {
                return;
            };
            outstanding = outstanding.saturating_add(charged.saturating_sub(allocated as u64));
        }
    }

    /// Blocks a preempted request is charged to resume: its current length
    /// (prompt plus generated tokens) plus the generation reserve for what it
    /// may still generate, capped at the whole pool, so that it is admitted
    /// once the pool is free rather than waiting at the head of the line
    /// forever; `None` if its current length alone exceeds the pool.
    pub(super) fn resume_blocks(&self, seq: &RequestKv<M>) -> Option<u64> {
        if self.groups.is_some() {
            let remaining = u32::try_from(seq.remaining_tokens()).unwrap_or(u32::MAX);
            return self.grouped_blocks(seq.total_tokens() as u64, remaining);
        }
        let pool = self.manager.total_blocks() as u64;
        let block_size = self.manager.block_size() as u64;
        if (seq.total_tokens() as u64).div_ceil(block_size) > pool {
            return None;
        }
        let cost = self.queue.config().request_blocks(
            u32::try_from(seq.total_tokens()).unwrap_or(u32::MAX),
            u32::try_from(seq.remaining_tokens()).unwrap_or(u32::MAX),
        );
        Some(cost.min(pool))
    }

    /// Blocks a request of `tokens` tokens that may generate `remaining`
    /// more is charged over its KV cache groups: a full-attention group its
    /// tokens plus the generation reserve (as without groups), a window or
    /// chunk group at most its span, one prefill chunk and a block for the
    /// tail, which is all it ever holds. Capped at the pool; `None` if even
    /// its least need (without the reserve) exceeds the pool.
    fn grouped_blocks(&self, tokens: u64, remaining: u32) -> Option<u64> {
        let groups = self.groups.as_deref()?;
        let pool = self.manager.total_blocks() as u64;
        let block_size = self.manager.block_size() as u64;
        let chunk_blocks = (self.config.chunk_size as u64).div_ceil(block_size);
        let reserve = self.queue.config().reserve().tokens(remaining);
        let need = |tokens: u64| -> u64 {
            let full = tokens.div_ceil(block_size);
            (groups.groups().iter())
                .map(|group| match group.kind().span() {
                    None => full,
                    Some(span) => {
                        // Saturating: a chunk size of `usize::MAX` is allowed.
                        let most = ((span as u64).div_ceil(block_size))
                            .saturating_add(chunk_blocks)
                            .saturating_add(1);
                        full.min(most)
                    }
                })
                .fold(0u64, u64::saturating_add)
        };
        if need(tokens) > pool {
            return None;
        }
        Some(need(tokens.saturating_add(u64::from(reserve))).min(pool))
    }

    /// The sequence of an admitted request, holding its cached prefix: a
    /// parked one reacquires it, a new one is built and matched.
    pub(super) fn resume_or_start(
        &mut self,
        admitted: &Admitted<InferenceRequest>,
    ) -> Result<Parked<M>, ScheduleError> {
        let id = admitted.id();
        if let Some(mut parked) = self.parked.remove(&id) {
            parked.seq.reacquire(&self.manager)?;
            return Ok(parked);
        }
        let request = admitted.request();
        // Room for the prompt and a bounded start on the output: memory grows
        // with the tokens actually generated, never with `max_new_tokens`
        // (which may be `u32::MAX`), but the first sampled tokens do not copy
        // the whole prompt to a larger buffer.
        let headroom = (request.max_new_tokens() as usize).min(GENERATION_HEADROOM);
        let max_output = request.max_new_tokens() as usize;
        let block_size = self.manager.block_size();
        // The request's prompt is shared, not copied: the sequences read
        // its full blocks in place.
        let prompt = || PromptTokens::shared(request.shared_prompt(), headroom);
        if let Some(groups) = &self.groups {
            let mut seq = RequestKv::Groups(GroupedSequence::from_prompt(
                prompt(),
                max_output,
                groups.clone(),
                request.salt(),
            )?);
            seq.match_and_add_prefix(&self.manager)?;
            return Ok(Parked {
                seq,
                admitted_before: false,
                onboard: true,
            });
        }
        let hashed = (request.hashed_prompt()).filter(|p| p.fits(block_size, request.salt()));
        let mut seq = match hashed {
            Some(prompt) => RequestKv::One(SchedulableSequence::from_hashed(
                prompt,
                max_output,
                headroom,
                HistoryPolicy::Off,
            )),
            None => RequestKv::One(
                SchedulableSequence::builder_from_prompt(prompt(), max_output, block_size)
                    .salt(request.salt())
                    .history(HistoryPolicy::Off)
                    .build()?,
            ),
        };
        seq.match_and_add_prefix(&self.manager)?;
        Ok(Parked {
            seq,
            admitted_before: false,
            onboard: true,
        })
    }
}
