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
    // fixed anyway, so the tokens are copied out; for usual block sizes that
    // is one 256-byte stack buffer, far cheaper than the hash itself.
    if tokens.len() <= STACK_TOKENS {
        let mut buf = [0u8; STACK_TOKENS * 4];
        for (dst, token) in buf.chunks_exact_mut(4).zip(tokens) {
            dst.copy_from_slice(&token.to_le_bytes());
        }
        xxh3_64(&buf[..tokens.len() * 4])
    } else {
        let bytes: Vec<u8> = tokens
            .iter()
            .flat_map(|token| token.to_le_bytes())
            .collect();
        xxh3_64(&bytes)
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
