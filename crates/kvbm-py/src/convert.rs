//! Rust values as Python objects: JSON reports as dicts, cache events as
//! dicts, hash values as ints.

use kvbm_blocks::{CacheEvent, EventMessage, PoolMetrics};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::Value;

/// A JSON value as the Python object `json.loads` would make of it.
pub(crate) fn json<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(flag) => flag.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(number) => {
            if let Some(int) = number.as_u64() {
                int.into_pyobject(py)?.into_any()
            } else if let Some(int) = number.as_i64() {
                int.into_pyobject(py)?.into_any()
            } else {
                number
                    .as_f64()
                    .unwrap_or(f64::NAN)
                    .into_pyobject(py)?
                    .into_any()
            }
        }
        Value::String(text) => text.into_pyobject(py)?.into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(json(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (key, item) in map {
                dict.set_item(key, json(py, item)?)?;
            }
            dict.into_any()
        }
    })
}

/// Cache events as dicts, oldest first: `{"type": "stored", "batch", "parent",
/// "hashes", "tokens"}`, `{"type": "removed", "batch", "hashes"}`,
/// `{"type": "cleared", "batch"}` and `{"type": "resync", "batch",
/// "missed_batches", "registered"}`.
pub(crate) fn events<'py>(
    py: Python<'py>,
    messages: &[EventMessage],
) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for message in messages {
        match message {
            EventMessage::Batch(batch) => {
                for event in batch.events() {
                    let dict = PyDict::new(py);
                    match event {
                        CacheEvent::Stored {
                            parent,
                            hashes,
                            tokens,
                        } => {
                            dict.set_item("type", "stored")?;
                            dict.set_item("batch", batch.sequence())?;
                            dict.set_item("parent", parent)?;
                            dict.set_item("hashes", hashes)?;
                            dict.set_item("tokens", tokens)?;
                        }
                        CacheEvent::Removed { hashes } => {
                            dict.set_item("type", "removed")?;
                            dict.set_item("batch", batch.sequence())?;
                            dict.set_item("hashes", hashes)?;
                        }
                        CacheEvent::Cleared => {
                            dict.set_item("type", "cleared")?;
                            dict.set_item("batch", batch.sequence())?;
                        }
                    }
                    list.append(dict)?;
                }
            }
            EventMessage::Resync(resync) => {
                let dict = PyDict::new(py);
                dict.set_item("type", "resync")?;
                dict.set_item("batch", resync.sequence)?;
                dict.set_item("missed_batches", resync.missed_batches)?;
                let registered: Vec<u128> = resync.registered.iter().map(|h| h.value()).collect();
                dict.set_item("registered", registered)?;
                list.append(dict)?;
            }
        }
    }
    Ok(list)
}

/// A pool's occupancy and lifetime counters as a dict.
pub(crate) fn pool_metrics<'py>(
    py: Python<'py>,
    metrics: &PoolMetrics,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("total_blocks", metrics.total_blocks)?;
    dict.set_item("free_blocks", metrics.free_blocks)?;
    dict.set_item("inactive_blocks", metrics.inactive_blocks)?;
    dict.set_item("in_use_blocks", metrics.in_use_blocks)?;
    dict.set_item("allocations", metrics.allocations)?;
    dict.set_item("registrations", metrics.registrations)?;
    dict.set_item("deduplications", metrics.deduplications)?;
    dict.set_item("match_hashes_requested", metrics.match_hashes_requested)?;
    dict.set_item("match_hashes_hit", metrics.match_hashes_hit)?;
    dict.set_item("evictions", metrics.evictions)?;
    Ok(dict)
}

/// The fraction of blocks in use (cached blocks no one holds count as free,
/// as in vLLM's `kv_cache_usage_perc`).
pub(crate) fn usage(metrics: &PoolMetrics) -> f64 {
    if metrics.total_blocks == 0 {
        return 0.0;
    }
    metrics.in_use_blocks as f64 / metrics.total_blocks as f64
}
