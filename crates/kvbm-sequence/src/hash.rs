//! Token-block hashing: [`block_hash`] of a block's tokens, [`chain_hash`]
//! to fold it onto its parent, and the [`Salt`] that roots every chain.
//!
//! Both steps are XXH3-64 (`xxhash-rust`), over little-endian bytes, so the
//! values are the same on every platform and can be recomputed by a router
//! that never sees a [`BlockSequence`](crate::BlockSequence).

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Seeds the chain step so a chained value never equals the plain XXH3 of
/// the same 16 bytes by accident (any fixed constant would do).
const CHAIN_SEED: u64 = 0x6b76_626d_5f73_6571; // "kvbm_seq"

/// Blocks up to this many tokens are encoded on the stack before hashing.
const STACK_TOKENS: usize = 64;

/// What isolates one family of caches from another: two sequences share block
/// hashes only if they have the same salt.
///
/// Use one salt per LoRA adapter, tenant or model revision whose KV must not
/// be shared. [`Salt::NONE`] (zero, the default) is the salt of a sequence
/// created without one.
///
/// ```
/// use kvbm_sequence::{BlockSequence, Salt};
/// let tokens: Vec<u32> = (0..8).collect();
/// let base = BlockSequence::new(tokens.clone(), 4)?;
/// let lora = BlockSequence::with_salt(tokens, 4, Salt::from_bytes(b"adapter-7"))?;
/// assert_ne!(base.sequence_hashes()[0], lora.sequence_hashes()[0]);
/// # Ok::<(), kvbm_sequence::SequenceError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Salt(u64);

impl Salt {
    /// No salt: what [`BlockSequence::new`](crate::BlockSequence::new) uses.
    pub const NONE: Self = Self(0);

    /// A salt from a precomputed 64-bit value.
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// A salt from a name or any other bytes (XXH3-64 of them).
    pub fn from_bytes(bytes: &[u8]) -> Self {
        Self(xxh3_64(bytes))
    }

    /// The 64-bit value every chain of this salt starts from.
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// The hash of one block's tokens alone, independent of its prefix and salt:
/// XXH3-64 of the tokens as little-endian `u32`s.
///
/// ```
/// use kvbm_sequence::block_hash;
/// assert_eq!(block_hash(&[1, 2, 3, 4]), block_hash(&[1, 2, 3, 4]));
/// assert_ne!(block_hash(&[1, 2, 3, 4]), block_hash(&[1, 2, 4, 3]));
/// ```
pub fn block_hash(tokens: &[u32]) -> u64 {
    // Safe code cannot view `&[u32]` as bytes, and the byte order must be
    // fixed anyway, so the tokens are copied into a byte buffer first. For
    // the usual block sizes the copy has a constant length: it compiles to a
    // few vector moves XXH3 can read back at once, where a variable-length
    // `memcpy` made the reads stall and cost more than the hash itself.
    if let Ok(block) = <&[u32; 16]>::try_from(tokens) {
        return hash_fixed::<16, 64>(block);
    }
    if let Ok(block) = <&[u32; 32]>::try_from(tokens) {
        return hash_fixed::<32, 128>(block);
    }
    if let Ok(block) = <&[u32; 64]>::try_from(tokens) {
        return hash_fixed::<64, 256>(block);
    }
    let len = tokens.len();
    if len <= STACK_TOKENS {
        let mut buf = [0u8; STACK_TOKENS * 4];
        encode(tokens, &mut buf);
        xxh3_64(buf.get(..len * 4).unwrap_or_default())
    } else {
        let mut buf = vec![0u8; len * 4];
        encode(tokens, &mut buf);
        xxh3_64(&buf)
    }
}

/// [`block_hash`] of exactly `TOKENS` tokens (`BYTES == 4 * TOKENS`).
#[inline(always)]
fn hash_fixed<const TOKENS: usize, const BYTES: usize>(tokens: &[u32; TOKENS]) -> u64 {
    debug_assert_eq!(BYTES, TOKENS * 4);
    let mut buf = [0u8; BYTES];
    encode(tokens, &mut buf);
    xxh3_64(&buf)
}

/// Writes `tokens` as little-endian bytes to the front of `buf`.
#[inline(always)]
fn encode(tokens: &[u32], buf: &mut [u8]) {
    for (dst, token) in buf.chunks_exact_mut(4).zip(tokens) {
        dst.copy_from_slice(&token.to_le_bytes());
    }
}

/// Folds a block's [`block_hash`] onto the chained value before it: the
/// parent block's chained value, or the [`Salt`] for the first block.
///
/// The result identifies the block together with its whole prefix, so it is
/// the prefix-cache key ([`SequenceHash::value`](kvbm_blocks::SequenceHash::value)).
///
/// ```
/// use kvbm_sequence::{block_hash, chain_hash, BlockSequence, Salt};
/// let seq = BlockSequence::new(vec![1, 2, 3, 4, 5, 6], 3)?;
/// let first = chain_hash(Salt::NONE.get(), block_hash(&[1, 2, 3]));
/// let second = chain_hash(first, block_hash(&[4, 5, 6]));
/// assert_eq!(seq.sequence_hashes()[1].value(), second);
/// assert_eq!(seq.sequence_hashes()[1].parent(), Some(first));
/// # Ok::<(), kvbm_sequence::SequenceError>(())
/// ```
pub fn chain_hash(previous: u64, block_hash: u64) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&previous.to_le_bytes());
    bytes[8..].copy_from_slice(&block_hash.to_le_bytes());
    xxh3_64_with_seed(&bytes, CHAIN_SEED)
}

#[cfg(test)]
mod tests {
    use xxhash_rust::xxh3::xxh3_64;

    use super::{Salt, block_hash, chain_hash};

    /// The definition, written the slow obvious way.
    fn reference(tokens: &[u32]) -> u64 {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        xxh3_64(&bytes)
    }

    #[test]
    fn every_encoding_path_hashes_the_little_endian_bytes() {
        // Fixed sizes (16, 32, 64), the stack buffer and the heap buffer.
        let tokens: Vec<u32> = (0..200u32).map(|t| t.wrapping_mul(0x9e37_79b9)).collect();
        for len in 0..=tokens.len() {
            assert_eq!(
                block_hash(&tokens[..len]),
                reference(&tokens[..len]),
                "len {len}"
            );
        }
    }

    #[test]
    fn chain_hash_depends_on_both_inputs_and_their_order() {
        assert_ne!(chain_hash(1, 2), chain_hash(2, 1));
        assert_ne!(chain_hash(1, 2), chain_hash(1, 3));
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&1u64.to_le_bytes());
        bytes[8..].copy_from_slice(&2u64.to_le_bytes());
        assert_ne!(chain_hash(1, 2), xxh3_64(&bytes), "seeded, not plain XXH3");
        assert_eq!(chain_hash(5, 6), chain_hash(5, 6));
    }

    #[test]
    fn salts() {
        assert_eq!(Salt::default(), Salt::NONE);
        assert_eq!(Salt::NONE.get(), 0);
        assert_eq!(Salt::new(7).get(), 7);
        assert_eq!(Salt::from_bytes(b"a"), Salt::new(xxh3_64(b"a")));
        assert_ne!(Salt::from_bytes(b"a"), Salt::from_bytes(b"b"));
    }
}
