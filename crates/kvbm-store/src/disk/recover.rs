//! Recovery at open: rebuilds the index from the slots on disk, and drops
//! (and counts) the blocks whose write never completed or that rotted.

use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use foldhash::fast::RandomState;
use tracing::warn;

use super::files::{SlotFiles, read_slot_with};
use super::index::{Entry, Index};
use super::layout::{Geometry, HEADER, Header, SlotHeader};
use crate::{Checksum, StoreError};

/// What opening a [`DiskStore`](crate::DiskStore) found in its directory.
///
/// Recovery tells apart what it can: a slot cut short by the end of its
/// file, or with bytes behind an empty header, is torn (its write never
/// completed); a header that does not verify, a block whose bytes do not
/// match its checksum, or a slot that cannot be read, is corrupt (a write
/// torn by a power loss can look like either). Every dropped slot gets a
/// tombstone and is free again, so it is counted once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recovery {
    /// The store was created now (its directory held none).
    pub created: bool,
    /// Blocks found whole and served.
    pub blocks: usize,
    /// Slots whose write never completed, dropped.
    pub dropped_torn: usize,
    /// Slots whose header or bytes do not verify, dropped.
    pub dropped_corrupt: usize,
    /// Older copies of a key found in two slots (a crash between a put and
    /// a remove's tombstone), dropped; the later put is kept.
    pub dropped_duplicates: usize,
}

impl Recovery {
    /// Every slot dropped, whatever the reason.
    pub fn dropped(&self) -> usize {
        self.dropped_torn + self.dropped_corrupt + self.dropped_duplicates
    }
}

/// What one slot holds.
enum Found {
    Free,
    Torn,
    Corrupt(String),
    Block(Header),
}

/// Scans every slot file (up to the capacity) and builds the index.
pub(crate) fn recover(
    files: &SlotFiles,
    geometry: &Geometry,
    verify: bool,
    sync: bool,
) -> Result<(Index, Recovery), StoreError> {
    let mut scan = Scan {
        geometry,
        verify,
        block: Vec::new(),
    };
    let mut report = Recovery::default();
    let mut entries: HashMap<u128, Entry, RandomState> = HashMap::default();
    let mut free = Vec::new();
    let mut dropped = Vec::new();
    let mut unused = Vec::new();
    let mut fresh = 0u32;
    let mut next_seq = 0u64;
    for file in 0..geometry.files() {
        let slots = geometry.slots_in_file(file);
        let first = geometry.slot(file, 0);
        let Some(handle) = files.existing(file)? else {
            unused.push((first, first + slots));
            continue;
        };
        let len = handle.metadata()?.len();
        let mut nth = 0;
        while nth < slots {
            let slot = geometry.slot(file, nth);
            let (_, at) = geometry.place(slot);
            if at >= len {
                break;
            }
            fresh = slot + 1;
            nth += 1;
            let found = scan
                .slot(handle, at, len - at)
                .unwrap_or_else(|err| Found::Corrupt(format!("it cannot be read: {err}")));
            let header = match found {
                Found::Free => {
                    free.push(slot);
                    continue;
                }
                Found::Torn => {
                    report.dropped_torn += 1;
                    dropped.push(slot);
                    continue;
                }
                Found::Corrupt(reason) => {
                    warn!(slot, %reason, "dropping a corrupt slot");
                    report.dropped_corrupt += 1;
                    dropped.push(slot);
                    continue;
                }
                Found::Block(header) => header,
            };
            next_seq = next_seq.max(header.seq.saturating_add(1));
            let entry = Entry {
                slot,
                checksum: header.checksum,
                seq: header.seq,
                lineage: header.lineage,
                ready: true,
            };
            match entries.entry(header.key) {
                MapEntry::Vacant(vacant) => {
                    vacant.insert(entry);
                }
                MapEntry::Occupied(mut kept) => {
                    report.dropped_duplicates += 1;
                    if kept.get().seq < entry.seq {
                        dropped.push(kept.insert(entry).slot);
                    } else {
                        dropped.push(slot);
                    }
                }
            }
        }
        unused.push((first + nth, first + slots));
    }
    for (from, to) in unused {
        free.extend(from..to.min(fresh));
    }
    bury(files, &dropped, sync);
    free.extend_from_slice(&dropped);
    report.blocks = entries.len();
    let index = Index::new(geometry.capacity(), entries, free, fresh, next_seq);
    Ok((index, report))
}

/// Writes tombstones over dropped slots, so the next reopen does not count
/// them again; a failure only means it will.
fn bury(files: &SlotFiles, dropped: &[u32], sync: bool) {
    for &slot in dropped {
        if let Err(err) = files.kill(slot) {
            warn!(slot, %err, "cannot write a tombstone over a dropped slot");
        }
    }
    if sync
        && !dropped.is_empty()
        && let Err(err) = files.sync(dropped.iter().copied())
    {
        warn!(%err, "cannot sync the tombstones of dropped slots");
    }
}

/// Reads slots, one buffer for every block.
struct Scan<'a> {
    geometry: &'a Geometry,
    verify: bool,
    block: Vec<u8>,
}

impl Scan<'_> {
    /// What the slot at `at` of `file` holds, `avail` bytes of it in the
    /// file.
    fn slot(&mut self, file: &File, at: u64, avail: u64) -> io::Result<Found> {
        let block_bytes = self.geometry.block_bytes();
        let mut bytes = [0u8; HEADER];
        let in_header = avail.min(HEADER as u64) as usize;
        file.read_exact_at(&mut bytes[..in_header], at)?;
        let in_block = (avail - in_header as u64).min(block_bytes as u64) as usize;
        match SlotHeader::decode(&bytes) {
            SlotHeader::Empty if in_header < HEADER || !self.verify || in_block == 0 => {
                Ok(if bytes.iter().all(|&b| b == 0) {
                    Found::Free
                } else {
                    Found::Torn
                })
            }
            SlotHeader::Empty => {
                let block = self.read(file, at, in_block)?;
                Ok(if block.iter().all(|&b| b == 0) {
                    Found::Free
                } else {
                    Found::Torn
                })
            }
            SlotHeader::Dead => Ok(Found::Free),
            SlotHeader::Bad(_) if in_header < HEADER => Ok(Found::Torn),
            SlotHeader::Bad(reason) => Ok(Found::Corrupt(reason.into())),
            SlotHeader::Live(header) if header.len != block_bytes as u64 => Ok(Found::Corrupt(
                format!("its header declares a block of {} bytes", header.len),
            )),
            SlotHeader::Live(_) if in_block < block_bytes => Ok(Found::Torn),
            SlotHeader::Live(header) if self.verify => {
                let sum = self.hash(file, at, block_bytes, header.key)?;
                Ok(if sum == header.checksum {
                    Found::Block(header)
                } else {
                    Found::Corrupt("its bytes do not match their checksum".into())
                })
            }
            SlotHeader::Live(header) => Ok(Found::Block(header)),
        }
    }

    /// The scan's buffer for `len` bytes.
    fn buffer(&mut self, len: usize) -> io::Result<&mut [u8]> {
        if self.block.len() < len {
            self.block
                .try_reserve_exact(len - self.block.len())
                .map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
            self.block.resize(len, 0);
        }
        Ok(&mut self.block[..len])
    }

    /// The first `len` bytes of the block of the slot at `at`.
    fn read(&mut self, file: &File, at: u64, len: usize) -> io::Result<&[u8]> {
        let block = self.buffer(len)?;
        file.read_exact_at(block, at + HEADER as u64)?;
        Ok(block)
    }

    /// The checksum, as the block `key`, of the `len` bytes of the block of
    /// the slot at `at`, read and hashed as a verified get does.
    fn hash(&mut self, file: &File, at: u64, len: usize, key: u128) -> io::Result<Checksum> {
        let block = self.buffer(len)?;
        read_slot_with(at + HEADER as u64, None, block, Some(key), |parts, at| {
            Ok(rustix::io::preadv(file, parts, at)?)
        })?
        .ok_or_else(|| io::Error::other("a verified read returned no checksum"))
    }
}
