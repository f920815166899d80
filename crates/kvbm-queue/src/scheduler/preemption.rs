//! Preemption: a running request gives its blocks back and waits again at its queue place.

use kvbm_schedule::SchedulableSequence;
use tracing::debug;

use super::running::Running;
use super::{InferenceRequest, Scheduler, StepPlan};
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
        self.requeue(admitted, Some(seq));
        debug!(%id, "preempted");
    }

    /// Puts an admitted request back at its queue place, parking its sequence
    /// (if it has progress worth keeping) until it is admitted again.
    pub(super) fn requeue(
        &mut self,
        admitted: Admitted<InferenceRequest>,
        seq: Option<SchedulableSequence<M>>,
    ) {
        let id = admitted.id();
        match self.queue.restore(admitted) {
            Ok(()) => {
                if let Some(seq) = seq.filter(|seq| seq.generated_tokens() > 0) {
                    self.parked.insert(id, seq);
                }
            }
            Err(_closed) => {
                // Only a closed queue refuses; the request cannot wait again.
                self.counters.dropped_on_restore += 1;
                self.live.retire(id);
            }
        }
    }
}
