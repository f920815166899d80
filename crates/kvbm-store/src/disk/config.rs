//! [`DiskConfig`]: where a [`DiskStore`](crate::DiskStore) lives, how big it
//! is, and how hard it tries to outlive a power loss.

use std::path::{Path, PathBuf};

/// How to open a [`DiskStore`](crate::DiskStore).
///
/// [`new`](Self::new) takes what has no sensible default (the directory,
/// the block size, the capacity); the rest have defaults a caller changes
/// with the builder methods.
///
/// ```
/// use kvbm_store::DiskConfig;
///
/// let config = DiskConfig::new("/var/cache/kvbm", 64 << 10, 1 << 16)
///     .sync(true)
///     .slots_per_file(4096);
/// assert_eq!(config.capacity_blocks(), 1 << 16);
/// ```
#[derive(Clone, Debug)]
pub struct DiskConfig {
    pub(crate) dir: PathBuf,
    pub(crate) block_bytes: usize,
    pub(crate) capacity_blocks: usize,
    pub(crate) slots_per_file: Option<usize>,
    pub(crate) sync: bool,
    pub(crate) create: bool,
    pub(crate) verify_on_open: bool,
    pub(crate) verify_reads: bool,
}

impl DiskConfig {
    /// A store in `dir` of at most `capacity_blocks` blocks of `block_bytes`
    /// bytes each; by default it creates the directory (and the store) if
    /// there is none, does not sync, and verifies every block when it opens.
    pub fn new(dir: impl Into<PathBuf>, block_bytes: usize, capacity_blocks: usize) -> Self {
        Self {
            dir: dir.into(),
            block_bytes,
            capacity_blocks,
            slots_per_file: None,
            sync: false,
            create: true,
            verify_on_open: true,
            verify_reads: true,
        }
    }

    /// Slots per file for a new store (default: files of about 1 GiB). A
    /// store reopened keeps the value it was created with: it is the
    /// layout of its files.
    #[must_use]
    pub fn slots_per_file(mut self, slots: usize) -> Self {
        self.slots_per_file = Some(slots);
        self
    }

    /// Whether every put and remove waits for its writes to reach the disk
    /// (`fdatasync` of each file it wrote, once per call) before it answers.
    ///
    /// Without it (the default), a block whose put returned survives a crash
    /// of the process (the kernel's page cache holds the write) but not
    /// necessarily a power loss or a kernel crash; a block lost that way is
    /// found torn or absent when the store reopens, never served wrong. A
    /// cache tier usually does not need more.
    #[must_use]
    pub fn sync(mut self, sync: bool) -> Self {
        self.sync = sync;
        self
    }

    /// Whether a missing directory, or one with no store in it, gets a new
    /// store (the default), or is an error.
    #[must_use]
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Whether opening reads and verifies every stored block (the default),
    /// so torn and corrupt blocks are dropped and counted at once. Without
    /// it, opening reads slot headers only (much faster for a large store);
    /// a block whose bytes do not verify is then found by the
    /// [`get`](crate::BlockStore::get) that reads it, which fails with
    /// [`Corrupt`](crate::StoreError::Corrupt) and drops it.
    #[must_use]
    pub fn verify_on_open(mut self, verify: bool) -> Self {
        self.verify_on_open = verify;
        self
    }

    /// Whether a [`get`](crate::BlockStore::get) verifies each block's bytes
    /// against its checksum before answering (the default). Headers are
    /// always checked. Turn it off only for a caller that verifies every
    /// block itself, as the [`TransferEngine`](crate::TransferEngine) does
    /// for a store that does not ([`BlockStore::verifies_reads`](crate::BlockStore::verifies_reads)):
    /// the bytes are then hashed once, by the engine, instead of twice.
    #[must_use]
    pub fn verify_reads(mut self, verify: bool) -> Self {
        self.verify_reads = verify;
        self
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every block's size in bytes.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// Blocks the store holds at most.
    pub fn capacity_blocks(&self) -> usize {
        self.capacity_blocks
    }
}
