//! [`SequenceHash`]: what a full block holds, identified together with its prefix.

use std::fmt;

use crate::BlockError;

/// The identity of a full block's content *and its whole prefix*.
///
/// Two blocks have the same `value` exactly when they hold the same tokens
/// after the same prefix, so the value alone is the cache key. Values are
/// 128 bits: at 2^32 cached blocks the chance that two distinct prefixes
/// share one is about 2^-65, where 64-bit values would make it near 1/2
/// (kvbm-logical keys its registry with `u128` too). The parent's
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
    /// The values are stored as halves (low first), not `u128`s: that keeps
    /// the struct 8-byte aligned, 40 bytes instead of 48, in every pool slot.
    value: [u64; 2],
    /// Meaningful only when `position > 0`; zero for roots.
    parent: [u64; 2],
    position: u32,
}

/// `value` as two halves, low first.
const fn split(value: u128) -> [u64; 2] {
    [value as u64, (value >> 64) as u64]
}

/// The value of two halves, low first.
pub(crate) const fn join(halves: [u64; 2]) -> u128 {
    halves[0] as u128 | (halves[1] as u128) << 64
}

impl SequenceHash {
    /// The first block of a sequence (position 0, no parent).
    pub const fn root(value: u128) -> Self {
        Self {
            value: split(value),
            parent: [0; 2],
            position: 0,
        }
    }

    /// The block that follows `self`, whose chained hash is `value`.
    ///
    /// The position saturates at `u32::MAX` (four billion blocks) instead of
    /// wrapping; positions are lineage metadata, never part of the key.
    pub const fn child(self, value: u128) -> Self {
        Self {
            value: split(value),
            parent: self.value,
            position: self.position.saturating_add(1),
        }
    }

    /// The same block's hash in another key space: `tag` XORed onto the
    /// chained value and onto the parent's (a root keeps having none), at
    /// the same position. Retagging a chain keeps it a chain, and
    /// retagging twice with one tag gives the hash back. (Layer groups of
    /// one request key their blocks so: the request's chain, each group
    /// under a tag of its own.)
    ///
    /// ```
    /// use kvbm_blocks::SequenceHash;
    /// let root = SequenceHash::root(5);
    /// let child = root.child(9);
    /// assert_eq!(child.retagged(3), root.retagged(3).child(9 ^ 3));
    /// assert_eq!(child.retagged(3).retagged(3), child);
    /// assert_eq!(root.retagged(3).parent(), None);
    /// ```
    #[inline]
    pub const fn retagged(self, tag: u128) -> Self {
        let tag = split(tag);
        // A root's parent stays zero: the tag is masked off for it rather
        // than branched on, so retagging a chain is a straight loop.
        let child = ((self.position != 0) as u64).wrapping_neg();
        Self {
            value: [self.value[0] ^ tag[0], self.value[1] ^ tag[1]],
            parent: [
                self.parent[0] ^ (tag[0] & child),
                self.parent[1] ^ (tag[1] & child),
            ],
            position: self.position,
        }
    }

    /// Builds a hash from raw parts, checking that position 0 has no parent
    /// and every other position has one.
    ///
    /// # Errors
    ///
    /// [`BlockError::InvalidSequenceHash`] when the parent and position disagree.
    pub const fn from_parts(
        value: u128,
        parent: Option<u128>,
        position: u32,
    ) -> Result<Self, BlockError> {
        match (parent, position) {
            (None, 0) => Ok(Self::root(value)),
            (Some(parent), 1..) => Ok(Self {
                value: split(value),
                parent: split(parent),
                position,
            }),
            (parent, position) => Err(BlockError::InvalidSequenceHash {
                position,
                has_parent: parent.is_some(),
            }),
        }
    }

    /// The chained hash: the cache key.
    pub const fn value(self) -> u128 {
        join(self.value)
    }

    /// The parent block's chained hash, `None` for a root.
    pub const fn parent(self) -> Option<u128> {
        if self.position == 0 {
            None
        } else {
            Some(join(self.parent))
        }
    }

    /// The block's index in its sequence (0 for the first block).
    pub const fn position(self) -> u32 {
        self.position
    }

    /// The stored halves (value, parent) and position, for structures that
    /// lay them out beside other fields without the struct's padding.
    pub(crate) const fn to_raw(self) -> ([u64; 2], [u64; 2], u32) {
        (self.value, self.parent, self.position)
    }

    /// The hash [`to_raw`](Self::to_raw) took apart.
    pub(crate) const fn from_raw(value: [u64; 2], parent: [u64; 2], position: u32) -> Self {
        Self {
            value,
            parent,
            position,
        }
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
                "SequenceHash({:#034x} @{} <- {:#034x})",
                self.value(),
                self.position,
                parent
            ),
            None => write!(f, "SequenceHash({:#034x} @0)", self.value()),
        }
    }
}
