//! [`Tiers::audit`]: every tier's conservation, and the transfers' books.

use std::collections::HashSet;

use crate::{TierError, Tiers, TransferKind};

/// What [`Tiers::audit`] counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TiersAudit {
    /// Transfers in flight.
    pub in_flight: usize,
    /// Blocks held as destinations of transfers in flight.
    pub landing_blocks: usize,
    /// Per lower tier with a pool of its own: its pool's audit (a shared
    /// pool is left to whoever shares it out: auditing it once per sharer
    /// would cost a pass over it each).
    pub pools: Vec<(crate::TierId, kvbm_blocks::PoolAudit)>,
}

impl<D> Tiers<D> {
    /// Recounts everything: each lower pool's own conservation (shared
    /// pools excepted, see [`TiersAudit::pools`]), that the
    /// hashes on their way into each tier (and up to the device) are exactly
    /// those of the transfers in flight that go there, that a transfer's
    /// sources and destinations are in the right tiers, and that planned
    /// transfers equal completed plus failed plus in flight.
    ///
    /// # Errors
    ///
    /// [`TierError::InvariantViolated`] naming the first disagreement (a
    /// bug), or a pool's own audit error.
    pub fn audit(&self) -> Result<TiersAudit, TierError> {
        let violated = |what: String| Err(TierError::InvariantViolated(what));
        let mut audit = TiersAudit::default();
        for (id, tier) in self.lower_ids().zip(&self.lower) {
            if tier.config.shared_pool().is_some() {
                continue;
            }
            let pool = tier.pool.audit().map_err(|source| TierError::Pool {
                medium: tier.config.medium.clone(),
                source,
            })?;
            audit.pools.push((id, pool));
        }
        let mut incoming: Vec<HashSet<u128>> = vec![HashSet::new(); self.lower.len()];
        let mut loading = 0usize;
        for (id, flight) in &self.flights {
            audit.landing_blocks += flight.hashes.len();
            if flight.pins.len() != flight.hashes.len()
                || flight.landings.block_ids().len() != flight.hashes.len()
            {
                return violated(format!(
                    "transfer {id}'s pins, landings and hashes disagree"
                ));
            }
            match (flight.kind, flight.destination.lower_index()) {
                (TransferKind::Load, None) => {
                    if flight.source.is_device() {
                        return violated(format!("load {id} from the device"));
                    }
                    for hash in &flight.hashes {
                        let entry = self.loading.get(&hash.value());
                        match (flight.abandoned, entry) {
                            (false, Some(owner)) if owner == id => loading += 1,
                            (false, _) => {
                                return violated(format!(
                                    "load {id} of a block not marked loading"
                                ));
                            }
                            (true, Some(owner)) if owner == id => {
                                return violated(format!(
                                    "abandoned load {id} still marked loading"
                                ));
                            }
                            (true, _) => {}
                        }
                    }
                }
                (TransferKind::Store, Some(index)) if index < self.lower.len() => {
                    if flight.source.level() != index {
                        return violated(format!("store {id} skips a tier"));
                    }
                    for hash in &flight.hashes {
                        if !incoming[index].insert(hash.value()) {
                            return violated(format!("a hash stored twice into tier {index}"));
                        }
                    }
                }
                _ => return violated(format!("transfer {id} goes the wrong way")),
            }
        }
        if loading != self.loading.len() {
            return violated(format!(
                "{} blocks marked loading, {loading} in flight",
                self.loading.len()
            ));
        }
        for (index, tier) in self.lower.iter().enumerate() {
            if tier.incoming.len() != incoming[index].len()
                || !incoming[index].iter().all(|h| tier.incoming.contains(h))
            {
                return violated(format!(
                    "tier {index}'s incoming set disagrees with its stores"
                ));
            }
        }
        let counts = self.counts;
        let settled = counts.completed.saturating_add(counts.failed);
        if counts.planned != settled.saturating_add(self.flights.len() as u64) {
            return violated(format!(
                "{} planned, {} completed, {} failed, {} in flight",
                counts.planned,
                counts.completed,
                counts.failed,
                self.flights.len()
            ));
        }
        audit.in_flight = self.flights.len();
        Ok(audit)
    }
}
