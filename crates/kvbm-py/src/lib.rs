//! `kvbm` for Python: the block pool, request sequences, the scheduler and
//! the simulator's replays, built by maturin into one abi3 wheel for
//! CPython 3.11 and later.
//!
//! A crossing between Python and Rust costs about what a Python call costs
//! (~200 ns), and a list about 80 ns per item, so the API moves whole loops
//! across in one call: a request's prefix lookup (`BlockPool.match_prefix`
//! of all its hashes), a step's releases (`BlockPool.release` of all its
//! blocks), a scheduler step (`Scheduler.step`, `Scheduler.apply`), a whole
//! replay (`replay_serve`). Hashes also travel packed (`bytes`, 16 per
//! hash) or as a `Sequence` object, without a Python int per block.
//!
//! Every class is `frozen` with its state behind a mutex, so any Python
//! thread may call any method; locks are taken detached from the
//! interpreter, and long calls (replays, steps of 64 requests and more)
//! release the GIL. Refusals are exceptions under `kvbm.KvbmError` with the
//! Rust error's message; nothing panics across the boundary. The Python API
//! is described for editors in `python/kvbm/__init__.pyi`.
//!
//! `VllmBlockPool` is vLLM 0.33's block pool state in Rust over vLLM's own
//! block objects; the package's Python module `kvbm.vllm` (in `python/`)
//! makes it a drop-in for vLLM's `BlockPool`, and `cargo xtask vllm-pool`
//! checks it against vLLM's scheduler and tests.
//!
//! `cargo xtask python` builds the wheel, installs it into a virtualenv
//! under `target/` and runs `tests/` with pytest.
#![forbid(unsafe_code)]

mod args;
mod convert;
mod errors;
mod lock;
mod plan;
mod pool;
mod scheduler;
mod sequence;
mod sim;
mod transfers;
mod vllm_pool;

use pyo3::prelude::*;

use crate::args::{Count, Tokens};

/// The storage-tier marker of every pool made from Python.
#[derive(Debug)]
pub(crate) struct Device;

/// The chained hash values of ``tokens``' full blocks of ``block_size``
/// tokens, as ``Sequence(tokens, block_size).hashes`` computes them.
#[pyfunction]
#[pyo3(signature = (tokens, block_size = Count(16)), text_signature = "(tokens, block_size=16)")]
fn block_hashes(tokens: Tokens, block_size: Count) -> PyResult<Vec<u128>> {
    Ok(pool::hash_values(&tokens.0, block_size.0)?)
}

/// The KV cache group a chained hash value belongs to (its top 8 bits): 0
/// for a model of one group, ``g`` for the blocks of group ``g`` of a
/// ``Scheduler`` built with ``model=`` or ``groups=`` (as in its
/// ``take_events``).
#[pyfunction]
fn group_of(value: u128) -> usize {
    kvbm_sequence::group_of(value)
}

/// A chained hash value without its KV cache group: the same for every
/// group's block of one prefix, as vLLM sends block hashes.
#[pyfunction]
fn without_group(value: u128) -> u128 {
    kvbm_sequence::without_group(value)
}

/// kvbm: a KV-cache block manager for LLM serving, in Rust. The block pool
/// (``BlockPool``), request sequences (``Sequence``, ``RequestSequence``),
/// the continuous-batching scheduler (``Scheduler``) and the simulator's
/// replays (``replay_cache``, ``replay_serve``, ``replay_cluster``).
#[pymodule]
fn kvbm(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(module)?;
    module.add_class::<pool::BlockPool>()?;
    module.add_class::<sequence::Sequence>()?;
    module.add_class::<sequence::RequestSequence>()?;
    module.add_class::<scheduler::Scheduler>()?;
    module.add_class::<plan::StepPlan>()?;
    module.add_class::<plan::StepReport>()?;
    module.add_class::<plan::PrefillWork>()?;
    module.add_class::<plan::DecodeWork>()?;
    module.add_class::<plan::Finished>()?;
    module.add_class::<transfers::Transfer>()?;
    module.add_class::<sim::Trace>()?;
    module.add_class::<vllm_pool::VllmBlockPool>()?;
    module.add_function(wrap_pyfunction!(block_hashes, module)?)?;
    module.add_function(wrap_pyfunction!(group_of, module)?)?;
    module.add_function(wrap_pyfunction!(without_group, module)?)?;
    module.add_function(wrap_pyfunction!(sim::replay_cache, module)?)?;
    module.add_function(wrap_pyfunction!(sim::replay_serve, module)?)?;
    module.add_function(wrap_pyfunction!(sim::replay_cluster, module)?)?;
    Ok(())
}
