//! Offload: which blocks each lower tier takes from the tier above, and the
//! store transfers that copy them down.

use kvbm_blocks::{ImmutableBlock, ImmutableBlocks, SequenceHash};
use tracing::trace;

use crate::flight::{Copy, Flight, Landing, Pin};
use crate::transfer::runs;
use crate::{OffloadPolicy, TierId, Tiers, Transfer, TransferKind};

impl<D> Tiers<D> {
    /// Device blocks just registered (a request computed them): the first
    /// lower tier takes copies if it is write-through, or selective and the
    /// block was hit often enough. Handles not kept are dropped at once.
    pub fn offload(&mut self, blocks: impl IntoIterator<Item = ImmutableBlock<D>>) {
        let Some(first) = self.lower.first() else {
            return;
        };
        let policy = first.config.offload;
        let copies: Vec<(SequenceHash, Pin<D>)> = blocks
            .into_iter()
            .filter(|block| self.takes(policy, block.sequence_hash()))
            .map(|block| (block.sequence_hash(), Pin::Device(block)))
            .collect();
        self.plan_store(TierId::DEVICE, 0, copies);
    }

    /// A request's prefix was found on the device (`blocks`, as matched):
    /// counts one hit per block for selective tiers, and a block that
    /// reaches the first tier's threshold is copied down.
    pub fn record_hits(&mut self, blocks: &ImmutableBlocks<D>) {
        let Some(sketch) = &mut self.hits else {
            return;
        };
        for block in blocks.iter() {
            sketch.increment(block.hash_value());
        }
        if let Some(first) = self.lower.first()
            && matches!(first.config.offload, OffloadPolicy::Selective { .. })
        {
            let handles = (0..blocks.len()).filter_map(|i| blocks.get(i));
            self.offload(handles);
        }
    }

    /// Keeps room above every write-back tier: the device (for a
    /// write-back first tier) or a lower tier (for a write-back tier below
    /// it) keeps `write_back_headroom` blocks free by evicting its coldest
    /// cached blocks into stores to the tier below. Call once a step,
    /// before allocating; with no write-back tier it does nothing.
    pub fn write_back(&mut self) {
        for index in 0..self.lower.len() {
            let tier = &self.lower[index];
            if tier.config.offload != OffloadPolicy::WriteBack {
                continue;
            }
            let headroom = tier.config.write_back_headroom;
            let room = tier
                .config
                .max_incoming_blocks
                .saturating_sub(tier.incoming.len());
            if index == 0 {
                let free = self.device.metrics().free_blocks;
                let want = headroom.saturating_sub(free).min(room);
                let copies = (self.device.evict_blocks(want).into_iter())
                    .map(|(hash, block)| (hash, Pin::DeviceEvicted(block)))
                    .collect();
                self.plan_store(TierId::DEVICE, 0, copies);
            } else {
                let above = &self.lower[index - 1].pool;
                let free = above.metrics().free_blocks;
                let want = headroom.saturating_sub(free).min(room);
                let copies = (above.evict_blocks(want).into_iter())
                    .map(|(hash, block)| (hash, Pin::LowerEvicted(block)))
                    .collect();
                let source = TierId::lower(index - 1).unwrap_or(TierId::DEVICE);
                self.plan_store(source, index, copies);
            }
        }
    }

    /// Whether a tier under `policy` takes the block `hash` from the tier
    /// above when it is registered or hit.
    pub(crate) fn takes(&self, policy: OffloadPolicy, hash: SequenceHash) -> bool {
        match policy {
            OffloadPolicy::WriteThrough => true,
            OffloadPolicy::Selective { min_hits } => self
                .hits
                .as_ref()
                .is_some_and(|sketch| sketch.estimate(hash.value()) >= min_hits.max(1)),
            OffloadPolicy::WriteBack => false,
        }
    }

    /// Plans copies from `source` into lower tier `index`: blocks already
    /// there or on their way are skipped (their pins dropped), and so are
    /// those past the tier's incoming limit or its room; the rest become
    /// one store transfer.
    pub(crate) fn plan_store(
        &mut self,
        source: TierId,
        index: usize,
        copies: Vec<(SequenceHash, Pin<D>)>,
    ) {
        if copies.is_empty() {
            return;
        }
        let Some(tier) = self.lower.get_mut(index) else {
            return;
        };
        let hashes: Vec<SequenceHash> = copies.iter().map(|(hash, _)| *hash).collect();
        let present = tier.pool.scan_matches(&hashes);
        let mut wanted: Vec<(SequenceHash, Pin<D>)> = Vec::with_capacity(copies.len());
        for ((hash, pin), present) in copies.into_iter().zip(present) {
            if present || tier.incoming.contains(&hash.value()) {
                continue;
            }
            if tier.incoming.len() + wanted.len() >= tier.config.max_incoming_blocks {
                tier.stats.skipped_stores += 1;
                continue;
            }
            if wanted.iter().any(|(h, _)| *h == hash) {
                continue;
            }
            wanted.push((hash, pin));
        }
        let room = tier.pool.available_blocks();
        if wanted.len() > room {
            tier.stats.skipped_stores += (wanted.len() - room) as u64;
            wanted.truncate(room);
        }
        if wanted.is_empty() {
            return;
        }
        let Ok(landings) = tier.pool.allocate_blocks(wanted.len()) else {
            // `available_blocks` said there was room; nothing was allocated.
            tier.stats.skipped_stores += wanted.len() as u64;
            return;
        };
        for (hash, _) in &wanted {
            tier.incoming.insert(hash.value());
        }
        let copies: Vec<Copy<D>> = wanted
            .into_iter()
            .zip(landings)
            .map(|((hash, source), landing)| Copy {
                hash,
                source,
                landing: Landing::Lower(landing),
            })
            .collect();
        let destination = TierId::lower(index).unwrap_or(TierId::DEVICE);
        trace!(%source, %destination, blocks = copies.len(), "store planned");
        self.launch(TransferKind::Store, source, destination, copies);
    }

    /// Records a planned transfer: in flight, and handed to the engine at
    /// the next [`take_planned`](Self::take_planned).
    pub(crate) fn launch(
        &mut self,
        kind: TransferKind,
        source: TierId,
        destination: TierId,
        copies: Vec<Copy<D>>,
    ) -> crate::TransferId {
        let id = self.next_transfer_id();
        let runs =
            runs((copies.iter()).map(|copy| (copy.source.block_id(), copy.landing.block_id())));
        self.planned.push(Transfer {
            id,
            kind,
            source,
            destination,
            runs,
            hashes: copies.iter().map(|copy| copy.hash).collect(),
        });
        self.flights.insert(
            id,
            Flight {
                kind,
                source,
                destination,
                copies,
                abandoned: false,
            },
        );
        self.counts.planned += 1;
        id
    }
}
