//! The free list, threaded through the slots it lists.
//!
//! A free slot's `refs` field counts nothing (no handle pins a free block),
//! so it holds the index of the next free slot instead. That makes the list
//! cost nothing per block, where a separate stack of ids cost 4 bytes per
//! block of the pool whether free or not. It is a stack: the most recently
//! freed block is reused first, while it is warm in cache.

use super::{Slot, SlotState};
use crate::BlockId;

/// Ends the list.
const NIL: u32 = u32::MAX;

#[derive(Debug)]
pub(super) struct FreeList {
    head: u32,
    len: usize,
}

impl FreeList {
    /// Chains every slot, `Free` already: block 0 is handed out first.
    /// Slot counts are below `u32::MAX` (the builder refuses more).
    pub(super) fn all(slots: &mut [Slot]) -> Self {
        let mut list = Self { head: NIL, len: 0 };
        for index in (0..slots.len()).rev() {
            list.push(slots, BlockId::new(index as u32));
        }
        list
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Lists a slot the caller has just made `Free`.
    #[inline]
    pub(super) fn push(&mut self, slots: &mut [Slot], id: BlockId) {
        let slot = &mut slots[id.index()];
        debug_assert_eq!(slot.state(), SlotState::Free, "{id} freed while in use");
        slot.refs = self.head;
        self.head = id.get();
        self.len += 1;
    }

    /// Unlists the most recently freed slot; it stays `Free` with no
    /// references until the caller changes it.
    #[inline]
    pub(super) fn pop(&mut self, slots: &mut [Slot]) -> Option<BlockId> {
        let slot = slots.get_mut(usize::try_from(self.head).ok()?)?;
        let id = BlockId::new(self.head);
        self.head = std::mem::replace(&mut slot.refs, 0);
        // Saturating: a count out of step with the links is corruption the
        // audit reports, not a reason to panic here.
        self.len = self.len.saturating_sub(1);
        Some(id)
    }

    /// Walks the list for an audit: the ids it links, first to last, ending
    /// early at a link out of range and after `len + 1` steps (so a cycle,
    /// which the audit reports, cannot hang it).
    pub(super) fn walk<'a>(&self, slots: &'a [Slot]) -> impl Iterator<Item = BlockId> + 'a {
        let mut next = self.head;
        std::iter::from_fn(move || {
            let slot = slots.get(usize::try_from(next).ok()?)?;
            let id = BlockId::new(next);
            next = slot.refs;
            Some(id)
        })
        .take(self.len.saturating_add(1))
    }
}
