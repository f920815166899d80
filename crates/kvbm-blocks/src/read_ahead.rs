//! [`ReadAhead`]: an iterator of registrations read a batch at a time.

use crate::{BlockId, SequenceHash};

/// Entries read ahead at a time.
const BATCH: usize = 32;

/// Yields `inner`'s (block, hash) entries, reading [`BATCH`] of them into
/// a buffer whenever it runs dry.
///
/// For a registration whose entries are scattered (a sequence's block ids
/// in one buffer, their hashes in the sequence's, neither read lately):
/// read one at a time just ahead of each registration, whose registry
/// probe waits on the hash, every miss on the way ran in series, and the
/// serving replay's registrations took twice as long. Read in a batch,
/// the reads are independent and overlap. Entries already read into one
/// array (staged handles) gain nothing from it and go straight through.
pub(crate) struct ReadAhead<I> {
    inner: I,
    buffer: [(BlockId, SequenceHash); BATCH],
    len: usize,
    at: usize,
}

impl<I: Iterator<Item = (BlockId, SequenceHash)>> ReadAhead<I> {
    pub(crate) fn new(inner: I) -> Self {
        Self {
            inner,
            buffer: [(BlockId::new(0), SequenceHash::root(0)); BATCH],
            len: 0,
            at: 0,
        }
    }
}

impl<I: Iterator<Item = (BlockId, SequenceHash)>> Iterator for ReadAhead<I> {
    type Item = (BlockId, SequenceHash);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.at == self.len {
            self.len = 0;
            for (slot, entry) in self.buffer.iter_mut().zip(self.inner.by_ref()) {
                *slot = entry;
                self.len += 1;
            }
            self.at = 0;
        }
        if self.at == self.len {
            return None;
        }
        let entry = self.buffer.get(self.at).copied();
        self.at += 1;
        entry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yields_every_entry_in_order_across_batches() {
        for n in [0, 1, BATCH - 1, BATCH, BATCH + 1, 3 * BATCH + 5] {
            let entries: Vec<_> = (0..n as u32)
                .map(|i| (BlockId::new(i), SequenceHash::root(u128::from(i))))
                .collect();
            let read: Vec<_> = ReadAhead::new(entries.iter().copied()).collect();
            assert_eq!(read, entries, "{n} entries");
        }
    }
}
