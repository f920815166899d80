//! [`DiskStore`]: the disk tier (being written; see the helper's task).

use std::path::Path;

use crate::{BlockRef, BlockStore, Checksum, StoreError};

/// A disk block store (not yet implemented: every call fails).
#[derive(Debug)]
pub struct DiskStore {
    block_bytes: usize,
}

impl DiskStore {
    /// Not yet implemented.
    ///
    /// # Errors
    ///
    /// Always [`StoreError::Config`] for now.
    pub fn open(_dir: &Path, block_bytes: usize, _capacity: usize) -> Result<Self, StoreError> {
        let _ = block_bytes;
        Err(StoreError::Config("the disk store is not built yet".into()))
    }
}

impl BlockStore for DiskStore {
    fn block_bytes(&self) -> usize {
        self.block_bytes
    }
    fn capacity(&self) -> usize {
        0
    }
    fn len(&self) -> usize {
        0
    }
    fn put(&self, blocks: &[BlockRef<'_>]) -> Vec<Result<(), StoreError>> {
        blocks
            .iter()
            .map(|_| Err(StoreError::Config("unbuilt".into())))
            .collect()
    }
    fn get(&self, reads: &mut [(u128, &mut [u8])]) -> Vec<Result<Checksum, StoreError>> {
        reads
            .iter()
            .map(|(key, _)| Err(StoreError::Missing { key: *key }))
            .collect()
    }
    fn contains(&self, keys: &[u128]) -> Vec<bool> {
        vec![false; keys.len()]
    }
    fn remove(&self, keys: &[u128]) -> Vec<Result<bool, StoreError>> {
        keys.iter().map(|_| Ok(false)).collect()
    }
}
