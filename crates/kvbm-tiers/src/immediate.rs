//! Copies completed at once, for a caller whose copies are synchronous (a
//! host tier the engine fills with a plain memory copy on its own thread)
//! and for a replay with no clock (the simulator's cache mode): the same
//! choices as [`offload`](Tiers::offload) and [`onboard`](Tiers::onboard),
//! without planning transfers, since nothing is ever in flight.
//!
//! Nothing stays pinned once these calls return: a caller that moves
//! bytes makes each copy before it touches these tiers again, and only
//! while no one else uses the lower pools (a pool shared with other
//! engines may reuse a source block at any time). Copies that take time,
//! or lower pools shared across threads, take the two-phase path, whose
//! sources and destinations stay pinned until the engine reports the copy.

use kvbm_blocks::{ImmutableBlocks, SequenceHash};

use crate::{Lower, OffloadPolicy, Tiers};

impl<D> Tiers<D> {
    /// [`offload_batch`](Self::offload_batch), copied at once: the blocks
    /// the first lower tier takes are stored there now (and passed on down
    /// as each tier's policy says); the number stored into the first tier.
    /// Blocks present below, or on their way by a transfer in flight, are
    /// skipped, as by `offload`.
    pub fn offload_now(&mut self, blocks: &ImmutableBlocks<D>) -> usize {
        let Some(first) = self.lower.first() else {
            return 0;
        };
        if blocks.is_empty() || !blocks.belongs_to(&self.device) {
            return 0;
        }
        let policy = first.config.offload;
        // The hashes go to a buffer kept between calls (a write-through
        // runs once per request).
        let mut hashes = std::mem::take(&mut self.offload_scratch);
        blocks.sequence_hashes_into(&mut hashes);
        // The sources stay pinned by the caller's `blocks` meanwhile.
        let stored = self.store_now(0, &mut hashes, policy);
        self.offload_scratch = hashes;
        stored
    }

    /// Stores the blocks of `hashes` the tier's `policy` takes into lower
    /// tier `index` now, then into the tier below as its policy says; how
    /// many went into `index`.
    fn store_now(
        &mut self,
        index: usize,
        wanted: &mut Vec<SequenceHash>,
        policy: OffloadPolicy,
    ) -> usize {
        let Some(tier) = self.lower.get(index) else {
            return 0;
        };
        // Taken, and not on its way by a transfer in flight (present ones
        // the pool skips itself). Twice in one batch is a hash collision
        // between two blocks of one chain: the pool keeps one copy.
        if policy != OffloadPolicy::WriteThrough || !tier.incoming.is_empty() {
            wanted
                .retain(|&hash| self.takes(policy, hash) && !tier.incoming.contains(&hash.value()));
        }
        let tier = &mut self.lower[index];
        tier.stats.skipped_stores += tier.pool.cache_blocks(wanted) as u64;
        let count = wanted.len();
        if count == 0 {
            return 0;
        }
        tier.stats.stored_blocks += count as u64;
        self.counts.stored_blocks += count as u64;
        // On down: the copies just made are the sources (nothing else runs
        // on this tier meanwhile, so they stay).
        if let Some(policy) = self.chained_below(index) {
            self.store_now(index + 1, wanted, policy);
        }
        count
    }

    /// [`onboard`](Self::onboard), copied at once: up to `max_blocks`
    /// leading blocks of `hashes` found in the lower tiers (each from the
    /// highest tier that has it) are registered on the device now and
    /// handed back, pinned, in prefix order, with how many came from each
    /// tier level (`[k]`: lower tier `k`). The walk stops at the first
    /// block no tier has, or one a transfer in flight is loading (nothing
    /// waits here). With no room on the device, nothing is loaded.
    pub fn onboard_now(
        &mut self,
        hashes: &[SequenceHash],
        max_blocks: usize,
    ) -> (ImmutableBlocks<D>, Vec<usize>) {
        let mut loaded_from = Vec::new();
        let loaded = self.onboard_now_into(hashes, max_blocks, &mut loaded_from);
        (loaded, loaded_from)
    }

    /// [`onboard_now`](Self::onboard_now) with the counts per tier level
    /// written to `loaded_from` (cleared first), for a caller that reuses
    /// one buffer from request to request: a replay onboards once a
    /// request, and most find nothing below, where the allocation of the
    /// counts was most of the call's cost.
    pub fn onboard_now_into(
        &mut self,
        hashes: &[SequenceHash],
        max_blocks: usize,
        loaded_from: &mut Vec<usize>,
    ) -> ImmutableBlocks<D> {
        loaded_from.clear();
        loaded_from.resize(self.lower.len() + 1, 0);
        let wanted = hashes
            .get(..max_blocks.min(hashes.len()))
            .unwrap_or_default();
        let mut pins: Vec<ImmutableBlocks<Lower>> = Vec::new();
        let found = match self.loading.is_empty() {
            true => self.touch_runs(wanted, loaded_from),
            false => self.pin_runs(wanted, loaded_from, &mut pins),
        };
        if let Some(sketch) = &mut self.hits {
            for hash in &wanted[..found] {
                sketch.increment(hash.value());
            }
        }
        if found == 0 {
            return ImmutableBlocks::new();
        }
        let Ok(loaded) = self.device.store_blocks(&wanted[..found]) else {
            for (level, count) in loaded_from.iter_mut().enumerate().skip(1) {
                if let Some(tier) = self.lower.get_mut(level - 1) {
                    tier.stats.hit_blocks -= *count as u64;
                    tier.stats.loaded_blocks -= *count as u64;
                }
                *count = 0;
            }
            return ImmutableBlocks::new();
        };
        self.counts.loaded_blocks += loaded.len() as u64;
        drop(pins);
        // As `onboard`: selective tiers below count these hits, and take
        // the blocks now due.
        self.store_hit_lower_now(&wanted[..found]);
        loaded
    }

    /// With no load in flight nothing stops the walk but a block no tier
    /// has: each run of `wanted` is served where it is, made most recently
    /// used there without pinning it (nothing runs meanwhile); how many.
    fn touch_runs(&mut self, wanted: &[SequenceHash], loaded_from: &mut [usize]) -> usize {
        let mut found = 0;
        'walk: while found < wanted.len() {
            for index in 0..self.lower.len() {
                // The first lower tier as far as it goes; one further down
                // for the next block only (a tier above may have the one
                // after).
                let end = if index == 0 { wanted.len() } else { found + 1 };
                let run = self.lower[index].pool.touch_prefix(&wanted[found..end]);
                if run > 0 {
                    self.served(index, run, loaded_from);
                    found += run;
                    continue 'walk;
                }
            }
            break;
        }
        found
    }

    /// With loads in flight: pins for the runs of `wanted`, one match per
    /// run of one tier's blocks, up to the first block no tier has or only
    /// a transfer in flight has; how many.
    fn pin_runs(
        &mut self,
        wanted: &[SequenceHash],
        loaded_from: &mut [usize],
        pins: &mut Vec<ImmutableBlocks<Lower>>,
    ) -> usize {
        let levels = self.locate(wanted);
        let mut found = 0;
        while found < levels.len() {
            let Some(index) = levels[found] else {
                break;
            };
            let run = (levels[found..].iter())
                .take_while(|&&level| level == Some(index))
                .count();
            let matched = self.lower[index]
                .pool
                .match_blocks(&wanted[found..found + run]);
            let pinned = matched.len();
            self.served(index, pinned, loaded_from);
            pins.push(matched);
            found += pinned;
            if pinned < run {
                break;
            }
        }
        found
    }

    /// Counts `blocks` served from lower tier `index`.
    fn served(&mut self, index: usize, blocks: usize, loaded_from: &mut [usize]) {
        loaded_from[index + 1] += blocks;
        self.lower[index].stats.hit_blocks += blocks as u64;
        self.lower[index].stats.loaded_blocks += blocks as u64;
    }

    /// Blocks just hit below the device that a selective lower tier
    /// (other than the first, which `offload_now` feeds) now takes.
    fn store_hit_lower_now(&mut self, hashes: &[SequenceHash]) {
        for index in 1..self.lower.len() {
            let policy = self.lower[index].config.offload;
            if !matches!(policy, OffloadPolicy::Selective { .. }) {
                continue;
            }
            self.store_now(index, &mut hashes.to_vec(), policy);
        }
    }
}
