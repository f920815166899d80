//! Onboarding: a request's prefix brought up from the lower tiers onto the
//! device, as load transfers.

use kvbm_blocks::{ImmutableBlocks, MutableBlocks, SequenceHash};
use tracing::trace;

use crate::flight::{Landings, Pins};
use crate::{Lower, TierId, Tiers, TransferId, TransferKind};

/// What [`Tiers::onboard`] set in motion for one request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Onboard {
    /// Blocks of the prefix that will be on the device once these transfers
    /// complete (the leading blocks of the hashes given).
    pub blocks: usize,
    /// Of those, blocks this call planned loads for, by tier level (`[k]`
    /// from lower tier `k`; `[0]` is always 0).
    pub loaded_from: Vec<usize>,
    /// The transfers to wait for: the loads planned here, and loads of
    /// other requests already bringing some of these blocks up (waited
    /// for, not loaded twice).
    pub transfers: Vec<TransferId>,
}

impl<D> Tiers<D> {
    /// Plans loads bringing up to `max_blocks` leading blocks of `hashes`
    /// (a request's prefix past what the device holds, never covering its
    /// last prompt token) from the lower tiers to the device, as
    /// [`lookup`](Self::lookup) found them: each block from the highest
    /// tier that has it, a block already on its way up waited for, and the
    /// walk ends at the first block no tier has. Device blocks are
    /// allocated for the loads now (evicting cached ones if needed); if
    /// they cannot be, nothing is planned and `blocks` is the number
    /// already on their way only.
    ///
    /// The sources are pinned in their tiers and the destinations held
    /// until each transfer is reported; a completed load registers its
    /// blocks on the device ([`Settled::Loaded`](crate::Settled::Loaded)).
    pub fn onboard(&mut self, hashes: &[SequenceHash], max_blocks: usize) -> Onboard {
        let mut onboard = Onboard {
            loaded_from: vec![0; self.lower.len() + 1],
            ..Onboard::default()
        };
        if self.lower.is_empty() {
            return onboard;
        }
        // Each block: waited for, or pinned in the highest tier that has it
        // (a batch per tier, so a transfer's pins take one lock to drop).
        let mut waits: Vec<TransferId> = Vec::new();
        let tiers = self.lower.len();
        let mut by_tier: Vec<(Vec<SequenceHash>, ImmutableBlocks<Lower>)> = (0..tiers)
            .map(|_| (Vec::new(), ImmutableBlocks::new()))
            .collect();
        let wanted = hashes
            .get(..max_blocks.min(hashes.len()))
            .unwrap_or_default();
        let levels = self.locate(wanted);
        // Pins, one match per run of consecutive blocks of one tier (one
        // lock each: a prefix from one tier is one run). A block gone since
        // the scan (a shared pool another user evicts) ends the walk there.
        let mut loads = 0usize;
        let mut covered = 0;
        // Blocks before the first one to load: all on their way already.
        let mut leading_waits = 0;
        let mut i = 0;
        while i < levels.len() {
            let Some(index) = levels[i] else {
                if let Some(&id) = self.loading.get(&wanted[i].value())
                    && !waits.contains(&id)
                {
                    waits.push(id);
                }
                covered += 1;
                if loads == 0 {
                    leading_waits += 1;
                }
                i += 1;
                continue;
            };
            let run = levels[i..]
                .iter()
                .take_while(|&&level| level == Some(index))
                .count();
            let matched = self.lower[index].pool.match_blocks(&wanted[i..i + run]);
            let pinned = matched.len();
            let (tier_hashes, pins) = &mut by_tier[index];
            tier_hashes.extend_from_slice(&wanted[i..i + pinned]);
            // One tier's blocks are one pool's: never refused.
            let _ = pins.append(matched);
            loads += pinned;
            covered += pinned;
            if pinned < run {
                break;
            }
            i += run;
        }
        if let Some(sketch) = &mut self.hits {
            for (hashes, _) in &by_tier {
                for hash in hashes {
                    sketch.increment(hash.value());
                }
            }
        }
        let mut landings = if loads == 0 {
            MutableBlocks::new()
        } else {
            match self.device.allocate_batch(loads) {
                Ok(landings) => landings,
                Err(_) => {
                    // No room on the device: load nothing (the pins drop),
                    // keep only the waits before the first load.
                    onboard.blocks = leading_waits;
                    let leading: Vec<u128> = (hashes.iter().take(leading_waits))
                        .map(|hash| hash.value())
                        .collect();
                    onboard.transfers = waits;
                    onboard.transfers.retain(|id| {
                        leading
                            .iter()
                            .any(|value| self.loading.get(value) == Some(id))
                    });
                    return onboard;
                }
            }
        };
        // One transfer per source tier, in prefix order within it.
        for (index, (tier_hashes, pins)) in by_tier.into_iter().enumerate() {
            if tier_hashes.is_empty() {
                continue;
            }
            let rest = landings.split_off(tier_hashes.len().min(landings.len()));
            let mine = std::mem::replace(&mut landings, rest);
            self.lower[index].stats.hit_blocks += tier_hashes.len() as u64;
            onboard.loaded_from[index + 1] += tier_hashes.len();
            let source = TierId::lower(index).unwrap_or(TierId::DEVICE);
            let values: Vec<u128> = tier_hashes.iter().map(|h| h.value()).collect();
            let id = self.launch(
                TransferKind::Load,
                source,
                TierId::DEVICE,
                tier_hashes,
                Pins::Lower(pins),
                Landings::Device(mine),
            );
            for value in values {
                self.loading.insert(value, id);
            }
            waits.push(id);
            trace!(%source, %id, "load planned");
        }
        onboard.blocks = covered;
        onboard.transfers = waits;
        // Selective tiers below count these hits too: a block loaded up may
        // be due for a copy further down.
        self.offload_hit_lower(hashes.get(..covered).unwrap_or_default());
        onboard
    }

    /// Where each of `wanted` is (nothing pinned): on its way up already
    /// (`None`), or the index of the highest tier that has it; the list
    /// ends at the first block no tier has. A run the first lower tier
    /// holds is found with one scan that stops where the run does; a block
    /// only a tier further down has costs a scan per tier above it.
    pub(crate) fn locate(&self, wanted: &[SequenceHash]) -> Vec<Option<usize>> {
        let mut levels: Vec<Option<usize>> = Vec::new();
        while levels.len() < wanted.len() {
            let rest = &wanted[levels.len()..];
            // The first tier with a run here; below the first, one block
            // only, since a tier above may have the next.
            let Some((index, run)) = (self.lower.iter().enumerate())
                .map(|(index, tier)| (index, tier.pool.registered_prefix(rest)))
                .find(|&(_, run)| run > 0)
            else {
                break;
            };
            let run = if index == 0 { run } else { 1 };
            levels.extend(
                rest[..run]
                    .iter()
                    .map(|hash| (!self.loading.contains_key(&hash.value())).then_some(index)),
            );
        }
        levels
    }

    /// Blocks hit in lower tier `k` that a selective tier `k + 1` now takes.
    fn offload_hit_lower(&mut self, hashes: &[SequenceHash]) {
        for index in 1..self.lower.len() {
            let policy = self.lower[index].config.offload;
            if !matches!(policy, crate::OffloadPolicy::Selective { .. }) {
                continue;
            }
            let due: Vec<SequenceHash> = (hashes.iter().copied())
                .filter(|&hash| self.takes(policy, hash))
                .collect();
            let above = &self.lower[index - 1].pool;
            let mut pins = ImmutableBlocks::new();
            let mut pinned = Vec::new();
            for hash in due {
                let matched = above.match_blocks(&[hash]);
                if !matched.is_empty() && pins.append(matched).is_ok() {
                    pinned.push(hash);
                }
            }
            let keep = vec![true; pinned.len()];
            let source = TierId::lower(index - 1).unwrap_or(TierId::DEVICE);
            self.plan_store(source, index, pinned, Pins::Lower(pins), keep);
        }
    }
}
