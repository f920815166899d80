//! Shared helpers for the kvbm benchmarks.

/// Whether the bench binary runs as the CI smoke test (`cargo test --benches`
/// runs each benchmark once, unoptimized) rather than a real measurement
/// (`cargo bench` passes `--bench`). Expensive setups shrink in smoke runs.
pub fn is_smoke_test() -> bool {
    !std::env::args().any(|arg| arg == "--bench")
}

/// Resident set size of this process in bytes (Linux `/proc/self/status`),
/// or `None` where that is unavailable.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A small deterministic generator of well-mixed `u64`s (xorshift), so both
/// sides of a comparison get identical inputs without another dependency.
#[derive(Debug, Clone)]
pub struct Xorshift(u64);

impl Xorshift {
    /// Seeds the generator (a zero seed is bumped to one).
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `len` tokens drawn from a 128k vocabulary, the same for every seed on
/// both sides of a comparison.
pub fn random_tokens(seed: u64, len: usize) -> Vec<u32> {
    let mut rng = Xorshift::new(seed);
    (0..len)
        .map(|_| (rng.next_u64() % 128_000) as u32)
        .collect()
}

/// A chain of `len` random hash values.
pub fn chain_values(rng: &mut Xorshift, len: usize) -> Vec<u64> {
    (0..len).map(|_| rng.next_u64()).collect()
}

/// SplitMix64's finalizer: a bijection of `u64` whose outputs look
/// uniform even for counting inputs, for keys and addresses no table or
/// prefetcher can predict.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The router's fleet rows (`--bench router`, `--example
/// router_instructions`): keys as well mixed as real block hashes, and the
/// events that carry them.
pub mod fleet {
    use kvbm_events::{BlockHash, BlockRemoved, BlockStored, KvEvent};
    use kvbm_router::{Router, RouterError};

    /// Workers of the fleet rows.
    pub const WORKERS: u64 = 1_024;

    /// Blocks per chain and per event.
    pub const CHAIN: u64 = 64;

    /// The owner of the chain every fleet worker holds.
    pub const SHARED_CHAIN: u64 = u64::MAX;

    /// A well-mixed key for `(owner, i)` (SplitMix64's finalizer): real
    /// block hashes are uniform, so the index sees the spread it sees in
    /// service. Owner [`SHARED_CHAIN`] is the chain every worker shares.
    pub fn mixed(owner: u64, i: u64) -> u64 {
        super::mix64(
            owner
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .wrapping_add(i.wrapping_mul(0xd1b5_4a32_d192_ed03)),
        )
    }

    /// The [`CHAIN`] keys of `owner`'s chain.
    pub fn chain(owner: u64) -> impl Iterator<Item = u64> + Clone {
        (0..CHAIN).map(move |i| mixed(owner, i))
    }

    /// A store of `keys`, blocks of 16 tokens, no token ids.
    pub fn stored(keys: impl Iterator<Item = u64>) -> KvEvent {
        KvEvent::BlockStored(BlockStored::new(
            keys.map(BlockHash::Int).collect(),
            None,
            Vec::new(),
            16,
        ))
    }

    /// A removal of `keys`.
    pub fn removed(keys: impl Iterator<Item = u64>) -> KvEvent {
        KvEvent::BlockRemoved(BlockRemoved::new(keys.map(BlockHash::Int).collect()))
    }

    /// A router of [`WORKERS`] workers, each holding the shared chain and
    /// one of its own.
    ///
    /// # Errors
    ///
    /// The router's refusal of a worker or of its store (none of a new
    /// router's, so a refusal means the fleet rows would measure
    /// something else).
    pub fn router() -> Result<Router, RouterError> {
        let router = Router::new();
        for worker in 0..WORKERS {
            router.add_worker(worker)?;
            router.apply(worker, &stored(chain(SHARED_CHAIN).chain(chain(worker))))?;
        }
        Ok(router)
    }
}

/// Building our side of a comparison.
pub mod ours {
    use kvbm_blocks::{BlockManager, ImmutableBlocks, SequenceHash};

    /// The storage-tier marker every kvbm benchmark uses.
    #[derive(Debug)]
    pub struct Gpu;

    /// The chained hashes of `values`, first block first.
    pub fn hashes(values: &[u64]) -> Vec<SequenceHash> {
        let mut out: Vec<SequenceHash> = Vec::with_capacity(values.len());
        for &value in values {
            let next = match out.last() {
                Some(parent) => parent.child(value.into()),
                None => SequenceHash::root(value.into()),
            };
            out.push(next);
        }
        out
    }

    /// Allocates, stages and registers one block per hash.
    pub fn register(manager: &BlockManager<Gpu>, hashes: &[SequenceHash]) -> ImmutableBlocks<Gpu> {
        let staged = manager
            .allocate_blocks(hashes.len())
            .expect("room")
            .into_iter()
            .zip(hashes)
            .map(|(block, &hash)| block.stage(hash, manager.block_size()).expect("size"))
            .collect();
        manager.register_blocks(staged).expect("same manager")
    }

    /// A kvbm LRU pool.
    pub fn manager(blocks: usize, block_size: usize) -> kvbm_blocks::BlockManager<Gpu> {
        kvbm_blocks::BlockManager::builder()
            .block_count(blocks)
            .block_size(block_size)
            .build()
            .expect("valid configuration")
    }
}

/// Building the peer's side of a comparison: kvbm-logical 1.6.1 configured
/// like ours (LRU inactive pool, a plain registry, no frequency tracker).
pub mod peer {
    use dynamo_tokens::PositionalLineageHash;
    use kvbm_logical::{BlockManager, ImmutableBlock};

    /// The peer's hashes of `values`: the same values, lineage attached.
    pub fn hashes(values: &[u64]) -> Vec<PositionalLineageHash> {
        let mut out = Vec::with_capacity(values.len());
        let mut parent = None;
        for (position, &value) in values.iter().enumerate() {
            out.push(PositionalLineageHash::new(value, parent, position as u64));
            parent = Some(value);
        }
        out
    }

    /// Allocates, stages and registers one block per hash.
    pub fn register(
        manager: &BlockManager<()>,
        hashes: &[PositionalLineageHash],
        block_size: usize,
    ) -> Vec<ImmutableBlock<()>> {
        let staged = manager
            .allocate_blocks(hashes.len())
            .expect("room")
            .into_iter()
            .zip(hashes)
            .map(|(block, &hash)| block.stage(hash, block_size).expect("size"))
            .collect();
        manager.register_blocks(staged)
    }

    /// A kvbm-logical LRU pool.
    pub fn manager(blocks: usize, block_size: usize) -> kvbm_logical::BlockManager<()> {
        kvbm_logical::BlockManager::<()>::builder()
            .block_count(blocks)
            .block_size(block_size)
            .registry(kvbm_logical::BlockRegistry::new())
            .with_lru_backend()
            .build()
            .expect("valid configuration")
    }
}

/// The tier bookkeeping workloads of `--bench tiers` and
/// `--example tiers_instructions`: blocks moved between a device pool and a
/// host tier below it, per batch of `batch` blocks, beside the same device
/// work with no tier. Each fixture cycles through [`tiers::SETS`] distinct
/// chains of `batch` blocks, so every step moves blocks no pool it reaches
/// holds: the device has room for two batches and evicts, the host evicts
/// when it stores (store) or holds every chain (load).
pub mod tiers {
    use kvbm_blocks::SequenceHash;
    use kvbm_tiers::{Settled, TierConfig, Tiers, Transfer};

    use crate::ours::{self, Gpu};
    use crate::{Xorshift, chain_values};

    /// Tokens per block (kvbm-sim's serve default).
    pub const BLOCK_SIZE: usize = 16;
    /// Distinct chains a fixture cycles through.
    pub const SETS: usize = 8;

    /// [`SETS`] chains of `batch` blocks, the same on every run.
    pub fn chains(batch: usize) -> Vec<Vec<SequenceHash>> {
        let mut rng = Xorshift::new(22);
        (0..SETS)
            .map(|_| ours::hashes(&chain_values(&mut rng, batch)))
            .collect()
    }

    /// A device pool of two batches with no tier below: each step
    /// registers a batch (evicting the one cached two steps ago) and drops
    /// it into the cache. The work a store or a load does on the device.
    #[derive(Debug)]
    pub struct DeviceOnly {
        device: kvbm_blocks::BlockManager<Gpu>,
        chains: Vec<Vec<SequenceHash>>,
        next: usize,
    }

    impl DeviceOnly {
        /// The pool, empty.
        pub fn new(batch: usize) -> Self {
            Self {
                device: ours::manager(2 * batch, BLOCK_SIZE),
                chains: chains(batch),
                next: 0,
            }
        }

        /// One batch registered and dropped; returns the blocks registered.
        pub fn step(&mut self) -> usize {
            let chain = &self.chains[self.next % SETS];
            self.next += 1;
            ours::register(&self.device, chain).len()
        }
    }

    /// [`DeviceOnly`] with a write-through host tier of four batches below:
    /// each step registers a batch, offloads it (`offload_batch`), takes
    /// the planned store and completes it (the host evicts its oldest
    /// batch: it holds half the chains).
    #[derive(Debug)]
    pub struct Store {
        tiers: Tiers<Gpu>,
        chains: Vec<Vec<SequenceHash>>,
        plan: Vec<Transfer>,
        next: usize,
    }

    impl Store {
        /// The pools, empty.
        pub fn new(batch: usize) -> Self {
            Self {
                tiers: tiers(batch, SETS / 2),
                chains: chains(batch),
                plan: Vec::new(),
                next: 0,
            }
        }

        /// One batch registered and stored; returns the blocks stored.
        pub fn step(&mut self) -> usize {
            let chain = &self.chains[self.next % SETS];
            self.next += 1;
            let stored = store(&mut self.tiers, chain, &mut self.plan);
            assert_eq!(stored, chain.len(), "every block is new to the host");
            stored
        }
    }

    /// A host tier holding every chain above an empty device pool of two
    /// batches: each step onboards a batch (`onboard`, which allocates its
    /// device blocks, evicting the batch loaded two steps ago), takes the
    /// planned load, completes it and drops the loaded blocks into the
    /// device cache.
    #[derive(Debug)]
    pub struct Load {
        tiers: Tiers<Gpu>,
        chains: Vec<Vec<SequenceHash>>,
        plan: Vec<Transfer>,
        next: usize,
    }

    impl Load {
        /// The pools, every chain stored in the host tier.
        pub fn new(batch: usize) -> Self {
            let mut tiers = tiers(batch, SETS);
            let chains = chains(batch);
            let mut plan = Vec::new();
            for chain in &chains {
                assert_eq!(store(&mut tiers, chain, &mut plan), batch);
            }
            Self {
                tiers,
                chains,
                plan,
                // The device still caches the last two chains stored.
                next: 0,
            }
        }

        /// One batch loaded from the host; returns the blocks loaded.
        pub fn step(&mut self) -> usize {
            let chain = &self.chains[self.next % SETS];
            self.next += 1;
            let onboard = self.tiers.onboard(chain, chain.len());
            assert_eq!(onboard.loaded_from[1], chain.len(), "all from the host");
            self.tiers.take_planned(&mut self.plan);
            let mut loaded = 0;
            for transfer in self.plan.drain(..) {
                match self.tiers.complete(transfer.id) {
                    Ok(Settled::Loaded { blocks, .. }) => loaded += blocks.len(),
                    other => panic!("a load settled as {other:?}"),
                }
            }
            loaded
        }
    }

    /// A device pool of two batches above a write-through host tier of
    /// `host_batches` batches.
    fn tiers(batch: usize, host_batches: usize) -> Tiers<Gpu> {
        let device = ours::manager(2 * batch, BLOCK_SIZE);
        let host = TierConfig::new("CPU", host_batches * batch);
        Tiers::new(device, vec![host]).expect("valid tiers")
    }

    /// Registers `chain` on the device, offloads it and completes the
    /// stores; returns the blocks stored.
    fn store(tiers: &mut Tiers<Gpu>, chain: &[SequenceHash], plan: &mut Vec<Transfer>) -> usize {
        let blocks = ours::register(tiers.device(), chain);
        tiers.offload_batch(blocks);
        tiers.take_planned(plan);
        let mut stored = 0;
        for transfer in plan.drain(..) {
            match tiers.complete(transfer.id) {
                Ok(Settled::Stored { blocks, .. }) => stored += blocks,
                other => panic!("a store settled as {other:?}"),
            }
        }
        stored
    }
}
