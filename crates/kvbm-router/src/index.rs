//! [`PrefixIndex`]: which workers hold which blocks, for many workers at
//! once, safe to update and query from many threads.

mod slots;

use std::sync::{PoisonError, RwLock, RwLockReadGuard};

use dashmap::DashMap;
use foldhash::fast::RandomState;

use self::slots::Slots;
use crate::WorkerId;

/// A block key in two halves: 8-byte aligned, so an entry with its holder
/// mask is 24 bytes (a `u128` key would pad it to 32). The index is as
/// large as the fleet's caches together, and its cost is cache misses.
type Key = [u64; 2];

fn split(key: u128) -> Key {
    [key as u64, (key >> 64) as u64]
}

/// Workers numbered below this are bits of a block's mask; the mask's top
/// bit says the block has holders numbered from here on, listed in the
/// spill map.
const INLINE_SLOTS: usize = 63;
const SPILLED: u64 = 1 << INLINE_SLOTS;

fn bit(slot: usize) -> u64 {
    1 << slot
}

/// The inline holders of a mask, lowest number first.
fn inline_slots(mask: u64) -> impl Iterator<Item = usize> {
    let mut rest = mask & !SPILLED;
    std::iter::from_fn(move || {
        let slot = rest.trailing_zeros() as usize;
        (rest != 0).then(|| {
            rest &= rest - 1;
            slot
        })
    })
}

/// Block key to the workers that hold the block. A key is the block's hash
/// as the engines send it ([`block_key`](crate::block_key)); it names the
/// block *and its whole prefix*, so one lookup per block answers "which
/// workers have the prefix up to here".
///
/// Workers are numbered densely inside the index, and a block's holders
/// are a 64-bit mask of those numbers: a block costs one 24-byte entry
/// whether one worker holds it or sixty-three, and a request's walk keeps
/// the workers still matching as a mask. Past 63 workers at once, the
/// higher numbers are listed per block in a second map (correct, as costly
/// as a list of holders per block).
///
/// ```
/// use kvbm_router::PrefixIndex;
///
/// let index = PrefixIndex::new();
/// index.insert_many(7, [1, 2, 3]);
/// index.insert_many(9, [1, 3]);
/// // Worker 9 lacks block 2, so only block 1 of the prefix counts for it.
/// assert_eq!(index.overlaps(&[1, 2, 3, 4]), [(7, 3), (9, 1)]);
/// assert_eq!(index.holders(3), [7, 9]);
/// ```
#[derive(Debug, Default)]
pub struct PrefixIndex {
    blocks: DashMap<Key, u64, RandomState>,
    /// Holders numbered [`INLINE_SLOTS`] and up, sorted, of the blocks
    /// whose mask has [`SPILLED`]. Locked only while the block's own entry
    /// is (blocks first, then spill), or by readers holding neither.
    spill: DashMap<Key, Vec<usize>, RandomState>,
    /// Read-locked by every update for its whole length, write-locked to
    /// free a number: a freed number holds no bits when it is reused.
    slots: RwLock<Slots>,
}

impl PrefixIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `worker` holds `key`; whether it was new.
    pub fn insert(&self, key: u128, worker: WorkerId) -> bool {
        self.insert_many(worker, [key]) == 1
    }

    /// Records that `worker` holds each of `keys` (one event's blocks);
    /// how many were new.
    pub fn insert_many(&self, worker: WorkerId, keys: impl IntoIterator<Item = u128>) -> usize {
        let (slots, slot) = self.slot_or_assign(worker);
        let new = keys
            .into_iter()
            .filter(|&key| self.insert_slot(split(key), slot))
            .count();
        drop(slots);
        new
    }

    /// Records that `worker` no longer holds `key`; whether it did.
    pub fn remove(&self, key: u128, worker: WorkerId) -> bool {
        self.remove_many(worker, [key]) == 1
    }

    /// Records that `worker` no longer holds each of `keys`; how many it
    /// did.
    pub fn remove_many(&self, worker: WorkerId, keys: impl IntoIterator<Item = u128>) -> usize {
        let slots = self.read_slots();
        let Some(slot) = slots.get(worker) else {
            return 0;
        };
        keys.into_iter()
            .filter(|&key| self.remove_slot(split(key), slot))
            .count()
    }

    /// Forgets every block `worker` holds; how many it held. Visits the
    /// whole index, so it costs what the index holds, not what the worker
    /// did: for the rare clear or departure, not for every eviction.
    pub fn remove_worker(&self, worker: WorkerId) -> usize {
        let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        let Some(slot) = slots.get(worker) else {
            return 0;
        };
        let mut removed = 0;
        if slot < INLINE_SLOTS {
            self.blocks.retain(|_, mask| {
                removed += usize::from(*mask & bit(slot) != 0);
                *mask &= !bit(slot);
                *mask != 0
            });
        } else {
            self.blocks.retain(|key, mask| {
                if *mask & SPILLED != 0 {
                    removed += usize::from(self.remove_spilled(key, slot, mask));
                }
                *mask != 0
            });
        }
        slots.release(worker);
        removed
    }

    /// The workers holding `key`, in order.
    pub fn holders(&self, key: u128) -> Vec<WorkerId> {
        let key = split(key);
        let slots = self.read_slots();
        let Some(mask) = self.blocks.get(&key).map(|mask| *mask) else {
            return Vec::new();
        };
        let mut holders: Vec<WorkerId> = inline_slots(mask)
            .chain(self.spilled(&key, mask))
            .filter_map(|slot| slots.worker(slot))
            .collect();
        holders.sort_unstable();
        holders
    }

    /// Distinct keys held by any worker.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether no worker holds anything.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// For the chain of block keys of a request (its prefix first), how
    /// many leading blocks each worker holds, for every worker holding at
    /// least the first; in worker order. Stops at the first block no
    /// remaining worker holds, so a miss costs one lookup.
    pub fn overlaps(&self, keys: &[u128]) -> Vec<(WorkerId, usize)> {
        let slots = self.read_slots();
        let mut out: Vec<(usize, usize)> = Vec::new();
        // The workers still matching: inline numbers as a mask, the rest
        // listed (empty unless more than 63 workers hold the first block).
        let mut alive = 0u64;
        let mut alive_spilled: Vec<usize> = Vec::new();
        let mut depth = 0;
        for (i, &key) in keys.iter().enumerate() {
            let key = split(key);
            let Some(mask) = self.blocks.get(&key).map(|mask| *mask) else {
                break;
            };
            if i == 0 {
                alive = mask & !SPILLED;
                alive_spilled.extend(self.spilled(&key, mask));
            } else {
                out.extend(inline_slots(alive & !mask).map(|slot| (slot, i)));
                alive &= mask;
                if !alive_spilled.is_empty() {
                    let holders: Vec<usize> = self.spilled(&key, mask).collect();
                    alive_spilled.retain(|slot| {
                        let holds = holders.binary_search(slot).is_ok();
                        if !holds {
                            out.push((*slot, i));
                        }
                        holds
                    });
                }
            }
            depth = i + 1;
            if alive == 0 && alive_spilled.is_empty() {
                break;
            }
        }
        out.extend(inline_slots(alive).map(|slot| (slot, depth)));
        out.extend(alive_spilled.into_iter().map(|slot| (slot, depth)));
        let mut overlaps: Vec<(WorkerId, usize)> = out
            .into_iter()
            .filter_map(|(slot, depth)| Some((slots.worker(slot)?, depth)))
            .collect();
        overlaps.sort_unstable();
        overlaps
    }

    fn read_slots(&self) -> RwLockReadGuard<'_, Slots> {
        self.slots.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The numbers lock, read, with `worker`'s number (given one if new).
    fn slot_or_assign(&self, worker: WorkerId) -> (RwLockReadGuard<'_, Slots>, usize) {
        loop {
            let slots = self.read_slots();
            if let Some(slot) = slots.get(worker) {
                return (slots, slot);
            }
            drop(slots);
            // Another thread may free it again before we read: look again.
            (self.slots.write().unwrap_or_else(PoisonError::into_inner)).assign(worker);
        }
    }

    fn insert_slot(&self, key: Key, slot: usize) -> bool {
        let mut mask = self.blocks.entry(key).or_insert(0);
        if slot < INLINE_SLOTS {
            let new = *mask & bit(slot) == 0;
            *mask |= bit(slot);
            return new;
        }
        let mut spilled = self.spill.entry(key).or_default();
        *mask |= SPILLED;
        match spilled.binary_search(&slot) {
            Ok(_) => false,
            Err(at) => {
                spilled.insert(at, slot);
                true
            }
        }
    }

    fn remove_slot(&self, key: Key, slot: usize) -> bool {
        let mut held = false;
        // The entry goes when its last holder does.
        self.blocks.remove_if_mut(&key, |key, mask| {
            if slot < INLINE_SLOTS {
                held = *mask & bit(slot) != 0;
                *mask &= !bit(slot);
            } else if *mask & SPILLED != 0 {
                held = self.remove_spilled(key, slot, mask);
            }
            *mask == 0
        });
        held
    }

    /// Takes `slot` off `key`'s spilled holders, clearing the block's
    /// [`SPILLED`] bit with the last; whether it was there. The caller
    /// holds the block's entry.
    fn remove_spilled(&self, key: &Key, slot: usize, mask: &mut u64) -> bool {
        let mut held = false;
        let emptied = self.spill.remove_if_mut(key, |_, spilled| {
            if let Ok(at) = spilled.binary_search(&slot) {
                spilled.remove(at);
                held = true;
            }
            spilled.is_empty()
        });
        if emptied.is_some() {
            *mask &= !SPILLED;
        }
        held
    }

    /// `key`'s holders numbered past the mask, if its `mask` says it has
    /// any.
    fn spilled(&self, key: &Key, mask: u64) -> impl Iterator<Item = usize> {
        let spilled = if mask & SPILLED == 0 {
            Vec::new()
        } else {
            (self.spill.get(key)).map_or_else(Vec::new, |spilled| spilled.clone())
        };
        spilled.into_iter()
    }
}
