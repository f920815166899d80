//! [`encode`] and [`decode`]: a [`KvEventBatch`] to and from msgpack bytes.

use crate::KvEventBatch;

/// Why a payload could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EventError {
    /// The bytes are not a `KvEventBatch` in msgpack (malformed, truncated,
    /// an unknown event type, a field of the wrong type).
    #[error("not a KVEventBatch: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
    /// The batch could not be written (only for values msgpack cannot
    /// hold; unreachable for batches built from this crate's types).
    #[error("cannot encode the batch: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    /// ZeroMQ refused an operation (an endpoint in use, a closed context).
    #[cfg(feature = "zmq")]
    #[error("zmq: {0}")]
    Transport(#[from] zmq::Error),
    /// A message did not have vLLM's frames (topic, 8-byte sequence number,
    /// payload), or a replay went wrong.
    #[error("protocol: {0}")]
    Protocol(String),
}

/// The msgpack payload of `batch`, as vLLM's encoder lays it out (events as
/// maps with named fields; the batch as an array).
///
/// # Errors
///
/// [`EventError::Encode`] if msgpack cannot hold a value.
pub fn encode(batch: &KvEventBatch) -> Result<Vec<u8>, EventError> {
    Ok(rmp_serde::to_vec_named(batch)?)
}

/// The batch in a msgpack payload from any encoder of vLLM's layout (vLLM
/// itself, or [`encode`]). Optional fields vLLM may add (`group_idx`,
/// `extra_keys`, ...) are ignored.
///
/// # Errors
///
/// [`EventError::Decode`] for bytes that are not such a payload; never
/// panics, whatever the bytes.
pub fn decode(bytes: &[u8]) -> Result<KvEventBatch, EventError> {
    Ok(rmp_serde::from_slice(bytes)?)
}
