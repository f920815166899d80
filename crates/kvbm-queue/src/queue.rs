//! [`RequestQueue`]: the public handle and its operations.

use std::fmt;
use std::time::Duration;

use crate::batch::{self, Admitted, Batch};
use crate::pending::Entry;
use crate::shared::Shared;
use crate::sync::{self, Arc, Ordering};
use crate::{
    CancelHandle, QueueConfig, QueueError, QueueStats, Rejected, Request, Ticket, WaitToken,
};

/// Largest batch capacity reserved up front, so a huge `max_count` does not
/// allocate for requests that are not there.
const PREALLOC: usize = 1024;

/// A thread-safe priority queue of requests waiting for KV blocks.
///
/// A cheap handle: clones share one queue, and every method takes `&self`.
/// Requests are served by priority (`Critical` first), FIFO within one
/// priority, unless [`Aging::Window`](crate::Aging::Window) is configured.
///
/// Every operation takes the queue's one lock once, so each is atomic with
/// respect to the others: `len`, `contains` and `stats` are exact at the
/// moment they run.
///
/// # Performance
///
/// Enqueue, dequeue, `remove`, `cancel` and `contains` are O(1): one hash
/// operation on the id plus list links (one list per priority). `restore`
/// walks past the requests still ahead of the restored one (O(1) per request
/// when a batch is restored in order). `select_batch` costs O(requests
/// examined). A consumer that finds the queue empty spins for a few
/// microseconds before it sleeps, so under steady traffic neither side makes
/// a system call; everything still goes through one lock, so producers and
/// consumers do not run in parallel with each other.
///
/// Between threads that costs a few hundred nanoseconds per request on a
/// 2-core machine, several times a lock-free channel such as
/// `crossbeam-channel`. Most of that is inherent to what the queue promises,
/// not to the lock: refusing a duplicate id and answering `contains` and
/// `remove` means every request enters and leaves a shared id index, and a
/// channel plus a concurrent id set alone (no priorities, no exact `len`)
/// already costs about half of this queue's time per request. The
/// `queue/mpmc` benchmark in `benches/` measures all three side by side.
///
/// See the [crate documentation](crate) for an example.
pub struct RequestQueue<R: Request> {
    shared: Arc<Shared<R>>,
}

impl<R: Request> Clone for RequestQueue<R> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// How long a dequeue may wait.
#[derive(Clone, Copy)]
enum Patience {
    Forever,
    For(Duration),
}

impl<R: Request> RequestQueue<R> {
    /// An empty, open queue.
    ///
    /// # Errors
    ///
    /// Whatever [`QueueConfig::validate`] reports.
    pub fn new(config: QueueConfig) -> Result<Self, QueueError> {
        config.validate()?;
        let bytes_per_block = config
            .layout()
            .and_then(|layout| layout.bytes_per_block(config.block_tokens()));
        Ok(Self {
            shared: Arc::new(Shared::new(config, bytes_per_block, sync::next_queue_id())),
        })
    }

    /// The configuration this queue was built with.
    pub fn config(&self) -> &QueueConfig {
        &self.shared.config
    }

    /// Queues `request` behind everything of its priority, and returns the
    /// [`Ticket`] that names it (for [`cancel`](Self::cancel) and
    /// [`cancel_handle`](Self::cancel_handle)).
    ///
    /// The request's methods are called here, once, before the lock is taken.
    ///
    /// # Errors
    ///
    /// The request comes back inside the [`Rejected`], with
    /// [`QueueError::TooLarge`] if its KV cost exceeds the whole pool,
    /// [`QueueError::Closed`] after [`close`](Self::close), or
    /// [`QueueError::Duplicate`] if a request with its id is queued. Nothing
    /// is overwritten.
    pub fn enqueue(&self, request: R) -> Result<Ticket<R::Id>, Rejected<R>> {
        let id = request.id();
        let priority = request.priority();
        let config = &self.shared.config;
        let blocks = config.request_blocks(request.prompt_tokens(), request.max_new_tokens());
        if blocks > config.pool_blocks() {
            let error = QueueError::TooLarge {
                needed: blocks,
                pool: config.pool_blocks(),
            };
            tracing::debug!(id = ?id, %error, "enqueue refused");
            return Err(Rejected::new(error, request));
        }
        let mut inner = self.shared.lock();
        if inner.closed {
            drop(inner);
            tracing::debug!(id = ?id, "enqueue refused: closed");
            return Err(Rejected::new(QueueError::Closed, request));
        }
        let seq = inner.next_seq;
        let aging = config.aging();
        let arrival_nanos = match (aging.is_timed(), request.arrival()) {
            (false, _) => 0,
            (true, Some(at)) => u64::try_from(at.as_nanos()).unwrap_or(u64::MAX),
            (true, None) => inner.elapsed_nanos(),
        };
        let entry = Entry {
            request,
            id,
            priority,
            seq,
            rank: aging.rank(priority, seq, arrival_nanos),
            blocks,
            bypassed: 0,
            boost: 0,
        };
        if let Err(entry) = inner.pending.insert(entry) {
            drop(inner);
            tracing::debug!(id = ?id, "enqueue refused: duplicate id");
            return Err(Rejected::new(QueueError::Duplicate, entry.request));
        }
        inner.next_seq += 1;
        inner.stats.enqueued += 1;
        let len = self.shared.arrived(inner);
        tracing::debug!(id = ?id, ?priority, seq, blocks, len, "enqueued");
        Ok(Ticket { id, seq })
    }

    /// Removes the request `ticket` names at once and returns it, if it is
    /// still queued; `None` if it already left (dequeued, selected, removed,
    /// cleared or cancelled), even if its id has been queued again since.
    pub fn cancel(&self, ticket: Ticket<R::Id>) -> Option<R> {
        self.shared.cancel(ticket)
    }

    /// Whether the request `ticket` names is still queued.
    pub fn is_queued(&self, ticket: Ticket<R::Id>) -> bool {
        self.shared
            .lock()
            .pending
            .contains_instance(ticket.id, ticket.seq)
    }

    /// A handle that cancels the request `ticket` names from any thread,
    /// without needing the queue at hand.
    pub fn cancel_handle(&self, ticket: Ticket<R::Id>) -> CancelHandle<R> {
        CancelHandle {
            ticket,
            shared: Arc::clone(&self.shared),
        }
    }

    /// Takes the next request, blocking while the queue is empty and open.
    ///
    /// After [`close`](Self::close) the remaining requests are still handed
    /// out; once none are left every dequeue returns [`QueueError::Closed`].
    ///
    /// # Errors
    ///
    /// Only [`QueueError::Closed`]: the queue is closed and drained.
    pub fn dequeue(&self) -> Result<R, QueueError> {
        self.wait_pop(Patience::Forever, None)
    }

    /// Like [`dequeue`](Self::dequeue), but gives up after `timeout`.
    ///
    /// # Errors
    ///
    /// [`QueueError::Timeout`] if nothing arrived in time (a zero timeout
    /// checks once), [`QueueError::Closed`] if the queue is closed and drained.
    pub fn dequeue_timeout(&self, timeout: Duration) -> Result<R, QueueError> {
        self.wait_pop(Patience::For(timeout), None)
    }

    /// Like [`dequeue`](Self::dequeue), but returns when `token` is cancelled
    /// from another thread. A cancelled token wins over queued requests: the
    /// consumer asked to stop, so it is handed nothing.
    ///
    /// # Errors
    ///
    /// [`QueueError::Cancelled`] once `token` is cancelled,
    /// [`QueueError::Closed`] if the queue is closed and drained, and
    /// [`QueueError::ForeignQueue`] if `token` was made by another queue
    /// (its cancellation would never wake this one).
    pub fn dequeue_cancellable(&self, token: &WaitToken<R>) -> Result<R, QueueError> {
        if !Arc::ptr_eq(&token.shared, &self.shared) {
            return Err(QueueError::ForeignQueue);
        }
        self.wait_pop(Patience::Forever, Some(token))
    }

    /// Takes the next request if there is one, without blocking.
    ///
    /// # Errors
    ///
    /// [`QueueError::Empty`] if nothing is queued, or [`QueueError::Closed`]
    /// if the queue is also closed.
    pub fn try_dequeue(&self) -> Result<R, QueueError> {
        let mut inner = self.shared.lock();
        let taken = inner.pending.pop_front();
        let outcome = match taken {
            Some(entry) => {
                inner.stats.dequeued += 1;
                Ok(entry)
            }
            None if inner.closed => Err(QueueError::Closed),
            None => Err(QueueError::Empty),
        };
        let len = inner.pending.len();
        drop(inner);
        Self::finish_dequeue(outcome, len)
    }

    /// A new token that cancels waits in
    /// [`dequeue_cancellable`](Self::dequeue_cancellable).
    pub fn wait_token(&self) -> WaitToken<R> {
        WaitToken::new(Arc::clone(&self.shared))
    }

    fn wait_pop(&self, patience: Patience, token: Option<&WaitToken<R>>) -> Result<R, QueueError> {
        let shared = &*self.shared;
        let mut inner = shared.lock();
        let deadline = match patience {
            Patience::Forever => None,
            // A timeout past what the clock can represent is "forever".
            Patience::For(timeout) => sync::deadline_after(&inner.clock, timeout),
        };
        let mut waited = false;
        // A zero timeout means "check once": no spinning.
        let mut spin = !matches!(patience, Patience::For(timeout) if timeout.is_zero());
        let mut backoff = sync::Backoff::new();
        // Order matters: a request is taken before `Closed` (drain after
        // close) and before the deadline is checked, so a waiter woken for a
        // request never reports a timeout while that request sits there.
        let outcome = loop {
            if token.is_some_and(|token| token.cancelled.load(Ordering::SeqCst)) {
                break Err(QueueError::Cancelled);
            }
            if let Some(entry) = inner.pending.pop_front() {
                inner.stats.dequeued += 1;
                break Ok(entry);
            }
            if inner.closed {
                break Err(QueueError::Closed);
            }
            let remaining = match deadline {
                None => None,
                Some(deadline) => {
                    let now = inner.clock.now();
                    if now >= deadline {
                        break Err(QueueError::Timeout);
                    }
                    Some(deadline.saturating_duration_since(now))
                }
            };
            if spin {
                // Watch for an arrival without the lock for a moment before
                // sleeping; then check everything again under the lock.
                let seen = shared.epoch.get();
                drop(inner);
                spin = false;
                while backoff.snooze() {
                    let cancelled =
                        token.is_some_and(|token| token.cancelled.load(Ordering::Relaxed));
                    if shared.epoch.get() != seen || cancelled {
                        spin = true;
                        break;
                    }
                }
                inner = shared.lock();
                continue;
            }
            inner.waiters += 1;
            inner = sync::wait(&shared.not_empty, inner, remaining);
            inner.waiters -= 1;
            waited = true;
        };
        // Leaving empty-handed while requests remain (only a cancelled token
        // does that) may have absorbed a wake-up meant for them: pass it on.
        // `WaitToken::cancel` wakes every waiter anyway, so this is a second
        // line of defence that keeps the no-lost-wake-up rule local to here.
        let pass_on = waited && outcome.is_err() && !inner.pending.is_empty() && inner.waiters > 0;
        let len = inner.pending.len();
        drop(inner);
        if pass_on {
            shared.not_empty.notify_one();
        }
        Self::finish_dequeue(outcome, len)
    }

    fn finish_dequeue(outcome: Result<Entry<R>, QueueError>, len: usize) -> Result<R, QueueError> {
        match outcome {
            Ok(entry) => {
                tracing::debug!(id = ?entry.id, seq = entry.seq, len, "dequeued");
                Ok(entry.request)
            }
            Err(error) => {
                tracing::trace!(%error, len, "dequeue returned empty-handed");
                Err(error)
            }
        }
    }

    /// Takes the request queued under `id` out of the queue at once and
    /// returns it; `None` if no such request is queued.
    pub fn remove(&self, id: R::Id) -> Option<R> {
        let mut inner = self.shared.lock();
        let taken = inner.pending.remove(id);
        if taken.is_some() {
            inner.stats.removed += 1;
        }
        let len = inner.pending.len();
        drop(inner);
        tracing::debug!(id = ?id, found = taken.is_some(), len, "removed");
        taken.map(|entry| entry.request)
    }

    /// Whether a request with `id` is queued.
    pub fn contains(&self, id: R::Id) -> bool {
        self.shared.lock().pending.contains(id)
    }

    /// Requests queued right now.
    pub fn len(&self) -> usize {
        self.shared.lock().pending.len()
    }

    /// Whether no request is queued.
    pub fn is_empty(&self) -> bool {
        self.shared.lock().pending.is_empty()
    }

    /// A mark of the arrivals so far, for [`arrived_since`](Self::arrived_since).
    pub(crate) fn arrival_mark(&self) -> u64 {
        self.shared.epoch.get()
    }

    /// Whether a request may have arrived (or the queue closed) since
    /// `mark` was taken: one atomic load, no lock, so a caller polling
    /// between cheap steps need not lock the queue each time. `false` means
    /// nothing arrived; `true` means look (under loom, which compiles the
    /// epoch out, always `true`).
    pub(crate) fn arrived_since(&self, mark: u64) -> bool {
        cfg!(kvbm_loom) || self.shared.epoch.get() != mark
    }

    /// The queued ids, in service order.
    pub fn queued_ids(&self) -> Vec<R::Id> {
        let inner = self.shared.lock();
        let snapshot = inner.pending.snapshot();
        drop(inner);
        snapshot.into_iter().map(|(id, _)| id).collect()
    }

    /// Counters of everything this queue has done, with its length.
    pub fn stats(&self) -> QueueStats {
        self.shared.lock().stats()
    }

    /// Takes every queued request, in service order. Does not close the queue.
    pub fn clear(&self) -> Vec<R> {
        let mut inner = self.shared.lock();
        let entries = inner.pending.drain();
        inner.stats.cleared += entries.len() as u64;
        drop(inner);
        tracing::debug!(count = entries.len(), "cleared");
        entries.into_iter().map(|entry| entry.request).collect()
    }

    /// Closes the queue: later enqueues are refused, and every consumer
    /// blocked now wakes. Queued requests stay and can still be dequeued,
    /// selected, removed or cleared; once they are gone, dequeues return
    /// [`QueueError::Closed`]. Returns `true` if this call closed the queue
    /// (`false` if it already was).
    pub fn close(&self) -> bool {
        let mut inner = self.shared.lock();
        let first = !inner.closed;
        inner.closed = true;
        self.shared.epoch.bump();
        let len = inner.pending.len();
        self.shared.wake_all(inner);
        tracing::debug!(first, len, "closed");
        first
    }

    /// Whether [`close`](Self::close) has been called.
    pub fn is_closed(&self) -> bool {
        self.shared.lock().closed
    }

    /// Takes up to `max_count` requests, in service order, whose KV block
    /// costs together fit `budget_blocks` (typically the pool's free blocks).
    ///
    /// When the next request does not fit, the configured
    /// [`Selection`](crate::Selection) decides: `HeadOfLine` (the default)
    /// stops there; `SkipAhead` passes over it, up to its bypass bound.
    /// Never blocks; `max_count == 0` takes nothing and changes nothing, and a
    /// zero budget takes only requests that cost zero blocks.
    pub fn select_batch(&self, max_count: usize, budget_blocks: u64) -> Batch<R> {
        let empty = || Batch {
            admitted: Vec::new(),
            blocks: 0,
            bypassed: 0,
        };
        if max_count == 0 {
            return empty();
        }
        let shared = &*self.shared;
        let mut inner = shared.lock();
        // A scheduler asks every step, mostly of an empty queue: allocate
        // nothing then.
        if inner.pending.is_empty() {
            return empty();
        }
        let mut admitted = Vec::with_capacity(max_count.min(PREALLOC).min(inner.pending.len()));
        let (blocks, bypassed) = batch::select(
            &mut inner.pending,
            max_count,
            budget_blocks,
            shared.config.selection(),
            shared.queue_id,
            &mut admitted,
        );
        inner.stats.selected += admitted.len() as u64;
        let len = inner.pending.len();
        drop(inner);
        tracing::debug!(
            count = admitted.len(),
            blocks,
            budget_blocks,
            bypassed,
            len,
            "selected"
        );
        Batch {
            admitted,
            blocks,
            bypassed,
        }
    }

    /// [`select_batch`](Self::select_batch) with a budget in bytes of KV
    /// memory, converted to whole blocks through the configured
    /// [`KvLayout`](crate::KvLayout).
    ///
    /// # Errors
    ///
    /// [`QueueError::NoKvLayout`] if the configuration has no layout.
    pub fn select_batch_bytes(
        &self,
        max_count: usize,
        budget_bytes: u64,
    ) -> Result<Batch<R>, QueueError> {
        let per_block = self.shared.bytes_per_block.ok_or(QueueError::NoKvLayout)?;
        Ok(self.select_batch(max_count, budget_bytes / per_block))
    }

    /// Puts a selected request back at its original place (for when its real
    /// block allocation failed), ahead of everything that arrived after it.
    /// Its [`Ticket`] works again.
    ///
    /// # Errors
    ///
    /// The admitted request comes back inside the [`Rejected`], with
    /// [`QueueError::ForeignQueue`] if another queue selected it,
    /// [`QueueError::Closed`] after [`close`](Self::close), or
    /// [`QueueError::Duplicate`] if its id was queued again meanwhile.
    pub fn restore(&self, admitted: Admitted<R>) -> Result<(), Rejected<Admitted<R>>> {
        self.restore_boosted(admitted, 0)
    }

    /// [`restore`](Self::restore), raising the request's urgency by
    /// `priority_steps` priority steps (what a preemption boost does): its
    /// rank drops by what that many priority steps are worth under the
    /// queue's [`Aging`](crate::Aging). A request's boosts add up to at most
    /// [`MAX_BOOST_STEPS`](crate::MAX_BOOST_STEPS); it keeps them if it is
    /// restored again.
    ///
    /// # Errors
    ///
    /// As [`restore`](Self::restore); a refused request is not boosted.
    pub fn restore_boosted(
        &self,
        mut admitted: Admitted<R>,
        priority_steps: u32,
    ) -> Result<(), Rejected<Admitted<R>>> {
        if admitted.queue_id != self.shared.queue_id {
            return Err(Rejected::new(QueueError::ForeignQueue, admitted));
        }
        let queue_id = admitted.queue_id;
        let mut inner = self.shared.lock();
        if inner.closed {
            drop(inner);
            return Err(Rejected::new(QueueError::Closed, admitted));
        }
        let (id, seq) = (admitted.entry.id, admitted.entry.seq);
        let unboosted = (admitted.entry.rank, admitted.entry.boost);
        admitted
            .entry
            .boost(priority_steps, self.shared.config.aging());
        if let Err(mut entry) = inner.pending.insert(admitted.entry) {
            drop(inner);
            (entry.rank, entry.boost) = unboosted;
            return Err(Rejected::new(
                QueueError::Duplicate,
                Admitted { entry, queue_id },
            ));
        }
        inner.stats.restored += 1;
        let len = self.shared.arrived(inner);
        tracing::debug!(id = ?id, seq, len, "restored");
        Ok(())
    }

    /// Moves the model clock forward by `by` and wakes every waiter, so timed
    /// dequeues can time out under loom (which has no real time).
    #[cfg(kvbm_loom)]
    #[doc(hidden)]
    pub fn loom_advance_clock(&self, by: Duration) {
        let mut inner = self.shared.lock();
        inner.clock.advance(by);
        self.shared.wake_all(inner);
    }

    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Shared<R> {
        &self.shared
    }
}

impl<R: Request> fmt::Debug for RequestQueue<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("RequestQueue");
        // `try_lock`: formatting must not deadlock a thread that holds the lock.
        match self.shared.inner.try_lock() {
            Ok(inner) => out
                .field("len", &inner.pending.len())
                .field("closed", &inner.closed)
                .field("waiters", &inner.waiters),
            Err(_) => out.field("state", &"<locked>"),
        };
        out.field("config", &self.shared.config).finish()
    }
}

#[cfg(all(test, not(kvbm_loom)))]
mod tests;
