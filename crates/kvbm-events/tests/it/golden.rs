//! Golden payloads from vLLM 0.33's own encoder (msgspec).
//!
//! The first, recorded in `shared/design/kv-events.md`: `[1.5,
//! [BlockStored(hashes [11, 12], parent nil, tokens 1..=8, block size 4,
//! medium "GPU"), BlockRemoved([11], "GPU"), AllBlocksCleared], nil]`. The
//! rest are files under `tests/fixtures/vllm-0.33.0/`, written by vLLM's
//! classes from the 0.33.0 wheel (`make_golden.py` there says how): both
//! hash forms, ranks, LoRA names, and the newer optional fields a reader
//! must skip.

use kvbm_events::{
    BlockHash, BlockRemoved, BlockStored, HashForm, KvEvent, KvEventBatch, WireGroup,
};

const VLLM_HEX: &str = "93cb3ff800000000000093de0008a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573920b0cb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980102030405060708aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573910ba66d656469756da347505581a474797065b0416c6c426c6f636b73436c6561726564c0";

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn expected() -> KvEventBatch {
    KvEventBatch::new(
        1.5,
        vec![
            KvEvent::BlockStored(
                BlockStored::new(
                    vec![BlockHash::Int(11), BlockHash::Int(12)],
                    None,
                    (1..=8).collect(),
                    4,
                )
                .with_medium("GPU"),
            ),
            KvEvent::BlockRemoved(BlockRemoved::new(vec![BlockHash::Int(11)]).with_medium("GPU")),
            KvEvent::AllBlocksCleared,
        ],
    )
}

#[test]
fn vllms_bytes_decode_to_the_batch_they_encode() {
    assert_eq!(kvbm_events::decode(&hex(VLLM_HEX)).unwrap(), expected());
}

/// Ours differ from vLLM's in one byte-level choice only: msgspec writes the
/// `BlockStored` map with a map16 header (`de 00 08`, the struct has more
/// than 15 fields counting the optional ones), rmp-serde the shortest one
/// (`88`). Same fields, same order, same values; either decodes the same.
#[test]
fn our_bytes_are_vllms_up_to_the_map_header() {
    let ours = kvbm_events::encode(&expected()).unwrap();
    let theirs = hex(VLLM_HEX);
    let at = theirs
        .windows(3)
        .position(|w| w == [0xde, 0x00, 0x08])
        .expect("vLLM's map16 header");
    assert_eq!(ours[at], 0x88, "a fixmap of 8 entries where vLLM has map16");
    let mut normalized = ours.clone();
    normalized.splice(at..=at, [0xde, 0x00, 0x08]);
    assert_eq!(normalized, theirs);
}

#[test]
fn a_rank_and_byte_hashes_round_trip() {
    let value = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210_u128;
    let batch = KvEventBatch::new(
        2.0,
        vec![KvEvent::BlockRemoved(BlockRemoved::new(vec![
            BlockHash::from_value(value, HashForm::Bytes),
            BlockHash::from_value(value, HashForm::Int64),
        ]))],
    )
    .with_rank(3);
    let bytes = kvbm_events::encode(&batch).unwrap();
    let back = kvbm_events::decode(&bytes).unwrap();
    assert_eq!(back, batch);
    assert_eq!(back.data_parallel_rank(), Some(3));
    let KvEvent::BlockRemoved(removed) = &back.events()[0] else {
        panic!("not a BlockRemoved: {back:?}");
    };
    assert_eq!(
        removed.block_hashes[0],
        BlockHash::Bytes(value.to_be_bytes().to_vec().into())
    );
    assert_eq!(
        removed.block_hashes[1],
        BlockHash::Int(0xfedc_ba98_7654_3210)
    );
}

#[test]
fn optional_fields_vllm_may_add_are_ignored_but_the_group() {
    // BlockRemoved with vLLM's optional `group_idx` and `ownership`.
    let mut bytes = vec![0x93, 0xcb];
    bytes.extend(1.0f64.to_be_bytes());
    bytes.push(0x91);
    bytes.push(0x85);
    for (key, value) in [
        ("type", &b"\xacBlockRemoved"[..]),
        ("block_hashes", &[0x91, 0x07][..]),
        ("medium", &b"\xa3CPU"[..]),
        ("group_idx", &[0x02][..]),
        ("ownership", &b"\xa5local"[..]),
    ] {
        bytes.push(0xa0 | key.len() as u8);
        bytes.extend(key.as_bytes());
        bytes.extend(value);
    }
    bytes.push(0xc0);
    let batch = kvbm_events::decode(&bytes).unwrap();
    assert_eq!(
        batch.events(),
        [KvEvent::BlockRemoved(
            BlockRemoved::new(vec![BlockHash::Int(7)])
                .with_medium("CPU")
                .with_group(2)
        )]
    );
}

/// Payloads written by vLLM 0.33.0's own classes and msgspec encoder
/// (`tests/fixtures/vllm-0.33.0/make_golden.py` says how; `cases.json`
/// there lists what each holds).
mod vllm_fixtures {
    use super::*;

    macro_rules! fixture {
        ($name:literal) => {
            (
                $name,
                include_bytes!(concat!("../fixtures/vllm-0.33.0/", $name, ".msgpack")) as &[u8],
            )
        };
    }

    fn digest(seed: u32) -> BlockHash {
        BlockHash::Bytes(
            (0..32)
                .map(|i| ((seed * 7 + i) % 256) as u8)
                .collect::<Vec<_>>()
                .into(),
        )
    }

    fn stored(
        hashes: Vec<BlockHash>,
        parent: Option<BlockHash>,
        tokens: Vec<u32>,
        block_size: u32,
    ) -> BlockStored {
        BlockStored::new(hashes, parent, tokens, block_size).with_medium("GPU")
    }

    /// What each payload holds, built with kvbm-events.
    fn expected(name: &str) -> KvEventBatch {
        match name {
            "stored_int_hashes" => KvEventBatch::new(
                1_764_000_000.25,
                vec![KvEvent::BlockStored(stored(
                    vec![BlockHash::Int(u64::MAX), BlockHash::Int(1)],
                    Some(BlockHash::Int(1 << 63)),
                    (100..132).collect(),
                    16,
                ))],
            ),
            "stored_bytes_lora_rank" => KvEventBatch::new(
                0.5,
                vec![KvEvent::BlockStored(
                    stored(vec![digest(1), digest(2), digest(3)], None, vec![7; 12], 4)
                        .with_medium("CPU")
                        .with_lora_name("adapter-a"),
                )],
            )
            .with_rank(3),
            "removed_and_cleared" => KvEventBatch::new(
                2.0,
                vec![
                    KvEvent::BlockRemoved(BlockRemoved::new(
                        [5, 6, u64::MAX - 1].map(BlockHash::Int).to_vec(),
                    )),
                    KvEvent::AllBlocksCleared,
                    KvEvent::BlockRemoved(BlockRemoved::new(vec![digest(9)]).with_medium("GPU")),
                ],
            )
            .with_rank(0),
            // The newer optional fields are skipped but the group's; the
            // rest is kept.
            "stored_with_newer_fields" => KvEventBatch::new(
                3.0,
                vec![
                    KvEvent::BlockStored(
                        stored(
                            vec![BlockHash::Int(10), BlockHash::Int(11)],
                            Some(BlockHash::Int(9)),
                            (1..=8).collect(),
                            4,
                        )
                        .with_lora_name("adapter-b")
                        .with_group(1, &WireGroup::new("full_attention", None)),
                    ),
                    KvEvent::BlockRemoved(
                        BlockRemoved::new(vec![BlockHash::Int(10)])
                            .with_medium("GPU")
                            .with_group(1),
                    ),
                ],
            ),
            "empty" => KvEventBatch::new(4.0, vec![]),
            "stored_grouped" => KvEventBatch::new(
                5.0,
                vec![
                    KvEvent::BlockStored(
                        stored(
                            vec![BlockHash::Int(21), BlockHash::Int(22)],
                            Some(BlockHash::Int(20)),
                            (1..=8).collect(),
                            4,
                        )
                        .with_group(1, &WireGroup::new("sliding_window", Some(128))),
                    ),
                    KvEvent::BlockRemoved(
                        BlockRemoved::new(vec![BlockHash::Int(21)])
                            .with_medium("GPU")
                            .with_group(1),
                    ),
                    KvEvent::BlockRemoved(
                        BlockRemoved::new(vec![BlockHash::Int(20)])
                            .with_medium("GPU")
                            .with_group(0),
                    ),
                ],
            )
            .with_rank(0),
            other => panic!("no expectation for {other}"),
        }
    }

    const FIXTURES: [(&str, &[u8]); 6] = [
        fixture!("stored_int_hashes"),
        fixture!("stored_bytes_lora_rank"),
        fixture!("removed_and_cleared"),
        fixture!("stored_with_newer_fields"),
        fixture!("empty"),
        fixture!("stored_grouped"),
    ];

    /// vLLM's bytes with msgspec's `map16` headers of small maps written as
    /// the `fixmap` rmp-serde writes (the one byte-level difference).
    fn with_fixmaps(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(bytes.len());
        let mut at = 0;
        while at < bytes.len() {
            match bytes[at..] {
                [0xde, 0x00, n, ..] if n < 16 => {
                    out.push(0x80 | n);
                    at += 3;
                }
                _ => {
                    out.push(bytes[at]);
                    at += 1;
                }
            }
        }
        out
    }

    #[test]
    fn vllms_payloads_decode_to_what_they_hold() {
        for (name, bytes) in FIXTURES {
            let batch = kvbm_events::decode(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(batch, expected(name), "{name}");
        }
    }

    #[test]
    fn our_payloads_are_vllms_bytes() {
        // Every fixture but the one with fields kvbm does not write.
        for (name, bytes) in FIXTURES {
            let ours = kvbm_events::encode(&expected(name)).unwrap();
            assert_eq!(
                kvbm_events::decode(&ours).unwrap(),
                expected(name),
                "{name}"
            );
            if name != "stored_with_newer_fields" {
                assert_eq!(ours, with_fixmaps(bytes), "{name}");
            }
        }
    }
}
