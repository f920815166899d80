//! `kvbm.VllmBlockPool`: the state of vLLM's `BlockPool` (its free queue and
//! its prefix-cache map) in Rust, over block objects Python owns.
//!
//! vLLM's managers read and write their `KVCacheBlock` objects directly
//! (`ref_cnt`, `block_hash`, `is_null`), so the blocks stay Python objects:
//! this pool holds them, keeps their `ref_cnt`, `_block_hash` and
//! `_block_hash_num_tokens` attributes as vLLM's pool would, and returns
//! them from its calls. What moves to Rust is every loop over blocks: a
//! request's prefix lookup, an allocation with its evictions, a step's
//! frees, the caching of a request's full blocks, each one call.
//!
//! The eviction order is vLLM 0.33's `FreeKVCacheBlockQueue`, exactly: one
//! queue of free blocks, ids ascending at the start; `get_new_blocks` pops
//! from the front (dropping a cached block's hashes); `free_blocks` puts the
//! blocks whose last reference it drops without a hash at the front (in
//! the order given) and the hashed ones at the back (in the order given,
//! which vLLM makes tail first); `touch` takes a free block out of the
//! middle. kvbm-blocks' `BlockManager` keeps free and cached blocks apart,
//! deduplicates registrations and keys its cache by kvbm's chained
//! `SequenceHash`; vLLM keeps one mixed queue, several blocks per hash and
//! opaque byte keys, and its results (block ids, hits after eviction)
//! depend on that, so this pool reproduces the queue itself.
//!
//! The queue ([`free_queue`]) and the key map ([`cache_map`]) are plain data
//! in modules of their own; this one binds them to the block objects and to
//! Python.
//!
//! Refusals leave the pool unchanged: a block of another pool, a block
//! freed more often than referenced, a hash list too short. A call that
//! re-enters the pool (from a block's attribute hook) or races another
//! thread on it raises `RuntimeError` (PyO3's borrow check), never blocks.

use std::collections::HashMap;

use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::args::Count;
use crate::errors::{Error, Kind};

mod cache_map;
mod free_queue;

use cache_map::CacheMap;
use free_queue::{FreeQueue, MAX_BLOCKS};

/// A map with a fast hasher (keys are already hashes; ids are the pool's).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A cache event, recorded when the pool is built with `events=True`.
#[derive(Debug)]
enum Event {
    /// Full blocks cached, under these keys.
    Stored(Vec<Py<PyBytes>>),
    /// A key no longer maps to a block.
    Removed(Py<PyBytes>),
    /// The whole prefix cache was reset.
    Cleared,
}

/// vLLM's `BlockPool` state: see the module docs.
#[pyclass(module = "kvbm")]
#[derive(Debug)]
pub(crate) struct VllmBlockPool {
    /// The block objects, by id; empty once the garbage collector cleared
    /// the pool (every call then raises `PoolError`).
    blocks: Vec<Py<PyAny>>,
    /// Free and cached blocks, in eviction order.
    queue: FreeQueue,
    /// The null block's id (the first popped: 0).
    null: u32,
    enable_caching: bool,
    /// Each block's primary key (its `_block_hash`) and tokens covered.
    primary: Vec<Option<Py<PyBytes>>>,
    primary_tokens: Vec<Option<u64>>,
    /// Keys a block holds beyond its primary one (partial entries).
    secondary: FastMap<u32, Vec<Py<PyBytes>>>,
    /// Key bytes to the blocks cached under them.
    cached: CacheMap,
    /// Per-block scratch for one call (references being dropped or added);
    /// all zero between calls.
    pending: Vec<u32>,
    /// Scratch key buffer (hash bytes + group id).
    key: Vec<u8>,
    events: Option<Vec<Event>>,
}

/// The error of a call on a pool the garbage collector cleared.
fn cleared() -> Error {
    Error::pool("this pool was cleared by the garbage collector")
}

/// The 4-byte big-endian group suffix vLLM appends to a block hash.
fn push_key(buf: &mut Vec<u8>, hash: &[u8], group: u32) {
    buf.clear();
    buf.extend_from_slice(hash);
    buf.extend_from_slice(&group.to_be_bytes());
}

/// The bytes of a hash or key object.
fn hash_bytes<'a, 'py>(obj: &'a Bound<'py, PyAny>) -> PyResult<&'a [u8]> {
    match obj.cast::<PyBytes>() {
        Ok(bytes) => Ok(bytes.as_bytes()),
        Err(_) => Err(PyTypeError::new_err(format!(
            "block hashes are bytes, not {}",
            obj.get_type().name()?
        ))),
    }
}

/// Item `index` of a list (fast) or any sequence.
fn item<'py>(seq: &Bound<'py, PyAny>, index: usize) -> PyResult<Bound<'py, PyAny>> {
    match seq.cast::<PyList>() {
        Ok(list) => list.get_item(index),
        Err(_) => seq.get_item(index),
    }
}

/// A sequence's length (a list's without a call).
fn seq_len(seq: &Bound<'_, PyAny>) -> PyResult<usize> {
    match seq.cast::<PyList>() {
        Ok(list) => Ok(list.len()),
        Err(_) => seq.len(),
    }
}

/// The blocks of an iterable, in order (a list without copying items).
fn collect<'py>(blocks: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if let Ok(list) = blocks.cast::<PyList>() {
        return Ok(list.iter().collect());
    }
    blocks.try_iter()?.collect()
}

impl VllmBlockPool {
    fn live(&self) -> Result<(), Error> {
        if self.blocks.is_empty() {
            return Err(cleared());
        }
        Ok(())
    }

    /// The id of `block` if it is one of this pool's objects, else `None`.
    fn own_id(&self, py: Python<'_>, block: &Bound<'_, PyAny>) -> PyResult<Option<u32>> {
        let id: i64 = block.getattr(intern!(py, "block_id"))?.extract()?;
        Ok(usize::try_from(id)
            .ok()
            .filter(|&i| i < self.blocks.len() && self.blocks[i].is(block))
            .map(|i| i as u32))
    }

    /// The id of `block`, which must be one of this pool's objects.
    fn id_of(&self, py: Python<'_>, block: &Bound<'_, PyAny>) -> PyResult<u32> {
        match self.own_id(py, block)? {
            Some(id) => Ok(id),
            None => Err(Error::pool(format!(
                "{} is not a block of this pool",
                block.repr().map(|r| r.to_string()).unwrap_or_default()
            ))
            .into()),
        }
    }

    fn ref_cnt(py: Python<'_>, block: &Bound<'_, PyAny>) -> PyResult<u64> {
        let refs: i64 = block.getattr(intern!(py, "ref_cnt"))?.extract()?;
        u64::try_from(refs)
            .map_err(|_| Error::pool(format!("a block's ref_cnt is negative ({refs})")).into())
    }

    fn set_ref_cnt(py: Python<'_>, block: &Bound<'_, PyAny>, refs: u64) -> PyResult<()> {
        block.setattr(intern!(py, "ref_cnt"), refs)
    }

    /// vLLM's `_remove_cached_block_hashes`: drops every key of block `id`
    /// and resets its hash attributes; the keys that mapped to it.
    fn drop_keys(&mut self, py: Python<'_>, id: u32) -> PyResult<Vec<Py<PyBytes>>> {
        let primary = self.primary[id as usize].take();
        let secondary = self.secondary.remove(&id).unwrap_or_default();
        if primary.is_none() && secondary.is_empty() {
            return Ok(Vec::new());
        }
        let mut removed = Vec::with_capacity(1 + secondary.len());
        for key in primary.into_iter().chain(secondary) {
            if self.cached.remove(key.as_bytes(py), id) {
                removed.push(key);
            }
        }
        self.primary_tokens[id as usize] = None;
        let block = self.blocks[id as usize].bind(py);
        block.setattr(intern!(py, "_block_hash"), py.None())?;
        block.setattr(intern!(py, "_block_hash_num_tokens"), py.None())?;
        Ok(removed)
    }

    /// Drops block `id`'s keys, recording `removed` events.
    fn evict(&mut self, py: Python<'_>, id: u32) -> PyResult<bool> {
        let removed = self.drop_keys(py, id)?;
        let any = !removed.is_empty();
        if let Some(events) = &mut self.events {
            events.extend(removed.into_iter().map(Event::Removed));
        }
        Ok(any)
    }

    /// vLLM's `_insert_block_hash`: caches block `id` under `key` (the
    /// scratch buffer's bytes, or `key_obj`'s).
    fn insert(
        &mut self,
        py: Python<'_>,
        id: u32,
        key_obj: &Bound<'_, PyBytes>,
        num_tokens: Option<u64>,
    ) -> PyResult<bool> {
        let key = key_obj.as_bytes();
        if let Some(primary) = &self.primary[id as usize]
            && primary.as_bytes(py) == key
        {
            return Ok(false);
        }
        if self.cached.contains(key, id) {
            return Ok(false);
        }
        if self.primary[id as usize].is_none() {
            let block = self.blocks[id as usize].bind(py);
            block.setattr(intern!(py, "_block_hash"), key_obj)?;
            block.setattr(intern!(py, "_block_hash_num_tokens"), num_tokens)?;
            self.primary[id as usize] = Some(key_obj.clone().unbind());
            self.primary_tokens[id as usize] = num_tokens;
        } else {
            self.secondary
                .entry(id)
                .or_default()
                .push(key_obj.clone().unbind());
        }
        self.cached.insert(key_obj, id);
        Ok(true)
    }

    /// Looks `hash` up in each of `groups`, in order, passing each group's
    /// index and earliest cached block to `found`; false at the first group
    /// with none (vLLM's hit needs every group).
    fn lookup_groups(
        &mut self,
        hash: &[u8],
        groups: &[u32],
        mut found: impl FnMut(usize, u32),
    ) -> bool {
        for (g, &group) in groups.iter().enumerate() {
            push_key(&mut self.key, hash, group);
            match self.lookup() {
                Some(id) => found(g, id),
                None => return false,
            }
        }
        true
    }

    /// The earliest block cached under the scratch key, if any.
    fn lookup(&self) -> Option<u32> {
        self.cached.first(&self.key)
    }

    fn objects<'py>(&self, py: Python<'py>, ids: &[u32]) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, ids.iter().map(|&id| self.blocks[id as usize].bind(py)))
    }

    /// Clears the per-call scratch counts of `ids`.
    fn reset_pending(&mut self, ids: &[u32]) {
        for &id in ids {
            self.pending[id as usize] = 0;
        }
    }

    /// Refuses, changing nothing, if any block of `ids` appears more often
    /// than its `ref_cnt` (`refs`, as read, in the same order) allows;
    /// `verb` says what the call does to them ("freed", "released").
    fn check_releases(&mut self, ids: &[u32], refs: &[u64], verb: &str) -> Result<(), Error> {
        let mut refused = None;
        for (&id, &count) in ids.iter().zip(refs) {
            self.pending[id as usize] += 1;
            if u64::from(self.pending[id as usize]) > count {
                refused = Some((id, count));
                break;
            }
        }
        self.reset_pending(ids);
        match refused {
            None => Ok(()),
            Some((id, count)) => Err(Error::pool(format!(
                "block {id} is {verb} more often than it is referenced (ref_cnt {count})"
            ))),
        }
    }

    /// Takes one reference off each block of `ids` (checked by
    /// [`check_releases`](Self::check_releases)), writing its `ref_cnt`;
    /// the ids whose last reference went, in order.
    fn release_refs(&mut self, py: Python<'_>, ids: &[u32], refs: &[u64]) -> PyResult<Vec<u32>> {
        let mut released = Vec::new();
        let mut written = Ok(());
        for (&id, &count) in ids.iter().zip(refs) {
            let seen = self.pending[id as usize];
            // Checked; saturating in case a hook moved the count since.
            let now = count.saturating_sub(u64::from(seen) + 1);
            self.pending[id as usize] = seen + 1;
            written = Self::set_ref_cnt(py, self.blocks[id as usize].bind(py), now);
            if written.is_err() {
                break;
            }
            if now == 0 {
                released.push(id);
            }
        }
        // Reset even when a write failed, so the next call counts afresh.
        self.reset_pending(ids);
        written.map(|()| released)
    }
}

#[pymethods]
impl VllmBlockPool {
    /// A pool over ``blocks``, block ``i`` the object with ``block_id == i``
    /// and ``ref_cnt == 0`` (vLLM's ``KVCacheBlock``, or any object with its
    /// attributes ``block_id``, ``ref_cnt``, ``_block_hash``,
    /// ``_block_hash_num_tokens`` and ``is_null``). All start free, in id
    /// order; block 0 becomes the null block (``is_null = True``), never
    /// handed out. ``enable_caching=False`` never keeps a freed block's
    /// hash in the eviction order. With ``events=True`` the pool records
    /// cache events for ``take_events``.
    #[new]
    #[pyo3(
        signature = (blocks, *, enable_caching = true, events = false),
        text_signature = "(blocks, *, enable_caching=True, events=False)"
    )]
    fn new(
        py: Python<'_>,
        blocks: &Bound<'_, PyAny>,
        enable_caching: bool,
        events: bool,
    ) -> PyResult<Self> {
        let objects = collect(blocks)?;
        let n = objects.len();
        if n == 0 {
            return Err(Error::invalid("a pool needs at least one block (the null block)").into());
        }
        if n >= MAX_BLOCKS {
            return Err(Error::invalid(format!("{n} blocks are too many")).into());
        }
        for (i, block) in objects.iter().enumerate() {
            let id: i64 = block.getattr(intern!(py, "block_id"))?.extract()?;
            if id != i as i64 {
                return Err(Error::invalid(format!(
                    "block {i} of the list has block_id {id}: blocks are listed by id"
                ))
                .into());
            }
            if Self::ref_cnt(py, block)? != 0 {
                return Err(
                    Error::invalid(format!("block {i} is referenced (ref_cnt > 0)")).into(),
                );
            }
            if objects[..i].iter().any(|b| b.is(block)) {
                return Err(Error::invalid(format!("block {i} is listed twice")).into());
            }
        }
        let mut pool = Self {
            blocks: objects.into_iter().map(Bound::unbind).collect(),
            queue: FreeQueue::all(n),
            null: 0,
            enable_caching,
            primary: (0..n).map(|_| None).collect(),
            primary_tokens: vec![None; n],
            secondary: FastMap::default(),
            cached: CacheMap::default(),
            pending: vec![0; n],
            key: Vec::with_capacity(64),
            events: events.then(Vec::new),
        };
        // vLLM's null block: the first popped, a placeholder never freed.
        pool.queue.unlink(0);
        pool.blocks[0]
            .bind(py)
            .setattr(intern!(py, "is_null"), true)?;
        Ok(pool)
    }

    /// Blocks in the pool, the null block included.
    #[getter]
    fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks in the free queue (free or cached, evictable).
    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.queue.len()
    }

    /// The fraction of blocks in use, the null block not counted (vLLM's
    /// ``get_usage``).
    #[getter]
    fn usage(&self) -> f64 {
        let total = self.blocks.len().saturating_sub(1);
        if total == 0 {
            return 0.0;
        }
        1.0 - self.queue.len() as f64 / total as f64
    }

    /// The null block object.
    #[getter]
    fn null_block(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.live()?;
        Ok(self.blocks[self.null as usize].clone_ref(py))
    }

    /// Whether freed blocks keep their hashes in the eviction order.
    #[getter]
    fn enable_caching(&self) -> bool {
        self.enable_caching
    }

    /// Keys in the prefix-cache map.
    #[getter]
    fn num_cached_keys(&self) -> usize {
        self.cached.len()
    }

    /// The block object with id ``block_id``.
    fn block(&self, py: Python<'_>, block_id: Count) -> PyResult<Py<PyAny>> {
        self.live()?;
        match self.blocks.get(block_id.0) {
            Some(block) => Ok(block.clone_ref(py)),
            None => Err(Error::invalid(format!(
                "block {} is out of range (the pool has {})",
                block_id.0,
                self.blocks.len()
            ))
            .into()),
        }
    }

    /// Pops ``num_blocks`` blocks from the front of the free queue, drops
    /// the hashes of cached ones (evicting them) and gives each
    /// ``ref_cnt = 1``; returns them in queue order.
    ///
    /// Raises ``PoolExhaustedError`` if fewer are free (nothing changes).
    fn get_new_blocks<'py>(
        &mut self,
        py: Python<'py>,
        num_blocks: Count,
    ) -> PyResult<Bound<'py, PyList>> {
        self.live()?;
        let count = num_blocks.0;
        if count > self.queue.len() {
            return Err(Error::new(
                Kind::Exhausted,
                format!(
                    "cannot get {count} free blocks from the pool ({} free)",
                    self.queue.len()
                ),
            )
            .into());
        }
        let mut ids = Vec::with_capacity(count);
        for at in self.queue.iter().take(count) {
            let block = self.blocks[at as usize].bind(py);
            let refs = Self::ref_cnt(py, block)?;
            if refs != 0 {
                return Err(Error::pool(format!(
                    "block {at} is in the free queue but referenced (ref_cnt {refs}): \
                     its ref_cnt was changed behind the pool's back"
                ))
                .into());
            }
            ids.push(at);
        }
        self.queue.detach_front(&ids);
        for &id in &ids {
            if self.enable_caching {
                self.evict(py, id)?;
            }
            Self::set_ref_cnt(py, self.blocks[id as usize].bind(py), 1)?;
        }
        self.objects(py, &ids)
    }

    /// Takes one more reference to each block (the null block is skipped);
    /// a block with none leaves the free queue. All or none.
    fn touch(&mut self, py: Python<'_>, blocks: &Bound<'_, PyAny>) -> PyResult<()> {
        self.live()?;
        let objects = collect(blocks)?;
        let mut ids = Vec::with_capacity(objects.len());
        let mut refs = Vec::with_capacity(objects.len());
        let checked = (|| -> PyResult<()> {
            for block in &objects {
                let id = self.id_of(py, block)?;
                if id == self.null {
                    continue;
                }
                let count = Self::ref_cnt(py, block)?;
                if count == 0 && self.pending[id as usize] == 0 && !self.queue.contains(id) {
                    return Err(Error::pool(format!(
                        "block {id} has ref_cnt 0 but is not in the free queue"
                    ))
                    .into());
                }
                self.pending[id as usize] += 1;
                ids.push(id);
                refs.push(count);
            }
            Ok(())
        })();
        self.reset_pending(&ids);
        checked?;
        for (&id, &count) in ids.iter().zip(&refs) {
            // `count` is the value before this call; a block listed twice
            // has gained `seen` references since.
            let seen = self.pending[id as usize];
            let now = count.saturating_add(u64::from(seen));
            if now == 0 {
                self.queue.unlink(id);
            }
            self.pending[id as usize] = seen + 1;
            Self::set_ref_cnt(py, self.blocks[id as usize].bind(py), now.saturating_add(1))?;
        }
        self.reset_pending(&ids);
        Ok(())
    }

    /// Drops one reference to each block, ordered by eviction priority
    /// (first evicted first; vLLM passes a request's blocks tail first).
    /// Blocks whose last reference goes join the free queue: without a
    /// hash at the front, in the order given; cached ones at the back.
    /// The null block is skipped. Blocks of other pools are returned, in
    /// order, for their own pool (``None`` if there are none).
    ///
    /// All or none: a block freed more often than referenced raises
    /// ``PoolError`` and nothing changes.
    fn free_blocks<'py>(
        &mut self,
        py: Python<'py>,
        blocks: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        self.live()?;
        let objects = collect(blocks)?;
        let mut ids = Vec::with_capacity(objects.len());
        let mut refs = Vec::with_capacity(objects.len());
        let mut foreign = Vec::new();
        for block in &objects {
            let Some(id) = self.own_id(py, block)? else {
                foreign.push(block);
                continue;
            };
            if id != self.null {
                ids.push(id);
                refs.push(Self::ref_cnt(py, block)?);
            }
        }
        self.check_releases(&ids, &refs, "freed")?;
        let released = self.release_refs(py, &ids, &refs)?;
        // Without a hash to the front, in the order given; cached ones to
        // the back (vLLM's order).
        let (last, first): (Vec<u32>, Vec<u32>) = released
            .into_iter()
            .partition(|&id| self.enable_caching && self.primary[id as usize].is_some());
        self.queue.prepend(&first);
        self.queue.append(&last);
        if foreign.is_empty() {
            return Ok(None);
        }
        Ok(Some(PyList::new(py, foreign)?))
    }

    /// Drops one reference to each block; those whose last reference goes
    /// join the back of the free queue whatever their hash (vLLM's
    /// ``unpin_blocks``). All or none.
    fn unpin(&mut self, py: Python<'_>, blocks: &Bound<'_, PyAny>) -> PyResult<()> {
        self.live()?;
        let objects = collect(blocks)?;
        let mut ids = Vec::with_capacity(objects.len());
        let mut refs = Vec::with_capacity(objects.len());
        for block in &objects {
            let id = self.id_of(py, block)?;
            if id == self.null {
                return Err(Error::pool("the null block cannot be unpinned").into());
            }
            ids.push(id);
            refs.push(Self::ref_cnt(py, block)?);
        }
        self.check_releases(&ids, &refs, "released")?;
        let released = self.release_refs(py, &ids, &refs)?;
        self.queue.append(&released);
        Ok(())
    }

    /// The blocks cached under ``block_hash`` for each group of
    /// ``group_ids`` (the earliest cached of several), or ``None`` if any
    /// group misses (vLLM's ``get_cached_block``).
    fn get_cached_block<'py>(
        &mut self,
        py: Python<'py>,
        block_hash: &Bound<'py, PyAny>,
        group_ids: Vec<u32>,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        self.live()?;
        let hash = hash_bytes(block_hash)?;
        let mut found = Vec::with_capacity(group_ids.len());
        if !self.lookup_groups(hash, &group_ids, |_, id| found.push(id)) {
            return Ok(None);
        }
        Ok(Some(self.objects(py, &found)?))
    }

    /// The longest run of cached blocks from the start of ``block_hashes``
    /// for every group of ``group_ids``, at most ``max_blocks``: one list of
    /// block objects per group. Block ``i``'s hash is
    /// ``block_hashes[(i + 1) * stride - 1]`` (``stride`` hashes per block,
    /// as vLLM views hashes of a smaller block size). The per-block loop of
    /// vLLM's ``FullAttentionManager.find_longest_cache_hit``, in one call;
    /// it touches nothing.
    #[pyo3(signature = (block_hashes, group_ids, max_blocks, stride = Count(1)))]
    fn find_longest_cache_hit<'py>(
        &mut self,
        py: Python<'py>,
        block_hashes: &Bound<'py, PyAny>,
        group_ids: Vec<u32>,
        max_blocks: Count,
        stride: Count,
    ) -> PyResult<Bound<'py, PyTuple>> {
        self.live()?;
        let stride = stride.0;
        if stride == 0 {
            return Err(Error::invalid("stride must be at least 1").into());
        }
        let available = seq_len(block_hashes)? / stride;
        let wanted = max_blocks.0.min(available);
        // Grown as blocks match: `wanted` and the groups are the caller's sizes.
        let mut found: Vec<Vec<u32>> = vec![Vec::new(); group_ids.len()];
        for i in 0..wanted {
            let hash_obj = item(block_hashes, (i + 1) * stride - 1)?;
            let hash = hash_bytes(&hash_obj)?;
            if !self.lookup_groups(hash, &group_ids, |g, id| found[g].push(id)) {
                // Groups before the one that missed matched block i: drop it.
                for list in &mut found {
                    list.truncate(i);
                }
                break;
            }
        }
        let lists = found
            .iter()
            .map(|ids| self.objects(py, ids))
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, lists)
    }

    /// The largest ``block_hash_num_tokens`` among ``blocks`` (0 if none
    /// has one): the per-block loop of vLLM's
    /// ``KVCacheManager.estimate_cached_tokens`` over one group's blocks,
    /// in one call. It reads each block's attribute, so it agrees with
    /// vLLM's loop whoever set it; it changes nothing.
    fn max_hash_num_tokens(&self, py: Python<'_>, blocks: &Bound<'_, PyAny>) -> PyResult<i64> {
        let mut max = 0i64;
        for block in blocks.try_iter()? {
            let tokens = block?.getattr(intern!(py, "_block_hash_num_tokens"))?;
            // vLLM's `block_hash_num_tokens or 0`.
            if !tokens.is_none() {
                max = max.max(tokens.extract::<i64>()?);
            }
        }
        Ok(max)
    }

    /// Caches a request's newly full blocks, ``blocks[num_cached_blocks:
    /// num_full_blocks]``, under their hashes (vLLM's ``cache_full_blocks``
    /// loop): block ``i`` under ``block_hashes[(i + 1) * stride - 1]`` plus
    /// the 4-byte group id, covering ``(i + 1) * block_size`` tokens. Null
    /// blocks and those whose ``block_mask`` entry (aligned with the new
    /// blocks) is false are skipped; a block hashed for fewer tokens is
    /// re-keyed. Returns the keys cached, in order.
    ///
    /// Raises ``InvalidArgumentError`` if the hashes or the mask are too
    /// short (nothing changes).
    #[pyo3(signature = (blocks, block_hashes, num_cached_blocks, num_full_blocks, block_size, group_id, *, stride = Count(1), block_mask = None))]
    #[allow(clippy::too_many_arguments)] // vLLM's signature, plus the hash view
    fn cache_full_blocks<'py>(
        &mut self,
        py: Python<'py>,
        blocks: &Bound<'py, PyAny>,
        block_hashes: &Bound<'py, PyAny>,
        num_cached_blocks: Count,
        num_full_blocks: Count,
        block_size: Count,
        group_id: u32,
        stride: Count,
        block_mask: Option<Vec<bool>>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.live()?;
        let (from, to, stride) = (num_cached_blocks.0, num_full_blocks.0, stride.0);
        if from >= to {
            return Ok(PyList::empty(py));
        }
        if stride == 0 {
            return Err(Error::invalid("stride must be at least 1").into());
        }
        let new = to - from;
        if let Some(mask) = &block_mask
            && mask.len() != new
        {
            return Err(Error::invalid(format!(
                "block_mask has {} entries for {new} new full blocks",
                mask.len()
            ))
            .into());
        }
        let hashes_needed = to.saturating_mul(stride);
        let have = seq_len(block_hashes)?;
        if have < hashes_needed {
            return Err(Error::invalid(format!(
                "{to} full blocks need {hashes_needed} block hashes, got {have}"
            ))
            .into());
        }
        if seq_len(blocks)? < to {
            return Err(Error::invalid(format!(
                "{to} full blocks, but the request has {} blocks",
                seq_len(blocks)?
            ))
            .into());
        }
        // Resolve every block and key before changing anything.
        let mut work: Vec<(u32, Bound<'py, PyBytes>, u64)> = Vec::with_capacity(new);
        for i in 0..new {
            if block_mask.as_ref().is_some_and(|mask| !mask[i]) {
                continue;
            }
            let block = item(blocks, from + i)?;
            let id = self.id_of(py, &block)?;
            if id == self.null {
                continue;
            }
            let hash_obj = item(block_hashes, (from + i + 1) * stride - 1)?;
            push_key(&mut self.key, hash_bytes(&hash_obj)?, group_id);
            let tokens = ((from + i + 1) as u64).saturating_mul(block_size.0 as u64);
            if self.primary[id as usize].is_some()
                && self.primary_tokens[id as usize].is_none_or(|t| t >= tokens)
                && !self.cached.contains(&self.key, id)
            {
                return Err(Error::pool(format!(
                    "block {id} is already cached for {} tokens, not fewer than {tokens}",
                    self.primary_tokens[id as usize].unwrap_or_default()
                ))
                .into());
            }
            work.push((id, PyBytes::new(py, &self.key), tokens));
        }
        let mut stored = Vec::with_capacity(work.len());
        for (id, key, tokens) in work {
            if let Some(primary) = &self.primary[id as usize]
                && primary.as_bytes(py) != key.as_bytes()
            {
                // Partial -> full promotion of the same block.
                self.evict(py, id)?;
            }
            self.insert(py, id, &key, Some(tokens))?;
            stored.push(key);
        }
        if let Some(events) = &mut self.events
            && !stored.is_empty()
        {
            events.push(Event::Stored(
                stored.iter().map(|k| k.clone().unbind()).collect(),
            ));
        }
        PyList::new(py, stored)
    }

    /// Caches ``block`` under ``key`` (hash bytes plus group id) for
    /// ``num_tokens`` tokens (vLLM's ``_insert_block_hash``): its primary
    /// key if it has none, else an extra one. Returns whether it was new.
    #[pyo3(signature = (key, block, num_tokens = None))]
    fn insert_hash(
        &mut self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        block: &Bound<'_, PyAny>,
        num_tokens: Option<Count>,
    ) -> PyResult<bool> {
        self.live()?;
        let key = key.cast::<PyBytes>().map_err(|_| {
            PyTypeError::new_err("a cache key is bytes (the block hash and 4-byte group id)")
        })?;
        let id = self.id_of(py, block)?;
        if id == self.null {
            return Err(Error::pool("the null block is never cached").into());
        }
        self.insert(py, id, key, num_tokens.map(|n| n.0 as u64))
    }

    /// Drops every key of ``block`` and resets its hash (vLLM's
    /// ``_remove_cached_block_hashes``); returns the keys that mapped to
    /// it. Records no event: the caller reports them.
    fn remove_hashes<'py>(
        &mut self,
        py: Python<'py>,
        block: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.live()?;
        let id = self.id_of(py, block)?;
        let removed = self.drop_keys(py, id)?;
        PyList::new(py, removed)
    }

    /// Evicts ``block`` from the prefix cache (vLLM's
    /// ``_maybe_evict_cached_block``), recording ``removed`` events; whether
    /// it had a key.
    fn evict_block(&mut self, py: Python<'_>, block: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.live()?;
        let id = self.id_of(py, block)?;
        self.evict(py, id)
    }

    /// Evicts the blocks with these ids from the prefix cache; referenced
    /// ones stay allocated, free ones stay where they are in the queue.
    ///
    /// Raises ``InvalidArgumentError`` for an id out of range (nothing
    /// changes).
    fn evict_blocks(&mut self, py: Python<'_>, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        self.live()?;
        let ids: Vec<Count> = collect(block_ids)?
            .iter()
            .map(|id| id.extract::<Count>())
            .collect::<PyResult<_>>()?;
        if let Some(bad) = ids.iter().find(|id| id.0 >= self.blocks.len()) {
            return Err(Error::invalid(format!(
                "invalid block_id {} >= {}: only the pool's blocks can be evicted",
                bad.0,
                self.blocks.len()
            ))
            .into());
        }
        for id in ids {
            self.evict(py, id.0 as u32)?;
        }
        Ok(())
    }

    /// Whether ``key`` maps to block ``block_id``.
    fn contains(&self, key: &Bound<'_, PyAny>, block_id: i64) -> PyResult<bool> {
        self.live()?;
        let Ok(id) = u32::try_from(block_id) else {
            return Ok(false);
        };
        Ok(self.cached.contains(hash_bytes(key)?, id))
    }

    /// The earliest block cached under ``key``, or ``None``.
    fn get_one_block(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
        self.live()?;
        Ok((self.cached.first(hash_bytes(key)?)).map(|id| self.blocks[id as usize].clone_ref(py)))
    }

    /// The ids cached under ``key``, earliest first.
    fn cached_ids(&self, key: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        self.live()?;
        Ok(self.cached.ids(hash_bytes(key)?).to_vec())
    }

    /// Every key of the prefix-cache map.
    fn cached_keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.cached.keys().map(|key| key.bind(py)))
    }

    /// The keys block ``block_id`` holds beyond its primary one.
    fn extra_keys<'py>(&self, py: Python<'py>, block_id: Count) -> PyResult<Bound<'py, PyList>> {
        let keys = u32::try_from(block_id.0)
            .ok()
            .and_then(|id| self.secondary.get(&id));
        PyList::new(py, keys.into_iter().flatten().map(|k| k.bind(py)))
    }

    /// The ids of the blocks holding extra keys.
    fn blocks_with_extra_keys(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.secondary.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Drops every hash if no block is referenced (the null block aside);
    /// returns whether it did (vLLM's ``reset_prefix_cache``). The free
    /// queue keeps its order.
    fn reset_prefix_cache(&mut self, py: Python<'_>) -> PyResult<bool> {
        self.live()?;
        if self.blocks.len() - self.queue.len() != 1 {
            return Ok(false);
        }
        self.cached.clear();
        self.secondary.clear();
        for id in 0..self.blocks.len() {
            if self.primary[id].take().is_some() {
                let block = self.blocks[id].bind(py);
                block.setattr(intern!(py, "_block_hash"), py.None())?;
                block.setattr(intern!(py, "_block_hash_num_tokens"), py.None())?;
            }
            self.primary_tokens[id] = None;
        }
        if let Some(events) = &mut self.events {
            events.push(Event::Cleared);
        }
        Ok(true)
    }

    /// The free queue's block ids, front (next handed out) first.
    fn free_block_ids(&self) -> PyResult<Vec<u32>> {
        self.live()?;
        Ok(self.queue.iter().collect())
    }

    /// The free queue's block objects, front first.
    fn free_block_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.live()?;
        self.objects(py, &self.queue.iter().collect::<Vec<_>>())
    }

    /// Whether block ``block_id`` is in the free queue.
    fn is_free(&self, block_id: Count) -> PyResult<bool> {
        self.live()?;
        Ok(block_id.0 < self.blocks.len() && self.queue.contains(block_id.0 as u32))
    }

    /// The cache events since the last call, oldest first:
    /// ``("stored", [key, ...])``, ``("removed", key)``, ``("cleared",
    /// None)``; keys are hash bytes plus the 4-byte group id. Empty
    /// without ``events=True``.
    fn take_events<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = self.events.as_mut().map(std::mem::take).unwrap_or_default();
        let items = events
            .into_iter()
            .map(|event| -> PyResult<Bound<'py, PyTuple>> {
                match event {
                    Event::Stored(keys) => {
                        let keys = PyList::new(py, keys.iter().map(|k| k.bind(py)))?;
                        PyTuple::new(
                            py,
                            ["stored".into_pyobject(py)?.into_any(), keys.into_any()],
                        )
                    }
                    Event::Removed(key) => PyTuple::new(
                        py,
                        [
                            "removed".into_pyobject(py)?.into_any(),
                            key.into_bound(py).into_any(),
                        ],
                    ),
                    Event::Cleared => PyTuple::new(
                        py,
                        [
                            "cleared".into_pyobject(py)?.into_any(),
                            py.None().into_bound(py),
                        ],
                    ),
                }
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    fn __len__(&self) -> usize {
        self.blocks.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "VllmBlockPool(num_blocks={}, free={}, cached_keys={}, enable_caching={})",
            self.blocks.len(),
            self.queue.len(),
            self.cached.len(),
            if self.enable_caching { "True" } else { "False" }
        )
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for block in &self.blocks {
            visit.call(block)?;
        }
        for key in self.primary.iter().flatten() {
            visit.call(key)?;
        }
        for keys in self.secondary.values() {
            for key in keys {
                visit.call(key)?;
            }
        }
        for key in self.cached.keys() {
            visit.call(key)?;
        }
        for event in self.events.iter().flatten() {
            match event {
                Event::Stored(keys) => {
                    for key in keys {
                        visit.call(key)?;
                    }
                }
                Event::Removed(key) => visit.call(key)?,
                Event::Cleared => {}
            }
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.blocks.clear();
        self.primary.clear();
        self.primary_tokens.clear();
        self.secondary.clear();
        self.cached.clear();
        self.pending.clear();
        self.queue.clear();
        if let Some(events) = &mut self.events {
            events.clear();
        }
    }
}
