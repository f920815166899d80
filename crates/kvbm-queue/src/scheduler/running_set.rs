//! [`RunningSet`]: the running requests and their position index, kept
//! together so that every change to the order drops the index, which the
//! next lookup by id builds again (a step that looks nobody up by id, a
//! simulated engine's, never builds it).

use std::collections::HashMap;
use std::ops::{Deref, Index, IndexMut};
use std::slice::SliceIndex;
use std::sync::OnceLock;

use super::RequestId;
use super::running::Running;

/// Index of each running request in the list (a fast hasher: ids are the
/// caller's but only looked up, never iterated in order).
type Positions = HashMap<RequestId, usize, foldhash::fast::RandomState>;

/// Admitted requests holding blocks, in no particular order between steps,
/// with an O(1) lookup by id once the index is built. Reads go through the
/// slice (`Deref`); changes to membership or order go through the methods
/// below, which drop the index.
///
/// Entries are boxed: a `Running` is hundreds of bytes, and removing one
/// from the middle (a request finishing, the others kept in order) shifts
/// every entry behind it, up to 128 KiB per removal among 256 running
/// requests; as pointers, 2 KiB.
pub(super) struct RunningSet<M> {
    #[expect(clippy::vec_box, reason = "a removal shifts pointers, not entries")]
    list: Vec<Box<Running<M>>>,
    /// Built by the first lookup after a change (lookups take `&self`, and
    /// the scheduler stays `Sync`); a change takes it away. Rebuilding
    /// after every step's admissions and finishes cost the all-at-once
    /// replay about 1% of its instructions, for lookups it never made.
    positions: OnceLock<Positions>,
}

impl<M> Default for RunningSet<M> {
    fn default() -> Self {
        Self {
            list: Vec::new(),
            positions: OnceLock::new(),
        }
    }
}

impl<M> RunningSet<M> {
    pub(super) fn push(&mut self, running: Running<M>) {
        self.list.push(Box::new(running));
        self.changed();
    }

    /// Removes entry `index`, keeping the others' order.
    pub(super) fn remove(&mut self, index: usize) -> Running<M> {
        self.changed();
        *self.list.remove(index)
    }

    /// Removes entry `index`, moving the last one into its place.
    pub(super) fn swap_remove(&mut self, index: usize) -> Running<M> {
        self.changed();
        *self.list.swap_remove(index)
    }

    /// Sorts by `key` unless already sorted (a sort moves entries only when
    /// the order was wrong, so a sorted list keeps its index).
    pub(super) fn sort_by_key<K: Ord>(&mut self, mut key: impl FnMut(&Running<M>) -> K + Copy) {
        if !self.list.is_sorted_by_key(|running| key(running)) {
            self.list.sort_by_key(|running| key(running));
            self.changed();
        }
    }

    pub(super) fn iter_mut(&mut self) -> std::slice::IterMut<'_, Box<Running<M>>> {
        self.list.iter_mut()
    }

    /// The list changed: the index goes.
    fn changed(&mut self) {
        self.positions.take();
    }

    /// The index, built now if the list changed since it last was.
    fn positions(&self) -> &Positions {
        self.positions.get_or_init(|| {
            let mut positions = Positions::default();
            positions.reserve(self.list.len());
            for (index, running) in self.list.iter().enumerate() {
                positions.insert(running.id(), index);
            }
            positions
        })
    }

    /// Where `id` is.
    pub(super) fn position(&self, id: RequestId) -> Option<usize> {
        let &index = self.positions().get(&id)?;
        (self.list.get(index)?.id() == id).then_some(index)
    }

    /// Whether the index names exactly the entries where they are (for the
    /// scheduler's audit).
    pub(super) fn index_agrees(&self) -> bool {
        self.positions().len() == self.list.len()
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
