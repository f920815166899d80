//! [`BlockHash`]: a block's identity on the wire, an integer or bytes.

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

/// A block hash as vLLM sends it: its SHA-256 digest bytes by default, or
/// the low 64 bits as an integer (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`).
/// Routers treat it as an opaque id (they hash the tokens themselves to
/// match queries), so either form works as long as one engine sticks to one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
