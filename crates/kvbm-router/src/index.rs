//! [`PrefixIndex`]: which workers hold which blocks, for many workers at
//! once, safe to update and query from many threads.

use dashmap::DashMap;
use foldhash::fast::RandomState;
use smallvec::SmallVec;

use crate::WorkerId;

/// The workers holding one block, sorted. Inline up to two: most blocks are
/// on one or two workers, and an entry then costs no allocation of its own.
type Holders = SmallVec<[WorkerId; 2]>;

/// Block key to the workers that hold the block (sorted, usually one or
/// two). A key is the block's hash as the engines send it
/// ([`block_key`](crate::block_key)); it names the block *and its whole
/// prefix*, so one lookup per block answers "does this worker have the
/// prefix up to here".
#[derive(Debug, Default)]
pub struct PrefixIndex {
    blocks: DashMap<u128, Holders, RandomState>,
}

impl PrefixIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `worker` holds `key`; whether it was new.
    pub fn insert(&self, key: u128, worker: WorkerId) -> bool {
        let mut workers = self.blocks.entry(key).or_default();
        match workers.binary_search(&worker) {
            Ok(_) => false,
            Err(at) => {
                workers.insert(at, worker);
                true
            }
        }
    }

    /// Forgets every block `worker` holds; how many it held. Visits the
    /// whole index, so it costs what the index holds, not what the worker
    /// did: for the rare clear or departure, not for every eviction.
    pub fn remove_worker(&self, worker: WorkerId) -> usize {
        let mut removed = 0;
        self.blocks.retain(|_, workers| {
            if let Ok(at) = workers.binary_search(&worker) {
                workers.remove(at);
                removed += 1;
            }
            !workers.is_empty()
        });
        removed
    }

    /// Records that `worker` no longer holds `key`; whether it did.
    pub fn remove(&self, key: u128, worker: WorkerId) -> bool {
        let mut held = false;
        // The entry goes when its last holder does.
        self.blocks.remove_if_mut(&key, |_, workers| {
            if let Ok(at) = workers.binary_search(&worker) {
                workers.remove(at);
                held = true;
            }
            workers.is_empty()
        });
        held
    }

    /// The workers holding `key`.
    pub fn holders(&self, key: u128) -> Vec<WorkerId> {
        self.blocks
            .get(&key)
            .map(|w| w.to_vec())
            .unwrap_or_default()
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
        let mut out = Vec::new();
        let mut alive: Vec<WorkerId> = Vec::new();
        let mut depth = 0;
        for (i, key) in keys.iter().enumerate() {
            let Some(holders) = self.blocks.get(key) else {
                break;
            };
            if i == 0 {
                alive.extend_from_slice(&holders);
            } else {
                alive.retain(|worker| {
                    let holds = holders.binary_search(worker).is_ok();
                    if !holds {
                        out.push((*worker, i));
                    }
                    holds
                });
            }
            depth = i + 1;
            if alive.is_empty() {
                break;
            }
        }
        out.extend(alive.into_iter().map(|worker| (worker, depth)));
        out.sort_unstable();
        out
    }
}
