//! [`DiskStore`]: the disk tier, fixed-size slots in files under one
//! directory, every block checksummed on disk and verified when read.

mod config;
mod dir;
mod files;
mod index;
mod layout;
mod recover;
#[cfg(test)]
mod tests;

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use tracing::{debug, instrument, warn};

pub use config::DiskConfig;
pub use recover::Recovery;

use files::{SlotFiles, SlotWrite};
use index::{Claim, Entry, Index};
use layout::{Geometry, HEADER, Header, SlotHeader};

use crate::{BlockRef, BlockStore, Checksum, StoreError};

/// A disk block store: up to a configured number of blocks, each in a
/// fixed-size slot of a file under one directory.
///
/// # Layout
///
/// The directory holds `kvbm-disk-store.meta` (the block size, slot stride,
/// slots per file and capacity, checksummed, written once by a temporary
/// file and a rename), a lock file (a second store opening the directory is
/// refused) and slot files `slots-00000.bin`, `slots-00001.bin`, ... Each
/// slot is a 128-byte header (magic, key, the block's [`Checksum`], length,
/// a put sequence number, the block's lineage, and a checksum of the header
/// itself) and the block, rounded up to 4 KiB so slots start on pages. A
/// put writes each slot's header and block straight from the caller's
/// buffer, the slots of a batch that follow one another in a file with one
/// vectored positional write (and the zeros between them); a remove writes
/// a tombstone over the header. Files grow as slots are first used (sparse
/// where a later slot was written first), never past the capacity: the
/// capacity is a bound set by the configuration, not by the disk filling.
///
/// # Reads never return wrong bytes
///
/// A get verifies the header (magic, the key asked for, the put that wrote
/// it) and the block's checksum before it answers; a block that does not
/// verify is [`StoreError::Corrupt`], and is dropped so it is not served
/// again. A slot is claimed for a put under the index's lock and readable
/// only once its write ended; a slot being read is pinned, and a slot is
/// rewritten only after every pin on it is let go and its tombstone is
/// written (so neither a concurrent get nor a reopen sees the old block).
///
/// # Crashes
///
/// Opening a directory with a store in it ([`recovery`](Self::recovery)
/// says what it found) rebuilds the index from the slot headers, verifying
/// each block's bytes unless [`DiskConfig::verify_on_open`] is off: every
/// block whose put completed is found, torn and corrupt slots are dropped
/// and counted, and of two slots with one key the later put wins. A remove
/// whose tombstone could not be written fails with [`StoreError::Io`] and
/// its block may come back after a reopen: harmless, its bytes verify.
/// [`DiskConfig::sync`] says what survives a power loss.
///
/// # Errors of the medium
///
/// A full disk or an I/O error fails the block it happened to (its slot is
/// freed, nothing of it is readable) and the store keeps working.
///
/// ```
/// use kvbm_blocks::SequenceHash;
/// use kvbm_store::{BlockRef, BlockStore, DiskConfig, DiskStore};
///
/// let dir = tempfile::tempdir()?;
/// let store = DiskStore::open(DiskConfig::new(dir.path(), 4, 2))?;
/// let block = BlockRef::new(SequenceHash::root(7), &[1, 2, 3, 4]);
/// assert!(store.put(&[block])[0].is_ok());
/// drop(store);
///
/// // Reopened (after a restart, say): the block is still there.
/// let store = DiskStore::open(DiskConfig::new(dir.path(), 4, 2))?;
/// assert_eq!(store.recovery().blocks, 1);
/// let mut out = [0u8; 4];
/// let sum = store.get(&mut [(7, &mut out[..])]).pop().unwrap()?;
/// assert!(sum.verifies(7, &out));
/// assert_eq!(out, [1, 2, 3, 4]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DiskStore {
    dir: PathBuf,
    geometry: Geometry,
    sync: bool,
    /// Whether a get hashes the block's bytes ([`DiskConfig::verify_reads`]).
    verify_reads: bool,
    files: SlotFiles,
    index: Mutex<Index>,
    recovery: Recovery,
    /// Holds the directory's lock while the store is open.
    _lock: File,
}

impl std::fmt::Debug for DiskStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskStore")
            .field("dir", &self.dir)
            .field("block_bytes", &self.geometry.block_bytes())
            .field("capacity", &self.geometry.capacity())
            .field("slot_stride", &self.geometry.stride())
            .field("slots_per_file", &self.geometry.slots_per_file())
            .field("sync", &self.sync)
            .finish_non_exhaustive()
    }
}

/// Why a slot could not be read as the block asked for.
enum Fault {
    Io(io::Error),
    Corrupt(String),
}

impl From<io::Error> for Fault {
    fn from(err: io::Error) -> Self {
        if err.kind() == io::ErrorKind::UnexpectedEof {
            Self::Corrupt("the slot is cut short".into())
        } else {
            Self::Io(err)
        }
    }
}

impl DiskStore {
    /// Opens the store in `config`'s directory, or creates one there (see
    /// [`DiskConfig::create`]), and recovers what it holds.
    ///
    /// A store reopened with a larger capacity than it was created with
    /// grows to it; its slots per file stay as created.
    ///
    /// # Errors
    ///
    /// - [`StoreError::Config`]: a block size of 0 or past 1 GiB, a capacity
    ///   of 0 or past `u32::MAX`, slots that cannot be addressed, or a
    ///   capacity smaller than the stored store's (it could drop blocks).
    /// - [`StoreError::Directory`]: the directory is missing (and not to be
    ///   created), not a directory, read-only, in use by another open
    ///   store (still so after 200 ms: a store just closed in this process
    ///   can hold the lock an instant longer while another thread spawns a
    ///   child), holds files but no store (foreign), or its metadata is
    ///   corrupt or declares a geometry that cannot work.
    /// - [`StoreError::WrongSize`]: the stored store's blocks are of another
    ///   size.
    #[instrument(level = "debug", skip_all, fields(dir = %config.dir.display()))]
    pub fn open(config: DiskConfig) -> Result<Self, StoreError> {
        let opened = dir::open(&config)?;
        let geometry = opened.geometry;
        let files = SlotFiles::new(&config.dir, geometry);
        let (index, mut recovery) =
            recover::recover(&files, &geometry, config.verify_on_open, config.sync).map_err(
                |err| match err {
                    StoreError::Io(err) => StoreError::Directory {
                        path: config.dir.clone(),
                        reason: format!("cannot open its slot files: {err}"),
                    },
                    other => other,
                },
            )?;
        recovery.created = opened.created;
        if recovery.dropped() > 0 {
            warn!(?recovery, "the disk store dropped torn or corrupt slots");
        }
        debug!(?recovery, "disk store open");
        Ok(Self {
            dir: config.dir,
            geometry,
            sync: config.sync,
            verify_reads: config.verify_reads,
            files,
            index: Mutex::new(index),
            recovery,
            _lock: opened.lock,
        })
    }

    /// What opening found: blocks kept, slots dropped.
    pub fn recovery(&self) -> Recovery {
        self.recovery
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every block it holds, with its whole hash (key and lineage, as the
    /// slot headers keep them): after a restart, what the disk tier's
    /// bookkeeping adopts ([`Tiers::adopt`](kvbm_tiers::Tiers::adopt)) so
    /// the blocks whose writes completed are found again.
    pub fn blocks(&self) -> Vec<kvbm_blocks::SequenceHash> {
        self.index().hashes()
    }

    fn index(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes the claimed blocks (`claims[i]` for `blocks[i]`), each into
    /// its slot with its header, the bytes straight from the caller's
    /// buffers; one result per block, `None` for a block not written (its
    /// claim was `Done`).
    ///
    /// Slots that follow one another in a file are written together, one
    /// run with one vectored write ([`SlotFiles::write_run`]), whatever
    /// order the batch named them in: a batch whose slots were freed
    /// together (a remove of a batch, its slots then taken in reverse
    /// order) is one run. A crash may leave any part of a run on disk (the
    /// page cache writes back in no set order): the header's checksum and
    /// the block's catch a torn slot at recovery or at the get that reads
    /// it, as for a slot written alone.
    fn write(&self, blocks: &[BlockRef<'_>], claims: &[Claim]) -> Vec<Option<io::Result<()>>> {
        let mut order: Vec<(u32, usize)> = Vec::new();
        let mut headers = Vec::new();
        for (at, (block, claim)) in blocks.iter().zip(claims).enumerate() {
            let Claim::Write { slot, seq } = *claim else {
                headers.push([0; HEADER]);
                continue;
            };
            order.push((slot, at));
            headers.push(
                Header {
                    key: block.key,
                    checksum: block.checksum,
                    len: self.geometry.block_bytes() as u64,
                    seq,
                    lineage: block.lineage,
                }
                .encode(),
            );
        }
        order.sort_unstable();
        let mut written: Vec<Option<io::Result<()>>> = blocks.iter().map(|_| None).collect();
        let per_file = self.geometry.slots_per_file();
        let mut rest = &order[..];
        while let Some(&(first, _)) = rest.first() {
            let run = rest
                .iter()
                .enumerate()
                .take_while(|&(nth, &(slot, _))| {
                    u64::from(slot) == u64::from(first) + nth as u64
                        && slot / per_file == first / per_file
                })
                .count();
            let (this, after) = rest.split_at(run);
            rest = after;
            let slots: Vec<SlotWrite<'_>> = this
                .iter()
                .map(|&(_, at)| SlotWrite {
                    header: &headers[at],
                    block: blocks[at].bytes,
                })
                .collect();
            for (&(_, at), result) in this.iter().zip(self.files.write_run(first, &slots)) {
                written[at] = Some(result);
            }
        }
        written
    }

    /// Reads `entry` of `key` into `into` and verifies it.
    fn read(&self, key: u128, entry: &Entry, into: &mut [u8]) -> Result<(), Fault> {
        let mut bytes = [0u8; HEADER];
        // Header and block in one read (a large block verified piece by
        // piece, each hashed as it lands); the block is trusted only once
        // the header says it is this entry's, and its bytes verify.
        let sum = self.files.read_slot(
            entry.slot,
            &mut bytes,
            into,
            self.verify_reads.then_some(key),
        )?;
        match SlotHeader::decode(&bytes) {
            SlotHeader::Live(header) if header.key != key => {
                return Err(Fault::Corrupt(format!(
                    "its slot holds block {:032x}",
                    header.key
                )));
            }
            SlotHeader::Live(header)
                if header.seq != entry.seq
                    || header.checksum != entry.checksum
                    || header.len != into.len() as u64 =>
            {
                return Err(Fault::Corrupt(
                    "its slot's header is not the one its put wrote".into(),
                ));
            }
            SlotHeader::Live(_) => {}
            SlotHeader::Empty => return Err(Fault::Corrupt("its slot's header is empty".into())),
            SlotHeader::Dead => {
                return Err(Fault::Corrupt("its slot holds a tombstone".into()));
            }
            SlotHeader::Bad(reason) => return Err(Fault::Corrupt(reason.into())),
        }
        if sum.is_none_or(|sum| sum == entry.checksum) {
            Ok(())
        } else {
            Err(Fault::Corrupt(
                "its bytes do not match their checksum".into(),
            ))
        }
    }

    /// Writes tombstones over `slots` (pinned by the caller), synced if the
    /// store syncs.
    fn bury(&self, slots: &[u32]) -> Vec<io::Result<()>> {
        let mut results: Vec<io::Result<()>> =
            slots.iter().map(|&slot| self.files.kill(slot)).collect();
        if self.sync
            && !slots.is_empty()
            && let Err(err) = self.files.sync(slots.iter().copied())
        {
            for result in results.iter_mut().filter(|result| result.is_ok()) {
                *result = Err(io::Error::new(err.kind(), err.to_string()));
            }
        }
        results
    }

    /// Tombstones and frees slots taken out of use by a put or a get;
    /// a tombstone that cannot be written is only logged (the slot's block
    /// may come back after a reopen, verified).
    fn retire(&self, slots: &[u32]) {
        if slots.is_empty() {
            return;
        }
        for (slot, result) in slots.iter().zip(self.bury(slots)) {
            if let Err(err) = result {
                warn!(slot, %err, "cannot write a tombstone");
            }
        }
        let mut index = self.index();
        for &slot in slots {
            index.release(slot);
        }
    }

    fn get_one(&self, key: u128, into: &mut [u8]) -> Result<Checksum, StoreError> {
        if into.len() != self.geometry.block_bytes() {
            return Err(StoreError::WrongSize {
                expected: self.geometry.block_bytes(),
                got: into.len(),
            });
        }
        let Some(entry) = self.index().pin_ready(key) else {
            return Err(StoreError::Missing { key });
        };
        let read = self.read(key, &entry, into);
        let mut index = self.index();
        match read {
            Ok(()) => {
                index.release(entry.slot);
                Ok(entry.checksum)
            }
            Err(Fault::Io(err)) => {
                index.release(entry.slot);
                into.fill(0);
                Err(StoreError::Io(err))
            }
            Err(Fault::Corrupt(reason)) => {
                into.fill(0);
                if !index.drop_entry(key, &entry) {
                    // Removed (and perhaps its slot tombstoned) meanwhile.
                    index.release(entry.slot);
                    return Err(StoreError::Missing { key });
                }
                drop(index);
                warn!(key = %format_args!("{key:032x}"), slot = entry.slot, %reason, "dropping a corrupt block");
                self.retire(&[entry.slot]);
                Err(StoreError::Corrupt { key, reason })
            }
        }
    }
}

impl BlockStore for DiskStore {
    fn block_bytes(&self) -> usize {
        self.geometry.block_bytes()
    }

    fn capacity(&self) -> usize {
        self.geometry.capacity() as usize
    }

    fn len(&self) -> usize {
        self.index().len()
    }

    fn put(&self, blocks: &[BlockRef<'_>]) -> Vec<Result<(), StoreError>> {
        let block_bytes = self.geometry.block_bytes();
        let claims: Vec<Claim> = {
            let mut index = self.index();
            blocks
                .iter()
                .map(|block| index.claim(block, block_bytes))
                .collect()
        };
        let mut written = self.write(blocks, &claims);
        if self.sync {
            let slots =
                claims
                    .iter()
                    .zip(&written)
                    .filter_map(|(claim, write)| match (claim, write) {
                        (Claim::Write { slot, .. }, Some(Ok(()))) => Some(*slot),
                        _ => None,
                    });
            if let Err(err) = self.files.sync(slots) {
                for write in written.iter_mut().flatten().filter(|write| write.is_ok()) {
                    *write = Err(io::Error::new(err.kind(), err.to_string()));
                }
            }
        }
        let mut retired = Vec::new();
        let results = {
            let mut index = self.index();
            blocks
                .iter()
                .zip(claims)
                .zip(written)
                .map(|((block, claim), write)| match claim {
                    Claim::Write { slot, seq } => {
                        let write = write
                            .unwrap_or_else(|| Err(io::Error::other("the block was not written")));
                        if index.publish(block.key, slot, seq, write.is_ok()) {
                            return Ok(());
                        }
                        // Failed, or removed while it was written: the
                        // remove won.
                        retired.push(slot);
                        write.map_err(StoreError::Io)
                    }
                    Claim::Done(result) => result,
                })
                .collect()
        };
        self.retire(&retired);
        results
    }

    fn get(&self, reads: &mut [(u128, &mut [u8])]) -> Vec<Result<Checksum, StoreError>> {
        reads
            .iter_mut()
            .map(|(key, into)| self.get_one(*key, into))
            .collect()
    }

    fn contains(&self, keys: &[u128]) -> Vec<bool> {
        let index = self.index();
        keys.iter().map(|&key| index.contains(key)).collect()
    }

    fn remove(&self, keys: &[u128]) -> Vec<Result<bool, StoreError>> {
        let mut buried = Vec::new();
        let mut results: Vec<Result<bool, StoreError>> = {
            let mut index = self.index();
            keys.iter()
                .enumerate()
                .map(|(at, &key)| match index.remove(key) {
                    Some(slot) => {
                        buried.push((at, slot));
                        Ok(true)
                    }
                    // Absent, or still being written (its put frees it).
                    None => Ok(false),
                })
                .collect()
        };
        if buried.is_empty() {
            return results;
        }
        let slots: Vec<u32> = buried.iter().map(|&(_, slot)| slot).collect();
        for (&(at, _), result) in buried.iter().zip(self.bury(&slots)) {
            if let Err(err) = result {
                results[at] = Err(StoreError::Io(err));
            }
        }
        let mut index = self.index();
        for slot in slots {
            index.release(slot);
        }
        results
    }

    fn keys(&self) -> Result<Vec<u128>, StoreError> {
        Ok(self.index().keys())
    }

    /// Unless [`DiskConfig::verify_reads`] is off: a get then checks the
    /// slot's header only, and the caller verifies the bytes.
    fn verifies_reads(&self) -> bool {
        self.verify_reads
    }
}
