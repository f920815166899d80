//! Arbitrary batches round-trip; arbitrary bytes never panic the decoder.

use kvbm_events::{BlockHash, BlockRemoved, BlockStored, KvEvent, KvEventBatch};
use proptest::prelude::*;

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
            )| {
                KvEvent::BlockStored(BlockStored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    lora_id,
                    medium,
                    lora_name,
                })
            },
        );
    let removed =
        (prop::collection::vec(hash(), 0..6), text()).prop_map(|(block_hashes, medium)| {
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes,
                medium,
            })
        });
    prop_oneof![stored, removed, Just(KvEvent::AllBlocksCleared)]
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
