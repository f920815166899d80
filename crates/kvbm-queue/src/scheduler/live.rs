//! Live ids and [`SubmitHandle`]: submitting and cancelling from other threads.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{InferenceRequest, RequestId};
use crate::{Rejected, Request, RequestQueue};

/// Ids of every request waiting or running, shared with the submit handles:
/// the queue alone knows only waiting ids, and an id must not be submitted
/// again while its request runs.
///
/// It also carries cancellations to the scheduler, which alone may touch
/// running requests. A cancelled id stays live until the scheduler has ended
/// the request and reported it, so a resubmission under the same id can never
/// be mistaken for the cancelled request (by the scheduler's parked progress,
/// or by a front end reading the report).
#[derive(Clone, Debug, Default)]
pub(super) struct LiveIds(Arc<Live>);

#[derive(Debug, Default)]
struct Live {
    state: Mutex<LiveState>,
    /// Whether `state.cancelled` may be non-empty: set and cleared under the
    /// lock, read without it, so a step with nothing cancelled (nearly all)
    /// does not take the lock to find out. A cancel that races a step's
    /// look is seen at the next step, as it would be after the lock.
    any_cancelled: AtomicBool,
}

#[derive(Clone, Debug, Default)]
pub(super) struct LiveState {
    /// Every request submitted and not yet reported as finished.
    pub(super) live: HashSet<RequestId>,
    /// Live requests cancelled through a handle, for the scheduler to end.
    pub(super) cancelled: HashSet<RequestId>,
}

impl LiveIds {
    pub(super) fn state(&self) -> MutexGuard<'_, LiveState> {
        self.0.state.lock().unwrap_or_else(PoisonError::into_inner)
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
        // Enqueued under the live lock, so whoever holds it (a cancel, the
        // audit) sees every live id either queued or accounted for.
        let mut state = self.state();
        if !state.live.insert(id) {
            return Err(Rejected::new(crate::QueueError::Duplicate, request));
        }
        queue.enqueue(request).map(drop).inspect_err(|_| {
            state.live.remove(&id);
        })
    }

    /// Marks `id` cancelled and takes it out of the waiting queue if it is
    /// there; `false` if no such request is live.
    ///
    /// Both happen under the live lock, so a request the scheduler retires
    /// meanwhile (which clears its mark under the same lock) is never
    /// cancelled after the fact.
    pub(super) fn cancel(&self, queue: &RequestQueue<InferenceRequest>, id: RequestId) -> bool {
        let removed = {
            let mut state = self.state();
            if !state.live.contains(&id) {
                return false;
            }
            if !state.cancelled.insert(id) {
                return true;
            }
            self.0.any_cancelled.store(true, Ordering::Release);
            queue.remove(id)
        };
        // The request (if it was waiting) is dropped outside both locks.
        drop(removed);
        true
    }

    /// Whether `id` was cancelled through a handle and not yet ended.
    pub(super) fn is_cancelled(&self, id: RequestId) -> bool {
        self.state().cancelled.contains(&id)
    }

    /// Whether any id may be cancelled and not yet ended (one atomic load;
    /// a cancel racing it is seen at the next look).
    pub(super) fn any_cancelled(&self) -> bool {
        self.0.any_cancelled.load(Ordering::Acquire)
    }

    /// The ids cancelled and not yet ended; each stays listed until the
    /// scheduler retires it.
    pub(super) fn cancelled(&self) -> Vec<RequestId> {
        if !self.0.any_cancelled.load(Ordering::Acquire) {
            return Vec::new();
        }
        self.state().cancelled.iter().copied().collect()
    }

    /// `id` left the scheduler (and any cancellation of it is void); it may
    /// be submitted again.
    pub(super) fn retire(&self, id: RequestId) {
        let mut state = self.state();
        state.live.remove(&id);
        if state.cancelled.remove(&id) && state.cancelled.is_empty() {
            self.0.any_cancelled.store(false, Ordering::Release);
        }
    }
}

/// A cheap, thread-safe handle for submitting and cancelling requests from
/// other threads (the scheduler itself stays on one thread).
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
    /// if a request with its id is waiting or running (or cancelled and not
    /// yet reported), [`QueueError::TooLarge`](crate::QueueError::TooLarge)
    /// if it could never fit the pool, or [`QueueError::Closed`](crate::QueueError::Closed).
    pub fn submit(&self, request: InferenceRequest) -> Result<(), Rejected<InferenceRequest>> {
        self.live.submit(&self.queue, request)
    }

    /// Ends a request wherever it is: waiting (new or preempted), being
    /// admitted, or running. Returns whether a request with this id was live
    /// (submitted and not yet reported finished).
    ///
    /// A waiting request leaves the queue at once. The scheduler ends the
    /// rest at its next [`step`](crate::Scheduler::step) or
    /// [`apply`](crate::Scheduler::apply), whichever comes first: a running
    /// request's blocks go back to the pool (its registered prefix stays
    /// cached) and a preempted request's progress is dropped. The next
    /// [`StepReport`](crate::StepReport) lists every cancelled request as
    /// finished with [`FinishReason::Cancelled`](crate::FinishReason::Cancelled)
    /// (unless it finished on its own first), and only then may its id be
    /// submitted again.
    pub fn cancel(&self, id: RequestId) -> bool {
        self.live.cancel(&self.queue, id)
    }
}
