//! What an engine's kernels read from the scheduler for the pending step:
//! slot mappings (flat and per request) and O(1) lookups by id.

use kvbm_queue::{PAD_SLOT, RequestId, SchedulerConfig, SchedulerError};

use super::scheduler::{outputs, request, run, scheduler};

/// Slot of position `pos` in a table of 4-token blocks.
fn slot(table: &[kvbm_blocks::BlockId], pos: usize) -> u64 {
    u64::from(table[pos / 4].get()) * 4 + (pos % 4) as u64
}

#[test]
fn the_slot_mapping_names_each_planned_token_in_plan_order() {
    let config = SchedulerConfig::default().with_chunk_size(6);
    let mut s = scheduler(16, config);
    s.submit(request(1, 0..10, 2)).unwrap();
    s.submit(request(2, 100..103, 4)).unwrap();

    // Step 0: request 1 prefills positions 0..6, request 2 all of 0..3.
    let plan = s.step().unwrap();
    let mut flat = Vec::new();
    s.slot_mapping(&plan, &mut flat).unwrap();
    let t1 = s.block_table(RequestId(1)).unwrap();
    let t2 = s.block_table(RequestId(2)).unwrap();
    let expected: Vec<u64> = (0..6)
        .map(|p| slot(&t1, p))
        .chain((0..3).map(|p| slot(&t2, p)))
        .collect();
    assert_eq!(flat, expected);
    let mut one = vec![42];
    assert_eq!(s.request_slots(RequestId(2), &mut one), Some(3));
    assert_eq!(one, [42, slot(&t2, 0), slot(&t2, 1), slot(&t2, 2)]);
    s.apply(&outputs(&plan)).unwrap();

    // A plan from another step is refused; after apply nothing is pending.
    assert_eq!(
        s.slot_mapping(&plan, &mut flat),
        Err(SchedulerError::NoStepPending)
    );
    let next = s.step().unwrap();
    assert_eq!(
        s.slot_mapping(&plan, &mut flat),
        Err(SchedulerError::StalePlan {
            plan: 0,
            pending: 1
        })
    );

    // Step 1: request 1's last chunk (6..10), request 2 decodes position 3.
    s.slot_mapping(&next, &mut flat).unwrap();
    let t1 = s.block_table(RequestId(1)).unwrap();
    let t2 = s.block_table(RequestId(2)).unwrap();
    let expected: Vec<u64> = (6..10)
        .map(|p| slot(&t1, p))
        .chain([slot(&t2, 3)])
        .collect();
    assert_eq!(flat, expected);

    // A request aborted mid-step keeps its place in the mapping, padded.
    s.abort(RequestId(1)).unwrap();
    s.slot_mapping(&next, &mut flat).unwrap();
    assert_eq!(flat, [PAD_SLOT, PAD_SLOT, PAD_SLOT, PAD_SLOT, slot(&t2, 3)]);
    assert_eq!(s.request_slots(RequestId(1), &mut flat), None);
    s.apply(&outputs(&next)).unwrap();
    assert!(s.is_running(RequestId(2)));
    assert!(!s.is_running(RequestId(1)));
    run(&mut s);
}
