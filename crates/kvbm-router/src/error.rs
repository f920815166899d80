//! [`RouterError`].

use crate::WorkerId;

/// What the router refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouterError {
    /// Events or load for a worker that was never added (or was removed).
    #[error("unknown worker {0}")]
    UnknownWorker(WorkerId),
    /// A worker added twice.
    #[error("worker {0} is already routed to")]
    DuplicateWorker(WorkerId),
}
