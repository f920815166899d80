//! [`QueueStats`]: what a queue has done since it was built.

/// Counters of everything a queue has done, read atomically with its length.
///
/// Every request that entered either is still queued or left exactly one way,
/// so at every moment
/// `enqueued + restored == dequeued + selected + removed + cancelled + cleared + len`
/// ([`is_balanced`](Self::is_balanced)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueStats {
    /// Requests queued right now.
    pub len: usize,
    /// Whether the queue is closed.
    pub closed: bool,
    /// Requests accepted by `enqueue`.
    pub enqueued: u64,
    /// Selected requests put back by `restore`.
    pub restored: u64,
    /// Requests taken by any dequeue.
    pub dequeued: u64,
    /// Requests taken by `select_batch`.
    pub selected: u64,
    /// Requests taken by `remove`.
    pub removed: u64,
    /// Requests taken by `cancel` (through a ticket or a `CancelHandle`).
    pub cancelled: u64,
    /// Requests taken by `clear`.
    pub cleared: u64,
}

impl QueueStats {
    /// Whether the counters account for every request exactly once.
    ///
    /// Summed in `u128`, so counters set by hand to any value cannot overflow.
    pub fn is_balanced(&self) -> bool {
        let entered = u128::from(self.enqueued) + u128::from(self.restored);
        let left = [
            self.dequeued,
            self.selected,
            self.removed,
            self.cancelled,
            self.cleared,
        ]
        .into_iter()
        .map(u128::from)
        .sum::<u128>();
        entered == left + self.len as u128
    }
}
