//! Shared helpers: a fake engine (device pool, device memory whose KV is a
//! function of each block's hash), tiers above a host arena, a store that
//! injects faults, and the loop that runs plans through the engine.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvbm_blocks::{BlockManager, ImmutableBlock, SequenceHash};
use kvbm_store::{
    BlockRef, BlockStore, Checksum, EngineConfig, HostArena, HostDevice, StoreError, TierStore,
    TransferEngine,
};
use kvbm_tiers::{Settled, TierConfig, TierId, Tiers, Transfer};

/// The device tier's marker.
#[derive(Debug)]
pub(crate) struct Gpu;

pub(crate) const TOKENS: usize = 4;
pub(crate) const BYTES: usize = 256;

/// Proptest cases: `KVBM_FUZZ_CASES` (`cargo xtask fuzz`), else `ci`.
pub(crate) fn cases(ci: u32) -> u32 {
    std::env::var("KVBM_FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(ci)
}

/// The fake engine's KV of block `key`, `bytes` long.
pub(crate) fn kv(key: u128, bytes: usize) -> Vec<u8> {
    let mut out = vec![0; bytes];
    kvbm_store::fake_kv(key, &mut out);
    out
}

/// A put of `bytes` as the first block of a sequence, `key`.
pub(crate) fn put(key: u128, bytes: &[u8]) -> BlockRef<'_> {
    BlockRef::root(key, bytes)
}

/// A chain of `n` hashes from root `seed`.
pub(crate) fn chain(seed: u128, n: usize) -> Vec<SequenceHash> {
    let mut hashes = Vec::with_capacity(n);
    let mut hash = SequenceHash::root(seed);
    for i in 0..n {
        if i > 0 {
            hash = hash.child(seed.wrapping_mul(1_000_003) ^ i as u128);
        }
        hashes.push(hash);
    }
    hashes
}

/// Faults a [`Faulty`] store injects.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// Every n-th put fails with an I/O error (0: never).
    pub(crate) put_every: AtomicU64,
    /// Every n-th get fails (0: never).
    pub(crate) get_every: AtomicU64,
    /// Every n-th get returns flipped bytes with the stored checksum (0: never).
    pub(crate) corrupt_every: AtomicU64,
    calls: AtomicU64,
}

impl Faults {
    fn hit(&self, every: &AtomicU64) -> bool {
        let n = every.load(Ordering::Relaxed);
        let call = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        n != 0 && call.is_multiple_of(n)
    }
}

/// A store that fails or corrupts some of its blocks.
#[derive(Debug)]
pub(crate) struct Faulty {
    pub(crate) inner: Arc<dyn BlockStore>,
    pub(crate) faults: Arc<Faults>,
}

impl BlockStore for Faulty {
    fn block_bytes(&self) -> usize {
        self.inner.block_bytes()
    }
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn put(&self, blocks: &[BlockRef<'_>]) -> Vec<Result<(), StoreError>> {
        let fail: Vec<bool> = blocks
            .iter()
            .map(|_| self.faults.hit(&self.faults.put_every))
            .collect();
        let keep: Vec<BlockRef<'_>> = blocks
            .iter()
            .zip(&fail)
            .filter(|(_, f)| !**f)
            .map(|(b, _)| *b)
            .collect();
        let mut results = self.inner.put(&keep).into_iter();
        fail.iter()
            .map(|f| {
                if *f {
                    Err(StoreError::Io(std::io::Error::other("injected")))
                } else {
                    results.next().expect("one result per kept block")
                }
            })
            .collect()
    }
    fn get(&self, reads: &mut [(u128, &mut [u8])]) -> Vec<Result<Checksum, StoreError>> {
        let mut results = self.inner.get(reads);
        for (result, (_, bytes)) in results.iter_mut().zip(reads.iter_mut()) {
            if self.faults.hit(&self.faults.get_every) {
                *result = Err(StoreError::Timeout(Duration::from_millis(1)));
            } else if self.faults.hit(&self.faults.corrupt_every) && result.is_ok() {
                bytes[7] ^= 0x40;
            }
        }
        results
    }
    fn contains(&self, keys: &[u128]) -> Vec<bool> {
        self.inner.contains(keys)
    }
    fn remove(&self, keys: &[u128]) -> Vec<Result<bool, StoreError>> {
        self.inner.remove(keys)
    }
    fn keys(&self) -> Result<Vec<u128>, StoreError> {
        self.inner.keys()
    }
}

/// A fake engine: device pool and memory, one host tier, the data plane.
pub(crate) struct Rig {
    pub(crate) pool: BlockManager<Gpu>,
    pub(crate) memory: Arc<HostDevice>,
    pub(crate) tiers: Tiers<Gpu>,
    pub(crate) engine: TransferEngine,
    /// The lower tier's store (behind the fault injector).
    pub(crate) host: Arc<dyn BlockStore>,
    pub(crate) faults: Arc<Faults>,
    /// Loaded blocks that held another block's KV (must stay 0).
    pub(crate) wrong: usize,
    pub(crate) verified: usize,
    pub(crate) backlog: Vec<Transfer>,
}

impl Rig {
    pub(crate) fn new(device_blocks: usize, host_blocks: usize, config: EngineConfig) -> Self {
        let host = Arc::new(HostArena::new(BYTES, host_blocks).unwrap());
        Self::with_store(
            device_blocks,
            TierConfig::new("CPU", host_blocks),
            host,
            &[],
            config,
        )
    }

    /// A device of `device_blocks` above one lower tier `tier` whose bytes
    /// are in `store`, which already holds `adopt` (a store reopened after
    /// a restart).
    pub(crate) fn with_store(
        device_blocks: usize,
        tier: TierConfig,
        host: Arc<dyn BlockStore>,
        adopt: &[SequenceHash],
        config: EngineConfig,
    ) -> Self {
        let pool = BlockManager::builder()
            .block_count(device_blocks)
            .block_size(TOKENS)
            .build()
            .unwrap();
        let mut tiers = Tiers::new(pool.clone(), vec![tier]).unwrap();
        let host_tier = TierId::lower(0).unwrap();
        tiers.adopt(host_tier, adopt).unwrap();
        let memory = Arc::new(HostDevice::new(BYTES, device_blocks).unwrap());
        let faults = Arc::new(Faults::default());
        let faulty: Arc<dyn BlockStore> = Arc::new(Faulty {
            inner: host.clone(),
            faults: Arc::clone(&faults),
        });
        let subscription = tiers.pool(host_tier).unwrap().subscribe_events(1024);
        let engine = TransferEngine::new(
            memory.clone(),
            vec![TierStore::new(host_tier, faulty).following(subscription)],
            config,
        )
        .unwrap();
        Self {
            pool,
            memory,
            tiers,
            engine,
            host,
            faults,
            wrong: 0,
            verified: 0,
            backlog: Vec::new(),
        }
    }

    /// A request computes `hashes`: device blocks with the fake KV,
    /// registered and offered to the host tier. Returns the blocks held.
    pub(crate) fn compute(&mut self, hashes: &[SequenceHash]) -> Vec<ImmutableBlock<Gpu>> {
        let Ok(blocks) = self.pool.allocate_blocks(hashes.len()) else {
            return Vec::new();
        };
        let staged = blocks
            .into_iter()
            .zip(hashes)
            .map(|(block, &hash)| {
                self.memory.compute(block.block_id(), hash.value()).unwrap();
                block.stage(hash, TOKENS).unwrap()
            })
            .collect();
        let registered: Vec<_> = self
            .pool
            .register_blocks(staged)
            .unwrap()
            .into_iter()
            .collect();
        self.tiers.offload(registered.iter().cloned());
        self.tiers.flush_events();
        registered
    }

    /// Runs every planned transfer through the engine until none is in
    /// flight; checks every loaded block byte for byte.
    pub(crate) fn drain(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            self.tiers.flush_events();
            self.tiers.take_planned(&mut self.backlog);
            let mut waiting = std::mem::take(&mut self.backlog);
            for transfer in waiting.drain(..) {
                if let Err(back) = self.engine.try_submit(transfer) {
                    self.backlog.push(back);
                }
            }
            if self.tiers.in_flight_count() == 0 {
                assert!(self.backlog.is_empty());
                return;
            }
            assert!(
                Instant::now() < deadline,
                "transfers did not settle in time"
            );
            let Some(report) = self.engine.report_timeout(Duration::from_millis(200)) else {
                continue;
            };
            let settled = self
                .tiers
                .settle_all(&[(report.id, report.outcome())])
                .unwrap();
            for settled in settled {
                if let Settled::Loaded { blocks, .. } = settled {
                    for (id, hash) in blocks.block_ids().zip(blocks.sequence_hashes()) {
                        if self.memory.holds(id, hash.value()).unwrap() {
                            self.verified += 1;
                        } else {
                            self.wrong += 1;
                        }
                    }
                }
            }
        }
    }
}
