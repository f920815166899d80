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
