//! Synthetic token ids: a trace's prompts rebuilt from its block hash ids,
//! and the tokens the stand-in engine "samples".
//!
//! A Mooncake trace carries no text, only one id per 512-token prompt block
//! where equal ids at equal positions mean equal content. Serve mode feeds
//! the [`Scheduler`](kvbm_queue::Scheduler) real token ids, which kvbm's own
//! hashing turns into block hashes, so the ids must become tokens with the
//! same sharing: token `i` (0-based, `0..512`) of the trace block with id `h`
//! is
//!
//! ```text
//! trace_token(h, i) = xorshift32(fold32(h) + i × 0x9E37_79B9)     (mod 2^32)
//! fold32(h)         = (h ⊕ (h >> 32)) mod 2^32
//! xorshift32(x)     = x ⊕= x << 13; x ⊕= x >> 17; x ⊕= x << 5
//! ```
//!
//! and a request's prompt is its blocks' tokens back to back, cut at
//! `input_length`. `xorshift32` (Marsaglia's) is a bijection of `u32` (each
//! step is an invertible linear map over bits), and so is adding a constant,
//! so **at every position, two ids below 2^32 give different tokens** (the
//! conversation trace's ids are below 2^18). Hence at any block size
//! dividing 512:
//!
//! - equal trace prefixes give equal tokens, so equal kvbm block hashes;
//! - a block whose trace id differs from another's differs in every token,
//!   so kvbm's chained hashes part at the first block where the traces part
//!   and never meet again (false sharing would need an XXH3 collision).
//!
//! Only equality matters (kvbm hashes the tokens), so the mix is chosen for
//! speed: shifts and xors, which vectorize on every x86-64 (a 32-bit
//! multiply does not before SSE4.1), about a fifth of the instructions of a
//! multiplying hash. That matters: the conversation trace has 145M prompt
//! tokens, built again for every replay.

use std::sync::Arc;

use crate::TraceRequest;

/// The multiplier that spreads offsets apart (2^32 / φ, odd).
const OFFSET_STEP: u32 = 0x9E37_79B9;

/// Chris Wellons' `lowbias32`: xorshifts and odd multiplications, each
/// invertible, so the whole is a bijection of `u32` with good avalanche.
#[inline]
fn lowbias32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// Marsaglia's `xorshift32` step: three shift-xors, each invertible, so the
/// whole is a bijection of `u32`.
#[inline]
fn xorshift32(mut x: u32) -> u32 {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    x
}

/// Token `offset` (`0..512`) of the trace block with id `hash_id`; see the
/// module docs for the formula and why it keeps the trace's sharing.
#[inline]
pub fn trace_token(hash_id: u64, offset: u32) -> u32 {
    xorshift32(fold(hash_id).wrapping_add(offset.wrapping_mul(OFFSET_STEP)))
}

/// A block id folded to 32 bits: the state of its token 0.
#[inline]
fn fold(hash_id: u64) -> u32 {
    (hash_id ^ (hash_id >> 32)) as u32
}

/// The prompt of a trace request: [`trace_token`]s of each `hash_ids` block
/// in turn, 512 per block, truncated to `input_length` tokens (fewer if the
/// ids do not cover it, which a checked [`Trace`](crate::Trace) rules out).
pub fn prompt_tokens(hash_ids: &[u64], input_length: usize) -> Vec<u32> {
    let mut tokens = vec![0; prompt_len(hash_ids, input_length)];
    fill_prompt(hash_ids, &mut tokens);
    tokens
}

/// `request`'s prompt as [`prompt_tokens`], `None` if it has none (or its
/// ids cover no token): written straight into the shared buffer, one
/// allocation and no copy (a replay builds 145M prompt tokens).
pub(crate) fn shared_prompt(request: &TraceRequest) -> Option<Arc<[u32]>> {
    let input_length = usize::try_from(request.input_length).unwrap_or(usize::MAX);
    let len = prompt_len(&request.hash_ids, input_length);
    if len == 0 {
        return None;
    }
    // An exact-size iterator collects into the `Arc` in place.
    let mut prompt: Arc<[u32]> = std::iter::repeat_n(0, len).collect();
    fill_prompt(&request.hash_ids, Arc::get_mut(&mut prompt)?);
    Some(prompt)
}

/// Tokens a prompt of `input_length` has that `hash_ids` cover.
fn prompt_len(hash_ids: &[u64], input_length: usize) -> usize {
    input_length.min(hash_ids.len().saturating_mul(crate::TRACE_BLOCK_TOKENS))
}

/// Writes the prompt of `hash_ids` over `tokens` (as long as the ids
/// cover). Block by block, so the inner loop over offsets is a plain counted
/// loop the compiler vectorizes: about three times faster than one flat
/// iterator over positions, which matters at 145M tokens.
fn fill_prompt(hash_ids: &[u64], tokens: &mut [u32]) {
    for (chunk, &hash_id) in tokens.chunks_mut(crate::TRACE_BLOCK_TOKENS).zip(hash_ids) {
        // `trace_token`'s argument advanced by addition, not recomputed by
        // a multiplication per offset (which the baseline SSE2 has no
        // vector instruction for): a fifth fewer instructions.
        let mut state = fold(hash_id);
        for token in chunk {
            *token = xorshift32(state);
            state = state.wrapping_add(OFFSET_STEP);
        }
    }
}

/// The token the stand-in engine samples for request `request` at sequence
/// position `position`: arbitrary but deterministic, so runs reproduce.
/// Generated blocks are registered like prompt blocks; their chained hashes
/// include the whole prompt, so they can only ever match the same request's
/// own blocks (after a preemption).
#[inline]
pub(crate) fn sampled_token(request: u64, position: usize) -> u32 {
    lowbias32((request as u32) ^ (position as u32).wrapping_mul(OFFSET_STEP) ^ 0x5eed_5eed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_mixes_are_bijections_on_a_window() {
        // A bijection of u32 maps a window of distinct inputs to distinct
        // outputs; check a window of 2^20 (the full 2^32 is too slow for a
        // unit test, and invertibility of each step is the real proof).
        for (name, mix) in [
            ("xorshift32", xorshift32 as fn(u32) -> u32),
            ("lowbias32", lowbias32),
        ] {
            let mut seen: Vec<u32> = (0..1u32 << 20).map(mix).collect();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), 1 << 20, "{name}");
        }
    }

    #[test]
    fn different_ids_differ_at_every_offset() {
        for offset in [0, 1, 255, 511] {
            let mut tokens: Vec<u32> = (0..50_000u64).map(|id| trace_token(id, offset)).collect();
            tokens.sort_unstable();
            tokens.dedup();
            assert_eq!(tokens.len(), 50_000, "offset {offset}");
        }
        // Ids that differ only above bit 32 still differ (fold32).
        assert_ne!(trace_token(7, 0), trace_token(7 | (1 << 40), 0));
    }

    #[test]
    fn prompts_are_block_tokens_cut_at_the_input_length() {
        let prompt = prompt_tokens(&[3, 9], 600);
        assert_eq!(prompt.len(), 600);
        assert_eq!(prompt[0], trace_token(3, 0));
        assert_eq!(prompt[511], trace_token(3, 511));
        assert_eq!(prompt[512], trace_token(9, 0));
        assert_eq!(prompt[599], trace_token(9, 87));
        for (at, &token) in prompt.iter().enumerate() {
            let (id, offset) = ([3, 9][at / 512], (at % 512) as u32);
            assert_eq!(token, trace_token(id, offset), "token {at}");
        }
        // A shorter request with the same first id shares its first tokens.
        assert_eq!(prompt_tokens(&[3], 100)[..], prompt[..100]);
        assert!(prompt_tokens(&[], 0).is_empty());
        // Ids that do not cover the length give what they cover.
        assert_eq!(prompt_tokens(&[1], 700).len(), 512);
    }
}
