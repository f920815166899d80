//! [`BlockError`], the one error type of this crate, and [`Rejected`], which
//! hands a consumed handle back to the caller when an operation refuses it.

use std::fmt;

/// Everything that can go wrong in `kvbm-blocks`.
///
/// Operations that consume a handle (staging, registering) wrap this in a
/// [`Rejected`] so the handle comes back instead of being lost.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BlockError {
    /// The builder was given no blocks (or `block_count(0)`).
    #[error("block count must be at least 1")]
    ZeroBlockCount,
    /// The builder was given `block_size(0)`.
    #[error("block size must be at least 1 token")]
    ZeroBlockSize,
    /// More blocks than a [`BlockId`](crate::BlockId) can address.
    #[error("block count {requested} exceeds the maximum of {max}")]
    TooManyBlocks {
        /// The block count asked for.
        requested: usize,
        /// The largest block count a pool supports.
        max: usize,
    },
    /// The memory for a pool of this many blocks could not be had (its
    /// bookkeeping takes a few dozen bytes per block).
    #[error("cannot allocate the bookkeeping for a pool of {blocks} blocks: out of memory")]
    OutOfMemory {
        /// The block count asked for.
        blocks: usize,
    },
    /// An allocation larger than the whole pool: it can never succeed.
    #[error("requested {requested} blocks but the pool only has {total}")]
    ExceedsCapacity {
        /// Blocks asked for.
        requested: usize,
        /// Blocks the pool has in total.
        total: usize,
    },
    /// Not enough free or evictable blocks right now; nothing was allocated.
    #[error("requested {requested} blocks but only {available} are available")]
    InsufficientBlocks {
        /// Blocks asked for.
        requested: usize,
        /// Free plus evictable cached blocks at the time of the call.
        available: usize,
    },
    /// A block was staged with a token count other than the block size.
    #[error("a block holds {expected} tokens but {actual} were staged")]
    TokenCountMismatch {
        /// The manager's block size.
        expected: usize,
        /// The token count given to `stage`.
        actual: usize,
    },
    /// A handle was given to a manager other than the one it came from.
    #[error("the block belongs to a different block manager")]
    ForeignManager,
    /// [`BlockManager::register_batch`](crate::BlockManager::register_batch)
    /// got a hash count other than its block count.
    #[error("{blocks} blocks cannot be registered under {hashes} hashes")]
    HashCountMismatch {
        /// Blocks in the batch.
        blocks: usize,
        /// Hashes given for them.
        hashes: usize,
    },
    /// `SequenceHash::from_parts` got a parent at position 0, or none elsewhere.
    #[error("a sequence hash at position {position} {}", if *.has_parent { "cannot have a parent" } else { "needs a parent" })]
    InvalidSequenceHash {
        /// The position given.
        position: u32,
        /// Whether a parent was given.
        has_parent: bool,
    },
    /// [`BlockManager::audit`](crate::BlockManager::audit) found the pool
    /// inconsistent. This is a bug in this crate; please report it.
    #[error("block pool invariant violated: {0}")]
    InvariantViolated(String),
}

/// An operation refused a handle it would have consumed; the handle is inside.
///
/// Like tokio's `TrySendError`, this gives ownership back: nothing is leaked
/// or silently returned to the pool, so the caller can fix the input and retry.
///
/// ```
/// use kvbm_blocks::{BlockError, BlockManager, SequenceHash};
/// # struct Gpu;
/// let manager = BlockManager::<Gpu>::builder().block_count(4).block_size(16).build()?;
/// let block = manager.allocate_blocks(1)?.pop().unwrap();
/// let rejected = block.stage(SequenceHash::root(1), 15).unwrap_err();
/// assert_eq!(rejected.error(), &BlockError::TokenCountMismatch { expected: 16, actual: 15 });
/// let block = rejected.into_inner(); // still ours, still allocated
/// assert_eq!(manager.available_blocks(), 3);
/// # drop(block);
/// # Ok::<(), kvbm_blocks::BlockError>(())
/// ```
pub struct Rejected<T> {
    error: BlockError,
    value: T,
}

impl<T> Rejected<T> {
    pub(crate) fn new(error: BlockError, value: T) -> Self {
        Self { error, value }
    }

    /// Why the operation refused the value.
    pub fn error(&self) -> &BlockError {
        &self.error
    }

    /// Takes the refused value back.
    pub fn into_inner(self) -> T {
        self.value
    }

    /// Splits into the reason and the refused value.
    pub fn into_parts(self) -> (BlockError, T) {
        (self.error, self.value)
    }
}

impl<T> fmt::Debug for Rejected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejected")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Display for Rejected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<T> std::error::Error for Rejected<T> {}

impl<T> From<Rejected<T>> for BlockError {
    fn from(rejected: Rejected<T>) -> Self {
        rejected.error
    }
}
