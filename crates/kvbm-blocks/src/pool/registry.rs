//! The prefix-cache registry: chained hash value → the block registered
//! under it.
//!
//! The table stores only the 4-byte [`BlockId`]; a key is read from the
//! slot the id names. With one entry per registered block that keeps the
//! table at about 5 bytes per block, small enough to stay in cache, where a
//! `HashMap<u64, BlockId>` (16-byte buckets) spilled out of L2 and made
//! evictions (one removal each) the replay's hottest spot.

use std::hash::BuildHasher;

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use crate::BlockId;
use crate::hash::join;

#[derive(Debug)]
pub(super) struct Registry {
    table: HashTable<BlockId>,
    /// Seeded per pool; mixes hand-made keys (0, 1, 2...) well.
    hasher: RandomState,
}

impl Registry {
    /// Room for `capacity` entries: one per block, so it never grows.
    pub(super) fn with_capacity(capacity: usize) -> Self {
        Self {
            table: HashTable::with_capacity(capacity),
            hasher: RandomState::default(),
        }
    }

    /// The bucket hash of a key: the seeded hash of its two 64-bit halves
    /// XORed. Keys are outputs of XXH3-128 or keyed SipHash, uniform in
    /// their low bits, and the per-pool seed keeps buckets unpredictable
    /// even for keys an attacker can compute; crowding one bucket would take
    /// values whose halves XOR alike (a 2^64 search each). The high half
    /// counts because keys may differ in it alone: a model's KV cache
    /// groups key one prefix's blocks by the same low bits and a group
    /// number on top (kvbm-sequence's `GROUP_SHIFT`), which would otherwise
    /// share a bucket. Hashing the whole `u128` cost two extra multiplies
    /// per lookup; the XOR costs one instruction.
    #[inline]
    pub(super) fn hash(&self, value: u128) -> u64 {
        bucket_hash(&self.hasher, value)
    }

    /// The block registered under `value`; `key_of` reads a block's key
    /// (its halves, low first, as a slot keeps them).
    #[inline]
    pub(super) fn get(&self, value: u128, key_of: impl Fn(BlockId) -> Key) -> Option<BlockId> {
        self.get_hashed(self.hash(value), value, key_of)
    }

    /// [`get`](Self::get) with the key's bucket hash ([`hash`](Self::hash))
    /// worked out already.
    #[inline]
    pub(super) fn get_hashed(
        &self,
        hash: u64,
        value: u128,
        key_of: impl Fn(BlockId) -> Key,
    ) -> Option<BlockId> {
        self.table
            .find(hash, |&id| is_key(key_of(id), value))
            .copied()
    }

    /// Registers `id` under `value` unless a block is registered under it
    /// already, which it returns instead (one probe for both). Inlined into
    /// `PoolState::register`, its one caller, which runs once per block
    /// (left to the compiler, it stayed a call in the registration loop).
    #[inline(always)]
    pub(super) fn insert_or_get(
        &mut self,
        value: u128,
        id: BlockId,
        key_of: impl Fn(BlockId) -> Key,
    ) -> Option<BlockId> {
        let hasher = &self.hasher;
        let entry = self.table.entry(
            bucket_hash(hasher, value),
            |&other| is_key(key_of(other), value),
            |&other| bucket_hash(hasher, join(key_of(other))),
        );
        match entry {
            Entry::Occupied(existing) => Some(*existing.get()),
            Entry::Vacant(vacant) => {
                vacant.insert(id);
                None
            }
        }
    }

    /// Registers `id` under the key whose bucket hash is `hash`
    /// ([`hash`](Self::hash)), a key the caller has just found absent (with
    /// nothing inserted since): no key is compared on the way.
    #[inline]
    pub(super) fn insert_new(&mut self, hash: u64, id: BlockId, key_of: impl Fn(BlockId) -> Key) {
        let hasher = &self.hasher;
        (self.table).insert_unique(hash, id, |&other| bucket_hash(hasher, join(key_of(other))));
    }

    /// Unregisters `id`, registered under `value`; whether it was there.
    /// Only ids are compared, so the slot's key is not read.
    #[inline]
    pub(super) fn remove(&mut self, value: u128, id: BlockId) -> bool {
        match self
            .table
            .find_entry(self.hash(value), |&other| other == id)
        {
            Ok(entry) => {
                entry.remove();
                true
            }
            Err(_) => false,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.table.len()
    }
}

/// A key as the slots keep it: the chained hash value's halves, low first.
pub(super) type Key = [u64; 2];

/// Whether `key` is `value`, a half at a time: a different key (in a
/// probe, one whose bucket tag matched by chance) almost always differs in
/// its low half, and the compares read the slot's halves in place, where
/// the 128-bit compare (two XORs and an OR) took two registers for them.
/// In the match loop, whose registers the table's probe already strains,
/// that saved two instructions a block.
#[inline(always)]
fn is_key(key: Key, value: u128) -> bool {
    key[0] == value as u64 && key[1] == (value >> 64) as u64
}

/// The one hash every table operation uses for a key (see [`Registry::hash`]).
#[inline]
fn bucket_hash(hasher: &RandomState, value: u128) -> u64 {
    hasher.hash_one(value as u64 ^ (value >> 64) as u64)
}
