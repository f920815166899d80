//! Sequence benchmarks: kvbm-sequence beside kvbm-logical 1.6.1 (and, for
//! hashing, dynamo-tokens 1.6.1, which kvbm-logical's `BlockSequence` wraps)
//! on identical workloads: same tokens, 16-token blocks, LRU pools of the
//! same size.
//!
//! Run: `cargo bench -p kvbm-benches --bench sequence`.
//!
//! - `hash_prompt`: split a 32k-token prompt into 16-token blocks and hash
//!   them (throughput in tokens).
//! - `append_tokens`: append 4096 tokens one at a time to an empty sequence,
//!   hashing each block as it fills (throughput in tokens).
//! - `request_lifecycle_{cold,warm}`: one request's whole life: build the
//!   sequence from its prompt, match the cached prefix, allocate the rest plus
//!   a generation block, register, decode 256 tokens (registering and
//!   allocating at every block boundary), release. *Cold* gives every
//!   iteration a unique prompt, so nothing matches and, once the pool is
//!   full, allocations evict; *warm* repeats one prompt, so the whole prompt
//!   (and the decoded blocks) come from the cache.
//!
//! Prompts are built outside the timed region and the finished sequence is
//! dropped outside it, on both sides. `hash_prompt` copies the 128 KiB prompt
//! right before each timed call (`BatchSize::PerIteration`), so it is hashed
//! from cache as a freshly tokenized prompt would be; batching many copies
//! first would measure DRAM bandwidth instead.

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvbm_benches::{is_smoke_test, random_tokens};

const BLOCK_SIZE: usize = 16;
const DECODE_TOKENS: u32 = 256;
/// Pool size for the lifecycle: a few requests' worth, so cold runs evict.
const POOL_BLOCKS: usize = 1024;

mod ours {
    use kvbm_blocks::BlockManager;
    use kvbm_sequence::RequestSequence;

    pub(crate) use kvbm_benches::ours::Gpu;

    pub(crate) fn manager(blocks: usize) -> BlockManager<Gpu> {
        kvbm_benches::ours::manager(blocks, super::BLOCK_SIZE)
    }

    /// One request's lifecycle; the sequence is returned so that its drop
    /// is not timed.
    pub(crate) fn lifecycle(manager: &BlockManager<Gpu>, prompt: Vec<u32>) -> RequestSequence<Gpu> {
        let mut seq =
            RequestSequence::new(prompt, super::DECODE_TOKENS as usize, super::BLOCK_SIZE)
                .expect("block size");
        let hits = seq.match_and_add_prefix(manager).expect("fresh sequence");
        seq.allocate_blocks(seq.num_blocks() - hits + 1, manager)
            .expect("room");
        seq.complete_and_register_pending(manager)
            .expect("same manager");
        for token in 0..super::DECODE_TOKENS {
            if seq.append_token(token).expect("budget").is_some() {
                seq.complete_and_register_pending(manager)
                    .expect("same manager");
                seq.allocate_blocks(1, manager).expect("room");
            }
        }
        seq.release();
        seq
    }
}

mod peer {
    use kvbm_logical::{BlockManager, RequestSequence};

    pub(crate) fn manager(blocks: usize) -> BlockManager<()> {
        kvbm_benches::peer::manager(blocks, super::BLOCK_SIZE)
    }

    /// The same lifecycle through kvbm-logical's `RequestSequence`.
    pub(crate) fn lifecycle(manager: &BlockManager<()>, prompt: Vec<u32>) -> RequestSequence<()> {
        let mut seq = RequestSequence::new(
            prompt,
            super::DECODE_TOKENS as usize,
            super::BLOCK_SIZE as u32,
        );
        let hits = seq.match_and_add_prefix(manager).expect("fresh sequence");
        assert!(
            seq.allocate_blocks(seq.num_blocks() - hits + 1, manager),
            "room"
        );
        seq.complete_and_register_pending(manager);
        for token in 0..super::DECODE_TOKENS {
            if seq.append_token(token).is_some() {
                seq.complete_and_register_pending(manager);
                assert!(seq.allocate_blocks(1, manager), "room");
            }
        }
        seq.release();
        seq
    }
}

/// A 32k-token prompt into 16-token blocks.
fn hash_prompt(c: &mut Criterion) {
    const TOKENS: usize = 32 * 1024;
    let mut group = c.benchmark_group("hash_prompt");
    group.throughput(Throughput::Elements(TOKENS as u64));
    let prompt = random_tokens(1, TOKENS);

    group.bench_with_input(BenchmarkId::new("kvbm", TOKENS), &prompt, |b, prompt| {
        b.iter_batched(
            || prompt.clone(),
            |tokens| {
                kvbm_sequence::BlockSequence::new(black_box(tokens), BLOCK_SIZE).expect("size")
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_with_input(
        BenchmarkId::new("kvbm-logical", TOKENS),
        &prompt,
        |b, prompt| {
            b.iter_batched(
                || prompt.clone(),
                |tokens| {
                    kvbm_logical::BlockSequence::new(black_box(tokens), BLOCK_SIZE as u32, None)
                },
                BatchSize::PerIteration,
            )
        },
    );
    group.bench_with_input(
        BenchmarkId::new("dynamo-tokens", TOKENS),
        &prompt,
        |b, prompt| {
            b.iter_batched(
                || dynamo_tokens::Tokens::from(prompt.clone()),
                |tokens| {
                    dynamo_tokens::TokenBlockSequence::new(
                        black_box(tokens),
                        BLOCK_SIZE as u32,
                        None,
                    )
                },
                BatchSize::PerIteration,
            )
        },
    );
    group.finish();
}

/// One 16-token block, hashed and chained onto a parent, by each hasher:
/// XXH3-128 (the default), keyed SipHash-1-3-128 (`Salt::keyed`).
fn hash_block(c: &mut Criterion) {
    let mut group = c.benchmark_group("hash_block_16");
    group.throughput(Throughput::Elements(1));
    let block = random_tokens(2, 16);
    let key = kvbm_sequence::HashKey::new(*b"bench-secret-key").leak();
    let salts = [
        ("xxh3-128", kvbm_sequence::Salt::NONE),
        (
            "siphash13-128-keyed",
            kvbm_sequence::Salt::keyed(key, b"tenant"),
        ),
    ];
    for (name, salt) in salts {
        group.bench_function(name, |b| {
            let mut parent = 1u128;
            b.iter(|| {
                let content = salt.block_hash(black_box(&block));
                parent = salt.chain_hash(parent, content);
                parent
            })
        });
    }
    group.finish();
}

/// 4096 tokens appended one at a time, as decoding does.
fn append_tokens(c: &mut Criterion) {
    const TOKENS: usize = 4096;
    let mut group = c.benchmark_group("append_tokens");
    group.throughput(Throughput::Elements(TOKENS as u64));
    let tokens = random_tokens(2, TOKENS);

    group.bench_with_input(BenchmarkId::new("kvbm", TOKENS), &tokens, |b, tokens| {
        b.iter_batched(
            || kvbm_sequence::BlockSequence::new(Vec::new(), BLOCK_SIZE).expect("size"),
            |mut seq| {
                for &token in tokens {
                    black_box(seq.append(token));
                }
                seq
            },
            BatchSize::SmallInput,
        )
    });
    group.bench_with_input(
        BenchmarkId::new("kvbm-logical", TOKENS),
        &tokens,
        |b, tokens| {
            b.iter_batched(
                || kvbm_logical::BlockSequence::new(Vec::new(), BLOCK_SIZE as u32, None),
                |mut seq| {
                    for &token in tokens {
                        black_box(seq.append_token(token).expect("append"));
                    }
                    seq
                },
                BatchSize::SmallInput,
            )
        },
    );
    group.bench_with_input(
        BenchmarkId::new("dynamo-tokens", TOKENS),
        &tokens,
        |b, tokens| {
            b.iter_batched(
                || {
                    dynamo_tokens::TokenBlockSequence::new(
                        Vec::<u32>::new().into(),
                        BLOCK_SIZE as u32,
                        None,
                    )
                },
                |mut seq| {
                    for &token in tokens {
                        black_box(seq.append(token).expect("append"));
                    }
                    seq
                },
                BatchSize::SmallInput,
            )
        },
    );
    group.finish();
}

fn prompt_lengths() -> &'static [usize] {
    if is_smoke_test() {
        &[512]
    } else {
        &[512, 4096]
    }
}

/// Unique prompts: every iteration misses the cache and, once the pool is
/// full, evicts older requests' blocks.
fn lifecycle_cold(c: &mut Criterion) {
    let mut group = c.benchmark_group("request_lifecycle_cold");
    for &len in prompt_lengths() {
        let base = random_tokens(3, len);
        // Tokens above the random range make each prompt unique from block 0.
        let unique = |i: &mut u32| {
            *i += 1;
            let mut prompt = base.clone();
            prompt[0] = 200_000 + *i;
            prompt
        };

        let manager = ours::manager(POOL_BLOCKS);
        let mut i = 0;
        group.bench_with_input(BenchmarkId::new("kvbm", len), &len, |b, _| {
            b.iter_batched(
                || unique(&mut i),
                |p| ours::lifecycle(&manager, p),
                BatchSize::SmallInput,
            )
        });

        let manager = peer::manager(POOL_BLOCKS);
        let mut i = 0;
        group.bench_with_input(BenchmarkId::new("kvbm-logical", len), &len, |b, _| {
            b.iter_batched(
                || unique(&mut i),
                |p| peer::lifecycle(&manager, p),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

/// One prompt over and over: the prompt's blocks (and the decoded ones) are
/// matched or deduplicated from the cache.
fn lifecycle_warm(c: &mut Criterion) {
    let mut group = c.benchmark_group("request_lifecycle_warm");
    for &len in prompt_lengths() {
        let prompt = random_tokens(4, len);

        let manager = ours::manager(POOL_BLOCKS);
        drop(ours::lifecycle(&manager, prompt.clone()));
        let probe = kvbm_sequence::RequestSequence::<ours::Gpu>::new(prompt.clone(), 0, BLOCK_SIZE)
            .expect("block size");
        let hits = probe.match_prefix(&manager).expect("same block size").len();
        assert_eq!(hits, len / BLOCK_SIZE, "warm: the whole prompt is cached");
        group.bench_with_input(BenchmarkId::new("kvbm", len), &prompt, |b, prompt| {
            b.iter_batched(
                || prompt.clone(),
                |p| ours::lifecycle(&manager, p),
                BatchSize::SmallInput,
            )
        });

        let manager = peer::manager(POOL_BLOCKS);
        drop(peer::lifecycle(&manager, prompt.clone()));
        let mut probe =
            kvbm_logical::RequestSequence::<()>::new(prompt.clone(), 0, BLOCK_SIZE as u32);
        let hits = probe
            .match_and_add_prefix(&manager)
            .expect("fresh sequence");
        assert_eq!(hits, len / BLOCK_SIZE, "warm: the whole prompt is cached");
        drop(probe);
        group.bench_with_input(
            BenchmarkId::new("kvbm-logical", len),
            &prompt,
            |b, prompt| {
                b.iter_batched(
                    || prompt.clone(),
                    |p| peer::lifecycle(&manager, p),
                    BatchSize::SmallInput,
                )
            },
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(3))
        .sample_size(30);
    targets = hash_block, hash_prompt, append_tokens, lifecycle_cold, lifecycle_warm
}
criterion_main!(benches);
