//! Intrusive doubly linked lists over block slots: O(1) push, unlink and pop
//! with two `u32` links per block and no allocation after construction.
//! A slot's two links sit side by side (one bounds check, one cache line).

use crate::BlockId;

const NIL: u32 = u32::MAX;
const NO_LIST: u8 = u8::MAX;

/// A slot's neighbours in its list (`NIL` at the ends).
#[derive(Clone, Copy, Debug)]
struct Link {
    prev: u32,
    next: u32,
}

const UNLINKED: Link = Link {
    prev: NIL,
    next: NIL,
};

#[derive(Clone, Copy, Debug)]
struct Ends {
    head: u32,
    tail: u32,
    len: usize,
}

/// A fixed number of lists sharing one set of per-slot links; a slot is in at
/// most one list at a time. Heads are the cold (evict-first) ends.
#[derive(Debug)]
pub(crate) struct SlotLists {
    links: Vec<Link>,
    owner: Vec<u8>,
    lists: Vec<Ends>,
}

impl SlotLists {
    pub(crate) fn new(slots: usize, lists: usize) -> Self {
        debug_assert!(lists < usize::from(NO_LIST));
        Self {
            links: vec![UNLINKED; slots],
            owner: vec![NO_LIST; slots],
            lists: vec![
                Ends {
                    head: NIL,
                    tail: NIL,
                    len: 0
                };
                lists
            ],
        }
    }

    /// Total slots across all lists.
    pub(crate) fn len(&self) -> usize {
        self.lists.iter().map(|l| l.len).sum()
    }

    /// Which list holds `id`, if any.
    pub(crate) fn list_of(&self, id: BlockId) -> Option<usize> {
        match self.owner[id.index()] {
            NO_LIST => None,
            list => Some(usize::from(list)),
        }
    }

    /// Appends at the warm end.
    pub(crate) fn push_back(&mut self, list: usize, id: BlockId) {
        debug_assert_eq!(self.owner[id.index()], NO_LIST, "{id} already listed");
        let i = id.get();
        let ends = &mut self.lists[list];
        self.links[i as usize] = Link {
            prev: ends.tail,
            next: NIL,
        };
        match ends.tail {
            NIL => ends.head = i,
            tail => self.links[tail as usize].next = i,
        }
        ends.tail = i;
        ends.len += 1;
        self.owner[i as usize] = list as u8;
    }

    /// Inserts at the cold end.
    pub(crate) fn push_front(&mut self, list: usize, id: BlockId) {
        debug_assert_eq!(self.owner[id.index()], NO_LIST, "{id} already listed");
        let i = id.get();
        let ends = &mut self.lists[list];
        self.links[i as usize] = Link {
            prev: NIL,
            next: ends.head,
        };
        match ends.head {
            NIL => ends.tail = i,
            head => self.links[head as usize].prev = i,
        }
        ends.head = i;
        ends.len += 1;
        self.owner[i as usize] = list as u8;
    }

    /// Removes `id` from whichever list holds it; returns that list.
    pub(crate) fn unlink(&mut self, id: BlockId) -> Option<usize> {
        let list = self.list_of(id)?;
        let i = id.index();
        let Link { prev, next } = std::mem::replace(&mut self.links[i], UNLINKED);
        let ends = &mut self.lists[list];
        match prev {
            NIL => ends.head = next,
            prev => self.links[prev as usize].next = next,
        }
        match next {
            NIL => ends.tail = prev,
            next => self.links[next as usize].prev = prev,
        }
        ends.len -= 1;
        self.owner[i] = NO_LIST;
        Some(list)
    }

    /// Removes and returns the coldest slot of `list`.
    pub(crate) fn pop_front(&mut self, list: usize) -> Option<BlockId> {
        match self.lists[list].head {
            NIL => None,
            head => {
                let id = BlockId::new(head);
                self.unlink(id);
                Some(id)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(lists: &mut SlotLists, list: usize) -> Vec<u32> {
        std::iter::from_fn(|| lists.pop_front(list))
            .map(BlockId::get)
            .collect()
    }

    #[test]
    fn push_unlink_pop_keep_order_and_counts() {
        let mut lists = SlotLists::new(8, 2);
        for i in [3, 1, 4, 5] {
            lists.push_back(0, BlockId::new(i));
        }
        lists.push_front(0, BlockId::new(2));
        lists.push_back(1, BlockId::new(7));
        assert_eq!(lists.len(), 6);
        assert_eq!(lists.unlink(BlockId::new(4)), Some(0));
        assert_eq!(lists.unlink(BlockId::new(4)), None);
        assert_eq!(lists.list_of(BlockId::new(7)), Some(1));
        assert_eq!(drain(&mut lists, 0), vec![2, 3, 1, 5]);
        assert_eq!(drain(&mut lists, 1), vec![7]);
        assert_eq!(lists.len(), 0);
    }

    #[test]
    fn unlinking_head_and_tail_repairs_ends() {
        let mut lists = SlotLists::new(4, 1);
        for i in 0..4 {
            lists.push_back(0, BlockId::new(i));
        }
        lists.unlink(BlockId::new(0));
        lists.unlink(BlockId::new(3));
        lists.push_back(0, BlockId::new(0));
        assert_eq!(drain(&mut lists, 0), vec![1, 2, 0]);
    }
}
