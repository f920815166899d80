//! Token-block hashing: [`block_hash`] of a block's tokens, [`chain_hash`]
//! to fold it onto its parent, and the [`Salt`] that roots every chain and
//! picks the hash function.
//!
//! By default both steps are XXH3-128 (`xxhash-rust`, and `twox-hash` for
//! blocks past 240 bytes, where its run-time choice of AVX2 is faster; the
//! same function either way), over little-endian
//! bytes, so the values are the same on every platform and can be recomputed
//! by a router that never sees a [`BlockSequence`](crate::BlockSequence).
//! A [keyed salt](Salt::keyed) switches both steps to SipHash-1-3-128 under a
//! secret key.
//!
//! The threat model of keyed hashing is in [`Salt`]'s documentation.

use std::fmt;
use std::hash::Hasher;

use siphasher::sip128::{Hasher128, SipHasher13};
use xxhash_rust::xxh3::{xxh3_128, xxh3_128_with_seed};

/// Seeds the chain step so a chained value never equals the plain XXH3 of
/// the same 32 bytes by accident (any fixed constant would do).
const CHAIN_SEED: u64 = 0x6b76_626d_5f73_6571; // "kvbm_seq"

/// Blocks up to this many tokens are encoded on the stack before hashing.
const STACK_TOKENS: usize = 64;

/// Where a chained value keeps its KV cache group: the top 8 of its 128
/// bits. A chain step's value leaves them 0, and group `g`'s salt
/// ([`Salt::for_group`]) puts `g` there, so a group's block is keyed by
/// the same 120-bit chained value as group 0's and its group, as vLLM keys
/// a group's blocks by (block hash, group), and an event names both
/// ([`group_of`], [`without_group`]). 120 bits keep accidental collisions
/// negligible (about 2^-57 at 2^32 cached blocks).
pub const GROUP_SHIFT: u32 = 120;

/// The bits of a chained value below its group's.
const CHAIN_MASK: u128 = (1 << GROUP_SHIFT) - 1;

/// The KV cache group a chained value (a [`BlockSequence`](crate::BlockSequence)'s,
/// under [`Salt::for_group`]) belongs to: 0 for a model of one group.
///
/// ```
/// use kvbm_sequence::{BlockSequence, Salt, group_of, without_group};
/// let tokens: Vec<u32> = (0..8).collect();
/// let full = BlockSequence::with_salt(tokens.clone(), 4, Salt::NONE.for_group(0))?;
/// let window = BlockSequence::with_salt(tokens, 4, Salt::NONE.for_group(1))?;
/// let (f, w) = (full.sequence_hashes()[1].value(), window.sequence_hashes()[1].value());
/// assert_eq!((group_of(f), group_of(w)), (0, 1));
/// assert_eq!(without_group(w), f);
/// # Ok::<(), kvbm_sequence::SequenceError>(())
/// ```
pub const fn group_of(value: u128) -> usize {
    (value >> GROUP_SHIFT) as usize
}

/// A chained value with its group taken off: the same for every group's
/// block of one prefix (see [`group_of`]).
pub const fn without_group(value: u128) -> u128 {
    value & CHAIN_MASK
}

/// A secret 128-bit key for [keyed block hashing](Salt::keyed).
///
/// Generate it once per deployment from a cryptographic random source and
/// give every engine and router of the deployment the same key. Salts refer
/// to it for the life of the process (so they stay small and `Copy`): keep
/// it in a `static`, or [`leak`](Self::leak) it once at startup. Its `Debug`
/// output shows nothing of it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct HashKey([u8; 16]);

impl HashKey {
    /// A key from 16 secret bytes.
    pub const fn new(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The key, moved to the heap for the rest of the process (16 bytes,
    /// once per deployment key).
    pub fn leak(self) -> &'static HashKey {
        Box::leak(Box::new(self))
    }
}

impl fmt::Debug for HashKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HashKey(<secret>)")
    }
}

/// What isolates one family of caches from another, and which hash function
/// names their blocks: two sequences share block hashes only if they have
/// the same salt.
///
/// Use one salt per LoRA adapter, tenant or model revision whose KV must not
/// be shared. [`Salt::NONE`] (zero, the default) is the salt of a sequence
/// created without one. Unkeyed salts hash with XXH3-128; a
/// [keyed](Salt::keyed) one with SipHash-1-3-128 under its key.
///
/// ```
/// use kvbm_sequence::{BlockSequence, HashKey, Salt};
/// let tokens: Vec<u32> = (0..8).collect();
/// let base = BlockSequence::new(tokens.clone(), 4)?;
/// let lora = BlockSequence::with_salt(tokens.clone(), 4, Salt::from_bytes(b"adapter-7"))?;
/// assert_ne!(base.sequence_hashes()[0], lora.sequence_hashes()[0]);
///
/// let key = HashKey::new(*b"deployment-key!!").leak();
/// let a = BlockSequence::with_salt(tokens.clone(), 4, Salt::keyed(key, b"tenant-a"))?;
/// let b = BlockSequence::with_salt(tokens, 4, Salt::keyed(key, b"tenant-b"))?;
/// assert_ne!(a.sequence_hashes()[0], b.sequence_hashes()[0]);
/// # Ok::<(), kvbm_sequence::SequenceError>(())
/// ```
///
/// # Threat model
///
/// A block's chained hash is the prefix-cache key: two requests whose blocks
/// hash alike share KV. With a public hash function (XXH3, or any unkeyed
/// hash) anyone who can send prompts can compute block hashes offline and
/// search for token blocks whose chained hash equals another tenant's,
/// then read or poison that tenant's cached KV through the collision (the
/// class of vLLM's CVE-2025-25183). 128-bit values make *accidental*
/// collisions negligible (about 2^-65 at 2^32 cached blocks, where 64-bit
/// values make one likely), but XXH3 is not collision resistant against a
/// deliberate search.
///
/// [`Salt::keyed`] defends against the search: every block hash and chain
/// step is SipHash-1-3-128 keyed with a per-deployment secret
/// ([`HashKey`]), a pseudo-random function, so without the key no hash can
/// be computed and no collision searched for offline. The tenant's name is
/// mixed in under the key as the chain's root, so tenants sharing a key
/// still cannot compute each other's hashes, and their caches stay apart.
/// Keep the key out of logs (its `Debug` prints nothing of it), the same on
/// every engine and router that must agree on hashes, and rotate it by
/// restarting with an empty cache. Out of scope: an attacker who knows the
/// key, and timing side channels of cache hits themselves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Salt {
    /// The start value, as halves (low first) like the tag: 8-byte
    /// alignment keeps a salt at 40 bytes, and the requests carrying one
    /// small.
    value: [u64; 2],
    key: Option<&'static HashKey>,
    /// XORed onto every chained value (see [`Salt::for_group`]): zero for
    /// a salt of no group, so its hashes are the plain chain's.
    tag: [u64; 2],
}

impl Salt {
    /// No salt: what [`BlockSequence::new`](crate::BlockSequence::new) uses.
    pub const NONE: Self = Self {
        value: [0; 2],
        key: None,
        tag: [0; 2],
    };

    /// An unkeyed salt from a precomputed value.
    pub const fn new(value: u128) -> Self {
        Self {
            value: split(value),
            key: None,
            tag: [0; 2],
        }
    }

    /// An unkeyed salt from a name or any other bytes (XXH3-128 of them).
    pub fn from_bytes(bytes: &[u8]) -> Self {
        Self::new(xxh3_128(bytes))
    }

    /// A keyed salt: blocks are hashed with SipHash-1-3-128 under `key`,
    /// and each chain starts from the keyed hash of `tenant` (a tenant,
    /// adapter or model name), so without the key no block hash of any
    /// tenant can be computed.
    pub fn keyed(key: &'static HashKey, tenant: &[u8]) -> Self {
        Self {
            value: split(siphash(key, tenant)),
            key: Some(key),
            tag: [0; 2],
        }
    }

    /// This salt with `tag` XORed onto its start value and every chained
    /// value (see [`Salt::for_group`]).
    pub(crate) const fn tagged(self, tag: u128) -> Self {
        Self {
            tag: split(join(self.tag) ^ tag),
            ..self
        }
    }

    /// The value every chain of this salt starts from, as
    /// [`chain_hash`](Self::chain_hash) takes it.
    pub const fn get(self) -> u128 {
        join(self.value) ^ join(self.tag)
    }

    /// The tag (zero for a salt of no group).
    pub(crate) const fn tag(self) -> u128 {
        join(self.tag)
    }

    /// The start value without the tag.
    pub(crate) const fn untagged(self) -> u128 {
        join(self.value)
    }

    /// Whether `other` chains as this salt does up to its tag: the same
    /// start value and hash function. Two such salts hash a prompt's blocks
    /// to values that differ by the XOR of their tags alone, so one chain
    /// serves both ([`BlockSequence::with_salts`](crate::BlockSequence::with_salts)).
    pub(crate) fn shares_chain(self, other: Self) -> bool {
        self.value == other.value && self.key == other.key
    }

    /// What turns a chained value of this salt into `other`'s, for a salt
    /// that [`shares_chain`](Self::shares_chain) with it.
    pub(crate) const fn retag(self, other: Self) -> u128 {
        join(self.tag) ^ join(other.tag)
    }

    /// Whether block hashes under this salt are keyed.
    pub const fn is_keyed(self) -> bool {
        self.key.is_some()
    }

    /// Whether `other` hashes a block's tokens as this salt does (both
    /// unkeyed, or keyed under the same key): [`block_hash`](Self::block_hash)
    /// depends on the key only, never on the start value.
    pub(crate) fn shares_block_hash(self, other: Self) -> bool {
        match (self.key, other.key) {
            (None, None) => true,
            (Some(a), Some(b)) => a == b,
            _ => false,
        }
    }

    /// The hash of one block's tokens under this salt's hash function:
    /// [`block_hash`] unkeyed, keyed SipHash-1-3-128 of the same bytes
    /// otherwise.
    pub fn block_hash(self, tokens: &[u32]) -> u128 {
        match self.key {
            None => block_hash(tokens),
            Some(key) => with_le_bytes(tokens, |bytes| siphash(key, bytes)),
        }
    }

    /// Folds a block hash onto the chained value before it under this
    /// salt's hash function: [`chain_hash`] unkeyed. A tagged salt's
    /// values are the untagged chain's with the tag XORed on, so the tag
    /// comes off `previous` before the fold and goes back on after it.
    #[inline]
    pub fn chain_hash(self, previous: u128, block_hash: u128) -> u128 {
        let tag = join(self.tag);
        tag ^ self.untagged_chain_hash(previous ^ tag, block_hash)
    }

    /// [`chain_hash`](Self::chain_hash) without the tag.
    #[inline]
    pub(crate) fn untagged_chain_hash(self, previous: u128, block_hash: u128) -> u128 {
        match self.key {
            None => chain_hash(previous, block_hash),
            Some(key) => siphash(key, &chain_bytes(previous, block_hash)) & CHAIN_MASK,
        }
    }
}

/// `value` as two halves, low first.
const fn split(value: u128) -> [u64; 2] {
    [value as u64, (value >> 64) as u64]
}

/// The value of two halves, low first.
const fn join(halves: [u64; 2]) -> u128 {
    halves[0] as u128 | (halves[1] as u128) << 64
}

/// The hash of one block's tokens alone, independent of its prefix and salt:
/// XXH3-128 of the tokens as little-endian `u32`s.
///
/// ```
/// use kvbm_sequence::block_hash;
/// assert_eq!(block_hash(&[1, 2, 3, 4]), block_hash(&[1, 2, 3, 4]));
/// assert_ne!(block_hash(&[1, 2, 3, 4]), block_hash(&[1, 2, 4, 3]));
/// ```
pub fn block_hash(tokens: &[u32]) -> u128 {
    with_le_bytes(tokens, xxh3_128_of)
}

/// Inputs past this many bytes take XXH3's long path (stripes of 64
/// bytes), where vector width pays.
const XXH3_LONG_BYTES: usize = 240;

/// XXH3-128 of `bytes`, from whichever implementation is faster at their
/// length: xxhash-rust's short paths, or twox-hash's long path with AVX2
/// when the CPU has it (a 64-token block: 33 ns against 44 ns). The same
/// function either way (a test checks every length up to 1 KiB).
#[inline(always)]
fn xxh3_128_of(bytes: &[u8]) -> u128 {
    if bytes.len() > XXH3_LONG_BYTES {
        xxh3_128_long(bytes)
    } else {
        xxh3_128(bytes)
    }
}

/// twox-hash's XXH3-128, out of line: its dispatch inlined into every
/// block hash's caller grew them past the inliner's budget (the
/// scheduler's commit stopped being inlined into its apply: +1.4%
/// instructions on 16-token blocks, which never take this path), and a
/// call costs nothing beside hashing 241 bytes or more.
#[inline(never)]
fn xxh3_128_long(bytes: &[u8]) -> u128 {
    twox_hash::XxHash3_128::oneshot(bytes)
}

/// Calls `hash` on `tokens` as little-endian bytes.
#[inline(always)]
fn with_le_bytes(tokens: &[u32], hash: impl FnOnce(&[u8]) -> u128) -> u128 {
    // Safe code cannot view `&[u32]` as bytes, and the byte order must be
    // fixed anyway, so the tokens are copied into a byte buffer first. For
    // the usual block sizes the copy has a constant length: it compiles to a
    // few vector moves the hash can read back at once, where a
    // variable-length `memcpy` made the reads stall and cost more than the
    // hash itself.
    if let Ok(block) = <&[u32; 16]>::try_from(tokens) {
        return hash(&fixed::<16, 64>(block));
    }
    if let Ok(block) = <&[u32; 32]>::try_from(tokens) {
        return hash(&fixed::<32, 128>(block));
    }
    if let Ok(block) = <&[u32; 64]>::try_from(tokens) {
        return hash(&fixed::<64, 256>(block));
    }
    let len = tokens.len();
    if len <= STACK_TOKENS {
        let mut buf = [0u8; STACK_TOKENS * 4];
        encode(tokens, &mut buf);
        hash(buf.get(..len * 4).unwrap_or_default())
    } else {
        let mut buf = vec![0u8; len * 4];
        encode(tokens, &mut buf);
        hash(&buf)
    }
}

/// `TOKENS` tokens as little-endian bytes (`BYTES == 4 * TOKENS`).
#[inline(always)]
fn fixed<const TOKENS: usize, const BYTES: usize>(tokens: &[u32; TOKENS]) -> [u8; BYTES] {
    debug_assert_eq!(BYTES, TOKENS * 4);
    let mut buf = [0u8; BYTES];
    encode(tokens, &mut buf);
    buf
}

/// Writes `tokens` as little-endian bytes to the front of `buf`.
#[inline(always)]
fn encode(tokens: &[u32], buf: &mut [u8]) {
    for (dst, token) in buf.chunks_exact_mut(4).zip(tokens) {
        dst.copy_from_slice(&token.to_le_bytes());
    }
}

/// SipHash-1-3-128 of `bytes` under `key`.
fn siphash(key: &HashKey, bytes: &[u8]) -> u128 {
    let mut hasher = SipHasher13::new_with_key(&key.0);
    hasher.write(bytes);
    hasher.finish128().as_u128()
}

/// The 32 bytes a chain step hashes: the previous value, then the block's.
fn chain_bytes(previous: u128, block_hash: u128) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    bytes[..16].copy_from_slice(&previous.to_le_bytes());
    bytes[16..].copy_from_slice(&block_hash.to_le_bytes());
    bytes
}

/// Folds a block's [`block_hash`] onto the chained value before it: the
/// parent block's chained value, or the [`Salt`] for the first block
/// (XXH3-128, seeded, of the two values' little-endian bytes, its top 8
/// bits cleared for the group: [`GROUP_SHIFT`]).
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
pub fn chain_hash(previous: u128, block_hash: u128) -> u128 {
    xxh3_128_with_seed(&chain_bytes(previous, block_hash), CHAIN_SEED) & CHAIN_MASK
}

#[cfg(test)]
mod tests {
    use siphasher::sip128::{Hasher128, SipHasher13};
    use xxhash_rust::xxh3::xxh3_128;

    use super::{HashKey, Salt, block_hash, chain_hash};

    /// The definition, written the slow obvious way.
    fn reference(tokens: &[u32]) -> u128 {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        xxh3_128(&bytes)
    }

    fn keyed_reference(key: [u8; 16], tokens: &[u32]) -> u128 {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        let mut hasher = SipHasher13::new_with_key(&key);
        std::hash::Hasher::write(&mut hasher, &bytes);
        hasher.finish128().as_u128()
    }

    #[test]
    fn both_implementations_agree_at_every_length() {
        let bytes: Vec<u8> = (0..1024u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in 0..=bytes.len() {
            let input = &bytes[..len];
            assert_eq!(super::xxh3_128_of(input), xxh3_128(input), "{len} bytes");
        }
    }

    #[test]
    fn every_encoding_path_hashes_the_little_endian_bytes() {
        // Fixed sizes (16, 32, 64), the stack buffer and the heap buffer.
        let tokens: Vec<u32> = (0..200u32).map(|t| t.wrapping_mul(0x9e37_79b9)).collect();
        let key = *b"0123456789abcdef";
        let keyed = Salt::keyed(HashKey::new(key).leak(), b"t");
        for len in 0..=tokens.len() {
            let block = &tokens[..len];
            assert_eq!(block_hash(block), reference(block), "len {len}");
            assert_eq!(Salt::NONE.block_hash(block), reference(block), "len {len}");
            assert_eq!(
                keyed.block_hash(block),
                keyed_reference(key, block),
                "len {len}"
            );
        }
    }

    #[test]
    fn chain_hash_depends_on_both_inputs_and_their_order() {
        assert_ne!(chain_hash(1, 2), chain_hash(2, 1));
        assert_ne!(chain_hash(1, 2), chain_hash(1, 3));
        let mut bytes = [0u8; 32];
        bytes[..16].copy_from_slice(&1u128.to_le_bytes());
        bytes[16..].copy_from_slice(&2u128.to_le_bytes());
        assert_ne!(chain_hash(1, 2), xxh3_128(&bytes), "seeded, not plain XXH3");
        assert_eq!(chain_hash(5, 6), chain_hash(5, 6));
        // The upper 64 bits matter: values that agree in their low halves
        // chain apart.
        assert_ne!(chain_hash(1, 2), chain_hash(1 | 1 << 64, 2));
    }

    #[test]
    fn a_chain_step_leaves_the_group_byte_zero_and_a_group_salt_sets_it() {
        let key = HashKey::new([3; 16]).leak();
        for salt in [Salt::NONE, Salt::from_bytes(b"t"), Salt::keyed(key, b"t")] {
            let mut previous = salt.get();
            for block in 0..64u128 {
                let value = salt.chain_hash(previous, block * 0x9e37_79b9);
                assert_eq!(super::group_of(value), 0, "{salt:?}");
                // Group 5's chain: its previous value is group 0's, tagged.
                let tagged = previous ^ 5 << super::GROUP_SHIFT;
                let grouped = salt.for_group(5).chain_hash(tagged, block * 0x9e37_79b9);
                assert_eq!(super::group_of(grouped), 5);
                assert_eq!(super::without_group(grouped), value);
                previous = value;
            }
        }
        assert_eq!(super::group_of(Salt::NONE.for_group(1000).get()), 255);
    }

    #[test]
    fn keys_and_tenants_separate_every_hash() {
        let k1 = HashKey::new([1; 16]).leak();
        let k2 = HashKey::new([2; 16]).leak();
        let tokens = [7u32; 16];
        let a = Salt::keyed(k1, b"a");
        assert_eq!(a, Salt::keyed(k1, b"a"));
        assert_ne!(a.get(), Salt::keyed(k1, b"b").get(), "tenants differ");
        assert_ne!(a.get(), Salt::keyed(k2, b"a").get(), "keys differ");
        assert_ne!(
            a.block_hash(&tokens),
            Salt::keyed(k2, b"a").block_hash(&tokens)
        );
        assert_ne!(
            a.block_hash(&tokens),
            block_hash(&tokens),
            "keyed is not XXH3"
        );
        assert_ne!(a.chain_hash(1, 2), chain_hash(1, 2));
        assert!(a.is_keyed() && !Salt::NONE.is_keyed());
        assert_eq!(format!("{k1:?}"), "HashKey(<secret>)");
        assert!(!format!("{a:?}").contains("1, 1"), "{a:?} shows the key");
    }

    #[test]
    fn salts() {
        assert_eq!(Salt::default(), Salt::NONE);
        assert_eq!(Salt::NONE.get(), 0);
        assert_eq!(Salt::new(7).get(), 7);
        assert_eq!(Salt::from_bytes(b"a"), Salt::new(xxh3_128(b"a")));
        assert_ne!(Salt::from_bytes(b"a"), Salt::from_bytes(b"b"));
    }
}
