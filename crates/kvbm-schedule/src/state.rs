//! [`SequenceState`], where a sequence stands in the schedule/apply protocol,
//! and [`DecodeOutcome`], what a committed decode step did.

/// Where a [`SchedulableSequence`](crate::SchedulableSequence) stands in the
/// schedule/apply protocol.
///
/// Every `schedule_*` call moves `Idle` to one of the scheduled states; the
/// matching `apply_*` call or
/// [`revert_schedule`](crate::SchedulableSequence::revert_schedule) moves it
/// back. The scheduled states remember what the step pre-allocated, so a
/// revert gives exactly those blocks back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SequenceState {
    /// No step is pending: the sequence may be scheduled, matched, released
    /// or reacquired.
    Idle,
    /// A prefill chunk is scheduled.
    PrefillScheduled {
        /// Tokens in the chunk (their KV is computed by the step).
        num_tokens: usize,
        /// Blocks the schedule allocated for the chunk.
        blocks_allocated: usize,
    },
    /// A decode step is scheduled: the forward pass computes the KV of the
    /// one tail token and samples the next token.
    DecodeScheduled {
        /// Blocks the schedule allocated (0 or 1: the block of the tail
        /// token's slot).
        blocks_allocated: usize,
    },
    /// A speculative step is scheduled: the forward pass computes the KV of
    /// the tail token and of `num_tokens` draft tokens.
    SpeculativeScheduled {
        /// Draft tokens scheduled, after clamping to the output budget.
        num_tokens: usize,
        /// Blocks the schedule allocated for the tail token and the drafts.
        blocks_allocated: usize,
    },
}

impl SequenceState {
    /// Whether no step is pending.
    pub fn is_idle(&self) -> bool {
        matches!(self, Self::Idle)
    }

    /// Blocks the pending step allocated (0 when idle): what
    /// [`revert_schedule`](crate::SchedulableSequence::revert_schedule)
    /// would give back.
    pub fn blocks_allocated(&self) -> usize {
        match *self {
            Self::Idle => 0,
            Self::PrefillScheduled {
                blocks_allocated, ..
            }
            | Self::DecodeScheduled { blocks_allocated }
            | Self::SpeculativeScheduled {
                blocks_allocated, ..
            } => blocks_allocated,
        }
    }
}

/// What a committed decode or speculative step did, from
/// [`apply_decode`](crate::SchedulableSequence::apply_decode) and
/// [`apply_speculative`](crate::SchedulableSequence::apply_speculative).
///
/// **Block completed** means an appended token filled the last slot of a
/// block: the block is now full *in tokens*. It is registered (matchable by
/// other requests) only once its KV is computed too, i.e. once
/// [`kv_position`](crate::SchedulableSequence::kv_position) covers it. For a
/// decode step that is the *next* committed step, which computes the KV of
/// the token just appended; for a speculative step, blocks filled by accepted
/// tokens other than the last are registered by this very step, and a block
/// filled by the last accepted token waits for the next one. If the request
/// ends first (max length, release), that block is never registered.
///
/// **Max length** means the output budget is spent
/// ([`is_complete`](crate::SchedulableSequence::is_complete)): no further
/// decode or speculative step can be scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecodeOutcome {
    /// No block filled and budget left.
    Continue,
    /// An appended token filled a block; budget left.
    BlockCompleted,
    /// The output budget is spent; no block filled.
    MaxLength,
    /// An appended token filled a block and the output budget is spent.
    BlockCompletedAndMaxLength,
}

impl DecodeOutcome {
    /// The outcome for a step that did or did not fill a block and did or
    /// did not spend the output budget.
    pub fn new(block_completed: bool, max_length: bool) -> Self {
        match (block_completed, max_length) {
            (false, false) => Self::Continue,
            (true, false) => Self::BlockCompleted,
            (false, true) => Self::MaxLength,
            (true, true) => Self::BlockCompletedAndMaxLength,
        }
    }

    /// Whether an appended token filled a block.
    pub fn block_completed(&self) -> bool {
        matches!(
            self,
            Self::BlockCompleted | Self::BlockCompletedAndMaxLength
        )
    }

    /// Whether the output budget is spent.
    pub fn is_max_length(&self) -> bool {
        matches!(self, Self::MaxLength | Self::BlockCompletedAndMaxLength)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_round_trips_its_two_flags() {
        for completed in [false, true] {
            for max in [false, true] {
                let outcome = DecodeOutcome::new(completed, max);
                assert_eq!(
                    (outcome.block_completed(), outcome.is_max_length()),
                    (completed, max)
                );
            }
        }
    }

    #[test]
    fn blocks_allocated_reads_every_scheduled_state() {
        assert_eq!(SequenceState::Idle.blocks_allocated(), 0);
        let prefill = SequenceState::PrefillScheduled {
            num_tokens: 8,
            blocks_allocated: 2,
        };
        let decode = SequenceState::DecodeScheduled {
            blocks_allocated: 1,
        };
        let spec = SequenceState::SpeculativeScheduled {
            num_tokens: 3,
            blocks_allocated: 3,
        };
        assert_eq!(
            [prefill, decode, spec].map(|s| s.blocks_allocated()),
            [2, 1, 3]
        );
        assert!(SequenceState::Idle.is_idle() && !decode.is_idle());
    }
}
