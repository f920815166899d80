//! Offload: which blocks each lower tier takes from the tier above, and the
//! store transfers that copy them down.

use kvbm_blocks::{ImmutableBlock, ImmutableBlocks, SequenceHash};
use tracing::trace;

use crate::flight::{Flight, Landings, Pins};
use crate::transfer::runs;
use crate::{OffloadPolicy, TierId, Tiers, Transfer, TransferId, TransferKind};

impl<D> Tiers<D> {
    /// Device blocks just registered (a request computed them): the first
    /// lower tier takes copies if it is write-through, or selective and the
    /// block was hit often enough. Handles not kept are dropped at once.
    pub fn offload(&mut self, blocks: impl IntoIterator<Item = ImmutableBlock<D>>) {
        let mut batch = ImmutableBlocks::new();
        for block in blocks {
            // Handles of other pools than the device's are not ours to copy.
            if block.belongs_to(&self.device) {
                let _ = batch.push(block);
            }
        }
        self.offload_batch(batch);
    }

    /// [`offload`](Self::offload) of a batch of device blocks (pinning and
    /// releasing them takes one pool lock, however many there are; a
    /// request's new blocks are `assigned.clone_range(before..)`).
    pub fn offload_batch(&mut self, blocks: ImmutableBlocks<D>) {
        let Some(first) = self.lower.first() else {
            return;
        };
        if blocks.is_empty() || !blocks.belongs_to(&self.device) {
            return;
        }
        let policy = first.config.offload;
        let hashes = blocks.sequence_hashes();
        let keep = self.wanted(policy, &hashes);
        self.plan_store(TierId::DEVICE, 0, hashes, Pins::Device(blocks), keep);
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
        let Some(first) = self.lower.first() else {
            return;
        };
        let policy = first.config.offload;
        if !matches!(policy, OffloadPolicy::Selective { .. }) {
            return;
        }
        // Only blocks due and not yet below are pinned (one lock each:
        // few cross the threshold at any one hit).
        let mut due = ImmutableBlocks::new();
        for (i, info) in blocks.iter().enumerate() {
            let value = info.hash_value();
            let hash = SequenceHash::root(value);
            if self.takes(policy, hash)
                && !first.incoming.contains(&value)
                && first.pool.scan_matches(&[hash]) == [false]
                && let Some(block) = blocks.get(i)
            {
                let _ = due.push(block);
            }
        }
        self.offload_batch(due);
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
            let (source, hashes, pins) = if index == 0 {
                let free = self.device.metrics().free_blocks;
                let want = headroom.saturating_sub(free).min(room);
                let (hashes, blocks) = self.device.evict_batch(want);
                (TierId::DEVICE, hashes, Pins::DeviceEvicted(blocks))
            } else {
                let above = &self.lower[index - 1].pool;
                let free = above.metrics().free_blocks;
                let want = headroom.saturating_sub(free).min(room);
                let (hashes, blocks) = above.evict_batch(want);
                let source = TierId::lower(index - 1).unwrap_or(TierId::DEVICE);
                (source, hashes, Pins::LowerEvicted(blocks))
            };
            let keep = vec![true; hashes.len()];
            self.plan_store(source, index, hashes, pins, keep);
        }
    }

    /// Which of `hashes` a tier under `policy` takes from the tier above
    /// now (see [`takes`](Self::takes)).
    pub(crate) fn wanted(&self, policy: OffloadPolicy, hashes: &[SequenceHash]) -> Vec<bool> {
        hashes
            .iter()
            .map(|&hash| self.takes(policy, hash))
            .collect()
    }

    /// The policy of lower tier `index + 1` when it takes copies of what
    /// lands in tier `index` (write-through or selective), else `None`.
    pub(crate) fn chained_below(&self, index: usize) -> Option<OffloadPolicy> {
        let policy = self.lower.get(index.checked_add(1)?)?.config.offload;
        matches!(
            policy,
            OffloadPolicy::WriteThrough | OffloadPolicy::Selective { .. }
        )
        .then_some(policy)
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

    /// Plans copies of the blocks `pins` holds (hashes `hashes`, those with
    /// `keep` set wanted) from `source` into lower tier `index`: blocks
    /// already there or on their way are skipped, and so are those past the
    /// tier's incoming limit or its room; the rest become one store
    /// transfer, and the pins of the skipped ones are released.
    pub(crate) fn plan_store(
        &mut self,
        source: TierId,
        index: usize,
        hashes: Vec<SequenceHash>,
        pins: Pins<D>,
        mut keep: Vec<bool>,
    ) {
        if hashes.is_empty() || hashes.len() != pins.len() || keep.len() != hashes.len() {
            return;
        }
        let Some(tier) = self.lower.get_mut(index) else {
            return;
        };
        let present = tier.pool.scan_matches(&hashes);
        // Each wanted hash goes into `incoming` as it is taken, so one
        // already there, or twice in this batch, is skipped in O(1).
        let limit = tier.config.max_incoming_blocks;
        let mut taken: Vec<u128> = Vec::with_capacity(hashes.len());
        for (i, hash) in hashes.iter().enumerate() {
            if !keep[i] {
                continue;
            }
            let value = hash.value();
            let wanted = if present[i] {
                false
            } else if tier.incoming.len() >= limit {
                // Past the limit: a hash not on its way yet is skipped.
                if !tier.incoming.contains(&value) {
                    tier.stats.skipped_stores += 1;
                }
                false
            } else {
                // One probe: false when it is on its way already.
                tier.incoming.insert(value)
            };
            if wanted {
                taken.push(value);
            } else {
                keep[i] = false;
            }
        }
        let room = tier.pool.available_blocks();
        if taken.len() > room {
            tier.stats.skipped_stores += (taken.len() - room) as u64;
            for value in taken.drain(room..) {
                tier.incoming.remove(&value);
                if let Some(at) = hashes.iter().rposition(|h| h.value() == value) {
                    keep[at] = false;
                }
            }
        }
        if taken.is_empty() {
            return;
        }
        let Ok(landings) = tier.pool.allocate_batch(taken.len()) else {
            // `available_blocks` said there was room; nothing was allocated.
            tier.stats.skipped_stores += taken.len() as u64;
            for value in &taken {
                tier.incoming.remove(value);
            }
            return;
        };
        let pins = pins.retain(&keep);
        let hashes: Vec<SequenceHash> = (hashes.into_iter().zip(&keep))
            .filter_map(|(hash, &keep)| keep.then_some(hash))
            .collect();
        let destination = TierId::lower(index).unwrap_or(TierId::DEVICE);
        trace!(%source, %destination, blocks = hashes.len(), "store planned");
        self.launch(
            TransferKind::Store,
            source,
            destination,
            hashes,
            pins,
            Landings::Lower(landings),
        );
    }

    /// Records a planned transfer: in flight, and handed to the engine at
    /// the next [`take_planned`](Self::take_planned).
    pub(crate) fn launch(
        &mut self,
        kind: TransferKind,
        source: TierId,
        destination: TierId,
        hashes: Vec<SequenceHash>,
        pins: Pins<D>,
        landings: Landings<D>,
    ) -> TransferId {
        let id = self.next_transfer_id();
        let runs = runs(
            pins.block_ids()
                .into_iter()
                .zip(landings.block_ids().iter().copied()),
        );
        self.planned.push(Transfer {
            id,
            kind,
            source,
            destination,
            runs,
            hashes: hashes.clone(),
        });
        self.flights.insert(
            id,
            Flight {
                kind,
                source,
                destination,
                hashes,
                pins,
                landings,
                abandoned: false,
            },
        );
        self.counts.planned += 1;
        id
    }
}
