//! What `decode` makes of events vLLM does not write but a peer may send:
//! keys in any order, fields kvbm does not know, fields missing, twice or
//! of the wrong type, and values nested deep enough to exhaust a stack.

use kvbm_events::{BlockHash, BlockRemoved, BlockStored, EventError, KvEvent, WireGroup, decode};

use crate::msgpack::{Value, batch, fields, map, str, uints};

/// A `BlockStored` with every field set.
fn stored() -> KvEvent {
    let mut stored = BlockStored::new(
        vec![BlockHash::Int(11), BlockHash::Bytes(vec![1, 2].into())],
        Some(BlockHash::Int(10)),
        (1..=8).collect(),
        4,
    )
    .with_medium("GPU")
    .with_lora_name("adapter-a");
    stored.lora_id = Some(-1);
    KvEvent::BlockStored(stored)
}

/// The events decoded from a batch of `events`, or the error's message.
fn decoded(events: Vec<Value>) -> Result<Vec<KvEvent>, String> {
    match decode(&batch(events)) {
        Ok(batch) => Ok(batch.events().to_vec()),
        Err(error @ EventError::Decode(_)) => Err(error.to_string()),
        Err(other) => panic!("not a decode error: {other:?}"),
    }
}

/// `event` with `fields` (name and value) in this order.
fn event(fields: &[(&str, Value)]) -> Value {
    map(fields.to_vec())
}

#[test]
fn the_type_may_come_anywhere_among_the_fields() {
    let expected = stored();
    let in_order: Vec<_> = (fields(&expected).into_iter())
        .map(|(name, value, _)| (name, value))
        .collect();
    for at in 0..in_order.len() {
        let mut rotated = in_order.clone();
        rotated.rotate_left(at);
        assert_eq!(
            decoded(vec![event(&rotated)]),
            Ok(vec![expected.clone()]),
            "type at {}",
            (in_order.len() - at) % in_order.len()
        );
        rotated.reverse();
        assert_eq!(decoded(vec![event(&rotated)]), Ok(vec![expected.clone()]));
    }
}

#[test]
fn optional_fields_left_out_read_as_none() {
    let bare = event(&[
        ("token_ids", uints([1, 2])),
        ("block_size", Value::UInt(2)),
        ("block_hashes", uints([5])),
        ("type", str("BlockStored")),
    ]);
    let removed = event(&[("block_hashes", uints([5])), ("type", str("BlockRemoved"))]);
    assert_eq!(
        decoded(vec![bare, removed]),
        Ok(vec![
            KvEvent::BlockStored(BlockStored::new(
                vec![BlockHash::Int(5)],
                None,
                vec![1, 2],
                2
            )),
            KvEvent::BlockRemoved(BlockRemoved::new(vec![BlockHash::Int(5)])),
        ])
    );
}

/// vLLM's optional `BlockStored` fields, `extra_keys` (per block, a tuple
/// of extra hash keys: LoRA name, multimodal ones, a cache salt) the
/// deepest: batch > events > event > extra_keys > tuple > a pair in it.
#[test]
fn a_vllm_like_event_with_nested_extra_keys_decodes() {
    let mm_hash = Value::Array(vec![str("mm-0f3a"), Value::UInt(12)]);
    let extra_keys = Value::Array(vec![
        Value::Array(vec![str("adapter-a"), mm_hash.clone(), str("salt")]),
        Value::Nil,
        Value::Array(vec![Value::Array(vec![mm_hash.clone(), mm_hash])]),
    ]);
    let mut vllm: Vec<_> = (fields(&stored()).into_iter())
        .map(|(name, value, _)| (name, value))
        .collect();
    vllm.extend([
        ("extra_keys", extra_keys),
        ("group_idx", Value::UInt(1)),
        ("kv_cache_spec_kind", str("sliding_window")),
        ("kv_cache_spec_sliding_window", Value::UInt(4096)),
        (
            "locality",
            map(vec![("node", str("a")), ("rack", Value::Nil)]),
        ),
        ("ownership", str("local")),
        ("session_id", Value::Bin(vec![0xff; 16])),
        ("lookahead_token_ids", uints([9, 10])),
    ]);
    // The group's fields are kept, the others skipped.
    let group = WireGroup::new("sliding_window", Some(4096));
    let expected = match stored() {
        KvEvent::BlockStored(stored) => KvEvent::BlockStored(stored.with_group(1, &group)),
        other => other,
    };
    assert_eq!(decoded(vec![event(&vllm)]), Ok(vec![expected]));
}

/// Unknown fields are skipped whatever they hold, nil and empty included,
/// and whatever their keys look like next to known ones.
#[test]
fn unknown_fields_of_any_shape_are_skipped() {
    let unknown = [
        Value::Nil,
        Value::Bool(true),
        Value::Int(-5),
        Value::Float(f64::NAN),
        Value::Bin(vec![]),
        Value::Array(vec![]),
        Value::Map(vec![(Value::UInt(1), Value::Array(vec![Value::Nil]))]),
        Value::Map(vec![(Value::Array(vec![]), Value::Map(vec![]))]),
    ];
    for value in unknown {
        let fields = [
            ("Type", value.clone()),
            ("type", str("AllBlocksCleared")),
            ("token_ids_", value.clone()),
            ("", value.clone()),
        ];
        assert_eq!(
            decoded(vec![event(&fields)]),
            Ok(vec![KvEvent::AllBlocksCleared]),
            "{value:?}"
        );
    }
}

/// `check(events, expect)`: the error's message holds `expect`.
fn check(events: Vec<Value>, expect: &str) {
    match decoded(events.clone()) {
        Ok(got) => panic!("{events:?} decoded as {got:?}, expected {expect:?}"),
        Err(message) => assert!(
            message.contains(expect),
            "{events:?}: {message:?} does not say {expect:?}"
        ),
    }
}

#[test]
fn malformed_events_are_refused() {
    let removed = |extra: (&str, Value)| {
        event(&[
            ("type", str("BlockRemoved")),
            ("block_hashes", uints([1])),
            extra,
        ])
    };
    let stored_without = |missing: &str| {
        let all: Vec<_> = (fields(&stored()).into_iter())
            .filter(|(name, _, _)| *name != missing)
            .map(|(name, value, _)| (name, value))
            .collect();
        event(&all)
    };
    check(
        vec![event(&[("block_hashes", uints([1]))])],
        "missing field `type`",
    );
    check(vec![event(&[])], "missing field `type`");
    check(
        vec![event(&[("type", str("BlockMoved"))])],
        "unknown variant `BlockMoved`",
    );
    check(
        vec![event(&[("type", str("blockstored"))])],
        "unknown variant",
    );
    check(
        vec![event(&[("type", Value::UInt(0))])],
        "an event type name",
    );
    check(vec![event(&[("type", Value::Nil)])], "an event type name");
    for field in ["block_hashes", "token_ids", "block_size"] {
        check(
            vec![stored_without(field)],
            &format!("missing field `{field}`"),
        );
    }
    check(
        vec![event(&[
            ("type", str("BlockRemoved")),
            ("medium", Value::Nil),
        ])],
        "missing field `block_hashes`",
    );
    check(
        vec![removed(("block_hashes", uints([2])))],
        "duplicate field `block_hashes`",
    );
    check(
        vec![removed(("type", str("BlockRemoved")))],
        "duplicate field `type`",
    );
    // A known field has its type in any event, the tag before it or after.
    check(vec![removed(("token_ids", str("1, 2")))], "invalid type");
    check(
        vec![event(&[
            ("token_ids", Value::Array(vec![Value::Int(-1)])),
            ("type", str("AllBlocksCleared")),
        ])],
        "invalid value",
    );
    check(
        vec![removed(("block_size", Value::Float(4.0)))],
        "invalid type",
    );
    check(vec![removed(("medium", Value::UInt(1)))], "invalid type");
    // A hash is a non-negative integer or bytes.
    check(
        vec![event(&[
            ("type", str("BlockRemoved")),
            ("block_hashes", Value::Array(vec![Value::Int(-7)])),
        ])],
        "block hash",
    );
    check(
        vec![event(&[
            ("type", str("BlockRemoved")),
            ("block_hashes", Value::Array(vec![Value::Float(7.0)])),
        ])],
        "block hash",
    );
    // An event is a map with string keys.
    check(
        vec![Value::Array(vec![str("AllBlocksCleared")])],
        "event map",
    );
    check(vec![str("AllBlocksCleared")], "event map");
    check(
        vec![Value::Map(vec![
            (str("type"), str("AllBlocksCleared")),
            (Value::UInt(0), Value::Nil),
        ])],
        "a field name",
    );
}

/// A hash is read from any form of bytes, as the `untagged` derive did.
#[test]
fn hashes_are_read_from_bin_str_or_byte_arrays() {
    let removed = event(&[
        ("type", str("BlockRemoved")),
        (
            "block_hashes",
            Value::Array(vec![
                Value::Bin(vec![1, 2]),
                str("ab"),
                uints([1, 2]),
                Value::UInt(u64::MAX),
                Value::Int(3),
            ]),
        ),
    ]);
    let bytes = |b: &[u8]| BlockHash::Bytes(b.to_vec().into());
    assert_eq!(
        decoded(vec![removed]),
        Ok(vec![KvEvent::BlockRemoved(BlockRemoved::new(vec![
            bytes(&[1, 2]),
            bytes(b"ab"),
            bytes(&[1, 2]),
            BlockHash::Int(u64::MAX),
            BlockHash::Int(3),
        ]))])
    );
}

/// `decode(bytes)` on a thread with a 256 KiB stack: deep recursion
/// overflows it and aborts the test binary, where the 2 MiB stack of a
/// test thread might let a regression pass by luck.
fn decode_on_a_small_stack(bytes: Vec<u8>) -> Result<usize, String> {
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || {
            (decode(&bytes).map(|batch| batch.events().len())).map_err(|error| error.to_string())
        })
        .expect("a thread")
        .join()
        .expect("decode does not panic")
}

/// `[1.0, [{"type": "AllBlocksCleared", "extra": [[...[nil]...]]}], nil]`
/// with `depth` arrays under `"extra"`, written byte by byte (a recursive
/// encoder would need the stack this is about).
fn cleared_with_nested_arrays(depth: usize) -> Vec<u8> {
    let mut bytes = batch(vec![event(&[
        ("type", str("AllBlocksCleared")),
        ("extra", Value::Nil),
    ])]);
    let nil = bytes.len() - 2; // the field's nil, before the rank's
    assert_eq!(bytes[nil..], [0xc0, 0xc0]);
    bytes.splice(nil..nil, std::iter::repeat_n(0x91, depth));
    bytes
}

#[test]
fn deep_nesting_in_an_unknown_field_is_refused_on_a_small_stack() {
    for depth in [1_000, 100_000] {
        let refused = decode_on_a_small_stack(cleared_with_nested_arrays(depth));
        assert_eq!(
            refused,
            Err("not a KVEventBatch: depth limit exceeded".to_owned()),
            "{depth} nested arrays"
        );
    }
}

/// The limit: 32 nested arrays or maps, counting the batch's own, its
/// events array and the event map (3 levels), are refused; 31 decode, on
/// a small stack too. vLLM's payloads go five or six deep.
#[test]
fn nesting_up_to_the_depth_limit_decodes_on_a_small_stack() {
    assert_eq!(
        decode_on_a_small_stack(cleared_with_nested_arrays(28)),
        Ok(1)
    );
    assert_eq!(
        decode_on_a_small_stack(cleared_with_nested_arrays(29)),
        Err("not a KVEventBatch: depth limit exceeded".to_owned())
    );
}
