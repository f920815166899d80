//! Priority preemption by admission (`Preemption::ByPriority`): who is
//! preempted, for whom, and never for an equally or less urgent request.

use kvbm_queue::{GenerationReserve, Preemption, Priority, RequestId, SchedulerConfig};

use super::scheduler::{Gpu, request, run, scheduler};

/// A pool of 8 four-token blocks; a `victim` request of 20 prompt tokens
/// (5 blocks, 7 with its full reserve) running when a 12-token request of
/// priority `urgent` (4 blocks with its reserve) arrives.
fn one_running_when_another_arrives(
    preemption: Preemption,
    urgent: Priority,
) -> kvbm_queue::Scheduler<Gpu> {
    let config = SchedulerConfig::default()
        .with_reserve(GenerationReserve::Full)
        .with_watermark_blocks(0)
        .with_preemption(preemption);
    let mut s = scheduler(8, config);
    s.submit(request(1, 0..20, 8).with_priority(Priority::Low))
        .unwrap();
    run(&mut s);
    assert_eq!(s.block_table(RequestId(1)).unwrap().len(), 5);
    s.submit(request(2, 100..112, 4).with_priority(urgent))
        .unwrap();
    s
}

#[test]
fn a_more_urgent_request_preempts_the_least_urgent_running_one() {
    let mut s = one_running_when_another_arrives(Preemption::ByPriority, Priority::High);
    let (plan, _) = run(&mut s);
    assert_eq!(plan.preempted, [RequestId(1)]);
    assert_eq!(
        plan.prefill.iter().map(|p| p.id).collect::<Vec<_>>(),
        [RequestId(2)]
    );
    assert!(
        plan.decode.is_empty(),
        "the victim's planned decode is taken back"
    );
    assert_eq!(s.census().priority_preemptions, 1);
    while !s.is_idle() {
        run(&mut s);
    }
    assert_eq!(s.census().finished, 2);
}

#[test]
fn without_priority_preemption_the_urgent_request_waits() {
    let mut s = one_running_when_another_arrives(Preemption::Never, Priority::High);
    let (plan, _) = run(&mut s);
    assert!(plan.preempted.is_empty());
    assert!(plan.prefill.is_empty());
    assert!(s.running_ids().eq([RequestId(1)]));
}

#[test]
fn an_equally_urgent_request_never_preempts() {
    let mut s = one_running_when_another_arrives(Preemption::ByPriority, Priority::Low);
    while !s.is_idle() {
        let (plan, _) = run(&mut s);
        assert!(plan.preempted.is_empty());
    }
    assert_eq!(s.census().priority_preemptions, 0);
}

/// Preempting all the less urgent requests would still not make room: none
/// is preempted for nothing.
#[test]
fn nobody_is_preempted_for_a_request_that_would_still_not_fit() {
    let config = SchedulerConfig::default()
        .with_reserve(GenerationReserve::Full)
        .with_watermark_blocks(0)
        .with_preemption(Preemption::ByPriority);
    let mut s = scheduler(8, config);
    s.submit(request(1, 0..12, 4).with_priority(Priority::Critical))
        .unwrap();
    s.submit(request(2, 100..108, 8).with_priority(Priority::Low))
        .unwrap();
    run(&mut s);
    assert_eq!(s.running_ids().count(), 2);
    // 7 blocks: fits only if the Critical request's blocks were freed too.
    s.submit(request(3, 200..224, 4).with_priority(Priority::High))
        .unwrap();
    let (plan, _) = run(&mut s);
    assert!(plan.preempted.is_empty());
    assert_eq!(s.census().priority_preemptions, 0);
}

/// The `Low` request 1 is preempted for the `High` request 2; then a
/// `Normal` request 3 arrives. Which of 1 and 3 runs next, once 2 is done?
fn resumed_first_with_boost(boost: u32) -> RequestId {
    let config = SchedulerConfig::default()
        .with_reserve(GenerationReserve::Full)
        .with_watermark_blocks(0)
        .with_preemption(Preemption::ByPriority)
        .with_preemption_boost(boost);
    let mut s = scheduler(8, config);
    s.submit(request(1, 0..20, 8).with_priority(Priority::Low))
        .unwrap();
    run(&mut s);
    s.submit(request(2, 100..112, 4).with_priority(Priority::High))
        .unwrap();
    let (plan, _) = run(&mut s);
    assert_eq!(plan.preempted, [RequestId(1)]);
    s.submit(request(3, 200..212, 4).with_priority(Priority::Normal))
        .unwrap();
    loop {
        let (plan, _) = run(&mut s);
        let started = plan.prefill.iter().map(|p| p.id);
        if let Some(id) = started.into_iter().find(|&id| id != RequestId(2)) {
            return id;
        }
    }
}

#[test]
fn a_preemption_boost_resumes_the_victim_ahead_of_later_more_urgent_arrivals() {
    // Unboosted, the `Normal` arrival goes first; one step of boost makes
    // request 1 level with `Normal` (and the tie goes to the more urgent
    // priority); two put it ahead.
    assert_eq!(resumed_first_with_boost(0), RequestId(3));
    assert_eq!(resumed_first_with_boost(1), RequestId(3));
    assert_eq!(resumed_first_with_boost(2), RequestId(1));
}
