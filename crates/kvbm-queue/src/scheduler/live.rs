//! Live ids and [`SubmitHandle`]: submitting and cancelling from other threads.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use super::{InferenceRequest, RequestId};
use crate::{Rejected, Request, RequestQueue};

/// Ids of every request waiting or running, shared with the submit handles:
/// the queue alone knows only waiting ids, and an id must not be submitted
/// again while its request runs.
#[derive(Clone, Debug, Default)]
pub(super) struct LiveIds(Arc<Mutex<HashSet<RequestId>>>);

impl LiveIds {
    pub(super) fn set(&self) -> std::sync::MutexGuard<'_, HashSet<RequestId>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `request` unless its id is live.
    pub(super) fn submit(
        &self,
        queue: &RequestQueue<InferenceRequest>,
        request: InferenceRequest,
    ) -> Result<(), Rejected<InferenceRequest>> {
        if request.prompt().is_empty() {
            return Err(Rejected::new(crate::QueueError::EmptyPrompt, request));
        }
        let id = request.id();
        if !self.set().insert(id) {
            return Err(Rejected::new(crate::QueueError::Duplicate, request));
        }
        queue.enqueue(request).map(drop).inspect_err(|_| {
            self.retire(id);
        })
    }

    /// `id` left the scheduler; it may be submitted again.
    pub(super) fn retire(&self, id: RequestId) {
        self.set().remove(&id);
    }
}

/// A cheap, thread-safe handle for submitting and cancelling waiting
/// requests from other threads (the scheduler itself stays on one thread).
#[derive(Clone, Debug)]
pub struct SubmitHandle {
    queue: RequestQueue<InferenceRequest>,
    live: LiveIds,
}

impl SubmitHandle {
    pub(super) fn new(queue: RequestQueue<InferenceRequest>, live: LiveIds) -> Self {
        Self { queue, live }
    }

    /// Queues a request.
    ///
    /// # Errors
    ///
    /// The request comes back with [`QueueError::EmptyPrompt`](crate::QueueError::EmptyPrompt)
    /// (nothing to compute a first token from), [`QueueError::Duplicate`](crate::QueueError::Duplicate)
    /// if a request with its id is waiting or running, [`QueueError::TooLarge`](crate::QueueError::TooLarge)
    /// if it could never fit the pool, or [`QueueError::Closed`](crate::QueueError::Closed).
    pub fn submit(&self, request: InferenceRequest) -> Result<(), Rejected<InferenceRequest>> {
        self.live.submit(&self.queue, request)
    }

    /// Takes a request out of the waiting queue; `false` if it is not
    /// waiting (a running request is aborted with [`Scheduler::abort`]).
    /// A preempted request's progress is dropped at the scheduler's next step.
    pub fn cancel(&self, id: RequestId) -> bool {
        let taken = self.queue.remove(id).is_some();
        if taken {
            self.live.retire(id);
        }
        taken
    }
}
