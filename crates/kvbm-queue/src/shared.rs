//! The private core every handle points at: one mutex over the queued
//! requests and one condition variable for consumers waiting on them.
//!
//! Lock rules (the loom models in `tests/loom_queue.rs` check them):
//!
//! 1. Every public operation locks once, so every operation is linearizable.
//! 2. No request code runs under the lock: `Request` methods are called before
//!    locking, and no request is dropped under it (requests only move in and
//!    out; whatever is removed is returned to the caller). Only the id's
//!    `Hash`/`Eq` runs inside.
//! 3. There is no counter beside the data: a consumer sleeps only while the
//!    queue is empty and open, and that predicate is read from the queue
//!    itself (the C# spec's semaphore drifted from the real count).
//! 4. Producers notify only when a consumer is asleep (`waiters`), after
//!    unlocking. Consumers spin briefly on the arrival [`Epoch`] before they
//!    sleep, so under steady traffic nobody sleeps and nobody notifies. A
//!    waiter that leaves without taking a request while requests remain
//!    passes its wake-up on, since it may have absorbed the one meant for
//!    them.
//! 5. `tracing` events are emitted after unlocking.

use crate::pending::Pending;
use crate::sync::{CachePadded, Clock, Condvar, Epoch, Instant, Mutex, MutexGuard, lock};
use crate::{QueueConfig, QueueStats, Request, Ticket};

pub(crate) struct Inner<R: Request> {
    pub(crate) pending: Pending<R>,
    pub(crate) next_seq: u64,
    pub(crate) closed: bool,
    /// Consumers blocked on `not_empty` right now.
    pub(crate) waiters: usize,
    pub(crate) clock: Clock,
    /// The clock when the queue was built: arrival times count from here.
    pub(crate) started: Instant,
    pub(crate) stats: QueueStats,
}

impl<R: Request> Inner<R> {
    /// Nanoseconds since the queue was built (saturating).
    pub(crate) fn elapsed_nanos(&self) -> u64 {
        let elapsed = self.clock.now().saturating_duration_since(self.started);
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
    }

    pub(crate) fn stats(&self) -> QueueStats {
        QueueStats {
            len: self.pending.len(),
            closed: self.closed,
            ..self.stats
        }
    }
}

pub(crate) struct Shared<R: Request> {
    pub(crate) inner: CachePadded<Mutex<Inner<R>>>,
    pub(crate) not_empty: Condvar,
    pub(crate) config: QueueConfig,
    /// KV bytes per block, when the config has a layout.
    pub(crate) bytes_per_block: Option<u64>,
    /// Tells this queue's handles and selections from another queue's.
    pub(crate) queue_id: u64,
    /// Bumped on every arrival and on close, for spinning consumers.
    pub(crate) epoch: Epoch,
}

impl<R: Request> Shared<R> {
    pub(crate) fn new(config: QueueConfig, bytes_per_block: Option<u64>, queue_id: u64) -> Self {
        let clock = Clock::new();
        let started = clock.now();
        Self {
            inner: CachePadded(Mutex::new(Inner {
                pending: Pending::with_capacity(
                    config.aging() == crate::Aging::Strict,
                    config.capacity(),
                ),
                next_seq: 0,
                closed: false,
                waiters: 0,
                clock,
                started,
                stats: QueueStats::default(),
            })),
            not_empty: Condvar::new(),
            config,
            bytes_per_block,
            queue_id,
            epoch: Epoch::new(),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner<R>> {
        lock(&self.inner.0)
    }

    /// Takes the request `ticket` names, if it is still queued.
    pub(crate) fn cancel(&self, ticket: Ticket<R::Id>) -> Option<R> {
        let mut inner = self.lock();
        let taken = inner.pending.remove_instance(ticket.id, ticket.seq);
        if taken.is_some() {
            inner.stats.cancelled += 1;
        }
        let len = inner.pending.len();
        drop(inner);
        tracing::debug!(id = ?ticket.id, seq = ticket.seq, found = taken.is_some(), len, "cancelled");
        taken.map(|entry| entry.request)
    }

    /// A request just became available: tells spinning consumers (the
    /// epoch), unlocks, and wakes one sleeping consumer if there is one
    /// (rule 4). Returns the queue length at that moment.
    pub(crate) fn arrived(&self, guard: MutexGuard<'_, Inner<R>>) -> usize {
        self.epoch.bump();
        let wake = guard.waiters > 0;
        let len = guard.pending.len();
        drop(guard);
        if wake {
            self.not_empty.notify_one();
        }
        len
    }

    /// Wakes every waiter if there are any; for events that concern them all
    /// (close, a cancelled wait token, model time moving).
    pub(crate) fn wake_all(&self, guard: MutexGuard<'_, Inner<R>>) {
        let wake = guard.waiters > 0;
        drop(guard);
        if wake {
            self.not_empty.notify_all();
        }
    }
}
