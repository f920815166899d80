//! What the engine is asked to copy: [`Transfer`]s of blocks between tiers,
//! in [`CopyRun`]s it can execute as one copy each, named by a
//! [`TransferId`] it reports back.

use std::fmt;

use kvbm_blocks::{BlockId, SequenceHash};

/// A tier: the device (G1, the block pool the scheduler allocates from),
/// then the lower tiers in order (G2 host, G3 disk, ...), as Dynamo's KVBM
/// numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TierId(u8);

impl TierId {
    /// The device tier.
    pub const DEVICE: Self = Self(0);

    /// The lower tier at `index` (0: the first below the device), if tier
    /// ids can name it.
    pub fn lower(index: usize) -> Option<Self> {
        u8::try_from(index).ok()?.checked_add(1).map(Self)
    }

    /// 0 for the device, 1 for the first lower tier, ...
    pub fn level(self) -> usize {
        usize::from(self.0)
    }

    /// Whether it is the device.
    pub fn is_device(self) -> bool {
        self.0 == 0
    }

    /// Its index among the lower tiers (`None` for the device).
    pub(crate) fn lower_index(self) -> Option<usize> {
        usize::from(self.0).checked_sub(1)
    }
}

impl fmt::Display for TierId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "G{}", u16::from(self.0) + 1)
    }
}

/// Names one planned transfer until the engine reports it; never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TransferId(u64);

impl TransferId {
    /// The raw number (transfers are numbered from 0 in planning order).
    pub fn get(self) -> u64 {
        self.0
    }

    /// The id with raw number `raw`, for an engine that got it as a number
    /// (across a process boundary). A number the tiers never handed out
    /// names no transfer: reports of it are refused.
    pub fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    pub(crate) fn new(raw: u64) -> Self {
        Self(raw)
    }
}

impl fmt::Display for TransferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}

/// Which way a transfer goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransferKind {
    /// Down the hierarchy: an offload (device to host, host to disk).
    Store,
    /// Up to the device: onboarding a cached prefix for a request.
    Load,
}

/// Consecutive blocks copied as one: `blocks` blocks from `source` on in the
/// source tier to `destination` on in the destination tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CopyRun {
    /// The first source block.
    pub source: BlockId,
    /// The first destination block.
    pub destination: BlockId,
    /// How many consecutive blocks.
    pub blocks: u32,
}

/// One copy the engine is asked to run, then to report
/// ([`Tiers::complete`](crate::Tiers::complete) or
/// [`Tiers::fail`](crate::Tiers::fail)). Until then its sources are pinned
/// where they are (never evicted, freed or reallocated) and its destinations
/// are held, not matchable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// Its name in reports.
    pub id: TransferId,
    /// Which way it goes.
    pub kind: TransferKind,
    /// Where the blocks are.
    pub source: TierId,
    /// Where they go.
    pub destination: TierId,
    /// The blocks, in runs of consecutive ids on both sides.
    pub runs: Vec<CopyRun>,
    /// Each block's hash, in the order of [`pairs`](Self::pairs): the key a
    /// store keyed by hash (a remote KV store) files it under.
    pub hashes: Vec<SequenceHash>,
}

impl Transfer {
    /// Blocks it copies.
    pub fn blocks(&self) -> usize {
        self.runs.iter().map(|run| run.blocks as usize).sum()
    }

    /// Every `(source, destination)` pair of blocks, in order.
    pub fn pairs(&self) -> impl Iterator<Item = (BlockId, BlockId)> + '_ {
        self.runs.iter().flat_map(|run| {
            (0..run.blocks).map(move |i| {
                (
                    BlockId::new(run.source.get().wrapping_add(i)),
                    BlockId::new(run.destination.get().wrapping_add(i)),
                )
            })
        })
    }
}

/// `(source, destination)` pairs merged into runs where both sides go up by
/// one.
pub(crate) fn runs(pairs: impl IntoIterator<Item = (BlockId, BlockId)>) -> Vec<CopyRun> {
    let pairs = pairs.into_iter();
    // At most a run per pair: one allocation, not one per doubling.
    let mut runs: Vec<CopyRun> = Vec::with_capacity(pairs.size_hint().0);
    for (source, destination) in pairs {
        if let Some(run) = runs.last_mut()
            && run.source.get().checked_add(run.blocks) == Some(source.get())
            && run.destination.get().checked_add(run.blocks) == Some(destination.get())
        {
            run.blocks += 1;
            continue;
        }
        runs.push(CopyRun {
            source,
            destination,
            blocks: 1,
        });
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_pairs_merge_into_runs_and_back() {
        let id = BlockId::new;
        let pairs = [
            (id(4), id(9)),
            (id(5), id(10)),
            (id(6), id(3)),
            (id(9), id(4)),
        ];
        let runs = runs(pairs);
        assert_eq!(runs.len(), 3);
        assert_eq!((runs[0].blocks, runs[1].blocks, runs[2].blocks), (2, 1, 1));
        let transfer = Transfer {
            id: TransferId::new(0),
            kind: TransferKind::Store,
            source: TierId::DEVICE,
            destination: TierId::lower(0).unwrap(),
            runs,
            hashes: Vec::new(),
        };
        assert_eq!(transfer.pairs().collect::<Vec<_>>(), pairs);
        assert_eq!(transfer.blocks(), 4);
    }

    #[test]
    fn tier_ids_name_levels() {
        assert_eq!(TierId::DEVICE.to_string(), "G1");
        assert_eq!(TierId::lower(1).unwrap().to_string(), "G3");
        assert_eq!(TierId::lower(254).unwrap().level(), 255);
        assert_eq!(TierId::lower(255), None);
        assert_eq!(TierId::lower(0).unwrap().lower_index(), Some(0));
        assert_eq!(TierId::DEVICE.lower_index(), None);
    }
}
