//! A msgpack value built by hand, to write what our encoder never would:
//! fields in any order, fields kvbm does not know, wrong types.

use kvbm_events::{BlockHash, KvEvent};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

/// Any msgpack value.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    Nil,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Bin(Vec<u8>),
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Nil => serializer.serialize_unit(),
            Value::Bool(b) => serializer.serialize_bool(*b),
            Value::Int(i) => serializer.serialize_i64(*i),
            Value::UInt(u) => serializer.serialize_u64(*u),
            Value::Float(f) => serializer.serialize_f64(*f),
            Value::Str(s) => serializer.serialize_str(s),
            Value::Bin(b) => serializer.serialize_bytes(b),
            Value::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Map(entries) => {
                let mut map = serializer.serialize_map(Some(entries.len()))?;
                for (key, value) in entries {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
        }
    }
}

/// A str.
pub(crate) fn str(text: &str) -> Value {
    Value::Str(text.to_owned())
}

/// A map with string keys, in the order given.
pub(crate) fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (str(k), v)).collect())
}

/// An array of unsigned integers.
pub(crate) fn uints(values: impl IntoIterator<Item = u32>) -> Value {
    Value::Array(values.into_iter().map(|v| Value::UInt(v.into())).collect())
}

/// A batch `[1.0, events, nil]` in msgpack.
pub(crate) fn batch(events: Vec<Value>) -> Vec<u8> {
    let batch = Value::Array(vec![Value::Float(1.0), Value::Array(events), Value::Nil]);
    rmp_serde::to_vec(&batch).expect("a msgpack value")
}

fn hash(hash: &BlockHash) -> Value {
    match hash {
        BlockHash::Int(i) => Value::UInt(*i),
        BlockHash::Bytes(b) => Value::Bin(b.to_vec()),
    }
}

fn hashes(list: &[BlockHash]) -> Value {
    Value::Array(list.iter().map(hash).collect())
}

fn text(text: &Option<String>) -> Value {
    text.as_deref().map_or(Value::Nil, str)
}

/// `event`'s fields as vLLM writes them, in vLLM's order, each with
/// whether it is optional (`None` then reads the same left out).
pub(crate) fn fields(event: &KvEvent) -> Vec<(&'static str, Value, bool)> {
    match event {
        KvEvent::BlockStored(s) => {
            let mut fields = vec![
                ("type", str("BlockStored"), false),
                ("block_hashes", hashes(&s.block_hashes), false),
                (
                    "parent_block_hash",
                    s.parent_block_hash.as_ref().map_or(Value::Nil, hash),
                    s.parent_block_hash.is_none(),
                ),
                ("token_ids", uints(s.token_ids.iter().copied()), false),
                ("block_size", Value::UInt(s.block_size.into()), false),
                (
                    "lora_id",
                    s.lora_id.map_or(Value::Nil, Value::Int),
                    s.lora_id.is_none(),
                ),
                ("medium", text(&s.medium), s.medium.is_none()),
                ("lora_name", text(&s.lora_name), s.lora_name.is_none()),
            ];
            // A model's KV cache group, written only when there is one.
            if let Some(group) = s.group_idx {
                fields.push(("group_idx", Value::Int(group), false));
            }
            if s.kv_cache_spec_kind.is_some() {
                fields.push(("kv_cache_spec_kind", text(&s.kv_cache_spec_kind), false));
            }
            if let Some(window) = s.kv_cache_spec_sliding_window {
                fields.push(("kv_cache_spec_sliding_window", Value::Int(window), false));
            }
            fields
        }
        KvEvent::BlockRemoved(r) => {
            let mut fields = vec![
                ("type", str("BlockRemoved"), false),
                ("block_hashes", hashes(&r.block_hashes), false),
                ("medium", text(&r.medium), r.medium.is_none()),
            ];
            if let Some(group) = r.group_idx {
                fields.push(("group_idx", Value::Int(group), false));
            }
            fields
        }
        KvEvent::AllBlocksCleared => vec![("type", str("AllBlocksCleared"), false)],
    }
}
