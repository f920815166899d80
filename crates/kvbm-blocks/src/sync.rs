//! The one place this crate takes its synchronization primitives from.
//!
//! Under `--cfg kvbm_loom` every primitive is loom's, so the model tests in
//! `tests/loom_pool.rs` explore the interleavings of the real pool code (and
//! crates above us that build with the same cfg drive these primitives too).

#[cfg(not(kvbm_loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(kvbm_loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

/// Locks `mutex`, recovering the data if a previous holder panicked.
///
/// No critical section in this crate panics on caller input, and every one of
/// them restores the pool's invariants before running code that could panic,
/// so a poisoned lock still guards consistent state.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
