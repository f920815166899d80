//! Splitting trace blocks into chained sub-blocks.

use super::*;
use crate::TraceRequest;

fn trace(requests: &[(u64, &[u64])]) -> Trace {
    Trace::from_requests(
        requests
            .iter()
            .map(|&(input_length, ids)| TraceRequest {
                timestamp: 0,
                input_length,
                output_length: 1,
                hash_ids: ids.to_vec(),
                priority: None,
            })
            .collect(),
    )
    .unwrap()
}

fn values(workload: &Workload, index: usize) -> Vec<u128> {
    workload
        .get(index)
        .unwrap()
        .blocks
        .iter()
        .map(|hash| hash.value())
        .collect()
}

#[test]
fn block_sizes_must_divide_512() {
    let trace = trace(&[(10, &[1])]);
    for block_size in [0, 3, 24, 384, 1024, 513] {
        match Workload::new(&trace, block_size) {
            Err(SimError::InvalidBlockSize { block_size: got }) => assert_eq!(got, block_size),
            other => panic!("block size {block_size}: {other:?}"),
        }
    }
    for shift in 0..=9 {
        assert!(Workload::new(&trace, 1 << shift).is_ok());
    }
}

#[test]
fn every_request_has_ceil_input_over_block_size_blocks() {
    let excerpt = Trace::conversation_excerpt().unwrap();
    for block_size in [512, 256, 64, 16] {
        let workload = Workload::new(&excerpt, block_size).unwrap();
        assert_eq!(workload.len(), excerpt.len());
        assert_eq!(workload.input_tokens(), 7_124_855);
        let mut total = 0;
        for (request, raw) in workload.requests().zip(excerpt.requests()) {
            let expected = raw.input_length.div_ceil(block_size as u64) as usize;
            assert_eq!(request.blocks.len(), expected);
            assert_eq!(request.input_tokens, raw.input_length);
            assert_eq!(request.output_tokens, raw.output_length);
            assert_eq!(request.arrival_ms, raw.timestamp);
            total += expected;
        }
        assert_eq!(workload.total_blocks(), total);
    }
}

#[test]
fn the_partial_last_trace_block_keeps_only_sub_blocks_with_tokens() {
    // 512 + 88 tokens at block size 128: four sub-blocks, then one partial.
    let workload = Workload::new(&trace(&[(600, &[1, 2])]), 128).unwrap();
    assert_eq!(workload.get(0).unwrap().blocks.len(), 5);
    // Exactly full: 512 + 256 at 128 is 4 + 2.
    let workload = Workload::new(&trace(&[(768, &[1, 2])]), 128).unwrap();
    assert_eq!(workload.get(0).unwrap().blocks.len(), 6);
}

#[test]
fn hashes_chain_with_positions_and_parents() {
    let workload = Workload::new(&trace(&[(1500, &[4, 5, 6])]), 256).unwrap();
    let blocks = workload.get(0).unwrap().blocks;
    assert_eq!(blocks.len(), 6);
    assert!(blocks[0].is_root());
    for (position, pair) in blocks.windows(2).enumerate() {
        assert_eq!(pair[1].parent(), Some(pair[0].value()));
        assert_eq!(pair[1].position() as usize, position + 1);
    }
    // The documented derivation, step by step.
    let mut parent = 0;
    let mut expected = Vec::new();
    for id in [4, 5, 6] {
        for sub in 0..2 {
            parent = sub_block_value(parent, id, sub);
            expected.push(parent);
        }
    }
    assert_eq!(values(&workload, 0), expected);
    assert_eq!(SUB_BLOCK_SEED.to_le_bytes(), *b"kvbm-sim");
}

#[test]
fn a_sub_block_matches_only_with_its_whole_prefix() {
    let workload = Workload::new(
        &trace(&[
            (1024, &[1, 2]),
            (1024, &[1, 3]),
            (1024, &[9, 2]),
            (1024, &[1, 2]),
        ]),
        256,
    )
    .unwrap();
    let (a, b, c, d) = (
        values(&workload, 0),
        values(&workload, 1),
        values(&workload, 2),
        values(&workload, 3),
    );
    assert_eq!(a, d, "the same ids give the same chain");
    assert_eq!(a[..2], b[..2], "a shared first trace block is shared");
    assert!(a[2..].iter().all(|value| !b.contains(value)));
    // Same trace id 2 in second place, after a different first block.
    assert!(a.iter().all(|value| !c.contains(value)));
    assert_eq!(workload.distinct_blocks(), 4 + 2 + 4);
}

#[test]
fn distinct_blocks_of_the_excerpt() {
    // 11,879 distinct prefix chains, counted independently (PROVENANCE.md).
    let excerpt = Trace::conversation_excerpt().unwrap();
    assert_eq!(
        Workload::new(&excerpt, 512).unwrap().distinct_blocks(),
        11_879
    );
}

#[test]
fn debug_is_a_summary() {
    let workload = Workload::new(&trace(&[(10, &[1])]), 16).unwrap();
    let debug = format!("{workload:?}");
    assert!(debug.contains("block_size: 16") && debug.contains("blocks: 1"));
}
