//! [`QueueError`], the one error type of this crate, and [`Rejected`], which
//! hands a refused request back to the caller.

use std::fmt;

/// Everything that can go wrong in `kvbm-queue`.
///
/// The four ways a dequeue can come back empty-handed are distinct variants:
/// [`Empty`](Self::Empty) (nothing queued right now), [`Timeout`](Self::Timeout)
/// (nothing arrived in time), [`Closed`](Self::Closed) (closed and drained)
/// and [`Cancelled`](Self::Cancelled) (the consumer's [`WaitToken`](crate::WaitToken)
/// was cancelled). Operations that consume a request wrap this in a
/// [`Rejected`] so the request comes back instead of being lost.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// A request with the same id is already queued.
    #[error("a request with this id is already queued")]
    Duplicate,
    /// The queue was closed: it takes no new requests, and a dequeue that
    /// finds it closed *and* drained reports this.
    #[error("the queue is closed")]
    Closed,
    /// The request needs more KV blocks than the whole pool has, so it could
    /// never be admitted; accepting it would stall a head-of-line queue forever.
    #[error("the request needs {needed} KV blocks but the pool has {pool}")]
    TooLarge {
        /// Blocks the request would need (prompt plus generation reserve).
        needed: u64,
        /// Blocks in the whole pool.
        pool: u64,
    },
    /// A scheduler request had no prompt tokens: nothing to compute a first
    /// token from.
    #[error("a request needs at least one prompt token")]
    EmptyPrompt,
    /// `try_dequeue` found nothing queued (and the queue open).
    #[error("the queue is empty")]
    Empty,
    /// A timed dequeue saw no request before its deadline.
    #[error("timed out waiting for a request")]
    Timeout,
    /// The consumer's wait token was cancelled.
    #[error("the wait was cancelled")]
    Cancelled,
    /// An [`Admitted`](crate::Admitted) was handed to a queue other than the
    /// one that selected it.
    #[error("the request was selected from a different queue")]
    ForeignQueue,
    /// A byte budget was given to a queue configured without a [`KvLayout`](crate::KvLayout).
    #[error("a byte budget needs a KV layout in the queue configuration")]
    NoKvLayout,
    /// A configuration or layout value that must be positive was zero.
    #[error("{field} must be at least 1")]
    Zero {
        /// The offending field.
        field: &'static str,
    },
    /// Tensor parallelism cannot split the KV heads evenly.
    #[error("{kv_heads} KV heads cannot be split across tensor-parallel size {tp_size}")]
    TensorParallel {
        /// KV heads of the model.
        kv_heads: u32,
        /// Tensor-parallel ranks.
        tp_size: u32,
    },
    /// Bytes per token or per block does not fit in a `u64`.
    #[error("the KV layout's size per {what} overflows u64")]
    LayoutOverflow {
        /// `"token"` or `"block"`.
        what: &'static str,
    },
}

/// An operation refused a request it would have taken; the request is inside.
///
/// Like tokio's `TrySendError`, this gives ownership back, so the caller can
/// answer the client, fix the input or retry.
///
/// ```
/// use kvbm_queue::{QueueConfig, QueueError, Request, RequestQueue};
///
/// #[derive(Debug, PartialEq)]
/// struct Req(u64);
/// impl Request for Req {
///     type Id = u64;
///     fn id(&self) -> u64 { self.0 }
///     fn prompt_tokens(&self) -> u32 { 16 }
///     fn max_new_tokens(&self) -> u32 { 0 }
/// }
///
/// let queue = RequestQueue::new(QueueConfig::new(16, 8))?;
/// queue.enqueue(Req(1))?;
/// let rejected = queue.enqueue(Req(1)).unwrap_err();
/// assert_eq!(rejected.error(), &QueueError::Duplicate);
/// assert_eq!(rejected.into_inner(), Req(1)); // ours again
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Rejected<R> {
    error: QueueError,
    request: R,
}

impl<R> Rejected<R> {
    pub(crate) fn new(error: QueueError, request: R) -> Self {
        Self { error, request }
    }

    /// Why the request was refused.
    pub fn error(&self) -> &QueueError {
        &self.error
    }

    /// Takes the refused request back.
    pub fn into_inner(self) -> R {
        self.request
    }

    /// Splits into the reason and the refused request.
    pub fn into_parts(self) -> (QueueError, R) {
        (self.error, self.request)
    }
}

impl<R> fmt::Debug for Rejected<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejected")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<R> fmt::Display for Rejected<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<R> std::error::Error for Rejected<R> {}

impl<R> From<Rejected<R>> for QueueError {
    fn from(rejected: Rejected<R>) -> Self {
        rejected.error
    }
}

/// Everything that can go wrong driving a [`Scheduler`](crate::Scheduler).
///
/// A refused call changes nothing: the plan stays pending, every request
/// stays where it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchedulerError {
    /// A tier below the device refused (a bad tier configuration, or a
    /// transfer report naming no transfer in flight).
    #[error(transparent)]
    Tier(#[from] kvbm_tiers::TierError),
    /// A load cost model value is negative or not finite, or the model has
    /// not one link per lower tier.
    #[error("load cost {name} of {value} is invalid")]
    InvalidCost {
        /// The value's name.
        name: &'static str,
        /// The value given.
        value: String,
    },
    /// KV cache groups the scheduler cannot run: blocks of another size
    /// than the pool's.
    #[error("KV cache groups refused: {reason}")]
    InvalidGroups {
        /// Why.
        reason: String,
    },
    /// `step` was called while the previous plan still awaits `apply`.
    #[error("step {step} was planned but not applied yet")]
    StepPending {
        /// The pending step.
        step: u64,
    },
    /// `apply` (or a pending-step lookup) was called with no plan pending.
    #[error("no step is pending")]
    NoStepPending,
    /// A lookup was handed the plan of another step than the pending one.
    #[error("plan of step {plan}, but step {pending} is pending")]
    StalePlan {
        /// The step of the plan handed in.
        plan: u64,
        /// The pending step.
        pending: u64,
    },
    /// A planned request got no output.
    #[error("no engine output for planned request {id}")]
    MissingOutput {
        /// The request.
        id: crate::RequestId,
    },
    /// An output names a request the plan did not schedule.
    #[error("engine output for request {id}, which this step did not schedule")]
    UnexpectedOutput {
        /// The request.
        id: crate::RequestId,
    },
    /// Two outputs name the same request.
    #[error("two engine outputs for request {id}")]
    DuplicateOutput {
        /// The request.
        id: crate::RequestId,
    },
    /// A decode or an emitting prefill chunk came back without a token.
    #[error("request {id} must sample a token this step")]
    MissingToken {
        /// The request.
        id: crate::RequestId,
    },
    /// A non-emitting prefill chunk came back with a token.
    #[error("request {id} samples no token this step")]
    UnexpectedToken {
        /// The request.
        id: crate::RequestId,
    },
    /// An output accepted more draft tokens than its step verified (a
    /// prefill chunk or a plain decode verifies none).
    #[error("request {id} accepted {accepted} draft tokens but its step verified {drafts}")]
    TooManyDrafts {
        /// The request.
        id: crate::RequestId,
        /// Draft tokens the output accepted.
        accepted: usize,
        /// Draft tokens the step verified.
        drafts: usize,
    },
    /// `abort` named a request that is neither waiting nor running.
    #[error("request {id} is not waiting or running")]
    UnknownRequest {
        /// The request.
        id: crate::RequestId,
    },
    /// A limit in the [`SchedulerConfig`](crate::SchedulerConfig) must be positive.
    #[error("scheduler config: {field} must be at least 1")]
    ZeroLimit {
        /// The offending field.
        field: &'static str,
    },
    /// The waiting queue refused the configuration.
    #[error("waiting queue: {0}")]
    Queue(#[from] QueueError),
    /// The block manager's audit failed.
    #[error("block manager: {0}")]
    Block(#[from] kvbm_blocks::BlockError),
    /// [`Scheduler::audit`](crate::Scheduler::audit) found requests or blocks
    /// unaccounted for. This is a bug in kvbm; please report it.
    #[error("scheduler invariant violated: {0}")]
    InvariantViolated(String),
}
