//! [`TierStats`] and [`TransferCounts`]: what each tier and the transfers
//! did.

/// What one lower tier has done, counted since the tiers were built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierStats {
    /// Blocks stored into it (copies completed).
    pub stored_blocks: u64,
    /// Blocks loaded from it onto the device (copies completed).
    pub loaded_blocks: u64,
    /// Blocks of stores into it that failed or were abandoned.
    pub failed_stores: u64,
    /// Blocks of loads from it that failed or were abandoned.
    pub failed_loads: u64,
    /// Blocks not stored because `max_incoming_blocks` were on their way
    /// already.
    pub skipped_stores: u64,
    /// Blocks its pool evicted (to make room for incoming ones).
    pub evicted_blocks: u64,
    /// Blocks of request prefixes found in it and chosen for loading.
    pub hit_blocks: u64,
    /// Blocks its store already held, registered without a copy
    /// ([`Tiers::adopt`](crate::Tiers::adopt)).
    pub adopted_blocks: u64,
}

/// Transfers planned and settled; `planned == completed + failed +
/// in_flight` at every instant (`Tiers::audit` checks it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransferCounts {
    /// Transfers planned.
    pub planned: u64,
    /// Reported complete (abandoned ones included: their copies finished,
    /// their results were thrown away).
    pub completed: u64,
    /// Reported failed.
    pub failed: u64,
    /// Planned, not yet reported.
    pub in_flight: u64,
    /// Blocks moved by completed transfers, down (stores).
    pub stored_blocks: u64,
    /// Blocks moved by completed transfers, up (loads).
    pub loaded_blocks: u64,
}
