//! [`Scheduler::abort`] and cancellations: taking one request out wherever it is.

use tracing::debug;

use super::{FinishReason, Finished, RequestId, Scheduler, SchedulerError};

impl<M> Scheduler<M> {
    /// Takes a request out wherever it is: waiting (new or preempted),
    /// onboarding (its loads are abandoned unless another request waits for
    /// them) or running (even mid-step: its scheduled work is reverted, and
    /// its output, if the engine still sends one, is ignored). Everything it
    /// held goes back to the pool; its registered blocks stay cached.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::UnknownRequest`] if it is neither waiting nor running.
    pub fn abort(&mut self, id: RequestId) -> Result<Finished, SchedulerError> {
        self.take_out(id, FinishReason::Aborted)
            .ok_or(SchedulerError::UnknownRequest { id })
    }

    /// Cancels a request from the scheduler's own thread, exactly as
    /// [`SubmitHandle::cancel`](crate::SubmitHandle::cancel) does from any
    /// other: it ends at the next `step` or `apply` and is reported then.
    /// Use [`abort`](Self::abort) to end it at once.
    pub fn cancel(&self, id: RequestId) -> bool {
        self.live.cancel(&self.queue, id)
    }

    /// Ends every request cancelled through a handle since the last call,
    /// wherever it is now, and lists it in `finished`.
    pub(super) fn end_cancelled(&mut self, finished: &mut Vec<Finished>) {
        for id in self.live.cancelled() {
            // A cancelled id is live until retired, so it is running, back in
            // the queue (restored after admission) or already out of it (the
            // handle removed it): `take_out` finds it in each case.
            if let Some(done) = self.take_out(id, FinishReason::Cancelled) {
                debug!(%id, "cancelled");
                finished.push(done);
            }
        }
    }

    /// Takes `id` out of the running set, the waiting queue or the parked
    /// sequences, releases what it holds and retires its id.
    fn take_out(&mut self, id: RequestId, reason: FinishReason) -> Option<Finished> {
        if let Some(done) = self.take_out_onboarding(id, reason) {
            return Some(done);
        }
        if let Some(index) = self.position(id) {
            let mut running = self.running.swap_remove(index);
            if running.work.take().is_some() {
                // Only unapplied work can be pending, so reverting succeeds;
                // if it ever did not, dropping the sequence still returns
                // every block it holds.
                let reverted = running.seq.revert_schedule();
                debug_assert!(reverted.is_ok(), "{id} had work but no schedule");
                if let Some(pending) = &mut self.pending {
                    pending.aborted.insert(id);
                }
            }
            debug!(%id, ?reason, "taken out while running");
            return Some(self.exit(id, reason, running.seq.generated_tokens()));
        }
        let waiting = self.queue.remove(id).is_some();
        if !waiting && !self.live.is_cancelled(id) {
            return None;
        }
        let generated_tokens = self
            .parked
            .remove(&id)
            .map_or(0, |parked| parked.seq.generated_tokens());
        debug!(%id, ?reason, "taken out while waiting");
        // Counted by the queue (removed) when it left the queue, here or in
        // the handle's `cancel`; only the id remains to retire.
        self.live.retire(id);
        Some(Finished {
            id,
            reason,
            generated_tokens,
        })
    }
}
