//! [`SlotFiles`]: the slot files, opened when first used, and positional
//! reads and writes of one slot at a time.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::layout::{Geometry, HEADER, dead_header, slot_file_name};

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

    /// Writes `header` and `block` (the store's block size long) into
    /// `slot` with one vectored positional write (`pwritev`): one system
    /// call, and no copy of the block into a staging buffer.
    pub(crate) fn write_slot(
        &self,
        slot: u32,
        header: &[u8; HEADER],
        block: &[u8],
    ) -> io::Result<()> {
        let (file, at) = self.geometry.place(slot);
        let file = self.file(file)?;
        let parts = [IoSlice::new(header), IoSlice::new(block)];
        let wrote = rustix::io::pwritev(file, &parts, at)?;
        // A short write (rare for regular files) is finished by hand.
        let total = HEADER + block.len();
        if wrote < total {
            let (head_done, block_from) = (wrote.min(HEADER), wrote.saturating_sub(HEADER));
            file.write_all_at(&header[head_done..], at + head_done as u64)?;
            file.write_all_at(&block[block_from..], at + (HEADER + block_from) as u64)?;
        }
        Ok(())
    }

    /// Reads `slot`'s header and block with one vectored positional read
    /// (`preadv`), the block straight into the caller's buffer.
    pub(crate) fn read_slot(
        &self,
        slot: u32,
        header: &mut [u8; HEADER],
        block: &mut [u8],
    ) -> io::Result<()> {
        let (file, at) = self.geometry.place(slot);
        let file = self.file(file)?;
        let total = HEADER + block.len();
        let read = {
            let mut parts = [IoSliceMut::new(header), IoSliceMut::new(block)];
            rustix::io::preadv(file, &mut parts, at)?
        };
        if read < total {
            let (head_done, block_from) = (read.min(HEADER), read.saturating_sub(HEADER));
            file.read_exact_at(&mut header[head_done..], at + head_done as u64)?;
            file.read_exact_at(&mut block[block_from..], at + (HEADER + block_from) as u64)?;
        }
        Ok(())
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
