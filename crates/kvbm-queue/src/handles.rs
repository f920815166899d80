//! [`CancelHandle`], which cancels one queued request, and [`WaitToken`],
//! which cancels a consumer's wait. Either can be used from any thread.
//!
//! Neither registers anything inside the queue: cancelling *tells* the queue,
//! and the queue runs no callbacks. So nothing is left behind when a handle or
//! token is dropped, and nothing can deadlock on a callback (the C# spec's
//! cancellation registrations leaked, and disposing them under the lock would
//! have deadlocked).

use std::fmt;

use crate::Request;
use crate::shared::Shared;
use crate::sync::{Arc, AtomicBool, Ordering};

/// Cancels one queued request. Returned by
/// [`enqueue`](crate::RequestQueue::enqueue); cheap to clone and `Send` when
/// the request is.
///
/// The handle names the *instance* it was returned for (id plus arrival
/// number): once that request has left the queue, cancelling is a no-op, even
/// if a new request with the same id has been queued since. A request taken by
/// `select_batch` and put back with `restore` is the same instance, so its
/// handle works again.
///
/// The handle keeps the queue's shared state alive (not the other way round).
pub struct CancelHandle<R: Request> {
    pub(crate) id: R::Id,
    pub(crate) seq: u64,
    pub(crate) shared: Arc<Shared<R>>,
}

impl<R: Request> CancelHandle<R> {
    /// Removes the request from the queue at once and returns it, if it is
    /// still queued; `None` if it already left (dequeued, selected, removed,
    /// cleared or cancelled).
    pub fn cancel(&self) -> Option<R> {
        let mut inner = self.shared.lock();
        let taken = inner.pending.remove_instance(self.id, self.seq);
        if taken.is_some() {
            inner.stats.cancelled += 1;
        }
        let len = inner.pending.len();
        drop(inner);
        tracing::debug!(id = ?self.id, seq = self.seq, found = taken.is_some(), len, "cancelled");
        taken.map(|entry| entry.request)
    }

    /// Whether the request is still queued.
    pub fn is_queued(&self) -> bool {
        self.shared
            .lock()
            .pending
            .contains_instance(self.id, self.seq)
    }

    /// The request's id.
    pub fn id(&self) -> R::Id {
        self.id
    }
}

impl<R: Request> Clone for CancelHandle<R> {
    fn clone(&self) -> Self {
        Self {
            id: self.id,
            seq: self.seq,
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<R: Request> fmt::Debug for CancelHandle<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelHandle")
            .field("id", &self.id)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

/// Cancels a consumer's wait: the Rust form of the C# spec's
/// `Dequeue(CancellationToken)`. Made by
/// [`RequestQueue::wait_token`](crate::RequestQueue::wait_token) and passed to
/// [`dequeue_cancellable`](crate::RequestQueue::dequeue_cancellable).
///
/// Cancelling is permanent and wakes every consumer waiting with this token
/// (or a clone), which returns [`QueueError::Cancelled`](crate::QueueError::Cancelled);
/// later waits with it return that at once, even if requests are queued.
pub struct WaitToken<R: Request> {
    pub(crate) cancelled: Arc<AtomicBool>,
    pub(crate) shared: Arc<Shared<R>>,
}

impl<R: Request> WaitToken<R> {
    pub(crate) fn new(shared: Arc<Shared<R>>) -> Self {
        Self {
            cancelled: Arc::new(AtomicBool::new(false)),
            shared,
        }
    }

    /// Cancels every wait that uses this token (now or later).
    pub fn cancel(&self) {
        if self.cancelled.swap(true, Ordering::SeqCst) {
            return;
        }
        // The flag is set before this lock is taken, and a waiter reads it
        // under the lock before sleeping, so a waiter either sees it or is
        // already asleep when the notification below goes out.
        let guard = self.shared.lock();
        self.shared.wake_all(guard);
        tracing::debug!("wait token cancelled");
    }

    /// Whether [`cancel`](Self::cancel) has been called.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }
}

impl<R: Request> Clone for WaitToken<R> {
    fn clone(&self) -> Self {
        Self {
            cancelled: Arc::clone(&self.cancelled),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<R: Request> fmt::Debug for WaitToken<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitToken")
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}
