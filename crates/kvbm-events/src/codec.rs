//! [`encode`] and [`decode`]: a [`KvEventBatch`] to and from msgpack bytes.

use serde::Deserialize;

use crate::KvEventBatch;

/// How deep [`decode`] follows nested arrays, maps and extension values:
/// rmp-serde counts each level, the batch array the first, and refuses a
/// payload that opens level 32. vLLM's payloads go five or six deep: the
/// batch, its events, an event map, `extra_keys` (a list of per-block
/// tuples), a tuple, what it holds. rmp-serde's default of 1024
/// lets the nested values of a field nobody reads recurse past a debug
/// build's thread stack (2 to 4 KiB a level); the 31 levels allowed here
/// fit in 128 KiB and leave room for fields vLLM may add.
const MAX_DEPTH: usize = 32;

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
/// Nothing of the payload is buffered: each value goes straight into its
/// field (unknown ones are skipped in place), so the heap held is what the
/// decoded types take, at most 4 bytes per byte of tokens (a 1-byte token
/// becomes a `u32`); a length declared huge preallocates at most 1 MiB
/// before its elements come. Payloads nesting 32 arrays or maps deep (the
/// batch's own counted) are refused, so no payload exhausts the stack.
///
/// # Errors
///
/// [`EventError::Decode`] for bytes that are not such a payload (nested
/// too deep among them); never panics, whatever the bytes.
pub fn decode(bytes: &[u8]) -> Result<KvEventBatch, EventError> {
    let mut deserializer = rmp_serde::Deserializer::from_read_ref(bytes);
    deserializer.set_max_depth(MAX_DEPTH);
    Ok(KvEventBatch::deserialize(&mut deserializer)?)
}
