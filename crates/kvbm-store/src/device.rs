//! [`DeviceMemory`]: the engine's KV memory on the device, as the data plane
//! sees it.

use kvbm_blocks::BlockId;

use crate::StoreError;

/// The engine's device memory (G1): it copies a device block to or from a
/// host buffer. An engine implements it over its KV cache tensors (a
/// `cudaMemcpyAsync` and a wait, say); tests implement it with plain memory
/// ([`HostDevice`]).
///
/// Blocks are named by the device pool's [`BlockId`]s, as the tiers' transfer
/// plans name them; every buffer is [`block_bytes`](Self::block_bytes) long.
pub trait DeviceMemory: Send + Sync + std::fmt::Debug {
    /// Every block's size in bytes.
    fn block_bytes(&self) -> usize;

    /// Copies device block `block` into `into`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Device`] for a block the device does not have or a copy
    /// that failed; [`StoreError::WrongSize`] for a buffer of another length.
    fn read(&self, block: BlockId, into: &mut [u8]) -> Result<(), StoreError>;

    /// Copies `from` into device block `block`.
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    fn write(&self, block: BlockId, from: &[u8]) -> Result<(), StoreError>;
}

/// A [`DeviceMemory`] in plain host memory: what tests and the simulator use
/// in place of a GPU, with helpers for a fake engine whose KV for each block
/// is [`fake_kv`](crate::fake_kv) of the block's hash.
#[derive(Debug)]
pub struct HostDevice {
    slots: crate::slots::Slots,
}

impl HostDevice {
    /// `blocks` device blocks of `block_bytes` bytes, zeroed.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for a size of 0 or one that cannot be
    /// allocated.
    pub fn new(block_bytes: usize, blocks: usize) -> Result<Self, StoreError> {
        Ok(Self {
            slots: crate::slots::Slots::new(block_bytes, blocks)?,
        })
    }

    /// Device blocks it has.
    pub fn blocks(&self) -> usize {
        self.slots.len()
    }

    /// Writes the fake engine's KV of `key` into `block`, as a forward pass
    /// that computed that block would.
    ///
    /// # Errors
    ///
    /// [`StoreError::Device`] for a block past the device.
    pub fn compute(&self, block: BlockId, key: u128) -> Result<(), StoreError> {
        let mut bytes = vec![0; self.slots.block_bytes()];
        crate::fake_kv(key, &mut bytes);
        self.write(block, &bytes)
    }

    /// Whether `block` holds exactly the fake engine's KV of `key`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Device`] for a block past the device.
    pub fn holds(&self, block: BlockId, key: u128) -> Result<bool, StoreError> {
        let mut bytes = vec![0; self.slots.block_bytes()];
        self.read(block, &mut bytes)?;
        let mut expected = vec![0; self.slots.block_bytes()];
        crate::fake_kv(key, &mut expected);
        Ok(bytes == expected)
    }
}

impl DeviceMemory for HostDevice {
    fn block_bytes(&self) -> usize {
        self.slots.block_bytes()
    }

    fn read(&self, block: BlockId, into: &mut [u8]) -> Result<(), StoreError> {
        self.slots
            .read(block.index(), into)
            .map_err(|err| device_error(block, err))
    }

    fn write(&self, block: BlockId, from: &[u8]) -> Result<(), StoreError> {
        self.slots
            .write(block.index(), from)
            .map_err(|err| device_error(block, err))
    }
}

fn device_error(block: BlockId, err: StoreError) -> StoreError {
    match err {
        StoreError::Config(reason) => {
            StoreError::Device(format!("block {}: {reason}", block.get()))
        }
        other => other,
    }
}
