//! Whole lifecycles: block accounting per step, LIFO release on revert and
//! on rejected drafts, preemption with recompute, decode outcomes, edge
//! cases.

use kvbm_schedule::{DecodeOutcome, SchedulableSequence, SequenceState};
use kvbm_sequence::Salt;

use crate::{BLOCK_SIZE, Gpu, audit, check, manager, request};

#[test]
fn chunked_prefill_allocates_per_chunk_and_registers_what_each_computed() {
    let m = manager(16);
    let mut seq = request(10, 4);
    // (chunk, blocks allocated by the schedule, held after, registered after)
    for (chunk, allocated, held, assigned) in [(3, 1, 1, 0), (3, 1, 2, 1), (4, 1, 3, 2)] {
        seq.schedule_prefill(chunk, &m).unwrap();
        check(
            "scheduled",
            seq.state(),
            SequenceState::PrefillScheduled {
                num_tokens: chunk,
                blocks_allocated: allocated,
            },
        );
        let token = (seq.remaining_prefill_tokens() == chunk).then_some(77);
        seq.apply_prefill(token, &m).unwrap();
        check("held", seq.held_blocks(), held);
        check("assigned", seq.assigned_blocks(), assigned);
    }
    assert_eq!(
        (seq.kv_position(), seq.total_tokens(), seq.tail_tokens()),
        (10, 11, 1)
    );
    assert!(seq.is_prefill_complete());
    assert_eq!(seq.prefill_position(), 10);
}

#[test]
fn a_zero_token_chunk_computes_nothing() {
    let m = manager(4);
    let mut seq = request(4, 2);
    seq.schedule_prefill(0, &m).unwrap();
    seq.apply_prefill(None, &m).unwrap();
    assert_eq!((seq.kv_position(), seq.held_blocks()), (0, 0));
}

#[test]
fn revert_gives_back_exactly_the_scheduled_blocks_last_first() {
    let m = manager(16);
    let mut seq = request(8, 16);
    seq.schedule_prefill(8, &m).unwrap();
    seq.apply_prefill(Some(8), &m).unwrap();
    let page = seq.page_indices();
    let free = audit(&m).free_blocks;

    seq.schedule_speculative(9, &m).unwrap(); // slots 8..=17: 3 more blocks
    let scheduled = seq.page_indices();
    assert_eq!(scheduled.len(), page.len() + 3);
    assert_eq!(scheduled[..page.len()], page[..]);
    assert_eq!(
        scheduled.len() * BLOCK_SIZE,
        20,
        "the page table covers every slot written"
    );
    seq.revert_schedule().unwrap();
    assert_eq!(seq.page_indices(), page);
    assert_eq!(audit(&m).free_blocks, free);

    // The pool's free list is a stack and hands a batch out top first, so
    // only a last-allocated-first release gives the next identical schedule
    // the very same page table (a first-first release would reverse it).
    seq.schedule_speculative(9, &m).unwrap();
    assert_eq!(seq.page_indices(), scheduled);
}

#[test]
fn rejected_drafts_give_back_the_page_table_tail() {
    let m = manager(16);
    let mut seq = request(8, 16);
    seq.schedule_prefill(8, &m).unwrap();
    seq.apply_prefill(Some(8), &m).unwrap();
    seq.schedule_speculative(9, &m).unwrap();
    let scheduled = seq.page_indices();
    let free = audit(&m).free_blocks;
    // Accept 4: total 13, blocks kept cover 13 slots (4 blocks of 5).
    let outcome = seq.apply_speculative(&[9, 10, 11, 12], &m).unwrap();
    assert_eq!(outcome, DecodeOutcome::BlockCompleted);
    assert_eq!(seq.page_indices(), scheduled[..4]);
    assert_eq!(audit(&m).free_blocks, free + 1);
    assert_eq!((seq.kv_position(), seq.tail_tokens()), (12, 1));
    // The kept block of the tail token's slot serves the next decode step.
    seq.schedule_decode(&m).unwrap();
    assert_eq!(seq.state().blocks_allocated(), 0);
}

#[test]
fn accepting_nothing_keeps_the_tail_and_frees_every_draft_block() {
    let m = manager(16);
    let mut seq = request(8, 16);
    seq.schedule_prefill(8, &m).unwrap();
    seq.apply_prefill(Some(8), &m).unwrap();
    let page = seq.page_indices();
    seq.schedule_speculative(6, &m).unwrap();
    assert_eq!(
        seq.apply_speculative(&[], &m).unwrap(),
        DecodeOutcome::Continue
    );
    assert_eq!(
        (seq.kv_position(), seq.tail_tokens(), seq.total_tokens()),
        (8, 1, 9)
    );
    // The tail token's slot block is kept; the drafts' are not.
    assert_eq!(seq.page_indices()[..page.len()], page[..]);
    assert_eq!(seq.held_blocks(), 3);
}

#[test]
fn decode_outcomes_mark_filled_blocks_and_the_end() {
    let m = manager(16);
    let mut seq = request(3, 6);
    seq.schedule_prefill(3, &m).unwrap();
    seq.apply_prefill(Some(3), &m).unwrap(); // fills block 0
    let mut outcomes = Vec::new();
    while !seq.is_complete() {
        seq.schedule_decode(&m).unwrap();
        outcomes.push(seq.apply_decode(4, &m).unwrap());
    }
    use DecodeOutcome::*;
    // Tokens land at slots 4..=8; slot 7 fills block 1; slot 8 is the last.
    assert_eq!(
        outcomes,
        [Continue, Continue, Continue, BlockCompleted, MaxLength]
    );

    let mut ends_on_block = request(3, 5);
    ends_on_block.schedule_prefill(3, &m).unwrap();
    ends_on_block.apply_prefill(Some(3), &m).unwrap();
    let mut last = Continue;
    while !ends_on_block.is_complete() {
        ends_on_block.schedule_decode(&m).unwrap();
        last = ends_on_block.apply_decode(4, &m).unwrap();
    }
    assert_eq!(last, BlockCompletedAndMaxLength);
}

#[test]
fn preemption_recomputes_lost_kv_through_the_prefill_path() {
    let m = manager(16);
    let mut seq = request(10, 20);
    seq.schedule_prefill(10, &m).unwrap();
    seq.apply_prefill(Some(10), &m).unwrap();
    for token in 11..16 {
        seq.schedule_decode(&m).unwrap();
        seq.apply_decode(token, &m).unwrap();
    }
    // 16 tokens, 15 computed, blocks 0..3 registered.
    assert_eq!(
        (seq.total_tokens(), seq.kv_position(), seq.assigned_blocks()),
        (16, 15, 3)
    );
    seq.release().unwrap();
    assert_eq!(
        (seq.kv_position(), seq.tail_tokens(), seq.held_blocks()),
        (0, 16, 0)
    );
    assert_eq!(audit(&m).inactive_blocks, 3);

    let hashes = seq.inner().sequence().sequence_hashes().to_vec();
    assert_eq!(m.scan_matches(&hashes), [true, true, true, false]);

    assert_eq!(seq.reacquire(&m).unwrap(), 3);
    assert_eq!((seq.kv_position(), seq.prefill_target()), (12, 15));
    assert!(!seq.final_chunk_emits_token());
    assert!(seq.schedule_decode(&m).is_err());
    // Recompute in chunks of 2, never with a token.
    while !seq.is_prefill_complete() {
        let chunk = seq.remaining_prefill_tokens().min(2);
        seq.schedule_prefill(chunk, &m).unwrap();
        seq.apply_prefill(None, &m).unwrap();
    }
    assert_eq!(
        (seq.kv_position(), seq.tail_tokens(), seq.generated_tokens()),
        (15, 1, 6)
    );
    seq.schedule_decode(&m).unwrap();
    assert_eq!(seq.apply_decode(16, &m).unwrap(), DecodeOutcome::Continue);
    assert_eq!(seq.assigned_blocks(), 4);
}

#[test]
fn a_released_sequence_can_recompute_without_reacquiring() {
    let m = manager(16);
    let mut seq = request(6, 4);
    seq.schedule_prefill(6, &m).unwrap();
    seq.apply_prefill(Some(6), &m).unwrap();
    seq.release().unwrap();
    m.clear_cache();
    seq.schedule_prefill(6, &m).unwrap();
    seq.apply_prefill(None, &m).unwrap();
    seq.schedule_decode(&m).unwrap();
    seq.apply_decode(7, &m).unwrap();
    assert_eq!((seq.kv_position(), seq.assigned_blocks()), (7, 1));
}

#[test]
fn a_preempted_prompt_still_emits_its_first_token_on_the_final_chunk() {
    let m = manager(16);
    let mut seq = request(10, 4);
    seq.schedule_prefill(8, &m).unwrap();
    seq.apply_prefill(None, &m).unwrap();
    seq.release().unwrap();
    assert_eq!(seq.reacquire(&m).unwrap(), 2);
    assert!(seq.final_chunk_emits_token());
    seq.schedule_prefill(2, &m).unwrap();
    seq.apply_prefill(Some(42), &m).unwrap();
    assert_eq!((seq.generated_tokens(), seq.tail_tokens()), (1, 1));
}

#[test]
fn salted_requests_share_only_with_the_same_salt() {
    let m = manager(16);
    let salted = |salt| {
        SchedulableSequence::<Gpu>::builder((0..9).collect(), 4, BLOCK_SIZE)
            .salt(Salt::new(salt))
            .build()
            .unwrap()
    };
    let mut first = salted(1);
    first.schedule_prefill(9, &m).unwrap();
    first.apply_prefill(Some(0), &m).unwrap();
    assert_eq!(salted(2).match_and_add_prefix(&m).unwrap(), 0);
    assert_eq!(salted(1).match_and_add_prefix(&m).unwrap(), 2);
    assert_eq!(request(9, 4).match_and_add_prefix(&m).unwrap(), 0);
}

#[test]
fn accessors_forward_the_request_and_debug_is_informative() {
    let m = manager(16);
    let mut seq = request(6, 3);
    assert_eq!(
        (
            seq.num_input_tokens(),
            seq.max_output_tokens(),
            seq.block_size()
        ),
        (6, 3, BLOCK_SIZE)
    );
    seq.schedule_prefill(6, &m).unwrap();
    seq.apply_prefill(Some(6), &m).unwrap();
    assert_eq!(seq.remaining_tokens(), 2);
    assert_eq!(seq.num_blocks(), 1);
    assert_eq!(seq.prefix_matched_blocks(), 0);
    assert_eq!(seq.block_ids().count(), seq.held_blocks());
    assert_eq!(seq.inner().total_tokens(), 7);
    let debug = format!("{seq:?}");
    for field in ["SchedulableSequence", "kv_position: 6", "Idle", "EventLog"] {
        assert!(debug.contains(field), "{debug}");
    }
    let builder = format!("{:?}", SchedulableSequence::<Gpu>::builder(vec![1], 1, 4));
    assert!(builder.contains("num_input_tokens: 1"), "{builder}");
}
