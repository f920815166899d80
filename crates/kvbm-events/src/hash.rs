//! [`BlockHash`]: a block's identity on the wire, an integer or bytes.

use std::fmt;

use serde::Serialize;
use serde::de::{self, Deserialize, Deserializer, SeqAccess, Visitor};
use serde_bytes::ByteBuf;

/// A block hash as vLLM sends it: its SHA-256 digest bytes by default, or
/// the low 64 bits as an integer (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`).
/// Routers treat it as an opaque id (they hash the tokens themselves to
/// match queries), so either form works as long as one engine sticks to one.
///
/// Read from a non-negative integer, or from bytes: a bin, a str or an
/// array of byte values (what serde's `untagged` derive accepted), each
/// straight into its variant without buffering.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(untagged)]
pub enum BlockHash {
    /// An integer hash (msgpack int).
    Int(u64),
    /// A byte-string hash (msgpack bin).
    Bytes(ByteBuf),
}

/// How kvbm's 128-bit chained hash values go on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HashForm {
    /// All 16 bytes, big-endian, as a byte string: no information lost.
    #[default]
    Bytes,
    /// The low 64 bits as an integer, for consumers that only take ints
    /// (collisions then become possible around 2^32 cached blocks).
    Int64,
}

impl BlockHash {
    /// The wire form of a kvbm chained hash value.
    pub fn from_value(value: u128, form: HashForm) -> Self {
        match form {
            HashForm::Bytes => BlockHash::Bytes(ByteBuf::from(value.to_be_bytes().to_vec())),
            HashForm::Int64 => BlockHash::Int(value as u64),
        }
    }
}

impl<'de> Deserialize<'de> for BlockHash {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(HashVisitor)
    }
}

/// [`BlockHash`] from whichever form comes: an `untagged` derive would
/// buffer each hash as a generic `Content` value first (32 bytes for every
/// element of an array of bytes).
struct HashVisitor;

impl<'de> Visitor<'de> for HashVisitor {
    type Value = BlockHash;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a block hash (an unsigned integer or bytes)")
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<BlockHash, E> {
        Ok(BlockHash::Int(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<BlockHash, E> {
        match u64::try_from(value) {
            Ok(value) => Ok(BlockHash::Int(value)),
            Err(_) => Err(E::invalid_value(de::Unexpected::Signed(value), &self)),
        }
    }

    fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<BlockHash, E> {
        Ok(BlockHash::Bytes(ByteBuf::from(bytes)))
    }

    fn visit_byte_buf<E: de::Error>(self, bytes: Vec<u8>) -> Result<BlockHash, E> {
        Ok(BlockHash::Bytes(ByteBuf::from(bytes)))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<BlockHash, E> {
        self.visit_bytes(text.as_bytes())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<BlockHash, A::Error> {
        // No more preallocated than serde_bytes does for a declared length.
        let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(byte) = seq.next_element::<u8>()? {
            bytes.push(byte);
        }
        Ok(BlockHash::Bytes(ByteBuf::from(bytes)))
    }
}
