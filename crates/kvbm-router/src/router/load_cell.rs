//! [`LoadCell`]: one worker's last reported load, read without a lock.

use super::WorkerLoad;
use crate::sync::{AtomicU64, Mutex, Ordering, fence, lock};

/// A worker's load, written by its reports and read by every route.
///
/// A route reads every live worker's load, so a lock per read was most of
/// a route's cost among many workers (two atomic read-modify-writes a
/// worker). Reads are optimistic instead, a sequence lock: a report makes
/// the sequence odd, writes the fields and makes it even again; a read
/// takes the fields if the sequence was even and unchanged around them.
/// A read that meets a report in progress does not spin: it waits for the
/// writer's lock, as every read did before, so a writer stalled mid-report
/// delays readers exactly as long as a lock would, never longer. Reports
/// of one worker are serialized by that lock; different workers' cells
/// share nothing. (`crossbeam`'s `AtomicCell` does this for a `Copy`
/// type too, but through a global table of locks shared by every cell,
/// so reports of different workers could wait for each other, and out of
/// sight of the loom models.)
#[derive(Debug, Default)]
pub(super) struct LoadCell {
    /// Even while no report is being written.
    sequence: AtomicU64,
    active_blocks: AtomicU64,
    queued_prefill_tokens: AtomicU64,
    running_requests: AtomicU64,
    /// Held by a report throughout, and by a read that met one.
    writer: Mutex<()>,
}

impl LoadCell {
    /// Records `load`, the worker's latest report.
    pub(super) fn set(&self, load: WorkerLoad) {
        let _writing = lock(&self.writer);
        let sequence = self.sequence.load(Ordering::Relaxed);
        self.sequence
            .store(sequence.wrapping_add(1), Ordering::Relaxed);
        // The odd sequence before any field: a read that sees a new field
        // sees the sequence moved.
        fence(Ordering::Release);
        self.store(load);
        self.sequence
            .store(sequence.wrapping_add(2), Ordering::Release);
    }

    /// The last load recorded, whole (never fields of two reports).
    /// Inlined: a route reads every worker's, and a load returned through
    /// memory from a call is read back wider than it was written, a stall
    /// per worker.
    #[inline]
    pub(super) fn get(&self) -> WorkerLoad {
        let before = self.sequence.load(Ordering::Acquire);
        let load = self.fields();
        // The fields before the second look at the sequence.
        fence(Ordering::Acquire);
        if before.is_multiple_of(2) && self.sequence.load(Ordering::Relaxed) == before {
            return load;
        }
        self.get_after_report()
    }

    /// [`get`](Self::get) that met a report under way: once it is done,
    /// its fields are whole.
    #[cold]
    fn get_after_report(&self) -> WorkerLoad {
        let _writing = lock(&self.writer);
        self.fields()
    }

    fn store(&self, load: WorkerLoad) {
        (self.active_blocks).store(load.active_blocks, Ordering::Relaxed);
        (self.queued_prefill_tokens).store(load.queued_prefill_tokens, Ordering::Relaxed);
        (self.running_requests).store(load.running_requests, Ordering::Relaxed);
    }

    #[inline]
    fn fields(&self) -> WorkerLoad {
        WorkerLoad {
            active_blocks: self.active_blocks.load(Ordering::Relaxed),
            queued_prefill_tokens: self.queued_prefill_tokens.load(Ordering::Relaxed),
            running_requests: self.running_requests.load(Ordering::Relaxed),
        }
    }
}
