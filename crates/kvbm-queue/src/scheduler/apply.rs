//! [`Scheduler::apply`]: commits what the engine sampled for the planned step.

use std::collections::HashSet;

use tracing::debug;

use super::running::Running;
use super::{
    EngineOutput, FinishReason, OutputIndex, PendingStep, RequestId, Scheduler, SchedulerError,
    StepReport,
};

/// How [`Scheduler::apply`] finds each planned request's output.
#[derive(Clone, Copy, Debug)]
enum OutputOrder {
    /// The plan's order, its prefills (this many) then its decodes: where
    /// every output was, the order an engine answering the plan list by
    /// list gives, so no index is built.
    Plan { prefills: usize },
    /// Any other order: by id, through the index built for it.
    ById,
}

impl OutputOrder {
    /// `running`'s output, if it has one.
    #[inline]
    fn output<'o, M>(
        self,
        running: &Running<M>,
        outputs: &'o [EngineOutput],
        by_id: &OutputIndex,
    ) -> Option<&'o EngineOutput> {
        let at = match self {
            OutputOrder::Plan { prefills } => running.output_in_plan_order(prefills)?,
            OutputOrder::ById => *by_id.get(&running.id())?,
        };
        outputs.get(at)
    }
}

impl<M> Scheduler<M> {
    /// Commits what the engine sampled for the pending plan.
    ///
    /// Ends the step: the pool's event subscribers
    /// ([`BlockManager::subscribe_events`](kvbm_blocks::BlockManager::subscribe_events))
    /// receive what it stored and evicted as one batch.
    ///
    /// `outputs` holds one entry per planned request, in any order (entries
    /// for requests aborted since the plan are ignored). The plan's own
    /// order, every `prefill` entry's output then every `decode` entry's,
    /// is the cheapest: it needs no index by id.
    ///
    /// # Errors
    ///
    /// Nothing changes on error: [`SchedulerError::NoStepPending`],
    /// [`SchedulerError::MissingOutput`], [`SchedulerError::UnexpectedOutput`],
    /// [`SchedulerError::DuplicateOutput`], [`SchedulerError::MissingToken`],
    /// [`SchedulerError::UnexpectedToken`] or [`SchedulerError::TooManyDrafts`].
    pub fn apply(&mut self, outputs: &[EngineOutput]) -> Result<StepReport, SchedulerError> {
        // Errors built only when returned (`ok_or` would build and drop
        // one every call).
        let Some(pending) = self.pending.as_ref() else {
            return Err(SchedulerError::NoStepPending);
        };
        let mut by_id = std::mem::take(&mut self.output_index);
        let order = match self.check_outputs(pending, outputs, &mut by_id) {
            Ok(order) => order,
            Err(error) => {
                by_id.clear();
                self.output_index = by_id;
                return Err(error);
            }
        };
        let Some(pending) = self.pending.take() else {
            return Err(SchedulerError::NoStepPending);
        };
        let step = pending.step;

        let mut report = StepReport {
            step,
            finished: pending.cancelled,
            ..StepReport::default()
        };
        // Requests that are done are taken out afterwards, keeping the
        // others in order (so the next step need not sort them again).
        let mut done = std::mem::take(&mut self.scratch.done);
        let mut registered = std::mem::take(&mut self.scratch.registered);
        let offloading = self.tiers.as_ref().is_some_and(|tiers| tiers.has_lower());
        for (i, running) in self.running.iter_mut().enumerate() {
            let Some(output) = order.output(running, outputs, &by_id) else {
                continue;
            };
            if offloading {
                registered.push((i, running.seq.lead().inner().assignments().assigned_end()));
            }
            match running.commit(output, &self.manager, &mut report, &mut self.scratch) {
                Ok(None) => {}
                Ok(Some(reason)) => done.push((i, reason)),
                Err(err) => {
                    // Unreachable after `check_outputs`; never panic.
                    debug!(id = %running.id(), %err, "request failed to apply");
                    done.push((i, FinishReason::Aborted));
                }
            }
        }
        // What they registered goes down to the tiers below, before anyone
        // leaves (the indices are the running set's).
        for &(i, before) in &registered {
            self.offload_new_blocks(i, before);
        }
        registered.clear();
        self.scratch.registered = registered;
        for &(i, reason) in done.iter().rev() {
            let finished = self.running.remove(i);
            let generated = finished.seq.generated_tokens();
            report
                .finished
                .push(self.exit(finished.id(), reason, generated));
        }
        done.clear();
        self.scratch.done = done;
        by_id.clear();
        self.output_index = by_id;
        self.counters.generated_tokens += report.generated_tokens as u64;
        self.counters.spec_proposed_tokens += report.verified_draft_tokens as u64;
        self.counters.spec_accepted_tokens += report.accepted_draft_tokens as u64;
        // Requests cancelled while the engine ran end now, after their
        // computed work is committed (what they registered stays cached).
        self.end_cancelled(&mut report.finished);
        debug!(step, finished = report.finished.len(), "step applied");
        self.record_metrics();
        // One batch of cache events per step, for the pool's subscribers
        // (one atomic load when there are none), and one per lower tier.
        self.manager.flush_events();
        if let Some(tiers) = &self.tiers {
            tiers.flush_events();
        }
        Ok(report)
    }

    /// Validates `outputs` against the plan without changing anything;
    /// how to find each request's output (through `by_id`, filled here,
    /// unless they are in the plan's order).
    fn check_outputs(
        &self,
        pending: &PendingStep,
        outputs: &[EngineOutput],
        by_id: &mut OutputIndex,
    ) -> Result<OutputOrder, SchedulerError> {
        by_id.clear();
        let order = if self.in_plan_order(pending, outputs) {
            OutputOrder::Plan {
                prefills: pending.prefills,
            }
        } else {
            by_id.reserve(outputs.len());
            for (at, output) in outputs.iter().enumerate() {
                if pending.aborted.contains(&output.id) {
                    continue;
                }
                if by_id.insert(output.id, at).is_some() {
                    return Err(SchedulerError::DuplicateOutput { id: output.id });
                }
            }
            OutputOrder::ById
        };
        let mut expected = 0;
        for running in &self.running {
            let Some(work) = running.work else { continue };
            expected += 1;
            let id = running.id();
            let Some(output) = order.output(running, outputs, by_id) else {
                return Err(SchedulerError::MissingOutput { id });
            };
            match (work.samples_token(), output.token.is_some()) {
                (true, false) => return Err(SchedulerError::MissingToken { id }),
                (false, true) => return Err(SchedulerError::UnexpectedToken { id }),
                _ => {}
            }
            let accepted = output.accepted_drafts.len();
            if accepted > work.drafts() {
                return Err(SchedulerError::TooManyDrafts {
                    id,
                    accepted,
                    drafts: work.drafts(),
                });
            }
        }
        if matches!(order, OutputOrder::ById) && by_id.len() != expected {
            let scheduled: HashSet<RequestId> = self
                .running
                .iter()
                .filter(|r| r.work.is_some())
                .map(|running| running.id())
                .collect();
            let stray = by_id.keys().find(|id| !scheduled.contains(id));
            if let Some(&id) = stray {
                return Err(SchedulerError::UnexpectedOutput { id });
            }
        }
        Ok(order)
    }

    /// Whether `outputs` hold exactly one output per planned request, each
    /// where the plan's order puts it (no request aborted since the plan).
    /// Then each is a different request's (the running ids are distinct),
    /// so there is none missing, doubled or stray, and no index is needed.
    fn in_plan_order(&self, pending: &PendingStep, outputs: &[EngineOutput]) -> bool {
        if !pending.aborted.is_empty() {
            return false;
        }
        let mut planned = 0usize;
        for running in &self.running {
            if running.work.is_none() {
                continue;
            }
            planned += 1;
            let at = running.output_in_plan_order(pending.prefills);
            if at
                .and_then(|at| outputs.get(at))
                .is_none_or(|output| output.id != running.id())
            {
                return false;
            }
        }
        planned == outputs.len()
    }
}
