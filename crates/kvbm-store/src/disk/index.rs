//! [`Index`]: which slot holds which key, which slots are free, and which
//! are pinned by a read or a tombstone in progress.
//!
//! The invariant that keeps a get from reading another block's bytes: a
//! slot goes back to the free list only when no one holds a pin on it, and
//! whoever takes a slot out of use (a remove, a corrupt read, a put whose
//! key was removed while it wrote) writes its tombstone while holding a pin.
//! So a slot is rewritten only after every read of it ended and its old
//! block can no longer come back after a reopen.

use std::collections::HashMap;

use foldhash::fast::RandomState;

use crate::{BlockRef, Checksum, Lineage, StoreError};

#[derive(Debug)]
pub(crate) struct Index {
    entries: HashMap<u128, Entry, RandomState>,
    /// Slots used before and free now; popped from the back.
    free: Vec<u32>,
    /// Slots from here to the capacity were never used.
    fresh: u32,
    capacity: u32,
    pins: HashMap<u32, Pin, RandomState>,
    /// Numbers puts: the header records it, so of two slots with one key
    /// the later put wins at a reopen, and a put that finds its key removed
    /// and put again meanwhile does not publish the other put's entry.
    next_seq: u64,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    pub(crate) slot: u32,
    pub(crate) checksum: Checksum,
    pub(crate) seq: u64,
    /// The rest of the block's hash, as its header keeps it.
    pub(crate) lineage: Lineage,
    /// The bytes are on disk (the put's write has ended).
    pub(crate) ready: bool,
}

#[derive(Debug)]
struct Pin {
    holders: u32,
    /// Out of use: free it when the last holder lets go.
    orphaned: bool,
}

/// What a put decided for one block.
#[derive(Debug)]
pub(crate) enum Claim {
    /// Write the block into this slot, then [`Index::publish`].
    Write { slot: u32, seq: u64 },
    /// Nothing to write (already stored with these bytes), or refused.
    Done(Result<(), StoreError>),
}

impl Index {
    /// An index of the blocks a reopen found: `free` holds the unused slots
    /// below `fresh`.
    pub(crate) fn new(
        capacity: u32,
        entries: HashMap<u128, Entry, RandomState>,
        mut free: Vec<u32>,
        fresh: u32,
        next_seq: u64,
    ) -> Self {
        // The lowest slots are used first.
        free.sort_unstable_by(|a, b| b.cmp(a));
        Self {
            entries,
            free,
            fresh,
            capacity,
            pins: HashMap::default(),
            next_seq,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity as usize
    }

    pub(crate) fn contains(&self, key: u128) -> bool {
        self.entries.get(&key).is_some_and(|entry| entry.ready)
    }

    /// Every readable block's whole hash.
    pub(crate) fn hashes(&self) -> Vec<kvbm_blocks::SequenceHash> {
        self.entries
            .iter()
            .filter(|(_, entry)| entry.ready)
            .map(|(key, entry)| entry.lineage.hash(*key))
            .collect()
    }

    pub(crate) fn keys(&self) -> Vec<u128> {
        self.entries
            .iter()
            .filter(|(_, entry)| entry.ready)
            .map(|(key, _)| *key)
            .collect()
    }

    pub(crate) fn claim(&mut self, block: &BlockRef<'_>, block_bytes: usize) -> Claim {
        if let Err(err) = block.check_len(block_bytes) {
            return Claim::Done(Err(err));
        }
        if let Some(entry) = self.entries.get(&block.key) {
            return Claim::Done(block.against_stored(entry.checksum));
        }
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None if self.fresh < self.capacity => {
                self.fresh += 1;
                self.fresh - 1
            }
            None => {
                return Claim::Done(Err(StoreError::Full {
                    capacity: self.capacity(),
                }));
            }
        };
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.entries.insert(
            block.key,
            Entry {
                slot,
                checksum: block.checksum,
                seq,
                lineage: block.lineage,
                ready: false,
            },
        );
        Claim::Write { slot, seq }
    }

    /// Ends a put's write. `Ok(true)`: the entry is readable. `Ok(false)`:
    /// the key was removed while it was written, and `Err`: the write
    /// failed; in both the slot is pinned for the caller, who writes a
    /// tombstone over it and [`release`](Self::release)s it.
    pub(crate) fn publish(&mut self, key: u128, slot: u32, seq: u64, written: bool) -> bool {
        let ours = self
            .entries
            .get(&key)
            .is_some_and(|entry| entry.seq == seq && entry.slot == slot);
        if ours && written {
            if let Some(entry) = self.entries.get_mut(&key) {
                entry.ready = true;
            }
            return true;
        }
        if ours {
            self.entries.remove(&key);
        }
        self.pin(slot);
        self.orphan(slot);
        false
    }

    /// The readable entry of `key`, its slot pinned until
    /// [`release`](Self::release).
    pub(crate) fn pin_ready(&mut self, key: u128) -> Option<Entry> {
        let entry = *self.entries.get(&key).filter(|entry| entry.ready)?;
        self.pin(entry.slot);
        Some(entry)
    }

    /// Removes `key`. A readable entry's slot comes back pinned (write its
    /// tombstone, then release it); an entry still being written is left to
    /// its put, which finds it gone.
    pub(crate) fn remove(&mut self, key: u128) -> Option<u32> {
        let entry = self.entries.remove(&key)?;
        if !entry.ready {
            return None;
        }
        self.pin(entry.slot);
        self.orphan(entry.slot);
        Some(entry.slot)
    }

    /// Drops `entry` of `key` (read from its slot, pinned by the caller,
    /// and found corrupt) if it is still the key's entry; whether it was.
    pub(crate) fn drop_entry(&mut self, key: u128, entry: &Entry) -> bool {
        let ours = self
            .entries
            .get(&key)
            .is_some_and(|now| now.seq == entry.seq && now.slot == entry.slot);
        if ours {
            self.entries.remove(&key);
            self.orphan(entry.slot);
        }
        ours
    }

    fn pin(&mut self, slot: u32) {
        let pin = self.pins.entry(slot).or_insert(Pin {
            holders: 0,
            orphaned: false,
        });
        pin.holders = pin.holders.saturating_add(1);
    }

    fn orphan(&mut self, slot: u32) {
        if let Some(pin) = self.pins.get_mut(&slot) {
            pin.orphaned = true;
        }
    }

    /// Lets go of a pin on `slot`; the last one frees an orphaned slot.
    pub(crate) fn release(&mut self, slot: u32) {
        let Some(pin) = self.pins.get_mut(&slot) else {
            return;
        };
        pin.holders = pin.holders.saturating_sub(1);
        if pin.holders == 0 {
            let orphaned = pin.orphaned;
            self.pins.remove(&slot);
            if orphaned {
                self.free.push(slot);
            }
        }
    }
}
