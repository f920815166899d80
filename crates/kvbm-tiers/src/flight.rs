//! Transfers in flight and the blocks each pins until it is settled: one
//! batch per transfer, so pinning and releasing a transfer's sources takes
//! one pool lock however many blocks it moves.

use kvbm_blocks::{BlockId, ImmutableBlocks, MutableBlocks, SequenceHash};

use crate::{Lower, TierId, TransferKind};

/// What keeps a transfer's sources where they are until it is settled.
#[derive(Debug)]
pub(crate) enum Pins<D> {
    /// Registered device blocks, held (never evicted while held).
    Device(ImmutableBlocks<D>),
    /// Device blocks evicted for write-back: held, content intact, freed
    /// when the copy is settled.
    DeviceEvicted(MutableBlocks<D>),
    /// Registered blocks of a lower tier.
    Lower(ImmutableBlocks<Lower>),
    /// A lower tier's blocks evicted for write-back to the next tier.
    LowerEvicted(MutableBlocks<Lower>),
}

impl<D> Pins<D> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Device(blocks) => blocks.len(),
            Self::DeviceEvicted(blocks) => blocks.len(),
            Self::Lower(blocks) => blocks.len(),
            Self::LowerEvicted(blocks) => blocks.len(),
        }
    }

    /// The pinned blocks' ids, in order.
    pub(crate) fn block_ids(&self) -> Vec<BlockId> {
        match self {
            Self::Device(blocks) => blocks.block_ids().collect(),
            Self::DeviceEvicted(blocks) => blocks.block_ids().to_vec(),
            Self::Lower(blocks) => blocks.block_ids().collect(),
            Self::LowerEvicted(blocks) => blocks.block_ids().to_vec(),
        }
    }

    /// Whether they are device blocks.
    pub(crate) fn on_device(&self) -> bool {
        matches!(self, Self::Device(_) | Self::DeviceEvicted(_))
    }

    /// Keeps the blocks whose `keep` is true, in order (the others are
    /// released). Keeping all changes nothing and takes no lock.
    pub(crate) fn retain(self, keep: &[bool]) -> Self {
        if keep.iter().all(|&k| k) {
            return self;
        }
        match self {
            Self::Device(blocks) => Self::Device(retain_batch(blocks, keep)),
            Self::Lower(blocks) => Self::Lower(retain_batch(blocks, keep)),
            Self::DeviceEvicted(mut blocks) => {
                blocks.retain(keep);
                Self::DeviceEvicted(blocks)
            }
            Self::LowerEvicted(mut blocks) => {
                blocks.retain(keep);
                Self::LowerEvicted(blocks)
            }
        }
    }
}

fn retain_batch<M>(blocks: ImmutableBlocks<M>, keep: &[bool]) -> ImmutableBlocks<M> {
    let mut kept = ImmutableBlocks::new();
    for (block, &keep) in blocks.into_iter().zip(keep) {
        if keep {
            // One batch's blocks are one manager's: never refused.
            let _ = kept.push(block);
        }
    }
    kept
}

/// A transfer's destinations: allocated (one handle per transfer: one pool
/// lock to free them, one to register them), not matchable until it
/// completes.
#[derive(Debug)]
pub(crate) enum Landings<D> {
    Device(MutableBlocks<D>),
    Lower(MutableBlocks<Lower>),
}

impl<D> Landings<D> {
    pub(crate) fn block_ids(&self) -> &[BlockId] {
        match self {
            Self::Device(blocks) => blocks.block_ids(),
            Self::Lower(blocks) => blocks.block_ids(),
        }
    }
}

/// A planned transfer the engine has not reported yet.
#[derive(Debug)]
pub(crate) struct Flight<D> {
    pub(crate) kind: TransferKind,
    pub(crate) source: TierId,
    pub(crate) destination: TierId,
    /// Each block's hash, in order (sources and landings follow it).
    pub(crate) hashes: Vec<SequenceHash>,
    pub(crate) pins: Pins<D>,
    pub(crate) landings: Landings<D>,
    /// Its result will be thrown away: the request that wanted it stopped
    /// waiting (a load timeout, a cancel). Its blocks stay pinned until the
    /// engine reports it, since the engine may still be writing them.
    pub(crate) abandoned: bool,
}
