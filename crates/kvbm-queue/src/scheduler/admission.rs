//! Admission: waiting requests become running ones, in queue order, within the step's limits.

use kvbm_schedule::{HistoryPolicy, SchedulableSequence, ScheduleError};
use tracing::debug;

use super::running::Running;
use super::{FinishReason, InferenceRequest, Scheduler, StepPlan};
use crate::{Admitted, Request};

impl<M> Scheduler<M> {
    /// Admits waiting requests in queue order while slots, tokens and blocks allow.
    pub(super) fn admit(&mut self, budget: &mut usize, plan: &mut StepPlan) {
        let slots = self.config.max_running.saturating_sub(self.running.len());
        if slots == 0 || *budget == 0 {
            return;
        }
        // The watermark keeps room for running requests to grow into; with
        // none running it would only keep a large request waiting forever.
        let watermark = if self.running.is_empty() {
            0
        } else {
            self.config.watermark(self.manager.total_blocks())
        };
        let blocks = self.manager.available_blocks().saturating_sub(watermark) as u64;
        let mut candidates = self
            .queue
            .select_batch(slots, blocks)
            .split_off(0)
            .into_iter();
        // The queue charged every candidate its prompt plus a generation
        // reserve; a preempted one must recompute what it generated too.
        let mut room = blocks;
        while let Some(admitted) = candidates.next() {
            let id = admitted.id();
            let cost = match self.parked.get(&id) {
                Some(seq) => self.queue.config().request_blocks(
                    u32::try_from(seq.total_tokens()).unwrap_or(u32::MAX),
                    u32::try_from(seq.remaining_tokens()).unwrap_or(u32::MAX),
                ),
                None => admitted.blocks(),
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
            let mut seq = match self.resume_or_start(&admitted) {
                Ok(seq) => seq,
                Err(err) => {
                    debug!(%id, %err, "request cannot start");
                    plan.finished.push(self.exit(id, FinishReason::Aborted, 0));
                    continue;
                }
            };
            let prompt = seq.total_tokens() as u64;
            let hits = seq.kv_position() as u64;
            match Running::schedule_seq(&mut seq, &self.manager, *budget, self.config.chunk_size) {
                Ok(Some(work)) => {
                    *budget -= work.tokens();
                    self.counters.prompt_tokens += prompt;
                    self.counters.prefix_hit_tokens += hits;
                    let mut running = Running::new(admitted, seq, self.next_admission);
                    self.next_admission += 1;
                    running.push_work(work, plan);
                    self.running.push(running);
                }
                Err(ScheduleError::AllocationFailed { .. }) => {
                    // Its first chunk does not fit: back to its place, and so
                    // is everyone behind it (head of line).
                    let _ = seq.release();
                    self.requeue(admitted, Some(seq));
                    for admitted in candidates.by_ref() {
                        self.requeue(admitted, None);
                    }
                }
                Ok(None) | Err(_) => {
                    // Cannot run at all (unreachable for prompts `submit`
                    // accepts); never requeue what would block the line.
                    debug!(%id, "request cannot be scheduled");
                    plan.finished.push(self.exit(
                        id,
                        FinishReason::Aborted,
                        seq.generated_tokens(),
                    ));
                }
            }
        }
    }

    /// The sequence of an admitted request: a preempted one reacquires its
    /// cached prefix, a new one is built and matched.
    pub(super) fn resume_or_start(
        &mut self,
        admitted: &Admitted<InferenceRequest>,
    ) -> Result<SchedulableSequence<M>, ScheduleError> {
        let id = admitted.id();
        if let Some(mut seq) = self.parked.remove(&id) {
            seq.reacquire(&self.manager)?;
            return Ok(seq);
        }
        let request = admitted.request();
        // Room for every token it may generate: no reallocation mid-decode.
        let mut tokens =
            Vec::with_capacity(request.prompt().len() + request.max_new_tokens() as usize);
        tokens.extend_from_slice(request.prompt());
        let mut seq = SchedulableSequence::builder(
            tokens,
            request.max_new_tokens() as usize,
            self.manager.block_size(),
        )
        .salt(request.salt())
        .history(HistoryPolicy::Off)
        .build()?;
        seq.match_and_add_prefix(&self.manager)?;
        Ok(seq)
    }
}
