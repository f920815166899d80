//! Bounded cache mode against a reference model of an LRU prefix cache, on
//! small random traces; and properties every eviction policy must keep.

use std::collections::{BTreeMap, HashMap};

use kvbm_sim::{CacheSim, Eviction, RequestOutcome, Trace, TraceRequest, Workload};
use proptest::prelude::*;

/// Where the model keeps a block.
#[derive(Clone, Copy, Debug)]
enum Place {
    /// Cached since this release tick.
    Cached(u64),
    /// Pinned by the current request.
    Pinned,
}

/// An LRU prefix cache written the obvious way: a map from hash to place and
/// an ordered map from release tick to hash.
struct LruModel {
    capacity: usize,
    free: usize,
    places: HashMap<u128, Place>,
    by_tick: BTreeMap<u64, u128>,
    tick: u64,
    evictions: u64,
}

impl LruModel {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            free: capacity,
            places: HashMap::new(),
            by_tick: BTreeMap::new(),
            tick: 0,
            evictions: 0,
        }
    }

    fn pin(&mut self, hash: u128) -> bool {
        match self.places.get(&hash) {
            Some(&Place::Cached(tick)) => {
                self.by_tick.remove(&tick);
                self.places.insert(hash, Place::Pinned);
                true
            }
            Some(Place::Pinned) => panic!("hash {hash:#x} twice in one request"),
            None => false,
        }
    }

    fn request(&mut self, hashes: &[u128]) -> RequestOutcome {
        let mut held = Vec::new();
        for &hash in hashes {
            if !self.pin(hash) {
                break;
            }
            held.push(hash);
        }
        let hit = held.len();
        let misses = &hashes[hit..];
        let stored = misses.len().min(self.capacity - hit);
        // Free blocks first, then the least recently released.
        let from_free = stored.min(self.free);
        self.free -= from_free;
        for _ in from_free..stored {
            let (_, victim) = self.by_tick.pop_first().expect("an evictable block");
            self.places.remove(&victim);
            self.evictions += 1;
        }
        for &hash in &misses[..stored] {
            // Already cached deeper in the chain: use that block, free ours.
            if self.pin(hash) {
                self.free += 1;
            } else {
                self.places.insert(hash, Place::Pinned);
            }
            held.push(hash);
        }
        for &hash in held.iter().rev() {
            self.tick += 1;
            self.by_tick.insert(self.tick, hash);
            self.places.insert(hash, Place::Cached(self.tick));
        }
        let mut outcome = RequestOutcome::default();
        outcome.hit_blocks = hit;
        outcome.stored_blocks = stored;
        outcome.uncached_blocks = misses.len() - stored;
        outcome
    }
}

/// Up to 24 requests of 1 to 6 trace blocks over a 3-id alphabet (lots of
/// shared prefixes), each with a random partial last block.
fn traces() -> impl Strategy<Value = Trace> {
    prop::collection::vec((prop::collection::vec(0u64..3, 1..=6), 1u64..=512), 1..=24).prop_map(
        |requests| {
            let requests = requests
                .into_iter()
                .enumerate()
                .map(|(index, (hash_ids, last))| TraceRequest {
                    timestamp: index as u64,
                    input_length: 512 * (hash_ids.len() as u64 - 1) + last,
                    output_length: 1,
                    hash_ids,
                    priority: None,
                })
                .collect();
            Trace::from_requests(requests).expect("consistent by construction")
        },
    )
}

fn block_sizes() -> impl Strategy<Value = usize> {
    prop::sample::select(vec![512usize, 256, 128])
}

proptest! {
    #[test]
    fn lru_cache_mode_matches_the_model(
        trace in traces(),
        block_size in block_sizes(),
        capacity in 1usize..=24,
    ) {
        let workload = Workload::new(&trace, block_size).unwrap();
        let mut sim = CacheSim::new(block_size, capacity, Eviction::Lru).unwrap();
        let mut model = LruModel::new(capacity);
        for (index, request) in workload.requests().enumerate() {
            let hashes: Vec<u128> = request.blocks.iter().map(|hash| hash.value()).collect();
            let expected = model.request(&hashes);
            let got = sim.replay_request(&request).unwrap();
            prop_assert_eq!(got, expected, "request {}", index);
            prop_assert_eq!(sim.evictions(), model.evictions, "request {}", index);
        }
        let occupancy = sim.audit().unwrap();
        prop_assert_eq!(occupancy.in_use_blocks, 0);
        prop_assert_eq!(occupancy.cached_blocks, model.by_tick.len());
        prop_assert_eq!(occupancy.free_blocks, model.free);
    }

    #[test]
    fn no_policy_beats_the_unbounded_cache_request_by_request(
        trace in traces(),
        block_size in block_sizes(),
        capacity in 1usize..=24,
    ) {
        let workload = Workload::new(&trace, block_size).unwrap();
        let distinct = workload.distinct_blocks();
        let mut unbounded = CacheSim::new(block_size, distinct, Eviction::Lru).unwrap();
        let ceilings: Vec<usize> = workload
            .requests()
            .map(|request| unbounded.replay_request(&request).unwrap().hit_blocks)
            .collect();
        prop_assert_eq!(unbounded.evictions(), 0);
        for eviction in Eviction::ALL {
            let mut sim = CacheSim::new(block_size, capacity, eviction).unwrap();
            for (request, &ceiling) in workload.requests().zip(&ceilings) {
                let outcome = sim.replay_request(&request).unwrap();
                prop_assert!(outcome.hit_blocks <= ceiling, "{}", eviction);
                prop_assert_eq!(
                    outcome.hit_blocks + outcome.stored_blocks + outcome.uncached_blocks,
                    request.blocks.len()
                );
                if capacity >= distinct {
                    prop_assert_eq!(outcome.hit_blocks, ceiling, "{}", eviction);
                }
            }
            let occupancy = sim.audit().unwrap();
            prop_assert_eq!(occupancy.in_use_blocks, 0);
            prop_assert_eq!(occupancy.cached_blocks + occupancy.free_blocks, capacity);
            if capacity >= distinct {
                prop_assert_eq!(sim.evictions(), 0);
            }
        }
    }
}
