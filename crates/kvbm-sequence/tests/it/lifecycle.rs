//! Whole request lifecycles against a real pool: prefix sharing between
//! requests, deduplication, preemption under pressure, speculative rollback.

use kvbm_blocks::BlockId;

use crate::{audit, manager, request};

/// Prefills `seq` the way a scheduler does: match, allocate the rest plus the
/// partial tail's block, register the full blocks.
fn prefill(
    seq: &mut kvbm_sequence::RequestSequence<crate::Gpu>,
    m: &kvbm_blocks::BlockManager<crate::Gpu>,
) -> usize {
    let hits = seq.match_and_add_prefix(m).unwrap();
    let needed = seq.additional_blocks_needed(seq.total_tokens() + 1);
    seq.allocate_blocks(needed, m).unwrap();
    seq.complete_and_register_pending(m).unwrap();
    hits
}

/// Decodes `count` tokens, registering each block as it fills.
fn decode(
    seq: &mut kvbm_sequence::RequestSequence<crate::Gpu>,
    m: &kvbm_blocks::BlockManager<crate::Gpu>,
    count: u32,
) {
    for token in 0..count {
        if seq.append_token(1000 + token).unwrap().is_some() {
            seq.complete_and_register_pending(m).unwrap();
            seq.allocate_blocks(1, m).unwrap();
        }
    }
}

#[test]
fn the_second_request_with_a_shared_prompt_reuses_the_cached_prefix() {
    let m = manager(32);
    let system: Vec<u32> = (0..12).collect(); // three full blocks
    let first_prompt = [&system[..], &[50, 51, 52, 53, 54]].concat();
    let second_prompt = [&system[..], &[60, 61]].concat();

    let mut first = request(&first_prompt, 8);
    assert_eq!(prefill(&mut first, &m), 0);
    let first_pages: Vec<BlockId> = first.block_ids().collect();
    decode(&mut first, &m, 8);
    assert!(first.is_complete());
    first.release();
    let after_first = audit(&m);
    assert_eq!(after_first.in_use_blocks(), 0);
    assert_eq!(
        after_first.inactive_blocks, 6,
        "4 prompt blocks and 2 generated ones cached"
    );

    let mut second = request(&second_prompt, 4);
    let before = m.metrics();
    assert_eq!(prefill(&mut second, &m), 3);
    assert_eq!(second.prefix_matched_blocks(), 3);
    assert_eq!(second.new_tokens_for_prefill(), 2);
    assert_eq!(
        second.block_ids().take(3).collect::<Vec<_>>(),
        first_pages[..3],
        "the very same blocks back the shared prompt"
    );
    assert_eq!(m.metrics().match_hashes_hit - before.match_hashes_hit, 3);
    assert_eq!(
        second.sequence().sequence_hashes(),
        &first.sequence().sequence_hashes()[..3]
    );
    second.release();
    assert_eq!(audit(&m).in_use_blocks(), 0);
}

#[test]
fn concurrent_requests_share_pinned_prefix_blocks() {
    let m = manager(16);
    let prompt: Vec<u32> = (0..8).collect();
    let mut a = request(&prompt, 4);
    let mut b = request(&prompt, 4);
    prefill(&mut a, &m);
    assert_eq!(
        prefill(&mut b, &m),
        2,
        "a's registered blocks are matchable at once"
    );
    let shared: Vec<BlockId> = a.block_ids().take(2).collect();
    assert_eq!(b.block_ids().take(2).collect::<Vec<_>>(), shared);
    let pool = audit(&m);
    assert_eq!(
        (pool.active_blocks, pool.held_blocks),
        (2, 2),
        "two shared, one tail block each"
    );
    a.release();
    assert_eq!(audit(&m).active_blocks, 2, "b still pins them");
    b.release();
    assert_eq!(audit(&m).inactive_blocks, 2);
}

#[test]
fn racing_cold_requests_converge_on_one_copy() {
    let m = manager(16);
    let prompt: Vec<u32> = (0..8).collect();
    let mut a = request(&prompt, 4);
    let mut b = request(&prompt, 4);
    // Both miss the cache, both compute the prompt.
    assert_eq!(a.match_and_add_prefix(&m).unwrap(), 0);
    assert_eq!(b.match_and_add_prefix(&m).unwrap(), 0);
    a.allocate_blocks(2, &m).unwrap();
    b.allocate_blocks(2, &m).unwrap();
    a.complete_and_register_pending(&m).unwrap();
    b.complete_and_register_pending(&m).unwrap();
    assert_eq!(
        a.block_ids().collect::<Vec<_>>(),
        b.block_ids().collect::<Vec<_>>(),
        "deduplicated into a's blocks"
    );
    let pool = audit(&m);
    assert_eq!(
        (pool.active_blocks, pool.free_blocks),
        (2, 14),
        "b's copies were freed"
    );
    assert_eq!(m.metrics().deduplications, 2);
}

#[test]
fn preemption_under_pressure_recomputes_only_what_was_evicted() {
    let m = manager(8);
    let prompt: Vec<u32> = (0..16).collect(); // four full blocks
    let mut seq = request(&prompt, 4);
    prefill(&mut seq, &m);
    assert_eq!(seq.held_blocks(), 5);
    seq.release();

    // Another request takes six blocks: two cached blocks must be evicted,
    // the deepest first, so the shared prefix survives.
    let other = m.allocate_blocks(6).unwrap();
    assert_eq!(audit(&m).inactive_blocks, 2);
    drop(other);

    assert_eq!(seq.reacquire(&m).unwrap(), 2);
    assert_eq!((seq.assigned_blocks(), seq.unassigned_blocks()), (2, 2));
    assert_eq!(seq.new_tokens_for_prefill(), 8);
    // Recompute, then publish.
    assert_eq!(seq.complete_and_register_pending(&m).unwrap(), 2);
    assert!(seq.assignments().is_consistent_with(seq.sequence()));
}

#[test]
fn speculative_rollback_keeps_accepted_tokens_and_frees_the_rest() {
    let m = manager(16);
    let mut seq = request(&(0..6).collect::<Vec<_>>(), 32);
    prefill(&mut seq, &m); // blocks: [0..4) assigned, tail block for 4..6
    let kv_position = seq.total_tokens();

    // Draft 9 tokens: 15 tokens need four blocks.
    let drafts: Vec<u32> = (100..109).collect();
    seq.append_tokens(&drafts).unwrap();
    seq.allocate_blocks(seq.additional_blocks_needed(seq.total_tokens()), &m)
        .unwrap();
    assert_eq!(seq.held_blocks(), 4);

    // The verifier accepts 3: roll back, drop what is not needed, register
    // what the KV now covers.
    seq.truncate(kv_position + 3).unwrap();
    assert_eq!(seq.total_tokens(), 9);
    assert_eq!(seq.release_unassigned_beyond(seq.total_tokens()), 1);
    seq.complete_and_register_up_to(seq.total_tokens() / 4, &m)
        .unwrap();
    assert_eq!((seq.assigned_blocks(), seq.unassigned_blocks()), (2, 1));
    assert_eq!(audit(&m).in_use_blocks(), 3);
    assert_eq!(seq.tokens().to_vec()[6..], [100, 101, 102]);
}
