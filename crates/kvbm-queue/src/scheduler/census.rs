//! [`Census`] and [`Scheduler::audit`]: where every request and block is.

use std::collections::HashSet;

use super::{RequestId, Scheduler, SchedulerError};

/// Where every request is: the scheduler's conservation law.
///
/// `submitted == waiting + onboarding + running + finished + aborted` holds
/// after every call ([`is_balanced`](Self::is_balanced)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Census {
    /// Requests ever accepted by `submit`.
    pub submitted: u64,
    /// Requests in the waiting queue (new or preempted).
    pub waiting: u64,
    /// Requests admitted and holding blocks.
    pub running: u64,
    /// Requests admitted and waiting for their prefix to be loaded from a
    /// tier below the device (holding device blocks, not yet running).
    pub onboarding: u64,
    /// Requests that finished (max tokens or stop).
    pub finished: u64,
    /// Requests aborted, cancelled while waiting, or dropped because the
    /// queue was closed under them.
    pub aborted: u64,
    /// Preemptions so far (a request may be preempted more than once).
    pub preemptions: u64,
    /// Of those, preemptions by admission for a more urgent waiting request
    /// ([`Preemption::ByPriority`](crate::Preemption::ByPriority)).
    pub priority_preemptions: u64,
    /// Tokens of the sequences admitted, counting every admission: the prompt
    /// for a new request, prompt plus generated tokens for a resumption.
    pub prompt_tokens: u64,
    /// Of those, tokens served from the prefix cache.
    pub prefix_hit_tokens: u64,
    /// Draft tokens verified in applied speculative steps.
    pub spec_proposed_tokens: u64,
    /// Of those, the ones the engine accepted.
    pub spec_accepted_tokens: u64,
    /// Prompt tokens of first admissions (resumptions not counted): what
    /// the prefix cache was asked for (vLLM's `prefix_cache_queries`).
    pub prefix_cache_queries: u64,
    /// Of those, tokens found cached (vLLM's `prefix_cache_hits`).
    pub prefix_cache_hits: u64,
    /// Tokens generated (sampled and accepted) so far.
    pub generated_tokens: u64,
}

impl Census {
    /// Whether every submitted request is in exactly one place (summed in
    /// `u128`, so counters set by hand to any value cannot overflow).
    pub fn is_balanced(&self) -> bool {
        let placed = [
            self.waiting,
            self.onboarding,
            self.running,
            self.finished,
            self.aborted,
        ]
        .into_iter()
        .map(u128::from)
        .sum::<u128>();
        u128::from(self.submitted) == placed
    }
}

impl<M> Scheduler<M> {
    /// Where every request is right now.
    pub fn census(&self) -> Census {
        let queue = self.queue.stats();
        Census {
            submitted: queue.enqueued,
            waiting: queue.len as u64,
            running: self.running.len() as u64,
            onboarding: self.onboarding.len() as u64,
            finished: self.counters.finished,
            aborted: self.counters.aborted_running
                + self.counters.dropped_on_restore
                + queue.removed
                + queue.cancelled,
            preemptions: self.counters.preemptions,
            priority_preemptions: self.counters.priority_preemptions,
            prompt_tokens: self.counters.prompt_tokens,
            prefix_hit_tokens: self.counters.prefix_hit_tokens,
            spec_proposed_tokens: self.counters.spec_proposed_tokens,
            spec_accepted_tokens: self.counters.spec_accepted_tokens,
            prefix_cache_queries: self.counters.prefix_cache_queries,
            prefix_cache_hits: self.counters.prefix_cache_hits,
            generated_tokens: self.counters.generated_tokens,
        }
    }

    /// Checks both conservation laws: every request in exactly one place, and
    /// every block in use held by exactly the running requests (assuming this
    /// scheduler is the manager's only user). O(blocks); for tests and
    /// debugging.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::InvariantViolated`] or [`SchedulerError::Block`]
    /// describing the first discrepancy.
    pub fn audit(&self) -> Result<Census, SchedulerError> {
        let fail = |msg: String| Err(SchedulerError::InvariantViolated(msg));
        // Held throughout, so no submit or cancel from another thread lands
        // between the reads below.
        let live = self.live.state();
        let census = self.census();
        if !census.is_balanced() {
            return fail(format!("requests unaccounted for: {census:?}"));
        }
        let mut running_ids: HashSet<RequestId> = self.running_ids().collect();
        // Onboarding requests are admitted too: out of the queue, live.
        running_ids.extend(self.onboarding.iter().map(|o| o.admitted.id()));
        // Every live id is running, waiting, or cancelled and not yet ended
        // (the handle took it out of the queue); every running and waiting
        // id is live.
        let mut out_of_queue = 0;
        for id in &live.live {
            if !running_ids.contains(id) && !self.queue.contains(*id) {
                if !live.cancelled.contains(id) {
                    return fail(format!("{id} is live but neither running nor waiting"));
                }
                out_of_queue += 1;
            }
        }
        if live.live.len() != running_ids.len() + census.waiting as usize + out_of_queue {
            return fail(format!(
                "{} live ids for {} running, {} waiting and {out_of_queue} cancelled requests",
                live.live.len(),
                running_ids.len(),
                census.waiting
            ));
        }
        if let Some(id) = live.cancelled.iter().find(|id| !live.live.contains(id)) {
            return fail(format!("{id} is cancelled but not live"));
        }
        if let Some(id) = self.parked.keys().find(|id| !live.live.contains(id)) {
            return fail(format!("parked {id} is not live"));
        }
        drop(live);
        if !self.running.index_agrees() {
            return fail("the position index disagrees with the running set".to_owned());
        }
        let mut held = HashSet::new();
        for running in &self.running {
            if self.queue.contains(running.id()) {
                return fail(format!("{} is both running and waiting", running.id()));
            }
            held.extend(running.seq.all_block_ids());
        }
        for onboarding in &self.onboarding {
            if self.queue.contains(onboarding.admitted.id()) {
                return fail(format!(
                    "{} is both onboarding and waiting",
                    onboarding.admitted.id()
                ));
            }
            held.extend(onboarding.parked.seq.all_block_ids());
            for loaded in &onboarding.loaded {
                held.extend(loaded.block_ids());
            }
        }
        if let Some(tiers) = &self.tiers {
            held.extend(tiers.device_blocks_held());
            tiers.audit()?;
        }
        let blocks = self.manager.audit()?;
        if blocks.in_use_blocks() != held.len() {
            return fail(format!(
                "{} blocks in use but running and onboarding requests and transfers hold {}",
                blocks.in_use_blocks(),
                held.len()
            ));
        }
        Ok(census)
    }
}
