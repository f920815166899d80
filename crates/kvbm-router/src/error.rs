//! [`RouterError`].

use crate::WorkerId;

/// What the router refuses. A refused call changes nothing but the
/// refusal counters of [`WorkerStats`](crate::WorkerStats).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouterError {
    /// Events or load for a worker that was never added (or was removed).
    #[error("unknown worker {0}")]
    UnknownWorker(WorkerId),
    /// A worker added twice.
    #[error("worker {0} is already routed to")]
    DuplicateWorker(WorkerId),
    /// A `BlockStored` of another block size than the router's (set by
    /// [`Router::with_block_size`](crate::Router::with_block_size), or
    /// fixed by the first `BlockStored` the router accepted): its keys
    /// would never match a request keyed at the router's size.
    #[error("worker {worker} stored blocks of {event} tokens, the router's are {router}")]
    BlockSizeMismatch {
        /// Who sent it.
        worker: WorkerId,
        /// The router's block size.
        router: u32,
        /// The event's block size.
        event: u32,
    },
    /// A `BlockStored` on a medium beyond the
    /// [`MAX_MEDIA`](crate::PrefixIndex::MAX_MEDIA) the router tracks.
    #[error("medium {medium:?} refused: the router tracks at most {max} media")]
    TooManyMedia {
        /// The refused medium's name.
        medium: String,
        /// How many media the router tracks, the device medium included.
        max: usize,
    },
    /// A `BlockStored` naming a medium longer than
    /// [`MAX_MEDIUM_NAME`](crate::PrefixIndex::MAX_MEDIUM_NAME) bytes.
    #[error("medium name of {len} bytes refused (at most {max})")]
    MediumNameTooLong {
        /// The name's length in bytes.
        len: usize,
        /// The longest name the router keeps.
        max: usize,
    },
    /// [`Router::audit`](crate::Router::audit) found the router's state
    /// inconsistent, which would be a bug in this crate (or the index
    /// changed behind the router's back through
    /// [`Router::index`](crate::Router::index)).
    #[error("router state is inconsistent: {0}")]
    InvariantViolated(String),
}
