//! Arbitrary batches round-trip, as we write them and with their fields
//! shuffled among unknown ones; arbitrary or mangled bytes never panic the
//! decoder.

use kvbm_events::{BlockHash, BlockRemoved, BlockStored, KvEvent, KvEventBatch};
use proptest::prelude::*;

use crate::msgpack::{self, Value};

fn hash() -> impl Strategy<Value = BlockHash> {
    prop_oneof![
        any::<u64>().prop_map(BlockHash::Int),
        prop::collection::vec(any::<u8>(), 0..40).prop_map(|b| BlockHash::Bytes(b.into())),
    ]
}

fn text() -> impl Strategy<Value = Option<String>> {
    prop::option::of("[A-Za-z0-9_-]{0,12}")
}

fn event() -> impl Strategy<Value = KvEvent> {
    let stored = (
        prop::collection::vec(hash(), 0..6),
        prop::option::of(hash()),
        prop::collection::vec(any::<u32>(), 0..40),
        any::<u32>(),
        prop::option::of(any::<i64>()),
        text(),
        text(),
        (
            prop::option::of(any::<i64>()),
            text(),
            prop::option::of(any::<i64>()),
        ),
    )
        .prop_map(
            |(
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_id,
                medium,
                lora_name,
                (group_idx, kind, window),
            )| {
                let mut stored =
                    BlockStored::new(block_hashes, parent_block_hash, token_ids, block_size);
                stored.lora_id = lora_id;
                stored.medium = medium;
                stored.lora_name = lora_name;
                stored.group_idx = group_idx;
                stored.kv_cache_spec_kind = kind;
                stored.kv_cache_spec_sliding_window = window;
                KvEvent::BlockStored(stored)
            },
        );
    let removed = (
        prop::collection::vec(hash(), 0..6),
        text(),
        prop::option::of(any::<i64>()),
    )
        .prop_map(|(block_hashes, medium, group_idx)| {
            let mut removed = BlockRemoved::new(block_hashes);
            removed.medium = medium;
            removed.group_idx = group_idx;
            KvEvent::BlockRemoved(removed)
        });
    prop_oneof![stored, removed, Just(KvEvent::AllBlocksCleared)]
}

/// Any msgpack value, nested up to 6 deep.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::Int),
        any::<u64>().prop_map(Value::UInt),
        any::<f64>().prop_map(Value::Float),
        "[a-z]{0,6}".prop_map(Value::Str),
        prop::collection::vec(any::<u8>(), 0..6).prop_map(Value::Bin),
    ];
    leaf.prop_recursive(6, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((inner.clone(), inner), 0..4).prop_map(Value::Map),
        ]
    })
}

/// The field names kvbm reads.
const KNOWN: [&str; 8] = [
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
];

/// A field kvbm does not read, with any value.
fn unknown_field() -> impl Strategy<Value = (String, Value)> {
    let name =
        "[a-z_]{0,14}".prop_filter("a field kvbm reads", |name| !KNOWN.contains(&name.as_str()));
    (name, value())
}

/// An event, and its map as another encoder of vLLM's layout might write
/// it: fields in any order, optional ones at `None` left out or not
/// (msgspec's `omit_defaults`), unknown fields among them.
fn shuffled_event() -> impl Strategy<Value = (KvEvent, Value)> {
    // One draw per field a store can have (so `zip` drops none).
    let omit = prop::collection::vec(any::<bool>(), 11);
    let unknown = prop::collection::vec(unknown_field(), 0..4);
    (event(), omit, unknown)
        .prop_flat_map(|(event, omit, unknown)| {
            let mut entries: Vec<(Value, Value)> = (msgpack::fields(&event).into_iter())
                .zip(omit)
                .filter(|((_, _, is_none), omit)| !(*is_none && *omit))
                .map(|((name, value, _), _)| (msgpack::str(name), value))
                .collect();
            entries.extend(
                unknown
                    .into_iter()
                    .map(|(name, value)| (Value::Str(name), value)),
            );
            (Just(event), Just(entries).prop_shuffle())
        })
        .prop_map(|(event, entries)| (event, Value::Map(entries)))
}

/// Cases per fuzz test: `KVBM_FUZZ_CASES` (`cargo xtask fuzz --cases N`),
/// else a CI-sized default.
fn cases() -> u32 {
    std::env::var("KVBM_FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(512)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn fuzz_batches_round_trip(
        ts in -1e12f64..1e12,
        events in prop::collection::vec(event(), 0..8),
        rank in prop::option::of(any::<i64>()),
    ) {
        let mut batch = KvEventBatch::new(ts, events);
        if let Some(rank) = rank {
            batch = batch.with_rank(rank);
        }
        let bytes = kvbm_events::encode(&batch).unwrap();
        prop_assert_eq!(kvbm_events::decode(&bytes).unwrap(), batch);
    }

    #[test]
    fn fuzz_shuffled_fields_among_unknown_ones_decode_the_same(
        events in prop::collection::vec(shuffled_event(), 0..6),
    ) {
        let (expected, maps): (Vec<KvEvent>, Vec<Value>) = events.into_iter().unzip();
        let batch = kvbm_events::decode(&msgpack::batch(maps)).unwrap();
        prop_assert_eq!(batch.events(), &expected[..]);
    }

    /// Bytes of a valid payload overwritten here and there: decoded or
    /// refused, never a panic; and what decodes re-encodes to a payload
    /// that decodes to itself.
    #[test]
    fn fuzz_mangled_payloads_decode_or_fail_cleanly(
        events in prop::collection::vec(event(), 1..4),
        writes in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = kvbm_events::encode(&KvEventBatch::new(1.0, events)).unwrap();
        for (at, byte) in writes {
            let at = at.index(bytes.len());
            bytes[at] = byte;
        }
        if let Ok(batch) = kvbm_events::decode(&bytes) {
            let again = kvbm_events::encode(&batch).unwrap();
            let back = kvbm_events::decode(&again).unwrap();
            prop_assert_eq!(kvbm_events::encode(&back).unwrap(), again);
        }
    }

    #[test]
    fn fuzz_arbitrary_bytes_decode_or_fail_cleanly(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = kvbm_events::decode(&bytes);
    }

    /// Truncating a valid payload anywhere is refused, never misread.
    #[test]
    fn fuzz_truncated_payloads_are_refused(
        events in prop::collection::vec(event(), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let bytes = kvbm_events::encode(&KvEventBatch::new(1.0, events)).unwrap();
        let at = cut.index(bytes.len());
        prop_assert!(kvbm_events::decode(&bytes[..at]).is_err());
    }
}
