//! [`shortlist`]: the workers [`Offer::LeastWorkAtEachDepth`] offers a
//! policy, found in one pass over the live workers' loads.
//!
//! [`Offer::LeastWorkAtEachDepth`]: crate::Offer::LeastWorkAtEachDepth

use super::{Roster, WorkerId, WorkerLoad, by_worker};
use crate::{Candidate, RouteRequest};

/// Least work below which the offer shortlists.
const MAX_WORK: u128 = 1 << 32;
/// Prompt tokens below which it shortlists.
const MAX_PROMPT: usize = 1 << 32;
/// Block size below which it shortlists.
const MAX_BLOCK_SIZE: usize = 1 << 16;

/// The group of a holder offered whatever its work.
const ALWAYS: usize = usize::MAX;

/// [`Offer::LeastWorkAtEachDepth`](crate::Offer::LeastWorkAtEachDepth)
/// among `order`: for each number of the request's leading blocks a
/// worker holds (its entry in `overlaps`, ascending by `worker_of`, whose
/// blocks and credit `credit_of` reads; no entry is none), the workers
/// holding that many
/// with the least work, in worker order. Unless `grouped`, some credit is
/// a lower tier's, which the offer does not group by, and every holder is
/// offered. `None` outside the offer's bounds (every worker is offered
/// instead).
pub(super) fn shortlist<T>(
    order: &Roster,
    overlaps: &[T],
    worker_of: impl Fn(&T) -> WorkerId,
    credit_of: impl Fn(&T) -> (usize, f64),
    grouped: bool,
    request: &RouteRequest<'_>,
) -> Option<Vec<Candidate>> {
    if request.prompt_tokens >= MAX_PROMPT || request.block_size >= MAX_BLOCK_SIZE {
        return None;
    }
    let block_size = request.block_size.max(1) as u128;
    let work_of = |load: &WorkerLoad| {
        // Below 2^128: each term is below 2^64 times below 2^16.
        u128::from(load.queued_prefill_tokens) + u128::from(load.active_blocks) * block_size
    };
    // The least work at each depth, 0 (holding nothing) to the whole
    // request, so far.
    let mut least = vec![u128::MAX; request.keys.len().saturating_add(1)];
    // Every worker that was at its depth's least work when scanned, in
    // worker order, with its depth (or `ALWAYS`): those the least moved
    // below since are dropped at the end, so no list is ever merged.
    // Sized for everyone (the whole fleet may tie), so never regrown.
    let workers = order.ids().len();
    let (mut list, mut groups) = (Vec::with_capacity(workers), Vec::with_capacity(workers));
    let mut holding = by_worker(overlaps, worker_of);
    for (worker, cell) in order.cells() {
        // Read here, not through an iterator of loads: the fields then
        // stay in registers instead of a copy through the stack.
        let load = cell.get();
        let entry = holding(worker);
        let (overlap_blocks, tier_credit) = entry.map_or((0, 0.0), &credit_of);
        // Idle workers at depth 0, holders by depth when `grouped`.
        let group = match least.get_mut(overlap_blocks) {
            Some(at_least) if grouped || entry.is_none() => {
                let work = work_of(&load);
                if work > *at_least {
                    continue;
                }
                *at_least = work;
                overlap_blocks
            }
            _ => ALWAYS,
        };
        list.push(Candidate {
            worker,
            overlap_blocks,
            tier_credit,
            load,
        });
        groups.push(group);
    }
    if (least.iter()).any(|&work| work != u128::MAX && work >= MAX_WORK) {
        return None;
    }
    let mut groups = groups.into_iter();
    list.retain(|candidate| match groups.next() {
        Some(ALWAYS) | None => true,
        Some(group) => least.get(group) == Some(&work_of(&candidate.load)),
    });
    Some(list)
}
