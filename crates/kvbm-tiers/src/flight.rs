//! Transfers in flight and the blocks each pins until it is settled.

use kvbm_blocks::{BlockId, ImmutableBlock, MutableBlock, SequenceHash};

use crate::{Lower, TierId, TransferKind};

/// What keeps a copy's source where it is until the copy is settled.
#[derive(Debug)]
pub(crate) enum Pin<D> {
    /// A registered device block, held (never evicted while held).
    Device(ImmutableBlock<D>),
    /// A device block evicted for write-back: held, content intact, freed
    /// when the copy is settled.
    DeviceEvicted(MutableBlock<D>),
    /// A registered block of a lower tier.
    Lower(ImmutableBlock<Lower>),
    /// A lower tier's block evicted for write-back to the next tier.
    LowerEvicted(MutableBlock<Lower>),
}

impl<D> Pin<D> {
    pub(crate) fn block_id(&self) -> BlockId {
        match self {
            Self::Device(block) => block.block_id(),
            Self::DeviceEvicted(block) => block.block_id(),
            Self::Lower(block) => block.block_id(),
            Self::LowerEvicted(block) => block.block_id(),
        }
    }
}

/// A copy's destination: allocated, not matchable until the copy completes.
#[derive(Debug)]
pub(crate) enum Landing<D> {
    Device(MutableBlock<D>),
    Lower(MutableBlock<Lower>),
}

impl<D> Landing<D> {
    pub(crate) fn block_id(&self) -> BlockId {
        match self {
            Self::Device(block) => block.block_id(),
            Self::Lower(block) => block.block_id(),
        }
    }
}

/// One block of a transfer.
#[derive(Debug)]
pub(crate) struct Copy<D> {
    pub(crate) hash: SequenceHash,
    pub(crate) source: Pin<D>,
    pub(crate) landing: Landing<D>,
}

/// A planned transfer the engine has not reported yet.
#[derive(Debug)]
pub(crate) struct Flight<D> {
    pub(crate) kind: TransferKind,
    pub(crate) source: TierId,
    pub(crate) destination: TierId,
    pub(crate) copies: Vec<Copy<D>>,
    /// Its result will be thrown away: the request that wanted it stopped
    /// waiting (a load timeout, a cancel). Its blocks stay pinned until the
    /// engine reports it, since the engine may still be writing them.
    pub(crate) abandoned: bool,
}
