//! What travels with a block's bytes: its key and a [`Checksum`] that binds
//! the bytes to the key, so bytes filed under another key never verify.

use std::hash::Hasher as _;

use kvbm_blocks::SequenceHash;
use twox_hash::XxHash3_64;

/// A 64-bit checksum of a block's bytes, seeded by the block's hash value:
/// the same bytes under another key give another checksum, so a block read
/// back under the wrong key (a stale slot, a misfiled value) fails
/// verification as surely as flipped bits do.
///
/// XXH3-64 (the hash kvbm already uses for token blocks) runs at memory
/// speed; it detects accidents (torn writes, bit rot, misfiling), it is not
/// a defence against a peer forging bytes.
///
/// It is computed with `twox-hash`, which picks its AVX2 code at run time
/// when the CPU has it (SSE2 otherwise), so a binary built for any x86-64
/// hashes at about twice the SSE2 rate on the machines that can; the
/// values are XXH3's, the same on every CPU and as `xxhash-rust`'s (a test
/// pins both), so checksums already on disk or in Redis still verify.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Checksum(u64);

impl Checksum {
    /// The checksum of `bytes` as the block `key`.
    pub fn of(key: u128, bytes: &[u8]) -> Self {
        Self(XxHash3_64::oneshot_with_seed(seed(key), bytes))
    }

    /// A checksum read back from a medium.
    pub fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The raw value, to write beside the bytes.
    pub fn get(self) -> u64 {
        self.0
    }

    /// Whether `bytes` are the block `key` this checksum was taken of.
    pub fn verifies(self, key: u128, bytes: &[u8]) -> bool {
        Self::of(key, bytes) == self
    }
}

/// A [`Checksum`] taken piece by piece, as a block's bytes arrive: for the
/// pieces of a block in order, the checksum [`Checksum::of`] gives for the
/// whole block. A reader hashes each piece right after it lands, while it is
/// still in the CPU's cache, instead of reading the whole block back from
/// memory afterwards.
pub(crate) struct Summing(XxHash3_64);

impl Summing {
    /// A checksum of the block `key`, no bytes in it yet.
    pub(crate) fn new(key: u128) -> Self {
        Self(XxHash3_64::with_seed(seed(key)))
    }

    /// Adds the block's next bytes.
    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }

    /// The checksum of the bytes added so far.
    pub(crate) fn finish(&self) -> Checksum {
        Checksum(self.0.finish())
    }
}

/// Folds a 128-bit key into XXH3's 64-bit seed.
fn seed(key: u128) -> u64 {
    (key as u64) ^ ((key >> 64) as u64).rotate_left(29)
}

/// Where a block sits in its sequence: its parent's hash value and its
/// position, the rest of its [`SequenceHash`] beside the key. A store that
/// outlives its process (the disk) keeps it, so the tier can take its
/// blocks back after a restart with their lineage whole
/// ([`DiskStore::blocks`](crate::DiskStore::blocks)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Lineage {
    /// The parent block's hash value; `None` for a sequence's first block.
    pub parent: Option<u128>,
    /// The block's index in its sequence.
    pub position: u32,
}

impl Lineage {
    /// A sequence's first block.
    pub const ROOT: Self = Self {
        parent: None,
        position: 0,
    };

    /// The lineage of `hash`.
    pub fn of(hash: SequenceHash) -> Self {
        Self {
            parent: hash.parent(),
            position: hash.position(),
        }
    }

    /// The whole hash of the block `key` with this lineage (a lineage that
    /// does not hold together, a parent at position 0 or none past it, is
    /// taken as a root's).
    pub fn hash(self, key: u128) -> SequenceHash {
        SequenceHash::from_parts(key, self.parent, self.position)
            .unwrap_or_else(|_| SequenceHash::root(key))
    }
}

/// One block to put: its key (the block's [`SequenceHash`] value), its
/// lineage, its checksum and its bytes.
#[derive(Clone, Copy, Debug)]
pub struct BlockRef<'a> {
    /// The block's hash value ([`SequenceHash::value`]).
    pub key: u128,
    /// The rest of its hash (stores that keep it: the disk).
    pub lineage: Lineage,
    /// [`Checksum::of`] the key and bytes.
    pub checksum: Checksum,
    /// The block's bytes, the store's block size long.
    pub bytes: &'a [u8],
}

impl<'a> BlockRef<'a> {
    /// The block `hash` with `bytes`, checksummed here.
    pub fn new(hash: SequenceHash, bytes: &'a [u8]) -> Self {
        let key = hash.value();
        Self {
            key,
            lineage: Lineage::of(hash),
            checksum: Checksum::of(key, bytes),
            bytes,
        }
    }
}

impl<'a> BlockRef<'a> {
    /// The first block of a sequence, `key`, with `bytes`, checksummed
    /// here: for a caller that keys blocks by hash value alone.
    pub fn root(key: u128, bytes: &'a [u8]) -> Self {
        Self::new(SequenceHash::root(key), bytes)
    }

    /// What a store answers a put of this block when it holds `stored`
    /// under its key already: nothing to do for the same bytes,
    /// [`StoreError::Collision`](crate::StoreError::Collision) (the stored
    /// block kept) for others.
    pub(crate) fn against_stored(&self, stored: Checksum) -> Result<(), crate::StoreError> {
        if stored == self.checksum {
            Ok(())
        } else {
            Err(crate::StoreError::Collision { key: self.key })
        }
    }

    /// [`StoreError::WrongSize`](crate::StoreError::WrongSize) unless the
    /// block is `block_bytes` long.
    pub(crate) fn check_len(&self, block_bytes: usize) -> Result<(), crate::StoreError> {
        if self.bytes.len() == block_bytes {
            Ok(())
        } else {
            Err(crate::StoreError::WrongSize {
                expected: block_bytes,
                got: self.bytes.len(),
            })
        }
    }
}

/// The bytes a fake engine holds for the block `key`: a deterministic
/// function of the key (XXH3 in counter mode), so a test can check any
/// loaded block byte for byte against what it must be.
pub fn fake_kv(key: u128, out: &mut [u8]) {
    for (counter, chunk) in out.chunks_mut(8).enumerate() {
        let word = XxHash3_64::oneshot_with_seed(seed(key), &(counter as u64).to_le_bytes());
        chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checksum_binds_the_bytes_to_their_key() {
        let bytes = [7u8; 64];
        let sum = Checksum::of(1, &bytes);
        assert!(sum.verifies(1, &bytes));
        assert!(!sum.verifies(2, &bytes));
        let mut flipped = bytes;
        flipped[63] ^= 1;
        assert!(!sum.verifies(1, &flipped));
    }

    /// XXH3 as `xxhash-rust` computes it (the checksums every store wrote
    /// before the switch to `twox-hash`), at lengths around each of XXH3's
    /// code paths (0-16, 17-128, 129-240 bytes, stripes, blocks of 1 KiB,
    /// its 256-byte streaming buffer), seeds included.
    #[test]
    fn checksums_are_xxh3_whole_or_in_pieces_as_before() {
        let bytes: Vec<u8> = (0..70_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let lengths = (0..=300)
            .chain([1023, 1024, 1025, 4095, 4096, 4097, 65_536, 69_999])
            .chain((1..=9).map(|k| 7_777 * k));
        for len in lengths {
            for key in [
                0u128,
                1,
                u128::MAX,
                0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
            ] {
                let block = &bytes[..len];
                let want = xxhash_rust::xxh3::xxh3_64_with_seed(block, seed(key));
                assert_eq!(Checksum::of(key, block).get(), want, "{len} bytes");
                for piece in [1, 63, 64, 255, 256, 257, 4096] {
                    let mut summing = Summing::new(key);
                    block.chunks(piece).for_each(|part| summing.update(part));
                    assert_eq!(summing.finish().get(), want, "{len} bytes in {piece}s");
                }
            }
        }
    }

    #[test]
    fn fake_kv_depends_on_the_key_and_fills_odd_lengths() {
        let (mut a, mut b) = ([0u8; 13], [0u8; 13]);
        fake_kv(5, &mut a);
        fake_kv(6, &mut b);
        assert_ne!(a, b);
        let mut again = [0u8; 13];
        fake_kv(5, &mut again);
        assert_eq!(a, again);
    }
}
