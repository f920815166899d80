//! [`Holders`]: the workers holding one key on one medium, as a set of
//! dense worker slots whose form follows its size: a few slots inline, a
//! sorted list, or a bitset over every slot once that is smaller.

use std::fmt;

/// A worker's dense number in its index (see `table.rs`): small, reused
/// once free, so a bitset over them is as wide as the fleet.
pub(super) type WorkerSlot = u32;

/// Slots kept inline, in the map entry itself: a key held by a few workers
/// (the common case) allocates nothing.
const INLINE: usize = 3;

/// The longest sorted list; past it (or once a bitset over the slots is no
/// larger) a set becomes a bitset.
const LIST_MAX: usize = 32;

/// A set of worker slots: inline, a sorted list, or a bitset, whichever is
/// smallest for its size (with some hysteresis, so a set hovering at a
/// boundary does not reallocate on every change). 16 bytes, so a map entry
/// with its `u128` key is 32.
pub(super) enum Holders {
    /// Up to [`INLINE`] slots, the first `len` sorted.
    Inline {
        len: u8,
        slots: [WorkerSlot; INLINE],
    },
    /// More than [`INLINE`] slots, sorted. Boxed, though a `Vec` is on
    /// the heap already: a thin pointer keeps the set at 16 bytes.
    #[allow(clippy::box_collection)]
    List(Box<Vec<WorkerSlot>>),
    /// Many slots, as bits.
    Bits(Box<Bits>),
}

/// What [`Holders::remove`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Removal {
    /// The slot was not in the set.
    Absent,
    /// The slot went; others remain.
    Removed,
    /// The slot went, and the set is empty.
    Emptied,
}

/// A bitset of worker slots with its count.
#[derive(Clone, Debug, Default)]
pub(super) struct Bits {
    count: usize,
    words: Vec<u64>,
}

/// A read-only look at a [`Holders`] or any slot set, for intersecting.
#[derive(Clone, Copy, Debug)]
pub(super) enum View<'a> {
    /// Sorted slots.
    Sorted(&'a [WorkerSlot]),
    /// A bitset's words.
    Bits(&'a [u64]),
}

impl<'a> View<'a> {
    /// The slots, ascending.
    pub(super) fn iter(self) -> impl Iterator<Item = WorkerSlot> + 'a {
        let (sorted, words): (&[WorkerSlot], &[u64]) = match self {
            View::Sorted(slots) => (slots, &[]),
            View::Bits(words) => (&[], words),
        };
        sorted.iter().copied().chain(ones(words))
    }

    /// Whether `slot` is in the set.
    #[inline]
    pub(super) fn contains(self, slot: WorkerSlot) -> bool {
        match self {
            View::Sorted(slots) if slots.len() <= INLINE => slots.contains(&slot),
            View::Sorted(slots) => slots.binary_search(&slot).is_ok(),
            View::Bits(words) => bit(words, slot),
        }
    }
}

/// Whether bit `slot` of `words` is set (bits past the end are clear).
#[inline]
pub(super) fn bit(words: &[u64], slot: WorkerSlot) -> bool {
    let (word, bit) = split(slot);
    words.get(word).is_some_and(|w| w >> bit & 1 == 1)
}

/// A slot's word and bit in a bitset.
#[inline]
pub(super) fn split(slot: WorkerSlot) -> (usize, u32) {
    ((slot / 64) as usize, slot % 64)
}

/// Words a bitset needs to hold `slot`.
fn words_for(slot: WorkerSlot) -> usize {
    (slot / 64) as usize + 1
}

/// Whether a list of `len` slots up to `max` is smaller than a bitset of
/// them (and not too long to search).
fn list_fits(len: usize, max: WorkerSlot) -> bool {
    len <= LIST_MAX && len.saturating_mul(4) < words_for(max).saturating_mul(8)
}

impl Bits {
    /// Sets bit `slot`; whether it was clear.
    pub(super) fn insert(&mut self, slot: WorkerSlot) -> bool {
        let (word, bit) = split(slot);
        if self.words.len() <= word {
            self.grow(word + 1);
        }
        let mask = 1u64 << bit;
        // There, grown above: a lookup that cannot fail, where an index
        // brought its bounds check's panic into every caller's loop.
        let Some(at) = self.words.get_mut(word) else {
            return false;
        };
        let new = *at & mask == 0;
        *at |= mask;
        self.count += usize::from(new);
        new
    }

    /// Widens the set to `words` words: rare, out of line.
    #[cold]
    #[inline(never)]
    fn grow(&mut self, words: usize) {
        self.words.resize(words, 0);
    }

    /// Clears bit `slot`; whether it was set.
    pub(super) fn remove(&mut self, slot: WorkerSlot) -> bool {
        let (word, bit) = split(slot);
        let Some(word) = self.words.get_mut(word) else {
            return false;
        };
        let mask = 1u64 << bit;
        let held = *word & mask != 0;
        *word &= !mask;
        self.count -= usize::from(held);
        held
    }

    /// Whether bit `slot` is set.
    pub(super) fn contains(&self, slot: WorkerSlot) -> bool {
        bit(&self.words, slot)
    }

    /// Slots set.
    pub(super) fn len(&self) -> usize {
        self.count
    }

    /// The words.
    pub(super) fn words(&self) -> &[u64] {
        &self.words
    }

    /// The set slots, ascending.
    pub(super) fn iter(&self) -> impl Iterator<Item = WorkerSlot> + '_ {
        ones(&self.words)
    }

    /// Clears every bit set in `dead`.
    fn remove_all(&mut self, dead: &Bits) {
        for (word, dead) in self.words.iter_mut().zip(&dead.words) {
            self.count -= (*word & dead).count_ones() as usize;
            *word &= !dead;
        }
    }
}

/// The set bits of `words`, ascending, as slots.
pub(super) fn ones(words: &[u64]) -> impl Iterator<Item = WorkerSlot> + '_ {
    (words.iter().enumerate()).flat_map(|(at, &word)| ones_of(at, word))
}

/// The set bits of `word` (word `at` of a bitset), ascending, as slots.
pub(super) fn ones_of(at: usize, word: u64) -> impl Iterator<Item = WorkerSlot> {
    let base = (at as WorkerSlot).wrapping_mul(64);
    Ones(word).map(move |bit| base | bit)
}

/// The set bits of one word, lowest first.
struct Ones(u64);

impl Iterator for Ones {
    type Item = WorkerSlot;

    #[inline]
    fn next(&mut self) -> Option<WorkerSlot> {
        if self.0 == 0 {
            return None;
        }
        let bit = self.0.trailing_zeros();
        self.0 &= self.0 - 1;
        Some(bit)
    }
}

impl Holders {
    /// The set of `slot` alone.
    pub(super) fn one(slot: WorkerSlot) -> Self {
        Holders::Inline {
            len: 1,
            slots: [slot, 0, 0],
        }
    }

    /// A read-only look at the set.
    #[inline]
    pub(super) fn view(&self) -> View<'_> {
        match self {
            Holders::Inline { len, slots } => View::Sorted(&slots[..usize::from(*len)]),
            Holders::List(list) => View::Sorted(list),
            Holders::Bits(bits) => View::Bits(bits.words()),
        }
    }

    /// Slots in the set.
    pub(super) fn len(&self) -> usize {
        match self {
            Holders::Inline { len, .. } => usize::from(*len),
            Holders::List(list) => list.len(),
            Holders::Bits(bits) => bits.len(),
        }
    }

    /// Whether the set is empty.
    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the set is `slot` alone, inline (where a set of one always
    /// is: the other forms shrink to it well before).
    #[inline]
    pub(super) fn is_only(&self, slot: WorkerSlot) -> bool {
        matches!(self, Holders::Inline { len: 1, slots: [only, ..] } if *only == slot)
    }

    /// Whether `slot` is in the set.
    pub(super) fn contains(&self, slot: WorkerSlot) -> bool {
        self.view().contains(slot)
    }

    /// The slots, ascending.
    pub(super) fn iter(&self) -> impl Iterator<Item = WorkerSlot> + '_ {
        self.view().iter()
    }

    /// Adds `slot`; whether it was new. Before the set grows out of its
    /// form it drops the slots `live` lacks (workers gone or cleared,
    /// whose bits the next sweep would drop), so they never make it grow.
    #[inline]
    pub(super) fn insert(&mut self, slot: WorkerSlot, live: &Bits) -> bool {
        match self {
            // Inlined: a key many workers hold is stored again and again
            // (by each worker that evicted it), and a call to set a bit
            // cost as much as the bit.
            Holders::Bits(bits) => bits.insert(slot),
            _ => self.insert_small(slot, live),
        }
    }

    /// [`insert`](Self::insert) into an inline set or a list.
    fn insert_small(&mut self, slot: WorkerSlot, live: &Bits) -> bool {
        match self {
            Holders::Inline { len, slots } => {
                // A linear scan: at most `INLINE` slots.
                let held = &slots[..usize::from(*len)];
                if held.contains(&slot) {
                    return false;
                }
                let at = held.iter().take_while(|&&s| s < slot).count();
                if usize::from(*len) == INLINE {
                    self.retain(|slot| live.contains(slot));
                    return self.insert_grown(slot);
                }
                // Shifted by hand: a call to `copy_within` costs more than
                // these few moves.
                let mut to = usize::from(*len);
                while to > at {
                    slots[to] = slots[to - 1];
                    to -= 1;
                }
                slots[at] = slot;
                *len += 1;
                true
            }
            Holders::List(list) => {
                let Err(at) = list.binary_search(&slot) else {
                    return false;
                };
                let max = list.last().copied().unwrap_or(0).max(slot);
                if list_fits(list.len() + 1, max) {
                    list.insert(at, slot);
                    return true;
                }
                self.retain(|slot| live.contains(slot));
                self.insert_grown(slot)
            }
            Holders::Bits(bits) => bits.insert(slot),
        }
    }

    /// Adds `slot`, absent, to a set that may be full for its form.
    fn insert_grown(&mut self, slot: WorkerSlot) -> bool {
        let mut all: Vec<WorkerSlot> = self.iter().collect();
        let at = all.binary_search(&slot).unwrap_or_else(|at| at);
        all.insert(at, slot);
        *self = Self::from_sorted(all);
        true
    }

    /// The set of `slots` (sorted, distinct) in its best form.
    fn from_sorted(slots: Vec<WorkerSlot>) -> Self {
        let max = slots.last().copied().unwrap_or(0);
        if slots.len() <= INLINE {
            let mut inline = [0; INLINE];
            inline[..slots.len()].copy_from_slice(&slots);
            Holders::Inline {
                // At most `INLINE`.
                len: slots.len() as u8,
                slots: inline,
            }
        } else if list_fits(slots.len(), max) {
            Holders::List(Box::new(slots))
        } else {
            let mut bits = Bits::default();
            slots.into_iter().for_each(|slot| {
                bits.insert(slot);
            });
            Holders::Bits(Box::new(bits))
        }
    }

    /// Removes `slot`: whether it was there, and whether it was the last
    /// (so that the index drops the emptied set without another look at
    /// it). A set that shrank well below its form's size takes a smaller
    /// one. Always inlined into the index's removal, which runs for every
    /// block an engine evicts (left to the compiler, it became a call).
    #[inline(always)]
    pub(super) fn remove(&mut self, slot: WorkerSlot) -> Removal {
        match self {
            Holders::Inline { len, slots } => {
                let Some(at) = slots[..usize::from(*len)].iter().position(|&s| s == slot) else {
                    return Removal::Absent;
                };
                for to in at..usize::from(*len) - 1 {
                    slots[to] = slots[to + 1];
                }
                *len -= 1;
                if *len == 0 {
                    Removal::Emptied
                } else {
                    Removal::Removed
                }
            }
            Holders::List(list) => {
                let Ok(at) = list.binary_search(&slot) else {
                    return Removal::Absent;
                };
                list.remove(at);
                self.shrink();
                self.removed()
            }
            Holders::Bits(bits) => {
                if !bits.remove(slot) {
                    return Removal::Absent;
                }
                // Only a set down to half a list's longest can take a
                // smaller form, or be empty (both of `shrink`'s tests for a
                // bitset imply it): a test here, where a call to `shrink`
                // to find that out cost as much as the removal itself.
                if bits.len() > LIST_MAX / 2 {
                    return Removal::Removed;
                }
                self.shrink();
                self.removed()
            }
        }
    }

    /// What a removal that took a slot out of the set did.
    fn removed(&self) -> Removal {
        if self.is_empty() {
            Removal::Emptied
        } else {
            Removal::Removed
        }
    }

    /// Removes every slot not satisfying `keep`.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(WorkerSlot) -> bool) {
        match self {
            Holders::Inline { len, slots } => {
                let mut kept = 0;
                for at in 0..usize::from(*len) {
                    if keep(slots[at]) {
                        slots[kept] = slots[at];
                        kept += 1;
                    }
                }
                // At most `INLINE`.
                *len = kept as u8;
            }
            Holders::List(list) => {
                list.retain(|&slot| keep(slot));
                self.shrink();
            }
            Holders::Bits(bits) => {
                let dead: Vec<WorkerSlot> = bits.iter().filter(|&slot| !keep(slot)).collect();
                dead.into_iter().for_each(|slot| {
                    bits.remove(slot);
                });
                self.shrink();
            }
        }
    }

    /// Removes every slot set in `dead` (a sweep's dead slots).
    pub(super) fn remove_all(&mut self, dead: &Bits) {
        match self {
            Holders::Bits(bits) => {
                bits.remove_all(dead);
                self.shrink();
            }
            _ => self.retain(|slot| !dead.contains(slot)),
        }
    }

    /// Takes a smaller form if the set shrank well below its own: a list
    /// of fewer than [`INLINE`] goes inline, a bitset whose slots would fit
    /// a list at half its length goes to a list.
    fn shrink(&mut self) {
        let smaller = match self {
            Holders::Inline { .. } => false,
            Holders::List(list) => list.len() < INLINE,
            Holders::Bits(bits) => {
                let max = (bits.words.len() as WorkerSlot)
                    .saturating_mul(64)
                    .saturating_sub(1);
                bits.len() < INLINE || list_fits(bits.len().saturating_mul(2), max)
            }
        };
        if smaller {
            let slots: Vec<WorkerSlot> = self.iter().collect();
            *self = Self::from_sorted(slots);
        }
    }
}

impl fmt::Debug for Holders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}
