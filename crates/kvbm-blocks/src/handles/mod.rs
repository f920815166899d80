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
mod lease;
mod registered;

use crate::{BlockId, SequenceHash};

pub use self::batch::{ImmutableBlocks, IntoIter};
pub use self::held::{CompleteBlock, MutableBlock};
pub(crate) use self::lease::Lease;
pub use self::registered::{ImmutableBlock, WeakBlock};

/// A registered block as seen through a handle: its slot and its content.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockInfo {
    hash: SequenceHash,
    id: BlockId,
    epoch: u32,
}

impl BlockInfo {
    pub(crate) fn new(id: BlockId, epoch: u32, hash: SequenceHash) -> Self {
        Self { hash, id, epoch }
    }

    /// The slot (page index) holding the block.
    pub fn block_id(&self) -> BlockId {
        self.id
    }

    /// The content and prefix identity of the block.
    pub fn sequence_hash(&self) -> SequenceHash {
        self.hash
    }

    pub(crate) fn epoch(&self) -> u32 {
        self.epoch
    }
}
