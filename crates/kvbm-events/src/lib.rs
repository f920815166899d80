//! KV-cache events on the wire routers already read: vLLM's `KVEventBatch`
//! (`vllm/distributed/kv_events.py`, vLLM 0.33), encoded as msgpack.
//!
//! An engine publishes what its prefix cache stores and evicts so that a
//! KV-aware router (NVIDIA Dynamo's kv-router, llm-d's kv-cache-manager) can
//! send each request where its prefix is cached. This crate is the payload
//! layer: [`KvEventBatch`] and its [`KvEvent`]s with exactly vLLM's layout,
//! [`encode`] and [`decode`], and [`BlockHash`] conversions from kvbm's
//! 128-bit [`SequenceHash`](kvbm_blocks::SequenceHash) values;
//! [`WireFormat`] turns a block pool's event subscription
//! ([`BlockManager::subscribe_events`](kvbm_blocks::BlockManager::subscribe_events))
//! into such batches. With the
//! `zmq` feature, vLLM's transport too: a `Publisher` (PUB frames and the
//! replay ROUTER) and a `Subscriber` that repairs gaps from the replay
//! socket. The core crates never depend on this one.
//!
//! The layout, as vLLM's msgspec structs define it:
//!
//! - a batch is a 3-element array `[ts, events, data_parallel_rank]`;
//! - each event is a map tagged by its class name under `"type"`, fields in
//!   declaration order; fields without a default are always written (nil
//!   when absent), optional ones vLLM leaves out when default are never
//!   written here and ignored when read;
//! - a block hash is an integer or a byte string.
//!
//! ```
//! use kvbm_events::{BlockHash, BlockStored, KvEvent, KvEventBatch, decode, encode};
//!
//! let batch = KvEventBatch::new(1.5, vec![
//!     KvEvent::BlockStored(
//!         BlockStored::new(vec![BlockHash::Int(11), BlockHash::Int(12)], None, (1..=8).collect(), 4)
//!             .with_medium("GPU"),
//!     ),
//!     KvEvent::AllBlocksCleared,
//! ]);
//! let bytes = encode(&batch)?;
//! assert_eq!(decode(&bytes)?, batch);
//! # Ok::<(), kvbm_events::EventError>(())
//! ```

#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod codec;
mod convert;
mod hash;
#[cfg(feature = "zmq")]
mod transport;
mod wire;

pub use codec::{EventError, decode, encode};
pub use convert::WireFormat;
pub use hash::{BlockHash, HashForm};
#[cfg(feature = "zmq")]
pub use transport::{
    Publisher, PublisherConfig, PublisherStats, Received, Subscriber, SubscriberConfig,
    SubscriberStats,
};
pub use wire::{BlockRemoved, BlockStored, KvEvent, KvEventBatch, WireGroup};

/// The README's examples, run as doctests (the item exists only then).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
