//! Serve mode on hand-made traces whose schedule can be worked out by hand.
//!
//! The step-time model is the default throughout: 5 ms per step, 0.05 ms
//! per prefilled token, 0.1 ms per decoding request. Every run audits the
//! scheduler after every step.

use std::time::Duration;

use kvbm_queue::{GenerationReserve, SchedulerConfig};

use super::*;
use crate::{Capacity, Trace, TraceRequest};

/// A request at `timestamp` ms with a prompt of `input` tokens made of the
/// trace blocks `ids`, generating `output` tokens.
fn request(timestamp: u64, ids: &[u64], input: u64, output: u64) -> TraceRequest {
    TraceRequest {
        timestamp,
        input_length: input,
        output_length: output,
        hash_ids: ids.to_vec(),
        priority: None,
    }
}

fn trace(requests: Vec<TraceRequest>) -> Trace {
    Trace::from_requests(requests).unwrap()
}

/// Block size 16, a roomy pool, audits after every step.
fn config() -> ServeConfig {
    ServeConfig::new(16, Capacity::Blocks(10_000)).with_audit_every(1)
}

fn ms(millis: f64) -> Duration {
    Duration::from_nanos((millis * 1e6).round() as u64)
}

fn run(trace: &Trace, config: &ServeConfig) -> ServeReport {
    let report = config.run(trace).unwrap();
    // Whatever the schedule, the census balances and nothing is left.
    assert!(report.census.is_balanced(), "{:?}", report.census);
    assert_eq!(report.census.waiting + report.census.running, 0);
    assert!(
        report
            .requests
            .iter()
            .all(|r| r.outcome != ServeOutcome::Pending)
    );
    report
}

#[test]
fn one_request_ttft_and_tpot_by_hand() {
    // 100 prompt tokens arriving at 1 s, 4 output tokens.
    let trace = trace(vec![request(1_000, &[1], 100, 4)]);
    let report = run(&trace, &config());
    let timeline = report.requests[0];
    // Step 1 prefills all 100 tokens and emits token 1:
    //   5 + 100 × 0.05 = 10 ms -> first token at 1010 ms, TTFT 10 ms.
    // Steps 2-4 decode tokens 2, 3, 4: 3 × (5 + 0.1) = 15.3 ms.
    //   finished at 1025.3 ms; TPOT = 15.3 / (4 - 1) = 5.1 ms; E2E 25.3 ms.
    assert_eq!(timeline.arrival, ms(1_000.0));
    assert_eq!(timeline.admitted, Some(ms(1_000.0)));
    assert_eq!(timeline.first_token, Some(ms(1_010.0)));
    assert_eq!(timeline.finished, Some(ms(1_025.3)));
    assert_eq!(timeline.ttft(), Some(ms(10.0)));
    assert_eq!(timeline.tpot(), Some(ms(5.1)));
    assert_eq!(timeline.e2e(), Some(ms(25.3)));
    assert_eq!(timeline.outcome, ServeOutcome::Finished);
    assert_eq!(
        (report.ttft.count, report.ttft.p50, report.ttft.max),
        (1, ms(10.0), ms(10.0))
    );
    assert_eq!((report.tpot.p99, report.e2e.p90), (ms(5.1), ms(25.3)));
    // The simulation starts at the first arrival.
    assert_eq!(report.sim_duration, ms(25.3));
    assert_eq!(report.busy_time, ms(25.3));
    assert_eq!(
        (report.steps, report.prefill_tokens, report.decode_tokens),
        (4, 100, 3)
    );
    assert_eq!(report.output_tokens, 4);
    // 4 tokens in 25.3 ms.
    assert!((report.output_tokens_per_s() - 4.0 / 0.0253).abs() < 1e-9);
    assert!((report.requests_per_s() - 1.0 / 0.0253).abs() < 1e-9);
    assert_eq!(report.utilization(), 1.0);
    // 100 tokens in 16-token blocks: 7 blocks, nothing cached.
    assert_eq!((report.hits.input_blocks, report.hits.hit_blocks), (7, 0));
    assert_eq!(report.preemptions, 0);
}

#[test]
fn prompt_only_and_single_token_requests() {
    // An output of 0 is a prompt-only request: one prefill step, no token.
    // An output of 1 finishes in the step that emits its first token.
    let trace = trace(vec![request(0, &[1], 40, 0), request(100, &[2], 40, 1)]);
    let report = run(&trace, &config());
    let (prompt_only, single) = (report.requests[0], report.requests[1]);
    // 5 + 40 × 0.05 = 7 ms each.
    assert_eq!(prompt_only.finished, Some(ms(7.0)));
    assert_eq!((prompt_only.first_token, prompt_only.ttft()), (None, None));
    assert_eq!(prompt_only.e2e(), Some(ms(7.0)));
    assert_eq!(single.first_token, Some(ms(107.0)));
    assert_eq!(single.finished, Some(ms(107.0)));
    assert_eq!(single.tpot(), None);
    assert_eq!(
        (report.ttft.count, report.tpot.count, report.e2e.count),
        (1, 0, 2)
    );
    assert_eq!(report.output_tokens, 1);
    // Idle between them: time jumped from 7 ms to the arrival at 100 ms.
    assert_eq!(report.sim_duration, ms(107.0));
    assert_eq!(report.busy_time, ms(14.0));
    assert_eq!(report.steps, 2);
}

#[test]
fn admission_follows_arrival_time_then_trace_order() {
    // One request runs at a time. Trace order is not arrival order:
    //   line 0 arrives at 10 ms, lines 1 and 2 at 0 ms, line 3 at 5 ms.
    // Each is 16 tokens and one output token: one step of
    // 5 + 16 × 0.05 = 5.8 ms.
    let trace = trace(vec![
        request(10, &[10], 16, 1),
        request(0, &[11], 16, 1),
        request(0, &[12], 16, 1),
        request(5, &[13], 16, 1),
    ]);
    let config = config().with_scheduler(SchedulerConfig::default().with_max_running(1));
    let report = run(&trace, &config);
    let ranks: Vec<_> = report.requests.iter().map(|r| r.admission_rank).collect();
    // Ties at 0 ms keep trace order (1 before 2); line 3 arrived mid-step
    // (5 ms < 5.8 ms) and queues before line 0.
    assert_eq!(ranks, [Some(3), Some(0), Some(1), Some(2)]);
    // Line 1: 0 -> 5.8; line 2: 5.8 -> 11.6; line 3: 11.6 -> 17.4;
    // line 0: 17.4 -> 23.2.
    let firsts: Vec<_> = report.requests.iter().map(|r| r.first_token).collect();
    assert_eq!(
        firsts,
        [
            Some(ms(23.2)),
            Some(ms(5.8)),
            Some(ms(11.6)),
            Some(ms(17.4))
        ]
    );
    // TTFTs 13.2, 5.8, 11.6, 12.4 ms: sorted 5.8, 11.6, 12.4, 13.2.
    assert_eq!(report.ttft.p50, ms(11.6));
    assert_eq!(report.ttft.max, ms(13.2));
    assert_eq!(report.ttft.mean, ms((13.2 + 5.8 + 11.6 + 12.4) / 4.0));
    assert_eq!(report.max_waiting, 2);
}

#[test]
fn chunked_prefill_delays_the_first_token() {
    // A 2500-token prompt, token budget and chunk size 1000, 3 output tokens.
    let trace = trace(vec![request(0, &[1, 2, 3, 4, 5], 2_500, 3)]);
    let limits = SchedulerConfig::default()
        .with_token_budget(1_000)
        .with_chunk_size(1_000);
    let report = run(&trace, &config().with_scheduler(limits));
    // Chunks of 1000, 1000 and 500 tokens:
    //   (5 + 50) + (5 + 50) + (5 + 25) = 140 ms -> first token at 140 ms.
    // Two decodes: 2 × 5.1 = 10.2 ms -> finished at 150.2 ms.
    let timeline = report.requests[0];
    assert_eq!(timeline.first_token, Some(ms(140.0)));
    assert_eq!(timeline.finished, Some(ms(150.2)));
    assert_eq!(timeline.tpot(), Some(ms(5.1)));
    assert_eq!(report.steps, 5);
}

#[test]
fn chunk_size_and_token_budget_split_two_prompts() {
    // Two 1500-token prompts at 0 ms; chunks of at most 1000 tokens, 1200
    // tokens per step, 2 output tokens each.
    let trace = trace(vec![
        request(0, &[1, 2, 3], 1_500, 2),
        request(0, &[4, 5, 6], 1_500, 2),
    ]);
    let limits = SchedulerConfig::default()
        .with_token_budget(1_200)
        .with_chunk_size(1_000);
    let report = run(&trace, &config().with_scheduler(limits));
    // Step 1: A 1000 (chunk), B admitted with the 200 left:
    //   5 + 1200 × 0.05 = 65 ms.
    // Step 2: A its last 500 (first token), B 700 (budget):
    //   65 ms -> A's first token at 130 ms.
    // Step 3: A decodes (1 token), B its last 600 (first token):
    //   5 + 600 × 0.05 + 0.1 = 35.1 ms -> A done, B's first token at 165.1.
    // Step 4: B decodes: 5.1 ms -> 170.2 ms.
    let (a, b) = (report.requests[0], report.requests[1]);
    assert_eq!(
        (a.first_token, a.finished),
        (Some(ms(130.0)), Some(ms(165.1)))
    );
    assert_eq!(
        (b.first_token, b.finished),
        (Some(ms(165.1)), Some(ms(170.2)))
    );
    assert_eq!((a.admitted, b.admitted), (Some(ms(0.0)), Some(ms(0.0))));
    assert_eq!(report.prefill_tokens, 3_000);
    assert_eq!(report.steps, 4);
}

#[test]
fn preemption_releases_and_reacquire_finds_the_cached_prefix() {
    // A 12-block pool of 16-token blocks; no generation reserve and no
    // watermark, so both requests are admitted at once and outgrow it.
    // Each: 64 prompt tokens (4 blocks), 80 output tokens (up to 9 blocks).
    let trace = trace(vec![request(0, &[1], 64, 80), request(0, &[2], 64, 80)]);
    let limits = SchedulerConfig::default()
        .with_reserve(GenerationReserve::Capped(0))
        .with_watermark_blocks(0);
    let config = ServeConfig::new(16, Capacity::Blocks(12))
        .with_scheduler(limits)
        .with_audit_every(1);
    let report = run(&trace, &config);
    let (a, b) = (report.requests[0], report.requests[1]);
    // Step 0: both prefill 64 tokens and emit a token (4 blocks each):
    //   5 + 128 × 0.05 = 11.4 ms.
    assert_eq!(
        (a.first_token, b.first_token),
        (Some(ms(11.4)), Some(ms(11.4)))
    );
    // Steps 1..=32: both decode (5.2 ms each). A request with g tokens
    // generated holds ceil((64 + g) / 16) blocks: 5, 6 then 7 at g = 33,
    // when 2 × 6 = 12 blocks are all taken. At step 33 A cannot get its
    // 7th block: B, admitted later, is preempted; its 6 registered blocks
    // stay cached. A takes its 7th, 8th and 9th blocks by evicting B's,
    // deepest first (released tail first), leaving B's first 3.
    assert_eq!(report.preemptions, 1);
    assert_eq!((a.preemptions, b.preemptions), (0, 1));
    // A decodes alone in steps 33..=79 (5.1 ms each) and finishes with 80
    // tokens at 11.4 + 32 × 5.2 + 47 × 5.1 = 11.4 + 166.4 + 239.7 = 417.5 ms.
    assert_eq!(a.finished, Some(ms(417.5)));
    // Step 80: B is admitted again (it could not be before: its recompute
    // chunk never fit), reacquires its 3 cached blocks (48 tokens) and
    // recomputes the rest but the tail: 64 + 33 - 1 - 48 = 48 tokens,
    //   5 + 48 × 0.05 = 7.4 ms,
    // then decodes its other 47 tokens: 47 × 5.1 = 239.7 ms.
    //   417.5 + 7.4 + 239.7 = 664.6 ms.
    assert_eq!(b.finished, Some(ms(664.6)));
    assert_eq!(b.hit_tokens, 0, "first admission found nothing cached");
    assert_eq!(report.admissions.admissions, 3);
    // Admitted tokens: 64 + 64 + (64 + 33) for B's resumption; of which
    // cached: 48, B's own prefix.
    assert_eq!(report.admissions.admitted_tokens, 225);
    assert_eq!(report.admissions.admitted_hit_tokens, 48);
    assert_eq!(report.census.prefix_hit_tokens, 48);
    // The first-admission hit accounting is unchanged by the preemption.
    assert_eq!(report.hits.hit_tokens, 0);
    assert_eq!(report.output_tokens, 160);
    assert_eq!(report.prefill_tokens, 128 + 48);
    assert_eq!(report.finished_requests(), 2);
    assert_eq!(report.steps, 80 + 1 + 47);
}

#[test]
fn shared_trace_prefixes_share_exactly_their_blocks() {
    // Request 2 shares its first k trace blocks with request 1, which has
    // finished (and registered its prompt) by the time request 2 arrives.
    // Prompts are 2000 tokens (the last trace block partial).
    let first: [u64; 4] = [1, 2, 3, 4];
    for block_size in [1, 16, 64, 512] {
        for k in 0..=4usize {
            let mut second = first;
            for id in second.iter_mut().skip(k) {
                *id += 100;
            }
            let trace = trace(vec![
                request(0, &first, 2_000, 1),
                request(100_000, &second, 2_000, 1),
            ]);
            let config =
                ServeConfig::new(block_size, Capacity::Tokens(1 << 20)).with_audit_every(1);
            let report = run(&trace, &config);
            // Shared: k × 512 tokens, whole blocks only, and never the
            // prompt's last token (the match cap: (2000 - 1) / b blocks).
            let shared_blocks = (k * 512 / block_size).min(1_999 / block_size);
            let expected = (shared_blocks * block_size) as u64;
            assert_eq!(
                report.census.prefix_hit_tokens, expected,
                "block size {block_size}, k {k}"
            );
            assert_eq!(report.requests[1].hit_tokens, expected);
            assert_eq!(report.hits.hit_blocks, shared_blocks as u64);
        }
    }
}

#[test]
fn prompt_tokens_reproduce_trace_sharing_through_kvbm_hashes() {
    // The hashes kvbm-sequence computes agree exactly where the trace ids do.
    use kvbm_sequence::BlockSequence;
    let a = prompt_tokens(&[7, 8, 9], 1_500);
    let b = prompt_tokens(&[7, 8, 10], 1_500);
    for block_size in [2, 16, 128, 512] {
        let ha = BlockSequence::new(a.clone(), block_size).unwrap();
        let hb = BlockSequence::new(b.clone(), block_size).unwrap();
        let (ha, hb) = (ha.sequence_hashes(), hb.sequence_hashes());
        let shared = 1_024 / block_size;
        assert_eq!(ha[..shared], hb[..shared], "block size {block_size}");
        assert!(
            ha[shared..].iter().zip(&hb[shared..]).all(|(x, y)| x != y),
            "block size {block_size}"
        );
    }
}

#[test]
fn requests_the_pool_cannot_hold_are_rejected_or_given_up() {
    // A 4-block pool of 16 tokens (64 tokens), default reserve (256):
    // - a 30-token prompt generating 10 fits: 40 tokens, 3 blocks;
    // - a 100-token prompt is larger than the pool: rejected at submission;
    // - an empty prompt is rejected;
    // - with no reserve, a 30-token prompt generating 100 is admitted but
    //   outgrows the pool while decoding.
    let requests = vec![
        request(0, &[1], 30, 10),
        request(1, &[2], 100, 1),
        request(2, &[], 0, 5),
    ];
    let config = ServeConfig::new(16, Capacity::Blocks(4)).with_audit_every(1);
    let report = run(&trace(requests), &config);
    let outcomes: Vec<_> = report.requests.iter().map(|r| r.outcome).collect();
    assert_eq!(
        outcomes,
        [
            ServeOutcome::Finished,
            ServeOutcome::RejectedTooLarge,
            ServeOutcome::RejectedEmpty
        ]
    );
    assert_eq!((report.rejected_requests, report.hits.requests), (2, 1));
    assert_eq!(report.hits.input_tokens, 30);

    let limits = SchedulerConfig::default().with_reserve(GenerationReserve::Capped(0));
    let report = run(
        &trace(vec![request(0, &[1], 30, 100)]),
        &config.with_scheduler(limits),
    );
    let timeline = report.requests[0];
    assert_eq!(timeline.outcome, ServeOutcome::CapacityExceeded);
    assert_eq!(report.capacity_exceeded(), 1);
    assert_eq!(report.finished_requests(), 0);
    // It generated until its 64th token needed a fifth block: the prompt's
    // 30, then 34 generated tokens fill 64 slots, the 35th finds no block.
    assert_eq!(report.output_tokens, 35);
    assert_eq!(timeline.e2e(), None);
    assert_eq!(timeline.tpot(), None);
}

#[test]
fn configuration_errors_are_typed() {
    let trace = trace(vec![request(0, &[1], 10, 1)]);
    let run = |config: ServeConfig| config.run(&trace).unwrap_err();
    assert!(matches!(
        run(ServeConfig::new(16, Capacity::Unbounded)),
        SimError::UnboundedServe
    ));
    assert!(matches!(
        run(ServeConfig::new(48, Capacity::Blocks(10))),
        SimError::InvalidBlockSize { block_size: 48 }
    ));
    assert!(matches!(
        run(ServeConfig::new(16, Capacity::Tokens(10))),
        SimError::ZeroCapacity { .. }
    ));
    assert!(matches!(
        run(ServeConfig::new(16, Capacity::Blocks(1 << 40))),
        SimError::CapacityTooLarge { .. }
    ));
    let zero_budget = SchedulerConfig::default().with_token_budget(0);
    match run(ServeConfig::default().with_scheduler(zero_budget)) {
        SimError::Scheduler(err) => assert!(err.to_string().contains("token_budget"), "{err}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_replay_times_the_scheduler_s_calls_within_itself() {
    let trace = Trace::conversation_excerpt().unwrap();
    let report = ServeConfig::new(64, Capacity::Tokens(200_000))
        .run(&trace)
        .unwrap();
    let scheduler = report.scheduler_time.expect("serve mode keeps it");
    assert!(scheduler > Duration::ZERO);
    assert!(scheduler <= report.replay_time, "{scheduler:?}");
}

#[test]
fn replays_are_deterministic() {
    let trace = Trace::conversation_excerpt().unwrap();
    let mut small = trace.clone();
    small.truncate(std::num::NonZeroUsize::new(60).unwrap());
    let config = ServeConfig::new(64, Capacity::Tokens(200_000));
    let mut first = config.run(&small).unwrap();
    let mut second = config.run(&small).unwrap();
    first.clear_wall_times();
    second.clear_wall_times();
    assert_eq!(first, second);
    assert!(first.preemptions > 0, "the small pool should preempt");
}

#[test]
fn the_latest_timestamp_is_simulated_exactly() {
    // The trace at its boundary: one request at 0, one at the
    // latest timestamp the clock takes (u64::MAX is refused by the trace).
    let latest = crate::MAX_TIMESTAMP_MS;
    let trace = trace(vec![
        request(0, &[1], 100, 4),
        request(latest, &[2], 100, 4),
    ]);
    let report = run(&trace, &config());
    let at = Duration::from_millis(latest);
    // Each runs alone, as in `one_request_ttft_and_tpot_by_hand`: 10 ms to
    // its first token, 25.3 ms to its last.
    for timeline in &report.requests {
        assert_eq!(timeline.outcome, ServeOutcome::Finished);
        assert_eq!(timeline.ttft(), Some(ms(10.0)));
        assert_eq!(timeline.tpot(), Some(ms(5.1)));
        assert_eq!(timeline.e2e(), Some(ms(25.3)));
    }
    let last = report.requests[1];
    assert_eq!(last.arrival, at);
    assert_eq!(last.first_token, Some(at + ms(10.0)));
    assert_eq!(last.finished, Some(at + ms(25.3)));
    // Every finished request has its samples.
    assert_eq!(
        (report.ttft.count, report.tpot.count, report.e2e.count),
        (2, 2, 2)
    );
    assert_eq!((report.ttft.p50, report.ttft.max), (ms(10.0), ms(10.0)));
    assert_eq!(report.sim_duration, at + ms(25.3));
    assert_eq!(report.busy_time, ms(50.6));
}

#[test]
fn a_step_past_the_clock_is_an_error_not_a_saturated_time() {
    // The latest arrival leaves half the clock's range (about 292 years)
    // for the replay: a step that long still ends on the clock...
    let latest = crate::MAX_TIMESTAMP_MS;
    let trace = trace(vec![request(latest, &[1], 100, 1)]);
    let half = Duration::from_nanos(u64::MAX / 2);
    let with_step = |per_step| {
        config().with_step_time(StepTime {
            per_step,
            per_prefill_token: Duration::ZERO,
            per_decode_request: Duration::ZERO,
        })
    };
    let report = run(&trace, &with_step(half));
    assert_eq!(report.requests[0].ttft(), Some(half));
    assert_eq!(report.ttft.count, 1);
    // ... and one 2 ms longer does not: an error, not a saturated clock.
    let err = with_step(half + ms(2.0)).run(&trace).unwrap_err();
    assert!(
        matches!(err, SimError::ClockOverflow { step: 1 }),
        "{err:?}"
    );
    assert!(
        err.to_string().starts_with(
            "simulated time passed the clock's limit of about 584 years at scheduler step 1"
        ),
        "{err}"
    );
}
