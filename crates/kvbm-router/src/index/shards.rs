//! [`Shards`]: every key's [`Holders`] per medium, split by key over a
//! fixed number of shards, each behind its own lock: an event locks one
//! shard per block, so events of different workers rarely meet, and no
//! update takes a lock over the whole index.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

use foldhash::fast::RandomState;

use super::holders::{Bits, Holders, WorkerSlot};
use crate::medium::Slot;
use crate::sync::{RwLock, RwLockReadGuard, read, write};

/// log2 of the shards: 256, so two workers' events rarely meet (2 in the
/// loom models, which need only see two keys meet or not).
#[cfg(not(kvbm_loom))]
const SHARD_BITS: u32 = 8;
#[cfg(kvbm_loom)]
const SHARD_BITS: u32 = 1;

/// The shards.
const SHARDS: usize = 1 << SHARD_BITS;

/// One medium's keys in one shard, with their holders.
type Map = HashMap<u128, Holders, RandomState>;

/// One shard's keys: the device medium's in place (the routing path's
/// map header shares its lock's cache line: `repr(C)`, device map first),
/// the lower media's by slot from 1 (a slot past the end holds none).
#[repr(C)]
#[derive(Debug, Default)]
pub(super) struct Maps {
    device: Map,
    lower: Vec<Map>,
}

impl Maps {
    /// The holders of `key` on `medium`.
    #[inline]
    pub(super) fn holders(&self, medium: Slot, key: u128) -> Option<&Holders> {
        self.on(medium)?.get(&key)
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
    /// was new.
    #[inline]
    fn insert(&mut self, medium: Slot, key: u128, slot: WorkerSlot, live: &Bits) -> bool {
        match self.on_mut(medium).entry(key) {
            Entry::Occupied(mut holders) => holders.get_mut().insert(slot, live),
            Entry::Vacant(vacant) => {
                vacant.insert(Holders::one(slot));
                true
            }
        }
    }

    /// Removes `slot` from the holders of `key` on `medium`, and the key
    /// if no one else holds it there; whether it was there.
    #[inline]
    fn remove(&mut self, medium: Slot, key: u128, slot: WorkerSlot) -> bool {
        let Some(map) = self.get_mut(medium) else {
            return false;
        };
        // One probe: the entry, removed through itself once empty.
        let Entry::Occupied(mut holders) = map.entry(key) else {
            return false;
        };
        let held = holders.get_mut().remove(slot);
        if holders.get().is_empty() {
            holders.remove();
        }
        held
    }

    /// Every medium's map.
    fn all(&self) -> impl Iterator<Item = &Map> {
        std::iter::once(&self.device).chain(&self.lower)
    }

    fn all_mut(&mut self) -> impl Iterator<Item = &mut Map> {
        std::iter::once(&mut self.device).chain(&mut self.lower)
    }
}

/// A shard: its lock on a cache line of its own, so neighbours' locks do
/// not share one.
#[repr(align(64))]
#[derive(Debug)]
struct Shard(RwLock<Maps>);

/// The shards.
#[derive(Debug)]
pub(super) struct Shards(Box<[Shard]>);

impl Default for Shards {
    fn default() -> Self {
        Self(
            (0..SHARDS)
                .map(|_| Shard(RwLock::new(Maps::default())))
                .collect(),
        )
    }
}

/// `key`'s shard: a fixed mix of its bits (the maps inside are keyed with
/// a random seed; this only spreads the locks).
#[inline]
fn shard_of(key: u128) -> usize {
    let folded = (key as u64) ^ ((key >> 64) as u64);
    let mixed = (folded ^ folded >> 29).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (mixed >> (64 - SHARD_BITS)) as usize
}

impl Shards {
    fn of(&self, key: u128) -> &RwLock<Maps> {
        &self.0[shard_of(key)].0
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
        self.each(keys, |maps, key| maps.insert(medium, key, slot, live))
    }

    /// Removes `slot` from the holders of each of `keys` on `medium` (a key
    /// with it, if no one else holds it there); how many it was among.
    pub(super) fn remove(
        &self,
        medium: Slot,
        keys: impl IntoIterator<Item = u128>,
        slot: WorkerSlot,
    ) -> usize {
        self.each(keys, |maps, key| maps.remove(medium, key, slot))
    }

    /// Applies `op` to each of `keys` under its shard's write lock, one
    /// key at a time; how many times it returned true. (Grouping a batch's
    /// keys by shard, to lock each shard once per batch, cost more than
    /// the locks it saved, even over 16 shards: the time goes to the maps'
    /// cache misses more than to the locks.)
    #[inline]
    fn each(
        &self,
        keys: impl IntoIterator<Item = u128>,
        mut op: impl FnMut(&mut Maps, u128) -> bool,
    ) -> usize {
        (keys.into_iter())
            .filter(|&key| op(&mut write(self.of(key)), key))
            .count()
    }

    /// `key`'s shard, read-locked: its holders on every medium.
    #[inline]
    pub(super) fn read(&self, key: u128) -> RwLockReadGuard<'_, Maps> {
        read(self.of(key))
    }

    /// Drops the bits of `dead` slots from every holder set, shard by
    /// shard (one lock at a time), and the keys no one holds any more;
    /// how many bits remain.
    pub(super) fn sweep(&self, dead: &Bits) -> usize {
        let mut kept = 0usize;
        for shard in self.0.iter() {
            let mut maps = write(&shard.0);
            for map in maps.all_mut() {
                map.retain(|_, holders| {
                    holders.remove_all(dead);
                    kept = kept.saturating_add(holders.len());
                    !holders.is_empty()
                });
                if map.capacity() > map.len().saturating_mul(4).max(64) {
                    map.shrink_to_fit();
                }
            }
        }
        kept
    }

    /// Distinct keys some `live` slot holds on some medium (each shard's
    /// keys are its own). Visits every key.
    pub(super) fn distinct(&self, live: &Bits) -> usize {
        let held = |holders: &Holders| holders.iter().any(|slot| live.contains(slot));
        let mut total = 0usize;
        for shard in self.0.iter() {
            let maps = read(&shard.0);
            total = total.saturating_add(if maps.lower.is_empty() {
                maps.device.values().filter(|h| held(h)).count()
            } else {
                let keys: HashSet<u128, RandomState> = (maps.all())
                    .flat_map(|map| map.iter().filter(|(_, h)| held(h)).map(|(k, _)| *k))
                    .collect();
                keys.len()
            });
        }
        total
    }
}
