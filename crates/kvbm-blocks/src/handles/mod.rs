//! The type-state RAII handles, one state per type:
//!
//! ```text
//! MutableBlock ──stage──▶ CompleteBlock ──register──▶ ImmutableBlock ⇄ WeakBlock
//!      ▲                        │ reset                  (many: ImmutableBlocks)
//!      └────────────────────────┘
//! ```
//!
//! Dropping a `MutableBlock` or `CompleteBlock` frees its block; dropping the
//! last handle of a registered block caches it. Handles may move to and drop
//! on any thread.

mod batch;
mod held;
mod held_batch;
mod lease;
mod registered;

use crate::hash::join;
use crate::{BlockId, SequenceHash};

pub use self::batch::{ImmutableBlocks, IntoIter};
pub use self::held::{CompleteBlock, MutableBlock};
pub use self::held_batch::MutableBlocks;
pub(crate) use self::lease::Lease;
pub use self::registered::{ImmutableBlock, WeakBlock};

/// A registered block as seen through a batch of handles: its slot, its
/// chained hash value (the cache key) and its position.
///
/// 32 bytes, because a request's block table and every matched prefix hold
/// one per block. The parent's value, lineage metadata, is not kept here;
/// [`ImmutableBlock::sequence_hash`] reads the whole [`SequenceHash`] from the
/// pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockInfo {
    value: [u64; 2],
    position: u32,
    id: BlockId,
    epoch: u32,
}

impl BlockInfo {
    pub(crate) fn new(id: BlockId, epoch: u32, hash: SequenceHash) -> Self {
        let (value, _parent, position) = hash.to_raw();
        Self::from_raw(id, epoch, value, position)
    }

    /// From a slot's raw fields (value halves, low first).
    #[inline]
    pub(crate) fn from_raw(id: BlockId, epoch: u32, value: [u64; 2], position: u32) -> Self {
        Self {
            value,
            position,
            id,
            epoch,
        }
    }

    /// The slot (page index) holding the block.
    pub fn block_id(&self) -> BlockId {
        self.id
    }

    /// The block's chained hash value: its content and prefix identity,
    /// [`SequenceHash::value`].
    pub fn hash_value(&self) -> u128 {
        join(self.value)
    }

    /// The block's index in its sequence, [`SequenceHash::position`].
    pub fn position(&self) -> u32 {
        self.position
    }

    /// Whether the block holds `hash`'s content after its prefix (equal
    /// values and positions).
    pub fn holds(&self, hash: SequenceHash) -> bool {
        self.hash_value() == hash.value() && self.position == hash.position()
    }

    pub(crate) fn epoch(&self) -> u32 {
        self.epoch
    }
}
