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
//! `fleet-1024-*`: 1,024 workers each holding one 64-block chain shared by
//! all (a system prompt) and one 64-block chain of their own, keyed by
//! well-mixed hashes as real block hashes are. `overlaps/fleet-1024-all`
//! looks up the shared chain (every worker matches all 64 blocks),
//! `overlaps/fleet-1024-one` one worker's own chain (one worker matches):
//! what a lookup costs at fleet size when everyone or no one else matches.
//! `route-kv-aware/fleet-1024-*` routes those requests, every worker idle
//! (so the workers at each depth of the request tie for the least work and
//! all are offered to the policy); `-loaded` after each worker reported a
//! load of its own (so the policy is offered the least-loaded worker at
//! each depth: one or two).
//! `store+remove/fleet-1024` stores then removes a 64-block chain of new
//! blocks on one of the 1,024 workers, `store+remove/fleet-1024-shared`
//! removes then stores again its copy of the shared chain (blocks 1,023
//! other workers hold); their throughput is in blocks carried by the two
//! events (128), so criterion's time per element is an event's cost per
//! block.
//!
//! Run: `cargo bench -p kvbm-benches --bench router`;
//! smoke: `cargo test -p kvbm-benches --bench router`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvbm_benches::fleet::{self, CHAIN, SHARED_CHAIN, chain, removed, stored};
use kvbm_benches::is_smoke_test;
use kvbm_events::KvEvent;
use kvbm_router::{KvAware, RouteRequest, Router, WorkerLoad};

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

/// The fleet-size rows: lookups among 1,024 workers, and an event's cost
/// per block on one of them.
fn bench_fleet(c: &mut Criterion) {
    // 1,024 workers, each with the shared chain and one of its own.
    let router = fleet::router().expect("a new router takes the fleet");
    let mut group = c.benchmark_group("router");
    group.throughput(Throughput::Elements(CHAIN));
    let all: Vec<u128> = chain(SHARED_CHAIN).map(u128::from).collect();
    let one: Vec<u128> = chain(517).map(u128::from).collect();
    for (name, keys, holders) in [
        ("fleet-1024-all", &all, fleet::WORKERS as usize),
        ("fleet-1024-one", &one, 1),
    ] {
        let found = router.index().overlaps(keys);
        assert_eq!(found.len(), holders, "{name}");
        assert!(found.iter().all(|&(_, depth)| depth == CHAIN as usize));
        group.bench_with_input(BenchmarkId::new("overlaps", name), keys, |b, keys| {
            b.iter(|| black_box(router.index().overlaps(black_box(keys))));
        });
        // The whole route: the lookup, every worker's load, the policy.
        group.bench_with_input(BenchmarkId::new("route-kv-aware", name), keys, |b, keys| {
            let mut policy = KvAware::new(0);
            let request = RouteRequest::new(keys, 16 * CHAIN as usize, 16);
            b.iter(|| black_box(router.route(&request, &mut policy)));
        });
    }
    // The same routes once every worker has reported a load of its own.
    for worker in 0..fleet::WORKERS {
        let load = WorkerLoad::new(1 + (worker * 7_919) % 1_024, (worker * 104_729) % 4_096, 1);
        router.set_load(worker, load).expect("known worker");
    }
    for (name, keys) in [
        ("fleet-1024-all-loaded", &all),
        ("fleet-1024-one-loaded", &one),
    ] {
        group.bench_with_input(BenchmarkId::new("route-kv-aware", name), keys, |b, keys| {
            let mut policy = KvAware::new(0);
            let request = RouteRequest::new(keys, 16 * CHAIN as usize, 16);
            b.iter(|| black_box(router.route(&request, &mut policy)));
        });
    }
    // Two events of 64 blocks each per iteration.
    group.throughput(Throughput::Elements(2 * CHAIN));
    let worker = 5;
    let fresh = chain(1 << 40);
    let (store, remove) = (stored(fresh.clone()), removed(fresh));
    group.bench_function(BenchmarkId::new("store+remove", "fleet-1024"), |b| {
        b.iter(|| {
            router.apply(worker, black_box(&store)).expect("known");
            router.apply(worker, black_box(&remove)).expect("known");
        });
    });
    let shared = chain(SHARED_CHAIN);
    let (store, remove) = (stored(shared.clone()), removed(shared));
    group.bench_function(BenchmarkId::new("store+remove", "fleet-1024-shared"), |b| {
        b.iter(|| {
            router.apply(worker, black_box(&remove)).expect("known");
            router.apply(worker, black_box(&store)).expect("known");
        });
    });
    assert_eq!(
        router.stats(worker).map(|s| s.held_blocks),
        Some(2 * CHAIN as usize)
    );
    group.finish();
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
            let request = RouteRequest::new(keys, 16 * BLOCKS as usize, 16);
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
    let removal =
        KvEvent::BlockRemoved(kvbm_events::BlockRemoved::new(blocks.block_hashes.clone()));
    router.add_worker(WORKERS).expect("new worker");
    group.bench_function("store+remove", |b| {
        b.iter(|| {
            router.apply(WORKERS, &event).expect("known");
            router.apply(WORKERS, &removal).expect("known");
        });
    });
    group.finish();
}

criterion_group!(benches, bench_router, bench_fleet);
criterion_main!(benches);
