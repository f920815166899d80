//! Python exceptions: one class per kind of refusal, all under `kvbm.KvbmError`.
//!
//! ```text
//! KvbmError(Exception)
//! ├── InvalidArgumentError(KvbmError, ValueError)  a value kvbm refuses
//! ├── PoolError                                    the block pool refused
//! │   └── PoolExhaustedError                       not enough blocks, any layer
//! ├── SequenceError                                a request sequence refused
//! ├── SchedulerError                               the scheduler refused
//! └── SimError                                     a trace or replay failed
//! ```
//!
//! Each carries the Rust error's message. Wrong Python types stay Python's
//! `TypeError`, raised by the argument conversion.

use kvbm_blocks::BlockError;
use kvbm_queue::{QueueError, SchedulerError as RustSchedulerError};
use kvbm_sequence::SequenceError as RustSequenceError;
use kvbm_sim::SimError as RustSimError;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

create_exception!(
    kvbm,
    KvbmError,
    PyException,
    "Base class of every error kvbm raises."
);
create_exception!(
    kvbm,
    PoolError,
    KvbmError,
    "The block pool refused an operation (a block this pool does not hold, say)."
);
create_exception!(
    kvbm,
    PoolExhaustedError,
    PoolError,
    "Not enough free or evictable blocks, now or ever: nothing was allocated."
);
create_exception!(
    kvbm,
    SequenceError,
    KvbmError,
    "A request sequence refused an operation; it is unchanged."
);
create_exception!(
    kvbm,
    SchedulerError,
    KvbmError,
    "The scheduler refused a call (a duplicate id, a step not applied); nothing changed."
);
create_exception!(
    kvbm,
    SimError,
    KvbmError,
    "A trace could not be loaded or a replay failed."
);

/// `kvbm.InvalidArgumentError`, made at first use: it derives from both
/// `KvbmError` and `ValueError`, which `create_exception!` (one base) cannot.
static INVALID_ARGUMENT: PyOnceLock<Py<PyType>> = PyOnceLock::new();

const INVALID_ARGUMENT_DOC: &str = "A value kvbm refuses: a negative or zero size, an unknown \
                                    policy name, a token list of the wrong length. Also a \
                                    ValueError.";

/// The `InvalidArgumentError` class.
pub(crate) fn invalid_argument_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    let class = INVALID_ARGUMENT.get_or_try_init(py, || -> PyResult<Py<PyType>> {
        let bases = PyTuple::new(
            py,
            [py.get_type::<KvbmError>(), py.get_type::<PyValueError>()],
        )?;
        let namespace = PyDict::new(py);
        namespace.set_item("__module__", "kvbm")?;
        namespace.set_item("__doc__", INVALID_ARGUMENT_DOC)?;
        let class = py
            .get_type::<PyType>()
            .call1(("InvalidArgumentError", bases, namespace))?;
        Ok(class.cast_into::<PyType>()?.unbind())
    })?;
    Ok(class.bind(py))
}

/// Which exception class a refusal becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Invalid,
    Pool,
    Exhausted,
    Sequence,
    Scheduler,
    Sim,
}

/// A refusal on its way to Python: its class and the Rust error's message.
#[derive(Debug)]
pub(crate) struct Error {
    kind: Kind,
    message: String,
}

impl Error {
    pub(crate) fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// An argument kvbm refuses.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(Kind::Invalid, message)
    }

    /// A block-pool refusal.
    pub(crate) fn pool(message: impl Into<String>) -> Self {
        Self::new(Kind::Pool, message)
    }
}

impl From<Error> for PyErr {
    fn from(error: Error) -> PyErr {
        let message = error.message;
        match error.kind {
            Kind::Invalid => Python::attach(|py| match invalid_argument_type(py) {
                Ok(class) => PyErr::from_type(class.clone(), message),
                Err(err) => err,
            }),
            Kind::Pool => PoolError::new_err(message),
            Kind::Exhausted => PoolExhaustedError::new_err(message),
            Kind::Sequence => SequenceError::new_err(message),
            Kind::Scheduler => SchedulerError::new_err(message),
            Kind::Sim => SimError::new_err(message),
        }
    }
}

/// The class of a block-layer error, wherever it surfaced.
fn block_kind(error: &BlockError) -> Kind {
    match error {
        BlockError::ZeroBlockCount
        | BlockError::ZeroBlockSize
        | BlockError::TooManyBlocks { .. }
        | BlockError::TokenCountMismatch { .. }
        | BlockError::InvalidSequenceHash { .. }
        // A pool too large for this machine: the size is what to fix.
        | BlockError::OutOfMemory { .. } => Kind::Invalid,
        BlockError::ExceedsCapacity { .. } | BlockError::InsufficientBlocks { .. } => {
            Kind::Exhausted
        }
        _ => Kind::Pool,
    }
}

impl From<BlockError> for Error {
    fn from(error: BlockError) -> Self {
        Self::new(block_kind(&error), error.to_string())
    }
}

impl From<RustSequenceError> for Error {
    fn from(error: RustSequenceError) -> Self {
        let kind = match &error {
            RustSequenceError::ZeroBlockSize => Kind::Invalid,
            RustSequenceError::AllocationFailed { source, .. }
                if block_kind(source) == Kind::Exhausted =>
            {
                Kind::Exhausted
            }
            RustSequenceError::Block(inner) => block_kind(inner),
            _ => Kind::Sequence,
        };
        Self::new(kind, error.to_string())
    }
}

/// The class of a waiting-queue error.
fn queue_kind(error: &QueueError) -> Kind {
    match error {
        QueueError::EmptyPrompt
        | QueueError::Zero { .. }
        | QueueError::NoKvLayout
        | QueueError::TensorParallel { .. }
        | QueueError::LayoutOverflow { .. } => Kind::Invalid,
        _ => Kind::Scheduler,
    }
}

impl From<QueueError> for Error {
    fn from(error: QueueError) -> Self {
        Self::new(queue_kind(&error), error.to_string())
    }
}

impl From<RustSchedulerError> for Error {
    fn from(error: RustSchedulerError) -> Self {
        let kind = match &error {
            RustSchedulerError::ZeroLimit { .. }
            | RustSchedulerError::InvalidCost { .. }
            | RustSchedulerError::Tier(
                kvbm_tiers::TierError::InvalidTier { .. }
                | kvbm_tiers::TierError::DuplicateMedium(_)
                | kvbm_tiers::TierError::TooManyTiers(_),
            ) => Kind::Invalid,
            RustSchedulerError::Queue(inner) => queue_kind(inner),
            RustSchedulerError::Block(inner) => block_kind(inner),
            _ => Kind::Scheduler,
        };
        Self::new(kind, error.to_string())
    }
}

impl From<RustSimError> for Error {
    fn from(error: RustSimError) -> Self {
        let kind = match &error {
            RustSimError::InvalidBlockSize { .. }
            | RustSimError::ZeroCapacity { .. }
            | RustSimError::CapacityTooLarge { .. }
            | RustSimError::UnboundedServe
            | RustSimError::InvalidStepTime { .. }
            | RustSimError::InvalidTiers(_)
            | RustSimError::InvalidAcceptance { .. }
            | RustSimError::InvalidPriorityMix { .. }
            | RustSimError::InvalidAgingRate { .. }
            | RustSimError::UnknownPolicy { .. }
            | RustSimError::ZeroEngines
            | RustSimError::InvalidReplicate { .. }
            | RustSimError::InvalidMemoryLimit { .. }
            | RustSimError::InvalidRouting { .. }
            | RustSimError::UnknownEviction { .. }
            | RustSimError::InvalidCapacity { .. }
            | RustSimError::TooManySubscribers { .. }
            | RustSimError::FeatureDisabled { .. }
            | RustSimError::UnknownModel { .. }
            | RustSimError::InvalidGroupSpec { .. }
            | RustSimError::InvalidBytes { .. }
            | RustSimError::CapacityBelowBlock { .. }
            | RustSimError::ConflictingFlags { .. }
            | RustSimError::MissingFlag { .. }
            | RustSimError::Groups(_) => Kind::Invalid,
            _ => Kind::Sim,
        };
        Self::new(kind, error.to_string())
    }
}

/// Registers the exception classes in the module.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("KvbmError", py.get_type::<KvbmError>())?;
    module.add("InvalidArgumentError", invalid_argument_type(py)?)?;
    module.add("PoolError", py.get_type::<PoolError>())?;
    module.add("PoolExhaustedError", py.get_type::<PoolExhaustedError>())?;
    module.add("SequenceError", py.get_type::<SequenceError>())?;
    module.add("SchedulerError", py.get_type::<SchedulerError>())?;
    module.add("SimError", py.get_type::<SimError>())?;
    Ok(())
}
