//! [`SequenceError`], the one error type of this crate.

use kvbm_blocks::BlockError;

/// Everything that can go wrong in `kvbm-sequence`.
///
/// Every variant is caller misuse or a full pool, reported instead of
/// panicking. No variant carries block handles: whenever an operation refuses
/// blocks it was given (say, matched blocks that are not a prefix of the
/// sequence), it drops them, which returns them to their manager (registered
/// blocks stay cached), so nothing leaks and the sequence is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SequenceError {
    /// A sequence was created with `block_size == 0`.
    #[error("block size must be at least 1 token")]
    ZeroBlockSize,
    /// The manager's blocks hold a different number of tokens than the
    /// sequence's blocks.
    #[error("the sequence uses {sequence}-token blocks but the manager has {manager}-token blocks")]
    BlockSizeMismatch {
        /// The sequence's block size.
        sequence: usize,
        /// The manager's block size.
        manager: usize,
    },
    /// The sequence holds blocks of one manager and was handed another.
    #[error("the sequence holds blocks of a different block manager")]
    ForeignManager,
    /// More matched blocks than the sequence has unassigned full blocks.
    #[error(
        "{matched} matched blocks start at block {position} but the sequence has only {full_blocks} full blocks"
    )]
    MatchedBeyondSequence {
        /// Where the matched blocks would start (the assigned count).
        position: usize,
        /// How many blocks were matched.
        matched: usize,
        /// Full blocks in the sequence.
        full_blocks: usize,
    },
    /// A matched block does not hold the block the sequence has at its
    /// position: the matched blocks are not a prefix of this sequence.
    #[error(
        "matched block at position {position} has hash value {actual:#x} but the sequence expects {expected:#x}"
    )]
    MatchedHashMismatch {
        /// The block index that disagreed.
        position: usize,
        /// The chained hash value of the sequence's block there.
        expected: u128,
        /// The chained hash value of the block offered.
        actual: u128,
    },
    /// Matched blocks can only continue the assigned prefix, and staged
    /// blocks already sit there.
    #[error("{staged} staged blocks must be registered before matched blocks can be added")]
    StagedBlocksPending {
        /// Staged blocks in the way.
        staged: usize,
    },
    /// Appending would generate more than `max_output_tokens` tokens; nothing
    /// was appended.
    #[error(
        "cannot append {requested} tokens: {remaining} of {max_output_tokens} output tokens remain"
    )]
    MaxOutputTokensExceeded {
        /// Tokens the call tried to append.
        requested: usize,
        /// Tokens that may still be generated.
        remaining: usize,
        /// The request's output budget.
        max_output_tokens: usize,
    },
    /// A truncation target outside `min..=max`: it would cut into the prompt
    /// or lengthen the sequence.
    #[error("cannot truncate to {len} tokens: the length must lie in {min}..={max}")]
    TruncateOutOfRange {
        /// The length asked for.
        len: usize,
        /// The shortest allowed length.
        min: usize,
        /// The current length.
        max: usize,
    },
    /// A truncation target inside a registered block: the tokens kept in it
    /// have their KV in that block, which is immutable (other requests may
    /// share it), so the table could neither keep it nor map those tokens
    /// elsewhere. Truncate to a block boundary (or past the registered
    /// blocks) instead.
    #[error(
        "cannot truncate to {len} tokens: inside registered block {block} (registered blocks cover {registered_tokens} tokens; cut at a multiple of {block_size})"
    )]
    TruncateIntoRegistered {
        /// The length asked for.
        len: usize,
        /// The registered block it falls in.
        block: usize,
        /// Tokens the registered blocks cover.
        registered_tokens: usize,
        /// Tokens per block.
        block_size: usize,
    },
    /// `reacquire` needs a released sequence, and this one still holds blocks.
    #[error("the sequence still holds {held} blocks; release it before reacquiring")]
    NotReleased {
        /// Blocks the sequence holds.
        held: usize,
    },
    /// The manager could not supply the blocks; nothing was allocated.
    #[error("could not allocate {requested} blocks")]
    AllocationFailed {
        /// Blocks asked for.
        requested: usize,
        /// Why the manager refused.
        #[source]
        source: BlockError,
    },
    /// The block layer refused an operation.
    #[error(transparent)]
    Block(#[from] BlockError),
}
