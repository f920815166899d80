//! Prefix credit in admission: a request whose prefix running requests
//! already hold is charged only for the blocks it adds.

use kvbm_queue::{GenerationReserve, InferenceRequest, RequestId, SchedulerConfig};

use super::scheduler::{request, run, scheduler};

/// Request 1 (24 prompt tokens: 6 blocks of 4) runs in a 10-block pool when
/// request 2 arrives: 24 tokens again, its first 20 the same as request 1's.
/// Returns the step request 2 is admitted at (if within 20 steps) and the
/// prompt tokens it found cached.
fn second_request_admission(credit: bool) -> (Option<u64>, u64) {
    let config = SchedulerConfig::default()
        .with_reserve(GenerationReserve::Capped(0))
        .with_watermark_blocks(0)
        .with_prefix_credit(credit);
    let mut s = scheduler(10, config);
    s.submit(request(1, 0..24, 12)).unwrap();
    run(&mut s);
    let prompt: Vec<u32> = (0..20).chain(100..104).collect();
    s.submit(InferenceRequest::new(RequestId(2), prompt, 4))
        .unwrap();
    for _ in 0..20 {
        let (plan, _) = run(&mut s);
        if let Some(p) = plan.prefill.iter().find(|p| p.id == RequestId(2)) {
            let hits = p.start as u64;
            assert!(
                s.is_running(RequestId(1)) || !credit,
                "credit admits it beside request 1"
            );
            return (Some(plan.step), hits);
        }
    }
    (None, 0)
}

#[test]
fn a_cached_prefix_held_by_a_running_request_costs_no_blocks() {
    // Credited: 6 blocks needed, 5 already held by request 1, so it costs
    // one of the 3 free blocks and starts at once, its prefill starting
    // after the 20 cached tokens.
    assert_eq!(second_request_admission(true), (Some(1), 20));
    // Uncredited: charged all 6 blocks, it waits for request 1 to finish
    // (12 decode steps), and then its prefix is in the evictable cache.
    let (step, hits) = second_request_admission(false);
    assert!(step.is_some_and(|step| step > 10), "admitted at {step:?}");
    assert_eq!(hits, 20);
}
