//! [`TierError`].

use crate::TransferId;

/// What the tiers refuse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TierError {
    /// A lower tier's configuration cannot work.
    #[error("tier {medium:?}: {reason}")]
    InvalidTier {
        /// The tier's medium.
        medium: String,
        /// What is wrong.
        reason: String,
    },
    /// Two tiers named the same medium, or one named the device's.
    #[error("medium {0:?} is named twice")]
    DuplicateMedium(String),
    /// More lower tiers than tier ids can name.
    #[error("{0} lower tiers (at most 254)")]
    TooManyTiers(usize),
    /// The pool of a tier could not be built.
    #[error("tier {medium:?}: {source}")]
    Pool {
        /// The tier's medium.
        medium: String,
        /// Why.
        #[source]
        source: kvbm_blocks::BlockError,
    },
    /// A tier these tiers do not have below the device.
    #[error("no lower tier {0}")]
    UnknownTier(crate::TierId),
    /// A report names a transfer that was never planned, or that was
    /// already settled (completed, failed).
    #[error("transfer {0} is not in flight")]
    UnknownTransfer(TransferId),
    /// The same transfer is reported twice in one batch of reports.
    #[error("transfer {0} is reported twice")]
    DuplicateReport(TransferId),
    /// Bookkeeping disagrees with itself (a bug; `Tiers::audit` reports it).
    #[error("tier invariant violated: {0}")]
    InvariantViolated(String),
}
