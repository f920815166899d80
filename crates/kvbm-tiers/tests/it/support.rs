//! Shared helpers: a device pool, hashes, and the engine's side of the
//! protocol.

use kvbm_blocks::{BlockManager, ImmutableBlock, ImmutableBlocks, SequenceHash};
use kvbm_tiers::{Settled, TierConfig, TierError, TierId, Tiers, Transfer};

/// The device tier's marker.
#[derive(Debug)]
pub(crate) struct Gpu;

pub(crate) const BLOCK: usize = 4;

pub(crate) fn device(blocks: usize) -> BlockManager<Gpu> {
    BlockManager::builder()
        .block_count(blocks)
        .block_size(BLOCK)
        .build()
        .unwrap()
}

pub(crate) fn tiers(device: &BlockManager<Gpu>, lower: Vec<TierConfig>) -> Tiers<Gpu> {
    Tiers::new(device.clone(), lower).unwrap()
}

/// A chain of `n` hashes (a prompt's blocks), from root `seed`.
pub(crate) fn chain(seed: u128, n: usize) -> Vec<SequenceHash> {
    let mut hashes = Vec::with_capacity(n);
    let mut hash = SequenceHash::root(seed);
    for i in 0..n {
        if i > 0 {
            hash = hash.child(seed ^ i as u128);
        }
        hashes.push(hash);
    }
    hashes
}

/// Registers `hashes` on the device (a request computed them).
pub(crate) fn compute(
    device: &BlockManager<Gpu>,
    hashes: &[SequenceHash],
) -> Vec<ImmutableBlock<Gpu>> {
    let blocks = device.allocate_blocks(hashes.len()).unwrap();
    let staged = blocks
        .into_iter()
        .zip(hashes)
        .map(|(block, &hash)| block.stage(hash, BLOCK).unwrap())
        .collect();
    device
        .register_blocks(staged)
        .unwrap()
        .into_iter()
        .collect()
}

/// The transfers planned since the last call.
pub(crate) fn planned(tiers: &mut Tiers<Gpu>) -> Vec<Transfer> {
    let mut out = Vec::new();
    tiers.take_planned(&mut out);
    out
}

/// Completes every planned transfer, and those they plan in turn.
pub(crate) fn run_all(tiers: &mut Tiers<Gpu>) -> Result<Vec<Settled<Gpu>>, TierError> {
    let mut settled = Vec::new();
    loop {
        let plan = planned(tiers);
        if plan.is_empty() {
            return Ok(settled);
        }
        for transfer in plan {
            settled.push(tiers.complete(transfer.id)?);
        }
    }
}

/// One batch of `blocks` (one pool's).
pub(crate) fn batch(blocks: &[ImmutableBlock<Gpu>]) -> ImmutableBlocks<Gpu> {
    let mut batch = ImmutableBlocks::new();
    for block in blocks {
        batch.push(block.clone()).unwrap();
    }
    batch
}

/// Lower tier `n` (G2 is 0).
pub(crate) fn g(n: usize) -> TierId {
    TierId::lower(n).unwrap()
}

/// How many of `hashes` are matchable in `tier`.
pub(crate) fn in_tier(tiers: &Tiers<Gpu>, tier: TierId, hashes: &[SequenceHash]) -> usize {
    let scan = tiers.pool(tier).unwrap().scan_matches(hashes);
    scan.into_iter().filter(|&b| b).count()
}
