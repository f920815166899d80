//! The data plane of kvbm's tiers: where the bytes of offloaded KV live and
//! how they move.
//!
//! [`kvbm_tiers`] decides which blocks go where and hands out two-phase
//! [`Transfer`](kvbm_tiers::Transfer) plans; this crate carries them out.
//! A [`BlockStore`] keeps one tier's whole blocks by key (the block's
//! [`SequenceHash`](kvbm_blocks::SequenceHash) value): [`HostArena`] in
//! preallocated host memory, [`DiskStore`] in fixed-size slots of files.
//! (Redis Cluster, the remote tier, is in `kvbm-store-redis`, so a user who
//! wants host memory only never compiles a Redis client.) The engine's own
//! device memory is a trait it implements, [`DeviceMemory`].
//!
//! Every block travels with its key and a [`Checksum`] that binds its bytes
//! to that key. A load whose bytes do not verify fails, and a failed
//! transfer means the request recomputes: nothing here can hand an engine
//! another block's KV.
//!
//! No core crate depends on this one (`cargo xtask layers` checks it): a
//! user who wants only the block pool or the tiers' bookkeeping never
//! compiles it.
//!
//! ```
//! use kvbm_blocks::{BlockId, SequenceHash};
//! use kvbm_store::{BlockRef, BlockStore, DeviceMemory, HostArena, HostDevice};
//!
//! // A fake engine: the KV of each block is a function of its hash.
//! let device = HostDevice::new(64, 4)?;
//! let host = HostArena::new(64, 16)?;
//! let hash = SequenceHash::root(0xfeed);
//! device.compute(BlockId::new(0), hash.value())?;
//!
//! // Offload: device block 0 to the host, checksummed on the way.
//! let mut buffer = vec![0; 64];
//! device.read(BlockId::new(0), &mut buffer)?;
//! host.put(&[BlockRef::new(hash, &buffer)]).pop().unwrap()?;
//!
//! // Onboard it into device block 3, verified before it is written.
//! let sum = host.get(&mut [(hash.value(), &mut buffer[..])]).pop().unwrap()?;
//! assert!(sum.verifies(hash.value(), &buffer));
//! device.write(BlockId::new(3), &buffer)?;
//! assert!(device.holds(BlockId::new(3), hash.value())?);
//! # Ok::<(), kvbm_store::StoreError>(())
//! ```

#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod arena;
mod block;
mod device;
mod disk;
mod engine;
mod error;
mod slots;
mod store;

pub use arena::HostArena;
pub use block::{BlockRef, Checksum, Lineage, fake_kv};
pub use device::{DeviceMemory, HostDevice};
pub use disk::{DiskConfig, DiskStore, Recovery};
pub use engine::{DataPlaneStats, EngineConfig, Failure, Report, TierStore, TransferEngine};
pub use error::StoreError;
pub use store::BlockStore;

/// The README's examples, run as doctests (the item exists only then).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
