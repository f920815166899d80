//! LRU as a ring of block ids in release order, with lazy removal.
//!
//! A cached block is pushed at the back when its last handle drops; a
//! block matched again is only marked gone (its ring entry stays, stale);
//! eviction pops from the front, skipping stale entries. The order of the
//! live entries is the order of their last release: exactly the LRU order
//! an intrusive list keeps, without the list's pointer chasing. In a pool
//! larger than the processor's caches that is what matters: popping from
//! a list reads the victim's links and writes its neighbour's (two misses,
//! the second waiting on the first), and unlinking a revived block writes
//! both neighbours'; here eviction reads the ring in order (which the
//! processor prefetches) and one word of the victim's, and a revival
//! writes one word.
//!
//! A block's word holds the ring position of its live entry. Positions
//! count pushes, wrapping at 2^32; the ring is kept shorter than that (it
//! is compacted once stale entries outnumber live ones, and always before
//! it spans 2^32 positions), so an entry is live exactly when its block's
//! word equals its position. The one position equal to the "not cached"
//! word is never given to a live entry.

use std::collections::VecDeque;

use crate::BlockId;

/// A block's word when it is not cached.
const GONE: u32 = u32::MAX;

/// Stale entries tolerated beyond the live ones before compacting (few in
/// unit tests, so that short call sequences compact too).
const SLACK: usize = if cfg!(test) { 3 } else { 1024 };

/// The ring's longest: its positions stay distinct modulo 2^32 (with room
/// for the skipped `GONE` position).
const MAX_RING: usize = (u32::MAX - 1) as usize;

#[derive(Debug)]
pub(crate) struct LruRing {
    /// Block ids in release order; the front is the next victim.
    ring: VecDeque<BlockId>,
    /// The position of `ring`'s front (positions wrap at 2^32).
    front: u32,
    /// Per block, the position of its live entry, or `GONE`.
    at: Vec<u32>,
    /// Live entries.
    live: usize,
}

impl LruRing {
    pub(crate) fn new(slots: usize) -> Self {
        Self {
            ring: VecDeque::new(),
            front: 0,
            at: vec![GONE; slots],
            live: 0,
        }
    }

    /// Cached blocks.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    pub(crate) fn contains(&self, id: BlockId) -> bool {
        self.at[id.index()] != GONE
    }

    /// Caches `id` as the most recently used.
    #[inline]
    pub(crate) fn push(&mut self, id: BlockId) {
        debug_assert!(!self.contains(id), "{id} already cached");
        let bound = (self.live.saturating_mul(2).saturating_add(SLACK)).min(MAX_RING);
        if self.ring.len() >= bound {
            self.compact();
        }
        let position = self.position(self.ring.len());
        if position == GONE {
            // The one position that would read as "not cached": skip it
            // with a stale entry of its own.
            self.ring.push_back(id);
        }
        let position = self.position(self.ring.len());
        self.at[id.index()] = position;
        self.ring.push_back(id);
        self.live += 1;
    }

    /// [`push`](Self::push) of each of `ids`, last first (a batch released
    /// at once), with the ring's bookkeeping done once for the batch: a
    /// compaction is due before the first push or not at all (each push
    /// adds one entry and raises the bound by two), and one range check
    /// tells whether any position is the skipped one. Past either rule's
    /// reach (a ring near 2^32 positions), it pushes one at a time.
    pub(crate) fn push_last_first(&mut self, ids: &[BlockId]) {
        let n = ids.len();
        if n == 0 {
            return;
        }
        let after = self.live.saturating_add(n).saturating_mul(2);
        if after.saturating_add(SLACK) <= MAX_RING {
            // The first push's check; the later ones would all pass.
            if self.ring.len() >= self.live * 2 + SLACK {
                self.compact();
            }
            let first = self.position(self.ring.len());
            // Positions `first..first + n` (wrapping) avoid `GONE` exactly
            // when `GONE - first`, its offset from `first`, is `n` or more.
            if GONE.wrapping_sub(first) as usize >= n {
                // The words apart from `self`, so their table's address
                // stays in a register across the writes.
                let at = self.at.as_mut_slice();
                for (offset, &id) in ids.iter().rev().enumerate() {
                    debug_assert!(at[id.index()] == GONE, "{id} already cached");
                    at[id.index()] = first.wrapping_add(offset as u32);
                }
                self.ring.extend(ids.iter().rev().copied());
                self.live += n;
                return;
            }
        }
        for &id in ids.iter().rev() {
            self.push(id);
        }
    }

    /// Takes `id` out of the cache (matched again); whether it was cached.
    pub(crate) fn remove(&mut self, id: BlockId) -> bool {
        let word = &mut self.at[id.index()];
        if *word == GONE {
            return false;
        }
        *word = GONE;
        self.live -= 1;
        true
    }

    /// Takes the least recently used block out of the cache.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<BlockId> {
        if self.live == 0 {
            self.clear_stale();
            return None;
        }
        while let Some(id) = self.ring.pop_front() {
            let position = self.front;
            self.front = self.front.wrapping_add(1);
            if self.is_live(id, position) {
                self.at[id.index()] = GONE;
                self.live -= 1;
                return Some(id);
            }
        }
        None
    }

    /// The position of the entry `offset` from the front.
    fn position(&self, offset: usize) -> u32 {
        // The ring stays far shorter than 2^32 entries (see `push`), so
        // the offset's low 32 bits are the offset.
        self.front.wrapping_add(offset as u32)
    }

    /// Whether the entry of `id` at `position` is its live one (no live
    /// entry is ever at `GONE`, which marks a block not cached).
    fn is_live(&self, id: BlockId, position: u32) -> bool {
        position != GONE && self.at[id.index()] == position
    }

    /// Drops the stale entries, keeping the live ones in order. Rare (once
    /// per thousand-odd stale entries), so kept out of `push`.
    #[cold]
    #[inline(never)]
    fn compact(&mut self) {
        let mut kept = VecDeque::with_capacity(self.live.saturating_mul(2).saturating_add(SLACK));
        for (offset, &id) in self.ring.iter().enumerate() {
            if self.is_live(id, self.position(offset)) {
                kept.push_back(id);
            }
        }
        self.ring = kept;
        self.front = 0;
        for (offset, &id) in self.ring.iter().enumerate() {
            self.at[id.index()] = offset as u32;
        }
    }

    /// With nothing live, every entry is stale: forget them.
    fn clear_stale(&mut self) {
        self.ring.clear();
        self.front = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Push(u32),
        Remove(u32),
        Pop,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u32..6).prop_map(Op::Push),
            2 => (0u32..6).prop_map(Op::Remove),
            2 => Just(Op::Pop),
        ]
    }

    proptest! {
        /// Against a plain ordered list, over any calls (pushes of cached
        /// blocks skipped, as the pool never makes them), from any starting
        /// position, so positions wrap and compactions happen mid-sequence.
        #[test]
        fn fuzz_the_ring_is_an_lru_list(
            start in prop_oneof![Just(0u32), Just(GONE - 3), any::<u32>()],
            ops in prop::collection::vec(op(), 1..200),
        ) {
            let mut ring = LruRing::new(6);
            ring.front = start;
            let mut model: Vec<u32> = Vec::new();
            for op in ops {
                match op {
                    Op::Push(i) if !model.contains(&i) => {
                        ring.push(BlockId::new(i));
                        model.push(i);
                    }
                    Op::Push(_) => {}
                    Op::Remove(i) => {
                        let cached = model.contains(&i);
                        model.retain(|&m| m != i);
                        prop_assert_eq!(ring.remove(BlockId::new(i)), cached);
                    }
                    Op::Pop => {
                        let expected = (!model.is_empty()).then(|| model.remove(0));
                        prop_assert_eq!(ring.pop().map(BlockId::get), expected);
                    }
                }
                prop_assert_eq!(ring.len(), model.len());
                // Bounded by the blocks, whatever the calls: stale entries
                // never outnumber the live ones at the last push (plus slack).
                prop_assert!(ring.ring.len() <= 2 * 6 + SLACK + 2);
                for i in 0..6 {
                    prop_assert_eq!(ring.contains(BlockId::new(i)), model.contains(&i));
                }
            }
        }
    }

    proptest! {
        /// A batch pushed last first leaves the ring as pushing its blocks
        /// one at a time would, from any position (the skipped one among
        /// the batch's) and any mix of stale and live entries before it.
        #[test]
        fn fuzz_a_batch_push_is_one_push_at_a_time(
            start in prop_oneof![Just(0u32), Just(GONE - 5), any::<u32>()],
            before in prop::collection::vec(op(), 0..60),
            batch in prop::collection::vec(0u32..12, 0..8),
        ) {
            let mut one = LruRing::new(12);
            one.front = start;
            let mut cached = [false; 12];
            for op in before {
                match op {
                    Op::Push(i) if !cached[i as usize] => {
                        one.push(BlockId::new(i));
                        cached[i as usize] = true;
                    }
                    Op::Push(_) => {}
                    Op::Remove(i) => {
                        one.remove(BlockId::new(i));
                        cached[i as usize] = false;
                    }
                    Op::Pop => {
                        if let Some(id) = one.pop() {
                            cached[id.index()] = false;
                        }
                    }
                }
            }
            // Distinct blocks not cached, as the pool's batches are.
            let mut ids: Vec<BlockId> = Vec::new();
            for i in batch {
                if !cached[i as usize] && !ids.contains(&BlockId::new(i)) {
                    ids.push(BlockId::new(i));
                }
            }
            let mut batched = LruRing {
                ring: one.ring.clone(),
                front: one.front,
                at: one.at.clone(),
                live: one.live,
            };
            for &id in ids.iter().rev() {
                one.push(id);
            }
            batched.push_last_first(&ids);
            prop_assert_eq!(&batched.ring, &one.ring);
            prop_assert_eq!(batched.front, one.front);
            prop_assert_eq!(&batched.at, &one.at);
            prop_assert_eq!(batched.live, one.live);
            prop_assert_eq!(drain(&mut batched), drain(&mut one));
        }
    }

    fn drain(ring: &mut LruRing) -> Vec<u32> {
        std::iter::from_fn(|| ring.pop())
            .map(BlockId::get)
            .collect()
    }

    #[test]
    fn pops_in_release_order_skipping_revived_blocks() {
        let mut ring = LruRing::new(8);
        for i in [3, 1, 4, 5, 2] {
            ring.push(BlockId::new(i));
        }
        assert!(ring.remove(BlockId::new(4)));
        assert!(!ring.remove(BlockId::new(4)));
        ring.push(BlockId::new(4)); // released again: now the newest
        assert!(ring.remove(BlockId::new(1)));
        assert_eq!(ring.len(), 4);
        assert!(ring.contains(BlockId::new(3)) && !ring.contains(BlockId::new(1)));
        assert_eq!(drain(&mut ring), vec![3, 5, 2, 4]);
        assert_eq!(ring.len(), 0);
        assert!(
            ring.ring.is_empty(),
            "stale entries dropped once nothing is live"
        );
    }

    #[test]
    fn compaction_keeps_the_order_and_bounds_the_ring() {
        let mut ring = LruRing::new(4);
        ring.push(BlockId::new(0));
        // Revive and release block 1 many times: each leaves a stale entry.
        for _ in 0..1000 {
            ring.push(BlockId::new(1));
            ring.remove(BlockId::new(1));
            assert!(ring.ring.len() <= 2 * ring.len() + SLACK + 2);
        }
        ring.push(BlockId::new(2));
        ring.push(BlockId::new(1));
        assert_eq!(drain(&mut ring), vec![0, 2, 1]);
    }

    #[test]
    fn a_stale_entry_at_the_skipped_position_is_never_live() {
        let mut ring = LruRing::new(4);
        ring.front = GONE - 1;
        ring.push(BlockId::new(0)); // at GONE - 1
        ring.push(BlockId::new(1)); // a filler at GONE, then at 0
        assert!(ring.remove(BlockId::new(1))); // its word now reads GONE
        ring.push(BlockId::new(2));
        // The filler sits at position GONE, where block 1's word points.
        assert_eq!(drain(&mut ring), vec![0, 2]);
        assert_eq!(ring.len(), 0);
    }

    #[test]
    fn positions_wrap_without_reading_as_not_cached() {
        let mut ring = LruRing::new(4);
        ring.front = GONE - 2;
        for i in 0..4 {
            ring.push(BlockId::new(i));
        }
        assert_eq!(ring.len(), 4);
        assert!((0..4).all(|i| ring.contains(BlockId::new(i))));
        assert_eq!(drain(&mut ring), vec![0, 1, 2, 3]);
    }
}
