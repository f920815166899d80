//! Registration timing and the prefix-match cap: a block becomes matchable
//! only once the KV of every one of its tokens is computed, and a match
//! always leaves a token for the forward pass.

use kvbm_blocks::BlockManager;
use kvbm_schedule::{SchedulableSequence, SequenceEvent};

use crate::{BLOCK_SIZE, Gpu, audit, check, manager, request};

/// Which of `seq`'s full blocks are matchable in `manager`.
fn matchable(seq: &SchedulableSequence<Gpu>, manager: &BlockManager<Gpu>) -> Vec<bool> {
    manager.scan_matches(seq.inner().sequence().sequence_hashes())
}

#[test]
fn a_block_filled_by_the_tail_token_is_not_matchable_until_its_kv_is_computed() {
    let m = manager(16);
    let mut first = request(7, 8);
    first.schedule_prefill(7, &m).unwrap();
    first.apply_prefill(Some(100), &m).unwrap();
    // Block 1 = [4, 5, 6, 100] is full in tokens, but 100 has no KV yet.
    assert_eq!(first.num_blocks(), 2);
    assert_eq!(matchable(&first, &m), [true, false]);

    // A request that shares all 8 tokens gets block 0 only.
    let prompt = [first.tokens().to_vec(), vec![1, 2, 3]].concat();
    let mut second = SchedulableSequence::<Gpu>::new(prompt.clone(), 4, BLOCK_SIZE).unwrap();
    assert_eq!(second.match_and_add_prefix(&m).unwrap(), 1);

    // The decode step computes 100's KV: now block 1 is published.
    first.schedule_decode(&m).unwrap();
    assert_eq!(matchable(&first, &m), [true, false], "not at schedule time");
    first.apply_decode(101, &m).unwrap();
    assert_eq!(matchable(&first, &m), [true, true]);
    let mut third = SchedulableSequence::<Gpu>::new(prompt, 4, BLOCK_SIZE).unwrap();
    assert_eq!(third.match_and_add_prefix(&m).unwrap(), 2);
}

#[test]
fn a_prefill_chunk_publishes_only_the_blocks_it_fully_computed() {
    let m = manager(16);
    let mut seq = request(12, 4);
    for (chunk, published) in [
        (3, [false, false, false]),
        (3, [true, false, false]),
        (5, [true, true, false]),
    ] {
        let before = matchable(&seq, &m);
        seq.schedule_prefill(chunk, &m).unwrap();
        assert_eq!(
            matchable(&seq, &m),
            before,
            "nothing is published at schedule time"
        );
        seq.apply_prefill(None, &m).unwrap();
        check(
            &format!("after a chunk of {chunk}"),
            matchable(&seq, &m),
            published.to_vec(),
        );
    }
    seq.schedule_prefill(1, &m).unwrap();
    seq.apply_prefill(Some(50), &m).unwrap();
    assert_eq!(matchable(&seq, &m), [true, true, true]);
}

#[test]
fn a_speculative_step_publishes_every_block_but_the_one_its_last_token_fills() {
    let m = manager(16);
    let mut seq = request(4, 16);
    seq.schedule_prefill(4, &m).unwrap();
    seq.apply_prefill(Some(4), &m).unwrap(); // 5 tokens, 4 computed
    seq.schedule_speculative(7, &m).unwrap();
    // Accept 7 tokens: total 12, blocks 1 and 2 fill; 11 is the tail.
    let outcome = seq.apply_speculative(&[5, 6, 7, 8, 9, 10, 11], &m).unwrap();
    assert!(outcome.block_completed());
    assert_eq!((seq.kv_position(), seq.tail_tokens()), (11, 1));
    assert_eq!(matchable(&seq, &m), [true, true, false]);
    seq.schedule_decode(&m).unwrap();
    seq.apply_decode(12, &m).unwrap();
    assert_eq!(matchable(&seq, &m), [true, true, true]);
}

#[test]
fn a_fully_cached_prompt_leaves_its_last_block_to_compute() {
    let m = manager(16);
    let mut first = request(8, 4);
    first.schedule_prefill(8, &m).unwrap();
    first.apply_prefill(Some(100), &m).unwrap();
    first.release().unwrap();

    // Same 8-token prompt: both blocks are cached, one is taken.
    let mut same = request(8, 4);
    assert_eq!(same.match_and_add_prefix(&m).unwrap(), 1);
    assert_eq!(
        (same.kv_position(), same.remaining_prefill_tokens()),
        (4, 4)
    );
    same.schedule_prefill(4, &m).unwrap();
    same.apply_prefill(Some(7), &m).unwrap();
    assert_eq!(same.tail_tokens(), 1);

    // One token longer: both blocks are taken, one token is left.
    let mut longer = request(9, 4);
    assert_eq!(longer.match_and_add_prefix(&m).unwrap(), 2);
    assert_eq!(longer.remaining_prefill_tokens(), 1);

    // A one-token prompt or an empty one matches nothing.
    for len in [0, 1] {
        let mut tiny = request(len, 4);
        check(
            &format!("prompt of {len}"),
            tiny.match_and_add_prefix(&m).unwrap(),
            0,
        );
    }
}

#[test]
fn a_mid_prefill_match_replaces_the_partially_computed_block() {
    let m = manager(16);
    let mut first = request(8, 4);
    first.schedule_prefill(8, &m).unwrap();
    first.apply_prefill(Some(100), &m).unwrap(); // blocks 0 and 1 published

    let mut second = request(12, 4);
    second.schedule_prefill(2, &m).unwrap();
    second.apply_prefill(None, &m).unwrap(); // block 0 half computed
    assert_eq!((second.held_blocks(), second.unassigned_blocks()), (1, 1));
    let free_before = audit(&m).free_blocks;

    assert_eq!(second.match_and_add_prefix(&m).unwrap(), 2);
    assert_eq!((second.kv_position(), second.held_blocks()), (8, 2));
    assert_eq!(second.unassigned_blocks(), 0);
    assert_eq!(second.page_indices(), first.page_indices()[..2]);
    assert_eq!(audit(&m).free_blocks, free_before + 1);
    let events = second.history().to_vec();
    assert_eq!(
        events[events.len() - 2..],
        [
            SequenceEvent::UnassignedDropped { count: 1 },
            SequenceEvent::PrefixMatched {
                blocks_matched: 2,
                kv_position: 8
            }
        ]
    );
    second.schedule_prefill(4, &m).unwrap();
    second.apply_prefill(Some(5), &m).unwrap();
    assert_eq!(second.assigned_blocks(), 3);
}

#[test]
fn while_decoding_there_is_nothing_left_to_match() {
    let m = manager(16);
    let mut seq = request(8, 4);
    seq.schedule_prefill(8, &m).unwrap();
    seq.apply_prefill(Some(1), &m).unwrap();
    for _ in 0..3 {
        assert_eq!(seq.match_and_add_prefix(&m).unwrap(), 0);
        seq.schedule_decode(&m).unwrap();
        seq.apply_decode(2, &m).unwrap();
    }
    assert_eq!(seq.kv_position(), 11);
}

/// `decode_within_blocks` is the `schedule_decode` + `apply_decode` pair
/// wherever it runs, and refuses, changing nothing, exactly where that pair
/// allocates or registers: two sequences over two pools, one decoding in
/// one call when it can, agree on tokens, positions, blocks, history and
/// what each pool holds after every token.
#[test]
fn decoding_within_blocks_is_the_decode_pair_where_it_needs_no_block() {
    for prompt_len in 1..=9u32 {
        let (one, pair) = (manager(32), manager(32));
        let (mut fast, mut slow) = (request(prompt_len, 21), request(prompt_len, 21));
        for (seq, m) in [(&mut fast, &one), (&mut slow, &pair)] {
            seq.schedule_prefill(prompt_len as usize, m).unwrap();
            seq.apply_prefill(Some(500), m).unwrap();
        }
        let mut in_one_call = 0;
        for token in 0..20u32 {
            let (history, tokens) = (fast.history().len(), fast.tokens().len());
            let slot = fast.kv_position();
            // The pair allocates at a block's first slot and registers a
            // block at its last; anything else is within the blocks held.
            let needs_block = slot % BLOCK_SIZE == 0 || (slot + 1) % BLOCK_SIZE == 0;
            if fast.decode_within_blocks(token) {
                assert!(!needs_block, "slot {slot} of a {prompt_len}-token prompt");
                in_one_call += 1;
            } else {
                assert!(needs_block, "slot {slot} of a {prompt_len}-token prompt");
                assert_eq!(
                    (fast.history().len(), fast.tokens().len()),
                    (history, tokens)
                );
                fast.schedule_decode(&one).unwrap();
                fast.apply_decode(token, &one).unwrap();
            }
            slow.schedule_decode(&pair).unwrap();
            slow.apply_decode(token, &pair).unwrap();
            assert_eq!(fast.tokens(), slow.tokens());
            assert_eq!(fast.kv_position(), slow.kv_position());
            assert_eq!(fast.state(), slow.state());
            assert_eq!(fast.history(), slow.history());
            assert_eq!(fast.held_blocks(), slow.held_blocks());
            assert_eq!(matchable(&fast, &one), matchable(&slow, &pair));
            assert_eq!(one.metrics(), pair.metrics());
        }
        assert!(in_one_call >= 8, "{in_one_call} of 20 in one call");
        // The budget's last token is refused like any decode past it.
        assert!(!fast.decode_within_blocks(0));
    }
}
