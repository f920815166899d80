//! The payload types, field for field as vLLM 0.33's msgspec structs.

use kvbm_sequence::AttentionKind;
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
    /// The KV cache group the blocks belong to, for a model whose layers
    /// form several (vLLM 0.33 sends it on every event; a block's hash is
    /// the same in every group, so consumers key blocks by both). Left out
    /// when `None`, as msgspec leaves out a default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_idx: Option<i64>,
    /// The group's attention kind, as vLLM's `KVCacheSpecKind` names it
    /// (`"full_attention"`, `"sliding_window"`,
    /// `"chunked_local_attention"`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_cache_spec_kind: Option<String>,
    /// A sliding-window group's window, in tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_cache_spec_sliding_window: Option<i64>,
}

/// vLLM's `BlockRemoved`: blocks that left the cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BlockRemoved {
    /// The blocks' hashes.
    pub block_hashes: Vec<BlockHash>,
    /// Where the blocks lived.
    pub medium: Option<String>,
    /// The KV cache group the blocks belonged to (see
    /// [`BlockStored::group_idx`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_idx: Option<i64>,
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
            group_idx: None,
            kv_cache_spec_kind: None,
            kv_cache_spec_sliding_window: None,
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

    /// The same event, for KV cache group `index` of the kind `group`
    /// describes.
    pub fn with_group(mut self, index: i64, group: &WireGroup) -> Self {
        self.group_idx = Some(index);
        self.kv_cache_spec_kind = Some(group.kind.clone());
        self.kv_cache_spec_sliding_window = group.sliding_window;
        self
    }
}

/// What vLLM's events say of a KV cache group besides its index: its
/// attention kind (`kv_cache_spec_kind`) and a sliding window's size.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WireGroup {
    /// vLLM's `KVCacheSpecKind` value, e.g. `"full_attention"`.
    pub kind: String,
    /// The window of a sliding-window group, in tokens.
    pub sliding_window: Option<i64>,
}

impl WireGroup {
    /// A group of `kind` (vLLM's `KVCacheSpecKind` value) with
    /// `sliding_window` tokens of window, if it slides.
    pub fn new(kind: impl Into<String>, sliding_window: Option<i64>) -> Self {
        Self {
            kind: kind.into(),
            sliding_window,
        }
    }

    /// Whether a group of vLLM's `KVCacheSpecKind` value `kind` reads every
    /// earlier token (full attention, MLA, full attention with sinks), so
    /// its blocks cover whole prefixes.
    ///
    /// ```
    /// use kvbm_events::WireGroup;
    /// assert!(WireGroup::is_full_kind("full_attention"));
    /// assert!(!WireGroup::is_full_kind("sliding_window"));
    /// ```
    pub fn is_full_kind(kind: &str) -> bool {
        matches!(
            kind,
            "full_attention" | "mla_attention" | "sink_full_attention"
        )
    }

    /// The group of an [`AttentionKind`]: `full_attention`,
    /// `sliding_window` with its window, `chunked_local_attention`, as
    /// vLLM 0.33 names them; `unknown` for a kind it has no name for.
    ///
    /// ```
    /// use kvbm_events::WireGroup;
    /// use kvbm_sequence::AttentionKind;
    /// let window = WireGroup::from_attention(AttentionKind::SlidingWindow { window: 128 });
    /// assert_eq!((window.kind.as_str(), window.sliding_window), ("sliding_window", Some(128)));
    /// ```
    pub fn from_attention(kind: AttentionKind) -> Self {
        match kind {
            AttentionKind::Full => Self::new("full_attention", None),
            AttentionKind::SlidingWindow { window } => Self::new(
                "sliding_window",
                Some(i64::try_from(window).unwrap_or(i64::MAX)),
            ),
            AttentionKind::ChunkedLocal { .. } => Self::new("chunked_local_attention", None),
            _ => Self::new("unknown", None),
        }
    }
}

impl BlockRemoved {
    /// `block_hashes` left the cache; no medium.
    pub fn new(block_hashes: Vec<BlockHash>) -> Self {
        Self {
            block_hashes,
            medium: None,
            group_idx: None,
        }
    }

    /// The same event, on `medium`.
    pub fn with_medium(mut self, medium: impl Into<String>) -> Self {
        self.medium = Some(medium.into());
        self
    }

    /// The same event, for KV cache group `index`.
    pub fn with_group(mut self, index: i64) -> Self {
        self.group_idx = Some(index);
        self
    }
}
