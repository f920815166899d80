//! [`Batch`] and [`Admitted`]: what `select_batch` takes out of the queue, and
//! the scan that takes it.

use std::fmt;

use crate::pending::{Entry, Pending};
use crate::{Priority, Request, Selection, Ticket};

/// A request taken by [`select_batch`](crate::RequestQueue::select_batch),
/// with the KV blocks it was charged and its place in the queue.
///
/// If the real block allocation fails, hand it to
/// [`restore`](crate::RequestQueue::restore): it goes back exactly where it
/// was, ahead of everything that arrived after it.
pub struct Admitted<R: Request> {
    pub(crate) entry: Entry<R>,
    pub(crate) queue_id: u64,
}

impl<R: Request> Admitted<R> {
    /// The request.
    pub fn request(&self) -> &R {
        &self.entry.request
    }

    /// Takes the request, giving up its place in the queue.
    pub fn into_request(self) -> R {
        self.entry.request
    }

    /// The request's id.
    pub fn id(&self) -> R::Id {
        self.entry.id
    }

    /// The request's priority.
    pub fn priority(&self) -> Priority {
        self.entry.priority
    }

    /// KV blocks charged against the budget.
    pub fn blocks(&self) -> u64 {
        self.entry.blocks
    }

    /// The arrival number that fixes its place among equal priorities.
    pub fn seq(&self) -> u64 {
        self.entry.seq
    }

    /// The request's ticket (the one `enqueue` returned).
    pub fn ticket(&self) -> Ticket<R::Id> {
        Ticket {
            id: self.entry.id,
            seq: self.entry.seq,
        }
    }
}

impl<R: Request> fmt::Debug for Admitted<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admitted")
            .field("id", &self.entry.id)
            .field("priority", &self.entry.priority)
            .field("seq", &self.entry.seq)
            .field("blocks", &self.entry.blocks)
            .finish_non_exhaustive()
    }
}

/// The requests one [`select_batch`](crate::RequestQueue::select_batch) took,
/// in service order.
pub struct Batch<R: Request> {
    pub(crate) admitted: Vec<Admitted<R>>,
    pub(crate) blocks: u64,
    pub(crate) bypassed: usize,
}

impl<R: Request> Batch<R> {
    /// Requests taken.
    pub fn len(&self) -> usize {
        self.admitted.len()
    }

    /// Whether nothing was taken.
    pub fn is_empty(&self) -> bool {
        self.admitted.is_empty()
    }

    /// KV blocks charged in total (at most the budget).
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Queued requests that did not fit and were passed over while something
    /// behind them was taken (always 0 under [`Selection::HeadOfLine`]).
    pub fn bypassed(&self) -> usize {
        self.bypassed
    }

    /// The taken requests, in service order.
    pub fn iter(&self) -> std::slice::Iter<'_, Admitted<R>> {
        self.admitted.iter()
    }

    /// Splits off the requests from `at` on (e.g. those whose allocation
    /// failed, to [`restore`](crate::RequestQueue::restore) them); nothing if
    /// `at >= self.len()`.
    pub fn split_off(&mut self, at: usize) -> Vec<Admitted<R>> {
        let rest = self.admitted.split_off(at.min(self.admitted.len()));
        self.blocks -= rest.iter().map(Admitted::blocks).sum::<u64>();
        rest
    }

    /// The bare requests, giving up their places in the queue.
    pub fn into_requests(self) -> Vec<R> {
        self.admitted
            .into_iter()
            .map(Admitted::into_request)
            .collect()
    }
}

impl<R: Request> IntoIterator for Batch<R> {
    type Item = Admitted<R>;
    type IntoIter = std::vec::IntoIter<Admitted<R>>;

    fn into_iter(self) -> Self::IntoIter {
        self.admitted.into_iter()
    }
}

impl<'a, R: Request> IntoIterator for &'a Batch<R> {
    type Item = &'a Admitted<R>;
    type IntoIter = std::slice::Iter<'a, Admitted<R>>;

    fn into_iter(self) -> Self::IntoIter {
        self.admitted.iter()
    }
}

impl<R: Request> fmt::Debug for Batch<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("len", &self.admitted.len())
            .field("blocks", &self.blocks)
            .field("bypassed", &self.bypassed)
            .field("admitted", &self.admitted)
            .finish()
    }
}

/// Scans `pending` in service order and moves into `out` up to `max_count`
/// requests whose costs fit `budget`. Returns `(blocks charged, bypassed)`.
///
/// A request that does not fit ends the scan under head-of-line, and under
/// skip-ahead once it has been passed over `max_bypass` times (a
/// reservation); otherwise it is skipped. Its pass-over count grows by one
/// per selection, and only if something behind it was taken.
pub(crate) fn select<R: Request>(
    pending: &mut Pending<R>,
    max_count: usize,
    budget: u64,
    selection: Selection,
    queue_id: u64,
    out: &mut Vec<Admitted<R>>,
) -> (u64, usize) {
    let (max_scan, max_bypass) = match selection {
        Selection::HeadOfLine => (usize::MAX, 0),
        Selection::SkipAhead {
            max_scan,
            max_bypass,
        } => (max_scan, max_bypass),
    };
    let mut remaining = budget;
    let mut cursor = pending.cursor();
    let mut examined = 0;
    let mut skipped = Vec::new();
    let mut passed_over = 0;
    while out.len() < max_count && examined < max_scan {
        let Some(slot) = pending.next_in_order(&mut cursor) else {
            break;
        };
        examined += 1;
        let entry = pending.entry(slot);
        if entry.blocks <= remaining {
            remaining -= entry.blocks;
            out.push(Admitted {
                entry: pending.take(slot),
                queue_id,
            });
            passed_over = skipped.len();
        } else if entry.bypassed >= max_bypass {
            break;
        } else {
            skipped.push(slot);
        }
    }
    for &slot in skipped.get(..passed_over).unwrap_or_default() {
        let entry = pending.entry_mut(slot);
        entry.bypassed = entry.bypassed.saturating_add(1);
    }
    (budget - remaining, passed_over)
}
