//! The one place this crate takes its synchronization primitives and its clock from.
//!
//! Under `--cfg kvbm_loom` every primitive is loom's, so `tests/loom_queue.rs`
//! explores the interleavings of the real queue code. Loom has no real time
//! (its `Condvar::wait_timeout` never times out), so the clock is swapped too:
//! under loom a [`Clock`] is a logical counter that a model thread advances
//! explicitly (tokio's timer tests drive time the same way), and a timed wait
//! is an untimed wait that the advancing thread wakes.

use std::time::Duration;

#[cfg(not(kvbm_loom))]
pub(crate) use std::sync::{
    Arc, Condvar, Mutex, MutexGuard,
    atomic::{AtomicBool, Ordering},
};

#[cfg(kvbm_loom)]
pub(crate) use loom::sync::{
    Arc, Condvar, Mutex, MutexGuard,
    atomic::{AtomicBool, Ordering},
};

/// Locks `mutex`, recovering the data if a previous holder panicked.
///
/// Every critical section in this crate restores the queue's invariants
/// before it runs code that could panic (only a request id's `Hash`/`Eq` runs
/// under the lock), so a poisoned lock still guards consistent state.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(not(kvbm_loom))]
    {
        let mut backoff = Backoff::new();
        loop {
            match mutex.try_lock() {
                Ok(guard) => return guard,
                Err(std::sync::TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    if !backoff.snooze() {
                        break;
                    }
                }
            }
        }
    }
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether the calling thread could take `mutex` right now (tests use it to
/// prove no request code runs while the queue lock is held).
#[cfg(all(test, not(kvbm_loom)))]
pub(crate) fn is_locked<T>(mutex: &Mutex<T>) -> bool {
    matches!(mutex.try_lock(), Err(std::sync::TryLockError::WouldBlock))
}

/// Waits on `condvar` until notified or until `remaining` (if any) elapses.
///
/// Spurious wake-ups are possible; callers re-check their predicate. Under
/// loom the timed wait never times out: the thread that advances the model
/// clock wakes every waiter instead.
pub(crate) fn wait<'a, T>(
    condvar: &Condvar,
    guard: MutexGuard<'a, T>,
    remaining: Option<Duration>,
) -> MutexGuard<'a, T> {
    match remaining {
        None => condvar
            .wait(guard)
            .unwrap_or_else(std::sync::PoisonError::into_inner),
        Some(remaining) => condvar
            .wait_timeout(guard, remaining)
            .map(|(guard, _)| guard)
            .unwrap_or_else(|poisoned| poisoned.into_inner().0),
    }
}

pub(crate) use clock::{Clock, Instant};

#[cfg(not(kvbm_loom))]
mod clock {
    pub(crate) use std::time::Instant;

    /// Real time: a zero-sized handle on `Instant::now`.
    #[derive(Debug)]
    pub(crate) struct Clock;

    impl Clock {
        pub(crate) fn new() -> Self {
            Clock
        }

        pub(crate) fn now(&self) -> Instant {
            Instant::now()
        }
    }
}

#[cfg(kvbm_loom)]
mod clock {
    use std::time::Duration;

    /// A point on the model clock, in nanoseconds since the queue was built.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    pub(crate) struct Instant(u64);

    impl Instant {
        /// Saturates instead of failing: model time can reach its end (a
        /// model thread advancing by `Duration::MAX`), and a deadline set
        /// then must have passed, not mean "wait forever".
        pub(crate) fn checked_add(self, d: Duration) -> Option<Self> {
            let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            Some(Self(self.0.saturating_add(nanos)))
        }

        pub(crate) fn saturating_duration_since(self, earlier: Self) -> Duration {
            Duration::from_nanos(self.0.saturating_sub(earlier.0))
        }
    }

    /// Model time. It lives inside the queue's mutex, so reading it adds no
    /// interleavings of its own; it moves only when a model thread advances it.
    #[derive(Debug)]
    pub(crate) struct Clock {
        nanos: u64,
    }

    impl Clock {
        pub(crate) fn new() -> Self {
            Clock { nanos: 0 }
        }

        pub(crate) fn now(&self) -> Instant {
            Instant(self.nanos)
        }

        pub(crate) fn advance(&mut self, d: Duration) {
            let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            self.nanos = self.nanos.saturating_add(nanos);
        }
    }
}

/// The deadline `timeout` from now, or `None` if it lies beyond what the clock
/// can represent (which then means "wait without a deadline").
pub(crate) fn deadline_after(clock: &Clock, timeout: Duration) -> Option<Instant> {
    clock.now().checked_add(timeout)
}

/// A number no other queue in this process has, so a handle from one queue
/// can be told apart from another's. A plain std counter in every build: it is
/// only ever compared for equality, never part of a modelled interleaving.
pub(crate) fn next_queue_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Relaxed)
}

pub(crate) use spin::{Backoff, Epoch};

/// Spinning before sleeping. A consumer that finds the queue empty watches a
/// counter that producers bump (an [`Epoch`]) for a few microseconds, then
/// yields a few times, before it sleeps on the condition variable: under
/// steady traffic the next request is usually that close, and a futex sleep
/// plus wake-up costs far more. Producers then skip `notify` entirely,
/// because nobody is asleep (crossbeam's `Backoff` has the same shape).
///
/// Under loom both are compiled out: `Backoff` never spins, so the models
/// check the sleeping path, which is the one that can lose a wake-up.
#[cfg(not(kvbm_loom))]
mod spin {
    use std::sync::atomic::{AtomicU64, Ordering};

    const SPIN_LIMIT: u32 = 6;
    const YIELD_LIMIT: u32 = 10;

    pub(crate) struct Backoff {
        step: u32,
    }

    impl Backoff {
        pub(crate) fn new() -> Self {
            Self { step: 0 }
        }

        /// Waits a little; `false` once it is time to sleep instead.
        pub(crate) fn snooze(&mut self) -> bool {
            if self.step > YIELD_LIMIT {
                return false;
            }
            if self.step <= SPIN_LIMIT {
                for _ in 0..1u32 << self.step {
                    std::hint::spin_loop();
                }
            } else {
                std::thread::yield_now();
            }
            self.step += 1;
            true
        }
    }

    /// A counter bumped (under the queue lock) whenever a request arrives or
    /// the queue closes, so spinning consumers can watch it without the lock.
    #[derive(Debug, Default)]
    pub(crate) struct Epoch(AtomicU64);

    impl Epoch {
        pub(crate) fn new() -> Self {
            Self(AtomicU64::new(0))
        }

        /// Only ever called with the queue lock held: one writer at a time.
        pub(crate) fn bump(&self) {
            let next = self.0.load(Ordering::Relaxed).wrapping_add(1);
            self.0.store(next, Ordering::Release);
        }

        pub(crate) fn get(&self) -> u64 {
            self.0.load(Ordering::Acquire)
        }
    }
}

#[cfg(kvbm_loom)]
mod spin {
    pub(crate) struct Backoff;

    impl Backoff {
        pub(crate) fn new() -> Self {
            Self
        }

        pub(crate) fn snooze(&mut self) -> bool {
            false
        }
    }

    #[derive(Debug, Default)]
    pub(crate) struct Epoch;

    impl Epoch {
        pub(crate) fn new() -> Self {
            Self
        }

        pub(crate) fn bump(&self) {}

        pub(crate) fn get(&self) -> u64 {
            0
        }
    }
}

/// Keeps `T` on cache lines of its own (128 bytes: two lines, for the
/// adjacent-line prefetcher), so the queue lock does not share a line with
/// the `Arc` reference counts that every handle clone touches.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct CachePadded<T>(pub(crate) T);

impl<T> std::ops::Deref for CachePadded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}
