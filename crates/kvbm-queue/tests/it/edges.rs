//! Hostile and unlucky inputs at the edges of the queue and the scheduler,
//! one test per defect found (issue 11), each failing without its fix.

use std::collections::HashMap;

use kvbm_queue::{
    FinishReason, Finished, GenerationReserve, InferenceRequest, Priority, QueueConfig, QueueError,
    RequestId, Scheduler, SchedulerConfig,
};

use super::scheduler::{
    Gpu, outputs, request, run, run_until_preempted, scheduler, two_requests_in_a_small_pool,
};
use super::{Req, with_config};

/// Runs audited steps until the scheduler is idle (at most `max_steps`),
/// returning every request's finish, from plans and reports alike.
fn drain(s: &mut Scheduler<Gpu>, max_steps: usize) -> HashMap<RequestId, Finished> {
    let mut finished = HashMap::new();
    for _ in 0..max_steps {
        if s.is_idle() {
            return finished;
        }
        let (plan, report) = run(s);
        for done in plan.finished.into_iter().chain(report.finished) {
            assert!(finished.insert(done.id, done).is_none(), "{done:?} twice");
        }
    }
    panic!("not idle after {max_steps} steps: {:?}", s.census());
}

/// Defect 1. A request that cannot fit (prompt 4 + up to 100 generated
/// tokens, pool of 8 blocks = 32 tokens) is preempted by a more urgent one
/// after growing to 6+ blocks. Resuming it costs its length plus the reserve,
/// more than the whole pool: it used to wait at the head of the line forever,
/// and the small request behind it with it.
#[test]
fn a_preempted_request_too_long_to_resume_never_blocks_the_line() {
    let config = SchedulerConfig::default()
        .with_reserve(GenerationReserve::Capped(8))
        .with_watermark_blocks(0);
    let mut s = scheduler(8, config);
    s.submit(request(1, 0..4, 100)).unwrap();
    while s.block_table(RequestId(1)).map_or(0, |t| t.len()) < 6 {
        run(&mut s);
    }
    let urgent = request(2, 100..104, 4).with_priority(Priority::High);
    s.submit(urgent).unwrap();
    s.submit(request(3, 200..204, 2)).unwrap();

    let finished = drain(&mut s, 500);
    let reason = |id| finished[&RequestId(id)].reason;
    assert_eq!(reason(1), FinishReason::CapacityExceeded);
    assert_eq!(reason(2), FinishReason::MaxTokens);
    assert_eq!(reason(3), FinishReason::MaxTokens);
    assert!(
        s.census().preemptions >= 1,
        "the scenario needs a preemption"
    );
    assert_eq!(s.manager().audit().unwrap().in_use_blocks(), 0);
}

/// Defect 2. Cancelling a preempted request and submitting its id again with
/// another prompt used to resume the old request's parked sequence.
#[test]
fn cancel_then_resubmit_runs_the_new_request() {
    let mut s = two_requests_in_a_small_pool();
    run_until_preempted(&mut s, RequestId(2));
    let handle = s.submit_handle();
    assert!(handle.cancel(RequestId(2)));
    // The id stays taken until a report says the old request ended.
    let early = handle.submit(request(2, 300..305, 3)).unwrap_err();
    assert_eq!(early.error(), &QueueError::Duplicate);

    let (plan, report) = run(&mut s);
    assert!(plan.prefill.iter().all(|p| p.id != RequestId(2)));
    let cancelled: Vec<_> = report.finished.iter().map(|f| (f.id, f.reason)).collect();
    assert_eq!(cancelled, [(RequestId(2), FinishReason::Cancelled)]);

    handle.submit(request(2, 300..305, 3)).unwrap();
    let mut seen_new_prompt = false;
    let mut finished = HashMap::new();
    while !s.is_idle() {
        let (_, report) = run(&mut s);
        if let Some(tokens) = s.tokens(RequestId(2)) {
            assert_eq!(
                tokens.range(0..5).as_deref(),
                Some(&[300, 301, 302, 303, 304][..])
            );
            seen_new_prompt = true;
        }
        finished.extend(report.finished.into_iter().map(|f| (f.id, f)));
    }
    assert!(seen_new_prompt);
    let new = finished[&RequestId(2)];
    assert_eq!(
        (new.reason, new.generated_tokens),
        (FinishReason::MaxTokens, 3)
    );
}

/// Virtual memory of this process in bytes (Linux).
fn virtual_memory() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm.split_whitespace().next().unwrap().parse().unwrap();
    pages * 4096
}

/// Defect 3. `max_new_tokens = u32::MAX` ("until the model stops") used to
/// reserve room for 4 billion tokens at admission: 16 GiB, and an abort
/// where that much cannot be had.
#[test]
fn max_new_tokens_u32_max_allocates_only_what_arrives() {
    let mut s = scheduler(128, SchedulerConfig::default());
    s.submit(request(1, 0..4, u32::MAX)).unwrap();
    let before = virtual_memory();
    for _ in 0..8 {
        run(&mut s);
    }
    let grown = virtual_memory().saturating_sub(before);
    assert!(grown < 1 << 30, "virtual memory grew by {grown} bytes");
    assert_eq!(s.tokens(RequestId(1)).unwrap().len(), 4 + 8);
    s.abort(RequestId(1)).unwrap();
    s.audit().unwrap();
}

/// Defect 6. `with_capacity(usize::MAX)` used to panic (capacity overflow)
/// when the queue reserved it; it is a hint, honoured up to a bound.
#[test]
fn a_huge_queue_capacity_is_only_a_hint() {
    let config = QueueConfig::new(16, 64).with_capacity(usize::MAX);
    let queue = with_config(config);
    assert_eq!(config.capacity(), QueueConfig::MAX_RESERVED);
    queue
        .enqueue(Req {
            id: 1,
            priority: Priority::Normal,
            prompt: 16,
            max_new: 0,
        })
        .unwrap();
    assert_eq!(queue.len(), 1);
}

/// Defect 8. A cancel through a handle ends the request wherever it is, and
/// the next report says so.
#[test]
fn cancel_ends_a_request_in_every_state() {
    let cancelled_in_report = |report: &kvbm_queue::StepReport, id: u64| {
        report
            .finished
            .iter()
            .any(|f| f.id == RequestId(id) && f.reason == FinishReason::Cancelled)
    };

    // Waiting: it leaves the queue at once, and the next report lists it.
    let mut s = scheduler(16, SchedulerConfig::default());
    let handle = s.submit_handle();
    s.submit(request(1, 0..4, 4)).unwrap();
    assert!(handle.cancel(RequestId(1)));
    assert_eq!(s.census().waiting, 0);
    assert!(!s.is_idle(), "the cancellation is not reported yet");
    let (plan, report) = run(&mut s);
    assert!(plan.is_empty());
    assert!(cancelled_in_report(&report, 1));
    assert!(s.is_idle());

    // Running, between steps: its blocks go back before the next plan.
    s.submit(request(2, 0..12, 4)).unwrap();
    run(&mut s);
    assert!(s.manager().audit().unwrap().in_use_blocks() > 0);
    assert!(handle.cancel(RequestId(2)));
    let (plan, report) = run(&mut s);
    assert!(plan.is_empty());
    assert!(cancelled_in_report(&report, 2));
    assert_eq!(s.manager().audit().unwrap().in_use_blocks(), 0);

    // Running, mid-step (from another thread): the engine's output for it
    // is still committed, then it ends.
    s.submit(request(3, 0..12, 4)).unwrap();
    let plan = s.step().unwrap();
    let h = handle.clone();
    assert!(
        std::thread::spawn(move || h.cancel(RequestId(3)))
            .join()
            .unwrap()
    );
    let report = s.apply(&outputs(&plan)).unwrap();
    assert!(cancelled_in_report(&report, 3));
    assert_eq!(s.manager().audit().unwrap().in_use_blocks(), 0);
    s.audit().unwrap();

    // Parked (preempted, waiting to resume).
    let mut s = two_requests_in_a_small_pool();
    run_until_preempted(&mut s, RequestId(2));
    assert!(s.cancel(RequestId(2)));
    let (_, report) = run(&mut s);
    assert!(cancelled_in_report(&report, 2));

    // Unknown and finished ids are not known.
    assert!(!s.cancel(RequestId(2)));
    assert!(!s.cancel(RequestId(99)));
}

/// Defect 8, under contention: a thread cancels every id while another
/// submits and the scheduler runs. Every request ends exactly once (finished
/// or cancelled), every accepted cancel of a still-live request is reported,
/// and nothing leaks.
#[test]
fn cancels_from_other_threads_are_never_lost() {
    const REQUESTS: u64 = 300;
    let config = SchedulerConfig::default()
        .with_max_running(8)
        .with_reserve(GenerationReserve::Capped(0));
    let mut s = scheduler(48, config);
    let submitter = s.submit_handle();
    let canceller = s.submit_handle();
    let finished = std::thread::scope(|scope| {
        scope.spawn(move || {
            for id in 0..REQUESTS {
                let prompt: Vec<u32> = (0..(id as u32 % 23) + 1).collect();
                submitter
                    .submit(InferenceRequest::new(RequestId(id), prompt, 6))
                    .unwrap();
            }
        });
        scope.spawn(move || {
            for round in 0..3 {
                for id in (round..REQUESTS).step_by(3) {
                    canceller.cancel(RequestId(id));
                    std::thread::yield_now();
                }
            }
        });
        let mut finished: HashMap<RequestId, Finished> = HashMap::new();
        while finished.len() < REQUESTS as usize {
            let (plan, report) = run(&mut s);
            for done in plan.finished.into_iter().chain(report.finished) {
                assert!(finished.insert(done.id, done).is_none(), "{done:?} twice");
            }
        }
        finished
    });
    assert!(s.is_idle());
    let census = s.audit().unwrap();
    assert_eq!(census.submitted, REQUESTS);
    assert_eq!(census.finished + census.aborted, REQUESTS);
    let cancelled = finished
        .values()
        .filter(|f| f.reason == FinishReason::Cancelled)
        .count() as u64;
    assert_eq!(census.aborted, cancelled);
    assert!(
        finished
            .values()
            .all(|f| matches!(f.reason, FinishReason::Cancelled | FinishReason::MaxTokens))
    );
    assert_eq!(s.manager().audit().unwrap().in_use_blocks(), 0);
}

/// Defect 10. The conservation checks summed their counters in `u64`; any
/// value a caller can put in these public fields must not overflow.
#[test]
fn conservation_checks_never_overflow() {
    let mut census = kvbm_queue::Census::default();
    census.submitted = u64::MAX;
    census.waiting = u64::MAX;
    census.running = u64::MAX;
    assert!(!census.is_balanced());
    census.running = 0;
    assert!(census.is_balanced());
    census.waiting = 1;
    census.finished = u64::MAX - 1;
    assert!(census.is_balanced());
    census.aborted = 1;
    assert!(!census.is_balanced());

    let mut stats = kvbm_queue::QueueStats::default();
    stats.enqueued = u64::MAX;
    stats.restored = u64::MAX;
    stats.dequeued = u64::MAX;
    stats.selected = u64::MAX;
    assert!(stats.is_balanced());
    stats.len = usize::MAX;
    assert!(!stats.is_balanced());
}
