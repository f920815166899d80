//! [`Router`]: the prefix index, the workers and their loads, and routing.
//!
//! # Lock order
//!
//! Every path takes the router's locks in this order, each at most once
//! (a nested read of the same `RwLock` could deadlock behind a waiting
//! writer), and releases them before calling out (a [`Policy`] runs with
//! none held):
//!
//! 1. `order`, the live workers and their loads (a [`Roster`]): written
//!    for a worker's whole addition or removal (list, map entry and index
//!    set together), read by [`Router::candidates`], [`Router::set_load`],
//!    [`Router::workers`] and [`Router::audit`]; a worker's load cell in it
//!    is a leaf, written under the read lock only (its writer lock taken
//!    by a report, and by a route's read only when it meets a report
//!    under way);
//! 2. a shard of the `workers` map: read (a `Ref`) for the whole of one
//!    event or message, so a removal, which write-locks it, waits for the
//!    events being applied and no later one finds the worker;
//! 3. the worker's `tally` (its counters), held across the index update
//!    it counts, so counters and index agree whenever a reader can look;
//! 4. the index's worker table (read by events and lookups, written for
//!    O(1) work by a worker's addition, removal or clear), then one of its
//!    key shards at a time (in [`PrefixIndex`]); the media table's append
//!    lock is a leaf.
//!
//! The event path takes the map's read lock, the tally, the index's table
//! read lock and one key shard's lock per block, or per run of an event's
//! blocks under that shard's lock: nothing over the whole
//! index is written, and nothing is allocated per block. The index's
//! garbage sweep (after a removal or clear, when due) takes its own sweep
//! lock, the table and the shards one at a time, and runs with none of the
//! router's locks held: [`Router::remove_worker`] releases `order`, and
//! [`Router::apply`] and [`Router::apply_message`] the map's `Ref` and the
//! tally, first.
//!
//! Every lock and atomic here comes from `crate::sync`, so
//! `tests/loom_router.rs` model-checks this protocol (additions, removals
//! and events racing) on this code.

mod audit;
mod groups;
mod load_cell;
mod roster;
mod shortlist;

use kvbm_blocks::{CacheEvent, EventMessage};
use kvbm_events::{KvEvent, KvEventBatch, WireFormat};

use crate::medium::Slot;
use crate::sync::{
    AtomicU64, Mutex, Ordering, RwLock, RwLockReadGuard, RwLockWriteGuard, WorkerMap, WorkerRef,
    lock, read, write,
};
use crate::{Candidate, Offer, Policy, PrefixIndex, RouteRequest, RouterError, block_key};

pub use audit::RouterAudit;
use roster::Roster;
use shortlist::shortlist;

/// A worker's identity (an engine, or one data-parallel rank of one).
pub type WorkerId = u64;

/// What a worker reports about its work, for the policies to weigh.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerLoad {
    /// KV blocks held by its running requests.
    pub active_blocks: u64,
    /// Prompt tokens admitted or waiting but not yet prefilled.
    pub queued_prefill_tokens: u64,
    /// Requests it is running.
    pub running_requests: u64,
}

impl WorkerLoad {
    /// A load of `active_blocks` held by `running_requests` requests, with
    /// `queued_prefill_tokens` still to prefill.
    pub const fn new(
        active_blocks: u64,
        queued_prefill_tokens: u64,
        running_requests: u64,
    ) -> Self {
        Self {
            active_blocks,
            queued_prefill_tokens,
            running_requests,
        }
    }
}

/// What the router has learned from one worker's events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerStats {
    /// Blocks it holds now, on every medium, as far as its events said
    /// (always [`PrefixIndex::held`] of it).
    pub held_blocks: usize,
    /// Blocks it announced as stored, ever (refused events not counted).
    pub stored_blocks: u64,
    /// Blocks it announced as removed, ever.
    pub removed_blocks: u64,
    /// Removals of blocks it had not announced on that medium (a sign of
    /// lost events).
    pub unknown_removals: u64,
    /// Times its state was cleared (`AllBlocksCleared`, or a resync).
    pub clears: u64,
    /// `BlockStored` events refused for another block size than the
    /// router's ([`RouterError::BlockSizeMismatch`]): a misconfigured
    /// engine.
    pub block_size_refusals: u64,
    /// `BlockStored` events refused for their medium
    /// ([`RouterError::TooManyMedia`], [`RouterError::MediumNameTooLong`]).
    pub medium_refusals: u64,
}

/// Where a request was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// The chosen worker.
    pub worker: WorkerId,
    /// Leading blocks of the request it holds.
    pub overlap_blocks: usize,
}

/// What the router keeps per worker besides its blocks (which are in the
/// index) and its load (in the [`Roster`]).
///
/// Behind the workers map's *read* lock, under its own lock: one worker's
/// events never wait for another's that happens to share a shard of the
/// map, and a departure (the map's write lock) waits for the events being
/// applied.
#[derive(Debug, Default)]
struct Worker {
    tally: Mutex<Tally>,
}

/// A worker's counters, and what its pool's messages are in.
#[derive(Debug, Default)]
struct Tally {
    stats: WorkerStats,
    /// The format of the last message [`Router::apply_message`] stored
    /// from, with its medium's slot: every later message in it is admitted
    /// without a look at its settings (the block size and media never
    /// change once admitted).
    wire: Option<(WireFormat, Slot)>,
    /// The KV cache group its events are scored on, once learned
    /// ([`groups::verdict`]).
    scored_group: Option<i64>,
}

/// Every worker in `order` with its load and what `overlap_of` credits it
/// (device blocks, lower-tier credit), in worker order.
fn everyone(
    order: &Roster,
    mut overlap_of: impl FnMut(WorkerId) -> (usize, f64),
) -> Vec<Candidate> {
    (order.loads())
        .map(|(worker, load)| {
            let (overlap_blocks, tier_credit) = overlap_of(worker);
            Candidate {
                worker,
                overlap_blocks,
                tier_credit,
                load,
            }
        })
        .collect()
}

/// The candidates `offer` names among `order`, `overlaps` (ascending by
/// `worker_of`) crediting each by `credit_of`; `grouped` unless some
/// credit is a lower tier's (see [`shortlist`](mod@shortlist)).
fn offered<T>(
    order: &Roster,
    overlaps: &[T],
    worker_of: impl Fn(&T) -> WorkerId + Copy,
    credit_of: impl Fn(&T) -> (usize, f64) + Copy,
    grouped: bool,
    offer: Offer,
    request: &RouteRequest<'_>,
) -> Vec<Candidate> {
    if offer == Offer::LeastWorkAtEachDepth
        && let Some(list) = shortlist(order, overlaps, worker_of, credit_of, grouped, request)
    {
        return list;
    }
    let mut overlap_of = by_worker(overlaps, worker_of);
    everyone(order, |worker| {
        overlap_of(worker).map_or((0, 0.0), credit_of)
    })
}

/// A lookup of `sorted`'s entry for a worker (ascending by `worker_of`),
/// for workers asked in ascending order: a merge of the two lists, not a
/// search for each.
fn by_worker<'a, T>(
    sorted: &'a [T],
    worker_of: impl Fn(&T) -> WorkerId,
) -> impl FnMut(WorkerId) -> Option<&'a T> {
    let mut rest = sorted.iter().peekable();
    move |worker| {
        while rest.next_if(|entry| worker_of(entry) < worker).is_some() {}
        rest.next_if(|entry| worker_of(entry) == worker)
    }
}

/// The block size and medium `format` writes into its events.
fn wire_settings(format: &WireFormat) -> (u32, Option<String>) {
    (format.block_size(), format.medium().map(str::to_owned))
}

/// A KV-aware router: follows many workers' KV events (vLLM's
/// [`KvEvent`]s, from the wire or straight from a block pool through
/// `kvbm_events::WireFormat`) in one [`PrefixIndex`], keeps their loads,
/// and asks a [`Policy`] where each request goes.
///
/// Every method takes `&self` and is safe from many threads: one thread per
/// worker can apply its events while others route, and workers come and
/// go meanwhile. A worker's addition and removal are atomic: no event,
/// route or [`audit`](Self::audit) sees it half added or half removed, and
/// a worker removed and added again starts empty, whatever raced.
///
/// What it does with an event's fields:
///
/// - `medium`: blocks are kept per medium ([`PrefixIndex`]); no medium and
///   `"GPU"` are the device medium, the only one routing credits. A
///   removal removes from its own medium; `AllBlocksCleared` clears them
///   all. A store on a medium past [`PrefixIndex::MAX_MEDIA`] is refused.
/// - `block_size`: the router has one ([`with_block_size`](Self::with_block_size),
///   or the first `BlockStored` it accepts fixes it); a `BlockStored` of
///   another size is refused, since its keys would never match a request
///   keyed at the router's size, and counted in
///   [`WorkerStats::block_size_refusals`].
/// - `lora_name` (and the deprecated `lora_id`): ignored. vLLM folds the
///   adapter into its block hashes, so one adapter's blocks already have
///   keys of their own, and a request keyed the engines' way matches only
///   its own adapter's.
/// - `parent_block_hash`, `token_ids`: not read; keys are the hashes.
#[derive(Debug)]
pub struct Router {
    index: PrefixIndex,
    workers: WorkerMap<Worker>,
    /// Live workers, sorted (the order candidates are offered in), with
    /// their loads.
    order: RwLock<Roster>,
    /// Tokens per block, plus one; 0 until set or fixed by the first
    /// accepted `BlockStored`, then never changed.
    block_size: AtomicU64,
    /// What a block held on a lower medium is worth against one on the
    /// device, by medium (none: lower tiers earn nothing).
    medium_weights: Vec<(String, f64)>,
}

impl Default for Router {
    fn default() -> Self {
        Self::new()
    }
}

impl Router {
    /// A router with no workers, whose block size the first `BlockStored`
    /// it accepts fixes.
    pub fn new() -> Self {
        Self {
            index: PrefixIndex::new(),
            workers: WorkerMap::new(),
            order: RwLock::new(Roster::default()),
            block_size: AtomicU64::new(0),
            medium_weights: Vec::new(),
        }
    }

    /// A router with no workers for blocks of `block_size` tokens: a
    /// `BlockStored` of another size is refused.
    pub fn with_block_size(block_size: u32) -> Self {
        let router = Self::new();
        router
            .block_size
            .store(u64::from(block_size) + 1, Ordering::Relaxed);
        router
    }

    /// Credits blocks a worker holds on `medium` (a lower tier: `"CPU"`,
    /// `"DISK"`, ...) right after its device prefix at `weight` of a device
    /// block (clamped to `0..=1`; non-finite means 0), so KV-aware routing
    /// prefers a worker that can load a prefix over one that must compute
    /// it, and one that holds it on its device over both. Set before use;
    /// a medium named twice keeps the last weight; the device medium
    /// (`"GPU"`) always counts 1.
    ///
    /// A reasonable weight is what loading saves of computing: `1 -
    /// load_time / compute_time` per block (a host tier over PCIe saves
    /// most of it, a disk less).
    pub fn with_medium_weight(mut self, medium: &str, weight: f64) -> Self {
        let weight = if weight.is_finite() {
            weight.clamp(0.0, 1.0)
        } else {
            0.0
        };
        if medium == "GPU" {
            return self;
        }
        self.medium_weights.retain(|(name, _)| name != medium);
        self.medium_weights.push((medium.to_owned(), weight));
        self.medium_weights
            .sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal));
        self
    }

    /// Tokens per block of the blocks it indexes: as set, or as the first
    /// accepted `BlockStored` said; `None` before.
    pub fn block_size(&self) -> Option<u32> {
        let stored = self.block_size.load(Ordering::Acquire);
        stored
            .checked_sub(1)
            .and_then(|size| u32::try_from(size).ok())
    }

    fn order_read(&self) -> RwLockReadGuard<'_, Roster> {
        read(&self.order)
    }

    fn order_write(&self) -> RwLockWriteGuard<'_, Roster> {
        write(&self.order)
    }

    /// Starts routing to `worker`, which holds nothing yet.
    ///
    /// # Errors
    ///
    /// [`RouterError::DuplicateWorker`] if it is already routed to.
    pub fn add_worker(&self, worker: WorkerId) -> Result<(), RouterError> {
        let mut order = self.order_write();
        let Err(at) = order.find(worker) else {
            return Err(RouterError::DuplicateWorker(worker));
        };
        // Its set before its map entry: events find the entry, then the set.
        self.index.add_worker(worker);
        self.workers.insert(worker, Worker::default());
        order.insert(at, worker);
        Ok(())
    }

    /// Stops routing to `worker` and forgets its blocks (it left, or
    /// restarted: add it again). The whole removal holds the live-worker
    /// list's write lock, so an addition of the same worker racing it
    /// waits for it and starts empty.
    ///
    /// # Errors
    ///
    /// [`RouterError::UnknownWorker`].
    pub fn remove_worker(&self, worker: WorkerId) -> Result<(), RouterError> {
        let mut order = self.order_write();
        let Ok(at) = order.find(worker) else {
            return Err(RouterError::UnknownWorker(worker));
        };
        // The map entry first: its shard's write lock waits for the events
        // being applied, and no later event finds the worker, so none can
        // touch its set after this.
        self.workers.remove(worker);
        self.index.forget_worker(worker);
        order.remove(at);
        // The sweep the removal may have made due, with no lock held.
        drop(order);
        self.index.collect();
        Ok(())
    }

    /// The live workers, in order.
    pub fn workers(&self) -> Vec<WorkerId> {
        self.order_read().ids().to_vec()
    }

    /// Applies one of `worker`'s events.
    ///
    /// For a model whose layers form KV cache groups, prefixes are scored
    /// on one full-attention group, learned from the first store naming a
    /// full-attention `kv_cache_spec_kind` (or group 0 if stores name no
    /// kind): the other groups' events are left out, since their blocks
    /// hash as its blocks do and would stand for, or erase, them.
    ///
    /// # Errors
    ///
    /// [`RouterError::UnknownWorker`]; for a `BlockStored`,
    /// [`RouterError::BlockSizeMismatch`], [`RouterError::TooManyMedia`]
    /// and [`RouterError::MediumNameTooLong`] (nothing changes but the
    /// worker's refusal counters).
    pub fn apply(&self, worker: WorkerId, event: &KvEvent) -> Result<(), RouterError> {
        let state = self.worker(worker)?;
        let mut tally = lock(&state.tally);
        let verdict = groups::verdict(event, tally.scored_group);
        if verdict == groups::Verdict::Skip {
            return Ok(());
        }
        let Tally {
            stats,
            scored_group,
            ..
        } = &mut *tally;
        match event {
            KvEvent::BlockStored(stored) => {
                let medium = stored.medium.as_deref();
                let slot = self.admit(worker, stored.block_size, medium, stats)?;
                if let groups::Verdict::Learn(group) = verdict {
                    *scored_group = Some(group);
                }
                let hashes = &stored.block_hashes;
                self.store(
                    worker,
                    slot,
                    stats,
                    hashes.iter().map(block_key),
                    hashes.len(),
                );
            }
            KvEvent::BlockRemoved(removed) => {
                let slot = self.index.media().find(removed.medium.as_deref());
                let hashes = &removed.block_hashes;
                self.forget(
                    worker,
                    slot,
                    stats,
                    hashes.iter().map(block_key),
                    hashes.len(),
                );
            }
            KvEvent::AllBlocksCleared => {
                self.clear(worker, stats);
                // The sweep the clear may have made due, with no lock held.
                drop(tally);
                drop(state);
                self.index.collect();
            }
        }
        Ok(())
    }

    /// Applies one message of a block pool's own subscription
    /// (`BlockManager::subscribe_events`) exactly as
    /// [`apply_batch`](Self::apply_batch) applies `format.events(message)`,
    /// vLLM's events of it, without building them (no token copies, no
    /// allocation per event): for an engine and its router in one
    /// process. Keys are the hashes in `format`'s wire form, blocks are on
    /// its medium and of its block size, so the index is the same either
    /// way.
    ///
    /// # Errors
    ///
    /// [`RouterError::UnknownWorker`] (nothing changes), even for an
    /// empty batch; at its first `Stored` event, the refusals of
    /// [`apply`](Self::apply) for `format`'s block size or medium (the
    /// events before it stay applied, as `apply_batch`'s do).
    pub fn apply_message(
        &self,
        worker: WorkerId,
        message: &EventMessage,
        format: &WireFormat,
    ) -> Result<(), RouterError> {
        let state = self.worker(worker)?;
        let mut guard = lock(&state.tally);
        let tally = &mut *guard;
        let key = |&value: &u128| block_key(&format.hash_value(value));
        // With KV cache groups, one full-attention group's blocks only.
        let scored = groups::scored_in(format);
        let counts = |value: &&u128| groups::value_counts(**value, scored);
        match message {
            EventMessage::Batch(batch) => {
                // `format`'s medium, once a `Stored` event admitted it, or
                // once a removal looked for it: resolved once a message.
                let mut admitted = None;
                let mut found = None;
                for event in batch.events() {
                    match event {
                        CacheEvent::Stored { hashes, .. } => {
                            if hashes.first().is_some_and(|h| !counts(&h)) {
                                continue;
                            }
                            let slot = match admitted {
                                Some(slot) => slot,
                                None => *admitted.insert(self.admit_wire(worker, format, tally)?),
                            };
                            let (keys, count) = (hashes.iter().map(key), hashes.len());
                            self.store(worker, slot, &mut tally.stats, keys, count);
                        }
                        CacheEvent::Removed { hashes } => {
                            let slot = match (admitted, found) {
                                (Some(slot), _) => Some(slot),
                                (None, Some(slot)) => slot,
                                (None, None) => *found.insert(self.find_wire(format, tally)),
                            };
                            let count = hashes.iter().filter(counts).count();
                            let keys = hashes.iter().filter(counts).map(key);
                            self.forget(worker, slot, &mut tally.stats, keys, count);
                        }
                        CacheEvent::Cleared => self.clear(worker, &mut tally.stats),
                    }
                }
            }
            // As `WireFormat::events`: a snapshot has no tokens to
            // re-announce, so the wire says to forget everything.
            EventMessage::Resync(_) => self.clear(worker, &mut tally.stats),
        }
        // The sweep a clear may have made due, with no lock held (one
        // relaxed load when none is).
        drop(guard);
        drop(state);
        self.index.collect();
        Ok(())
    }

    fn worker(&self, worker: WorkerId) -> Result<WorkerRef<'_, Worker>, RouterError> {
        // Built only when returned: the error has heap fields in some
        // variants, so a dropped one costs a call on every event.
        match self.workers.get(worker) {
            Some(state) => Ok(state),
            None => Err(RouterError::UnknownWorker(worker)),
        }
    }

    /// Admits a `BlockStored` of `block_size` tokens on `medium` from
    /// `worker`: the medium's slot, or the refusal, counted in `stats`.
    /// The router's block size is fixed only once the medium is admitted,
    /// so a refused event changes neither (save when two first stores of
    /// different sizes race: the loser's new medium keeps its slot).
    fn admit(
        &self,
        worker: WorkerId,
        block_size: u32,
        medium: Option<&str>,
        stats: &mut WorkerStats,
    ) -> Result<Slot, RouterError> {
        let wanted = u64::from(block_size) + 1;
        let mismatch = |stats: &mut WorkerStats, fixed: u64| {
            stats.block_size_refusals += 1;
            Err(RouterError::BlockSizeMismatch {
                worker,
                router: u32::try_from(fixed - 1).unwrap_or(u32::MAX),
                event: block_size,
            })
        };
        // A load, not a read-modify-write: every engine's thread reads
        // this line on every store.
        let fixed = self.block_size.load(Ordering::Acquire);
        if fixed != 0 && fixed != wanted {
            return mismatch(stats, fixed);
        }
        let slot =
            (self.index.media().admit(medium)).inspect_err(|_| stats.medium_refusals += 1)?;
        if fixed == 0
            && let Err(fixed) =
                (self.block_size).compare_exchange(0, wanted, Ordering::AcqRel, Ordering::Acquire)
            && fixed != wanted
        {
            // Another worker's store fixed another size first.
            return mismatch(stats, fixed);
        }
        Ok(slot)
    }

    /// [`admit`](Self::admit) for a store in `format`, from the worker's
    /// cache when it was admitted before.
    fn admit_wire(
        &self,
        worker: WorkerId,
        format: &WireFormat,
        tally: &mut Tally,
    ) -> Result<Slot, RouterError> {
        if let Some((cached, slot)) = &tally.wire
            && cached == format
        {
            return Ok(*slot);
        }
        let (block_size, medium) = wire_settings(format);
        let slot = self.admit(worker, block_size, medium.as_deref(), &mut tally.stats)?;
        tally.wire = Some((format.clone(), slot));
        Ok(slot)
    }

    /// The slot of `format`'s medium for a removal, `None` if it was never
    /// stored on.
    fn find_wire(&self, format: &WireFormat, tally: &Tally) -> Option<Slot> {
        match &tally.wire {
            Some((cached, slot)) if cached == format => Some(*slot),
            _ => self.index.media().find(wire_settings(format).1.as_deref()),
        }
    }

    /// `worker` stored the `count` blocks `keys` on `slot`.
    fn store(
        &self,
        worker: WorkerId,
        slot: Slot,
        stats: &mut WorkerStats,
        keys: impl Iterator<Item = u128>,
        count: usize,
    ) {
        stats.held_blocks += self.index.insert_in(worker, slot, keys);
        stats.stored_blocks += count as u64;
    }

    /// `worker` evicted the `count` blocks `keys` from `slot` (from a
    /// medium never stored on, for `None`).
    fn forget(
        &self,
        worker: WorkerId,
        slot: Option<Slot>,
        stats: &mut WorkerStats,
        keys: impl Iterator<Item = u128>,
        count: usize,
    ) {
        let held = slot.map_or(0, |slot| self.index.remove_in(worker, slot, keys));
        stats.held_blocks = stats.held_blocks.saturating_sub(held);
        stats.unknown_removals += count.saturating_sub(held) as u64;
        stats.removed_blocks += count as u64;
    }

    /// `worker` holds nothing any more, on any medium.
    fn clear(&self, worker: WorkerId, stats: &mut WorkerStats) {
        // Its sweep, if due, once the caller released its locks.
        self.index.clear_in(worker);
        stats.held_blocks = 0;
        stats.clears += 1;
    }

    /// Applies a batch of `worker`'s events, in order, up to the first
    /// refused one.
    ///
    /// # Errors
    ///
    /// The first refusal of [`apply`](Self::apply); the events before it
    /// stay applied.
    pub fn apply_batch(&self, worker: WorkerId, batch: &KvEventBatch) -> Result<(), RouterError> {
        batch
            .events()
            .iter()
            .try_for_each(|event| self.apply(worker, event))
    }

    /// Forgets what `worker` holds, on every medium, as after lost events:
    /// it will be relearned from its next stores (until then it gets no
    /// cache credit, never credit for blocks it no longer has).
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
        let order = self.order_read();
        let cell = order
            .load(worker)
            .ok_or(RouterError::UnknownWorker(worker))?;
        cell.set(load);
        Ok(())
    }

    /// What the router knows of `worker`; `None` unless it is live.
    pub fn stats(&self, worker: WorkerId) -> Option<WorkerStats> {
        (self.workers.get(worker)).map(|state| lock(&state.tally).stats)
    }

    /// The index itself, for queries of its own. Changing it through this
    /// reference bypasses the router's counters (which
    /// [`audit`](Self::audit) would then report).
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    /// Every live worker with its overlap with `request` (device blocks)
    /// and its load, in worker order.
    ///
    /// One pass over the live workers and their loads under one read lock;
    /// the index's lookup costs what the request's keys and the workers
    /// that match them cost, not the fleet.
    pub fn candidates(&self, request: &RouteRequest<'_>) -> Vec<Candidate> {
        self.offer(request, Offer::Everyone)
    }

    /// The workers `offer` names, with their overlaps and loads, in worker
    /// order.
    fn offer(&self, request: &RouteRequest<'_>, offer: Offer) -> Vec<Candidate> {
        // The list first: no worker comes or goes while its overlap and
        // load are read, so an overlap is never a previous incarnation's.
        let order = self.order_read();
        if self.medium_weights.is_empty() {
            let overlaps = self.index.overlaps(request.keys);
            let credit = |&(_, blocks): &(WorkerId, usize)| (blocks, 0.0);
            return offered(&order, &overlaps, |o| o.0, credit, true, offer, request);
        }
        let weights: Vec<(&str, f64)> = (self.medium_weights.iter())
            .map(|(name, weight)| (name.as_str(), *weight))
            .collect();
        let overlaps = self.index.tiered_overlaps(&weights, request.keys);
        let credit = |&(_, blocks, credit): &(WorkerId, usize, f64)| (blocks, credit);
        offered(&order, &overlaps, |o| o.0, credit, false, offer, request)
    }

    /// Where `policy` sends `request`; `None` with no workers. The policy
    /// is offered every live worker or the shortlist it asks for
    /// ([`Policy::offer`]): with [`KvAware`](crate::KvAware)'s defaults
    /// and [`LeastLoaded`](crate::LeastLoaded), for each number of the
    /// request's blocks a worker holds (none included), the workers holding
    /// that many with the least work, so a route among many workers builds
    /// few candidates.
    pub fn route(&self, request: &RouteRequest<'_>, policy: &mut dyn Policy) -> Option<Decision> {
        let candidates = self.offer(request, policy.offer());
        let chosen = candidates.get(policy.choose(request, &candidates)?)?;
        Some(Decision {
            worker: chosen.worker,
            overlap_blocks: chosen.overlap_blocks,
        })
    }
}
