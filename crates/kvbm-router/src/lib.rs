//! A KV-aware request router, as NVIDIA Dynamo's kv-router and llm-d's
//! kv-cache-manager are: engines publish what their prefix caches store and
//! evict (vLLM's KV events, [`kvbm_events`]), the [`Router`] folds every
//! engine's events into one [`PrefixIndex`], and for each request a
//! [`Policy`] weighs each worker's cached prefix of it against its load.
//!
//! - [`PrefixIndex`]: which workers hold which block keys: per key, the set
//!   of its holders (a few inline, a sorted list, or a bitset), the keys
//!   split over 256 maps under 16 locks, an event's keys grouped by lock,
//!   so events applied from different threads rarely meet. A request's overlap intersects its
//!   keys' holder sets in turn and stops when no worker matches: its cost
//!   follows the request's length and the workers that match it, not the
//!   size of the fleet.
//! - [`Policy`]: [`Random`], [`RoundRobin`], [`LeastLoaded`], and
//!   [`KvAware`] (Dynamo's cost: overlap weight × prefill blocks + decode
//!   blocks, with an optional softmax temperature). Implement the trait to
//!   add your own. A policy is offered every live worker, or a shortlist
//!   it asks for ([`Policy::offer`], [`Offer`]): kv-aware at its defaults
//!   and least-loaded see only the least-loaded workers at each depth of
//!   the request, and choose exactly as among everyone.
//! - Resync: after lost events or an engine restart, `AllBlocksCleared` (or
//!   [`Router::clear_worker`]) forgets a worker's blocks; workers come and
//!   go at run time ([`Router::add_worker`], [`Router::remove_worker`]),
//!   each addition and removal atomic however the calls race
//!   ([`Router::audit`] cross-checks the state at any moment).
//! - Event fields: blocks are kept per `medium` (routing credits the
//!   device medium, `"GPU"` or none; at most [`PrefixIndex::MAX_MEDIA`]
//!   media); the router has one `block_size` and refuses stores of another;
//!   `lora_name` is ignored, since vLLM's hashes already differ per
//!   adapter. See [`Router`].
//!
//! Blocks are keyed by the hash the engine sends ([`block_key`]): the index
//! needs no tokens, and a request is keyed by hashing its prompt the way the
//! engines do (for kvbm engines, `kvbm_sequence::BlockSequence`).
//!
//! ```
//! use kvbm_events::{BlockHash, BlockStored, KvEvent};
//! use kvbm_router::{KvAware, RouteRequest, Router, WorkerLoad};
//!
//! let router = Router::new();
//! router.add_worker(1)?;
//! router.add_worker(2)?;
//! // Worker 2 caches the first two blocks of a prompt (hashes 10, 11).
//! let hashes = vec![BlockHash::Int(10), BlockHash::Int(11)];
//! let stored = BlockStored::new(hashes, None, (0..32).collect(), 16).with_medium("GPU");
//! router.apply(2, &KvEvent::BlockStored(stored))?;
//! router.set_load(1, WorkerLoad::default())?;
//!
//! // A request whose three blocks start with those two goes to worker 2.
//! let request = RouteRequest::new(&[10, 11, 12], 48, 16);
//! let decision = router.route(&request, &mut KvAware::new(0)).unwrap();
//! assert_eq!((decision.worker, decision.overlap_blocks), (2, 2));
//! # Ok::<(), kvbm_router::RouterError>(())
//! ```

#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod error;
mod index;
mod medium;
mod policy;
mod router;
mod sync;

use kvbm_events::BlockHash;

pub use error::RouterError;
pub use index::PrefixIndex;
pub use policy::{
    Candidate, KvAware, LeastLoaded, Offer, Policy, Random, RoundRobin, RouteRequest,
};
pub use router::{Decision, Router, RouterAudit, WorkerId, WorkerLoad, WorkerStats};

/// The index key of a block hash as engines send it: an integer hash as is,
/// a byte-string hash by its first 16 bytes, big-endian (all of a kvbm
/// hash; 128 bits of a vLLM SHA-256 digest).
///
/// ```
/// use kvbm_events::{BlockHash, HashForm};
/// let value = 0x0123_4567_89ab_cdef_0011_2233_4455_6677_u128;
/// assert_eq!(kvbm_router::block_key(&BlockHash::from_value(value, HashForm::Bytes)), value);
/// assert_eq!(kvbm_router::block_key(&BlockHash::Int(7)), 7);
/// ```
pub fn block_key(hash: &BlockHash) -> u128 {
    match hash {
        BlockHash::Int(value) => u128::from(*value),
        BlockHash::Bytes(bytes) => {
            let mut key = [0u8; 16];
            let n = bytes.len().min(16);
            key[..n].copy_from_slice(&bytes[..n]);
            u128::from_be_bytes(key)
        }
    }
}

/// The README's examples, run as doctests (the item exists only then).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
