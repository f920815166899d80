//! [`BlockStore`]: one tier's storage of whole blocks by key.

use crate::{BlockRef, Checksum, StoreError};

/// A tier's storage of whole blocks, each filed under its key (the block's
/// [`SequenceHash`](kvbm_blocks::SequenceHash) value), all of one size.
///
/// Calls are batched: one call moves many blocks, and each block gets its
/// own result, so one bad block (a corrupt slot, a dead remote node) fails
/// only itself. A store is shared by the transfer engine's workers: every
/// method takes `&self`.
///
/// Contract, for every implementation (the tests in `tests/it/contract.rs`
/// run it against each):
/// - [`put`](Self::put) of a key already stored with the same checksum
///   succeeds and changes nothing; with another checksum it is
///   [`StoreError::Collision`] and the stored block is kept.
/// - [`get`](Self::get) returns the checksum stored with the bytes; a store
///   whose medium can rot or tear (disk, remote) verifies it before
///   answering, and returns [`StoreError::Corrupt`] instead of bytes that do
///   not verify.
/// - A failed put leaves the key absent (or as it was), never half-written
///   and readable.
/// - Nothing a caller passes panics: a buffer of the wrong length is
///   [`StoreError::WrongSize`].
pub trait BlockStore: Send + Sync + std::fmt::Debug {
    /// Every block's size in bytes.
    fn block_bytes(&self) -> usize;

    /// Blocks it can hold at once.
    fn capacity(&self) -> usize;

    /// Blocks it holds now.
    fn len(&self) -> usize;

    /// Whether it holds no block.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stores each block; one result per block, in order.
    fn put(&self, blocks: &[BlockRef<'_>]) -> Vec<Result<(), StoreError>>;

    /// Reads the block of each key into the buffer beside it (each the
    /// store's block size long); one result per key, in order, with the
    /// checksum stored with the bytes.
    fn get(&self, reads: &mut [(u128, &mut [u8])]) -> Vec<Result<Checksum, StoreError>>;

    /// Whether each key is stored.
    fn contains(&self, keys: &[u128]) -> Vec<bool>;

    /// Removes each key; one result per key: whether it was stored.
    fn remove(&self, keys: &[u128]) -> Vec<Result<bool, StoreError>>;

    /// Whether [`get`](Self::get) itself verifies every block's bytes
    /// against its key and checksum before answering (the disk and Redis
    /// stores do; memory does not rot, so the arena does not). The transfer
    /// engine then does not hash the bytes a second time; it verifies
    /// every block read from a store that does not.
    fn verifies_reads(&self) -> bool {
        false
    }

    /// Every key it holds now, so a store can be brought back in line with
    /// its tier after the tier forgot what the store kept (a cleared tier, a
    /// lagging event stream, a restart).
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] from a store that cannot list its keys (the
    /// default), or the medium's error.
    fn keys(&self) -> Result<Vec<u128>, StoreError> {
        Err(StoreError::Config(format!("{self:?} cannot list its keys")))
    }
}
