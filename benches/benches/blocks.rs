//! Block pool benchmarks: kvbm-blocks beside kvbm-logical 1.6.1 on identical
//! workloads (same hash values, same block counts, LRU on both sides).
//!
//! Run: `cargo bench -p kvbm-benches --bench blocks`. Every group reports
//! per-block throughput (`Throughput::Elements`), so criterion prints
//! blocks/s; divide to get ns per block.

use std::hint::black_box;
use std::sync::{Arc, Mutex};

use criterion::{
    BatchSize, Bencher, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use kvbm_benches::{Xorshift, chain_values, is_smoke_test, resident_bytes};

/// Tokens per block on both sides (the peer's test helpers use 4 too).
const BLOCK_SIZE: usize = 4;

mod ours {
    use kvbm_blocks::{BlockManager, ImmutableBlocks, SequenceHash};

    pub(crate) use kvbm_benches::ours::{Gpu, hashes};

    pub(crate) fn manager(blocks: usize) -> BlockManager<Gpu> {
        kvbm_benches::ours::manager(blocks, super::BLOCK_SIZE)
    }

    pub(crate) fn register(
        manager: &BlockManager<Gpu>,
        hashes: &[SequenceHash],
    ) -> ImmutableBlocks<Gpu> {
        kvbm_benches::ours::register(manager, hashes)
    }
}

mod peer {
    use dynamo_tokens::PositionalLineageHash;
    use kvbm_logical::{BlockManager, ImmutableBlock};

    pub(crate) use kvbm_benches::peer::hashes;

    pub(crate) fn manager(blocks: usize) -> BlockManager<()> {
        kvbm_benches::peer::manager(blocks, super::BLOCK_SIZE)
    }

    pub(crate) fn register(
        manager: &BlockManager<()>,
        hashes: &[PositionalLineageHash],
    ) -> Vec<ImmutableBlock<()>> {
        kvbm_benches::peer::register(manager, hashes, super::BLOCK_SIZE)
    }
}

const CHAIN_LENGTHS: [usize; 3] = [8, 32, 128];

/// `match_blocks` on an n-block chain that other handles keep pinned (`held`),
/// or that sits in the cache (every iteration revives the chain and its drop
/// caches it again).
fn match_chain(c: &mut Criterion, group_name: &str, held: bool) {
    let mut group = c.benchmark_group(group_name);
    for n in CHAIN_LENGTHS {
        group.throughput(Throughput::Elements(n as u64));
        let values = chain_values(&mut Xorshift::new(n as u64), n);

        let manager = ours::manager(n);
        let hashes = ours::hashes(&values);
        let pinned = ours::register(&manager, &hashes);
        let _pinned = held.then_some(pinned);
        group.bench_with_input(BenchmarkId::new("kvbm", n), &n, |b, _| {
            b.iter(|| manager.match_blocks(black_box(&hashes)))
        });

        let manager = peer::manager(n);
        let hashes = peer::hashes(&values);
        let pinned = peer::register(&manager, &hashes);
        let _pinned = held.then_some(pinned);
        group.bench_with_input(BenchmarkId::new("kvbm-logical", n), &n, |b, _| {
            b.iter(|| manager.match_blocks(black_box(&hashes)))
        });
        if held && n == CHAIN_LENGTHS[0] {
            group.bench_with_input(BenchmarkId::new("handle-floor", n), &n, handle_floor);
        }
    }
    group.finish();
}

/// What a match that returns an owning batch over a mutex-guarded pool
/// pays per call before it touches a block, and what ours pays: the batch's
/// `Arc` clone and drop, and two uncontended lock pairs (the match's and
/// the drop's). A held match's time cannot fall below it, so the held rows'
/// ratio to kvbm-logical is bounded by the peer's time over this one.
fn handle_floor(b: &mut Bencher<'_>, _: &usize) {
    let pool = Arc::new(Mutex::new(0u64));
    b.iter(|| {
        let batch = Arc::clone(black_box(&pool));
        *batch.lock().expect("never poisoned") += 1;
        *batch.lock().expect("never poisoned") -= 1;
        batch
    })
}

fn match_held(c: &mut Criterion) {
    match_chain(c, "match_held", true);
}

fn match_cached(c: &mut Criterion) {
    match_chain(c, "match_cached", false);
}

/// allocate 32 → stage → register → drop, with fresh hashes every iteration
/// in a 64-block pool, so from the third iteration on every allocation
/// evicts the oldest cached request (the steady state of a full cache).
fn cycle(c: &mut Criterion) {
    const N: usize = 32;
    const SETS: usize = 64;
    let mut group = c.benchmark_group("allocate_stage_register_drop");
    group.throughput(Throughput::Elements(N as u64));
    let mut rng = Xorshift::new(42);
    let sets: Vec<Vec<u64>> = (0..SETS).map(|_| chain_values(&mut rng, N)).collect();

    let manager = ours::manager(2 * N);
    let our_sets: Vec<_> = sets.iter().map(|values| ours::hashes(values)).collect();
    let mut i = 0;
    group.bench_function(BenchmarkId::new("kvbm", N), |b| {
        b.iter(|| {
            i = (i + 1) % SETS;
            let staged = manager
                .allocate_blocks(N)
                .expect("room")
                .into_iter()
                .zip(&our_sets[i])
                .map(|(block, &hash)| block.stage(hash, BLOCK_SIZE).expect("size"))
                .collect();
            manager.register_blocks(staged).expect("same manager")
        })
    });

    let manager = peer::manager(2 * N);
    let peer_sets: Vec<_> = sets.iter().map(|values| peer::hashes(values)).collect();
    let mut i = 0;
    group.bench_function(BenchmarkId::new("kvbm-logical", N), |b| {
        b.iter(|| {
            i = (i + 1) % SETS;
            let staged = manager
                .allocate_blocks(N)
                .expect("room")
                .into_iter()
                .zip(&peer_sets[i])
                .map(|(block, &hash)| block.stage(hash, BLOCK_SIZE).expect("size"))
                .collect();
            manager.register_blocks(staged)
        })
    });
    group.finish();
}

/// Dropping 128 registered, pinned blocks (each goes to the cache). Ours as
/// the batch a request holds, and as 128 single handles for comparison.
fn drop_registered(c: &mut Criterion) {
    const N: usize = 128;
    let mut group = c.benchmark_group("drop_registered");
    group.throughput(Throughput::Elements(N as u64));
    let values = chain_values(&mut Xorshift::new(7), N);

    let setup_ours = || {
        let manager = ours::manager(N);
        let blocks = ours::register(&manager, &ours::hashes(&values));
        (manager, blocks)
    };
    group.bench_function(BenchmarkId::new("kvbm", N), |b| {
        b.iter_batched(
            setup_ours,
            |(manager, blocks)| {
                drop(black_box(blocks));
                manager // dropped outside the timed region
            },
            BatchSize::SmallInput,
        )
    });
    group.bench_function(BenchmarkId::new("kvbm-single-handles", N), |b| {
        b.iter_batched(
            || {
                let (manager, blocks) = setup_ours();
                (manager, blocks.into_iter().collect::<Vec<_>>())
            },
            |(manager, blocks)| {
                drop(black_box(blocks));
                manager
            },
            BatchSize::SmallInput,
        )
    });
    group.bench_function(BenchmarkId::new("kvbm-logical", N), |b| {
        b.iter_batched(
            || {
                let manager = peer::manager(N);
                let blocks = peer::register(&manager, &peer::hashes(&values));
                (manager, blocks)
            },
            |(manager, blocks)| {
                drop(black_box(blocks));
                manager
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// Matching an 8-block chain among 1k and 1M cached blocks whose hashes are
/// small consecutive integers, as trace ids are: the cost must not grow.
/// Also reports resident bytes per cached block.
fn match_at_scale(c: &mut Criterion) {
    const CHAIN: usize = 8;
    let scales: &[usize] = if is_smoke_test() {
        &[1 << 10, 1 << 14]
    } else {
        &[1 << 10, 1 << 20]
    };
    let mut group = c.benchmark_group("match_cached_at_scale");
    group.throughput(Throughput::Elements(CHAIN as u64));
    for &cached in scales {
        // Chains of 8 consecutive ids: 0..8, 8..16, ...; match one from the middle.
        let chains: Vec<Vec<u64>> = (0..cached / CHAIN)
            .map(|c| ((c * CHAIN) as u64..((c + 1) * CHAIN) as u64).collect())
            .collect();
        let probe = &chains[chains.len() / 2];

        let before = resident_bytes();
        let manager = ours::manager(cached);
        for chain in &chains {
            drop(ours::register(&manager, &ours::hashes(chain)));
        }
        report_memory("kvbm", cached, before);
        let hashes = ours::hashes(probe);
        group.bench_with_input(BenchmarkId::new("kvbm", cached), &cached, |b, _| {
            b.iter(|| manager.match_blocks(black_box(&hashes)))
        });
        drop(manager);

        let before = resident_bytes();
        let manager = peer::manager(cached);
        for chain in &chains {
            drop(peer::register(&manager, &peer::hashes(chain)));
        }
        report_memory("kvbm-logical", cached, before);
        let hashes = peer::hashes(probe);
        group.bench_with_input(BenchmarkId::new("kvbm-logical", cached), &cached, |b, _| {
            b.iter(|| manager.match_blocks(black_box(&hashes)))
        });
    }
    group.finish();
}

fn report_memory(who: &str, cached: usize, before: Option<u64>) {
    if let (Some(before), Some(after)) = (before, resident_bytes()) {
        let per_block = after.saturating_sub(before) as f64 / cached as f64;
        eprintln!(
            "memory: {who} holds {cached} cached blocks in ~{per_block:.0} resident bytes each"
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(3))
        .sample_size(40);
    targets = match_held, match_cached, cycle, drop_registered, match_at_scale
}
criterion_main!(benches);
