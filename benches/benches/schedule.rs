//! Schedule benchmarks: kvbm-schedule's `SchedulableSequence` beside
//! kvbm-logical 1.6.1's on one identical workload.
//!
//! Run: `cargo bench -p kvbm-benches --bench schedule`.
//!
//! - `schedule_request`: one request's whole life through the schedule/apply
//!   protocol: build the sequence from a 2048-token prompt, prefill it in
//!   four 512-token chunks (schedule, apply; the last chunk carries the
//!   first generated token), then 512 decode steps (schedule, apply), then
//!   release. Blocks of 16 tokens, LRU pools of 1024 blocks on both sides.
//!   Every iteration gets a unique prompt (nothing matches; once the pool is
//!   full, allocations evict older requests' cached blocks), built outside
//!   the timed region; the released sequence is dropped outside it too.
//!   Throughput is in tokens (prompt + generated).
//!
//! kvbm-logical dispatches events to a no-op delegate by default; kvbm is
//! measured with its default history (`HistoryPolicy::Full`, every event
//! kept) and, as `kvbm-history-off`, with `HistoryPolicy::Off`.

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvbm_benches::{is_smoke_test, random_tokens};

const BLOCK_SIZE: usize = 16;
const PROMPT_TOKENS: usize = 2048;
const CHUNK_TOKENS: usize = 512;
const DECODE_STEPS: usize = 512;
/// The prefill's first token plus one per decode step.
const MAX_OUTPUT_TOKENS: usize = DECODE_STEPS + 1;
const POOL_BLOCKS: usize = 1024;

/// The token "sampled" at step `i` (any value works; the same on both sides).
fn sampled(i: usize) -> u32 {
    (i as u32).wrapping_mul(2_654_435_761) % 128_000
}

mod ours {
    use kvbm_blocks::BlockManager;
    use kvbm_schedule::{HistoryPolicy, SchedulableSequence};

    pub(crate) use kvbm_benches::ours::Gpu;

    pub(crate) fn manager(blocks: usize) -> BlockManager<Gpu> {
        kvbm_benches::ours::manager(blocks, super::BLOCK_SIZE)
    }

    /// One request through prefill chunks and decode steps; returned so that
    /// its drop is not timed.
    pub(crate) fn request(
        manager: &BlockManager<Gpu>,
        prompt: Vec<u32>,
        history: HistoryPolicy,
    ) -> SchedulableSequence<Gpu> {
        let mut seq =
            SchedulableSequence::builder(prompt, super::MAX_OUTPUT_TOKENS, super::BLOCK_SIZE)
                .history(history)
                .build()
                .expect("block size");
        let chunks = super::PROMPT_TOKENS / super::CHUNK_TOKENS;
        for chunk in 0..chunks {
            seq.schedule_prefill(super::CHUNK_TOKENS, manager)
                .expect("room");
            let token = (chunk + 1 == chunks).then(|| super::sampled(0));
            seq.apply_prefill(token, manager).expect("scheduled");
        }
        for step in 1..=super::DECODE_STEPS {
            seq.schedule_decode(manager).expect("room");
            super::black_box(
                seq.apply_decode(super::sampled(step), manager)
                    .expect("scheduled"),
            );
        }
        debug_assert!(seq.is_complete());
        seq.release().expect("idle");
        seq
    }
}

mod peer {
    use kvbm_logical::{BlockManager, SchedulableSequence};

    pub(crate) fn manager(blocks: usize) -> BlockManager<()> {
        kvbm_benches::peer::manager(blocks, super::BLOCK_SIZE)
    }

    /// The same request through kvbm-logical's `SchedulableSequence`.
    pub(crate) fn request(manager: &BlockManager<()>, prompt: Vec<u32>) -> SchedulableSequence<()> {
        let mut seq = SchedulableSequence::<()>::new(
            prompt,
            super::MAX_OUTPUT_TOKENS,
            super::BLOCK_SIZE as u32,
            None,
        );
        let chunks = super::PROMPT_TOKENS / super::CHUNK_TOKENS;
        for chunk in 0..chunks {
            seq.schedule_prefill(super::CHUNK_TOKENS, manager)
                .expect("room");
            let token = (chunk + 1 == chunks).then(|| super::sampled(0));
            seq.apply_prefill(token, manager).expect("scheduled");
        }
        for step in 1..=super::DECODE_STEPS {
            seq.schedule_decode(manager).expect("room");
            super::black_box(
                seq.apply_decode(super::sampled(step), manager)
                    .expect("scheduled"),
            );
        }
        debug_assert!(seq.is_complete());
        seq.release().expect("idle");
        seq
    }
}

/// Unique prompts: tokens above the random range make each one unique from
/// block 0.
fn unique_prompts() -> impl FnMut() -> Vec<u32> {
    let base = random_tokens(5, PROMPT_TOKENS);
    let mut i = 0u32;
    move || {
        i += 1;
        let mut prompt = base.clone();
        prompt[0] = 200_000 + i;
        prompt
    }
}

/// Both sides end in the same place: the whole request ran and was released.
fn check_equivalence() {
    let manager = ours::manager(POOL_BLOCKS);
    let seq = ours::request(&manager, unique_prompts()(), Default::default());
    assert_eq!(
        (
            seq.total_tokens(),
            seq.generated_tokens(),
            seq.held_blocks()
        ),
        (PROMPT_TOKENS + MAX_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS, 0)
    );
    // Everything computed was registered and is cached now.
    assert_eq!(
        manager.metrics().inactive_blocks,
        (PROMPT_TOKENS + DECODE_STEPS) / BLOCK_SIZE
    );
    let manager = peer::manager(POOL_BLOCKS);
    let seq = peer::request(&manager, unique_prompts()());
    assert_eq!(
        (
            seq.total_tokens(),
            seq.generated_tokens(),
            seq.assigned_blocks()
        ),
        (PROMPT_TOKENS + MAX_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS, 0)
    );
}

fn schedule_request(c: &mut Criterion) {
    check_equivalence();
    let mut group = c.benchmark_group("schedule_request");
    group.throughput(Throughput::Elements(
        (PROMPT_TOKENS + MAX_OUTPUT_TOKENS) as u64,
    ));
    let n = PROMPT_TOKENS;

    let manager = ours::manager(POOL_BLOCKS);
    let mut prompts = unique_prompts();
    group.bench_with_input(BenchmarkId::new("kvbm", n), &n, |b, _| {
        b.iter_batched(
            &mut prompts,
            |p| ours::request(&manager, p, kvbm_schedule::HistoryPolicy::Full),
            BatchSize::SmallInput,
        )
    });

    let manager = ours::manager(POOL_BLOCKS);
    let mut prompts = unique_prompts();
    group.bench_with_input(BenchmarkId::new("kvbm-history-off", n), &n, |b, _| {
        b.iter_batched(
            &mut prompts,
            |p| ours::request(&manager, p, kvbm_schedule::HistoryPolicy::Off),
            BatchSize::SmallInput,
        )
    });

    let manager = peer::manager(POOL_BLOCKS);
    let mut prompts = unique_prompts();
    group.bench_with_input(BenchmarkId::new("kvbm-logical", n), &n, |b, _| {
        b.iter_batched(
            &mut prompts,
            |p| peer::request(&manager, p),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn config() -> Criterion {
    let config = Criterion::default().sample_size(30);
    if is_smoke_test() {
        config
    } else {
        config
            .warm_up_time(std::time::Duration::from_secs(1))
            .measurement_time(std::time::Duration::from_secs(4))
    }
}

criterion_group! {
    name = benches;
    config = config();
    targets = schedule_request
}
criterion_main!(benches);
