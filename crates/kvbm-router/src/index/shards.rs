//! [`Shards`]: every key's [`Holders`] per medium, split by key over a
//! fixed number of maps under fewer locks: an event takes each lock its
//! keys need once per round of 64 keys (or one per key when it has few),
//! so events of different workers rarely meet, and no update takes a
//! lock over the whole index.

use std::collections::HashSet;
use std::hash::BuildHasher;

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use super::holders::{Bits, Holders, Removal, WorkerSlot};
use crate::medium::{DEVICE_SLOT, Slot};
use crate::sync::{RwLock, RwLockReadGuard, read, write};

/// log2 of the locks: 16, so workers applied from different threads
/// rarely meet and a round of an event's keys takes few (2 in the loom
/// models, which need only see two keys meet or not).
#[cfg(not(kvbm_loom))]
const LOCK_BITS: u32 = 4;
#[cfg(kvbm_loom)]
const LOCK_BITS: u32 = 1;

/// log2 of the maps under one lock: 16, 256 in all (2 in the loom models,
/// so that one lock's round spans maps).
#[cfg(not(kvbm_loom))]
const MAP_BITS: u32 = 4;
#[cfg(kvbm_loom)]
const MAP_BITS: u32 = 1;

/// The locks.
const LOCKS: usize = 1 << LOCK_BITS;

/// The maps under one lock.
const MAPS: usize = 1 << MAP_BITS;

/// One medium's keys of one map slot, with their holders.
type Map = HashTable<(u128, Holders)>;

/// The keys' hasher: seeded at random per index; with a fixed seed in the
/// loom models, whose every run must take the same locks in the same
/// order.
#[cfg(not(kvbm_loom))]
type KeyHasher = RandomState;
#[cfg(kvbm_loom)]
type KeyHasher = foldhash::fast::FixedState;

/// A key's seeded hash, worked out once per key and operation: its top
/// bits pick the key's lock and its map under that lock, the rest its
/// bucket and tag in that map. (Before, a fixed mix of the key picked the
/// map and each map hashed the key again with its own seed.)
#[derive(Clone, Copy, Debug)]
struct KeyHash(u64);

impl KeyHash {
    /// `key`'s hash under the index's seed.
    #[inline]
    fn of(hasher: &KeyHasher, key: u128) -> Self {
        Self(hasher.hash_one(key))
    }

    /// The key's map, of all `LOCKS * MAPS`: its lock is the top bits.
    #[inline]
    fn map(self) -> usize {
        (self.0 >> (64 - LOCK_BITS - MAP_BITS)) as usize
    }

    /// The hash its map files it under: turned so that the bits that
    /// picked the map, the same for every key in it, sit where no table
    /// of fewer than 2^48 buckets reads them (a table takes its buckets
    /// from the low bits and its tags from the top seven).
    #[inline]
    fn in_map(self) -> u64 {
        self.0.rotate_right(LOCK_BITS + MAP_BITS)
    }
}

/// One map slot's keys: the device medium's in place, the lower media's
/// by slot from 1 (a slot past the end holds none).
#[derive(Debug, Default)]
pub(super) struct Maps {
    device: Map,
    lower: Vec<Map>,
}

impl Maps {
    /// The holders of `key`, hashed to `hash`, on `medium`.
    #[inline]
    fn holders(&self, medium: Slot, key: u128, hash: KeyHash) -> Option<&Holders> {
        let (_, holders) = self.on(medium)?.find(hash.in_map(), |(k, _)| *k == key)?;
        Some(holders)
    }

    #[inline]
    fn on(&self, medium: Slot) -> Option<&Map> {
        match medium.checked_sub(1) {
            None => Some(&self.device),
            Some(lower) => self.lower.get(lower),
        }
    }

    #[inline]
    fn get_mut(&mut self, medium: Slot) -> Option<&mut Map> {
        match medium.checked_sub(1) {
            None => Some(&mut self.device),
            Some(lower) => self.lower.get_mut(lower),
        }
    }

    #[inline]
    fn on_mut(&mut self, medium: Slot) -> &mut Map {
        let Some(lower) = medium.checked_sub(1) else {
            return &mut self.device;
        };
        if self.lower.len() <= lower {
            self.lower.resize_with(lower + 1, Map::default);
        }
        &mut self.lower[lower]
    }

    /// Records `slot` among the holders of `key` on `medium`; whether it
    /// was new. `hasher` rehashes the map's keys if it grows. Always
    /// inlined, as [`remove`](Self::remove) is: once a bitset's insertion
    /// was inlined into it, the compiler made it a call per key in the
    /// store's round (about 15 instructions more per block stored).
    #[inline(always)]
    fn insert(
        &mut self,
        medium: Slot,
        (key, hash): (u128, KeyHash),
        slot: WorkerSlot,
        live: &Bits,
        hasher: &KeyHasher,
    ) -> bool {
        let entry = self.on_mut(medium).entry(
            hash.in_map(),
            |(k, _)| *k == key,
            |(k, _)| KeyHash::of(hasher, *k).in_map(),
        );
        match entry {
            Entry::Occupied(mut entry) => entry.get_mut().1.insert(slot, live),
            Entry::Vacant(vacant) => {
                vacant.insert((key, Holders::one(slot)));
                true
            }
        }
    }

    /// Removes `slot` from the holders of `key` on `medium`, and the key
    /// if no one else holds it there; whether it was there. Always inlined:
    /// left to the compiler it became a call per key in the removal's
    /// round (about 12 instructions more per block removed) when the
    /// update's choice between rounds and one lock per key changed shape.
    #[inline(always)]
    fn remove(&mut self, medium: Slot, (key, hash): (u128, KeyHash), slot: WorkerSlot) -> bool {
        let Some(map) = self.get_mut(medium) else {
            return false;
        };
        // One probe: the entry, removed through itself once empty.
        let Ok(mut entry) = map.find_entry(hash.in_map(), |(k, _)| *k == key) else {
            return false;
        };
        // Most keys have this slot as their one holder: the key goes at
        // once, with no update of a set about to be dropped nor a second
        // look at what is left of it.
        if entry.get().1.is_only(slot) {
            // Inline, the set owns nothing: forgotten rather than dropped,
            // it costs no second look at its form.
            std::mem::forget(entry.remove().0);
            return true;
        }
        match entry.get_mut().1.remove(slot) {
            Removal::Absent => false,
            Removal::Removed => true,
            Removal::Emptied => {
                entry.remove();
                true
            }
        }
    }

    /// Every medium's map.
    fn all(&self) -> impl Iterator<Item = &Map> {
        std::iter::once(&self.device).chain(&self.lower)
    }

    fn all_mut(&mut self) -> impl Iterator<Item = &mut Map> {
        std::iter::once(&mut self.device).chain(&mut self.lower)
    }
}

/// A shard: its maps, `MAPS` of them under one lock on a cache line of its
/// own (so neighbours' locks do not share one). Keys are spread over more
/// maps than locks so that no one map grows large: a map's growth copies
/// it under the lock, and a small one's copy is short.
#[repr(align(64))]
#[derive(Debug)]
struct Shard(RwLock<Stripe>);

/// One lock's maps, picked by key.
#[derive(Debug)]
pub(super) struct Stripe([Maps; MAPS]);

impl Default for Stripe {
    fn default() -> Self {
        Self(std::array::from_fn(|_| Maps::default()))
    }
}

/// One key's maps, read-locked with the rest of their shard.
pub(super) struct MapsRead<'a> {
    stripe: RwLockReadGuard<'a, Stripe>,
    /// The key's maps in the stripe.
    at: usize,
    /// The key's hash.
    hash: KeyHash,
}

impl MapsRead<'_> {
    /// The holders of `key` (the key this was read for) on `medium`.
    #[inline]
    pub(super) fn holders(&self, medium: Slot, key: u128) -> Option<&Holders> {
        self.stripe.0[self.at].holders(medium, key, self.hash)
    }
}

/// The shards, and the seed of every key's hash: per index, so that keys
/// a peer picks cannot be made to crowd one bucket, or one lock, of an
/// index it cannot see.
#[derive(Debug)]
pub(super) struct Shards {
    shards: Box<[Shard]>,
    hasher: KeyHasher,
}

impl Default for Shards {
    fn default() -> Self {
        Self {
            shards: (0..LOCKS).map(|_| Shard(RwLock::default())).collect(),
            hasher: KeyHasher::default(),
        }
    }
}

/// Keys an update groups by lock at a time: each lock it needs is taken
/// once per round, in lock order. At most 64: a round keeps a bit per key
/// in a `u64` per lock.
const ROUND: usize = 64;
const _: () = assert!(ROUND <= 64);

/// Keys below which an update takes a lock per key instead: grouping a
/// few (filling a round's buffer and its masks) costs more than the
/// locks it would save. (2 in the loom models, whose events of two keys
/// then take the grouped path.)
#[cfg(not(kvbm_loom))]
const GROUPED: usize = 16;
#[cfg(kvbm_loom)]
const GROUPED: usize = 2;

impl Shards {
    /// The lock over map `map` (of all `LOCKS * MAPS`).
    fn lock(&self, map: usize) -> &RwLock<Stripe> {
        &self.shards[map >> MAP_BITS].0
    }

    /// `key` with its hash.
    #[inline]
    fn hashed(&self, key: u128) -> (u128, KeyHash) {
        (key, KeyHash::of(&self.hasher, key))
    }

    /// Records `slot` among the holders of each of `keys` on `medium`;
    /// how many were new. `live` lets a full set drop dead slots before it
    /// grows.
    pub(super) fn insert(
        &self,
        medium: Slot,
        keys: impl IntoIterator<Item = u128>,
        slot: WorkerSlot,
        live: &Bits,
    ) -> usize {
        let hasher = &self.hasher;
        // The device medium's (most events') with its slot a constant, so
        // that no key's update chooses between media.
        if medium == DEVICE_SLOT {
            return self.each(keys, move |maps, key| {
                maps.insert(DEVICE_SLOT, key, slot, live, hasher)
            });
        }
        self.each(keys, move |maps, key| {
            maps.insert(medium, key, slot, live, hasher)
        })
    }

    /// Removes `slot` from the holders of each of `keys` on `medium` (a key
    /// with it, if no one else holds it there); how many it was among.
    pub(super) fn remove(
        &self,
        medium: Slot,
        keys: impl IntoIterator<Item = u128>,
        slot: WorkerSlot,
    ) -> usize {
        // As `insert`.
        if medium == DEVICE_SLOT {
            return self.each(keys, move |maps, key| maps.remove(DEVICE_SLOT, key, slot));
        }
        self.each(keys, move |maps, key| maps.remove(medium, key, slot))
    }

    /// Applies `op` to each of `keys` under its lock's write lock; how
    /// many times it returned true. The keys go in rounds of [`ROUND`],
    /// each round's grouped by lock so that it takes each lock once: an
    /// uncontended lock still costs two atomic operations, which were
    /// most of an update's time when every key took its own. Keys under
    /// one lock keep their order; the order across locks does not matter
    /// (each key's update is its own).
    #[inline]
    fn each(
        &self,
        keys: impl IntoIterator<Item = u128>,
        mut op: impl FnMut(&mut Maps, (u128, KeyHash)) -> bool,
    ) -> usize {
        let mut keys = keys.into_iter();
        let mut done = 0usize;
        // Known to be few: a lock each, with no round to fill. Otherwise
        // rounds, each of which still goes key by key if short. (The upper
        // bound, not the lower: a filtered event's lower bound is 0, and
        // deciding on it sent every removal of the in-process wire, which
        // filters by KV cache group, through a lock per key.)
        if keys.size_hint().1.is_some_and(|most| most < GROUPED) {
            return self.one_by_one(keys.map(|key| self.hashed(key)), &mut op);
        }
        // Each key with its hash, worked out as the round fills, and a bit
        // per key in its lock's mask.
        let mut round = [(0u128, KeyHash(0)); ROUND];
        loop {
            let mut masks = [0u64; LOCKS];
            // The next key's bit, shifted along (`1 << n` took three
            // instructions a key): after `n` keys it is `1 << n`, or 0
            // after all `ROUND`, so it counts them too.
            let mut bit = 1u64;
            for (at, key) in round.iter_mut().zip(&mut keys) {
                let hashed = self.hashed(key);
                masks[hashed.1.map() >> MAP_BITS] |= bit;
                bit <<= 1;
                *at = hashed;
            }
            let n = bit.trailing_zeros() as usize;
            done += if n < GROUPED {
                self.one_by_one(round[..n].iter().copied(), &mut op)
            } else {
                self.round(&round, &masks, &mut op)
            };
            if n < ROUND {
                return done;
            }
        }
    }

    /// [`each`](Self::each) for a few keys, each with its hash: a lock
    /// each.
    #[inline]
    fn one_by_one(
        &self,
        keys: impl Iterator<Item = (u128, KeyHash)>,
        op: &mut impl FnMut(&mut Maps, (u128, KeyHash)) -> bool,
    ) -> usize {
        keys.filter(|&key| {
            let map = key.1.map();
            #[cfg(test)]
            tests::count_write_lock();
            op(&mut write(self.lock(map)).0[map & (MAPS - 1)], key)
        })
        .count()
    }

    /// One round of [`each`](Self::each), its `keys` with their hashes
    /// (the whole buffer: a key no mask covers, past the round's end, is
    /// never read) and, per lock, a bit per key it covers: each lock's
    /// keys, in their order, under one write lock. (A mask per lock costs
    /// a few instructions a key, where sorting the keys by lock cost
    /// enough to lose what the locks saved on keys many workers hold.)
    fn round(
        &self,
        keys: &[(u128, KeyHash); ROUND],
        masks: &[u64; LOCKS],
        op: &mut impl FnMut(&mut Maps, (u128, KeyHash)) -> bool,
    ) -> usize {
        let mut done = 0usize;
        for (shard, &mask) in self.shards.iter().zip(masks) {
            if mask == 0 {
                continue;
            }
            #[cfg(test)]
            tests::count_write_lock();
            let mut stripe = write(&shard.0);
            let mut mask = mask;
            while mask != 0 {
                // Below `ROUND`, a bit of a `u64`: said so, the index needs
                // no bounds check, and without that check's length the loop
                // kept fewer values on the stack (about 4 instructions a
                // block fewer).
                let at = mask.trailing_zeros() as usize % ROUND;
                mask &= mask - 1;
                let key = keys[at];
                let maps = &mut stripe.0[key.1.map() & (MAPS - 1)];
                done += usize::from(op(maps, key));
            }
        }
        done
    }

    /// `key`'s maps, read-locked: its holders on every medium.
    #[inline]
    pub(super) fn read(&self, key: u128) -> MapsRead<'_> {
        let hash = KeyHash::of(&self.hasher, key);
        let map = hash.map();
        MapsRead {
            stripe: read(self.lock(map)),
            at: map & (MAPS - 1),
            hash,
        }
    }

    /// Drops the bits of `dead` slots from every holder set, shard by
    /// shard (one lock at a time), and the keys no one holds any more;
    /// how many bits remain.
    pub(super) fn sweep(&self, dead: &Bits) -> usize {
        let mut kept = 0usize;
        let hasher = &self.hasher;
        for shard in self.shards.iter() {
            let mut stripe = write(&shard.0);
            for map in stripe.0.iter_mut().flat_map(Maps::all_mut) {
                map.retain(|(_, holders)| {
                    holders.remove_all(dead);
                    kept = kept.saturating_add(holders.len());
                    !holders.is_empty()
                });
                if map.capacity() > map.len().saturating_mul(4).max(64) {
                    map.shrink_to_fit(|(k, _)| KeyHash::of(hasher, *k).in_map());
                }
            }
        }
        kept
    }

    /// Distinct keys some `live` slot holds on some medium (each map's
    /// keys are its own). Visits every key.
    pub(super) fn distinct(&self, live: &Bits) -> usize {
        let held = |holders: &Holders| holders.iter().any(|slot| live.contains(slot));
        let mut total = 0usize;
        for shard in self.shards.iter() {
            let stripe = read(&shard.0);
            for maps in &stripe.0 {
                total = total.saturating_add(if maps.lower.is_empty() {
                    maps.device.iter().filter(|(_, h)| held(h)).count()
                } else {
                    let keys: HashSet<u128, RandomState> = (maps.all())
                        .flat_map(|map| map.iter().filter(|(_, h)| held(h)).map(|(k, _)| *k))
                        .collect();
                    keys.len()
                });
            }
        }
        total
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::cell::Cell;

    use super::*;

    thread_local! {
        /// Write locks this thread's updates took.
        static WRITE_LOCKS: Cell<usize> = const { Cell::new(0) };
    }

    /// An update took a write lock (test builds only).
    pub(super) fn count_write_lock() {
        WRITE_LOCKS.with(|locks| locks.set(locks.get() + 1));
    }

    /// Write locks `update` took on this thread.
    fn write_locks(update: impl FnOnce()) -> usize {
        let before = WRITE_LOCKS.with(Cell::get);
        update();
        WRITE_LOCKS.with(Cell::get) - before
    }

    /// A long update takes each lock once per round, however its keys come:
    /// a filtered iterator's lower size bound is 0, and deciding on it once
    /// sent every in-process removal (filtered by KV cache group) through a
    /// lock per key.
    #[test]
    fn long_updates_take_each_lock_once_per_round_even_filtered() {
        let shards = Shards::default();
        let live = Bits::default();
        let keys: Vec<u128> = (0..ROUND as u128).map(|k| k * 0x9e37_79b9).collect();
        let every = |&key: &u128| key != u128::MAX;
        let stored = write_locks(|| {
            let new = shards.insert(0, keys.iter().copied().filter(every), 1, &live);
            assert_eq!(new, ROUND);
        });
        let removed = write_locks(|| {
            let held = shards.remove(0, keys.iter().copied().filter(every), 1);
            assert_eq!(held, ROUND);
        });
        assert!(
            stored <= LOCKS && removed <= LOCKS,
            "{stored} and {removed} locks"
        );
        // A few keys known to be few take a lock each.
        let few = write_locks(|| {
            shards.insert(0, keys[..GROUPED - 1].iter().copied(), 1, &live);
        });
        assert_eq!(few, GROUPED - 1);
    }
}
