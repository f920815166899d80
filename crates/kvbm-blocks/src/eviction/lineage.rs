//! Lineage-aware eviction: leaves before parents, so shared prefixes survive.
//!
//! Every registered block counts its registered children. Cached blocks with
//! no children sit in the leaf list, the others in the parent list; eviction
//! takes the oldest leaf, falling back to the oldest parent. A child keeps a
//! link to its parent tagged with the parent slot's epoch (the pool's, which
//! moves on whenever a slot stops holding registered content), so a link to
//! a slot that was evicted and reused is recognised as stale.

use crate::BlockId;

use super::list::SlotLists;

const LEAVES: usize = 0;
const PARENTS: usize = 1;
const NO_PARENT: u32 = u32::MAX;

#[derive(Debug)]
pub(crate) struct Lineage {
    lists: SlotLists,
    children: Vec<u32>,
    parent: Vec<u32>,
    /// The parent slot's epoch when the link was made.
    parent_epoch: Vec<u32>,
}

impl Lineage {
    pub(crate) fn new(slots: usize) -> Self {
        Self {
            lists: SlotLists::new(slots, 2),
            children: vec![0; slots],
            parent: vec![NO_PARENT; slots],
            parent_epoch: vec![0; slots],
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.lists.len()
    }

    pub(crate) fn lists(&self) -> &SlotLists {
        &self.lists
    }

    pub(crate) fn lists_mut(&mut self) -> &mut SlotLists {
        &mut self.lists
    }

    /// Records `id` as a child of `parent` (both registered), given with
    /// its slot's current epoch.
    pub(crate) fn link(&mut self, id: BlockId, parent: Option<(BlockId, u32)>) {
        let (i, parent, epoch) = match parent {
            Some((parent, epoch)) if parent != id => (id.index(), parent, epoch),
            _ => {
                self.parent[id.index()] = NO_PARENT;
                return;
            }
        };
        let p = parent.index();
        self.parent[i] = parent.get();
        self.parent_epoch[i] = epoch;
        self.children[p] += 1;
        // A cached leaf that gains a child is a parent now.
        if self.lists.list_of(parent) == Some(LEAVES) {
            self.lists.unlink(parent);
            self.lists.push_back(PARENTS, parent);
        }
    }

    pub(crate) fn insert(&mut self, id: BlockId) {
        let list = if self.children[id.index()] == 0 {
            LEAVES
        } else {
            PARENTS
        };
        self.lists.push_back(list, id);
    }

    pub(crate) fn evict(&mut self) -> Option<BlockId> {
        self.lists
            .pop_front(LEAVES)
            .or_else(|| self.lists.pop_front(PARENTS))
    }

    /// `id` was evicted: its parent loses a child and may become a leaf.
    /// `epoch_of` reads a slot's current epoch.
    pub(crate) fn unlink_parent(&mut self, id: BlockId, epoch_of: impl Fn(BlockId) -> u32) {
        let i = id.index();
        self.children[i] = 0;
        let parent = std::mem::replace(&mut self.parent[i], NO_PARENT);
        if parent == NO_PARENT {
            return;
        }
        let p = parent as usize;
        if self.parent_epoch[i] != epoch_of(BlockId::new(parent)) {
            return; // the parent was evicted (and maybe reused) before us
        }
        self.children[p] -= 1;
        let parent = BlockId::new(parent);
        if self.children[p] == 0 && self.lists.list_of(parent) == Some(PARENTS) {
            // Its newest child was just the coldest leaf, so it is about as
            // old: it takes that child's place at the cold end.
            self.lists.unlink(parent);
            self.lists.push_front(LEAVES, parent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(i: u32) -> BlockId {
        BlockId::new(i)
    }

    /// Slot epochs as the pool keeps them: moved on at every eviction.
    struct Epochs(Vec<u32>);

    impl Epochs {
        fn of(&self, id: BlockId) -> (BlockId, u32) {
            (id, self.0[id.index()])
        }

        /// Evicts `victim` from `lin` as the pool does.
        fn evicted(&mut self, lin: &mut Lineage, victim: BlockId) {
            self.0[victim.index()] += 1;
            let epochs = &self.0;
            lin.unlink_parent(victim, |b| epochs[b.index()]);
        }
    }

    #[test]
    fn leaves_go_before_their_parents_even_when_parents_are_older() {
        // Chain 0 <- 1 <- 2 released root first (oldest), plus an unrelated
        // leaf 3 released last.
        let mut lin = Lineage::new(4);
        let mut ep = Epochs(vec![0; 4]);
        lin.link(id(0), None);
        lin.link(id(1), Some(ep.of(id(0))));
        lin.link(id(2), Some(ep.of(id(1))));
        lin.link(id(3), None);
        for i in 0..4 {
            lin.insert(id(i));
        }
        let mut order = vec![];
        while let Some(victim) = lin.evict() {
            ep.evicted(&mut lin, victim);
            order.push(victim.get());
        }
        assert_eq!(order, vec![2, 1, 0, 3]);
    }

    #[test]
    fn a_shared_parent_survives_until_its_last_child_goes() {
        let mut lin = Lineage::new(4);
        let mut ep = Epochs(vec![0; 4]);
        lin.link(id(0), None);
        lin.link(id(1), Some(ep.of(id(0))));
        lin.link(id(2), Some(ep.of(id(0))));
        for i in 0..3 {
            lin.insert(id(i));
        }
        let first = lin.evict().unwrap();
        ep.evicted(&mut lin, first);
        assert_eq!(first, id(1));
        let second = lin.evict().unwrap();
        ep.evicted(&mut lin, second);
        assert_eq!(second, id(2));
        assert_eq!(lin.evict(), Some(id(0)));
    }

    #[test]
    fn stale_links_to_a_reused_parent_slot_are_ignored() {
        let mut lin = Lineage::new(3);
        let mut ep = Epochs(vec![0; 3]);
        lin.link(id(0), None);
        lin.link(id(1), Some(ep.of(id(0))));
        // No cached leaf exists while 1 is held, so the parent goes first.
        lin.insert(id(0));
        assert_eq!(lin.evict(), Some(id(0)));
        ep.evicted(&mut lin, id(0));
        // Slot 0 is reused by an unrelated block; 1's eviction must not
        // decrement its child count.
        lin.link(id(0), None);
        lin.link(id(2), Some(ep.of(id(0))));
        lin.insert(id(1));
        assert_eq!(lin.evict(), Some(id(1)));
        ep.evicted(&mut lin, id(1));
        assert_eq!(lin.children[0], 1);
    }
}
