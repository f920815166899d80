//! kvbm's remote tier: a [`BlockStore`](kvbm_store::BlockStore) on a Redis
//! Cluster, the distributed store LMCache already uses as a remote KV
//! backend and llm-d as an index store.
//!
//! [`RedisClusterStore`] keeps each block as one string value under
//! `{namespace}:kv:{32 hex digits of the block's hash}` (a [`Namespace`]
//! per deployment or model; no hash tag, so blocks spread over every
//! master), a 32-byte header (the key and the caller's
//! [`Checksum`](kvbm_store::Checksum)) before the bytes. It talks to the
//! cluster through redis-rs's synchronous cluster client (no async runtime)
//! from a bounded pool of connections; each batch is one cluster pipeline,
//! and every call is bounded by the [`RedisConfig`]'s timeouts.
//!
//! Failures stay per block: a master that dies mid-transfer fails the
//! blocks it holds (the requests that needed them recompute) while the
//! blocks on the other masters keep moving; a get whose bytes do not verify
//! is [`StoreError::Corrupt`](kvbm_store::StoreError::Corrupt); a put of a
//! stored key with other bytes is
//! [`StoreError::Collision`](kvbm_store::StoreError::Collision) and keeps
//! what is stored. Connecting to a standalone (non-cluster) Redis is a
//! [`StoreError::Config`](kvbm_store::StoreError::Config), an unreachable
//! one a [`StoreError::Remote`](kvbm_store::StoreError::Remote) or
//! [`StoreError::Timeout`](kvbm_store::StoreError::Timeout).
//!
//! The keys, checked without a server:
//!
//! ```
//! use kvbm_store_redis::{Namespace, RedisConfig};
//!
//! let config = RedisConfig::new(
//!     ["redis://127.0.0.1:7101", "redis://127.0.0.1:7102"],
//!     "llama-3-70b/prod",
//!     4096, // bytes per block
//!     1024, // blocks this store may hold
//! );
//! config.validate()?;
//! let ns = Namespace::new(config.namespace.as_str())?;
//! assert_eq!(
//!     ns.redis_key(0x2a),
//!     "llama-3-70b/prod:kv:0000000000000000000000000000002a",
//! );
//! # Ok::<(), kvbm_store::StoreError>(())
//! ```
//!
//! A round trip, against a running cluster:
//!
//! ```no_run
//! use kvbm_blocks::SequenceHash;
//! use kvbm_store::{BlockRef, BlockStore, fake_kv};
//! use kvbm_store_redis::{RedisClusterStore, RedisConfig};
//!
//! let config = RedisConfig::new(["redis://127.0.0.1:7101"], "demo", 4096, 1024);
//! let store = RedisClusterStore::connect(config)?;
//!
//! let hash = SequenceHash::root(0xfeed);
//! let mut bytes = vec![0; 4096];
//! fake_kv(hash.value(), &mut bytes);
//! store.put(&[BlockRef::new(hash, &bytes)]).pop().unwrap()?;
//!
//! let mut back = vec![0; 4096];
//! let sum = store.get(&mut [(hash.value(), &mut back[..])]).pop().unwrap()?;
//! assert!(sum.verifies(hash.value(), &back));
//! assert_eq!(back, bytes);
//! # Ok::<(), kvbm_store::StoreError>(())
//! ```
//!
//! Its tests run against a real three-master cluster that `cargo xtask
//! test` starts (`KVBM_REDIS_CLUSTER`); outside CI, without one, they are
//! skipped with a loud message.

#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod config;
mod error;
mod pool;
mod scan;
mod store;
mod value;

pub use config::{Namespace, RedisConfig};
pub use store::RedisClusterStore;

/// The README's examples, run as doctests (the item exists only then).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
