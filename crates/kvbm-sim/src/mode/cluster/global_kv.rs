//! Mooncake's global cache-aware scheduling, and the index of the pool it
//! reads: [`GlobalKv`] sends each request where its time to first token
//! looks shortest, counting a prefix cached in the cluster's shared pool
//! (the `REMOTE` tier every engine offloads to and loads from) as
//! available to every engine at the network's cost.
//!
//! Mooncake (Qin et al., FAST '25, Algorithm 1) estimates, per prefill
//! instance: its queueing time, the prefill time of what it does not have
//! cached, and the time to fetch the longest prefix cached anywhere when
//! that is longer than its own; the request goes to the instance with the
//! smallest sum. That is this policy, with the queueing time from the
//! prompt tokens an engine has queued and not prefilled, and the prefill
//! and fetch times from the replay's step and link models.

use std::sync::Arc;

use kvbm_blocks::{CacheEvent, EventMessage};
use kvbm_events::WireFormat;
use kvbm_router::{Candidate, Policy, PrefixIndex, RouteRequest, block_key};

use crate::{EventSink, SimError};

/// The pool's blocks in the global index, under this pseudo-worker.
const POOL: u64 = 0;

/// Feeds the shared pool's cache events into the global index.
pub(super) struct GlobalFeed<'a> {
    pub(super) index: &'a PrefixIndex,
    pub(super) format: &'a WireFormat,
}

impl EventSink for GlobalFeed<'_> {
    fn publish(&mut self, message: &EventMessage) -> Result<(), SimError> {
        let key = |&value: &u128| block_key(&self.format.hash_value(value));
        match message {
            EventMessage::Batch(batch) => {
                for event in batch.events() {
                    match event {
                        CacheEvent::Stored { hashes, .. } => {
                            self.index.insert_many(POOL, hashes.iter().map(key));
                        }
                        CacheEvent::Removed { hashes } => {
                            self.index.remove_many(POOL, hashes.iter().map(key));
                        }
                        CacheEvent::Cleared => {
                            self.index.remove_worker(POOL);
                        }
                    }
                }
            }
            // The subscription's first message, of a pool still empty; a
            // later one (after lost events) forgets what it cannot list.
            EventMessage::Resync(_) => {
                self.index.remove_worker(POOL);
            }
        }
        Ok(())
    }
}

/// The costs [`GlobalKv`] estimates with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct GlobalCosts {
    /// Seconds to prefill one token.
    pub(super) prefill_token_s: f64,
    /// Seconds per fetch from the pool, whatever its size.
    pub(super) fetch_setup_s: f64,
    /// Seconds per block fetched from the pool.
    pub(super) fetch_block_s: f64,
}

/// Mooncake's global cache-aware policy (see the module docs).
#[derive(Debug)]
pub(crate) struct GlobalKv {
    index: Arc<PrefixIndex>,
    costs: GlobalCosts,
}

impl GlobalKv {
    pub(super) fn new(index: Arc<PrefixIndex>, costs: GlobalCosts) -> Self {
        Self { index, costs }
    }

    /// The estimated time to first token on `candidate` when the pool holds
    /// the request's first `pooled` blocks.
    fn ttft(&self, request: &RouteRequest<'_>, candidate: &Candidate, pooled: usize) -> f64 {
        let costs = &self.costs;
        let block_size = request.block_size.max(1) as f64;
        let own = candidate.overlap_blocks as f64 + candidate.tier_credit.max(0.0);
        let (cached, fetch) = if pooled as f64 > own {
            let fetched = pooled as f64 - own;
            (
                pooled as f64,
                costs.fetch_setup_s + fetched * costs.fetch_block_s,
            )
        } else {
            (own, 0.0)
        };
        let compute = (request.prompt_tokens as f64 - cached * block_size).max(0.0);
        let queue = candidate.load.queued_prefill_tokens as f64;
        (queue + compute) * costs.prefill_token_s + fetch
    }
}

impl Policy for GlobalKv {
    fn name(&self) -> &str {
        "global-kv"
    }

    fn choose(&mut self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<usize> {
        let pooled = (self.index.overlaps(request.keys).first()).map_or(0, |&(_, depth)| depth);
        // The shortest estimate; ties to the engine with the least active
        // KV (the one whose decodes slow its steps least), then the first.
        (candidates.iter().enumerate())
            .map(|(i, c)| (self.ttft(request, c, pooled), c.load.active_blocks, i))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)))
            .map(|(_, _, i)| i)
    }
}

#[cfg(test)]
mod tests {
    use kvbm_router::WorkerLoad;

    use super::*;

    fn candidate(worker: u64, overlap: usize, queued: u64) -> Candidate {
        Candidate::new(worker, overlap, WorkerLoad::new(0, queued, 0))
    }

    #[test]
    fn a_pooled_prefix_makes_an_idle_engine_beat_a_busy_one_that_holds_it() {
        let index = Arc::new(PrefixIndex::new());
        let costs = GlobalCosts {
            prefill_token_s: 1e-4,
            fetch_setup_s: 1e-5,
            fetch_block_s: 1e-5,
        };
        let mut policy = GlobalKv::new(Arc::clone(&index), costs);
        let keys = [1, 2, 3, 4];
        let request = RouteRequest::new(&keys, 64, 16);
        // Engine 0 holds the prefix but has 10k tokens queued; engine 1 is
        // idle and cold.
        let candidates = [candidate(0, 4, 10_000), candidate(1, 0, 0)];
        assert_eq!(
            policy.choose(&request, &candidates),
            Some(1),
            "compute beats queueing"
        );
        // With the prefix in the pool, engine 1 fetches it instead.
        index.insert_many(POOL, [1, 2, 3]);
        let fetch = policy.ttft(&request, &candidates[1], 3);
        assert!(fetch < policy.ttft(&request, &candidates[1], 0));
        assert_eq!(policy.choose(&request, &candidates), Some(1));
        // Equally idle: the one holding it wins.
        let even = [candidate(0, 4, 0), candidate(1, 0, 0)];
        assert_eq!(policy.choose(&request, &even), Some(0));
    }
}
