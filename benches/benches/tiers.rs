//! kvbm-tiers' bookkeeping per block moved (issue 22): storing a batch of
//! device blocks into a host tier, loading one back, and beside them the
//! same device work with no tier, so the tiers' share per block shows.
//!
//! Every row moves a batch of B blocks per iteration (B = 32, and 512: a
//! prefill's worth of 16-token blocks at an 8,192-token budget) through a
//! device pool of 2B blocks, cycling through 8 chains so every batch is new
//! to the pools it reaches (fixtures in `kvbm_benches::tiers`):
//!
//! - `device-only`: register the batch, drop it into the cache (each
//!   allocation evicts the batch cached two iterations ago);
//! - `store`: the same, plus `offload_batch` into a write-through host tier
//!   of 4B blocks, `take_planned`, `complete` (the host is full: each store
//!   evicts its oldest batch);
//! - `load`: the host holds all 8 chains, the device none of the one asked
//!   for: `onboard` (which allocates the device blocks, evicting), then
//!   `take_planned`, `complete` (a `Settled::Loaded`) and the loaded
//!   blocks dropped into the device cache.
//!
//! The engine's copy itself is not here: the tiers only plan it. No peer
//! row: kvbm-logical 1.6.1 has no tiers below its pool. Throughput is in
//! blocks moved; divide to get ns per block.
//!
//! Run: `cargo bench -p kvbm-benches --bench tiers`;
//! smoke: `cargo test -p kvbm-benches --bench tiers`. Instruction counts of
//! the same fixtures: `--example tiers_instructions`.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvbm_benches::tiers::{DeviceOnly, Load, Store};

const BATCHES: [usize; 2] = [32, 512];

fn bench_tiers(c: &mut Criterion) {
    let mut group = c.benchmark_group("tiers");
    for batch in BATCHES {
        group.throughput(Throughput::Elements(batch as u64));
        let mut device = DeviceOnly::new(batch);
        group.bench_function(BenchmarkId::new("device-only", batch), |b| {
            b.iter(|| device.step())
        });
        let mut store = Store::new(batch);
        group.bench_function(BenchmarkId::new("store", batch), |b| {
            b.iter(|| store.step())
        });
        let mut load = Load::new(batch);
        group.bench_function(BenchmarkId::new("load", batch), |b| b.iter(|| load.step()));
    }
    group.finish();
}

criterion_group!(benches, bench_tiers);
criterion_main!(benches);
