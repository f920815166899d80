//! Locking a binding's state from Python without deadlocks or panics.

use std::sync::{Mutex, MutexGuard, PoisonError};

use pyo3::Python;
use pyo3::sync::MutexExt;

/// Locks `mutex`, detached from the interpreter while waiting (so a thread
/// holding the lock while detached, in a long call, can always re-attach),
/// and past a poisoned lock: every operation leaves the state consistent
/// before anything could panic, so a poisoned lock is still usable.
pub(crate) fn lock<'a, T>(mutex: &'a Mutex<T>, py: Python<'_>) -> MutexGuard<'a, T> {
    mutex
        .lock_py_attached(py)
        .unwrap_or_else(PoisonError::into_inner)
}
