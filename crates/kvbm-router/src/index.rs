//! [`PrefixIndex`]: which workers hold which blocks, for many workers at
//! once, safe to update and query from many threads.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard};

use foldhash::fast::RandomState;

use crate::WorkerId;

/// One worker's blocks.
type Blocks = HashSet<u128, RandomState>;

/// Every worker's blocks, sorted by worker id.
type Workers = Vec<(WorkerId, Mutex<Blocks>)>;

/// Block keys by the workers that hold them. A key is the block's hash as
/// the engines send it ([`block_key`](crate::block_key)); it names the
/// block *and its whole prefix*, so a worker holding a request's first `n`
/// keys holds its first `n` blocks.
///
/// The index is partitioned by worker, as Dynamo's sharded indexer is:
/// each worker's blocks are a set of their own behind their own lock. A
/// worker's events (every block every engine stores or evicts: the bulk of
/// a router's work) touch only its set, so workers applied from different
/// threads never contend, and a set stays as small as one engine's cache.
/// A request's overlap walks each worker's set while it matches: one probe
/// per worker plus one per block matched.
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
    /// Every worker that holds (or held) blocks, sorted by id. Read-locked
    /// by every update and query, write-locked only when a worker is first
    /// seen or forgotten.
    workers: RwLock<Workers>,
}

fn lock(blocks: &Mutex<Blocks>) -> MutexGuard<'_, Blocks> {
    blocks.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where `worker` is in `workers`, or would go.
fn position(workers: &Workers, worker: WorkerId) -> Result<usize, usize> {
    workers.binary_search_by_key(&worker, |(id, _)| *id)
}

/// `worker`'s blocks, locked, if it has a set.
fn blocks_of(workers: &Workers, worker: WorkerId) -> Option<MutexGuard<'_, Blocks>> {
    position(workers, worker)
        .ok()
        .map(|at| lock(&workers[at].1))
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
        let workers = self.workers_with(worker);
        let Some(mut blocks) = blocks_of(&workers, worker) else {
            return 0; // forgotten again meanwhile: as if stored, then cleared
        };
        keys.into_iter().filter(|&key| blocks.insert(key)).count()
    }

    /// Records that `worker` no longer holds `key`; whether it did.
    pub fn remove(&self, key: u128, worker: WorkerId) -> bool {
        self.remove_many(worker, [key]) == 1
    }

    /// Records that `worker` no longer holds each of `keys`; how many it
    /// did.
    pub fn remove_many(&self, worker: WorkerId, keys: impl IntoIterator<Item = u128>) -> usize {
        let workers = self.read();
        let Some(mut blocks) = blocks_of(&workers, worker) else {
            return 0;
        };
        keys.into_iter().filter(|key| blocks.remove(key)).count()
    }

    /// Forgets every block `worker` holds; how many it held.
    pub fn remove_worker(&self, worker: WorkerId) -> usize {
        let mut workers = self.workers.write().unwrap_or_else(PoisonError::into_inner);
        match position(&workers, worker) {
            Ok(at) => {
                let (_, blocks) = workers.remove(at);
                blocks
                    .into_inner()
                    .unwrap_or_else(PoisonError::into_inner)
                    .len()
            }
            Err(_) => 0,
        }
    }

    /// The workers holding `key`, in order.
    pub fn holders(&self, key: u128) -> Vec<WorkerId> {
        (self.read().iter())
            .filter(|(_, blocks)| lock(blocks).contains(&key))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Blocks `worker` holds.
    pub fn held(&self, worker: WorkerId) -> usize {
        blocks_of(&self.read(), worker).map_or(0, |blocks| blocks.len())
    }

    /// Distinct keys held by any worker. Visits every worker's blocks: for
    /// tests and diagnostics, not the routing path.
    pub fn len(&self) -> usize {
        let workers = self.read();
        let mut distinct = Blocks::default();
        for (_, blocks) in workers.iter() {
            distinct.extend(lock(blocks).iter());
        }
        distinct.len()
    }

    /// Whether no worker holds anything.
    pub fn is_empty(&self) -> bool {
        self.read()
            .iter()
            .all(|(_, blocks)| lock(blocks).is_empty())
    }

    /// For the chain of block keys of a request (its prefix first), how
    /// many leading blocks each worker holds, for every worker holding at
    /// least the first; in worker order. Each worker's walk stops at its
    /// first missing block, so a worker without the first costs one probe.
    pub fn overlaps(&self, keys: &[u128]) -> Vec<(WorkerId, usize)> {
        (self.read().iter())
            .filter_map(|(id, blocks)| {
                let blocks = lock(blocks);
                let depth = keys.iter().take_while(|key| blocks.contains(key)).count();
                (depth > 0).then_some((*id, depth))
            })
            .collect()
    }

    fn read(&self) -> RwLockReadGuard<'_, Workers> {
        self.workers.read().unwrap_or_else(PoisonError::into_inner)
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
            let mut workers = self.workers.write().unwrap_or_else(PoisonError::into_inner);
            if let Err(at) = position(&workers, worker) {
                workers.insert(at, (worker, Mutex::default()));
            }
        }
        self.read()
    }
}
