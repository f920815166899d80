//! [`Router`]: the prefix index, the workers and their loads, and routing.

use std::sync::{Mutex, PoisonError, RwLock};

use dashmap::DashMap;
use dashmap::mapref::one::Ref;
use foldhash::fast::RandomState;
use kvbm_blocks::{CacheEvent, EventMessage};
use kvbm_events::{KvEvent, KvEventBatch, WireFormat};

use crate::{Candidate, Policy, PrefixIndex, RouteRequest, RouterError, block_key};

/// A worker's identity (an engine, or one data-parallel rank of one).
pub type WorkerId = u64;

/// What a worker reports about its work, for the policies to weigh.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerLoad {
    /// KV blocks held by its running requests.
    pub active_blocks: u64,
    /// Prompt tokens admitted or waiting but not yet prefilled.
    pub queued_prefill_tokens: u64,
    /// Requests it is running.
    pub running_requests: u64,
}

/// What the router has learned from one worker's events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerStats {
    /// Blocks it holds now, as far as its events said.
    pub held_blocks: usize,
    /// Blocks it announced as stored, ever.
    pub stored_blocks: u64,
    /// Blocks it announced as removed, ever.
    pub removed_blocks: u64,
    /// Removals of blocks it had not announced (a sign of lost events).
    pub unknown_removals: u64,
    /// Times its state was cleared (`AllBlocksCleared`, or a resync).
    pub clears: u64,
}

/// Where a request was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The chosen worker.
    pub worker: WorkerId,
    /// Leading blocks of the request it holds.
    pub overlap_blocks: usize,
}

/// What the router keeps per worker besides its blocks (which are in the
/// index).
///
/// Behind the workers map's *read* lock, each under its own lock: one
/// worker's events never wait for another's that happens to share a shard
/// of the map, and a departure (the map's write lock) waits for the events
/// being applied.
#[derive(Debug, Default)]
struct Worker {
    load: Mutex<WorkerLoad>,
    stats: Mutex<WorkerStats>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A KV-aware router: follows many workers' KV events (vLLM's
/// [`KvEvent`]s, from the wire or straight from a block pool through
/// `kvbm_events::WireFormat`) in one [`PrefixIndex`], keeps their loads,
/// and asks a [`Policy`] where each request goes.
///
/// Every method takes `&self` and is safe from many threads: one thread per
/// worker can apply its events while others route.
#[derive(Debug)]
pub struct Router {
    index: PrefixIndex,
    workers: DashMap<WorkerId, Worker, RandomState>,
    /// Live workers, sorted: the order candidates are offered in.
    order: RwLock<Vec<WorkerId>>,
}

impl Default for Router {
    fn default() -> Self {
        Self::new()
    }
}

impl Router {
    /// A router with no workers.
    pub fn new() -> Self {
        Self {
            index: PrefixIndex::new(),
            workers: DashMap::default(),
            order: RwLock::new(Vec::new()),
        }
    }

    /// Starts routing to `worker`, which holds nothing yet.
    ///
    /// # Errors
    ///
    /// [`RouterError::DuplicateWorker`] if it is already routed to.
    pub fn add_worker(&self, worker: WorkerId) -> Result<(), RouterError> {
        let mut order = self.order.write().unwrap_or_else(PoisonError::into_inner);
        let Err(at) = order.binary_search(&worker) else {
            return Err(RouterError::DuplicateWorker(worker));
        };
        self.workers.insert(worker, Worker::default());
        order.insert(at, worker);
        Ok(())
    }

    /// Stops routing to `worker` and forgets its blocks (it left, or
    /// restarted: add it again).
    ///
    /// # Errors
    ///
    /// [`RouterError::UnknownWorker`].
    pub fn remove_worker(&self, worker: WorkerId) -> Result<(), RouterError> {
        {
            let mut order = self.order.write().unwrap_or_else(PoisonError::into_inner);
            let Ok(at) = order.binary_search(&worker) else {
                return Err(RouterError::UnknownWorker(worker));
            };
            order.remove(at);
        }
        if self.workers.remove(&worker).is_some() {
            self.index.remove_worker(worker);
        }
        Ok(())
    }

    /// The live workers, in order.
    pub fn workers(&self) -> Vec<WorkerId> {
        self.order
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Applies one of `worker`'s events.
    ///
    /// # Errors
    ///
    /// [`RouterError::UnknownWorker`] (nothing changes).
    pub fn apply(&self, worker: WorkerId, event: &KvEvent) -> Result<(), RouterError> {
        let state = self.worker(worker)?;
        match event {
            KvEvent::BlockStored(stored) => {
                let hashes = &stored.block_hashes;
                self.store(worker, &state, hashes.iter().map(block_key), hashes.len());
            }
            KvEvent::BlockRemoved(removed) => {
                let hashes = &removed.block_hashes;
                self.forget(worker, &state, hashes.iter().map(block_key), hashes.len());
            }
            KvEvent::AllBlocksCleared => self.clear(worker, &state),
        }
        Ok(())
    }

    /// Applies one message of a block pool's own subscription
    /// (`BlockManager::subscribe_events`) exactly as [`apply`](Self::apply)
    /// applies `format.events(message)`, vLLM's events of it, without
    /// building them (no token copies, no allocation per event): for an
    /// engine and its router in one process. Keys are the hashes in
    /// `format`'s wire form, so the index is the same either way.
    ///
    /// # Errors
    ///
    /// [`RouterError::UnknownWorker`] (nothing changes), even for an
    /// empty batch.
    pub fn apply_message(
        &self,
        worker: WorkerId,
        message: &EventMessage,
        format: &WireFormat,
    ) -> Result<(), RouterError> {
        let state = self.worker(worker)?;
        let key = |&value: &u128| block_key(&format.hash_value(value));
        match message {
            EventMessage::Batch(batch) => {
                for event in batch.events() {
                    match event {
                        CacheEvent::Stored { hashes, .. } => {
                            self.store(worker, &state, hashes.iter().map(key), hashes.len());
                        }
                        CacheEvent::Removed { hashes } => {
                            self.forget(worker, &state, hashes.iter().map(key), hashes.len());
                        }
                        CacheEvent::Cleared => self.clear(worker, &state),
                    }
                }
            }
            // As `WireFormat::events`: a snapshot has no tokens to
            // re-announce, so the wire says to forget everything.
            EventMessage::Resync(_) => self.clear(worker, &state),
        }
        Ok(())
    }

    fn worker(&self, worker: WorkerId) -> Result<Ref<'_, WorkerId, Worker>, RouterError> {
        (self.workers.get(&worker)).ok_or(RouterError::UnknownWorker(worker))
    }

    /// `worker` stored the `count` blocks `keys`.
    fn store(
        &self,
        worker: WorkerId,
        state: &Worker,
        keys: impl Iterator<Item = u128>,
        count: usize,
    ) {
        let new = self.index.insert_many(worker, keys);
        let mut stats = lock(&state.stats);
        stats.held_blocks += new;
        stats.stored_blocks += count as u64;
    }

    /// `worker` evicted the `count` blocks `keys`.
    fn forget(
        &self,
        worker: WorkerId,
        state: &Worker,
        keys: impl Iterator<Item = u128>,
        count: usize,
    ) {
        let held = self.index.remove_many(worker, keys);
        let mut stats = lock(&state.stats);
        stats.held_blocks = stats.held_blocks.saturating_sub(held);
        stats.unknown_removals += (count - held) as u64;
        stats.removed_blocks += count as u64;
    }

    /// `worker` holds nothing any more.
    fn clear(&self, worker: WorkerId, state: &Worker) {
        self.index.remove_worker(worker);
        let mut stats = lock(&state.stats);
        stats.held_blocks = 0;
        stats.clears += 1;
    }

    /// Applies a batch of `worker`'s events, in order.
    ///
    /// # Errors
    ///
    /// [`RouterError::UnknownWorker`] (nothing changes).
    pub fn apply_batch(&self, worker: WorkerId, batch: &KvEventBatch) -> Result<(), RouterError> {
        batch
            .events()
            .iter()
            .try_for_each(|event| self.apply(worker, event))
    }

    /// Forgets what `worker` holds, as after lost events: it will be
    /// relearned from its next stores (until then it gets no cache credit,
    /// never credit for blocks it no longer has).
    ///
    /// # Errors
    ///
    /// [`RouterError::UnknownWorker`].
    pub fn clear_worker(&self, worker: WorkerId) -> Result<(), RouterError> {
        self.apply(worker, &KvEvent::AllBlocksCleared)
    }

    /// Records `worker`'s current load.
    ///
    /// # Errors
    ///
    /// [`RouterError::UnknownWorker`].
    pub fn set_load(&self, worker: WorkerId, load: WorkerLoad) -> Result<(), RouterError> {
        *lock(&self.worker(worker)?.load) = load;
        Ok(())
    }

    /// What the router knows of `worker`.
    pub fn stats(&self, worker: WorkerId) -> Option<WorkerStats> {
        (self.workers.get(&worker)).map(|state| *lock(&state.stats))
    }

    /// The index itself (for queries of its own).
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    /// Every live worker with its overlap with `request` and its load, in
    /// worker order.
    pub fn candidates(&self, request: &RouteRequest<'_>) -> Vec<Candidate> {
        let overlaps = self.index.overlaps(request.keys);
        let order = self.order.read().unwrap_or_else(PoisonError::into_inner);
        order
            .iter()
            .filter_map(|&worker| {
                let load = *lock(&self.workers.get(&worker)?.load);
                let overlap_blocks = (overlaps.binary_search_by_key(&worker, |&(w, _)| w))
                    .map_or(0, |at| overlaps[at].1);
                Some(Candidate {
                    worker,
                    overlap_blocks,
                    load,
                })
            })
            .collect()
    }

    /// Where `policy` sends `request`; `None` with no workers.
    pub fn route(&self, request: &RouteRequest<'_>, policy: &mut dyn Policy) -> Option<Decision> {
        let candidates = self.candidates(request);
        let chosen = candidates.get(policy.choose(request, &candidates)?)?;
        Some(Decision {
            worker: chosen.worker,
            overlap_blocks: chosen.overlap_blocks,
        })
    }
}
