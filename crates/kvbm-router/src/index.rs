//! [`PrefixIndex`]: which workers hold which blocks, on which medium, for
//! many workers at once, safe to update and query from many threads.
//!
//! Code map: `holders.rs` is one key's set of workers (inline, list or
//! bitset over dense worker slots); `shards.rs` maps keys to those sets,
//! sharded by key; `table.rs` numbers the workers with slots and counts
//! their blocks; `walk.rs` intersects a request's keys' sets.
//!
//! Locks, in order, each at most once: the sweep lock (a garbage
//! collection, alone), then the worker table (`table.rs`: read by every
//! event and lookup, written for O(1) work by a worker's addition,
//! removal or clear), then one key shard at a time (`shards.rs`). The
//! media table's append lock is a leaf.

mod holders;
mod shards;
mod table;
#[cfg(test)]
mod tests;
mod walk;

use std::fmt;

use holders::{Holders, WorkerSlot};
use shards::Shards;
use table::Table;
use walk::Survivors;

use crate::medium::{self, DEVICE_SLOT, Media, Slot};
use crate::sync::{
    AtomicBool, Mutex, Ordering, RwLock, RwLockReadGuard, RwLockWriteGuard, lock, write,
};
use crate::{RouterError, WorkerId};

/// Block keys by the workers that hold them, per storage medium. A key is
/// the block's hash as the engines send it ([`block_key`](crate::block_key));
/// it names the block *and its whole prefix*, so a worker holding a
/// request's first `n` keys holds its first `n` blocks.
///
/// The index keeps, for each key on each medium, the set of workers
/// holding it, as a set of dense worker numbers: a few inline, more as a
/// sorted list, many as a bitset (so a key one worker holds costs no
/// fleet-wide bitset). The keys are split over 256 maps under 16 locks
/// (shards): a worker's events (every block every engine stores or
/// evicts: the bulk of a router's work) lock nothing over the whole index,
/// so workers applied from different threads meet only when their blocks
/// fall under the same lock at the same moment. An event's keys are
/// grouped by lock, 64 at a time, so a long event takes each lock it needs
/// once (an uncontended lock is still two atomic operations, which were
/// most of an update's time when every key took its own); an event of
/// fewer than 16 keys takes a lock per key.
///
/// A request's overlap intersects its keys' holder sets one after the
/// other, recording the depth at which each worker drops out, and stops
/// when no one matches: its cost follows the request's length and the
/// workers that match it (a step costs a probe per match, or a word per 64
/// workers while many match), not the size of the fleet.
///
/// What that costs the events: a map update per block and a shard lock
/// per block or per run of blocks under one lock (where sets per worker
/// took one lock per event), and a map entry of 32
/// bytes per key and medium held (a key one worker holds costs twice what
/// a set per worker did; a key many hold, far less). An event's blocks
/// land a shard at a time and a lookup reads each key as it is when it gets
/// there, so a lookup racing a worker's events may see some of their
/// blocks and not others (never a block the worker never stored); a
/// worker's addition, removal and clear are atomic to lookups.
///
/// Forgetting a worker (its removal or clear) is O(1): its number is
/// retired, hidden from every lookup at once, and its bits are dropped
/// from the sets later, all retired numbers' together, by a sweep of the
/// shards once their garbage reaches what the last sweep kept (so a
/// sweep's cost is amortized over the blocks it collects).
///
/// Media: a worker's keys are kept per medium, as vLLM's events name one
/// (`"GPU"`, `"CPU"`, ...). No medium and `"GPU"` are both the *device*
/// medium, the one the methods without `_on` read and write; a removal
/// removes from its own medium only. What credits a request
/// ([`overlaps`](Self::overlaps), [`holders`](Self::holders)) reads the
/// device medium; [`overlaps_on`](Self::overlaps_on) reads another, for a
/// policy that weighs lower tiers. Counts ([`held`](Self::held),
/// [`len`](Self::len), [`is_empty`](Self::is_empty)) cover every medium. At
/// most [`MAX_MEDIA`](Self::MAX_MEDIA) media are kept, so a peer naming
/// new ones cannot make the index allocate without bound.
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
/// // Blocks offloaded to the CPU are no device hit, but can be asked for.
/// index.insert_many_on(9, Some("CPU"), [2])?;
/// assert_eq!(index.overlaps(&[1, 2]), [(7, 2), (9, 1)]);
/// assert_eq!(index.overlaps_on(Some("CPU"), &[2]), [(9, 1)]);
/// # Ok::<(), kvbm_router::RouterError>(())
/// ```
pub struct PrefixIndex {
    /// The workers, their slots and counters.
    table: RwLock<Table>,
    /// Every key's holders.
    shards: Shards,
    /// Held by the one sweep running.
    sweeping: Mutex<()>,
    /// Whether a sweep may be due: set and cleared under the table's write
    /// lock, read without it (a missed set only delays a sweep).
    due: AtomicBool,
    /// The media named so far.
    media: Media,
}

impl Default for PrefixIndex {
    fn default() -> Self {
        Self {
            table: RwLock::new(Table::default()),
            shards: Shards::default(),
            sweeping: Mutex::new(()),
            due: AtomicBool::new(false),
            media: Media::default(),
        }
    }
}

impl fmt::Debug for PrefixIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrefixIndex")
            .field("workers", &self.worker_ids())
            .field("media", &self.media)
            .finish_non_exhaustive()
    }
}

impl PrefixIndex {
    /// Media kept, the device medium included: a store on one more is
    /// refused ([`RouterError::TooManyMedia`]).
    pub const MAX_MEDIA: usize = medium::MAX_MEDIA;

    /// The longest medium name kept, in bytes: a store naming a longer one
    /// is refused ([`RouterError::MediumNameTooLong`]).
    pub const MAX_MEDIUM_NAME: usize = medium::MAX_MEDIUM_NAME;

    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `worker` holds `key` on the device medium; whether it
    /// was new.
    pub fn insert(&self, key: u128, worker: WorkerId) -> bool {
        self.insert_many(worker, [key]) == 1
    }

    /// Records that `worker` holds each of `keys` (one event's blocks) on
    /// the device medium; how many were new.
    pub fn insert_many(&self, worker: WorkerId, keys: impl IntoIterator<Item = u128>) -> usize {
        self.insert_with(worker, DEVICE_SLOT, keys)
    }

    /// Records that `worker` holds each of `keys` on `medium` (`None` and
    /// `"GPU"` are the device medium); how many were new.
    ///
    /// # Errors
    ///
    /// [`RouterError::TooManyMedia`] for a medium beyond the
    /// [`MAX_MEDIA`](Self::MAX_MEDIA) kept,
    /// [`RouterError::MediumNameTooLong`]; nothing changes.
    pub fn insert_many_on(
        &self,
        worker: WorkerId,
        medium: Option<&str>,
        keys: impl IntoIterator<Item = u128>,
    ) -> Result<usize, RouterError> {
        let slot = self.media.admit(medium)?;
        Ok(self.insert_with(worker, slot, keys))
    }

    /// Records that `worker` no longer holds `key` on the device medium;
    /// whether it did.
    pub fn remove(&self, key: u128, worker: WorkerId) -> bool {
        self.remove_many(worker, [key]) == 1
    }

    /// Records that `worker` no longer holds each of `keys` on the device
    /// medium; how many it did.
    pub fn remove_many(&self, worker: WorkerId, keys: impl IntoIterator<Item = u128>) -> usize {
        self.remove_in(worker, DEVICE_SLOT, keys)
    }

    /// Records that `worker` no longer holds each of `keys` on `medium`;
    /// how many it did (none on a medium never stored on).
    pub fn remove_many_on(
        &self,
        worker: WorkerId,
        medium: Option<&str>,
        keys: impl IntoIterator<Item = u128>,
    ) -> usize {
        (self.media.find(medium)).map_or(0, |slot| self.remove_in(worker, slot, keys))
    }

    /// Forgets every block `worker` holds on every medium, and the worker;
    /// how many it held. O(1), save for the sweep it may run (see the
    /// type's docs).
    pub fn remove_worker(&self, worker: WorkerId) -> usize {
        let held = self.forget_worker(worker);
        self.collect();
        held
    }

    /// Forgets every block `worker` holds on every medium, keeping the
    /// worker; how many it held. O(1), save for the sweep it may run.
    pub fn clear_worker(&self, worker: WorkerId) -> usize {
        let held = self.clear_in(worker);
        self.collect();
        held
    }

    /// The workers holding `key` on the device medium, in order.
    pub fn holders(&self, key: u128) -> Vec<WorkerId> {
        let table = self.read();
        let found: Vec<(WorkerSlot, ())> = {
            let maps = self.shards.read(key);
            let Some(holders) = maps.holders(DEVICE_SLOT, key) else {
                return Vec::new();
            };
            (holders.iter())
                .filter(|&slot| table.live().contains(slot))
                .map(|slot| (slot, ()))
                .collect()
        };
        table
            .ordered(found, None)
            .into_iter()
            .map(|(id, ())| id)
            .collect()
    }

    /// Blocks `worker` holds, on every medium.
    pub fn held(&self, worker: WorkerId) -> usize {
        let table = self.read();
        table.find(worker).map_or(0, |at| table.counts(at).total())
    }

    /// Blocks `worker` holds on `medium`.
    pub fn held_on(&self, worker: WorkerId, medium: Option<&str>) -> usize {
        let Some(slot) = self.media.find(medium) else {
            return 0;
        };
        let table = self.read();
        table.find(worker).map_or(0, |at| table.counts(at).on(slot))
    }

    /// Distinct keys held by any worker on any medium. Visits every key:
    /// for tests and diagnostics, not the routing path.
    pub fn len(&self) -> usize {
        let table = self.read();
        self.shards.distinct(table.live())
    }

    /// Whether no worker holds anything on any medium.
    pub fn is_empty(&self) -> bool {
        let table = self.read();
        table.all_counts().iter().all(|counts| counts.total() == 0)
    }

    /// For the chain of block keys of a request (its prefix first), how
    /// many leading blocks each worker holds on the device medium, for
    /// every worker holding at least the first; in worker order. The walk
    /// intersects each key's holders with the workers still matching and
    /// stops when none is, so it costs a probe per block while anyone
    /// matches, plus a probe per match (or a word per 64 workers while
    /// many match), whatever the number of workers.
    pub fn overlaps(&self, keys: &[u128]) -> Vec<(WorkerId, usize)> {
        self.overlaps_in(DEVICE_SLOT, keys)
    }

    /// As [`overlaps`](Self::overlaps), on `medium` alone (none on a medium
    /// never stored on): what a policy crediting lower-tier hits (blocks a
    /// worker offloaded to its CPU, say) below device hits would weigh.
    pub fn overlaps_on(&self, medium: Option<&str>, keys: &[u128]) -> Vec<(WorkerId, usize)> {
        (self.media.find(medium)).map_or_else(Vec::new, |slot| self.overlaps_in(slot, keys))
    }

    /// For each worker holding at least the first block on some medium:
    /// its device overlap and, past it, the weighted credit of the blocks
    /// that continue the prefix on the lower media `weights` names (each
    /// block counted once, at the weight of the first medium in `weights`
    /// holding it; the walk ends at the first block no medium holds), in
    /// worker order. Media never stored on are skipped. Walks as
    /// [`overlaps`](Self::overlaps) does, each worker past its device
    /// prefix probed on each weighted medium: its cost follows the keys and
    /// the workers that match, not the fleet.
    pub fn tiered_overlaps(
        &self,
        weights: &[(&str, f64)],
        keys: &[u128],
    ) -> Vec<(WorkerId, usize, f64)> {
        let slots: Vec<(Slot, f64)> = (weights.iter())
            .filter_map(|&(name, weight)| {
                let slot = self.media.find(Some(name))?;
                (slot != DEVICE_SLOT).then_some((slot, weight))
            })
            .collect();
        let table = self.read();
        let live = table.live();
        // Workers still matching on the device; workers past their device
        // prefix, still walking the lower media (slot, depth, credit); and
        // those whose walk ended.
        let mut device = Survivors::none();
        let mut walkers: Vec<(WorkerSlot, usize, f64)> = Vec::new();
        let mut dropped = Vec::new();
        let mut ended: Vec<(WorkerSlot, (usize, f64))> = Vec::new();
        for (depth, &key) in keys.iter().enumerate() {
            let maps = self.shards.read(key);
            let on_device = maps.holders(DEVICE_SLOT, key).map(Holders::view);
            if depth == 0 {
                if let Some(first) = on_device {
                    device = Survivors::start(first, live);
                }
                // Lower-tier holders of the first block not on the device:
                // walking from the start.
                let mut first: Vec<WorkerSlot> = (slots.iter())
                    .filter_map(|&(slot, _)| maps.holders(slot, key))
                    .flat_map(Holders::iter)
                    .filter(|&s| live.contains(s) && !on_device.is_some_and(|d| d.contains(s)))
                    .collect();
                first.sort_unstable();
                first.dedup();
                walkers.extend(first.into_iter().map(|slot| (slot, 0, 0.0)));
            } else {
                device.step(on_device, depth, &mut dropped);
                walkers.extend(dropped.drain(..).map(|(slot, depth)| (slot, depth, 0.0)));
            }
            walkers.retain_mut(|(slot, depth, credit)| {
                let weight = (slots.iter()).find_map(|&(medium, weight)| {
                    maps.holders(medium, key)?.contains(*slot).then_some(weight)
                });
                match weight {
                    Some(weight) => *credit += weight,
                    None => ended.push((*slot, (*depth, *credit))),
                }
                weight.is_some()
            });
            if device.is_empty() && walkers.is_empty() {
                break;
            }
        }
        device.finish(keys.len(), &mut dropped);
        ended.extend(
            dropped
                .into_iter()
                .map(|(slot, depth)| (slot, (depth, 0.0))),
        );
        ended.extend((walkers.into_iter()).map(|(slot, depth, credit)| (slot, (depth, credit))));
        ended.retain(|&(_, (depth, credit))| depth > 0 || credit > 0.0);
        (table.ordered(ended, None).into_iter())
            .map(|(id, (depth, credit))| (id, depth, credit))
            .collect()
    }

    fn overlaps_in(&self, medium: Slot, keys: &[u128]) -> Vec<(WorkerId, usize)> {
        let Some((&first, rest)) = keys.split_first() else {
            return Vec::new();
        };
        let table = self.read();
        let mut survivors = match self.shards.read(first).holders(medium, first) {
            Some(holders) => Survivors::start(holders.view(), table.live()),
            None => return Vec::new(),
        };
        let mut ended = Vec::new();
        for (at, &key) in rest.iter().enumerate() {
            if survivors.is_empty() {
                break;
            }
            let maps = self.shards.read(key);
            // `at + 1` keys matched before this one.
            survivors.step(
                maps.holders(medium, key).map(Holders::view),
                at + 1,
                &mut ended,
            );
        }
        table.ordered(ended, Some((&survivors, keys.len())))
    }

    /// The media named so far.
    pub(crate) fn media(&self) -> &Media {
        &self.media
    }

    /// Gives `worker` an empty set (emptying one it had; the sweep that
    /// may make due waits for the next removal or clear).
    pub(crate) fn add_worker(&self, worker: WorkerId) {
        let mut table = write(&self.table);
        match table.position(worker) {
            Ok(at) => {
                table.clear(at);
                self.note_due(&table);
            }
            Err(at) => table.add(at, worker),
        }
    }

    /// [`remove_worker`](Self::remove_worker) without the sweep (for a
    /// caller holding locks of its own: it calls
    /// [`collect`](Self::collect) once it released them).
    pub(crate) fn forget_worker(&self, worker: WorkerId) -> usize {
        let mut table = write(&self.table);
        let held = table.find(worker).map_or(0, |at| table.remove(at));
        self.note_due(&table);
        held
    }

    /// [`clear_worker`](Self::clear_worker) without the sweep, as
    /// [`forget_worker`](Self::forget_worker).
    pub(crate) fn clear_in(&self, worker: WorkerId) -> usize {
        let mut table = write(&self.table);
        let held = table.find(worker).map_or(0, |at| table.clear(at));
        self.note_due(&table);
        held
    }

    /// Raises the sweep flag if `table` (write-locked) calls for a sweep.
    fn note_due(&self, table: &RwLockWriteGuard<'_, Table>) {
        if table.sweep_due() {
            self.due.store(true, Ordering::Relaxed);
        }
    }

    /// Sweeps the retired workers' bits out of every shard, if a sweep is
    /// due (see the type's docs); one sweep at a time, each shard locked
    /// in turn. Called with no lock held.
    pub(crate) fn collect(&self) {
        if !self.due.load(Ordering::Relaxed) {
            return;
        }
        let _sweeping = lock(&self.sweeping);
        let sweep = {
            let mut table = write(&self.table);
            // Retirements from here on raise the flag again.
            self.due.store(false, Ordering::Relaxed);
            if !table.sweep_due() {
                return;
            }
            table.begin_sweep()
        };
        let kept = self.shards.sweep(sweep.dead());
        let mut table = write(&self.table);
        table.end_sweep(sweep, kept);
        self.note_due(&table);
    }

    /// Records that `worker` holds each of `keys` on `slot`, if it is in
    /// the index (never adding it); how many were new.
    pub(crate) fn insert_in(
        &self,
        worker: WorkerId,
        slot: Slot,
        keys: impl IntoIterator<Item = u128>,
    ) -> usize {
        self.insert_into(&self.read(), worker, slot, keys)
    }

    /// Records that `worker` no longer holds each of `keys` on `medium`;
    /// how many it did.
    pub(crate) fn remove_in(
        &self,
        worker: WorkerId,
        medium: Slot,
        keys: impl IntoIterator<Item = u128>,
    ) -> usize {
        let table = self.read();
        let Some(at) = table.find(worker) else {
            return 0;
        };
        let slot = table.slot(at);
        let gone = self.shards.remove(medium, keys, slot);
        table.counts(at).sub(medium, gone);
        gone
    }

    /// The workers in the index, in order.
    pub(crate) fn worker_ids(&self) -> Vec<WorkerId> {
        self.read().ids().to_vec()
    }

    fn read(&self) -> RwLockReadGuard<'_, Table> {
        crate::sync::read(&self.table)
    }

    /// Records in `table` that `worker` holds each of `keys` on `medium`,
    /// if it is there; how many were new. Its counter moves once, after
    /// the blocks (exact whenever none of its events is in flight).
    fn insert_into(
        &self,
        table: &Table,
        worker: WorkerId,
        medium: Slot,
        keys: impl IntoIterator<Item = u128>,
    ) -> usize {
        let Some(at) = table.find(worker) else {
            return 0;
        };
        let (slot, live) = (table.slot(at), table.live());
        let new = self.shards.insert(medium, keys, slot, live);
        table.counts(at).add(medium, new);
        new
    }

    /// [`insert_in`](Self::insert_in), adding `worker` if it is not in the
    /// index (the standalone index's `insert`s).
    fn insert_with(
        &self,
        worker: WorkerId,
        medium: Slot,
        keys: impl IntoIterator<Item = u128>,
    ) -> usize {
        // Not there if forgotten again meanwhile: as if stored, then
        // cleared.
        self.insert_into(&self.table_with(worker), worker, medium, keys)
    }

    /// The table, read-locked, with `worker` in it (added if new).
    fn table_with(&self, worker: WorkerId) -> RwLockReadGuard<'_, Table> {
        {
            let table = self.read();
            if table.find(worker).is_some() {
                return table;
            }
        }
        {
            let mut table = write(&self.table);
            if let Err(at) = table.position(worker) {
                table.add(at, worker);
            }
        }
        self.read()
    }
}
