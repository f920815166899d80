//! [`Ticket`] and [`CancelHandle`], which cancel one queued request, and
//! [`WaitToken`], which cancels a consumer's wait. All work from any thread.
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

/// Names one queued request: its id plus the arrival number that makes this
/// instance unique. Returned by [`enqueue`](crate::RequestQueue::enqueue);
/// plain data, so it is free to copy, store and send.
///
/// Cancelling through a ticket ([`RequestQueue::cancel`](crate::RequestQueue::cancel))
/// acts only on that instance: once it has left the queue, the ticket is
/// stale and does nothing, even if a new request with the same id has been
/// queued since. A request taken by `select_batch` and put back with
/// `restore` is the same instance, so its ticket works again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket<Id> {
    pub(crate) id: Id,
    pub(crate) seq: u64,
}

impl<Id: Copy> Ticket<Id> {
    /// The request's id.
    pub fn id(&self) -> Id {
        self.id
    }

    /// The request's arrival number.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// Cancels one queued request from any thread, on its own: a [`Ticket`]
/// bundled with the queue. Made by
/// [`RequestQueue::cancel_handle`](crate::RequestQueue::cancel_handle); cheap
/// to clone and `Send` when the request is, so it can be moved into the task
/// that watches the client's connection.
///
/// The handle keeps the queue's shared state alive (not the other way round).
pub struct CancelHandle<R: Request> {
    pub(crate) ticket: Ticket<R::Id>,
    pub(crate) shared: Arc<Shared<R>>,
}

impl<R: Request> CancelHandle<R> {
    /// Removes the request from the queue at once and returns it, if it is
    /// still queued; `None` if it already left (dequeued, selected, removed,
    /// cleared or cancelled).
    pub fn cancel(&self) -> Option<R> {
        self.shared.cancel(self.ticket)
    }

    /// Whether the request is still queued.
    pub fn is_queued(&self) -> bool {
        self.shared
            .lock()
            .pending
            .contains_instance(self.ticket.id, self.ticket.seq)
    }

    /// The ticket this handle cancels.
    pub fn ticket(&self) -> Ticket<R::Id> {
        self.ticket
    }
}

impl<R: Request> Clone for CancelHandle<R> {
    fn clone(&self) -> Self {
        Self {
            ticket: self.ticket,
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<R: Request> fmt::Debug for CancelHandle<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelHandle")
            .field("ticket", &self.ticket)
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
