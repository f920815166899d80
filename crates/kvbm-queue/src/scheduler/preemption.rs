//! Preemption: a running request gives its blocks back and waits again at its queue place.

use std::cmp::Reverse;

use tracing::debug;

use super::running::Running;
use super::{InferenceRequest, Parked, Scheduler, StepPlan};
use crate::Admitted;

impl<M> Scheduler<M> {
    /// Releases a running request's blocks and queues it again at its place.
    pub(super) fn preempt(&mut self, index: usize, plan: &mut StepPlan) {
        let Running {
            admitted, mut seq, ..
        } = self.running.remove(index);
        let id = admitted.id();
        // Only unscheduled requests are preempted, so this cannot fail.
        let released = seq.release();
        debug_assert!(released.is_ok(), "preempted {id} mid-step");
        self.counters.preemptions += 1;
        plan.preempted.push(id);
        let parked = Parked {
            seq,
            admitted_before: true,
            onboard: true,
        };
        self.requeue_boosted(admitted, Some(parked), self.config.preemption_boost);
        debug!(%id, "preempted");
    }

    /// Puts an admitted request back at its queue place, parking its sequence
    /// (released, holding no blocks) until it is admitted again, so its
    /// prompt is not hashed twice and its progress is kept.
    pub(super) fn requeue(
        &mut self,
        admitted: Admitted<InferenceRequest>,
        parked: Option<Parked<M>>,
    ) {
        self.requeue_boosted(admitted, parked, 0);
    }

    /// [`requeue`](Self::requeue), raising its urgency by `boost` priority
    /// steps.
    fn requeue_boosted(
        &mut self,
        admitted: Admitted<InferenceRequest>,
        parked: Option<Parked<M>>,
        boost: u32,
    ) {
        let id = admitted.id();
        match self.queue.restore_boosted(admitted, boost) {
            Ok(()) => {
                if let Some(parked) = parked {
                    self.parked.insert(id, parked);
                }
            }
            Err(_closed) => {
                // Only a closed queue refuses; the request cannot wait again.
                self.counters.dropped_on_restore += 1;
                self.live.retire(id);
            }
        }
    }

    /// Admits the head of the queue, which did not fit, by preempting
    /// running requests strictly less urgent than it (lowest priority, then
    /// latest arrival, first), as long as that frees enough blocks; repeats
    /// while slots and tokens allow. Requests at `admitted_before..` were
    /// admitted this step and are never victims.
    pub(super) fn admit_by_priority(
        &mut self,
        admitted_before: usize,
        budget: &mut usize,
        plan: &mut StepPlan,
    ) {
        let mut eligible = admitted_before;
        while self.free_slots() > 0 && *budget > 0 {
            let Some(head) = self.queue.select_batch(1, u64::MAX).split_off(0).pop() else {
                return;
            };
            let Some(cost) = self.admission_cost(&head, plan) else {
                continue;
            };
            let room = self.admission_room();
            let victims = self.victims_for(head.priority(), &self.running[..eligible], cost, room);
            if cost <= room || victims.is_empty() {
                // It fits but did not start (tokens ran out or its chunk
                // could not be allocated), or preempting cannot make it fit.
                self.requeue(head, None);
                return;
            }
            // Highest index first, so the indices left stay valid.
            for index in victims {
                self.preempt_scheduled(index, budget, plan);
                self.counters.priority_preemptions += 1;
                eligible -= 1;
            }
            debug!(id = %head.id(), "admitted by priority preemption");
            if self.start(head, budget, plan).is_none() {
                return;
            }
        }
    }

    /// The indices (into `running`, descending) of the least urgent requests
    /// strictly less urgent than `priority` whose blocks, with `room`, cover
    /// `cost`; empty if all of them together would not.
    fn victims_for(
        &self,
        priority: crate::Priority,
        running: &[Box<Running<M>>],
        cost: u64,
        room: u64,
    ) -> Vec<usize> {
        let mut candidates: Vec<usize> = (0..running.len())
            .filter(|&i| running[i].priority() < priority)
            .collect();
        candidates.sort_by_key(|&i| (running[i].priority(), Reverse(running[i].admitted.seq())));
        let mut freed = room;
        let mut victims = Vec::new();
        // What the victims would give back, counted exactly: the blocks
        // they hold alone (unregistered ones always; registered ones unless
        // a request that keeps running shares them, as requests sharing a
        // prefix do). Counting every held block would preempt requests
        // whose blocks stay in use, for a head that still does not fit.
        let mut alone = 0u64;
        let mut tables = Vec::new();
        for i in candidates {
            if freed >= cost {
                break;
            }
            for seq in running[i].seq.sequences() {
                let assignments = seq.inner().assignments();
                let unregistered = assignments.staged_count() + assignments.unassigned_count();
                alone = alone.saturating_add(unregistered as u64);
                tables.push(assignments.assigned());
            }
            let registered = self.manager.pinned_only_by(tables.iter().copied()) as u64;
            freed = room.saturating_add(alone).saturating_add(registered);
            victims.push(i);
        }
        if freed < cost {
            return Vec::new();
        }
        victims.sort_unstable_by(|a, b| b.cmp(a));
        victims
    }

    /// Preempts `running[index]`, first taking back the work planned for it
    /// this step (its plan entry, its tokens and the blocks that work
    /// allocated).
    fn preempt_scheduled(&mut self, index: usize, budget: &mut usize, plan: &mut StepPlan) {
        let running = &mut self.running[index];
        if let Some(work) = running.work.take() {
            let id = running.id();
            // Unapplied work always reverts; if it ever did not, releasing
            // the sequence below still returns every block.
            let _ = running.seq.revert_schedule();
            *budget += work.tokens();
            plan.prefill.retain(|p| p.id != id);
            plan.decode.retain(|d| d.id != id);
        }
        self.preempt(index, plan);
    }
}
