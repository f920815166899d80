//! [`Router::audit`]: the router's state cross-checked, for tests and
//! diagnostics.

use super::Router;
use crate::RouterError;
use crate::sync::lock;

/// What [`Router::audit`] counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouterAudit {
    /// Live workers.
    pub workers: usize,
    /// Blocks they hold, on every medium (a block held by two workers, or
    /// on two media, counts twice).
    pub held_blocks: usize,
    /// Media with a slot, the device medium included.
    pub media: usize,
}

impl Router {
    /// Cross-checks the router's state under its locks, so it holds at any
    /// moment, however many threads are applying events, routing, or
    /// adding and removing workers: the live workers are sorted and
    /// distinct, exactly they have counters and a set in the index, and
    /// each one's [`held_blocks`](crate::WorkerStats::held_blocks) is what
    /// the index holds for it. O(workers); a diagnostic for tests and
    /// leak hunts, not the routing path.
    ///
    /// # Errors
    ///
    /// [`RouterError::InvariantViolated`] naming the first inconsistency,
    /// which would be a bug in this crate (or a change made to the index
    /// through [`Router::index`]).
    pub fn audit(&self) -> Result<RouterAudit, RouterError> {
        let fail = |what: String| Err(RouterError::InvariantViolated(what));
        // Held throughout: no worker comes or goes meanwhile.
        let roster = self.order_read();
        let order = roster.ids();
        if let Some(pair) = order.windows(2).find(|pair| pair[0] >= pair[1]) {
            return fail(format!(
                "live workers out of order: {} then {}",
                pair[0], pair[1]
            ));
        }
        let indexed = self.index.worker_ids();
        if indexed != order {
            return fail(format!(
                "the index has sets for workers {indexed:?}, the live workers are {order:?}"
            ));
        }
        if self.workers.len() != order.len() {
            return fail(format!(
                "{} workers have counters, {} are live",
                self.workers.len(),
                order.len()
            ));
        }
        let mut held_blocks = 0;
        for &worker in order.iter() {
            let Some(state) = self.workers.get(worker) else {
                return fail(format!("live worker {worker} has no counters"));
            };
            // The tally held across the look at the index, as the event
            // path holds it across the update it counts.
            let tally = lock(&state.tally);
            let (counted, held) = (tally.stats.held_blocks, self.index.held(worker));
            drop(tally);
            if counted != held {
                return fail(format!(
                    "worker {worker} holds {held} blocks in the index, its counters say {counted}"
                ));
            }
            held_blocks += held;
        }
        Ok(RouterAudit {
            workers: order.len(),
            held_blocks,
            media: self.index.media().len(),
        })
    }
}
