//! Decodes in place: the steps of an engine whose running requests all
//! decode inside the blocks they hold, simulated at once
//! ([`Scheduler::run_decodes_in_place`](kvbm_queue::Scheduler::run_decodes_in_place))
//! with the bookkeeping of as many [`ServeSim::advance`] calls.
//!
//! An engine behind a router spends most of its steps this way (a request
//! or two generating between arrivals), and the plan, report and counters
//! of each such step cost many times its decodes. Every report stays the
//! same: each such step would plan one decode per running request with no
//! table update, send no cache event, admit, preempt and finish nobody,
//! and take the same time as the others, so its counters add up in closed
//! form.

use super::{ServeSim, tokens};
use crate::SimError;

impl ServeSim<'_> {
    /// Runs in place the steps that begin before `until` (any, for `None`)
    /// while each only decodes every running request inside its blocks,
    /// auditing where [`advance`](Self::advance) would; returns how many
    /// ran (0 when the next step is not one, or the engine has transfers,
    /// which steps start and end).
    ///
    /// # Errors
    ///
    /// As [`advance`](Self::advance)'s audit.
    pub(crate) fn advance_in_place(&mut self, until: Option<u64>) -> Result<u64, SimError> {
        if !self.in_place || self.transfers.is_some() {
            return Ok(0);
        }
        // Plain decodes of the running requests: what `step` charges them.
        let running = self.scheduler.running_ids().len() as u64;
        let elapsed = self.step_time.step_nanos(0, running);
        let start = self.now;
        // Steps that begin before `until`, each ending before the clock's
        // last value (the one that would not is left to `advance`, which
        // reports the overflow).
        let max_steps = match (elapsed, until) {
            (0, Some(at)) if at <= start => 0,
            (0, _) => u64::MAX,
            (e, until) => {
                let before_until =
                    until.map_or(u64::MAX, |at| at.saturating_sub(start).div_ceil(e));
                before_until.min((super::NEVER - 1).saturating_sub(start) / e)
            }
        };
        // Never past the next audit, which must see the pool as it is then.
        let to_audit = self.audit_every.map_or(u64::MAX, |every| {
            every - self.counters.scheduler_steps % every
        });
        let ran = (self.scheduler_clock).time(|| {
            (self.scheduler).run_decodes_in_place(max_steps.min(to_audit), |id, position| {
                Some(tokens::sampled_token(id.0, position + 1))
            })
        });
        if ran.steps == 0 {
            return Ok(0);
        }
        // Every running request decoded in each step (as timed above).
        let (steps, decodes) = (ran.steps, ran.requests as u64);
        debug_assert_eq!(decodes, running);
        // What `steps` calls of `step` would have counted, each the same.
        let tokens = steps.saturating_mul(decodes);
        self.counters.steps_begin(steps);
        (self.counters).ran(steps, tokens, 0, tokens, elapsed.saturating_mul(steps));
        self.counters.output_tokens += tokens;
        self.now = start + elapsed * steps;
        if let Some(kv) = &mut self.kv {
            // Its blocks did not change: one look sees every step's peak.
            kv.observe(&self.scheduler);
        }
        if self
            .audit_every
            .is_some_and(|every| self.counters.scheduler_steps.is_multiple_of(every))
        {
            self.scheduler.audit()?;
        }
        Ok(steps)
    }
}
