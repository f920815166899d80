//! [`Scheduler::run_lone_decode`]: many steps of a lone decoding request at
//! once, for simulators.

use super::{RequestId, Scheduler};

impl<M> Scheduler<M> {
    /// For simulators: runs up to `max_steps` steps at once while each is a
    /// lone request decoding one token inside the blocks it holds, with
    /// exactly the effects `max_steps` [`step`](Self::step) +
    /// [`apply`](Self::apply) pairs would have (the sequence's tokens,
    /// position and history, step numbers, generated-token counters,
    /// metrics), minus the plans and reports, which for such steps say
    /// nothing a simulator needs: one decode of that request, no table
    /// update, no event, nobody finished. Returns the steps run.
    ///
    /// A simulated engine spends most of its steps this way when requests
    /// arrive far apart (an engine behind a router with one request
    /// generating), and there the plan and report machinery, not the
    /// decode, is most of a step's cost.
    ///
    /// It runs a step only if it would be exactly that, and stops before
    /// the first that would not: when anything is waiting, onboarding or
    /// cancelled, more than one request runs, speculative decoding or
    /// tiers are configured, a step is pending, or the request's step
    /// would allocate a block, register one (a block of its KV completes)
    /// or finish it (its last token). Run those with `step` and `apply`.
    ///
    /// `sample(id, position)` is the token the engine samples in the step
    /// that computes the KV of slot `position` (that step's
    /// [`DecodeWork::position`](super::DecodeWork::position)). It is asked
    /// before the step runs; `None` ends the run before that step (the
    /// engine would report something other than a plain token there, a
    /// stop say), so a later `step` asks the engine again for that slot.
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
    /// let steps = scheduler.run_lone_decode(100, |_, position| Some(position as u32));
    /// assert_eq!(steps, 10);
    /// assert_eq!(scheduler.step()?.step, 11);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run_lone_decode(
        &mut self,
        max_steps: u64,
        mut sample: impl FnMut(RequestId, usize) -> Option<u32>,
    ) -> u64 {
        if self.pending.is_some()
            || self.tiers.is_some()
            || !self.onboarding.is_empty()
            || self.config.speculative_tokens > 0
            || self.running.len() != 1
        {
            return 0;
        }
        let mut steps = 0;
        while steps < max_steps {
            // Another thread may submit or cancel between two steps.
            if self.live.any_cancelled() || !self.queue.is_empty() {
                break;
            }
            let running = &mut self.running[0];
            if !running.may_decode_in_place() {
                break;
            }
            let Some(token) = sample(running.id(), running.seq.kv_position()) else {
                break;
            };
            if !running.decode_in_place(token) {
                break;
            }
            // What the step's plan and apply count.
            self.next_step += 1;
            self.counters.generated_tokens += 1;
            self.record_metrics();
            steps += 1;
        }
        steps
    }
}
