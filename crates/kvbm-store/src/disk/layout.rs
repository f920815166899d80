//! The on-disk format: the metadata file, slot headers, and where each slot
//! lives in which file.
//!
//! Everything is little-endian and fixed-size. Every field read back from
//! disk is checked (a checksum, then ranges) before it sizes or addresses
//! anything, so a corrupt or hostile file is refused, never trusted.

use twox_hash::XxHash3_64;

use crate::{Checksum, Lineage};

/// The metadata file: the store's geometry, written once (atomically).
pub(crate) const META: &str = "kvbm-disk-store.meta";
/// Where the metadata file is written before it is renamed into place.
pub(crate) const META_TMP: &str = "kvbm-disk-store.meta.tmp";
/// The file a store holds an exclusive lock on while it is open.
pub(crate) const LOCK: &str = "kvbm-disk-store.lock";
/// A file created and removed at open to check the directory is writable.
pub(crate) const PROBE: &str = "kvbm-disk-store.probe";

/// Bytes of a slot's header, before the block's bytes.
pub(crate) const HEADER: usize = 128;
/// Slots start on page boundaries.
pub(crate) const PAGE: u64 = 4096;
/// The largest block a disk store takes: a KV block is megabytes at most,
/// and this bounds every buffer the store allocates.
pub(crate) const MAX_BLOCK_BYTES: usize = 1 << 30;
/// Slot files a store may use at most (each holds a file descriptor once
/// used); a larger store takes more slots per file.
pub(crate) const MAX_FILES: u64 = 4096;
/// The size the default slots-per-file aims at.
const DEFAULT_FILE_BYTES: u64 = 1 << 30;

/// Bytes the metadata file holds; a larger file is not a disk store's.
pub(crate) const META_LEN: usize = 56;
const META_MAGIC: [u8; 8] = *b"KVBMDISK";
/// 2: slot headers of 128 bytes keep the block's lineage (parent, position).
const VERSION: u32 = 2;

const LIVE: [u8; 8] = *b"KVBMBLK2";
const DEAD: [u8; 8] = *b"KVBMDEAD";

/// The name of slot file `file`.
pub(crate) fn slot_file_name(file: u32) -> String {
    format!("slots-{file:05}.bin")
}

/// How a store's slots map onto files, all of it checked to be addressable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    block_bytes: usize,
    /// Bytes from one slot's start to the next: header and block, rounded
    /// up to a page.
    stride: u64,
    slots_per_file: u32,
    capacity: u32,
}

impl Geometry {
    /// The geometry of `capacity` blocks of `block_bytes`, `slots_per_file`
    /// to a file (`None`: files of about 1 GiB), or why it cannot work.
    pub(crate) fn new(
        block_bytes: usize,
        capacity: usize,
        slots_per_file: Option<usize>,
    ) -> Result<Self, String> {
        if block_bytes == 0 || block_bytes > MAX_BLOCK_BYTES {
            return Err(format!(
                "a block size of {block_bytes} bytes: it must be 1 to {MAX_BLOCK_BYTES}"
            ));
        }
        let stride = stride_of(block_bytes);
        let capacity = u32::try_from(capacity)
            .ok()
            .filter(|&capacity| capacity > 0)
            .ok_or_else(|| {
                format!(
                    "a capacity of {capacity} blocks: it must be 1 to {}",
                    u32::MAX
                )
            })?;
        let per_file = match slots_per_file {
            Some(0) => return Err("0 slots per file".into()),
            Some(per_file) => u32::try_from(per_file).unwrap_or(u32::MAX),
            None => u32::try_from((DEFAULT_FILE_BYTES / stride).max(1)).unwrap_or(u32::MAX),
        };
        Self::checked(block_bytes, stride, per_file.min(capacity), capacity)
    }

    /// Checks that the files can be addressed and are not too many.
    fn checked(
        block_bytes: usize,
        stride: u64,
        slots_per_file: u32,
        capacity: u32,
    ) -> Result<Self, String> {
        u64::from(slots_per_file)
            .checked_mul(stride)
            .filter(|&bytes| bytes <= i64::MAX as u64)
            .ok_or_else(|| {
                format!("{slots_per_file} slots of {stride} bytes in one file overflow")
            })?;
        let files = u64::from(capacity).div_ceil(u64::from(slots_per_file));
        if files > MAX_FILES {
            return Err(format!(
                "{capacity} blocks at {slots_per_file} per file take {files} files, \
                 more than {MAX_FILES}: take more slots per file"
            ));
        }
        Ok(Self {
            block_bytes,
            stride,
            slots_per_file,
            capacity,
        })
    }

    /// The same files with room for `capacity` blocks.
    pub(crate) fn with_capacity(self, capacity: usize) -> Result<Self, String> {
        let capacity = u32::try_from(capacity)
            .map_err(|_| format!("a capacity of {capacity} blocks: at most {}", u32::MAX))?;
        Self::checked(self.block_bytes, self.stride, self.slots_per_file, capacity)
    }

    pub(crate) fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    pub(crate) fn stride(&self) -> u64 {
        self.stride
    }

    pub(crate) fn slots_per_file(&self) -> u32 {
        self.slots_per_file
    }

    /// Slot files the capacity spans.
    pub(crate) fn files(&self) -> u32 {
        // At most MAX_FILES, checked when built.
        self.capacity.div_ceil(self.slots_per_file)
    }

    /// Slots of file `file` (the last file may be short).
    pub(crate) fn slots_in_file(&self, file: u32) -> u32 {
        let first = u64::from(file) * u64::from(self.slots_per_file);
        let left = u64::from(self.capacity).saturating_sub(first);
        left.min(u64::from(self.slots_per_file)) as u32
    }

    /// The file of `slot` and the byte offset of the slot in it.
    pub(crate) fn place(&self, slot: u32) -> (u32, u64) {
        let file = slot / self.slots_per_file;
        let nth = slot % self.slots_per_file;
        // Cannot overflow: slots_per_file * stride was checked.
        (file, u64::from(nth) * self.stride)
    }

    /// The slot number of the `nth` slot of `file`.
    pub(crate) fn slot(&self, file: u32, nth: u32) -> u32 {
        // Below the capacity, a u32, for the slots `slots_in_file` counts.
        file * self.slots_per_file + nth
    }

    /// The metadata file's bytes for this geometry.
    pub(crate) fn encode_meta(&self) -> [u8; META_LEN] {
        let mut out = [0u8; META_LEN];
        out[0..8].copy_from_slice(&META_MAGIC);
        out[8..12].copy_from_slice(&VERSION.to_le_bytes());
        out[16..24].copy_from_slice(&(self.block_bytes as u64).to_le_bytes());
        out[24..32].copy_from_slice(&self.stride.to_le_bytes());
        out[32..40].copy_from_slice(&u64::from(self.slots_per_file).to_le_bytes());
        out[40..48].copy_from_slice(&u64::from(self.capacity).to_le_bytes());
        let sum = XxHash3_64::oneshot(&out[..48]);
        out[48..56].copy_from_slice(&sum.to_le_bytes());
        out
    }
}

/// What a metadata file says, once its checksum verifies: the block size
/// stands apart so a mismatch can be told as one.
#[derive(Debug)]
pub(crate) struct Meta {
    pub(crate) block_bytes: u64,
    stride: u64,
    slots_per_file: u64,
    capacity: u64,
}

impl Meta {
    /// Parses a metadata file's bytes, or says why they are not one.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, String> {
        let bytes: &[u8; META_LEN] = bytes
            .try_into()
            .map_err(|_| format!("{} bytes where a disk store writes {META_LEN}", bytes.len()))?;
        if bytes[0..8] != META_MAGIC {
            return Err("not a kvbm disk store's metadata (wrong magic)".into());
        }
        if u64_at(bytes, 48) != XxHash3_64::oneshot(&bytes[..48]) {
            return Err("its checksum does not match (torn or corrupt)".into());
        }
        let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if version != VERSION {
            return Err(format!(
                "format version {version}, this build reads {VERSION}"
            ));
        }
        Ok(Self {
            block_bytes: u64_at(bytes, 16),
            stride: u64_at(bytes, 24),
            slots_per_file: u64_at(bytes, 32),
            capacity: u64_at(bytes, 40),
        })
    }

    /// The geometry it declares, for blocks of `block_bytes` (already
    /// compared with `self.block_bytes` by the caller), checked as a new
    /// one is.
    pub(crate) fn geometry(&self, block_bytes: usize) -> Result<Geometry, String> {
        if self.stride != stride_of(block_bytes) {
            return Err(format!(
                "a slot stride of {} bytes for blocks of {block_bytes}",
                self.stride
            ));
        }
        let per_file = u32::try_from(self.slots_per_file)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{} slots per file", self.slots_per_file))?;
        let capacity = u32::try_from(self.capacity)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("a capacity of {} blocks", self.capacity))?;
        if per_file > capacity {
            return Err(format!("{per_file} slots per file for {capacity} blocks"));
        }
        Geometry::checked(block_bytes, self.stride, per_file, capacity)
    }
}

/// Header and block rounded up to a page (cannot overflow: the block size
/// is at most [`MAX_BLOCK_BYTES`]).
fn stride_of(block_bytes: usize) -> u64 {
    (HEADER as u64 + block_bytes as u64).next_multiple_of(PAGE)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// A live slot's header: whose block it holds and how to verify it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) key: u128,
    pub(crate) checksum: Checksum,
    /// The block's length in bytes (the store's block size, checked).
    pub(crate) len: u64,
    /// Which put wrote it: of two slots with one key, the later wins.
    pub(crate) seq: u64,
    /// The rest of the block's hash.
    pub(crate) lineage: Lineage,
}

/// Where the header's own checksum sits: after everything it covers.
const SEAL: usize = HEADER - 8;

/// What a slot's header says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SlotHeader {
    /// All zeros: never written (or its write never reached the header).
    Empty,
    /// A tombstone: the block was removed.
    Dead,
    /// A block, if its bytes verify.
    Live(Header),
    /// Neither: rot, a torn header, or foreign bytes.
    Bad(&'static str),
}

impl Header {
    /// The header's bytes.
    pub(crate) fn encode(&self) -> [u8; HEADER] {
        let mut out = [0u8; HEADER];
        out[0..8].copy_from_slice(&LIVE);
        out[8..24].copy_from_slice(&self.key.to_le_bytes());
        out[24..32].copy_from_slice(&self.checksum.get().to_le_bytes());
        out[32..40].copy_from_slice(&self.len.to_le_bytes());
        out[40..48].copy_from_slice(&self.seq.to_le_bytes());
        out[48..64].copy_from_slice(&self.lineage.parent.unwrap_or(0).to_le_bytes());
        out[64..68].copy_from_slice(&self.lineage.position.to_le_bytes());
        out[68] = u8::from(self.lineage.parent.is_some());
        seal(&mut out);
        out
    }
}

/// A tombstone: written over a removed block's header.
pub(crate) fn dead_header() -> [u8; HEADER] {
    let mut out = [0u8; HEADER];
    out[0..8].copy_from_slice(&DEAD);
    seal(&mut out);
    out
}

/// Writes the header's checksum over everything before it.
fn seal(out: &mut [u8; HEADER]) {
    let sum = XxHash3_64::oneshot(&out[..SEAL]);
    out[SEAL..].copy_from_slice(&sum.to_le_bytes());
}

impl SlotHeader {
    /// Reads a header's bytes.
    pub(crate) fn decode(bytes: &[u8; HEADER]) -> Self {
        if bytes.iter().all(|&b| b == 0) {
            return Self::Empty;
        }
        let magic = &bytes[0..8];
        if magic != LIVE && magic != DEAD {
            return Self::Bad("the slot header's magic is wrong");
        }
        if u64_at(bytes, SEAL) != XxHash3_64::oneshot(&bytes[..SEAL]) {
            return Self::Bad("the slot header's checksum does not match");
        }
        if magic == DEAD {
            return Self::Dead;
        }
        let u128_at = |at: usize| {
            let mut word = [0u8; 16];
            word.copy_from_slice(&bytes[at..at + 16]);
            u128::from_le_bytes(word)
        };
        let mut position = [0u8; 4];
        position.copy_from_slice(&bytes[64..68]);
        Self::Live(Header {
            key: u128_at(8),
            checksum: Checksum::from_raw(u64_at(bytes, 24)),
            len: u64_at(bytes, 32),
            seq: u64_at(bytes, 40),
            lineage: Lineage {
                parent: (bytes[68] != 0).then(|| u128_at(48)),
                position: u32::from_le_bytes(position),
            },
        })
    }
}
