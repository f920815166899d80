//! [`ScheduleError`] and [`ApplyError`], the errors of this crate.
//!
//! The seed splits them the way the protocol is split: a `schedule_*` call
//! (and matching, reacquiring) fails with a [`ScheduleError`], an `apply_*`
//! call (and reverting, releasing) with an [`ApplyError`]. Both are in this
//! one module and both wrap `kvbm-sequence`'s [`SequenceError`] for what the
//! lower layers refuse (a manager of another pool or block size, say).
//!
//! Every failed call is atomic: it allocates, registers and changes nothing,
//! and a failed `apply_*` leaves the schedule pending so a corrected retry
//! works.

use kvbm_blocks::BlockError;
use kvbm_sequence::SequenceError;

use crate::SequenceState;

/// Why a `schedule_*` call, [`match_and_add_prefix`] or [`reacquire`] refused.
/// The sequence is unchanged and no block was allocated.
///
/// [`match_and_add_prefix`]: crate::SchedulableSequence::match_and_add_prefix
/// [`reacquire`]: crate::SchedulableSequence::reacquire
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// A step is already scheduled: apply or revert it first.
    #[error("cannot {operation}: a step is already scheduled ({state:?})")]
    NotIdle {
        /// The refused call (`"schedule_decode"`, ...).
        operation: &'static str,
        /// The pending step.
        state: SequenceState,
    },
    /// Decode and speculative steps need every token but the tail one to
    /// have its KV computed; prefill (or recompute) chunks are still due.
    #[error(
        "prefill is not complete: {kv_position} of {prefill_target} tokens have their KV computed"
    )]
    PrefillNotComplete {
        /// Tokens whose KV is computed.
        kv_position: usize,
        /// Tokens the prefill path must compute before decoding.
        prefill_target: usize,
    },
    /// `schedule_prefill` with nothing left to prefill.
    #[error(
        "prefill is already complete: {kv_position} of {prefill_target} tokens have their KV computed"
    )]
    PrefillComplete {
        /// Tokens whose KV is computed.
        kv_position: usize,
        /// Tokens the prefill path computes.
        prefill_target: usize,
    },
    /// The chunk would run past the prefill target.
    #[error(
        "a prefill chunk of {num_tokens} tokens from position {kv_position} passes the prefill target of {prefill_target} tokens"
    )]
    PrefillOverrun {
        /// Where the chunk would start (tokens whose KV is computed).
        kv_position: usize,
        /// Tokens asked for.
        num_tokens: usize,
        /// Where prefill ends.
        prefill_target: usize,
    },
    /// The manager cannot supply the blocks the step needs; none were taken.
    #[error("cannot allocate {requested} blocks for the step: {available} available")]
    AllocationFailed {
        /// Blocks the step needs beyond those held.
        requested: usize,
        /// Free plus evictable cached blocks when the allocation was refused.
        available: usize,
        /// The refusal from the layers below.
        #[source]
        source: SequenceError,
    },
    /// The output budget is spent: no decode or speculative step remains.
    #[error(
        "generation is complete: {generated_tokens} of {max_output_tokens} output tokens generated"
    )]
    GenerationComplete {
        /// Tokens generated.
        generated_tokens: usize,
        /// The output budget.
        max_output_tokens: usize,
    },
    /// Decode and speculative steps need exactly one tail token (generated,
    /// KV not computed yet) to feed the model; this sequence has another
    /// count (0 for an empty prompt that never generated).
    #[error("a decode step needs exactly {expected} tail token but the sequence has {actual}")]
    WrongDanglingCount {
        /// Always 1.
        expected: usize,
        /// `tail_tokens()`.
        actual: usize,
    },
    /// [`reacquire`](crate::SchedulableSequence::reacquire) on a sequence
    /// that still holds blocks: release it first.
    #[error("the sequence still holds {held} blocks; release it before reacquiring")]
    NotReleased {
        /// Blocks held.
        held: usize,
    },
    /// [`take_hit`](crate::SchedulableSequence::take_hit) with blocks the
    /// sequence cannot match: past its last full block before the last
    /// token, or an inverted range.
    #[error("a hit of blocks {start}..{end} is outside the {matchable} matchable blocks")]
    HitBeyondPrompt {
        /// First block of the hit's needed range.
        start: usize,
        /// End of the needed range: the hit point.
        end: usize,
        /// Full blocks before the last token.
        matchable: usize,
    },
    /// The layers below refused: a manager with another block size, or of
    /// another pool than the blocks held ([`SequenceError::BlockSizeMismatch`],
    /// [`SequenceError::ForeignManager`]), or a zero block size at
    /// construction.
    #[error(transparent)]
    Sequence(#[from] SequenceError),
}

impl ScheduleError {
    /// The block-layer error behind an [`AllocationFailed`](Self::AllocationFailed)
    /// (`InsufficientBlocks`, `ExceedsCapacity`), if that is what this is.
    pub fn block_error(&self) -> Option<&BlockError> {
        match self {
            Self::AllocationFailed {
                source: SequenceError::AllocationFailed { source, .. },
                ..
            } => Some(source),
            _ => None,
        }
    }
}

/// Why an `apply_*` call, [`revert_schedule`] or [`release`] refused. The
/// sequence is unchanged: a pending schedule stays pending, so a corrected
/// retry works.
///
/// [`revert_schedule`]: crate::SchedulableSequence::revert_schedule
/// [`release`]: crate::SchedulableSequence::release
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    /// The call does not match the pending step (or there is none).
    #[error("cannot {operation}: expected {expected}, the sequence is in {actual:?}")]
    WrongState {
        /// The refused call (`"apply_decode"`, ...).
        operation: &'static str,
        /// The state the call needs (`"PrefillScheduled"`, `"Idle"`, `"a
        /// scheduled state"`, ...).
        expected: &'static str,
        /// The state the sequence is in.
        actual: SequenceState,
    },
    /// A token was given for a prefill chunk that emits none. Only the chunk
    /// that reaches the prefill target of a request that has generated
    /// nothing yet, with output budget left, carries the first generated
    /// token; recompute chunks after a preemption never do.
    #[error(
        "a token was given for a prefill chunk that emits none (the chunk ends at {chunk_end} of {prefill_target} tokens; {generated_tokens} of {max_output_tokens} output tokens generated)"
    )]
    TokenOnNonFinalChunk {
        /// Where the chunk ends.
        chunk_end: usize,
        /// Where prefill ends.
        prefill_target: usize,
        /// Tokens generated so far.
        generated_tokens: usize,
        /// The output budget.
        max_output_tokens: usize,
    },
    /// The chunk completes the prompt and must carry the first generated
    /// token (the one sampled from its last position).
    #[error(
        "the prefill chunk ending at the prompt's {prefill_target} tokens must carry the first generated token"
    )]
    MissingTokenOnFinalChunk {
        /// Where prefill ends (the prompt length).
        prefill_target: usize,
    },
    /// More accepted tokens than draft tokens were scheduled.
    #[error("{accepted} accepted tokens exceed the {scheduled} scheduled draft tokens")]
    AcceptedExceedsScheduled {
        /// Tokens given.
        accepted: usize,
        /// Draft tokens scheduled (after clamping to the output budget).
        scheduled: usize,
    },
    /// The layers below refused: a manager with another block size, or of
    /// another pool than the blocks held.
    #[error(transparent)]
    Sequence(#[from] SequenceError),
}
