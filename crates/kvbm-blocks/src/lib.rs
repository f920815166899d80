//! KV-cache blocks: the bottom layer of kvbm.
//!
//! A *block* is a fixed-size slot of KV memory (`block_size` tokens), named by
//! a [`BlockId`] that doubles as its page index. A [`BlockManager`] owns a pool
//! of them and moves each through type-state RAII handles:
//!
//! - [`MutableBlock`]: allocated, being filled; dropping it frees the block.
//!   [`MutableBlocks`] holds a run of them behind one handle (the
//!   destinations of a copy between tiers), registered or freed under one
//!   lock.
//! - [`CompleteBlock`]: full, tagged with the [`SequenceHash`] of its tokens
//!   and their whole prefix; not yet visible to others.
//! - [`ImmutableBlock`] / [`ImmutableBlocks`]: registered, shared, matchable
//!   by any request. When the last handle drops, the block joins the
//!   *inactive pool*: still matchable, evicted only when allocations need
//!   room, in the order of the configured [`EvictionPolicy`].
//! - [`WeakBlock`]: names a registered block without keeping it.
//!
//! Every block is in exactly one place at all times: free, in use (held by
//! handles), or inactive (cached), and `free + inactive + in_use == total`
//! ([`BlockManager::audit`] recounts it).
//!
//! This crate knows nothing about tokens, sequences or requests; those are
//! `kvbm-sequence`'s and the layers' above.
//!
//! # Example: prefix reuse and eviction
//!
//! ```
//! use kvbm_blocks::{BlockManager, SequenceHash};
//!
//! struct Gpu; // a storage-tier marker
//!
//! let manager = BlockManager::<Gpu>::builder().block_count(4).block_size(16).build()?;
//!
//! // A request fills two blocks and publishes them.
//! let a = SequenceHash::root(0xa);
//! let b = a.child(0xb);
//! let staged = manager
//!     .allocate_blocks(2)?
//!     .into_iter()
//!     .zip([a, b])
//!     .map(|(block, hash)| block.stage(hash, 16))
//!     .collect::<Result<Vec<_>, _>>()?;
//! let request_one = manager.register_blocks(staged)?;
//! drop(request_one); // finished: both blocks are cached (deepest first), not freed
//! assert_eq!(manager.metrics().inactive_blocks, 2);
//!
//! // A second request with the same prefix finds both blocks.
//! let hit = manager.match_blocks(&[a, b, b.child(0xc)]);
//! assert_eq!(hit.len(), 2);
//! drop(hit);
//!
//! // Allocating the whole pool evicts the cached blocks, chain end first,
//! // and says which.
//! let all = manager.allocate_blocks_with_evictions(4)?;
//! assert_eq!(all.evicted, [b, a]);
//! assert!(manager.match_blocks(&[a]).is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod builder;
mod config;
mod error;
mod events;
mod eviction;
mod handles;
mod hash;
mod id;
mod manager;
mod metrics;
mod pool;
mod read_ahead;
mod sync;

pub use builder::{BlockManagerBuilder, MAX_BLOCKS};
pub use config::{DuplicatePolicy, EvictionPolicy};
pub use error::{BlockError, Rejected};
pub use events::{
    CacheEvent, EventBatch, EventMessage, EventSubscription, Events, MAX_PENDING_BLOCKS, Resync,
};
pub use eviction::sketch::FrequencySketch;
pub use handles::{
    BlockInfo, CompleteBlock, ImmutableBlock, ImmutableBlocks, IntoIter, MutableBlock,
    MutableBlocks, WeakBlock,
};
pub use hash::SequenceHash;
pub use id::BlockId;
pub use manager::{Allocation, BlockManager};
pub use metrics::{PoolAudit, PoolMetrics};

/// The README's examples, run as doctests (the item exists only then).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
