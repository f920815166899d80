//! [`Scheduler::run_decodes_in_place`]: many steps at once while every
//! running request decodes inside the blocks it holds, for simulators.

use super::{RequestId, Scheduler};

/// What [`Scheduler::run_decodes_in_place`] ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DecodesInPlace {
    /// Steps run.
    pub steps: u64,
    /// Requests that decoded one token in each of them (the same ones in
    /// every step: nobody joins, leaves or waits out a step meanwhile); 0
    /// when no step ran.
    pub requests: usize,
}

impl<M> Scheduler<M> {
    /// For simulators: runs up to `max_steps` steps at once while each is
    /// every running request decoding one token inside the blocks it holds,
    /// with exactly the effects as many [`step`](Self::step) +
    /// [`apply`](Self::apply) pairs would have (the sequences' tokens,
    /// positions and histories, step numbers, generated-token counters,
    /// metrics), minus the plans and reports, which for such steps say
    /// nothing a simulator needs: one decode of each running request, no
    /// table update, no cache event, nobody admitted, preempted or
    /// finished.
    ///
    /// A simulated engine behind a router spends most of its steps this
    /// way (a request or two generating between arrivals), and there the
    /// plan and report machinery, not the decodes, is most of a step's
    /// cost.
    ///
    /// It runs a step only if it would be exactly that, and stops before
    /// the first that would not: when anything is waiting, onboarding or
    /// cancelled, nothing runs, speculative decoding or tiers are
    /// configured, a step is pending, or some request's step would
    /// allocate a block, register one (a block of its KV completes), finish
    /// it (its last token) or send the engine a table it does not know.
    /// Run those with `step` and `apply`.
    ///
    /// `sample(id, position)` is the token the engine samples for request
    /// `id` in the step that computes the KV of slot `position` (that
    /// step's [`DecodeWork::position`](super::DecodeWork::position)). It is
    /// asked for every running request before the step runs; `None` ends
    /// the run before that step (the engine would report something other
    /// than a plain token there, a stop say), so a later `step` asks the
    /// engine again for those slots.
    ///
    /// ```
    /// # use kvbm_blocks::BlockManager;
    /// # use kvbm_queue::{EngineOutput, InferenceRequest, RequestId, Scheduler, SchedulerConfig};
    /// # let manager = BlockManager::<()>::builder().block_count(16).block_size(16).build()?;
    /// let mut scheduler = Scheduler::new(manager, SchedulerConfig::default())?;
    /// scheduler.submit(InferenceRequest::new(RequestId(1), vec![7; 5], 100)).unwrap();
    /// // The prompt's step, through the plan: it samples the first token.
    /// let plan = scheduler.step()?;
    /// scheduler.apply(&[EngineOutput::token(RequestId(1), 1)])?;
    /// assert_eq!(plan.step, 0);
    /// // Slots 5 to 15 lie in its first block: ten decodes in place, the
    /// // eleventh would complete that block.
    /// let ran = scheduler.run_decodes_in_place(100, |_, position| Some(position as u32));
    /// assert_eq!((ran.steps, ran.requests), (10, 1));
    /// assert_eq!(scheduler.step()?.step, 11);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run_decodes_in_place(
        &mut self,
        max_steps: u64,
        mut sample: impl FnMut(RequestId, usize) -> Option<u32>,
    ) -> DecodesInPlace {
        let requests = self.running.len();
        let mut ran = DecodesInPlace {
            steps: 0,
            requests: 0,
        };
        if self.pending.is_some()
            || self.tiers.is_some()
            || !self.onboarding.is_empty()
            || self.config.speculative_tokens > 0
            || requests == 0
            // A step decodes as many requests as its budget has tokens.
            // (Admission never runs more than that, each taking a token,
            // but the step's rule is what this stands for.)
            || requests > self.config.token_budget
        {
            return ran;
        }
        // The step's tokens, all sampled before any is applied: a step
        // runs whole or not at all.
        let mut tokens = std::mem::take(&mut self.scratch.tokens);
        // The queue is locked only when something may have arrived since
        // it was last seen empty (an arrival moves its epoch after queueing
        // the request; the mark is taken before looking).
        let mut arrivals = self.queue.arrival_mark();
        let mut waiting = !self.queue.is_empty();
        while ran.steps < max_steps {
            // Another thread may submit or cancel between two steps.
            if self.queue.arrived_since(arrivals) {
                arrivals = self.queue.arrival_mark();
                waiting = !self.queue.is_empty();
            }
            if waiting || self.live.any_cancelled() {
                break;
            }
            if !self.decode_step_in_place(&mut sample, &mut tokens) {
                break;
            }
            // What the step's plan and apply count.
            self.next_step += 1;
            self.counters.generated_tokens += requests as u64;
            self.record_metrics();
            ran.steps += 1;
        }
        tokens.clear();
        self.scratch.tokens = tokens;
        if ran.steps > 0 {
            ran.requests = requests;
        }
        ran
    }

    /// One step of [`run_decodes_in_place`](Self::run_decodes_in_place)'s
    /// requests, whole or not at all; whether it ran.
    fn decode_step_in_place(
        &mut self,
        sample: &mut impl FnMut(RequestId, usize) -> Option<u32>,
        tokens: &mut Vec<u32>,
    ) -> bool {
        if self.running.len() == 1 {
            // Alone, the decode checks its blocks itself: nothing to
            // keep whole.
            let running = &mut self.running[0];
            if !running.in_place_allowed() {
                return false;
            }
            let Some(token) = sample(running.id(), running.seq.kv_position()) else {
                return false;
            };
            return running.decode_in_place(token);
        }
        if !self.running.iter().all(|r| r.may_decode_in_place()) {
            return false;
        }
        tokens.clear();
        for running in self.running.iter() {
            match sample(running.id(), running.seq.kv_position()) {
                Some(token) => tokens.push(token),
                None => return false,
            }
        }
        for (running, &token) in self.running.iter_mut().zip(tokens.iter()) {
            // Checked above for every one, so none refuses.
            let decoded = running.decode_in_place(token);
            debug_assert!(decoded, "{} was checked", running.id());
        }
        true
    }
}
