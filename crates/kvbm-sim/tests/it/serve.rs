//! Serve mode on the committed excerpt of the conversation trace, with the
//! scheduler audited as it goes.

use kvbm_queue::{Priority, SchedulerConfig};
use kvbm_sim::{
    CacheConfig, Capacity, Eviction, PriorityMix, ServeConfig, ServeOutcome, ServeReport, Trace,
    Workload,
};

/// Checks what every complete replay of the excerpt must satisfy.
fn check_complete(trace: &Trace, report: &ServeReport) {
    let summary = trace.summary();
    // Every request finished, and the census agrees.
    assert_eq!(report.finished_requests(), summary.requests);
    assert_eq!(report.rejected_requests + report.capacity_exceeded(), 0);
    assert!(
        report
            .requests
            .iter()
            .all(|r| r.outcome == ServeOutcome::Finished)
    );
    let census = report.census;
    assert!(census.is_balanced(), "{census:?}");
    assert_eq!(
        (census.submitted, census.finished),
        (summary.requests, summary.requests)
    );
    assert_eq!(census.waiting + census.running + census.aborted, 0);
    // Every request generated exactly its output_length.
    assert_eq!(report.output_tokens, summary.output_tokens);
    assert_eq!(report.hits.input_tokens, summary.input_tokens);
    // Each preemption is followed by exactly one readmission.
    assert_eq!(
        report.admissions.admissions,
        summary.requests + report.preemptions
    );
    assert_eq!(census.preemptions, report.preemptions);
    let preempted: u64 = report
        .requests
        .iter()
        .map(|r| u64::from(r.preemptions))
        .sum();
    assert_eq!(preempted, report.preemptions);
    // Prefill computes every prompt token it did not find cached, at least.
    assert!(report.prefill_tokens >= summary.input_tokens - report.hits.hit_tokens);
    // Latencies are measured for every request that has them.
    let with_output = trace
        .requests()
        .iter()
        .filter(|r| r.output_length >= 1)
        .count();
    let with_tpot = trace
        .requests()
        .iter()
        .filter(|r| r.output_length >= 2)
        .count();
    assert_eq!(report.ttft.count, with_output as u64);
    assert_eq!(report.tpot.count, with_tpot as u64);
    assert!(report.ttft.p50 <= report.ttft.p90 && report.ttft.p90 <= report.ttft.p99);
    assert!(report.ttft.p99 <= report.ttft.max && report.ttft.max <= report.e2e.max);
    assert!(report.busy_time <= report.sim_duration);
    // Nobody's first token precedes their arrival or follows their finish.
    for r in &report.requests {
        let (Some(first), Some(done)) = (r.first_token, r.finished) else {
            panic!("{r:?}");
        };
        assert!(r.arrival <= r.admitted.unwrap() && first > r.arrival && first <= done);
    }
}

#[test]
fn the_excerpt_through_a_small_pool_audited_every_step() {
    // 781 blocks of 512 tokens (400k tokens): the excerpt's requests
    // contend for room, so this replays hundreds of preemptions and
    // reacquisitions, with the scheduler's conservation laws checked after
    // every one of its steps.
    let trace = Trace::conversation_excerpt().unwrap();
    let config = ServeConfig::new(512, Capacity::Tokens(400_000))
        .with_eviction(Eviction::Lineage)
        .with_audit_every(1);
    let report = config.run(&trace).unwrap();
    check_complete(&trace, &report);
    assert_eq!(report.capacity_blocks, 781);
    assert!(report.preemptions > 50, "{}", report.preemptions);
    // Resumed requests found some of their own blocks again.
    assert!(report.admissions.admitted_hit_tokens > report.hits.hit_tokens);
}

#[test]
fn the_excerpt_with_the_defaults_hits_no_more_than_an_unbounded_cache() {
    // Block size 16, 3M tokens: no preemption, audited every 100 steps.
    // (Prefix credit admits a little more eagerly, and preempts once here.)
    let trace = Trace::conversation_excerpt().unwrap();
    let scheduler = SchedulerConfig::default().with_prefix_credit(false);
    let config = ServeConfig::default()
        .with_scheduler(scheduler)
        .with_audit_every(100);
    let report = config.run(&trace).unwrap();
    check_complete(&trace, &report);
    assert_eq!(report.preemptions, 0);
    assert_eq!(
        report.admissions.admitted_hit_tokens,
        report.hits.hit_tokens
    );
    assert!(report.hits.hit_tokens > 0);
    // A hit needs the block registered by an earlier request, which an
    // unbounded cache replaying the same requests one by one would hold.
    let workload = Workload::new(&trace, 16).unwrap();
    let cache = CacheConfig::new(Capacity::Unbounded, Eviction::Lru)
        .run(&workload)
        .unwrap();
    assert!(report.hits.hit_blocks <= cache.hits.hit_blocks);
    assert_eq!(report.hits.input_blocks, cache.hits.input_blocks);
}

/// Speculative decoding changes how many steps the excerpt takes, never
/// what it generates: all drafts accepted, none, or some.
#[test]
fn speculative_decoding_generates_the_same_tokens_in_fewer_steps() {
    let excerpt = Trace::conversation_excerpt().unwrap();
    let trace = Trace::from_requests(excerpt.requests()[..200].to_vec()).unwrap();
    let base = ServeConfig::new(16, Capacity::Tokens(400_000)).with_audit_every(50);
    let plain = base.run(&trace).unwrap();
    check_complete(&trace, &plain);
    assert_eq!(plain.spec_proposed_tokens, 0);
    assert_eq!(plain.tokens_per_decode_step(), 1.0);
    let with = |accept: f64| {
        let scheduler = base.scheduler.with_speculative_tokens(4);
        let report = base
            .with_scheduler(scheduler)
            .with_spec_accept(accept)
            .with_seed(3)
            .run(&trace)
            .unwrap();
        check_complete(&trace, &report);
        assert_eq!(report.output_tokens, plain.output_tokens);
        assert!(report.spec_proposed_tokens > 0);
        report
    };
    let all = with(1.0);
    assert_eq!(all.spec_accepted_tokens, all.spec_proposed_tokens);
    assert!(
        all.decode_tokens * 2 < plain.decode_tokens,
        "5 tokens per decode"
    );
    let none = with(0.0);
    assert_eq!(none.spec_accepted_tokens, 0);
    assert_eq!(none.decode_tokens, plain.decode_tokens);
    let some = with(0.5);
    assert!(some.decode_tokens < plain.decode_tokens);
    assert!(some.decode_tokens > all.decode_tokens);
    // Seeded: the same run again is the same run.
    let again = with(0.5);
    assert_eq!(again.spec_accepted_tokens, some.spec_accepted_tokens);
    assert_eq!(again.ttft, some.ttft);
}

/// A trace line's own `priority` wins over the drawn mix, and every
/// priority present gets its TTFT.
#[test]
fn trace_priorities_win_over_the_mix() {
    let mut requests = Trace::conversation_excerpt().unwrap().requests()[..60].to_vec();
    for request in requests.iter_mut().step_by(3) {
        request.priority = Some(7);
    }
    let trace = Trace::from_requests(requests).unwrap();
    let config = ServeConfig::new(16, Capacity::Tokens(400_000))
        .with_priorities(PriorityMix::parse("0:1").unwrap());
    let report = config.run(&trace).unwrap();
    check_complete(&trace, &report);
    for (index, request) in report.requests.iter().enumerate() {
        let expected = if index % 3 == 0 {
            Priority::Low
        } else {
            Priority::Critical
        };
        assert_eq!(request.priority, expected, "request {index}");
    }
    let by_priority: Vec<(Priority, u64)> = report
        .ttft_by_priority
        .iter()
        .map(|(p, l)| (*p, l.count))
        .collect();
    assert_eq!(by_priority, [(Priority::Critical, 40), (Priority::Low, 20)]);
}
