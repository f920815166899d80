//! [`PrefixIndex`]: which workers hold which blocks, on which medium, for
//! many workers at once, safe to update and query from many threads.

use std::collections::HashSet;
use std::sync::PoisonError;

use foldhash::fast::RandomState;

use crate::medium::{self, DEVICE_SLOT, Media, Slot};
use crate::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, lock, write};
use crate::{RouterError, WorkerId};

/// One worker's blocks on one medium.
type Blocks = HashSet<u128, RandomState>;

/// One worker's blocks, by medium slot (a slot past the end holds none).
#[derive(Debug, Default)]
struct Held(Vec<Blocks>);

impl Held {
    /// The blocks on `slot`, made room for.
    fn on_mut(&mut self, slot: Slot) -> &mut Blocks {
        if self.0.len() <= slot {
            self.0.resize_with(slot + 1, Blocks::default);
        }
        &mut self.0[slot]
    }

    fn on(&self, slot: Slot) -> Option<&Blocks> {
        self.0.get(slot)
    }

    /// Blocks on every medium.
    fn len(&self) -> usize {
        self.0.iter().map(HashSet::len).sum()
    }

    /// Forgets every medium's blocks (keeping the room); how many there
    /// were.
    fn clear(&mut self) -> usize {
        let held = self.len();
        self.0.iter_mut().for_each(HashSet::clear);
        held
    }
}

/// Every worker's blocks, sorted by worker id.
type Workers = Vec<(WorkerId, Mutex<Held>)>;

/// Block keys by the workers that hold them, per storage medium. A key is
/// the block's hash as the engines send it ([`block_key`](crate::block_key));
/// it names the block *and its whole prefix*, so a worker holding a
/// request's first `n` keys holds its first `n` blocks.
///
/// The index is partitioned by worker, as Dynamo's sharded indexer is:
/// each worker's blocks are a set of their own behind their own lock. A
/// worker's events (every block every engine stores or evicts: the bulk of
/// a router's work) touch only its set, so workers applied from different
/// threads never contend, and a set stays as small as one engine's cache.
/// A request's overlap walks each worker's set while it matches: one probe
/// per worker plus one per block matched.
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
#[derive(Debug, Default)]
pub struct PrefixIndex {
    /// Every worker that holds (or held) blocks, sorted by id. Read-locked
    /// by every update and query, write-locked only when a worker is first
    /// seen or forgotten.
    workers: RwLock<Workers>,
    /// The media named so far.
    media: Media,
}

/// Where `worker` is in `workers`, or would go.
fn position(workers: &Workers, worker: WorkerId) -> Result<usize, usize> {
    workers.binary_search_by_key(&worker, |(id, _)| *id)
}

/// `worker`'s blocks, locked, if it has a set.
fn held_of(workers: &Workers, worker: WorkerId) -> Option<MutexGuard<'_, Held>> {
    position(workers, worker)
        .ok()
        .map(|at| lock(&workers[at].1))
}

/// Records in `workers` that `worker` holds each of `keys` on `slot`, if
/// it has a set; how many were new.
fn insert(
    workers: &Workers,
    worker: WorkerId,
    slot: Slot,
    keys: impl IntoIterator<Item = u128>,
) -> usize {
    let Some(mut held) = held_of(workers, worker) else {
        return 0;
    };
    let blocks = held.on_mut(slot);
    keys.into_iter().filter(|&key| blocks.insert(key)).count()
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
    /// how many it held.
    pub fn remove_worker(&self, worker: WorkerId) -> usize {
        let mut workers = write(&self.workers);
        match position(&workers, worker) {
            Ok(at) => {
                let (_, held) = workers.remove(at);
                held.into_inner()
                    .unwrap_or_else(PoisonError::into_inner)
                    .len()
            }
            Err(_) => 0,
        }
    }

    /// Forgets every block `worker` holds on every medium, keeping the
    /// worker (and its sets' room: it is about to store again); how many
    /// it held.
    pub fn clear_worker(&self, worker: WorkerId) -> usize {
        held_of(&self.read(), worker).map_or(0, |mut held| held.clear())
    }

    /// The workers holding `key` on the device medium, in order.
    pub fn holders(&self, key: u128) -> Vec<WorkerId> {
        (self.read().iter())
            .filter(|(_, held)| lock(held).on(DEVICE_SLOT).is_some_and(|b| b.contains(&key)))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Blocks `worker` holds, on every medium.
    pub fn held(&self, worker: WorkerId) -> usize {
        held_of(&self.read(), worker).map_or(0, |held| held.len())
    }

    /// Blocks `worker` holds on `medium`.
    pub fn held_on(&self, worker: WorkerId, medium: Option<&str>) -> usize {
        let Some(slot) = self.media.find(medium) else {
            return 0;
        };
        held_of(&self.read(), worker)
            .and_then(|held| held.on(slot).map(HashSet::len))
            .unwrap_or(0)
    }

    /// Distinct keys held by any worker on any medium. Visits every
    /// worker's blocks: for tests and diagnostics, not the routing path.
    pub fn len(&self) -> usize {
        let workers = self.read();
        let mut distinct = Blocks::default();
        for (_, held) in workers.iter() {
            lock(held)
                .0
                .iter()
                .for_each(|blocks| distinct.extend(blocks));
        }
        distinct.len()
    }

    /// Whether no worker holds anything on any medium.
    pub fn is_empty(&self) -> bool {
        self.read().iter().all(|(_, held)| lock(held).len() == 0)
    }

    /// For the chain of block keys of a request (its prefix first), how
    /// many leading blocks each worker holds on the device medium, for
    /// every worker holding at least the first; in worker order. Each
    /// worker's walk stops at its first missing block, so a worker without
    /// the first costs one probe.
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
    /// worker order. Media never stored on are skipped.
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
        (self.read().iter())
            .filter_map(|(id, held)| {
                let held = lock(held);
                let device = held.on(DEVICE_SLOT);
                let depth = match device {
                    Some(blocks) => keys.iter().take_while(|key| blocks.contains(key)).count(),
                    None => 0,
                };
                let mut credit = 0.0;
                for key in &keys[depth..] {
                    let weight = (slots.iter())
                        .find_map(|&(slot, weight)| held.on(slot)?.contains(key).then_some(weight));
                    match weight {
                        Some(weight) => credit += weight,
                        None => break,
                    }
                }
                (depth > 0 || credit > 0.0).then_some((*id, depth, credit))
            })
            .collect()
    }

    fn overlaps_in(&self, slot: Slot, keys: &[u128]) -> Vec<(WorkerId, usize)> {
        (self.read().iter())
            .filter_map(|(id, held)| {
                let held = lock(held);
                let blocks = held.on(slot)?;
                let depth = keys.iter().take_while(|key| blocks.contains(key)).count();
                (depth > 0).then_some((*id, depth))
            })
            .collect()
    }

    /// The media named so far.
    pub(crate) fn media(&self) -> &Media {
        &self.media
    }

    /// Gives `worker` an empty set (emptying one it had).
    pub(crate) fn add_worker(&self, worker: WorkerId) {
        let mut workers = write(&self.workers);
        match position(&workers, worker) {
            Ok(at) => {
                let held = workers[at].1.get_mut();
                held.unwrap_or_else(PoisonError::into_inner).clear();
            }
            Err(at) => workers.insert(at, (worker, Mutex::default())),
        }
    }

    /// Records that `worker` holds each of `keys` on `slot`, if it has a
    /// set (never making one); how many were new.
    pub(crate) fn insert_in(
        &self,
        worker: WorkerId,
        slot: Slot,
        keys: impl IntoIterator<Item = u128>,
    ) -> usize {
        insert(&self.read(), worker, slot, keys)
    }

    /// Records that `worker` no longer holds each of `keys` on `slot`; how
    /// many it did.
    pub(crate) fn remove_in(
        &self,
        worker: WorkerId,
        slot: Slot,
        keys: impl IntoIterator<Item = u128>,
    ) -> usize {
        let workers = self.read();
        let Some(mut held) = held_of(&workers, worker) else {
            return 0;
        };
        let Some(blocks) = held.0.get_mut(slot) else {
            return 0;
        };
        keys.into_iter().filter(|key| blocks.remove(key)).count()
    }

    /// The workers with a set, in order.
    pub(crate) fn worker_ids(&self) -> Vec<WorkerId> {
        self.read().iter().map(|(id, _)| *id).collect()
    }

    fn read(&self) -> RwLockReadGuard<'_, Workers> {
        crate::sync::read(&self.workers)
    }

    /// [`insert_in`](Self::insert_in), making `worker` a set if it has
    /// none (the standalone index's `insert`s).
    fn insert_with(
        &self,
        worker: WorkerId,
        slot: Slot,
        keys: impl IntoIterator<Item = u128>,
    ) -> usize {
        // None if forgotten again meanwhile: as if stored, then cleared.
        insert(&self.workers_with(worker), worker, slot, keys)
    }

    /// The workers, read-locked, with `worker` among them (added if new).
    fn workers_with(&self, worker: WorkerId) -> RwLockReadGuard<'_, Workers> {
        {
            let workers = self.read();
            if position(&workers, worker).is_ok() {
                return workers;
            }
        }
        {
            let mut workers = write(&self.workers);
            if let Err(at) = position(&workers, worker) {
                workers.insert(at, (worker, Mutex::default()));
            }
        }
        self.read()
    }
}
