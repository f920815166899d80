//! [`SequenceHash`]: what a full block holds, identified together with its prefix.

use std::fmt;

use crate::BlockError;

/// The identity of a full block's content *and its whole prefix*.
///
/// Two blocks have the same `value` exactly when they hold the same tokens
/// after the same prefix, so the value alone is the cache key. The parent's
/// value and the block's position ride along as lineage: lineage-aware
/// eviction uses them to keep shared prefixes alive.
///
/// The token hashing itself belongs to `kvbm-sequence`; callers that already
/// have chained block hashes (for example a trace whose ids encode their
/// prefix) build them directly:
///
/// ```
/// use kvbm_blocks::SequenceHash;
/// let root = SequenceHash::root(0xa1);
/// let next = root.child(0xb2);
/// assert_eq!(next.parent(), Some(0xa1));
/// assert_eq!(next.position(), 1);
/// assert_eq!(SequenceHash::from_parts(0xb2, Some(0xa1), 1)?, next);
/// # Ok::<(), kvbm_blocks::BlockError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SequenceHash {
    value: u64,
    /// Meaningful only when `position > 0`; zero for roots.
    parent: u64,
    position: u32,
}

impl SequenceHash {
    /// The first block of a sequence (position 0, no parent).
    pub const fn root(value: u64) -> Self {
        Self {
            value,
            parent: 0,
            position: 0,
        }
    }

    /// The block that follows `self`, whose chained hash is `value`.
    ///
    /// The position saturates at `u32::MAX` (four billion blocks) instead of
    /// wrapping; positions are lineage metadata, never part of the key.
    pub const fn child(self, value: u64) -> Self {
        Self {
            value,
            parent: self.value,
            position: self.position.saturating_add(1),
        }
    }

    /// Builds a hash from raw parts, checking that position 0 has no parent
    /// and every other position has one.
    ///
    /// # Errors
    ///
    /// [`BlockError::InvalidSequenceHash`] when the parent and position disagree.
    pub const fn from_parts(
        value: u64,
        parent: Option<u64>,
        position: u32,
    ) -> Result<Self, BlockError> {
        match (parent, position) {
            (None, 0) => Ok(Self::root(value)),
            (Some(parent), 1..) => Ok(Self {
                value,
                parent,
                position,
            }),
            (parent, position) => Err(BlockError::InvalidSequenceHash {
                position,
                has_parent: parent.is_some(),
            }),
        }
    }

    /// The chained hash: the cache key.
    pub const fn value(self) -> u64 {
        self.value
    }

    /// The parent block's chained hash, `None` for a root.
    pub const fn parent(self) -> Option<u64> {
        if self.position == 0 {
            None
        } else {
            Some(self.parent)
        }
    }

    /// The block's index in its sequence (0 for the first block).
    pub const fn position(self) -> u32 {
        self.position
    }

    /// Whether this is the first block of a sequence.
    pub const fn is_root(self) -> bool {
        self.position == 0
    }
}

impl fmt::Debug for SequenceHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.parent() {
            Some(parent) => write!(
                f,
                "SequenceHash({:#018x} @{} <- {:#018x})",
                self.value, self.position, parent
            ),
            None => write!(f, "SequenceHash({:#018x} @0)", self.value),
        }
    }
}
