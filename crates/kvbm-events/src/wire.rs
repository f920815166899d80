//! The payload types, field for field as vLLM 0.33's msgspec structs.

use serde::{Deserialize, Serialize};

use crate::BlockHash;

mod de;

/// One message's payload: when, what, and which data-parallel rank said it.
///
/// On the wire a 3-element array `[ts, events, data_parallel_rank]`
/// (msgspec `array_like`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct KvEventBatch(pub f64, pub Vec<KvEvent>, pub Option<i64>);

impl KvEventBatch {
    /// A batch of `events` at `ts` (seconds since the epoch, as vLLM's
    /// `time.time()`), from no particular data-parallel rank.
    pub fn new(ts: f64, events: Vec<KvEvent>) -> Self {
        Self(ts, events, None)
    }

    /// The same batch, from data-parallel rank `rank`.
    pub fn with_rank(mut self, rank: i64) -> Self {
        self.2 = Some(rank);
        self
    }

    /// The timestamp.
    pub fn ts(&self) -> f64 {
        self.0
    }

    /// The events, oldest first.
    pub fn events(&self) -> &[KvEvent] {
        &self.1
    }

    /// The data-parallel rank, if any.
    pub fn data_parallel_rank(&self) -> Option<i64> {
        self.2
    }
}

/// One cache change, tagged by vLLM's class name under `"type"`.
///
/// Read in one pass, whatever the order of the map's keys, each field
/// straight into its type (no buffering of the map); fields this crate
/// does not know are skipped. A missing or unknown `"type"`, a missing
/// required field (`block_hashes`; for `BlockStored` also `token_ids` and
/// `block_size`), a field given twice or a known field of the wrong type
/// (in any event type) is an error; optional fields left out read as
/// `None`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type")]
pub enum KvEvent {
    /// Consecutive blocks of one sequence became cached.
    BlockStored(BlockStored),
    /// Blocks left the cache.
    BlockRemoved(BlockRemoved),
    /// Every block left the cache.
    AllBlocksCleared,
}

/// vLLM's `BlockStored`: consecutive blocks of one sequence, now cached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BlockStored {
    /// The blocks' hashes, in sequence order.
    pub block_hashes: Vec<BlockHash>,
    /// The hash of the block before the first one (`None` at a sequence's
    /// start). Routers link the chain through it, so it must have been
    /// stored before (or be in the same batch).
    pub parent_block_hash: Option<BlockHash>,
    /// Every token of those blocks, `block_size × block_hashes.len()` of
    /// them: routers hash them to match queries.
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: u32,
    /// Deprecated in vLLM (`lora_name` replaces it); always written, nil.
    pub lora_id: Option<i64>,
    /// Where the blocks live: `"GPU"`, `"CPU"` or `"STORAGE"`.
    pub medium: Option<String>,
    /// The LoRA adapter the blocks belong to, if any.
    pub lora_name: Option<String>,
}

/// vLLM's `BlockRemoved`: blocks that left the cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BlockRemoved {
    /// The blocks' hashes.
    pub block_hashes: Vec<BlockHash>,
    /// Where the blocks lived.
    pub medium: Option<String>,
}

impl BlockStored {
    /// `block_hashes` (in sequence order, the first one a child of
    /// `parent_block_hash`) holding `token_ids`, `block_size` per block; no
    /// medium, no LoRA adapter.
    pub fn new(
        block_hashes: Vec<BlockHash>,
        parent_block_hash: Option<BlockHash>,
        token_ids: Vec<u32>,
        block_size: u32,
    ) -> Self {
        Self {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_id: None,
            medium: None,
            lora_name: None,
        }
    }

    /// The same event, on `medium` (`"GPU"`, `"CPU"`, `"STORAGE"`).
    pub fn with_medium(mut self, medium: impl Into<String>) -> Self {
        self.medium = Some(medium.into());
        self
    }

    /// The same event, for the LoRA adapter `lora_name`.
    pub fn with_lora_name(mut self, lora_name: impl Into<String>) -> Self {
        self.lora_name = Some(lora_name.into());
        self
    }
}

impl BlockRemoved {
    /// `block_hashes` left the cache; no medium.
    pub fn new(block_hashes: Vec<BlockHash>) -> Self {
        Self {
            block_hashes,
            medium: None,
        }
    }

    /// The same event, on `medium`.
    pub fn with_medium(mut self, medium: impl Into<String>) -> Self {
        self.medium = Some(medium.into());
        self
    }
}
