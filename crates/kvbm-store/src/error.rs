//! [`StoreError`].

use std::path::PathBuf;
use std::time::Duration;

/// What a store, the device or the transfer engine refuses or fails at.
///
/// Errors about one block ([`WrongSize`](Self::WrongSize),
/// [`Full`](Self::Full), [`Collision`](Self::Collision),
/// [`Corrupt`](Self::Corrupt), [`Io`](Self::Io), [`Timeout`](Self::Timeout),
/// [`Remote`](Self::Remote)) fail that block only: the transfer that carried
/// it fails, the request recomputes, and every other block is untouched.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A configuration that cannot work (a block size of 0, no slots, a
    /// capacity past what the store can address).
    #[error("invalid store configuration: {0}")]
    Config(String),
    /// A directory the disk store cannot use: missing, not a directory,
    /// read-only, or holding files that are not a disk store's.
    #[error("directory {path}: {reason}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A store opened with another block size than it was created with, or
    /// a buffer of another length than the store's blocks.
    #[error("block of {got} bytes, the store's blocks are {expected} bytes")]
    WrongSize {
        /// The store's block size in bytes.
        expected: usize,
        /// What was given.
        got: usize,
    },
    /// No free slot for another block.
    #[error("store full ({capacity} blocks)")]
    Full {
        /// The store's capacity in blocks.
        capacity: usize,
    },
    /// The key is not stored.
    #[error("block {key:032x} is not stored")]
    Missing {
        /// The block's hash value.
        key: u128,
    },
    /// The key is stored with other bytes: the stored block is kept.
    #[error("block {key:032x} is already stored with other bytes")]
    Collision {
        /// The block's hash value.
        key: u128,
    },
    /// The bytes read do not verify against the block's key and checksum.
    #[error("block {key:032x} does not verify: {reason}")]
    Corrupt {
        /// The block's hash value.
        key: u128,
        /// What did not match.
        reason: String,
    },
    /// An I/O error of the medium (a full disk, a failed read).
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The medium did not answer in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// A remote store refused or failed the call.
    #[error("remote store: {0}")]
    Remote(String),
    /// The device could not copy the block (an engine's own error).
    #[error("device: {0}")]
    Device(String),
    /// The transfer engine is shut down or its queue is full.
    #[error("transfer engine: {0}")]
    Engine(String),
}

impl StoreError {
    /// Whether the error is about one block only (the store keeps working),
    /// as opposed to the store or its configuration.
    pub fn is_per_block(&self) -> bool {
        !matches!(
            self,
            Self::Config(_) | Self::Directory { .. } | Self::Engine(_)
        )
    }
}
