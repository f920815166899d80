//! [`Roster`]: the live workers in order, each with its last reported load
//! beside it.

use super::load_cell::LoadCell;
use super::{WorkerId, WorkerLoad};

/// The live workers, sorted, and their loads in a parallel array, each in a
/// cell of its own.
///
/// A route reads every worker's load, so the loads sit together: one pass
/// over two arrays, where a lookup per worker in the workers map cost a
/// hash, a shard lock and a cache miss each, the cost that grew with the
/// fleet. A load report writes only its own worker's cell, under the
/// roster's read lock, so reports of different workers never wait for
/// each other, and a route reads the cells without locking them
/// ([`LoadCell`]).
#[derive(Debug, Default)]
pub(super) struct Roster {
    ids: Vec<WorkerId>,
    loads: Vec<LoadCell>,
}

impl Roster {
    /// The live workers, ascending.
    pub(super) fn ids(&self) -> &[WorkerId] {
        &self.ids
    }

    /// Where `worker` is (`Ok`), or where it would go (`Err`).
    pub(super) fn find(&self, worker: WorkerId) -> Result<usize, usize> {
        self.ids.binary_search(&worker)
    }

    /// Lists `worker`, with no load reported, at `at` (from
    /// [`find`](Self::find)'s `Err`).
    pub(super) fn insert(&mut self, at: usize, worker: WorkerId) {
        self.ids.insert(at, worker);
        self.loads.insert(at, LoadCell::default());
    }

    /// Unlists the worker at `at` (from [`find`](Self::find)'s `Ok`).
    pub(super) fn remove(&mut self, at: usize) {
        self.ids.remove(at);
        self.loads.remove(at);
    }

    /// `worker`'s load cell; `None` unless it is live.
    pub(super) fn load(&self, worker: WorkerId) -> Option<&LoadCell> {
        self.find(worker).ok().and_then(|at| self.loads.get(at))
    }

    /// Every live worker with its load cell, ascending.
    pub(super) fn cells(&self) -> impl Iterator<Item = (WorkerId, &LoadCell)> + '_ {
        self.ids.iter().copied().zip(&self.loads)
    }

    /// Every live worker with its load, ascending.
    pub(super) fn loads(&self) -> impl Iterator<Item = (WorkerId, WorkerLoad)> + '_ {
        self.cells().map(|(worker, cell)| (worker, cell.get()))
    }
}
