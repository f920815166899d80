//! Tokens split into blocks with chained hashes; per-request block tracking.
//!
//! The second layer of kvbm, on top of `kvbm-blocks` only:
//!
//! - **tokens → blocks → hashes.** A [`BlockSequence`] cuts a request's `u32`
//!   tokens into full blocks of `block_size` plus a partial tail, and names
//!   every full block by a [`SequenceHash`](kvbm_blocks::SequenceHash) chained
//!   from its parent's ([`block_hash`] of the tokens folded by [`chain_hash`],
//!   XXH3 both), rooted in an optional [`Salt`]. Two requests share a block
//!   hash exactly when they share the salt and every token up to the end of
//!   that block, so the hash is the prefix-cache key. A sequence may read a
//!   prompt it shares with the request (and the request's other layer
//!   groups) in place ([`PromptTokens::shared`]); its [`Tokens`] then come
//!   in two pieces.
//! - **per-request tracking.** [`LogicalBlockAssignments`] holds the block
//!   handles of one sequence in page order: assigned (registered or matched),
//!   staged (full, not yet published) and unassigned (allocated ahead), with
//!   the invariant that assigned then staged blocks hold a prefix of the
//!   sequence's full blocks. [`RequestSequence`] ties the two to a
//!   [`BlockManager`](kvbm_blocks::BlockManager): match the cached prefix,
//!   allocate, register, generate, release, reacquire, each an explicit call.
//! - **layer groups.** [`KvCacheGroups`] describes a model whose layers
//!   attend differently (full, sliding-window, chunked-local: an
//!   [`AttentionKind`] per group) and holds the rules: which blocks a group
//!   reads no more once `n` tokens are computed (a sequence gives them back
//!   with [`RequestSequence::skip_to`]), and the longest prefix hit every
//!   group can serve.
//!
//! This crate holds no scheduling policy: when to prefill, decode or preempt
//! is `kvbm-schedule`'s business. Misuse is a [`SequenceError`], never a
//! panic, and every block it refuses goes back to its manager.
//!
//! # Example: two requests sharing a prompt
//!
//! ```
//! use kvbm_blocks::BlockManager;
//! use kvbm_sequence::RequestSequence;
//!
//! struct Gpu; // a storage-tier marker
//! let manager = BlockManager::<Gpu>::builder().block_count(8).block_size(4).build()?;
//! let system_prompt: Vec<u32> = (0..8).collect(); // two full blocks
//!
//! // The first request computes the prompt, registers it, answers, finishes.
//! let mut first = RequestSequence::<Gpu>::new([&system_prompt[..], &[100, 101]].concat(), 4, 4)?;
//! assert_eq!(first.match_and_add_prefix(&manager)?, 0); // cold cache
//! first.allocate_blocks(first.additional_blocks_needed(first.total_tokens()), &manager)?;
//! assert_eq!(first.complete_and_register_pending(&manager)?, 2);
//! for token in [102, 103] {
//!     if let Some(block) = first.append_token(token)? {
//!         assert_eq!(block, 2); // the tail block just filled up
//!         first.complete_and_register_pending(&manager)?;
//!     }
//! }
//! first.release(); // its three blocks stay cached
//!
//! // The second request with the same system prompt skips recomputing it.
//! let mut second = RequestSequence::<Gpu>::new([&system_prompt[..], &[200, 201, 202]].concat(), 4, 4)?;
//! assert_eq!(second.match_and_add_prefix(&manager)?, 2);
//! assert_eq!(second.new_tokens_for_prefill(), 3);
//! assert_eq!(second.sequence().sequence_hashes()[..2], first.sequence().sequence_hashes()[..2]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod assignments;
mod block_sequence;
mod error;
mod groups;
mod hash;
mod hashed_prompt;
mod request;
#[cfg(test)]
mod test_support;
mod tokens;

pub use assignments::LogicalBlockAssignments;
pub use block_sequence::BlockSequence;
pub use error::SequenceError;
pub use groups::{AttentionKind, GroupError, KvCacheGroup, KvCacheGroups};
pub use hash::{GROUP_SHIFT, HashKey, Salt, block_hash, chain_hash, group_of, without_group};
pub use hashed_prompt::HashedPrompt;
pub use request::RequestSequence;
pub use tokens::{PromptTokens, Tokens};

/// The README's examples, run as doctests (the item exists only then).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
