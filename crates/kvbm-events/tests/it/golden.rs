//! The payload vLLM 0.33's encoder (msgspec) produces for a known batch,
//! recorded in `shared/design/kv-events.md`: `[1.5, [BlockStored(hashes
//! [11, 12], parent nil, tokens 1..=8, block size 4, medium "GPU"),
//! BlockRemoved([11], "GPU"), AllBlocksCleared], nil]`.

use kvbm_events::{BlockHash, BlockRemoved, BlockStored, HashForm, KvEvent, KvEventBatch};

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
            KvEvent::BlockStored(BlockStored {
                block_hashes: vec![BlockHash::Int(11), BlockHash::Int(12)],
                parent_block_hash: None,
                token_ids: (1..=8).collect(),
                block_size: 4,
                lora_id: None,
                medium: Some("GPU".to_owned()),
                lora_name: None,
            }),
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![BlockHash::Int(11)],
                medium: Some("GPU".to_owned()),
            }),
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
        vec![KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![
                BlockHash::from_value(value, HashForm::Bytes),
                BlockHash::from_value(value, HashForm::Int64),
            ],
            medium: None,
        })],
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
fn optional_fields_vllm_may_add_are_ignored() {
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
        [KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![BlockHash::Int(7)],
            medium: Some("CPU".to_owned()),
        })]
    );
}
