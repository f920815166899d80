//! [`Survivors`]: the workers still matching a request as its keys are
//! walked, intersected key by key with each key's holders; each worker
//! that drops out is recorded with the depth it reached.
//!
//! Dense (a bitset over the slots) while many match, sparse (a sorted
//! list) once few do: a step costs a word per 64 slots, or a probe per
//! survivor, never a probe per worker of the fleet.

use super::holders::{Bits, View, WorkerSlot, bit, ones_of};

/// Survivors below this many go from bits to a list.
const SPARSE_AT: usize = 16;

/// The slots still matching.
#[derive(Debug)]
pub(super) enum Survivors {
    /// Sorted slots.
    Sparse(Vec<WorkerSlot>),
    /// Bits, with their count.
    Dense { words: Vec<u64>, count: usize },
}

impl Survivors {
    /// The `live` slots among the holders of the first key.
    pub(super) fn start(first: View<'_>, live: &Bits) -> Self {
        match first {
            View::Sorted(slots) => Survivors::Sparse(
                slots
                    .iter()
                    .copied()
                    .filter(|&s| live.contains(s))
                    .collect(),
            ),
            View::Bits(words) => {
                let words: Vec<u64> = (words.iter().zip(live.words()))
                    .map(|(held, live)| held & live)
                    .collect();
                let count = words.iter().map(|w| w.count_ones() as usize).sum();
                let mut survivors = Survivors::Dense { words, count };
                survivors.compact();
                survivors
            }
        }
    }

    /// No one.
    pub(super) fn none() -> Self {
        Survivors::Sparse(Vec::new())
    }

    /// How many still match.
    pub(super) fn len(&self) -> usize {
        match self {
            Survivors::Sparse(slots) => slots.len(),
            Survivors::Dense { count, .. } => *count,
        }
    }

    /// Whether `slot` still matches.
    #[inline]
    pub(super) fn contains(&self, slot: WorkerSlot) -> bool {
        match self {
            Survivors::Sparse(slots) => slots.binary_search(&slot).is_ok(),
            Survivors::Dense { words, .. } => bit(words, slot),
        }
    }

    /// Whether no one matches any more.
    pub(super) fn is_empty(&self) -> bool {
        match self {
            Survivors::Sparse(slots) => slots.is_empty(),
            Survivors::Dense { count, .. } => *count == 0,
        }
    }

    /// Keeps the survivors among `next`, the holders of the key at
    /// `depth` (`None`: no one holds it); each one dropped goes to
    /// `ended` with `depth`, the blocks it matched.
    pub(super) fn step(
        &mut self,
        next: Option<View<'_>>,
        depth: usize,
        ended: &mut Vec<(WorkerSlot, usize)>,
    ) {
        let Some(next) = next else {
            self.finish(depth, ended);
            *self = Survivors::none();
            return;
        };
        match (&mut *self, next) {
            (Survivors::Sparse(slots), next) => slots.retain(|&slot| {
                let kept = next.contains(slot);
                if !kept {
                    ended.push((slot, depth));
                }
                kept
            }),
            (Survivors::Dense { words, count }, View::Bits(held)) => {
                for (at, word) in words.iter_mut().enumerate() {
                    let kept = *word & held.get(at).copied().unwrap_or(0);
                    let gone = *word & !kept;
                    if gone != 0 {
                        ended.extend(ones_of(at, gone).map(|slot| (slot, depth)));
                        *count -= gone.count_ones() as usize;
                        *word = kept;
                    }
                }
                self.compact();
            }
            (Survivors::Dense { words, .. }, View::Sorted(held)) => {
                let kept: Vec<WorkerSlot> =
                    held.iter().copied().filter(|&s| bit(words, s)).collect();
                for (at, &word) in words.iter().enumerate() {
                    let gone = ones_of(at, word).filter(|slot| kept.binary_search(slot).is_err());
                    ended.extend(gone.map(|slot| (slot, depth)));
                }
                *self = Survivors::Sparse(kept);
            }
        }
    }

    /// Every survivor, to `ended` with `value`.
    pub(super) fn finish<T: Copy>(&self, value: T, ended: &mut Vec<(WorkerSlot, T)>) {
        ended.reserve(self.len());
        match self {
            Survivors::Sparse(slots) => ended.extend(slots.iter().map(|&s| (s, value))),
            Survivors::Dense { words, .. } => {
                for (at, &word) in words.iter().enumerate() {
                    ended.extend(ones_of(at, word).map(|s| (s, value)));
                }
            }
        }
    }

    /// Goes sparse if few remain.
    fn compact(&mut self) {
        if let Survivors::Dense { words, count } = self
            && *count < SPARSE_AT
        {
            let mut slots = Vec::with_capacity(*count);
            for (at, &word) in words.iter().enumerate() {
                slots.extend(ones_of(at, word));
            }
            *self = Survivors::Sparse(slots);
        }
    }
}
