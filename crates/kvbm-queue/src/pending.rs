//! [`Pending`]: the queued requests in service order, indexed by id.
//!
//! One intrusive doubly linked list per priority, threaded through a slab,
//! plus an id → slot index. Within one priority the service key
//! `(rank, priority, seq)` grows with `seq` (for either [`Aging`] policy),
//! so each list is sorted by arrival and the next request overall is the
//! smallest of four list heads. That makes enqueue, dequeue, remove and
//! cancel O(1) (plus one hash operation), and removal is real: the node is
//! unlinked and its slot freed at once, so nothing stale is ever skipped
//! later. Only [`Pending::insert`] of a request older than the tail of its
//! list (a restore) walks, past the requests still ahead of it (from the
//! previous restore when that is ahead, so restoring a batch in order is O(1)
//! per request).
//!
//! This is plain data: the queue guards it with its mutex.

use std::collections::HashMap;

use crate::request::Priority;
use crate::{Aging, MAX_BOOST_STEPS, Request};

/// "No slot": the end of a list or of the free list.
const NIL: usize = usize::MAX;
const LEVELS: usize = Priority::ALL.len();

/// A queued request and what the queue knows about it.
pub(crate) struct Entry<R: Request> {
    pub(crate) request: R,
    pub(crate) id: R::Id,
    pub(crate) priority: Priority,
    /// Arrival number, unique per queue, never reused.
    pub(crate) seq: u64,
    /// The first part of the service key `(rank, priority, seq)`; smaller first.
    pub(crate) rank: u64,
    /// KV blocks this request costs.
    pub(crate) blocks: u64,
    /// Selections that passed this request over (skip-ahead only).
    pub(crate) bypassed: u32,
    /// Priority steps preemption boosts took off `rank` so far.
    pub(crate) boost: u32,
}

impl<R: Request> Entry<R> {
    /// Service order: rank, then the more urgent priority on a tie (so an
    /// aging window's bound is exact), then arrival.
    fn key(&self) -> (u64, u64, u64) {
        (self.rank, self.priority.steps_below_max(), self.seq)
    }

    /// Raises its urgency by `steps` priority steps, as far as
    /// [`MAX_BOOST_STEPS`] allows in all.
    pub(crate) fn boost(&mut self, steps: u32, aging: Aging) {
        let boost = self.boost.saturating_add(steps).min(MAX_BOOST_STEPS);
        let added = u64::from(boost - self.boost);
        self.rank = self
            .rank
            .saturating_sub(added.saturating_mul(aging.step_rank()));
        self.boost = boost;
    }
}

struct Node<R: Request> {
    entry: Entry<R>,
    prev: usize,
    next: usize,
}

enum Slot<R: Request> {
    Occupied(Node<R>),
    Vacant { next_free: usize },
}

#[derive(Clone, Copy)]
struct Ends {
    head: usize,
    tail: usize,
}

const EMPTY: Ends = Ends {
    head: NIL,
    tail: NIL,
};

/// A position in a service-order walk: the next unvisited slot of each list.
pub(crate) struct Cursor {
    next: [usize; LEVELS],
}

pub(crate) struct Pending<R: Request> {
    slots: Vec<Slot<R>>,
    free: usize,
    /// The slot of the last request inserted out of order (a restore): a
    /// hint where the next one goes, checked before use.
    finger: usize,
    /// Whether ranks are plain priority steps ([`Aging::Strict`]).
    strict: bool,
    /// Queued requests with a preemption boost: while there are any, list
    /// order alone does not decide under `strict`.
    boosted: usize,
    levels: [Ends; LEVELS],
    index: HashMap<R::Id, usize, foldhash::fast::RandomState>,
}

impl<R: Request> Pending<R> {
    /// An empty queue; `strict` when every rank is its priority's steps below
    /// `Critical`, so that list order alone decides.
    #[cfg(test)]
    pub(crate) fn new(strict: bool) -> Self {
        Self::with_capacity(strict, 0)
    }

    /// An empty queue with room for `capacity` requests before it allocates.
    pub(crate) fn with_capacity(strict: bool, capacity: usize) -> Self {
        Self {
            slots: Vec::with_capacity(capacity),
            free: NIL,
            finger: NIL,
            strict,
            boosted: 0,
            levels: [EMPTY; LEVELS],
            index: HashMap::with_capacity_and_hasher(capacity, Default::default()),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub(crate) fn contains(&self, id: R::Id) -> bool {
        self.index.contains_key(&id)
    }

    /// Whether `id` is queued as the instance that arrived with `seq`.
    pub(crate) fn contains_instance(&self, id: R::Id, seq: u64) -> bool {
        self.index
            .get(&id)
            .is_some_and(|&slot| self.node(slot).entry.seq == seq)
    }

    fn node(&self, slot: usize) -> &Node<R> {
        match self.slots.get(slot) {
            Some(Slot::Occupied(node)) => node,
            _ => unreachable!("kvbm-queue bug: slot {slot} is not occupied"),
        }
    }

    fn node_mut(&mut self, slot: usize) -> &mut Node<R> {
        match self.slots.get_mut(slot) {
            Some(Slot::Occupied(node)) => node,
            _ => unreachable!("kvbm-queue bug: slot {slot} is not occupied"),
        }
    }

    /// Queues `entry` at its place in service order, or hands it back if its
    /// id is already queued.
    pub(crate) fn insert(&mut self, entry: Entry<R>) -> Result<(), Entry<R>> {
        use std::collections::hash_map::Entry as MapEntry;
        let level = entry.priority.index();
        let key = entry.key();
        let boosted = entry.boost > 0;
        // Find the slot this entry will take before touching the index, so a
        // duplicate leaves everything as it was.
        let slot = if self.free == NIL {
            self.slots.len()
        } else {
            self.free
        };
        match self.index.entry(entry.id) {
            MapEntry::Occupied(_) => return Err(entry),
            MapEntry::Vacant(vacant) => {
                vacant.insert(slot);
            }
        }
        // The node goes before the first node with a larger key; appends
        // (every fresh enqueue in arrival order) find that at once by looking
        // at the tail. Restores walk, from the last restored node if it lies
        // ahead of this one (a batch restored in order then costs O(1) per
        // request), else from the head.
        let ends = self.levels[level];
        let before = if ends.tail == NIL || self.node(ends.tail).entry.key() < key {
            NIL
        } else {
            let mut at = match self.slots.get(self.finger) {
                Some(Slot::Occupied(node))
                    if node.entry.priority.index() == level && node.entry.key() < key =>
                {
                    self.finger
                }
                _ => ends.head,
            };
            while at != NIL && self.node(at).entry.key() < key {
                at = self.node(at).next;
            }
            self.finger = slot;
            at
        };
        let prev = if before == NIL {
            ends.tail
        } else {
            self.node(before).prev
        };
        let node = Slot::Occupied(Node {
            entry,
            prev,
            next: before,
        });
        if slot == self.slots.len() {
            self.slots.push(node);
        } else {
            self.free = match std::mem::replace(&mut self.slots[slot], node) {
                Slot::Vacant { next_free } => next_free,
                Slot::Occupied(_) => unreachable!("kvbm-queue bug: free slot {slot} is occupied"),
            };
        }
        if prev == NIL {
            self.levels[level].head = slot;
        } else {
            self.node_mut(prev).next = slot;
        }
        if before == NIL {
            self.levels[level].tail = slot;
        } else {
            self.node_mut(before).prev = slot;
        }
        self.boosted += usize::from(boosted);
        Ok(())
    }

    /// The slot of the next request in service order.
    fn front_slot(&self) -> Option<usize> {
        self.min_of(self.levels.map(|ends| ends.head))
    }

    /// The slot with the smallest key among `candidates` (one per list).
    fn min_of(&self, candidates: [usize; LEVELS]) -> Option<usize> {
        if self.strict && self.boosted == 0 {
            // Strict priority: the most urgent non-empty list wins, without
            // touching (and missing the cache on) the candidate nodes.
            return candidates.into_iter().rev().find(|&slot| slot != NIL);
        }
        candidates
            .into_iter()
            .filter(|&slot| slot != NIL)
            .min_by_key(|&slot| self.node(slot).entry.key())
    }

    /// Takes the next request in service order.
    pub(crate) fn pop_front(&mut self) -> Option<Entry<R>> {
        let slot = self.front_slot()?;
        Some(self.unlink(slot))
    }

    /// Takes the request queued under `id`.
    pub(crate) fn remove(&mut self, id: R::Id) -> Option<Entry<R>> {
        let slot = *self.index.get(&id)?;
        Some(self.unlink(slot))
    }

    /// Takes the request queued under `id` only if it is the instance that
    /// arrived with `seq` (a stale handle must not hit a reused id).
    pub(crate) fn remove_instance(&mut self, id: R::Id, seq: u64) -> Option<Entry<R>> {
        let slot = *self.index.get(&id)?;
        if self.node(slot).entry.seq != seq {
            return None;
        }
        Some(self.unlink(slot))
    }

    fn unlink(&mut self, slot: usize) -> Entry<R> {
        let freed = Slot::Vacant {
            next_free: self.free,
        };
        let Slot::Occupied(node) = std::mem::replace(&mut self.slots[slot], freed) else {
            unreachable!("kvbm-queue bug: unlinking vacant slot {slot}")
        };
        self.free = slot;
        let level = node.entry.priority.index();
        if node.prev == NIL {
            self.levels[level].head = node.next;
        } else {
            self.node_mut(node.prev).next = node.next;
        }
        if node.next == NIL {
            self.levels[level].tail = node.prev;
        } else {
            self.node_mut(node.next).prev = node.prev;
        }
        let removed = self.index.remove(&node.entry.id);
        debug_assert_eq!(removed, Some(slot), "index and lists disagree");
        self.boosted -= usize::from(node.entry.boost > 0);
        node.entry
    }

    /// Takes every request, in service order. Keeps the allocations, like
    /// `Vec::clear`: a queue that was this deep will likely be again.
    pub(crate) fn drain(&mut self) -> Vec<Entry<R>> {
        let mut all = Vec::with_capacity(self.len());
        while let Some(entry) = self.pop_front() {
            all.push(entry);
        }
        self.slots.clear();
        self.free = NIL;
        self.finger = NIL;
        all
    }

    /// A walk over the queue in service order (see [`Self::next_in_order`]).
    pub(crate) fn cursor(&self) -> Cursor {
        Cursor {
            next: self.levels.map(|ends| ends.head),
        }
    }

    /// The next slot of the walk, advancing it. Unlinking the returned slot
    /// afterwards is allowed: the cursor already points past it.
    pub(crate) fn next_in_order(&self, cursor: &mut Cursor) -> Option<usize> {
        let slot = self.min_of(cursor.next)?;
        let node = self.node(slot);
        cursor.next[node.entry.priority.index()] = node.next;
        Some(slot)
    }

    pub(crate) fn entry(&self, slot: usize) -> &Entry<R> {
        &self.node(slot).entry
    }

    pub(crate) fn entry_mut(&mut self, slot: usize) -> &mut Entry<R> {
        &mut self.node_mut(slot).entry
    }

    /// Takes the request in `slot` (from a walk).
    pub(crate) fn take(&mut self, slot: usize) -> Entry<R> {
        self.unlink(slot)
    }

    /// `(id, seq)` of every queued request, in service order.
    pub(crate) fn snapshot(&self) -> Vec<(R::Id, u64)> {
        let mut cursor = self.cursor();
        let mut out = Vec::with_capacity(self.len());
        while let Some(slot) = self.next_in_order(&mut cursor) {
            let entry = self.entry(slot);
            out.push((entry.id, entry.seq));
        }
        out
    }

    /// Recounts the structure: every list linked both ways and sorted by key,
    /// every node indexed under its id, every other slot on the free list.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let mut linked = 0;
        for (level, ends) in self.levels.iter().enumerate() {
            let mut prev = NIL;
            let mut at = ends.head;
            while at != NIL {
                let node = self.node(at);
                if node.prev != prev {
                    return Err(format!("slot {at}: prev {} != {prev}", node.prev));
                }
                if node.entry.priority.index() != level {
                    return Err(format!("slot {at} on the wrong list"));
                }
                if prev != NIL && self.node(prev).entry.key() >= node.entry.key() {
                    return Err(format!("list {level} not sorted by key at slot {at}"));
                }
                if self.index.get(&node.entry.id) != Some(&at) {
                    return Err(format!("slot {at} not indexed under its id"));
                }
                linked += 1;
                prev = at;
                at = node.next;
            }
            if ends.tail != prev {
                return Err(format!("list {level}: tail {} != {prev}", ends.tail));
            }
        }
        if linked != self.index.len() {
            return Err(format!("{linked} linked but {} indexed", self.index.len()));
        }
        let mut free = 0;
        let mut at = self.free;
        while at != NIL {
            match self.slots.get(at) {
                Some(Slot::Vacant { next_free }) => at = *next_free,
                _ => return Err(format!("free list reaches non-vacant slot {at}")),
            }
            free += 1;
        }
        if linked + free != self.slots.len() {
            return Err(format!(
                "{linked} linked + {free} free != {} slots",
                self.slots.len()
            ));
        }
        Ok(())
    }
}

#[cfg(all(test, not(kvbm_loom)))]
mod tests;
