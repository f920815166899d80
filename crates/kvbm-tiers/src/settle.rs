//! The engine's reports: a transfer completed (its destinations become
//! matchable) or failed (they are freed, nothing is marked loaded).

use kvbm_blocks::{ImmutableBlocks, MutableBlocks};
use tracing::{debug, trace};

use crate::flight::{Flight, Landings, Pins};
use crate::{TierError, TierId, Tiers, TransferId, TransferKind};

/// How a transfer ended, by the engine's report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Every block was copied.
    Completed,
    /// The copy failed (or timed out in the engine): none of it counts.
    Failed,
}

/// What settling a transfer changed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Settled<D> {
    /// A store completed: its blocks are cached in `tier` now (and may be
    /// on their way further down).
    Stored {
        /// The transfer.
        id: TransferId,
        /// Where the blocks are now.
        tier: TierId,
        /// How many.
        blocks: usize,
    },
    /// A load completed: its blocks are registered on the device, pinned by
    /// `blocks` until the caller drops them (so the requests waiting for
    /// them find them there).
    Loaded {
        /// The transfer.
        id: TransferId,
        /// The lower tier they came from.
        from: TierId,
        /// The blocks, registered on the device, in prefix order.
        blocks: ImmutableBlocks<D>,
    },
    /// The copy failed, or completed after it was abandoned: its
    /// destinations were freed and nothing became matchable.
    Dropped {
        /// The transfer.
        id: TransferId,
        /// Which way it went.
        kind: TransferKind,
        /// Blocks it would have copied.
        blocks: usize,
        /// Whether the engine reported it failed (else it was abandoned).
        failed: bool,
    },
}

impl<D> Settled<D> {
    /// The transfer settled.
    pub fn id(&self) -> TransferId {
        match self {
            Self::Stored { id, .. } | Self::Loaded { id, .. } | Self::Dropped { id, .. } => *id,
        }
    }
}

impl<D> Tiers<D> {
    /// The engine completed transfer `id`.
    ///
    /// # Errors
    ///
    /// [`TierError::UnknownTransfer`] if it was never planned or is settled
    /// already; nothing changes.
    pub fn complete(&mut self, id: TransferId) -> Result<Settled<D>, TierError> {
        self.settle(id, Outcome::Completed)
    }

    /// The engine failed transfer `id`: its destinations are freed, its
    /// sources unpinned, and nothing is marked stored or loaded.
    ///
    /// # Errors
    ///
    /// As [`complete`](Self::complete).
    pub fn fail(&mut self, id: TransferId) -> Result<Settled<D>, TierError> {
        self.settle(id, Outcome::Failed)
    }

    /// Settles a batch of reports, all or nothing: every id must be in
    /// flight and named once, else nothing changes.
    ///
    /// # Errors
    ///
    /// [`TierError::UnknownTransfer`], [`TierError::DuplicateReport`].
    pub fn settle_all(
        &mut self,
        reports: &[(TransferId, Outcome)],
    ) -> Result<Vec<Settled<D>>, TierError> {
        for (i, (id, _)) in reports.iter().enumerate() {
            if !self.flights.contains_key(id) {
                return Err(TierError::UnknownTransfer(*id));
            }
            if reports[..i].iter().any(|(other, _)| other == id) {
                return Err(TierError::DuplicateReport(*id));
            }
        }
        reports
            .iter()
            .map(|&(id, outcome)| self.settle(id, outcome))
            .collect()
    }

    /// Gives up on transfer `id` (its request stopped waiting): whatever
    /// the engine reports later, nothing of it becomes matchable. Its blocks
    /// stay pinned until that report, since the engine may still be writing
    /// them; a block it was loading may be loaded again meanwhile.
    ///
    /// # Errors
    ///
    /// As [`complete`](Self::complete).
    pub fn abandon(&mut self, id: TransferId) -> Result<(), TierError> {
        let flight = self
            .flights
            .get_mut(&id)
            .ok_or(TierError::UnknownTransfer(id))?;
        flight.abandoned = true;
        if flight.kind == TransferKind::Load {
            self.loading.retain(|_, loading| *loading != id);
        }
        Ok(())
    }

    fn settle(&mut self, id: TransferId, outcome: Outcome) -> Result<Settled<D>, TierError> {
        let flight = self
            .flights
            .remove(&id)
            .ok_or(TierError::UnknownTransfer(id))?;
        let blocks = flight.hashes.len();
        match outcome {
            Outcome::Completed => self.counts.completed += 1,
            Outcome::Failed => self.counts.failed += 1,
        }
        self.forget_in_flight(id, &flight);
        if outcome == Outcome::Failed || flight.abandoned {
            self.count_dropped(&flight);
            debug!(%id, blocks, failed = outcome == Outcome::Failed, "transfer dropped");
            // Pins and destinations drop here: sources back where they
            // were, destinations freed.
            return Ok(Settled::Dropped {
                id,
                kind: flight.kind,
                blocks,
                failed: outcome == Outcome::Failed,
            });
        }
        trace!(%id, blocks, kind = ?flight.kind, "transfer completed");
        Ok(match flight.kind {
            TransferKind::Load => self.land_on_device(id, flight),
            TransferKind::Store => self.land_below(id, flight),
        })
    }

    /// The flight's hashes are no longer on their way anywhere.
    fn forget_in_flight(&mut self, id: TransferId, flight: &Flight<D>) {
        match flight.destination.lower_index() {
            None => {
                for hash in &flight.hashes {
                    if self.loading.get(&hash.value()) == Some(&id) {
                        self.loading.remove(&hash.value());
                    }
                }
            }
            Some(index) => {
                if let Some(tier) = self.lower.get_mut(index) {
                    for hash in &flight.hashes {
                        tier.incoming.remove(&hash.value());
                    }
                }
            }
        }
    }

    fn count_dropped(&mut self, flight: &Flight<D>) {
        let blocks = flight.hashes.len() as u64;
        match flight.kind {
            TransferKind::Store => {
                if let Some(tier) =
                    (flight.destination.lower_index()).and_then(|i| self.lower.get_mut(i))
                {
                    tier.stats.failed_stores += blocks;
                }
            }
            TransferKind::Load => {
                if let Some(tier) =
                    (flight.source.lower_index()).and_then(|i| self.lower.get_mut(i))
                {
                    tier.stats.failed_loads += blocks;
                }
            }
        }
    }

    /// A completed load: its blocks registered on the device (one lock),
    /// its sources released (one lock).
    fn land_on_device(&mut self, id: TransferId, flight: Flight<D>) -> Settled<D> {
        let Flight {
            source,
            hashes,
            landings,
            pins,
            ..
        } = flight;
        let landed = match landings {
            Landings::Device(blocks) => blocks,
            Landings::Lower(_) => MutableBlocks::new(),
        };
        drop(pins);
        let count = landed.len() as u64;
        let blocks = self
            .device
            .register_batch(landed, &hashes)
            .unwrap_or_default();
        if let Some(tier) = (source.lower_index()).and_then(|i| self.lower.get_mut(i)) {
            tier.stats.loaded_blocks += count;
        }
        self.counts.loaded_blocks += count;
        Settled::Loaded {
            id,
            from: source,
            blocks,
        }
    }

    /// A completed store: its blocks cached in their tier, and passed on to
    /// the tier below if it takes them.
    fn land_below(&mut self, id: TransferId, flight: Flight<D>) -> Settled<D> {
        let Flight {
            destination,
            hashes,
            landings,
            pins,
            ..
        } = flight;
        let blocks = hashes.len();
        let Some(index) = destination.lower_index() else {
            return Settled::Dropped {
                id,
                kind: TransferKind::Store,
                blocks,
                failed: false,
            };
        };
        let landed = match landings {
            Landings::Lower(landed) => landed,
            Landings::Device(_) => MutableBlocks::new(),
        };
        drop(pins);
        let count = landed.len();
        let chained = self.chained_below(index);
        let Some(tier) = self.lower.get_mut(index) else {
            return Settled::Stored {
                id,
                tier: destination,
                blocks: 0,
            };
        };
        tier.stats.stored_blocks += count as u64;
        self.counts.stored_blocks += count as u64;
        let Some(policy) = chained else {
            // Nothing takes them further down: straight into the cache.
            let _ = tier.pool.cache_batch(landed, &hashes);
            return Settled::Stored {
                id,
                tier: destination,
                blocks: count,
            };
        };
        let stored = tier
            .pool
            .register_batch(landed, &hashes)
            .unwrap_or_default();
        let keep = self.wanted(policy, &hashes);
        if keep.iter().any(|&k| k) && stored.len() == hashes.len() {
            self.plan_store(destination, index + 1, hashes, Pins::Lower(stored), keep);
        }
        Settled::Stored {
            id,
            tier: destination,
            blocks: count,
        }
    }
}
