//! Cache mode against an independent, straightforward reimplementation: a
//! set of every prefix chain seen so far, with no kvbm type in sight.

use std::collections::HashSet;

use kvbm_sim::{CacheConfig, Capacity, Eviction, Trace, Workload};

/// What the reference counts.
#[derive(Debug, PartialEq, Eq)]
struct Counts {
    input_blocks: u64,
    hit_blocks: u64,
    input_tokens: u64,
    hit_tokens: u64,
}

/// A block is named by the trace ids up to and including its trace block,
/// plus its sub-block index within that trace block; it hits when it and
/// every block before it in the request were seen in an earlier request.
fn reference(trace: &Trace, block_size: u64) -> Counts {
    let per_trace_block = 512 / block_size;
    let mut seen: HashSet<(Vec<u64>, u64)> = HashSet::new();
    let mut counts = Counts {
        input_blocks: 0,
        hit_blocks: 0,
        input_tokens: 0,
        hit_tokens: 0,
    };
    for request in trace.requests() {
        let wanted = request.input_length.div_ceil(block_size);
        let mut keys = Vec::new();
        for (index, _) in request.hash_ids.iter().enumerate() {
            for sub in 0..per_trace_block {
                if keys.len() as u64 == wanted {
                    break;
                }
                keys.push((request.hash_ids[..=index].to_vec(), sub));
            }
        }
        let hits = keys.iter().take_while(|key| seen.contains(*key)).count() as u64;
        counts.input_blocks += keys.len() as u64;
        counts.hit_blocks += hits;
        counts.input_tokens += request.input_length;
        counts.hit_tokens += (hits * block_size).min(request.input_length);
        seen.extend(keys);
    }
    counts
}

fn simulated(workload: &Workload, eviction: Eviction) -> Counts {
    let report = CacheConfig::new(Capacity::Unbounded, eviction)
        .run(workload)
        .unwrap();
    assert_eq!(report.evictions, 0, "an unbounded cache never evicts");
    assert_eq!(report.oversized_requests, 0);
    Counts {
        input_blocks: report.hits.input_blocks,
        hit_blocks: report.hits.hit_blocks,
        input_tokens: report.hits.input_tokens,
        hit_tokens: report.hits.hit_tokens,
    }
}

#[test]
fn unbounded_cache_mode_matches_the_reference_on_the_excerpt() {
    let trace = Trace::conversation_excerpt().unwrap();
    let expected = reference(&trace, 512);
    // The numbers themselves, as PROVENANCE.md states them.
    assert_eq!(
        expected,
        Counts {
            input_blocks: 14_162,
            hit_blocks: 2_283,
            input_tokens: 7_124_855,
            hit_tokens: 1_167_589,
        }
    );
    let workload = Workload::new(&trace, 512).unwrap();
    for eviction in Eviction::ALL {
        assert_eq!(simulated(&workload, eviction), expected, "{eviction}");
    }
}

#[test]
fn sub_blocks_match_the_reference_at_smaller_block_sizes() {
    let trace = Trace::conversation_excerpt().unwrap();
    for block_size in [256, 64, 16] {
        let workload = Workload::new(&trace, block_size as usize).unwrap();
        let expected = reference(&trace, block_size);
        assert_eq!(
            simulated(&workload, Eviction::Lru),
            expected,
            "{block_size}"
        );
        assert!(expected.hit_blocks > 0);
    }
}

#[test]
fn a_cache_as_large_as_the_workload_is_unbounded() {
    let trace = Trace::conversation_excerpt().unwrap();
    let workload = Workload::new(&trace, 512).unwrap();
    let distinct = workload.distinct_blocks() as u64;
    let expected = reference(&trace, 512);
    for eviction in Eviction::ALL {
        let report = CacheConfig::new(Capacity::Blocks(distinct), eviction)
            .run(&workload)
            .unwrap();
        assert_eq!(report.hits.hit_blocks, expected.hit_blocks, "{eviction}");
        assert_eq!(report.evictions, 0);
        let tokens = CacheConfig::new(Capacity::Tokens(distinct * 512 + 511), eviction)
            .run(&workload)
            .unwrap();
        assert_eq!(tokens.capacity_blocks as u64, distinct);
        assert_eq!(tokens.hits, report.hits);
    }
}
