//! [`Scheduler::step`]: plans one engine iteration, running requests first.

use std::collections::HashSet;

use kvbm_schedule::ScheduleError;
use tracing::field::Empty;
use tracing::{debug, debug_span};

use super::running::Running;
use super::{FinishReason, PendingStep, Scheduler, SchedulerError, StepPlan};

impl<M> Scheduler<M> {
    /// Plans the next engine iteration.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::StepPending`] if the previous plan was not applied.
    pub fn step(&mut self) -> Result<StepPlan, SchedulerError> {
        let mut plan = StepPlan::default();
        self.step_into(&mut plan)?;
        Ok(plan)
    }

    /// [`step`](Self::step) into a plan the caller keeps from step to step:
    /// `plan` is overwritten (its lists cleared, their memory kept), so a
    /// step loop allocates no plan after the first.
    ///
    /// ```
    /// # use kvbm_blocks::BlockManager;
    /// # use kvbm_queue::{InferenceRequest, RequestId, Scheduler, SchedulerConfig, StepPlan};
    /// # let manager = BlockManager::<()>::builder().block_count(64).block_size(4).build()?;
    /// let mut scheduler = Scheduler::new(manager, SchedulerConfig::default())?;
    /// scheduler.submit(InferenceRequest::new(RequestId(1), vec![1, 2, 3, 4, 5], 2)).unwrap();
    /// let mut plan = StepPlan::default();
    /// scheduler.step_into(&mut plan)?;
    /// assert_eq!(plan.prefill.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`SchedulerError::StepPending`] if the previous plan was not applied
    /// (`plan` is left as it was).
    pub fn step_into(&mut self, plan: &mut StepPlan) -> Result<(), SchedulerError> {
        if let Some(pending) = &self.pending {
            return Err(SchedulerError::StepPending { step: pending.step });
        }
        let span = debug_span!(
            "step",
            step = self.next_step,
            prefill = Empty,
            decode = Empty,
            preempted = Empty,
            tokens = Empty
        );
        let _entered = span.enter();
        plan.step = self.next_step;
        plan.recycle_work();
        plan.preempted.clear();
        plan.finished.clear();
        plan.transfers.clear();
        plan.onboarding.clear();
        // Cancelled requests leave before anything is planned for them.
        let mut cancelled = Vec::new();
        self.end_cancelled(&mut cancelled);
        if let Some(tiers) = &mut self.tiers {
            // Room for this step's allocations, written down first.
            tiers.write_back();
        }
        let mut budget = self.config.token_budget;
        self.schedule_running(&mut budget, plan);
        if plan.preempted.is_empty() {
            // Onboarded requests were admitted before anyone waiting.
            self.start_onboarded(&mut budget, plan);
            self.admit(&mut budget, plan);
        }
        if let Some(tiers) = &mut self.tiers {
            tiers.take_planned(&mut plan.transfers);
        }
        self.next_step += 1;
        self.pending = Some(PendingStep {
            step: plan.step,
            prefills: plan.prefill.len(),
            aborted: HashSet::new(),
            cancelled,
        });
        span.record("prefill", plan.prefill.len());
        span.record("decode", plan.decode.len());
        span.record("preempted", plan.preempted.len());
        span.record("tokens", plan.num_tokens());
        debug!("step planned");
        // Metrics are recorded once per step, when it is applied.
        Ok(())
    }

    /// Running requests, most important first; preemption victims come from
    /// the end of this order.
    pub(super) fn schedule_running(&mut self, budget: &mut usize, plan: &mut StepPlan) {
        let order = |r: &Running<M>| (std::cmp::Reverse(r.priority()), r.admission);
        // Usually already in order: admissions append in order and `apply`
        // and preemption remove without reordering.
        self.running.sort_by_key(order);
        // Device blocks held by onboarding requests or transfers in flight
        // come back by themselves: until they do, no request is alone with
        // the whole pool.
        let others_hold = !self.onboarding.is_empty()
            || self.tiers.as_ref().is_some_and(|t| t.in_flight_count() > 0);
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            match self.running[i].schedule(
                &self.manager,
                self.config.limits(*budget, self.manager.total_blocks()),
            ) {
                Ok(Some(work)) => {
                    *budget -= work.tokens();
                    self.running[i].push_work(work, plan);
                    i += 1;
                }
                Ok(None) => i += 1,
                Err(ScheduleError::AllocationFailed { .. })
                    if self.running.len() == 1 && others_hold =>
                {
                    // Waits for the held blocks instead.
                    i += 1;
                }
                Err(ScheduleError::AllocationFailed { .. }) if self.running.len() == 1 => {
                    // Alone and still out of blocks: its length outgrew the
                    // whole pool, and preempting it would only loop.
                    let done = self.running.remove(i);
                    debug!(id = %done.id(), "request outgrew the block pool");
                    let generated = done.seq.generated_tokens();
                    plan.finished.push(self.exit(
                        done.id(),
                        FinishReason::CapacityExceeded,
                        generated,
                    ));
                }
                Err(ScheduleError::AllocationFailed { .. }) => {
                    // The victim: the least important request not yet
                    // scheduled, which is the last one (possibly `i` itself).
                    let victim = self.running.len() - 1;
                    self.preempt(victim, plan);
                }
                Err(err) => {
                    // Unreachable for a consistent sequence; never panic:
                    // take the request out and keep the rest going.
                    let done = self.running.remove(i);
                    debug!(id = %done.id(), %err, "request failed to schedule");
                    let generated = done.seq.generated_tokens();
                    plan.finished
                        .push(self.exit(done.id(), FinishReason::Aborted, generated));
                }
            }
        }
    }
}
