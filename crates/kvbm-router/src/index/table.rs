//! [`Table`]: the index's workers, sorted by id, each with its dense
//! [`WorkerSlot`] and its block counters; and the slots' own bookkeeping:
//! which are live, which are free, and which a sweep must clean first.
//!
//! A slot's bits stay in the holder sets of the keys it held after its
//! worker is cleared or removed: the index keeps no list of a worker's
//! keys, so forgetting a worker is O(1). The slot is *retired* (no longer
//! live, so every lookup masks its bits out) and *dirty*; a sweep of every
//! shard later drops the bits of all dirty slots at once, after which they
//! are free for new workers. A sweep is due once the garbage (the bits the
//! dirty slots left) reaches what the last sweep kept, so its cost is
//! amortized over the blocks it collects; or once dirty slots outnumber the
//! live workers, so bitsets stay as wide as the fleet.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::holders::{Bits, WorkerSlot};
use super::walk::Survivors;
use crate::WorkerId;
use crate::medium::{MAX_MEDIA, Slot};
use crate::sync::{AtomicUsize, Ordering};

/// Garbage bits below which no sweep is due (every retirement's, in the
/// loom models, so they explore sweeps too).
#[cfg(not(kvbm_loom))]
const SWEEP_FLOOR: usize = 64;
#[cfg(kvbm_loom)]
const SWEEP_FLOOR: usize = 1;

/// Dirty slots below which no sweep is due for their number alone.
#[cfg(not(kvbm_loom))]
const DIRTY_FLOOR: usize = 8;
#[cfg(kvbm_loom)]
const DIRTY_FLOOR: usize = 1;

/// A worker's blocks per medium slot. Counted by its events (the number
/// of holder bits each newly set or cleared), read by `held`; a cache
/// line of its own, so workers applied from different threads do not
/// share one.
#[repr(align(64))]
#[derive(Debug)]
pub(super) struct Counts([AtomicUsize; MAX_MEDIA]);

impl Default for Counts {
    fn default() -> Self {
        Self(std::array::from_fn(|_| AtomicUsize::new(0)))
    }
}

impl Counts {
    /// `n` more blocks on `medium`.
    pub(super) fn add(&self, medium: Slot, n: usize) {
        if let (Some(count), true) = (self.0.get(medium), n > 0) {
            count.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// `n` fewer blocks on `medium` (never more than it counted: each
    /// was one of its bits).
    pub(super) fn sub(&self, medium: Slot, n: usize) {
        if let (Some(count), true) = (self.0.get(medium), n > 0) {
            count.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Blocks on `medium`.
    pub(super) fn on(&self, medium: Slot) -> usize {
        self.0.get(medium).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Blocks on every medium.
    pub(super) fn total(&self) -> usize {
        (self.0.iter()).fold(0, |sum, c| sum.saturating_add(c.load(Ordering::Relaxed)))
    }
}

/// The workers and their slots. Read-locked by every event and lookup (a
/// lookup holds it throughout, so the slots it finds keep their owners);
/// written, for O(1) work, by a worker's addition, removal or clear, and by
/// a sweep's start and end.
#[derive(Debug, Default)]
pub(super) struct Table {
    /// Worker ids, sorted.
    ids: Vec<WorkerId>,
    /// `ids[i]`'s slot.
    slots: Vec<WorkerSlot>,
    /// `ids[i]`'s counters.
    counts: Vec<Counts>,
    /// Each slot's worker (meaningful for live slots).
    owners: Vec<WorkerId>,
    /// Slots of workers in the table.
    live: Bits,
    /// Clean slots, for reuse lowest first (bitsets stay narrow).
    free: BinaryHeap<Reverse<WorkerSlot>>,
    /// Retired slots whose bits may remain in holder sets.
    dirty: Vec<WorkerSlot>,
    /// Bits the dirty slots had when retired.
    garbage: usize,
    /// Bits the last sweep kept: the garbage that makes the next one due.
    sweep_at: usize,
}

/// A sweep under way: its dirty slots, as a list and as bits.
#[derive(Debug)]
pub(super) struct Sweep {
    slots: Vec<WorkerSlot>,
    dead: Bits,
}

impl Sweep {
    /// The slots whose bits the sweep drops.
    pub(super) fn dead(&self) -> &Bits {
        &self.dead
    }
}

impl Table {
    /// Where `worker` is, or would go.
    pub(super) fn position(&self, worker: WorkerId) -> Result<usize, usize> {
        self.ids.binary_search(&worker)
    }

    /// Where `worker` is, if it is.
    pub(super) fn find(&self, worker: WorkerId) -> Option<usize> {
        self.position(worker).ok()
    }

    /// The slot of the worker at `at`.
    pub(super) fn slot(&self, at: usize) -> WorkerSlot {
        self.slots[at]
    }

    /// The counters of the worker at `at`.
    pub(super) fn counts(&self, at: usize) -> &Counts {
        &self.counts[at]
    }

    /// Every worker's counters, in worker order.
    pub(super) fn all_counts(&self) -> &[Counts] {
        &self.counts
    }

    /// The live slots.
    pub(super) fn live(&self) -> &Bits {
        &self.live
    }

    /// The worker ids, sorted.
    pub(super) fn ids(&self) -> &[WorkerId] {
        &self.ids
    }

    /// Adds `worker`, absent, at `at` (its place), on a clean slot.
    pub(super) fn add(&mut self, at: usize, worker: WorkerId) {
        let slot = self.allocate(worker);
        self.ids.insert(at, worker);
        self.slots.insert(at, slot);
        self.counts.insert(at, Counts::default());
    }

    /// Forgets the blocks of the worker at `at`: its slot retires and it
    /// gets a clean one. How many it held.
    pub(super) fn clear(&mut self, at: usize) -> usize {
        let held = self.retire(at);
        let slot = self.allocate(self.ids[at]);
        self.slots[at] = slot;
        self.counts[at] = Counts::default();
        held
    }

    /// Removes the worker at `at`, retiring its slot; how many blocks it
    /// held.
    pub(super) fn remove(&mut self, at: usize) -> usize {
        let held = self.retire(at);
        self.ids.remove(at);
        self.slots.remove(at);
        self.counts.remove(at);
        held
    }

    /// A clean slot for `worker`, made live.
    fn allocate(&mut self, worker: WorkerId) -> WorkerSlot {
        let slot = match self.free.pop() {
            Some(Reverse(slot)) => {
                self.owners[slot as usize] = worker;
                slot
            }
            None => {
                // Slots are fewer than workers plus dirty slots (at most
                // about twice the workers): 2^32 of them would need far
                // more memory than the table rows behind them can get.
                let slot = WorkerSlot::try_from(self.owners.len()).unwrap_or(WorkerSlot::MAX);
                self.owners.push(worker);
                slot
            }
        };
        self.live.insert(slot);
        slot
    }

    /// Takes the slot of the worker at `at` out of service: free at once
    /// if it holds nothing, else dirty until a sweep. How many blocks it
    /// held.
    fn retire(&mut self, at: usize) -> usize {
        let slot = self.slots[at];
        let held = self.counts[at].total();
        self.live.remove(slot);
        if held == 0 {
            self.free.push(Reverse(slot));
        } else {
            self.dirty.push(slot);
            self.garbage = self.garbage.saturating_add(held);
        }
        held
    }

    /// Whether a sweep should run: the garbage reached what the last sweep
    /// kept (and a floor), or dirty slots outnumber the workers.
    pub(super) fn sweep_due(&self) -> bool {
        !self.dirty.is_empty()
            && (self.garbage >= self.sweep_at.max(SWEEP_FLOOR)
                || self.dirty.len() >= self.ids.len().max(DIRTY_FLOOR))
    }

    /// Starts a sweep of the slots dirty now (those retired meanwhile wait
    /// for the next).
    pub(super) fn begin_sweep(&mut self) -> Sweep {
        let slots = std::mem::take(&mut self.dirty);
        self.garbage = 0;
        let mut dead = Bits::default();
        slots.iter().for_each(|&slot| {
            dead.insert(slot);
        });
        Sweep { slots, dead }
    }

    /// Ends `sweep`, which visited every shard and left `kept` bits: its
    /// slots are clean.
    pub(super) fn end_sweep(&mut self, sweep: Sweep, kept: usize) {
        self.free.extend(sweep.slots.into_iter().map(Reverse));
        self.sweep_at = kept;
    }

    /// `found` (live slots with what a lookup found for each) and the
    /// `rest` (survivors of a walk, each found with the same value), by
    /// worker, in worker order: sorted when few, else read off the workers
    /// in order (O(workers), but only when that is about what sorting them
    /// would cost).
    pub(super) fn ordered<T: Copy>(
        &self,
        mut found: Vec<(WorkerSlot, T)>,
        rest: Option<(&Survivors, T)>,
    ) -> Vec<(WorkerId, T)> {
        let k = found.len() + rest.map_or(0, |(rest, _)| rest.len());
        let n = self.ids.len();
        let log = (usize::BITS - k.leading_zeros()) as usize;
        if k.saturating_mul(log) <= n {
            if let Some((rest, value)) = rest {
                rest.finish(value, &mut found);
            }
            let mut out: Vec<(WorkerId, T)> = Vec::with_capacity(found.len());
            for (slot, t) in found {
                if let Some(&id) = self.owners.get(slot as usize) {
                    out.push((id, t));
                }
            }
            out.sort_unstable_by_key(|&(id, _)| id);
            return out;
        }
        let mut by_slot: Vec<Option<T>> = Vec::new();
        if !found.is_empty() {
            by_slot.resize(self.owners.len(), None);
            for (slot, t) in found {
                if let Some(at) = by_slot.get_mut(slot as usize) {
                    *at = Some(t);
                }
            }
        }
        let mut out = Vec::with_capacity(k);
        for (&id, &slot) in self.ids.iter().zip(&self.slots) {
            let value = match rest {
                Some((rest, value)) if rest.contains(slot) => Some(value),
                _ => by_slot.get(slot as usize).copied().flatten(),
            };
            if let Some(value) = value {
                out.push((id, value));
            }
        }
        out
    }
}
