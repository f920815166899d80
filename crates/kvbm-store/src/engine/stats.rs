//! [`DataPlaneStats`]: what the transfer engine moved, verified and failed.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of the transfer engine since it started (a snapshot).
///
/// Conservation: every transfer handed to the engine is counted once in
/// `completed_transfers` or `failed_transfers` when its report is sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DataPlaneStats {
    /// Transfers whose every block was copied.
    pub completed_transfers: u64,
    /// Transfers that failed (the request recomputes).
    pub failed_transfers: u64,
    /// Blocks written to a lower tier's store.
    pub stored_blocks: u64,
    /// Blocks written to the device by completed or failed loads.
    pub loaded_blocks: u64,
    /// Blocks read from a store whose bytes verified against their key and
    /// checksum.
    pub verified_blocks: u64,
    /// Blocks read from a store whose bytes did not verify (each failed its
    /// transfer; never written to the device).
    pub corrupt_blocks: u64,
    /// Blocks of failed transfers.
    pub failed_blocks: u64,
    /// Bytes read from lower tiers' stores.
    pub bytes_read: u64,
    /// Bytes written to lower tiers' stores.
    pub bytes_written: u64,
    /// Blocks removed from stores because their tier evicted them.
    pub removed_blocks: u64,
    /// Times a followed tier's event stream lagged (a resync): removals in
    /// the batches it missed were not applied to the store.
    pub missed_removal_batches: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) completed_transfers: AtomicU64,
    pub(crate) failed_transfers: AtomicU64,
    pub(crate) stored_blocks: AtomicU64,
    pub(crate) loaded_blocks: AtomicU64,
    pub(crate) verified_blocks: AtomicU64,
    pub(crate) corrupt_blocks: AtomicU64,
    pub(crate) failed_blocks: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) removed_blocks: AtomicU64,
    pub(crate) missed_removal_batches: AtomicU64,
}

/// Adds `n` to a counter (relaxed: the counters are statistics, read as a
/// snapshot; the report channel orders what matters).
pub(crate) fn add(counter: &AtomicU64, n: usize) {
    counter.fetch_add(n as u64, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self) -> DataPlaneStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DataPlaneStats {
            completed_transfers: get(&self.completed_transfers),
            failed_transfers: get(&self.failed_transfers),
            stored_blocks: get(&self.stored_blocks),
            loaded_blocks: get(&self.loaded_blocks),
            verified_blocks: get(&self.verified_blocks),
            corrupt_blocks: get(&self.corrupt_blocks),
            failed_blocks: get(&self.failed_blocks),
            bytes_read: get(&self.bytes_read),
            bytes_written: get(&self.bytes_written),
            removed_blocks: get(&self.removed_blocks),
            missed_removal_batches: get(&self.missed_removal_batches),
        }
    }
}
