//! kvbm-router through its public API.
#![cfg(not(kvbm_loom))]

mod fields;
mod fuzz;
mod index;
mod index_model;
mod index_stress;
mod message;
mod policies;
mod race;
mod router;
mod shortlist;

use kvbm_events::{BlockHash, BlockRemoved, BlockStored, KvEvent};

/// A stored event for integer-hashed blocks `keys` (tokens are not read).
pub(crate) fn stored(keys: &[u64]) -> KvEvent {
    KvEvent::BlockStored(BlockStored::new(
        keys.iter().map(|&k| BlockHash::Int(k)).collect(),
        None,
        Vec::new(),
        16,
    ))
}

/// A removed event for integer-hashed blocks `keys`.
pub(crate) fn removed(keys: &[u64]) -> KvEvent {
    KvEvent::BlockRemoved(BlockRemoved::new(
        keys.iter().map(|&k| BlockHash::Int(k)).collect(),
    ))
}

/// Cases per fuzz test: `KVBM_FUZZ_CASES` (`cargo xtask fuzz --cases N`),
/// else 256.
pub(crate) fn cases() -> u32 {
    std::env::var("KVBM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}
