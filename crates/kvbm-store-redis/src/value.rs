//! The stored value: a 32-byte header, then the block's bytes.
//!
//! | bytes  | what                                         |
//! |--------|----------------------------------------------|
//! | 0..8   | magic `KVBMRB` and format version `\0\x01`   |
//! | 8..24  | the block's key (its hash value), little end |
//! | 24..32 | the caller's [`Checksum`], little end        |
//! | 32..   | the block's bytes                            |
//!
//! The key in the header catches a value filed under the wrong Redis key
//! (a copy by hand, a namespace mix-up); the checksum, recomputed on every
//! read, catches bytes that changed.

use kvbm_store::{Checksum, StoreError};

/// Magic and format version.
const MAGIC: [u8; 8] = *b"KVBMRB\x00\x01";

/// The header's length; `GETRANGE key 0 HEADER_BYTES-1` reads just it.
pub(crate) const HEADER_BYTES: usize = 32;

/// What the header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) key: u128,
    pub(crate) checksum: Checksum,
}

/// The value to store for the block `key`, written straight into a
/// command's buffer (header, then the caller's bytes: no copy of its own).
#[derive(Debug)]
pub(crate) struct Encoded<'a> {
    header: [u8; HEADER_BYTES],
    bytes: &'a [u8],
}

impl<'a> Encoded<'a> {
    pub(crate) fn new(key: u128, checksum: Checksum, bytes: &'a [u8]) -> Self {
        let mut header = [0u8; HEADER_BYTES];
        header[..8].copy_from_slice(&MAGIC);
        header[8..24].copy_from_slice(&key.to_le_bytes());
        header[24..32].copy_from_slice(&checksum.get().to_le_bytes());
        Self { header, bytes }
    }
}

impl redis::ToRedisArgs for Encoded<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        use std::io::Write as _;
        let mut arg = out.writer_for_next_arg();
        // Writing into the command's own buffer cannot fail.
        let _ = arg.write_all(&self.header);
        let _ = arg.write_all(self.bytes);
    }
}

/// The value to store for the block `key`.
#[cfg(test)]
pub(crate) fn encode(key: u128, checksum: Checksum, bytes: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(HEADER_BYTES + bytes.len());
    value.extend_from_slice(&MAGIC);
    value.extend_from_slice(&key.to_le_bytes());
    value.extend_from_slice(&checksum.get().to_le_bytes());
    value.extend_from_slice(bytes);
    value
}

/// Reads a header (the value's first [`HEADER_BYTES`], or more).
pub(crate) fn header(raw: &[u8]) -> Result<Header, String> {
    let Some(head) = raw.get(..HEADER_BYTES) else {
        return Err(format!(
            "value of {} bytes, shorter than its {HEADER_BYTES}-byte header",
            raw.len()
        ));
    };
    if head[..8] != MAGIC {
        return Err("not a kvbm block (bad magic or format version)".to_owned());
    }
    let mut key = [0; 16];
    key.copy_from_slice(&head[8..24]);
    let mut checksum = [0; 8];
    checksum.copy_from_slice(&head[24..32]);
    Ok(Header {
        key: u128::from_le_bytes(key),
        checksum: Checksum::from_raw(u64::from_le_bytes(checksum)),
    })
}

/// Checks the value read for `key` and copies its bytes into `out` (the
/// store's block size long): [`StoreError::Corrupt`] unless the length, the
/// header's key and the checksum all match, and then `out` is untouched.
pub(crate) fn decode(key: u128, raw: &[u8], out: &mut [u8]) -> Result<Checksum, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt { key, reason };
    let header = header(raw).map_err(corrupt)?;
    if header.key != key {
        return Err(corrupt(format!(
            "value is the block {:032x}, filed under this key",
            header.key
        )));
    }
    let bytes = &raw[HEADER_BYTES..];
    if bytes.len() != out.len() {
        return Err(corrupt(format!(
            "{} bytes stored, the store's blocks are {}",
            bytes.len(),
            out.len()
        )));
    }
    if !header.checksum.verifies(key, bytes) {
        return Err(corrupt("bytes do not match their checksum".to_owned()));
    }
    out.copy_from_slice(bytes);
    Ok(header.checksum)
}

#[cfg(test)]
mod tests;
