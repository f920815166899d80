//! [`SlotFiles`]: the slot files, opened when first used, and positional
//! reads and writes of one slot at a time.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::layout::{Geometry, HEADER, PAGE, dead_header, slot_file_name};
use crate::Checksum;
use crate::block::Summing;

/// Slots one `pwritev` writes at most: three buffers each (header, block,
/// padding) stay under Linux's `IOV_MAX` of 1024.
pub(crate) const RUN_SLOTS: usize = 256;

/// Bytes of a block read, then hashed, at a time when a read verifies it:
/// small enough to still be in the CPU's L2 cache (512 KiB to 2 MiB a core
/// on current x86-64 servers) when it is hashed right after it lands.
///
/// A block of at most this many bytes is read whole and hashed after. A
/// larger one, read whole, has left the cache by the time the hash reads
/// it back: with 4 MiB blocks on this project's AMD EPYC machines, a
/// verified get then ran at 66-71% of a plain read of the same bytes
/// (medians of `benches/benches/stores.rs`); read and hashed piece by
/// piece, at 76-80%. Pieces of 16-64 KiB did worse on 128 KiB blocks (a
/// system call per piece, and the streaming hash's own cost), and pieces
/// of 128 or 512 KiB no better than 256 KiB on 4 MiB blocks.
pub(crate) const READ_CHUNK: usize = 256 << 10;

/// The padding between a block's end and the next slot's start (shorter
/// than a page: the stride rounds header and block up to one).
static ZEROS: [u8; PAGE as usize] = [0; PAGE as usize];

/// One slot of a run to write: its header and its block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SlotWrite<'a> {
    pub(crate) header: &'a [u8; HEADER],
    pub(crate) block: &'a [u8],
}

/// A store's slot files. Each is opened (created if need be) the first time
/// a slot of it is used, and stays open; reads and writes are positional,
/// so threads share one handle without a lock.
#[derive(Debug)]
pub(crate) struct SlotFiles {
    dir: PathBuf,
    geometry: Geometry,
    files: Box<[OnceLock<File>]>,
}

impl SlotFiles {
    pub(crate) fn new(dir: &Path, geometry: Geometry) -> Self {
        // At most MAX_FILES handles, checked with the geometry.
        let files = (0..geometry.files()).map(|_| OnceLock::new()).collect();
        Self {
            dir: dir.to_path_buf(),
            geometry,
            files,
        }
    }

    fn path(&self, file: u32) -> PathBuf {
        self.dir.join(slot_file_name(file))
    }

    /// File `file`, opened or created.
    pub(crate) fn file(&self, file: u32) -> io::Result<&File> {
        let cell = self
            .files
            .get(file as usize)
            .ok_or_else(|| io::Error::other(format!("slot file {file} is past the capacity")))?;
        if let Some(handle) = cell.get() {
            return Ok(handle);
        }
        let handle = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.path(file))?;
        // A thread that raced us set the same file first: ours is dropped.
        let _ = cell.set(handle);
        cell.get()
            .ok_or_else(|| io::Error::other("slot file handle not set"))
    }

    /// File `file` if it exists, opened for reading and writing.
    pub(crate) fn existing(&self, file: u32) -> io::Result<Option<&File>> {
        match std::fs::metadata(self.path(file)) {
            Ok(_) => self.file(file).map(Some),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Writes `bytes` (a header and a block) at the start of `slot`.
    pub(crate) fn write(&self, slot: u32, bytes: &[u8]) -> io::Result<()> {
        let (file, at) = self.geometry.place(slot);
        self.file(file)?.write_all_at(bytes, at)
    }

    /// Writes a run of consecutive slots of one file, `first` and on, each
    /// a header and a block (the store's block size long, straight from the
    /// caller's buffers), with as few vectored positional writes
    /// (`pwritev`) as it takes: one for a run of up to [`RUN_SLOTS`] slots.
    /// One result per slot, in order.
    ///
    /// The zeros between a block's end and the next slot's start (within
    /// the slot's last page) are written too, so the run is one contiguous
    /// range: one system call for a batch instead of one per block, and a
    /// write the page cache takes as a plain sequential one (with large
    /// folios). Written one slot at a time, at a stride that is a page more
    /// than the block, 128 KiB blocks went at 60-80% of a plain write of
    /// the same bytes; as runs, at 90-125%. The last slot's padding is not
    /// written, so a file is as long as a write of its last slot alone
    /// leaves it.
    ///
    /// A write that fails partway fails no block by itself: the slots it
    /// wrote whole stand, and every other slot of the run is written again
    /// alone, so each block gets its own error (a full disk past some
    /// slot fails those slots only), as if each had been written alone.
    ///
    /// A run that crosses its file's end, or a block of another size, is a
    /// caller's bug, answered with an error for each slot, never a panic.
    pub(crate) fn write_run(&self, first: u32, slots: &[SlotWrite<'_>]) -> Vec<io::Result<()>> {
        let (file, at) = self.geometry.place(first);
        let fits = u32::try_from(slots.len())
            .ok()
            .and_then(|n| (first % self.geometry.slots_per_file()).checked_add(n))
            .is_some_and(|end| end <= self.geometry.slots_in_file(file))
            && slots
                .iter()
                .all(|slot| slot.block.len() == self.geometry.block_bytes());
        if !fits {
            return errors(
                slots.len(),
                &io::Error::other("a run of slots that is not whole slots of one file"),
            );
        }
        let handle = match self.file(file) {
            Ok(handle) => handle,
            Err(err) => return errors(slots.len(), &err),
        };
        write_run_with(self.geometry.stride(), at, slots, |parts, at| {
            Ok(rustix::io::pwritev(handle, parts, at)?)
        })
    }

    /// Reads `slot`'s header and block, the block straight into the
    /// caller's buffer, with one vectored positional read (`preadv`); with
    /// `sum`, also the [`Checksum`] of the block's bytes as the block `sum`
    /// (see [`read_slot_with`] for how a large block is read and hashed).
    pub(crate) fn read_slot(
        &self,
        slot: u32,
        header: &mut [u8; HEADER],
        block: &mut [u8],
        sum: Option<u128>,
    ) -> io::Result<Option<Checksum>> {
        let (file, at) = self.geometry.place(slot);
        let file = self.file(file)?;
        read_slot_with(at, Some(header), block, sum, |parts, at| {
            Ok(rustix::io::preadv(file, parts, at)?)
        })
    }

    /// Writes a tombstone over `slot`'s header.
    pub(crate) fn kill(&self, slot: u32) -> io::Result<()> {
        self.write(slot, &dead_header())
    }

    /// Waits until the writes to the files of `slots` are on the disk.
    pub(crate) fn sync(&self, slots: impl IntoIterator<Item = u32>) -> io::Result<()> {
        let mut files: Vec<u32> = slots
            .into_iter()
            .map(|slot| self.geometry.place(slot).0)
            .collect();
        files.sort_unstable();
        files.dedup();
        for file in files {
            self.file(file)?.sync_data()?;
        }
        Ok(())
    }
}

/// `count` copies of `err` (an [`io::Error`] is not `Clone`).
fn errors(count: usize, err: &io::Error) -> Vec<io::Result<()>> {
    (0..count)
        .map(|_| Err(io::Error::new(err.kind(), err.to_string())))
        .collect()
}

/// [`SlotFiles::write_run`] over any positional vectored write `pwritev`
/// (which may write short, as `pwritev(2)` does): slots `stride` bytes
/// apart from `at`, each no longer than the stride, coalesced into writes
/// of up to [`RUN_SLOTS`] slots; the slots a failed write did not cover
/// whole are written again one by one. Unit tests drive it with writes that
/// fail partway.
pub(crate) fn write_run_with(
    stride: u64,
    at: u64,
    slots: &[SlotWrite<'_>],
    mut pwritev: impl FnMut(&[IoSlice<'_>], u64) -> io::Result<usize>,
) -> Vec<io::Result<()>> {
    let mut results = Vec::with_capacity(slots.len());
    let mut parts = Vec::with_capacity(3 * RUN_SLOTS.min(slots.len()));
    for (nth_chunk, chunk) in slots.chunks(RUN_SLOTS).enumerate() {
        let chunk_at = at + (nth_chunk * RUN_SLOTS) as u64 * stride;
        parts.clear();
        for (nth, slot) in chunk.iter().enumerate() {
            parts.push(IoSlice::new(slot.header));
            parts.push(IoSlice::new(slot.block));
            let pad = stride.saturating_sub((HEADER + slot.block.len()) as u64) as usize;
            if nth + 1 < chunk.len() && pad > 0 {
                parts.push(IoSlice::new(&ZEROS[..pad.min(ZEROS.len())]));
            }
        }
        let (done, wrote) = write_all_vectored_at(&mut pwritev, &mut parts, chunk_at);
        for (nth, slot) in chunk.iter().enumerate() {
            let start = nth as u64 * stride;
            let end = start + (HEADER + slot.block.len()) as u64;
            results.push(if wrote.is_ok() || end <= done as u64 {
                Ok(())
            } else {
                // Not written whole: alone now, for its own result.
                let mut alone = [IoSlice::new(slot.header), IoSlice::new(slot.block)];
                write_all_vectored_at(&mut pwritev, &mut alone, chunk_at + start).1
            });
        }
    }
    results
}

/// Writes all of `parts` at `at`, again after a short write or an
/// interruption; how many bytes were written, and whether all were.
fn write_all_vectored_at(
    pwritev: &mut impl FnMut(&[IoSlice<'_>], u64) -> io::Result<usize>,
    mut parts: &mut [IoSlice<'_>],
    at: u64,
) -> (usize, io::Result<()>) {
    let mut left: usize = parts.iter().map(|part| part.len()).sum();
    let mut done = 0usize;
    while left > 0 {
        match pwritev(parts, at + done as u64) {
            Ok(0) => return (done, Err(io::ErrorKind::WriteZero.into())),
            Ok(wrote) if wrote > left => {
                return (
                    done,
                    Err(io::Error::other("a write reported more bytes than asked")),
                );
            }
            Ok(wrote) => {
                done += wrote;
                left -= wrote;
                IoSlice::advance_slices(&mut parts, wrote);
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return (done, Err(err)),
        }
    }
    (done, Ok(()))
}

/// [`SlotFiles::read_slot`] over any positional vectored read `preadv`
/// (which may read short, as `preadv(2)` does): the slot's header (when
/// asked for) and block from `at`, and with `sum` the [`Checksum`] of the
/// block's bytes as the block `sum`.
///
/// A block of up to [`READ_CHUNK`] bytes is read with its header in one
/// call and hashed once it is whole. A larger one is read [`READ_CHUNK`]
/// bytes at a time (the first with the header), each piece hashed into
/// one running checksum right after it lands, while it is in the cache:
/// every byte of the block is hashed once, in order, so the checksum is the
/// block's, as [`Checksum::of`] gives it. Without `sum`, header and block
/// are one read however large the block.
///
/// A file that ends before the block does is [`io::ErrorKind::UnexpectedEof`].
pub(crate) fn read_slot_with(
    at: u64,
    header: Option<&mut [u8; HEADER]>,
    block: &mut [u8],
    sum: Option<u128>,
    mut preadv: impl FnMut(&mut [IoSliceMut<'_>], u64) -> io::Result<usize>,
) -> io::Result<Option<Checksum>> {
    let (first, rest) = match sum {
        Some(_) => block.split_at_mut(READ_CHUNK.min(block.len())),
        None => block.split_at_mut(block.len()),
    };
    let block_at = at + header.as_ref().map_or(0, |header| header.len() as u64);
    match header {
        Some(header) => read_exact_vectored_at(
            &mut preadv,
            &mut [IoSliceMut::new(header), IoSliceMut::new(first)],
            at,
        )?,
        None => read_exact_vectored_at(&mut preadv, &mut [IoSliceMut::new(first)], at)?,
    }
    let Some(key) = sum else {
        return Ok(None);
    };
    if rest.is_empty() {
        return Ok(Some(Checksum::of(key, first)));
    }
    let mut summing = Summing::new(key);
    summing.update(first);
    let mut piece_at = block_at + first.len() as u64;
    for piece in rest.chunks_mut(READ_CHUNK) {
        read_exact_vectored_at(&mut preadv, &mut [IoSliceMut::new(piece)], piece_at)?;
        summing.update(piece);
        piece_at += piece.len() as u64;
    }
    Ok(Some(summing.finish()))
}

/// Fills all of `parts` from `at`, again after a short read or an
/// interruption; a read of nothing before they are full (the file ends) is
/// [`io::ErrorKind::UnexpectedEof`].
fn read_exact_vectored_at(
    preadv: &mut impl FnMut(&mut [IoSliceMut<'_>], u64) -> io::Result<usize>,
    mut parts: &mut [IoSliceMut<'_>],
    at: u64,
) -> io::Result<()> {
    let mut left: usize = parts.iter().map(|part| part.len()).sum();
    let mut done = 0u64;
    while left > 0 {
        match preadv(parts, at + done) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(read) if read > left => {
                return Err(io::Error::other("a read reported more bytes than asked"));
            }
            Ok(read) => {
                done += read as u64;
                left -= read;
                IoSliceMut::advance_slices(&mut parts, read);
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}
