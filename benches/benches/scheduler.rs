//! The `Scheduler`'s step loop (plan a step, apply the engine's outputs),
//! per scheduled request-step, on the shapes of the all-at-once Mooncake
//! replay (block size 16, 187,500 blocks, 256 running, 8,192-token budget).
//! No peer runs in-process: vLLM's own v1 scheduler is Python (41.5-61 µs per
//! scheduled request-step on this trace, measured outside this bench).
//!
//! - `decode`: every running request decodes one token a step.
//! - `speculative`: the same with 3 draft tokens per decode, 2 accepted.
//! - `churn`: requests finish after 32 tokens and are replaced at once, so
//!   each step mixes prefill chunks (2,048-token prompts sharing a 1,024-token
//!   prefix), admissions, finishes and decodes.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvbm_benches::ours::{Gpu, manager};
use kvbm_benches::random_tokens;
use kvbm_queue::{EngineOutput, InferenceRequest, RequestId, Scheduler, SchedulerConfig, StepPlan};

const BLOCK_SIZE: usize = 16;

fn scheduler(running: usize, drafts: usize) -> Scheduler<Gpu> {
    let blocks = 187_500;
    let config = SchedulerConfig::default()
        .with_max_running(running)
        .with_token_budget(8_192)
        .with_chunk_size(8_192)
        .with_watermark_blocks(0)
        .with_speculative_tokens(drafts);
    Scheduler::new(manager(blocks, BLOCK_SIZE), config).expect("valid configuration")
}

/// The engine: a token for every decode and every emitting chunk; a
/// speculative decode accepts two of its drafts (fewer if it has fewer).
fn outputs(plan: &StepPlan, out: &mut Vec<EngineOutput>) {
    out.clear();
    out.extend(plan.prefill.iter().map(|p| match p.emits_token {
        true => EngineOutput::token(p.id, 7),
        false => EngineOutput::no_token(p.id),
    }));
    out.extend(plan.decode.iter().map(|d| match d.draft_tokens {
        0 => EngineOutput::token(d.id, 7),
        drafts => EngineOutput::speculative(d.id, vec![5; drafts.min(2)], 7),
    }));
}

/// One planned and applied step; the requests it scheduled.
fn step(s: &mut Scheduler<Gpu>, out: &mut Vec<EngineOutput>) -> usize {
    let plan = s.step().expect("no step pending");
    outputs(&plan, out);
    let report = s.apply(out).expect("outputs match the plan");
    black_box(&report);
    out.len()
}

fn prompt(id: u64, shared: &[u32], len: usize) -> Vec<u32> {
    let mut tokens = shared.to_vec();
    tokens.extend(random_tokens(id + 1, len - shared.len()));
    tokens
}

/// Most decode steps one scheduler serves in `decode`: every request may
/// generate this many tokens, which keeps the pool far from full.
const DECODE_STEPS: u32 = 4_000;

/// `running` requests with 2,048-token prompts (a 1,024-token shared prefix),
/// all prefilled, so that every step from now on decodes all of them.
fn decoding(running: usize, drafts: usize, out: &mut Vec<EngineOutput>) -> Scheduler<Gpu> {
    let mut s = scheduler(running, drafts);
    let shared = random_tokens(0, 1_024);
    for id in 0..running as u64 {
        let tokens = prompt(id, &shared, 2_048);
        s.submit(InferenceRequest::new(
            RequestId(id),
            tokens,
            DECODE_STEPS + 8,
        ))
        .expect("fits");
    }
    loop {
        let plan = s.step().expect("no step pending");
        let all_decode = plan.decode.len() == running;
        outputs(&plan, out);
        s.apply(out).expect("outputs match the plan");
        if all_decode {
            return s;
        }
    }
}

fn bench_decode(c: &mut Criterion) {
    decode_group(c, "scheduler_step/decode", &[64, 256], 0);
    decode_group(c, "scheduler_step/speculative", &[256], 3);
}

/// Steps of schedulers where `running` requests decode with `drafts` drafts.
fn decode_group(c: &mut Criterion, name: &str, sizes: &[usize], drafts: usize) {
    let mut group = c.benchmark_group(name);
    group.warm_up_time(Duration::from_millis(500));
    // With drafts a request gains up to 3 tokens a step.
    let steps_per_scheduler = u64::from(DECODE_STEPS) / (drafts as u64 + 1);
    for &running in sizes {
        group.throughput(Throughput::Elements(running as u64));
        group.bench_function(BenchmarkId::new("kvbm", running), |b| {
            let mut out = Vec::new();
            b.iter_custom(|iters| {
                // A fresh decoding scheduler every `steps_per_scheduler`
                // steps, built outside the timed region.
                let mut elapsed = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let mut s = decoding(running, drafts, &mut out);
                    let steps = left.min(steps_per_scheduler);
                    let started = Instant::now();
                    for _ in 0..steps {
                        step(&mut s, &mut out);
                    }
                    elapsed += started.elapsed();
                    left -= steps;
                }
                elapsed
            });
        });
    }
    group.finish();
}

fn bench_churn(c: &mut Criterion) {
    let mut group = c.benchmark_group("scheduler_step/churn");
    group.warm_up_time(Duration::from_millis(500));
    let running = 256;
    let mut s = scheduler(running, 0);
    let shared = random_tokens(0, 1_024);
    let mut next_id = 0u64;
    let mut refill = |s: &mut Scheduler<Gpu>| {
        while s.census().waiting < 8 {
            let request =
                InferenceRequest::new(RequestId(next_id), prompt(next_id, &shared, 2_048), 32);
            s.submit(request).expect("fits");
            next_id += 1;
        }
    };
    let mut out = Vec::new();
    for _ in 0..200 {
        refill(&mut s);
        step(&mut s, &mut out);
    }
    // Elements are request-steps: count them per iteration as they come.
    let scheduled_per_step = {
        let mut total = 0;
        for _ in 0..50 {
            refill(&mut s);
            total += step(&mut s, &mut out);
        }
        (total / 50).max(1)
    };
    group.throughput(Throughput::Elements(scheduled_per_step as u64));
    group.bench_function(BenchmarkId::new("kvbm", running), |b| {
        b.iter(|| {
            refill(&mut s);
            step(&mut s, &mut out)
        });
    });
    group.finish();
}

criterion_group!(benches, bench_decode, bench_churn);
criterion_main!(benches);
