//! kvbm-router's costs: applying a worker's stored blocks, and looking up a
//! request's overlap with every worker, per block.
//!
//! 16 workers each hold 64 chains of 256 blocks (the first 64 blocks of
//! every chain shared by all workers, like a system prompt). A lookup walks
//! a 256-block request: `full` is held whole by one worker, `shared` only
//! its 64-block shared prefix, by every worker. The index keeps each
//! worker's blocks apart, so a lookup probes each worker's set until it
//! misses: `full` costs 256 probes plus one per other worker, `shared` 65
//! per worker. `fleet-256` is `full` among 256 workers of 4 chains each:
//! what a lookup pays per worker in a large fleet. Throughput is in blocks
//! of the request.
//!
//! Run: `cargo bench -p kvbm-benches --bench router`;
//! smoke: `cargo test -p kvbm-benches --bench router`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvbm_benches::is_smoke_test;
use kvbm_events::{BlockHash, BlockStored, KvEvent};
use kvbm_router::{KvAware, RouteRequest, Router};

const WORKERS: u64 = 16;
/// Workers of the large-fleet lookup.
const FLEET: u64 = 256;
const BLOCKS: u64 = 256;
const SHARED: u64 = 64;

/// Key of block `i` of chain `chain` of `worker` (the shared prefix is the
/// same for everyone).
fn key(worker: u64, chain: u64, i: u64) -> u64 {
    if i < SHARED {
        1 + i
    } else {
        (worker << 48) | (chain << 24) | i
    }
}

fn stored(keys: impl Iterator<Item = u64>) -> KvEvent {
    KvEvent::BlockStored(BlockStored {
        block_hashes: keys.map(BlockHash::Int).collect(),
        parent_block_hash: None,
        token_ids: Vec::new(),
        block_size: 16,
        lora_id: None,
        medium: None,
        lora_name: None,
    })
}

fn filled_router(workers: u64, chains: u64) -> Router {
    let router = Router::new();
    for worker in 0..workers {
        router.add_worker(worker).expect("new worker");
        for chain in 0..chains {
            let event = stored((0..BLOCKS).map(|i| key(worker, chain, i)));
            router.apply(worker, &event).expect("known worker");
        }
    }
    router
}

fn bench_router(c: &mut Criterion) {
    let chains = if is_smoke_test() { 2 } else { 64 };
    let router = filled_router(WORKERS, chains);
    let mut group = c.benchmark_group("router");
    group.throughput(Throughput::Elements(BLOCKS));
    let full: Vec<u128> = (0..BLOCKS).map(|i| u128::from(key(3, 1, i))).collect();
    let shared: Vec<u128> = (0..BLOCKS).map(|i| u128::from(key(99, 0, i))).collect();
    for (name, keys) in [("full", &full), ("shared", &shared)] {
        group.bench_with_input(BenchmarkId::new("overlaps", name), keys, |b, keys| {
            b.iter(|| black_box(router.index().overlaps(black_box(keys))));
        });
        group.bench_with_input(BenchmarkId::new("route-kv-aware", name), keys, |b, keys| {
            let mut policy = KvAware::new(0);
            let request = RouteRequest {
                keys,
                prompt_tokens: 16 * BLOCKS as usize,
                block_size: 16,
            };
            b.iter(|| black_box(router.route(&request, &mut policy)));
        });
    }
    let fleet = filled_router(FLEET, if is_smoke_test() { 1 } else { 4 });
    group.bench_with_input(
        BenchmarkId::new("overlaps", "fleet-256"),
        &full,
        |b, keys| {
            b.iter(|| black_box(fleet.index().overlaps(black_box(keys))));
        },
    );
    drop(fleet);
    // Storing then removing one worker's 256-block chain.
    let event = stored((0..BLOCKS).map(|i| key(WORKERS, 0, i) | 1 << 62));
    let KvEvent::BlockStored(ref blocks) = event else {
        unreachable!()
    };
    let removal = KvEvent::BlockRemoved(kvbm_events::BlockRemoved {
        block_hashes: blocks.block_hashes.clone(),
        medium: None,
    });
    router.add_worker(WORKERS).expect("new worker");
    group.bench_function("store+remove", |b| {
        b.iter(|| {
            router.apply(WORKERS, &event).expect("known");
            router.apply(WORKERS, &removal).expect("known");
        });
    });
    group.finish();
}

criterion_group!(benches, bench_router);
criterion_main!(benches);
