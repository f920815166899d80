//! KV beyond the device from Python: a `Scheduler`'s lower tiers (host
//! memory, a disk) built from its keyword options, and the copies between
//! tiers its plans ask the engine for (`Transfer`), reported back by id.

use std::str::FromStr;

use kvbm_queue::TiersConfig;
use kvbm_tiers::{Outcome, TierConfig, Transfer as RustTransfer, TransferId, TransferKind};
use pyo3::prelude::*;

use crate::args::{Count, U64};
use crate::errors::Error;

/// The lower tiers a scheduler's options ask for (`None`: no tier), as
/// `kvbm-sim serve` names them: `"CPU"` for host memory, `"DISK"` below it.
pub(crate) fn tiers_config(
    host_blocks: Option<Count>,
    disk_blocks: Option<Count>,
    offload: &str,
    max_onboarding_blocks: Count,
    load_timeout_steps: U64,
) -> PyResult<Option<TiersConfig>> {
    if disk_blocks.is_some() && host_blocks.is_none() {
        return Err(
            Error::invalid("disk_blocks needs host_blocks: the disk sits below the host").into(),
        );
    }
    let policy = kvbm_sim::Offload::from_str(offload.trim())
        .map_err(Error::invalid)?
        .policy();
    let lower: Vec<TierConfig> = [("CPU", host_blocks), ("DISK", disk_blocks)]
        .into_iter()
        .filter_map(|(medium, blocks)| blocks.map(|blocks| (medium, blocks.0)))
        .map(|(medium, blocks)| TierConfig::new(medium, blocks).with_offload(policy))
        .collect();
    if lower.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        TiersConfig::new(lower)
            .with_max_onboarding_blocks(max_onboarding_blocks.0)
            .with_load_timeout_steps(load_timeout_steps.0),
    ))
}

/// The engine's reports: each id in `completed`, then each in `failed`.
pub(crate) fn reports(completed: &[U64], failed: &[U64]) -> Vec<(TransferId, Outcome)> {
    let report = |ids: &[U64], outcome: Outcome| -> Vec<(TransferId, Outcome)> {
        ids.iter()
            .map(|id| (TransferId::from_raw(id.0), outcome))
            .collect()
    };
    let mut all = report(completed, Outcome::Completed);
    all.extend(report(failed, Outcome::Failed));
    all
}

/// A copy between tiers the engine runs, then reports by ``transfer_id``
/// (``Scheduler.report_transfers``): ``kind`` is ``"store"`` (down: the
/// device to the host, the host to the disk) or ``"load"`` (up to the
/// device, onboarding a request's cached prefix). ``source`` and
/// ``destination`` are tier levels (0 the device, 1 the host, 2 the disk);
/// ``runs`` are ``(source_block, destination_block, blocks)`` of
/// consecutive ids on both sides, one copy each; ``hashes`` are the blocks'
/// chained hashes, in the runs' order (a store keyed by hash files them
/// under these). Until it is reported its sources are pinned and its
/// destinations held.
#[pyclass(module = "kvbm", frozen, get_all)]
#[derive(Clone, Debug)]
pub(crate) struct Transfer {
    /// Its id in reports.
    transfer_id: u64,
    /// `"store"` or `"load"`.
    kind: &'static str,
    /// The source tier's level.
    source: usize,
    /// The destination tier's level.
    destination: usize,
    /// `(source_block, destination_block, blocks)` per run.
    runs: Vec<(u32, u32, u32)>,
    /// The blocks' chained hashes.
    hashes: Vec<u128>,
}

impl From<&RustTransfer> for Transfer {
    fn from(transfer: &RustTransfer) -> Self {
        Self {
            transfer_id: transfer.id.get(),
            kind: match transfer.kind {
                TransferKind::Load => "load",
                _ => "store",
            },
            source: transfer.source.level(),
            destination: transfer.destination.level(),
            runs: (transfer.runs.iter())
                .map(|run| (run.source.get(), run.destination.get(), run.blocks))
                .collect(),
            hashes: transfer.hashes.iter().map(|hash| hash.value()).collect(),
        }
    }
}

#[pymethods]
impl Transfer {
    /// Blocks it copies.
    #[getter]
    fn num_blocks(&self) -> u64 {
        self.runs
            .iter()
            .map(|&(_, _, blocks)| u64::from(blocks))
            .sum()
    }

    fn __repr__(&self) -> String {
        format!(
            "Transfer(transfer_id={}, kind='{}', source={}, destination={}, num_blocks={})",
            self.transfer_id,
            self.kind,
            self.source,
            self.destination,
            self.num_blocks()
        )
    }
}
