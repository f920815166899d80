//! [`BlockId`]: the index of a block's slot of KV memory.

use std::fmt;

/// Identifies one fixed-size slot of KV memory in a [`BlockManager`](crate::BlockManager).
///
/// Ids run from `0` to `total_blocks() - 1`, so an id is directly usable as a
/// page index into the KV tensor, as an attention kernel's block table wants.
///
/// ```
/// use kvbm_blocks::BlockId;
/// let id = BlockId::new(7);
/// assert_eq!(id.index(), 7);
/// assert_eq!(id.get(), 7u32);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockId(u32);

impl BlockId {
    /// Wraps a raw slot index.
    pub const fn new(index: u32) -> Self {
        Self(index)
    }

    /// The slot index as a `u32`, the width block tables usually use.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// The slot index as a `usize`, for indexing.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

impl From<BlockId> for u32 {
    fn from(id: BlockId) -> u32 {
        id.0
    }
}
