//! One step of the stand-in engine: what a plan does to the engine's
//! records (preemptions, exits, admissions, onboarding), the outputs a
//! forward pass would give (a token wherever one is due, drafts accepted
//! at random), the scheduler's apply, and the clock.

use std::time::Duration;

use kvbm_queue::{EngineOutput, FinishReason, RequestId, StepPlan};

use super::{NEVER, ServeOutcome, ServeSim, draws, tokens};
use crate::SimError;

impl ServeSim<'_> {
    /// Runs one planned step through the stand-in engine and applies it.
    /// Returns whether anything ran or changed.
    pub(super) fn step(&mut self, plan: &StepPlan) -> Result<bool, SimError> {
        // The queue as this step's admission found it.
        self.counters.steps_begin(1);
        let start = self.now;
        for &id in &plan.preempted {
            if let Some(track) = self.tracks.get_mut(id.0 as usize) {
                track.running = false;
                track.preemptions += 1;
            }
            self.counters.preemptions += 1;
            self.counters.running = self.counters.running.saturating_sub(1);
        }
        for finished in &plan.finished {
            self.finish(finished.id, finished.reason, start);
        }
        for &id in &plan.onboarding {
            if let Some(track) = self.tracks.get_mut(id.0 as usize) {
                track.onboarding_since = start;
            }
        }
        if let Some(transfers) = &mut self.transfers {
            // Stores and this step's loads start with the step.
            transfers.start(start, &plan.transfers)?;
        }
        // Admissions: a request the plan hands a fresh table that was not
        // running. Its work starts at its matched prefix.
        let admitted = plan
            .prefill
            .iter()
            .filter(|work| work.resumed)
            .map(|work| (work.id, work.start))
            .chain(
                plan.decode
                    .iter()
                    .filter(|work| work.resumed)
                    .map(|work| (work.id, work.position)),
            );
        for (id, hits) in admitted {
            let Some(track) = self.tracks.get_mut(id.0 as usize) else {
                continue;
            };
            if track.running {
                continue; // a table swap after deduplication, not an admission
            }
            track.running = true;
            if track.onboarding_since != NEVER {
                self.counters.onboarded += 1;
                self.counters.stall += start.saturating_sub(track.onboarding_since);
                track.onboarding_since = NEVER;
            }
            self.counters.running += 1;
            self.counters.admissions += 1;
            self.counters.admitted_hit_tokens += hits as u64;
            if track.admission_rank == NEVER {
                track.admission_rank = self.counters.first_admissions;
                self.counters.first_admissions += 1;
                track.admitted = start;
                track.hit_tokens = hits as u64;
            }
        }

        // The engine: a token wherever one is due, never a stop.
        self.outputs.clear();
        let mut prefill_tokens = 0u64;
        for work in &plan.prefill {
            prefill_tokens += work.num_tokens as u64;
            self.outputs.push(if work.emits_token {
                let token = tokens::sampled_token(work.id.0, work.start + work.num_tokens);
                EngineOutput::token(work.id, token)
            } else {
                EngineOutput::no_token(work.id)
            });
        }
        // A speculative decode: each draft is accepted with probability
        // `spec_accept` until the first rejection; the accepted drafts are
        // the tokens it would have sampled anyway.
        let mut draft_tokens = 0u64;
        for work in &plan.decode {
            let (id, next) = (work.id, work.position + 1);
            draft_tokens += work.draft_tokens as u64;
            let accepted =
                draws::accepted_drafts(self.seed, self.spec_accept, id.0, next, work.draft_tokens);
            let token = tokens::sampled_token(id.0, next + accepted);
            // No drafts (a plain decode) collect into an empty, unallocated list.
            let drafts = (next..next + accepted)
                .map(|position| tokens::sampled_token(id.0, position))
                .collect();
            self.outputs
                .push(EngineOutput::speculative(id, drafts, token));
        }
        let decodes = plan.decode.len() as u64;
        let outputs = &self.outputs;
        let report = (self.scheduler_clock).time(|| self.scheduler.apply(outputs))?;

        // Verifying drafts costs what prefilling as many tokens does.
        let elapsed = self
            .step_time
            .step_nanos(prefill_tokens.saturating_add(draft_tokens), decodes);
        // `NEVER` is no time: a step that would end there or later has run
        // past the clock.
        // (The error is built only when returned: it has heap fields.)
        let Some(end) = start.checked_add(elapsed).filter(|&end| end < NEVER) else {
            return Err(SimError::ClockOverflow {
                step: self.counters.scheduler_steps,
            });
        };
        let ran = !plan.is_empty();
        if ran {
            let scheduled = (plan.prefill.len() + plan.decode.len()) as u64;
            (self.counters).ran(1, scheduled, prefill_tokens, decodes, elapsed);
        }
        self.now = end;
        if let Some(transfers) = &mut self.transfers {
            // What the step registered goes down as it ends.
            transfers.start_planned(end, &mut self.scheduler)?;
        }
        self.counters.output_tokens += report.generated_tokens as u64;
        for id in &report.first_tokens {
            if let Some(track) = self.tracks.get_mut(id.0 as usize)
                && track.first_token == NEVER
            {
                track.first_token = end;
                let prompt = self
                    .trace
                    .requests()
                    .get(id.0 as usize)
                    .map_or(0, |r| r.input_length);
                self.counters.unprefilled_tokens =
                    self.counters.unprefilled_tokens.saturating_sub(prompt);
                let nanos = end.saturating_sub(track.arrival);
                self.ttft.record(Duration::from_nanos(nanos).as_secs_f64());
            }
        }
        for finished in &report.finished {
            self.finish(finished.id, finished.reason, end);
        }
        Ok(ran || !plan.preempted.is_empty() || !plan.finished.is_empty())
    }

    fn finish(&mut self, id: RequestId, reason: FinishReason, at: u64) {
        let Some(track) = self.tracks.get_mut(id.0 as usize) else {
            return;
        };
        if track.running {
            self.counters.running = self.counters.running.saturating_sub(1);
        }
        track.running = false;
        track.finished = at;
        track.outcome = match reason {
            FinishReason::MaxTokens | FinishReason::Stop => ServeOutcome::Finished,
            FinishReason::CapacityExceeded => ServeOutcome::CapacityExceeded,
            FinishReason::Aborted | FinishReason::Cancelled => ServeOutcome::Aborted,
            // A reason added after this was written: the request left early.
            _ => ServeOutcome::Aborted,
        };
        self.counters.exited += 1;
        self.counters.unreported += 1;
    }
}
