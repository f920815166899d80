//! `kvbm.BlockPool`: kvbm-blocks' manager, with blocks named by their ids.
//!
//! Python holds block ids, not handles: the pool keeps the Rust handle of
//! every block Python holds, with a count of the references Python took
//! (allocated blocks have one; a registered block one per registration or
//! match that returned it), and [`release`](BlockPool::release) gives them
//! back. A block Python does not hold cannot be released, registered or
//! used: that is a `PoolError`, never a double free.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Mutex, MutexGuard};

use kvbm_blocks::{
    BlockError, BlockManager, DuplicatePolicy, EventSubscription, EvictionPolicy, ImmutableBlock,
    ImmutableBlocks, MutableBlock, PoolAudit, SequenceHash,
};
use kvbm_sequence::Salt;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::Device;
use crate::args::{Count, Hashes, Tokens, U32};
use crate::convert;
use crate::errors::Error;
use crate::lock::lock;

/// A map keyed by block ids, with a fast hasher (the ids are the pool's).
type ById<V> = HashMap<u32, V, foldhash::fast::RandomState>;

/// The blocks Python holds, by id.
#[derive(Debug, Default)]
struct Held {
    blocks: ById<Slot>,
}

/// A block Python holds.
#[derive(Debug)]
enum Slot {
    /// Allocated, not registered: one reference.
    Mutable(MutableBlock<Device>),
    /// Registered: `refs` references taken by Python (at least 1).
    Registered {
        /// Held for its drop: the last reference Python gives back frees it.
        _handle: ImmutableBlock<Device>,
        refs: u64,
    },
}

impl Held {
    /// Takes one more reference to each registered block.
    fn add_registered(&mut self, blocks: ImmutableBlocks<Device>) -> Vec<u32> {
        let mut ids = Vec::with_capacity(blocks.len());
        for block in blocks {
            let id = block.block_id().get();
            ids.push(id);
            match self.blocks.entry(id) {
                Entry::Occupied(mut slot) => match slot.get_mut() {
                    Slot::Registered { refs, .. } => *refs = refs.saturating_add(1),
                    // A slot Python holds as allocated cannot come back
                    // registered (the pool hands out each block once); keep
                    // the registered handle, which is the newer truth.
                    Slot::Mutable(_) => {
                        slot.insert(Slot::Registered {
                            _handle: block,
                            refs: 1,
                        });
                    }
                },
                Entry::Vacant(slot) => {
                    slot.insert(Slot::Registered {
                        _handle: block,
                        refs: 1,
                    });
                }
            }
        }
        ids
    }
}

/// A pool of KV-cache blocks with a prefix cache (kvbm-blocks' `BlockManager`).
///
/// Blocks are named by their ids (``0 .. num_blocks``, usable as page
/// indices). ``allocate`` hands out blocks, ``register`` publishes full
/// ones under their chained hashes, ``match_prefix`` finds the longest
/// cached prefix of a request in one call, and ``release`` gives blocks
/// back: a registered block whose last reference is released stays cached
/// (matchable) until an allocation needs room. Thread-safe.
#[pyclass(module = "kvbm", frozen)]
#[derive(Debug)]
pub(crate) struct BlockPool {
    pub(crate) manager: BlockManager<Device>,
    held: Mutex<Held>,
    events: Option<EventSubscription>,
}

impl BlockPool {
    fn held<'a>(&'a self, py: Python<'_>) -> MutexGuard<'a, Held> {
        lock(&self.held, py)
    }
}

/// Bytes of bookkeeping a pool needs per block, rounded up: kvbm-blocks'
/// 44-byte slot, its registry entry and eviction order (62 bytes measured
/// at a million blocks).
const BYTES_PER_BLOCK: u64 = 64;

/// The memory Linux says can be had now without swapping, if it says.
fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// A block manager for Python, refusing a pool whose bookkeeping would not
/// fit in the memory available: the allocation itself could succeed (the
/// kernel overcommits) and the pool's first touch of it end the process.
pub(crate) fn manager(
    blocks: usize,
    block_size: usize,
    eviction: EvictionPolicy,
    duplicates: DuplicatePolicy,
) -> Result<BlockManager<Device>, Error> {
    let needed = (blocks as u64).saturating_mul(BYTES_PER_BLOCK);
    if blocks <= kvbm_blocks::MAX_BLOCKS
        && let Some(available) = available_memory()
        && needed > available
    {
        return Err(BlockError::OutOfMemory { blocks }.into());
    }
    Ok(BlockManager::<Device>::builder()
        .block_count(blocks)
        .block_size(block_size)
        .eviction(eviction)
        .duplicates(duplicates)
        .build()?)
}

/// The hashes of `tokens`' full blocks as kvbm-sequence chains them
/// (unsalted), the first after `parent` at `position`.
fn token_hashes(
    tokens: &[u32],
    block_size: usize,
    parent: Option<u128>,
    position: Option<u32>,
) -> Result<Vec<SequenceHash>, Error> {
    let salt = Salt::NONE;
    let position = first_position(parent, position)?;
    let mut hashes: Vec<SequenceHash> = Vec::with_capacity(tokens.len() / block_size);
    for block in tokens.chunks_exact(block_size) {
        let content = salt.block_hash(block);
        let hash = match (hashes.last(), parent) {
            (Some(previous), _) => previous.child(salt.chain_hash(previous.value(), content)),
            (None, Some(parent)) => {
                SequenceHash::from_parts(salt.chain_hash(parent, content), Some(parent), position)?
            }
            (None, None) => {
                SequenceHash::from_parts(salt.chain_hash(salt.get(), content), None, position)?
            }
        };
        hashes.push(hash);
    }
    Ok(hashes)
}

/// The position of a chain's first block: 0 without a parent; given with one.
pub(crate) fn first_position(parent: Option<u128>, position: Option<u32>) -> Result<u32, Error> {
    match (parent, position) {
        (None, None) => Ok(0),
        (Some(_), None) => Err(Error::invalid(
            "a parent needs the position of the first block (position=)",
        )),
        (Some(_), Some(0)) => Err(Error::invalid(
            "the block at position 0 is a root: it has no parent",
        )),
        (None, Some(position)) if position > 0 => Err(Error::invalid(format!(
            "the block at position {position} needs its parent (parent=)"
        ))),
        (_, Some(position)) => Ok(position),
    }
}

#[pymethods]
impl BlockPool {
    /// A pool of ``num_blocks`` blocks of ``block_size`` tokens.
    ///
    /// ``eviction`` is ``"lru"``, ``"multi-level"`` or ``"lineage"``;
    /// ``duplicates`` is ``"deduplicate"`` (registering a hash already
    /// registered returns the registered block and frees the new one) or
    /// ``"allow"``. With ``events=True`` the pool records cache events for
    /// ``take_events`` (at most ``event_capacity`` batches wait; a reader
    /// that falls behind gets a resync, never a silent gap).
    #[new]
    #[pyo3(
        signature = (num_blocks, block_size = Count(16), *, eviction = "lru", duplicates = "deduplicate", events = false, event_capacity = Count(1024)),
        text_signature = "(num_blocks, block_size=16, *, eviction='lru', duplicates='deduplicate', events=False, event_capacity=1024)"
    )]
    fn new(
        num_blocks: Count,
        block_size: Count,
        eviction: &str,
        duplicates: &str,
        events: bool,
        event_capacity: Count,
    ) -> PyResult<Self> {
        let manager = manager(
            num_blocks.0,
            block_size.0,
            crate::args::eviction(eviction)?.policy(),
            crate::args::duplicates(duplicates)?,
        )?;
        let events = events.then(|| manager.subscribe_events(event_capacity.0.max(1)));
        Ok(Self {
            manager,
            held: Mutex::new(Held::default()),
            events,
        })
    }

    /// Blocks in the pool.
    #[getter]
    fn num_blocks(&self) -> usize {
        self.manager.total_blocks()
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self) -> usize {
        self.manager.block_size()
    }

    /// The eviction policy's name.
    #[getter]
    fn eviction(&self) -> &'static str {
        match self.manager.eviction_policy() {
            kvbm_blocks::EvictionPolicy::Lru => "lru",
            kvbm_blocks::EvictionPolicy::MultiLevelLru => "multi-level",
            kvbm_blocks::EvictionPolicy::Lineage => "lineage",
            _ => "unknown",
        }
    }

    /// Blocks an allocation could get now: free plus cached (evictable).
    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.manager.available_blocks()
    }

    /// The fraction of blocks in use (held by someone), 0.0 to 1.0.
    #[getter]
    fn usage(&self) -> f64 {
        convert::usage(&self.manager.metrics())
    }

    /// Distinct blocks Python holds through this pool object.
    #[getter]
    fn num_held(&self, py: Python<'_>) -> usize {
        self.held(py).blocks.len()
    }

    /// Allocates ``count`` blocks, all or none, evicting cached blocks
    /// when the free ones run out; returns their ids.
    ///
    /// Raises ``PoolExhaustedError`` if not enough are free or evictable.
    fn allocate(&self, py: Python<'_>, count: Count) -> PyResult<Vec<u32>> {
        let blocks = self.manager.allocate_blocks(count.0).map_err(Error::from)?;
        let mut held = self.held(py);
        let ids = blocks.iter().map(|block| block.block_id().get()).collect();
        for block in blocks {
            held.blocks
                .insert(block.block_id().get(), Slot::Mutable(block));
        }
        Ok(ids)
    }

    /// Publishes allocated blocks, full, under chained hashes: each becomes
    /// matchable by every request. Returns the ids now holding them, in
    /// order: under ``"deduplicate"`` a hash already registered returns
    /// the registered block (and frees the one given).
    ///
    /// ``hashes`` are the blocks' chained hash values (ints, or bytes of
    /// packed 16-byte little-endian values, or a ``Sequence`` to take its
    /// hashes from ``position`` on); without them, ``tokens`` (``block_size``
    /// per block) are hashed as ``Sequence`` hashes them. ``parent`` is the
    /// value of the block before the first (``position`` its index);
    /// ``tokens`` given with ``hashes`` ride along in the ``stored`` events.
    /// All or none: on error every block stays allocated.
    #[pyo3(signature = (block_ids, hashes = None, *, tokens = None, parent = None, position = None))]
    fn register(
        &self,
        py: Python<'_>,
        block_ids: Vec<U32>,
        hashes: Option<Hashes>,
        tokens: Option<Tokens>,
        parent: Option<u128>,
        position: Option<U32>,
    ) -> PyResult<Vec<u32>> {
        let block_size = self.manager.block_size();
        let tokens = tokens.map(|t| t.0).unwrap_or_default();
        let expected = block_ids.len().saturating_mul(block_size);
        if !tokens.is_empty() && tokens.len() != expected {
            return Err(Error::invalid(format!(
                "{} blocks of {block_size} tokens need {expected} tokens, got {}",
                block_ids.len(),
                tokens.len()
            ))
            .into());
        }
        let position = position.map(|p| p.0);
        let hashes = match hashes {
            Some(hashes) => hashes.chain(parent, position, Some(block_ids.len()))?,
            None if tokens.is_empty() && !block_ids.is_empty() => {
                return Err(Error::invalid("register needs hashes or tokens").into());
            }
            None => token_hashes(&tokens, block_size, parent, position)?,
        };
        let mut held = self.held(py);
        // Check every id before taking any block out.
        let mut seen: std::collections::HashSet<u32, foldhash::fast::RandomState> =
            std::collections::HashSet::with_capacity_and_hasher(
                block_ids.len(),
                Default::default(),
            );
        for &U32(id) in &block_ids {
            if !matches!(held.blocks.get(&id), Some(Slot::Mutable(_))) {
                return Err(Error::pool(format!(
                    "block {id} is not an allocated, unregistered block of this pool"
                ))
                .into());
            }
            if !seen.insert(id) {
                return Err(Error::invalid(format!("block {id} is listed twice")).into());
            }
        }
        let mut staged = Vec::with_capacity(block_ids.len());
        for (&U32(id), hash) in block_ids.iter().zip(hashes) {
            let Some(Slot::Mutable(block)) = held.blocks.remove(&id) else {
                continue;
            };
            match block.stage(hash, block_size) {
                Ok(complete) => staged.push(complete),
                Err(rejected) => {
                    let (error, block) = rejected.into_parts();
                    held.blocks.insert(id, Slot::Mutable(block));
                    restore(&mut held, staged);
                    return Err(Error::from(error).into());
                }
            }
        }
        match self.manager.register_blocks_with_tokens(staged, &tokens) {
            Ok(registered) => Ok(held.add_registered(registered)),
            Err(rejected) => {
                let (error, blocks) = rejected.into_parts();
                restore(&mut held, blocks);
                Err(Error::from(error).into())
            }
        }
    }

    /// The longest cached prefix of ``hashes`` (a request's chained block
    /// hashes from its first block: ints, packed bytes or a ``Sequence``),
    /// one call per request. Returns the ids of the blocks found, in
    /// order, each with one more reference for the caller to ``release``.
    fn match_prefix(&self, py: Python<'_>, hashes: Hashes) -> PyResult<Vec<u32>> {
        let hashes = hashes.chain(None, None, None)?;
        let matched = self.manager.match_blocks(&hashes);
        Ok(self.held(py).add_registered(matched))
    }

    /// Which of ``hashes`` are registered now (held or cached), without the
    /// prefix rule and without touching anything.
    fn contains(&self, hashes: Hashes) -> PyResult<Vec<bool>> {
        let hashes = hashes.chain(None, None, None)?;
        Ok(self.manager.scan_matches(&hashes))
    }

    /// Gives back one reference per id listed (an id may appear once per
    /// reference). An allocated block returns to the free pool; a
    /// registered one is cached once its last reference is gone, last
    /// listed first: a request's block table, in page order, is evicted
    /// tail first.
    ///
    /// All or none: an id this pool does not hold (or released more often
    /// than held) raises ``PoolError`` and nothing is released.
    fn release(&self, py: Python<'_>, block_ids: Vec<U32>) -> PyResult<()> {
        let mut held = self.held(py);
        let mut wanted: ById<u64> =
            ById::with_capacity_and_hasher(block_ids.len(), Default::default());
        for &U32(id) in &block_ids {
            let count = wanted.entry(id).or_default();
            *count += 1;
            let refs = match held.blocks.get(&id) {
                None => 0,
                Some(Slot::Mutable(_)) => 1,
                Some(Slot::Registered { refs, .. }) => *refs,
            };
            if *count > refs {
                return Err(Error::pool(if refs == 0 {
                    format!("block {id} is not held (released already, or never allocated here)")
                } else {
                    format!("block {id} is released {count} times but held {refs} times")
                })
                .into());
            }
        }
        // Last listed first: a request's table, passed in page order, is
        // cached tail first, so its tail is evicted before its prefix (as
        // kvbm-blocks releases a batch, and vLLM frees a request's blocks).
        let mut dropped = Vec::new();
        for &U32(id) in block_ids.iter().rev() {
            if let Entry::Occupied(mut slot) = held.blocks.entry(id) {
                let gone = match slot.get_mut() {
                    Slot::Mutable(_) => true,
                    Slot::Registered { refs, .. } => {
                        *refs -= 1;
                        *refs == 0
                    }
                };
                if gone {
                    dropped.push(slot.remove());
                }
            }
        }
        drop(held);
        // Dropping the handles gives the blocks back, outside this pool's lock.
        drop(dropped);
        Ok(())
    }

    /// References Python holds on block ``block_id`` (0 if none).
    fn ref_count(&self, py: Python<'_>, block_id: U32) -> u64 {
        match self.held(py).blocks.get(&block_id.0) {
            None => 0,
            Some(Slot::Mutable(_)) => 1,
            Some(Slot::Registered { refs, .. }) => *refs,
        }
    }

    /// Evicts every cached block (none is held) to the free pool; returns
    /// how many were evicted.
    fn clear_cache(&self) -> usize {
        self.manager.clear_cache().len()
    }

    /// The cache events since the last call, oldest first, as dicts (see
    /// the type stubs); needs ``events=True``.
    fn take_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let Some(subscription) = &self.events else {
            return Err(
                Error::pool("this pool records no events: build it with events=True").into(),
            );
        };
        self.manager.flush_events();
        convert::events(py, &subscription.drain())
    }

    /// Occupancy and lifetime counters, read at one instant.
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        convert::pool_metrics(py, &self.manager.metrics())
    }

    /// Recounts every block (O(blocks)): where each one is. Raises
    /// ``PoolError`` if the pool is inconsistent (a bug in kvbm).
    fn audit<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let audit: PoolAudit = self.manager.audit().map_err(Error::from)?;
        let dict = PyDict::new(py);
        dict.set_item("free_blocks", audit.free_blocks)?;
        dict.set_item("held_blocks", audit.held_blocks)?;
        dict.set_item("active_blocks", audit.active_blocks)?;
        dict.set_item("inactive_blocks", audit.inactive_blocks)?;
        dict.set_item("duplicate_blocks", audit.duplicate_blocks)?;
        dict.set_item("registered_hashes", audit.registered_hashes)?;
        dict.set_item("in_use_blocks", audit.in_use_blocks())?;
        dict.set_item("total_blocks", audit.total_blocks())?;
        Ok(dict)
    }

    fn __repr__(&self) -> String {
        let metrics = self.manager.metrics();
        format!(
            "BlockPool(num_blocks={}, block_size={}, eviction='{}', free={}, cached={}, in_use={})",
            metrics.total_blocks,
            self.manager.block_size(),
            self.eviction(),
            metrics.free_blocks,
            metrics.inactive_blocks,
            metrics.in_use_blocks
        )
    }
}

/// Puts staged blocks back among the allocated ones, unstaged.
fn restore(held: &mut Held, blocks: Vec<kvbm_blocks::CompleteBlock<Device>>) {
    for block in blocks {
        let block = block.reset();
        held.blocks
            .insert(block.block_id().get(), Slot::Mutable(block));
    }
}

/// The values of `tokens`' full-block hashes, chained as
/// [`Sequence`](crate::sequence::Sequence) chains them; exposed as
/// `kvbm.block_hashes`.
pub(crate) fn hash_values(tokens: &[u32], block_size: usize) -> Result<Vec<u128>, Error> {
    if block_size == 0 {
        return Err(Error::invalid("block size must be at least 1 token"));
    }
    Ok(token_hashes(tokens, block_size, None, None)?
        .into_iter()
        .map(SequenceHash::value)
        .collect())
}
