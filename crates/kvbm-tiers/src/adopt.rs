//! Taking back what a lower tier's store kept across a restart.

use std::collections::HashSet;

use kvbm_blocks::SequenceHash;

use crate::{TierError, TierId, Tiers};

impl<D> Tiers<D> {
    /// Registers `hashes` in lower tier `tier` without a copy: blocks its
    /// store already holds, such as a disk store reopened after a restart
    /// (`kvbm_store::DiskStore::blocks` lists them with their lineage). They
    /// become matchable there at once, as if stores of them had completed.
    ///
    /// Hashes the tier holds or is receiving, and repeats, are skipped;
    /// parents go before their children; as many are taken as the tier has
    /// room for (free blocks, then cached ones it may evict, as for a
    /// store). Returns how many were adopted.
    ///
    /// Only what the store really holds may be adopted: a block adopted in
    /// error is found missing when it is loaded, and the load fails (its
    /// request recomputes), never serves other bytes, since the data plane
    /// verifies every block it reads.
    ///
    /// # Errors
    ///
    /// [`TierError::UnknownTier`] for the device or a tier it does not
    /// have; nothing changes then.
    pub fn adopt(&mut self, tier: TierId, hashes: &[SequenceHash]) -> Result<usize, TierError> {
        let index = tier
            .lower_index()
            .filter(|&index| index < self.lower.len())
            .ok_or(TierError::UnknownTier(tier))?;
        let lower = &mut self.lower[index];
        let mut ordered: Vec<SequenceHash> = hashes.to_vec();
        ordered.sort_by_key(|hash| hash.position());
        let mut seen = HashSet::with_capacity(ordered.len());
        ordered.retain(|hash| seen.insert(hash.value()) && !lower.incoming.contains(&hash.value()));
        let present = lower.pool.scan_matches(&ordered);
        let mut wanted: Vec<SequenceHash> = (ordered.into_iter().zip(present))
            .filter_map(|(hash, present)| (!present).then_some(hash))
            .collect();
        wanted.truncate(lower.pool.available_blocks());
        if wanted.is_empty() {
            return Ok(0);
        }
        let Ok(blocks) = lower.pool.allocate_batch(wanted.len()) else {
            return Ok(0);
        };
        let adopted = lower
            .pool
            .register_batch(blocks, &wanted)
            .map_or(0, |blocks| blocks.len());
        lower.stats.adopted_blocks += adopted as u64;
        Ok(adopted)
    }
}
