//! [`Scheduler::abort`]: takes one request out wherever it is.

use tracing::debug;

use super::{FinishReason, Finished, RequestId, Scheduler, SchedulerError};

impl<M> Scheduler<M> {
    /// Takes a request out wherever it is: waiting (new or preempted) or
    /// running (even mid-step: its scheduled work is reverted, and its
    /// output, if the engine still sends one, is ignored). Everything it
    /// held goes back to the pool; its registered blocks stay cached.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::UnknownRequest`] if it is neither waiting nor running.
    pub fn abort(&mut self, id: RequestId) -> Result<Finished, SchedulerError> {
        if let Some(index) = self.running.iter().position(|r| r.id() == id) {
            let mut running = self.running.swap_remove(index);
            if running.work.take().is_some() {
                let reverted = running.seq.revert_schedule();
                debug_assert!(reverted.is_ok(), "{id} had work but no schedule");
                if let Some(pending) = &mut self.pending {
                    pending.aborted.insert(id);
                }
            }
            debug!(%id, "aborted while running");
            return Ok(self.exit(id, FinishReason::Aborted, running.seq.generated_tokens()));
        }
        if self.queue.remove(id).is_some() {
            let generated_tokens = self
                .parked
                .remove(&id)
                .map_or(0, |seq| seq.generated_tokens());
            debug!(%id, "aborted while waiting");
            self.live.retire(id);
            return Ok(Finished {
                id,
                reason: FinishReason::Aborted,
                generated_tokens,
            });
        }
        Err(SchedulerError::UnknownRequest { id })
    }
}
