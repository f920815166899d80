//! `kvbm.Sequence` (tokens cut into blocks with chained hashes) and
//! `kvbm.RequestSequence` (one request's tokens and the blocks backing them).

use std::ops::Range;
use std::sync::Mutex;

use kvbm_blocks::SequenceHash;
use kvbm_sequence::{BlockSequence, RequestSequence as RustRequestSequence};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyIterator, PyList, PyRange};

use crate::Device;
use crate::args::{Count, SaltArg, Tokens, U32, pack};
use crate::errors::Error;
use crate::lock::lock;
use crate::pool::BlockPool;

/// A Python `range` of block indices.
fn range<'py>(py: Python<'py>, blocks: Range<usize>) -> PyResult<Bound<'py, PyRange>> {
    let bound = |index: usize| isize::try_from(index).unwrap_or(isize::MAX);
    PyRange::new(py, bound(blocks.start), bound(blocks.end))
}

/// Hash values as `bytes`, 16 little-endian bytes each.
fn packed<'py>(py: Python<'py>, hashes: &[SequenceHash]) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &pack(hashes.iter().map(|hash| hash.value())))
}

fn values(hashes: &[SequenceHash]) -> Vec<u128> {
    hashes.iter().map(|hash| hash.value()).collect()
}

/// A request's tokens cut into full blocks of ``block_size`` plus a partial
/// tail, each full block named by a hash chained from its parent's (XXH3,
/// rooted in an optional salt): two sequences share block ``i``'s hash
/// exactly when they share the salt and every token up to the end of block
/// ``i``, so the hash is the prefix-cache key. Thread-safe.
#[pyclass(module = "kvbm", frozen)]
#[derive(Debug)]
pub(crate) struct Sequence {
    inner: Mutex<BlockSequence>,
}

impl Sequence {
    /// Its full blocks' hashes.
    pub(crate) fn sequence_hashes(&self, py: Python<'_>) -> Vec<SequenceHash> {
        lock(&self.inner, py).sequence_hashes().to_vec()
    }
}

#[pymethods]
impl Sequence {
    /// ``tokens`` in blocks of ``block_size``; ``salt`` (str or bytes)
    /// isolates its hashes from other salts'.
    #[new]
    #[pyo3(
        signature = (tokens, block_size = Count(16), *, salt = SaltArg::default()),
        text_signature = "(tokens, block_size=16, *, salt=None)"
    )]
    fn new(tokens: Tokens, block_size: Count, salt: SaltArg) -> PyResult<Self> {
        let inner =
            BlockSequence::with_salt(tokens.0, block_size.0, salt.0).map_err(Error::from)?;
        Ok(Self {
            inner: Mutex::new(inner),
        })
    }

    /// The tokens.
    #[getter]
    fn tokens(&self, py: Python<'_>) -> Vec<u32> {
        lock(&self.inner, py).tokens().to_vec()
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self, py: Python<'_>) -> usize {
        lock(&self.inner, py).block_size()
    }

    /// Full blocks.
    #[getter]
    fn num_blocks(&self, py: Python<'_>) -> usize {
        lock(&self.inner, py).num_blocks()
    }

    /// The full blocks' chained hash values (ints in ``0 .. 2**128``).
    #[getter]
    fn hashes(&self, py: Python<'_>) -> Vec<u128> {
        values(lock(&self.inner, py).sequence_hashes())
    }

    /// The same hash values packed as bytes, 16 little-endian bytes each
    /// (what ``BlockPool`` methods take at memory speed).
    #[getter]
    fn packed_hashes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let inner = lock(&self.inner, py);
        packed(py, inner.sequence_hashes())
    }

    /// The tokens after the last full block.
    #[getter]
    fn partial_tokens(&self, py: Python<'_>) -> Vec<u32> {
        lock(&self.inner, py).partial_tokens().to_vec()
    }

    /// The tokens of full block ``index`` (``None`` past the full blocks).
    fn block_tokens(&self, py: Python<'_>, index: Count) -> Option<Vec<u32>> {
        lock(&self.inner, py)
            .block_tokens(index.0)
            .map(<[u32]>::to_vec)
    }

    /// Appends one token; returns the index of the block it completed, if any.
    fn append(&self, py: Python<'_>, token: U32) -> Option<usize> {
        lock(&self.inner, py).append(token.0)
    }

    /// Appends tokens; returns the ``range`` of blocks they completed.
    fn extend<'py>(&self, py: Python<'py>, tokens: Tokens) -> PyResult<Bound<'py, PyRange>> {
        let completed = lock(&self.inner, py).extend(&tokens.0);
        range(py, completed)
    }

    /// Keeps the first ``length`` tokens (hashes of blocks that stay full are
    /// kept). Raises ``SequenceError`` past the end.
    fn truncate(&self, py: Python<'_>, length: Count) -> PyResult<()> {
        lock(&self.inner, py)
            .truncate(length.0)
            .map_err(Error::from)?;
        Ok(())
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        lock(&self.inner, py).total_tokens()
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyIterator>> {
        let tokens = self.tokens(py);
        PyIterator::from_object(PyList::new(py, tokens)?.as_any())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let inner = lock(&self.inner, py);
        format!(
            "Sequence(tokens={}, block_size={}, num_blocks={})",
            inner.total_tokens(),
            inner.block_size(),
            inner.num_blocks()
        )
    }
}

/// One request's tokens and the blocks backing them in a ``BlockPool``:
/// match the cached prefix, allocate, register, append generated tokens,
/// release and reacquire, each an explicit call (kvbm-sequence's
/// ``RequestSequence``, no scheduling policy). While it holds blocks it
/// belongs to one pool; its blocks stay valid even after that pool object
/// is gone. Thread-safe.
#[pyclass(module = "kvbm", frozen)]
#[derive(Debug)]
pub(crate) struct RequestSequence {
    inner: Mutex<RustRequestSequence<Device>>,
}

impl RequestSequence {
    /// Its full blocks' hashes.
    pub(crate) fn sequence_hashes(&self, py: Python<'_>) -> Vec<SequenceHash> {
        lock(&self.inner, py).sequence().sequence_hashes().to_vec()
    }

    /// Runs `f` on the sequence under its lock.
    fn with<T>(&self, py: Python<'_>, f: impl FnOnce(&mut RustRequestSequence<Device>) -> T) -> T {
        f(&mut lock(&self.inner, py))
    }
}

#[pymethods]
impl RequestSequence {
    /// A request with prompt ``tokens`` that may generate up to
    /// ``max_output_tokens`` more, in blocks of ``block_size``.
    #[new]
    #[pyo3(
        signature = (tokens, max_output_tokens, block_size = Count(16), *, salt = SaltArg::default()),
        text_signature = "(tokens, max_output_tokens, block_size=16, *, salt=None)"
    )]
    fn new(
        tokens: Tokens,
        max_output_tokens: Count,
        block_size: Count,
        salt: SaltArg,
    ) -> PyResult<Self> {
        let inner =
            RustRequestSequence::with_salt(tokens.0, max_output_tokens.0, block_size.0, salt.0)
                .map_err(Error::from)?;
        Ok(Self {
            inner: Mutex::new(inner),
        })
    }

    /// Matches the longest cached prefix of its full blocks in ``pool`` and
    /// takes it; returns how many blocks hit.
    fn match_prefix(&self, py: Python<'_>, pool: PyRef<'_, BlockPool>) -> PyResult<usize> {
        let hits = self.with(py, |seq| seq.match_and_add_prefix(&pool.manager));
        Ok(hits.map_err(Error::from)?)
    }

    /// Allocates ``count`` blocks from ``pool``, all or none.
    fn allocate_blocks(
        &self,
        py: Python<'_>,
        count: Count,
        pool: PyRef<'_, BlockPool>,
    ) -> PyResult<()> {
        let done = self.with(py, |seq| seq.allocate_blocks(count.0, &pool.manager));
        Ok(done.map_err(Error::from)?)
    }

    /// Allocates what covering the first ``num_tokens`` positions still
    /// needs (all its tokens by default); returns how many were allocated.
    #[pyo3(signature = (pool, num_tokens = None))]
    fn allocate_for(
        &self,
        py: Python<'_>,
        pool: PyRef<'_, BlockPool>,
        num_tokens: Option<Count>,
    ) -> PyResult<usize> {
        let allocated = self.with(py, |seq| {
            let tokens = num_tokens.map_or(seq.total_tokens(), |n| n.0);
            let needed = seq.additional_blocks_needed(tokens);
            seq.allocate_blocks(needed, &pool.manager).map(|()| needed)
        });
        Ok(allocated.map_err(Error::from)?)
    }

    /// Blocks still to allocate to cover the first ``num_tokens`` positions.
    fn blocks_needed(&self, py: Python<'_>, num_tokens: Count) -> usize {
        self.with(py, |seq| seq.additional_blocks_needed(num_tokens.0))
    }

    /// Stages and registers every full block an allocated block can back
    /// (or only those below ``up_to`` blocks: those whose KV is computed);
    /// returns how many were registered.
    #[pyo3(signature = (pool, up_to = None))]
    fn register_pending(
        &self,
        py: Python<'_>,
        pool: PyRef<'_, BlockPool>,
        up_to: Option<Count>,
    ) -> PyResult<usize> {
        let registered = self.with(py, |seq| match up_to {
            None => seq.complete_and_register_pending(&pool.manager),
            Some(up_to) => seq.complete_and_register_up_to(up_to.0, &pool.manager),
        });
        Ok(registered.map_err(Error::from)?)
    }

    /// Appends a generated token; returns the index of the block it filled,
    /// if any. Raises ``SequenceError`` past ``max_output_tokens``.
    fn append_token(&self, py: Python<'_>, token: U32) -> PyResult<Option<usize>> {
        let filled = self.with(py, |seq| seq.append_token(token.0));
        Ok(filled.map_err(Error::from)?)
    }

    /// Appends generated tokens, all or none; returns the ``range`` of
    /// blocks they filled.
    fn append_tokens<'py>(&self, py: Python<'py>, tokens: Tokens) -> PyResult<Bound<'py, PyRange>> {
        let filled = self
            .with(py, |seq| seq.append_tokens(&tokens.0))
            .map_err(Error::from)?;
        range(py, filled)
    }

    /// Rolls back to the first ``length`` tokens (rejected draft tokens).
    fn truncate(&self, py: Python<'_>, length: Count) -> PyResult<()> {
        let done = self.with(py, |seq| seq.truncate(length.0));
        Ok(done.map_err(Error::from)?)
    }

    /// Gives back up to ``count`` allocated, unused blocks (last first);
    /// returns how many.
    fn release_unassigned(&self, py: Python<'_>, count: Count) -> usize {
        self.with(py, |seq| seq.release_unassigned(count.0))
    }

    /// Gives every block back (registered ones stay cached): preemption.
    fn release(&self, py: Python<'_>) {
        self.with(py, |seq| seq.release());
    }

    /// After ``release``, matches the cached prefix again in ``pool``;
    /// returns the hits.
    fn reacquire(&self, py: Python<'_>, pool: PyRef<'_, BlockPool>) -> PyResult<usize> {
        let hits = self.with(py, |seq| seq.reacquire(&pool.manager));
        Ok(hits.map_err(Error::from)?)
    }

    /// All its tokens, prompt and generated.
    #[getter]
    fn tokens(&self, py: Python<'_>) -> Vec<u32> {
        self.with(py, |seq| seq.tokens().to_vec())
    }

    /// Its full blocks' chained hash values.
    #[getter]
    fn hashes(&self, py: Python<'_>) -> Vec<u128> {
        self.with(py, |seq| values(seq.sequence().sequence_hashes()))
    }

    /// The hash values packed as bytes, 16 little-endian bytes each.
    #[getter]
    fn packed_hashes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let hashes = self.sequence_hashes(py);
        packed(py, &hashes)
    }

    /// The ids of the blocks backing it, in page order (its block table).
    #[getter]
    fn block_ids(&self, py: Python<'_>) -> Vec<u32> {
        self.with(py, |seq| seq.page_indices())
    }

    /// Prompt plus generated tokens.
    #[getter]
    fn total_tokens(&self, py: Python<'_>) -> usize {
        self.with(py, |seq| seq.total_tokens())
    }

    /// Prompt tokens.
    #[getter]
    fn num_input_tokens(&self, py: Python<'_>) -> usize {
        self.with(py, |seq| seq.num_input_tokens())
    }

    /// Tokens generated so far.
    #[getter]
    fn generated_tokens(&self, py: Python<'_>) -> usize {
        self.with(py, |seq| seq.generated_tokens())
    }

    /// The output budget.
    #[getter]
    fn max_output_tokens(&self, py: Python<'_>) -> usize {
        self.with(py, |seq| seq.max_output_tokens())
    }

    /// Tokens that may still be generated.
    #[getter]
    fn remaining_tokens(&self, py: Python<'_>) -> usize {
        self.with(py, |seq| seq.remaining_tokens())
    }

    /// Whether the output budget is used up.
    #[getter]
    fn is_complete(&self, py: Python<'_>) -> bool {
        self.with(py, |seq| seq.is_complete())
    }

    /// Full blocks of tokens.
    #[getter]
    fn num_blocks(&self, py: Python<'_>) -> usize {
        self.with(py, |seq| seq.num_blocks())
    }

    /// Registered or cache-matched blocks.
    #[getter]
    fn assigned_blocks(&self, py: Python<'_>) -> usize {
        self.with(py, |seq| seq.assigned_blocks())
    }

    /// Full blocks staged, not yet registered.
    #[getter]
    fn staged_blocks(&self, py: Python<'_>) -> usize {
        self.with(py, |seq| seq.staged_blocks())
    }

    /// Allocated blocks not yet holding a full block.
    #[getter]
    fn unassigned_blocks(&self, py: Python<'_>) -> usize {
        self.with(py, |seq| seq.unassigned_blocks())
    }

    /// Full blocks waiting to be registered.
    #[getter]
    fn pending_blocks(&self, py: Python<'_>) -> usize {
        self.with(py, |seq| seq.pending_blocks())
    }

    /// Blocks it holds.
    #[getter]
    fn held_blocks(&self, py: Python<'_>) -> usize {
        self.with(py, |seq| seq.held_blocks())
    }

    /// Blocks the last match or reacquire found cached.
    #[getter]
    fn prefix_matched_blocks(&self, py: Python<'_>) -> usize {
        self.with(py, |seq| seq.prefix_matched_blocks())
    }

    /// Tokens the cache hits do not cover.
    #[getter]
    fn new_tokens_for_prefill(&self, py: Python<'_>) -> usize {
        self.with(py, |seq| seq.new_tokens_for_prefill())
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self, py: Python<'_>) -> usize {
        self.with(py, |seq| seq.block_size())
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.total_tokens(py)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        self.with(py, |seq| {
            format!(
                "RequestSequence(tokens={}, generated={}/{}, blocks={}, held={})",
                seq.total_tokens(),
                seq.generated_tokens(),
                seq.max_output_tokens(),
                seq.num_blocks(),
                seq.held_blocks()
            )
        })
    }
}
