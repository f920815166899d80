//! `revert_schedule`: undo a scheduled step without applying it.

use tracing::debug;

use crate::{ApplyError, SchedulableSequence, SequenceEvent, SequenceState};

impl<M> SchedulableSequence<M> {
    /// Undoes the scheduled step (the model did not run, or its result is
    /// discarded): the blocks the schedule allocated go back to the free
    /// pool, last allocated first, and the sequence is idle again, exactly as
    /// before the schedule.
    ///
    /// # Errors
    ///
    /// [`ApplyError::WrongState`] if no step is scheduled; nothing changes.
    pub fn revert_schedule(&mut self) -> Result<(), ApplyError> {
        let reverted = self.state;
        if reverted.is_idle() {
            return Err(ApplyError::WrongState {
                operation: "revert_schedule",
                expected: "a scheduled state",
                actual: reverted,
            });
        }
        // Nothing touches the blocks between a schedule and its apply or
        // revert (a failed apply changes nothing), so the schedule's blocks
        // are the last unassigned ones.
        let blocks_released = self.inner.release_unassigned(reverted.blocks_allocated());
        if blocks_released != reverted.blocks_allocated() {
            // Unreachable while failed applies change nothing; if it ever
            // happens the sequence is still consistent, with fewer blocks.
            tracing::warn!(
                blocks_released,
                allocated = reverted.blocks_allocated(),
                "revert released fewer blocks than the schedule allocated"
            );
        }
        self.state = SequenceState::Idle;
        debug!(?reverted, blocks_released, "schedule reverted");
        self.record(SequenceEvent::ScheduleReverted {
            reverted,
            blocks_released,
        });
        Ok(())
    }
}
