//! Cache mode on hand-made requests whose outcome can be worked out by hand.

use super::*;
use crate::{Trace, TraceRequest};

/// A workload at block size 512 where each request lists its trace ids.
fn workload(requests: &[&[u64]]) -> Workload {
    let requests = requests
        .iter()
        .map(|ids| TraceRequest {
            timestamp: 0,
            input_length: 512 * ids.len() as u64,
            output_length: 1,
            hash_ids: ids.to_vec(),
            priority: None,
        })
        .collect();
    Workload::new(&Trace::from_requests(requests).unwrap(), 512).unwrap()
}

fn replay_all(sim: &mut CacheSim, workload: &Workload) -> Vec<RequestOutcome> {
    workload
        .requests()
        .map(|request| sim.replay_request(&request).unwrap())
        .collect()
}

fn outcome(hit: usize, stored: usize, uncached: usize) -> RequestOutcome {
    RequestOutcome {
        hit_blocks: hit,
        stored_blocks: stored,
        uncached_blocks: uncached,
    }
}

#[test]
fn release_is_tail_first_so_lru_evicts_chain_ends() {
    // Three blocks: A fills the cache, B needs one block, A comes back.
    let workload = workload(&[&[1, 2, 3], &[7], &[1, 2, 3]]);
    let mut sim = CacheSim::new(512, 3, Eviction::Lru).unwrap();
    let outcomes = replay_all(&mut sim, &workload);
    // B evicted A's deepest block (3), not its root: A's return finds 1, 2.
    // Released head first, B would have evicted 1 and A would find nothing.
    assert_eq!(
        outcomes,
        [outcome(0, 3, 0), outcome(0, 1, 0), outcome(2, 1, 0)]
    );
    // A's return evicted B's block for its own tail.
    assert_eq!(sim.evictions(), 2);
    let a = workload.get(0).unwrap().blocks;
    assert!(a.iter().all(|&hash| sim.contains(hash)));
}

#[test]
fn hits_pin_the_prefix_while_misses_evict_around_it() {
    // Capacity 4. A = 1 2 3 4 fills it. B = 1 2 5 6 hits 1 2 and must evict
    // two of A's blocks for 5 6: the pinned 1 2 are safe, 4 then 3 go.
    let workload = workload(&[&[1, 2, 3, 4], &[1, 2, 5, 6], &[1, 2, 3]]);
    let mut sim = CacheSim::new(512, 4, Eviction::Lru).unwrap();
    let outcomes = replay_all(&mut sim, &workload);
    assert_eq!(outcomes[1], outcome(2, 2, 0));
    assert_eq!(outcomes[2], outcome(2, 1, 0));
    let report = sim.report();
    assert_eq!(report.hits.hit_blocks, 4);
    assert_eq!(report.evictions, 3);
}

#[test]
fn a_request_larger_than_the_cache_stores_the_prefix_that_fits() {
    let workload = workload(&[&[1, 2, 3], &[1, 2, 3]]);
    let mut sim = CacheSim::new(512, 2, Eviction::Lru).unwrap();
    let outcomes = replay_all(&mut sim, &workload);
    assert_eq!(outcomes, [outcome(0, 2, 1), outcome(2, 0, 1)]);
    let report = sim.report();
    assert_eq!((report.oversized_requests, report.uncached_blocks), (2, 2));
    assert_eq!(report.evictions, 0);
}

#[test]
fn the_pool_accounts_for_every_block_after_every_request() {
    let excerpt = Workload::new(&Trace::conversation_excerpt().unwrap(), 512).unwrap();
    for eviction in Eviction::ALL {
        let mut sim = CacheSim::new(512, 700, eviction).unwrap();
        let mut stored = 0;
        for (index, request) in excerpt.requests().enumerate() {
            stored += sim.replay_request(&request).unwrap().stored_blocks;
            if index % 50 == 0 || index + 1 == excerpt.len() {
                let occupancy = sim.audit().unwrap();
                assert_eq!(occupancy.total_blocks, 700);
                assert_eq!(occupancy.in_use_blocks, 0, "{eviction} after {index}");
                assert_eq!(occupancy.cached_blocks + occupancy.free_blocks, 700);
                // Nothing was ever freed except by eviction: the cache is full
                // once it has stored more than it holds.
                if stored >= 700 {
                    assert_eq!(occupancy.free_blocks, 0, "{eviction} after {index}");
                }
            }
        }
    }
}

#[test]
fn capacities_resolve_to_blocks_or_refuse() {
    let workload = workload(&[&[1, 2], &[1, 3]]);
    assert_eq!(Capacity::Blocks(7).resolve(&workload).unwrap(), 7);
    assert_eq!(Capacity::Tokens(1500).resolve(&workload).unwrap(), 2);
    assert_eq!(Capacity::Unbounded.resolve(&workload).unwrap(), 3);
    for zero in [
        Capacity::Blocks(0),
        Capacity::Tokens(0),
        Capacity::Tokens(511),
    ] {
        match zero.resolve(&workload) {
            Err(SimError::ZeroCapacity { block_size, .. }) => assert_eq!(block_size, 512),
            other => panic!("{zero}: {other:?}"),
        }
    }
    assert!(matches!(
        Capacity::Blocks(u64::MAX).resolve(&workload),
        Err(SimError::CapacityTooLarge { .. })
    ));
    assert!(matches!(
        CacheConfig::new(Capacity::Blocks(0), Eviction::Lru).run(&workload),
        Err(SimError::ZeroCapacity { .. })
    ));
}

#[test]
fn the_json_report_has_the_documented_fields() {
    let workload = workload(&[&[1, 2], &[1, 3]]);
    let report = CacheConfig::default().run(&workload).unwrap();
    let json = report.to_json();
    for (field, value) in [
        ("requests", 2),
        ("input_blocks", 4),
        ("hit_blocks", 1),
        ("input_tokens", 2048),
        ("hit_tokens", 512),
        ("preemptions", 0),
        ("evictions", 0),
        ("capacity_blocks", 3),
    ] {
        assert_eq!(json[field], value, "{field}");
    }
    assert_eq!(json["mode"], "cache");
    assert_eq!(json["eviction"], "lru");
    assert_eq!(json["unbounded"], true);
    assert_eq!(json["block_hit_rate"], 0.25);
    let text = report.to_string();
    assert!(text.contains("capacity unbounded (3 blocks)"), "{text}");
    assert!(text.contains("25.00%"), "{text}");
}

/// A host tier below a 3-block cache: a prompt pushed out of the cache
/// comes back from the host, counted as a hit and under the host tier;
/// without tiers the JSON report has no `tiers`.
#[test]
fn a_host_tier_serves_what_the_cache_evicted() {
    let workload = workload(&[&[1, 2, 3], &[7, 8, 9], &[1, 2, 3]]);
    let plain = CacheConfig::new(Capacity::Blocks(3), Eviction::Lru)
        .run(&workload)
        .unwrap();
    assert_eq!(plain.hits.hit_blocks, 0);
    assert!(plain.to_json().get("tiers").is_none());
    let tiers = CacheTiers::default().with_host_tokens(8 * 512);
    let host = CacheConfig::new(Capacity::Blocks(3), Eviction::Lru)
        .with_tiers(tiers)
        .run(&workload)
        .unwrap();
    assert_eq!(
        host.hits.hit_blocks, 3,
        "the whole first prompt, from the host"
    );
    let served = host.tiers.unwrap().host.unwrap();
    assert_eq!((served.hit_blocks, served.hit_tokens), (3, 3 * 512));
    assert_eq!(
        served.stored_blocks, 6,
        "write-through: every computed block"
    );
    assert_eq!(host.to_json()["tiers"]["host"]["hit_blocks"], 3);
}

#[test]
fn cache_tiers_that_cannot_exist_are_refused() {
    let workload = workload(&[&[1]]);
    // Less than one 512-token block.
    let tiers = CacheTiers::default().with_host_tokens(100);
    let err = CacheConfig::new(Capacity::Blocks(3), Eviction::Lru)
        .with_tiers(tiers)
        .run(&workload)
        .unwrap_err();
    assert!(matches!(err, SimError::InvalidTiers(_)), "{err}");
}
