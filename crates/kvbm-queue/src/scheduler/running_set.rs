//! [`RunningSet`]: the running requests and their position index, kept
//! together so that every change to the order marks the index for rebuilding
//! (it is rebuilt only when something changed, not after every step).

use std::collections::HashMap;
use std::ops::{Deref, Index, IndexMut};
use std::slice::SliceIndex;

use super::RequestId;
use super::running::Running;

/// Index of each running request in the list (a fast hasher: ids are the
/// caller's but only looked up, never iterated in order).
type Positions = HashMap<RequestId, usize, foldhash::fast::RandomState>;

/// Admitted requests holding blocks, in no particular order between steps,
/// with an O(1) lookup by id. Reads go through the slice (`Deref`);
/// changes to membership or order go through the methods below, which keep
/// the index honest.
///
/// Entries are boxed: a `Running` is hundreds of bytes, and removing one
/// from the middle (a request finishing, the others kept in order) shifts
/// every entry behind it, up to 128 KiB per removal among 256 running
/// requests; as pointers, 2 KiB.
pub(super) struct RunningSet<M> {
    #[expect(clippy::vec_box, reason = "a removal shifts pointers, not entries")]
    list: Vec<Box<Running<M>>>,
    positions: Positions,
    /// Whether `list` changed since `positions` was built.
    stale: bool,
}

impl<M> Default for RunningSet<M> {
    fn default() -> Self {
        Self {
            list: Vec::new(),
            positions: Positions::default(),
            stale: false,
        }
    }
}

impl<M> RunningSet<M> {
    pub(super) fn push(&mut self, running: Running<M>) {
        self.list.push(Box::new(running));
        self.stale = true;
    }

    /// Removes entry `index`, keeping the others' order.
    pub(super) fn remove(&mut self, index: usize) -> Running<M> {
        self.stale = true;
        *self.list.remove(index)
    }

    /// Removes entry `index`, moving the last one into its place.
    pub(super) fn swap_remove(&mut self, index: usize) -> Running<M> {
        self.stale = true;
        *self.list.swap_remove(index)
    }

    /// Sorts by `key` unless already sorted (a sort moves entries only when
    /// the order was wrong, so a sorted list keeps its index).
    pub(super) fn sort_by_key<K: Ord>(&mut self, mut key: impl FnMut(&Running<M>) -> K + Copy) {
        if !self.list.is_sorted_by_key(|running| key(running)) {
            self.list.sort_by_key(|running| key(running));
            self.stale = true;
        }
    }

    pub(super) fn iter_mut(&mut self) -> std::slice::IterMut<'_, Box<Running<M>>> {
        self.list.iter_mut()
    }

    /// Rebuilds the position index if the list changed since it was built.
    pub(super) fn reindex(&mut self) {
        if !self.stale {
            return;
        }
        self.positions.clear();
        for (index, running) in self.list.iter().enumerate() {
            self.positions.insert(running.id(), index);
        }
        self.stale = false;
    }

    /// Where `id` is. The index is checked against the entry, so a stale
    /// index can only miss, never name another request.
    pub(super) fn position(&self, id: RequestId) -> Option<usize> {
        let &index = self.positions.get(&id)?;
        (self.list.get(index)?.id() == id).then_some(index)
    }

    /// Whether the index names exactly the entries where they are (for the
    /// scheduler's audit).
    pub(super) fn index_agrees(&self) -> bool {
        self.positions.len() == self.list.len()
            && (self.list.iter().enumerate()).all(|(i, r)| self.position(r.id()) == Some(i))
    }
}

impl<M> Deref for RunningSet<M> {
    type Target = [Box<Running<M>>];

    fn deref(&self) -> &[Box<Running<M>>] {
        &self.list
    }
}

impl<M, I: SliceIndex<[Box<Running<M>>]>> Index<I> for RunningSet<M> {
    type Output = I::Output;

    fn index(&self, index: I) -> &I::Output {
        &self.list[index]
    }
}

impl<'a, M> IntoIterator for &'a RunningSet<M> {
    type Item = &'a Box<Running<M>>;
    type IntoIter = std::slice::Iter<'a, Box<Running<M>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.list.iter()
    }
}

/// Mutable access to one entry (not to ranges, which could reorder): it may
/// change its state, never its id (an entry is replaced only through the
/// methods above).
impl<M> IndexMut<usize> for RunningSet<M> {
    fn index_mut(&mut self, index: usize) -> &mut Box<Running<M>> {
        &mut self.list[index]
    }
}
