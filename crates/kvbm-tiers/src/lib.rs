//! KV-cache tiers below the device: the bookkeeping of host memory, disk and
//! other stores that keep KV the GPU has no room for, as NVIDIA Dynamo's
//! KVBM (G1 device, G2 host, G3 disk), vLLM's offloading connector, SGLang's
//! HiCache and LMCache do.
//!
//! [`Tiers`] keeps the device pool (the scheduler's [`BlockManager`]) above
//! one or more lower tiers, each a [`BlockManager`] of its own with its own
//! capacity and eviction policy, all keyed by the same [`SequenceHash`]es.
//! It decides what to copy where ([`OffloadPolicy`] per lower tier:
//! write-through, selective after K hits, write-back on eviction), finds a
//! request's prefix across tiers ([`Tiers::lookup`]), plans loads that bring
//! it up ([`Tiers::onboard`]), and hands the engine [`Transfer`]s to run.
//! Every copy is two-phase: planned, then completed or failed by the
//! engine; only a completed copy's destination becomes matchable, and
//! nothing in flight is ever evicted, freed or reused. Moving the bytes is
//! the engine's job.
//!
//! It knows nothing of requests, and the block pool knows nothing of it: a
//! user with one tier never builds a [`Tiers`] and pays nothing.
//!
//! ```
//! use kvbm_blocks::{BlockManager, SequenceHash};
//! use kvbm_tiers::{Settled, TierConfig, TierId, Tiers};
//!
//! struct Gpu;
//! let device = BlockManager::<Gpu>::builder().block_count(2).block_size(16).build()?;
//! let mut tiers = Tiers::new(device.clone(), vec![TierConfig::new("CPU", 8)])?;
//! let host = TierId::lower(0).unwrap();
//!
//! // A request computes a block; the host tier (write-through) takes a copy.
//! let hash = SequenceHash::root(42);
//! let staged = device.allocate_blocks(1)?.pop().unwrap().stage(hash, 16)?;
//! let block = device.register_block(staged)?;
//! tiers.offload([block]);
//! let mut plan = Vec::new();
//! tiers.take_planned(&mut plan);
//! assert_eq!((plan[0].source, plan[0].destination), (TierId::DEVICE, host));
//! // ... the engine copies the bytes, then reports:
//! tiers.complete(plan[0].id)?;
//!
//! // The device evicts it; the host still has it, and brings it back.
//! device.allocate_blocks(2)?;
//! assert!(device.match_blocks(&[hash]).is_empty());
//! assert_eq!(tiers.lookup(&[hash]), [0, 1]);
//! let onboard = tiers.onboard(&[hash], 8);
//! assert_eq!(onboard.blocks, 1);
//! plan.clear();
//! tiers.take_planned(&mut plan);
//! let Settled::Loaded { blocks, .. } = tiers.complete(plan[0].id)? else { unreachable!() };
//! assert_eq!(device.match_blocks(&[hash]).len(), 1);
//! drop(blocks);
//! tiers.audit()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod adopt;
mod audit;
mod config;
mod error;
mod flight;
mod immediate;
mod load;
mod settle;
mod stats;
mod store;
mod tiers;
mod transfer;

#[cfg(doc)]
use kvbm_blocks::{BlockManager, SequenceHash};

pub use audit::TiersAudit;
pub use config::{OffloadPolicy, TierConfig};
pub use error::TierError;
pub use load::Onboard;
pub use settle::{Outcome, Settled};
pub use stats::{TierStats, TransferCounts};
pub use tiers::{Lower, Tiers};
pub use transfer::{CopyRun, TierId, Transfer, TransferId, TransferKind};

/// The README's examples, run as doctests (the item exists only then).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
