//! kvbm-store's block stores beside the limit of their medium, measured in
//! the same run (issue: performance against the physical limit).
//!
//! One group per block size, `stores/16-tokens` and `stores/512-tokens`,
//! each with `Throughput::Bytes` (criterion prints GiB/s) and these rows,
//! every one moving the same batch of 32 blocks per iteration (the transfer
//! engine's `EngineConfig::batch_blocks` default):
//!
//! - `memcpy`: the batch copied into a preallocated buffer of the same
//!   layout (one contiguous region of block-sized slots): the host limit of
//!   `arena/put` (caller's blocks into the arena) and `arena/get` (arena
//!   into the caller's buffers). The arena stores the caller's checksum and
//!   returns it on get without recomputing it.
//! - `file/write`: plain positional writes (`write_all_at`, one per block,
//!   sequential offsets) of the same volume into a preallocated file in the
//!   same directory, through the page cache like the store (no `O_DIRECT`,
//!   no fsync on either side): the limit of `disk/put`.
//! - `file/read`: the same file read back into the caller's buffers: the
//!   limit of `disk/get`. The disk store reads each slot's header, then its
//!   block, and verifies the block's checksum before it answers (a block
//!   over 256 KiB read and hashed 256 KiB at a time, while the piece is in
//!   the cache); that verification is part of its cost and is measured as
//!   is.
//! - `xxh3`: [`Checksum::of`] over the batch (XXH3 with AVX2 picked at run
//!   time), what the disk store's verification costs (and what the
//!   transfer engine pays once per block at the device).
//! - `redis/put`, `redis/get`: the Redis Cluster store, one pipelined batch
//!   per call, only when `KVBM_REDIS_CLUSTER` names a cluster's nodes
//!   (comma-separated `redis://` URLs); skipped with a note otherwise. Its
//!   limit is `redis-benchmark` SET/GET of the same value size and pipeline
//!   depth, which `cargo xtask store-limits` runs beside this bench.
//!
//! The caller's buffers (the batch's bytes, the gets' destination) start
//! on a page, as an engine's DMA-registered buffers do. It matters for the
//! plain reads: glibc places a large allocation 16 bytes past a page, and
//! the kernel's copy from a page-cache page into a destination 8 or 16
//! bytes past a page ran at ~1.4 GiB/s instead of ~10-15 GiB/s on this
//! project's AMD EPYC machines (`rep movsb` with source and destination
//! nearly 4 KiB-aliased), which made `file/read` a false limit (the disk
//! store's blocks sit 64 bytes into their slots and never hit it).
//!
//! Puts time only the put: each iteration first removes the batch (untimed)
//! so every put stores its blocks anew, and the blocks' checksums are
//! computed once in the setup (the transfer engine computes them at the
//! device, not per store).
//!
//! # Scale
//!
//! An 8B model (Llama-3-8B: 32 layers, 8 KV heads of 128 dimensions, K and
//! V, bf16) holds 128 KiB of KV per token: a 16-token block is 2 MiB, a
//! 512-token block 64 MiB, and a batch of 32 of those (2 GiB) is too big for
//! these machines. The bytes per token are scaled down 16 times, to 8 KiB:
//! blocks of 128 KiB and 4 MiB, batches of 4 MiB and 128 MiB, so no row's
//! working set (source and destination) passes 256 MiB. The smoke run
//! (`cargo test --benches`) uses 64 bytes per token.
//!
//! Run: `cargo bench -p kvbm-benches --bench stores`, or the ratio table:
//! `cargo xtask store-limits` (starts a Redis Cluster for the Redis rows);
//! smoke: `cargo test -p kvbm-benches --bench stores`.

use std::fs::{File, OpenOptions};
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Bencher, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use kvbm_benches::is_smoke_test;
use kvbm_blocks::SequenceHash;
use kvbm_store::{
    BlockRef, BlockStore, Checksum, DiskConfig, DiskStore, HostArena, StoreError, fake_kv,
};
use kvbm_store_redis::{RedisClusterStore, RedisConfig};

/// KV bytes per token of an 8B model: 32 layers x 8 KV heads x 128 dims x
/// (K, V) x 2 bytes.
const MODEL_BYTES_PER_TOKEN: usize = 32 * 8 * 128 * 2 * 2;
/// How much smaller the benchmarked tokens are (see the module docs).
const SCALE_DOWN: usize = 16;
/// Bytes per token in the smoke run.
const SMOKE_BYTES_PER_TOKEN: usize = 64;
/// Block sizes in tokens.
const TOKENS: [usize; 2] = [16, 512];
/// Blocks per call (`EngineConfig::batch_blocks`'s default).
const BATCH: usize = 32;
/// The variable naming the Redis Cluster's nodes.
const CLUSTER_ENV: &str = "KVBM_REDIS_CLUSTER";

fn bytes_per_token() -> usize {
    if is_smoke_test() {
        SMOKE_BYTES_PER_TOKEN
    } else {
        MODEL_BYTES_PER_TOKEN / SCALE_DOWN
    }
}

/// Where the caller's buffers start: on a page, as an engine's
/// DMA-registered buffers do (see the module docs for why it matters).
const PAGE: usize = 4096;

/// `len` zeroed bytes starting on a page (inside a slightly larger `Vec`).
struct PageAligned {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl PageAligned {
    fn new(len: usize) -> Self {
        let buf = vec![0u8; len + PAGE];
        let start = buf.as_ptr().align_offset(PAGE);
        Self { buf, start, len }
    }

    fn as_slice(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// A batch of blocks: keys, bytes (one contiguous page-aligned region,
/// block after block) and checksums, computed once.
struct Batch {
    block_bytes: usize,
    keys: Vec<u128>,
    bytes: PageAligned,
    sums: Vec<Checksum>,
}

impl Batch {
    fn new(block_bytes: usize) -> Self {
        let keys: Vec<u128> = (0..BATCH as u128)
            .map(|i| SequenceHash::root(0x5703_e000 + i).value())
            .collect();
        let mut bytes = PageAligned::new(BATCH * block_bytes);
        for (key, block) in keys
            .iter()
            .zip(bytes.as_mut_slice().chunks_mut(block_bytes))
        {
            fake_kv(*key, block);
        }
        let sums = keys
            .iter()
            .zip(bytes.as_slice().chunks(block_bytes))
            .map(|(key, block)| Checksum::of(*key, block))
            .collect();
        Self {
            block_bytes,
            keys,
            bytes,
            sums,
        }
    }

    fn blocks(&self) -> impl Iterator<Item = &[u8]> {
        self.bytes.as_slice().chunks(self.block_bytes)
    }

    fn refs(&self) -> Vec<BlockRef<'_>> {
        self.keys
            .iter()
            .zip(&self.sums)
            .zip(self.blocks())
            .map(|((&key, &checksum), bytes)| BlockRef {
                key,
                lineage: kvbm_store::Lineage::ROOT,
                checksum,
                bytes,
            })
            .collect()
    }

    fn total_bytes(&self) -> usize {
        self.bytes.len
    }
}

/// Panics unless every block's call succeeded.
fn all_ok<T>(results: Vec<Result<T, StoreError>>, what: &str) {
    for result in results {
        if let Err(err) = result {
            panic!("{what}: {err}");
        }
    }
}

/// Times `put` of the batch, each iteration after an untimed removal.
fn bench_put(b: &mut Bencher<'_>, store: &dyn BlockStore, batch: &Batch) {
    let refs = batch.refs();
    b.iter_custom(|iters| {
        let mut timed = Duration::ZERO;
        for _ in 0..iters {
            all_ok(store.remove(&batch.keys), "remove");
            let started = Instant::now();
            let results = store.put(black_box(&refs));
            timed += started.elapsed();
            all_ok(results, "put");
        }
        timed
    });
}

/// Times `get` of the batch (stored by the caller) into `out`.
fn bench_get(b: &mut Bencher<'_>, store: &dyn BlockStore, batch: &Batch, out: &mut [u8]) {
    b.iter(|| {
        let mut reads: Vec<(u128, &mut [u8])> = batch
            .keys
            .iter()
            .copied()
            .zip(out.chunks_mut(batch.block_bytes))
            .collect();
        all_ok(store.get(black_box(&mut reads)), "get");
    });
}

/// A file of the batch's volume in `dir`, written once so every page of
/// it exists before the timed writes.
fn preallocated_file(dir: &Path, batch: &Batch) -> File {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.join("plain.bin"))
        .expect("create the plain file");
    write_blocks(&file, batch);
    file
}

fn write_blocks(file: &File, batch: &Batch) {
    for (at, block) in batch.blocks().enumerate() {
        file.write_all_at(block, (at * batch.block_bytes) as u64)
            .expect("write the plain file");
    }
}

fn read_blocks(file: &File, block_bytes: usize, out: &mut [u8]) {
    for (at, block) in out.chunks_mut(block_bytes).enumerate() {
        file.read_exact_at(block, (at * block_bytes) as u64)
            .expect("read the plain file");
    }
}

/// The Redis store on `KVBM_REDIS_CLUSTER`'s nodes, or `None` (with a note)
/// when the variable is unset.
fn redis_store(block_bytes: usize) -> Option<RedisClusterStore> {
    let nodes = std::env::var(CLUSTER_ENV).ok().filter(|n| !n.is_empty());
    let Some(nodes) = nodes else {
        eprintln!("note: {CLUSTER_ENV} is not set: skipping the redis/put and redis/get rows");
        return None;
    };
    let mut config = RedisConfig::new(
        nodes.split(',').map(str::trim),
        format!("kvbm-bench-stores-{}", std::process::id()),
        block_bytes,
        BATCH,
    );
    // A 128 MiB pipeline on a busy 2-core machine: generous bounds, so a
    // slow batch is measured rather than failed.
    config.response_timeout = Duration::from_secs(30);
    config.call_timeout = Duration::from_secs(60);
    Some(RedisClusterStore::connect(config).expect("connect to the redis cluster"))
}

fn bench_stores(c: &mut Criterion) {
    let per_token = bytes_per_token();
    for tokens in TOKENS {
        let block_bytes = tokens * per_token;
        let batch = Batch::new(block_bytes);
        let mut out = PageAligned::new(batch.total_bytes());
        let out = out.as_mut_slice();
        let mut group = c.benchmark_group(format!("stores/{tokens}-tokens"));
        group.throughput(Throughput::Bytes(batch.total_bytes() as u64));
        // Iterations of 10-100 ms at 512 tokens: flat sampling, few samples.
        group.sampling_mode(SamplingMode::Flat);
        group.sample_size(if tokens >= 512 { 10 } else { 30 });

        // Host memory.
        group.bench_function("memcpy", |b| {
            b.iter(|| {
                for (into, block) in out.chunks_mut(block_bytes).zip(batch.blocks()) {
                    into.copy_from_slice(black_box(block));
                }
            });
        });
        let arena = HostArena::new(block_bytes, BATCH).expect("allocate the arena");
        group.bench_function("arena/put", |b| bench_put(b, &arena, &batch));
        all_ok(arena.put(&batch.refs()), "arena put");
        group.bench_function("arena/get", |b| bench_get(b, &arena, &batch, out));
        drop(arena);

        group.bench_function("xxh3", |b| {
            b.iter(|| {
                for (key, block) in batch.keys.iter().zip(batch.blocks()) {
                    black_box(Checksum::of(*key, black_box(block)));
                }
            });
        });

        // Disk, through the page cache on both sides.
        let dir = tempfile::tempdir().expect("a temporary directory");
        let file = preallocated_file(dir.path(), &batch);
        group.bench_function("file/write", |b| b.iter(|| write_blocks(&file, &batch)));
        let disk = DiskStore::open(DiskConfig::new(
            dir.path().join("store"),
            block_bytes,
            BATCH,
        ))
        .expect("open the disk store");
        group.bench_function("disk/put", |b| bench_put(b, &disk, &batch));
        all_ok(disk.put(&batch.refs()), "disk put");
        group.bench_function("file/read", |b| {
            b.iter(|| read_blocks(&file, block_bytes, black_box(&mut *out)));
        });
        group.bench_function("disk/get", |b| bench_get(b, &disk, &batch, out));
        drop(disk);
        // The same store as the transfer engine may run it: headers checked,
        // the bytes left to the engine's one verification.
        let unverified = DiskStore::open(
            DiskConfig::new(dir.path().join("unverified"), block_bytes, BATCH).verify_reads(false),
        )
        .expect("open the disk store");
        all_ok(unverified.put(&batch.refs()), "disk put");
        group.bench_function("disk/get-unverified", |b| {
            bench_get(b, &unverified, &batch, out)
        });
        drop((unverified, file, dir));

        // The remote tier, when there is a cluster.
        if let Some(redis) = redis_store(block_bytes) {
            group.bench_function("redis/put", |b| bench_put(b, &redis, &batch));
            all_ok(redis.put(&batch.refs()), "redis put");
            group.bench_function("redis/get", |b| bench_get(b, &redis, &batch, out));
            all_ok(redis.remove(&batch.keys), "redis remove");
        }
        group.finish();
    }
}

criterion_group!(benches, bench_stores);
criterion_main!(benches);
