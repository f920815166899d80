//! [`HostArena`]: the host tier's bytes, a preallocated region of
//! fixed-size slots with no allocation per block.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use foldhash::fast::RandomState;

use crate::slots::Slots;
use crate::{BlockRef, BlockStore, Checksum, StoreError};

/// A host-memory block store: `capacity` slots of `block_bytes` bytes,
/// allocated once when it is built (in a few large stripes an engine can
/// register for DMA), an index from key to slot, and a free list.
///
/// Puts and gets copy outside the index's lock; a slot being written is not
/// readable until its copy ends, and a slot being read is not rewritten
/// until the read ends, so a get never returns another block's bytes.
///
/// Memory does not rot the way a disk does, so `get` returns the stored
/// checksum without recomputing it: the transfer engine verifies every load
/// end to end anyway.
///
/// ```
/// use kvbm_store::{BlockRef, BlockStore, HostArena};
/// use kvbm_blocks::SequenceHash;
///
/// let arena = HostArena::new(4, 2)?; // 2 blocks of 4 bytes
/// let block = BlockRef::new(SequenceHash::root(7), &[1, 2, 3, 4]);
/// assert!(arena.put(&[block])[0].is_ok());
/// let mut out = [0u8; 4];
/// let sum = arena.get(&mut [(7, &mut out[..])]).pop().unwrap()?;
/// assert!(sum.verifies(7, &out));
/// assert_eq!(out, [1, 2, 3, 4]);
/// # Ok::<(), kvbm_store::StoreError>(())
/// ```
#[derive(Debug)]
pub struct HostArena {
    slots: Slots,
    index: Mutex<Index>,
}

#[derive(Debug)]
struct Index {
    entries: HashMap<u128, Entry, RandomState>,
    free: Vec<u32>,
    /// Numbers each put's entries, so a put that finds its key removed and
    /// put again meanwhile does not publish the other put's entry.
    next_generation: u64,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    slot: u32,
    checksum: Checksum,
    generation: u64,
    /// The bytes are in the slot (a put's copy has ended).
    ready: bool,
}

impl HostArena {
    /// An arena of `capacity` blocks of `block_bytes` bytes each, allocated
    /// and zeroed now.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for a size of 0, more than `u32::MAX` slots, or
    /// a region that cannot be allocated (refused, never an abort).
    pub fn new(block_bytes: usize, capacity: usize) -> Result<Self, StoreError> {
        let slots = Slots::new(block_bytes, capacity)?;
        let mut free = Vec::new();
        free.try_reserve_exact(capacity)
            .map_err(|err| StoreError::Config(format!("free list: {err}")))?;
        // Popped from the back: the lowest slots are used first.
        free.extend((0..capacity as u32).rev());
        Ok(Self {
            slots,
            index: Mutex::new(Index {
                entries: HashMap::default(),
                free,
                next_generation: 0,
            }),
        })
    }

    fn index(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What a put decided for one block under the index's lock.
enum Claim {
    /// Write the bytes into this slot, then publish the entry.
    Write { slot: u32, generation: u64 },
    /// Nothing to write (already stored with these bytes), or refused.
    Done(Result<(), StoreError>),
}

impl BlockStore for HostArena {
    fn block_bytes(&self) -> usize {
        self.slots.block_bytes()
    }

    fn capacity(&self) -> usize {
        self.slots.len()
    }

    fn len(&self) -> usize {
        self.index().entries.len()
    }

    fn put(&self, blocks: &[BlockRef<'_>]) -> Vec<Result<(), StoreError>> {
        let block_bytes = self.slots.block_bytes();
        let claims: Vec<Claim> = {
            let mut index = self.index();
            blocks
                .iter()
                .map(|block| index.claim(block, block_bytes, self.slots.len()))
                .collect()
        };
        let written: Vec<Result<(), StoreError>> = blocks
            .iter()
            .zip(&claims)
            .map(|(block, claim)| match claim {
                Claim::Write { slot, .. } => self.slots.write(*slot as usize, block.bytes),
                Claim::Done(_) => Ok(()),
            })
            .collect();
        let mut index = self.index();
        blocks
            .iter()
            .zip(claims)
            .zip(written)
            .map(|((block, claim), write)| match claim {
                Claim::Done(result) => result,
                Claim::Write { slot, generation } => {
                    index.publish(block.key, slot, generation, write)
                }
            })
            .collect()
    }

    fn get(&self, reads: &mut [(u128, &mut [u8])]) -> Vec<Result<Checksum, StoreError>> {
        reads
            .iter_mut()
            .map(|(key, into)| {
                if into.len() != self.slots.block_bytes() {
                    return Err(StoreError::WrongSize {
                        expected: self.slots.block_bytes(),
                        got: into.len(),
                    });
                }
                // The slot is locked for reading before the index is let go,
                // so no put can reuse it before the copy ends.
                let index = self.index();
                let entry = match index.entries.get(key) {
                    Some(entry) if entry.ready => *entry,
                    _ => return Err(StoreError::Missing { key: *key }),
                };
                let slot = self.slots.lock_read(entry.slot as usize)?;
                drop(index);
                slot.copy_to(into);
                Ok(entry.checksum)
            })
            .collect()
    }

    fn contains(&self, keys: &[u128]) -> Vec<bool> {
        let index = self.index();
        keys.iter()
            .map(|key| index.entries.get(key).is_some_and(|entry| entry.ready))
            .collect()
    }

    fn remove(&self, keys: &[u128]) -> Vec<Result<bool, StoreError>> {
        let mut index = self.index();
        keys.iter()
            .map(|key| match index.entries.remove(key) {
                // A put still copying frees its slot when it ends.
                Some(entry) if entry.ready => {
                    index.free.push(entry.slot);
                    Ok(true)
                }
                _ => Ok(false),
            })
            .collect()
    }

    fn keys(&self) -> Result<Vec<u128>, StoreError> {
        let index = self.index();
        Ok(index
            .entries
            .iter()
            .filter(|(_, e)| e.ready)
            .map(|(k, _)| *k)
            .collect())
    }
}

impl Index {
    fn claim(&mut self, block: &BlockRef<'_>, block_bytes: usize, capacity: usize) -> Claim {
        if let Err(err) = block.check_len(block_bytes) {
            return Claim::Done(Err(err));
        }
        if let Some(entry) = self.entries.get(&block.key) {
            return Claim::Done(block.against_stored(entry.checksum));
        }
        let Some(slot) = self.free.pop() else {
            return Claim::Done(Err(StoreError::Full { capacity }));
        };
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1);
        self.entries.insert(
            block.key,
            Entry {
                slot,
                checksum: block.checksum,
                generation,
                ready: false,
            },
        );
        Claim::Write { slot, generation }
    }

    /// Ends a put's copy: the entry becomes readable, or, if the copy failed
    /// or the key was removed meanwhile, the slot goes back to the free list.
    fn publish(
        &mut self,
        key: u128,
        slot: u32,
        generation: u64,
        write: Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let ours = self
            .entries
            .get(&key)
            .is_some_and(|entry| entry.generation == generation);
        match write {
            Ok(()) if ours => {
                if let Some(entry) = self.entries.get_mut(&key) {
                    entry.ready = true;
                }
                Ok(())
            }
            Ok(()) => {
                // Removed while it was copied: the remove won.
                self.free.push(slot);
                Ok(())
            }
            Err(err) => {
                if ours {
                    self.entries.remove(&key);
                }
                self.free.push(slot);
                Err(err)
            }
        }
    }
}
