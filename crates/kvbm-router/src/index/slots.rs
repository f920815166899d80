//! [`Slots`]: workers numbered densely, so a block's holders can be bits.

use std::collections::HashMap;

use foldhash::fast::RandomState;

use crate::WorkerId;

/// Worker ids to small dense numbers and back. A departed worker's number
/// is given to the next newcomer, lowest first, so numbers stay below the
/// count of workers ever present at once (and most fit a block's inline
/// mask).
#[derive(Debug, Default)]
pub(super) struct Slots {
    of: HashMap<WorkerId, usize, RandomState>,
    workers: Vec<Option<WorkerId>>,
}

impl Slots {
    /// `worker`'s number, if it has one.
    pub(super) fn get(&self, worker: WorkerId) -> Option<usize> {
        self.of.get(&worker).copied()
    }

    /// The worker numbered `slot`.
    pub(super) fn worker(&self, slot: usize) -> Option<WorkerId> {
        self.workers.get(slot).copied().flatten()
    }

    /// `worker`'s number, giving it the lowest free one if it has none.
    pub(super) fn assign(&mut self, worker: WorkerId) -> usize {
        if let Some(slot) = self.get(worker) {
            return slot;
        }
        let slot = match self.workers.iter().position(Option::is_none) {
            Some(free) => {
                self.workers[free] = Some(worker);
                free
            }
            None => {
                self.workers.push(Some(worker));
                self.workers.len() - 1
            }
        };
        self.of.insert(worker, slot);
        slot
    }

    /// Frees `worker`'s number; which it was.
    pub(super) fn release(&mut self, worker: WorkerId) -> Option<usize> {
        let slot = self.of.remove(&worker)?;
        if let Some(entry) = self.workers.get_mut(slot) {
            *entry = None;
        }
        while self.workers.last() == Some(&None) {
            self.workers.pop();
        }
        Some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_dense_and_reused_lowest_first() {
        let mut slots = Slots::default();
        assert_eq!([10, 20, 30].map(|w| slots.assign(w)), [0, 1, 2]);
        assert_eq!(slots.assign(20), 1, "a worker keeps its number");
        assert_eq!(slots.release(10), Some(0));
        assert_eq!(slots.release(20), Some(1));
        assert_eq!(slots.release(20), None);
        assert_eq!(slots.assign(40), 0);
        assert_eq!(slots.worker(0), Some(40));
        assert_eq!(slots.worker(1), None);
        assert_eq!(slots.release(30), Some(2));
        assert_eq!(slots.workers.len(), 1, "trailing free numbers are dropped");
    }
}
