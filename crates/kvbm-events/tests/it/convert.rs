//! A block pool's events in vLLM's form: `WireFormat::batch` and its
//! copy-free `WireFormat::encode` agree byte for byte, and what the pool
//! stores and evicts comes out as vLLM's events.

use std::sync::Arc;

use kvbm_blocks::{BlockManager, EventBatch, EventMessage, Resync, SequenceHash};
use kvbm_events::{BlockHash, HashForm, KvEvent, WireFormat, WireGroup, decode, encode};
use kvbm_sequence::{AttentionKind, group_of};
use proptest::prelude::*;

struct Gpu;

fn chain(len: usize, seed: u128) -> Vec<SequenceHash> {
    let mut hashes: Vec<SequenceHash> = Vec::new();
    for i in 0..len as u128 {
        let value = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(i);
        hashes.push(match hashes.last() {
            Some(parent) => parent.child(value),
            None => SequenceHash::root(value),
        });
    }
    hashes
}

/// One event to push into a batch.
#[derive(Clone, Debug)]
enum Event {
    Stored(Vec<SequenceHash>, Vec<u32>),
    Removed(Vec<SequenceHash>),
    Cleared,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (1..5usize, any::<u128>(), any::<bool>(), any::<u32>()).prop_map(
            |(len, seed, with_tokens, token)| Event::Stored(
                chain(len, seed),
                match with_tokens {
                    true => vec![token; len * 4],
                    false => Vec::new(),
                },
            )
        ),
        // An empty removal too: one empty event without groups, none with.
        (0..5usize, any::<u128>()).prop_map(|(len, seed)| Event::Removed(chain(len, seed))),
        Just(Event::Cleared),
    ]
}

fn values(hashes: &[SequenceHash]) -> Vec<u128> {
    hashes.iter().map(|h| h.value()).collect()
}

fn batch_of(events: &[Event]) -> EventBatch {
    let mut batch = EventBatch::new(1);
    for event in events {
        match event {
            Event::Stored(hashes, tokens) => {
                let parent = hashes.first().and_then(|h| h.parent());
                batch.push_stored(parent, &values(hashes), tokens);
            }
            Event::Removed(hashes) => batch.push_removed(&values(hashes)),
            Event::Cleared => batch.push_cleared(),
        }
    }
    batch
}

fn format() -> impl Strategy<Value = WireFormat> {
    let form = prop_oneof![Just(HashForm::Bytes), Just(HashForm::Int64)];
    let text = prop::option::of("[a-zA-Z]{0,6}");
    // A model's KV cache groups half the time: the group rides in a hash's
    // top byte, random here, so most blocks name a group past the list.
    let groups = prop::option::of(prop::collection::vec(
        prop_oneof![
            Just(WireGroup::from_attention(AttentionKind::Full)),
            (1..4096usize).prop_map(|window| WireGroup::from_attention(
                AttentionKind::SlidingWindow { window }
            )),
        ],
        1..4,
    ));
    (
        form,
        text.clone(),
        text,
        prop::option::of(any::<i64>()),
        groups,
    )
        .prop_map(|(form, medium, lora, rank, groups)| {
            let format = WireFormat::new(4)
                .with_hash_form(form)
                .with_medium(medium)
                .with_lora_name(lora)
                .with_rank(rank);
            match groups {
                Some(groups) => format.with_kv_groups(groups),
                None => format,
            }
        })
}

proptest! {
    #[test]
    fn fuzz_the_copy_free_encoding_is_the_batchs(
        format in format(),
        events in prop::collection::vec(event(), 0..6),
        resync in any::<bool>(),
        ts in any::<f64>(),
    ) {
        let message = match resync {
            true => EventMessage::Resync(Arc::new(Resync::new(3, 1, chain(2, 5)))),
            false => EventMessage::Batch(Arc::new(batch_of(&events))),
        };
        let batch = format.batch(&message, ts);
        let bytes = format.encode(&message, ts).unwrap();
        prop_assert_eq!(&bytes, &encode(&batch).unwrap());
        let decoded = decode(&bytes).unwrap();
        prop_assert_eq!(decoded.events(), batch.events());
        // With groups, a removal is one event per run of one group, each
        // naming it, and no hash keeps its group.
        if let (Some(_), EventMessage::Batch(_)) = (format.kv_groups(), &message) {
            let runs: usize = (events.iter())
                .map(|event| match event {
                    Event::Removed(hashes) => values(hashes)
                        .chunk_by(|&a, &b| group_of(a) == group_of(b))
                        .count(),
                    Event::Stored(..) | Event::Cleared => 1,
                })
                .sum();
            prop_assert_eq!(batch.events().len(), runs);
            for event in batch.events() {
                let (hashes, group) = match event {
                    KvEvent::BlockStored(s) => (&s.block_hashes, s.group_idx),
                    KvEvent::BlockRemoved(r) => (&r.block_hashes, r.group_idx),
                    _ => continue,
                };
                prop_assert!(group.is_some());
                for hash in hashes {
                    if let BlockHash::Bytes(bytes) = hash {
                        prop_assert_eq!(bytes[0], 0, "the group is off the hash");
                    }
                }
            }
        }
    }
}

#[test]
fn a_pools_stores_and_evictions_become_vllms_events() {
    let manager = BlockManager::<Gpu>::builder()
        .block_count(2)
        .block_size(2)
        .build()
        .unwrap();
    let events = manager.subscribe_events(8);
    let format = WireFormat::new(2).with_hash_form(HashForm::Int64);
    let hashes = chain(2, 1);
    let staged = (manager.allocate_blocks(2).unwrap().into_iter().zip(&hashes))
        .map(|(block, &hash)| block.stage(hash, 2).unwrap())
        .collect();
    drop(
        manager
            .register_blocks_with_tokens(staged, &[1, 2, 3, 4])
            .unwrap(),
    );
    manager.flush_events();
    drop(manager.allocate_blocks(1).unwrap()); // evicts the chain's end
    manager.flush_events();
    let wire: Vec<KvEvent> = (events.drain().iter())
        .flat_map(|message| decode(&format.encode(message, 0.0).unwrap()).unwrap().1)
        .collect();
    let int = |hash: SequenceHash| BlockHash::Int(hash.value() as u64);
    let [
        cleared,
        KvEvent::BlockStored(stored),
        KvEvent::BlockRemoved(removed),
    ] = &wire[..]
    else {
        panic!("a resync, a store and a removal: {wire:?}");
    };
    assert_eq!(cleared, &KvEvent::AllBlocksCleared);
    assert_eq!(stored.block_hashes, [int(hashes[0]), int(hashes[1])]);
    assert_eq!(
        (stored.parent_block_hash.clone(), stored.block_size),
        (None, 2)
    );
    assert_eq!(stored.token_ids, [1, 2, 3, 4]);
    assert_eq!(stored.medium.as_deref(), Some("GPU"));
    assert_eq!(removed.block_hashes, [int(hashes[1])]);
}

/// vLLM's publisher stamps every batch with its engine's data-parallel
/// rank (`batch.data_parallel_rank = self._dp_rank`, 0 without data
/// parallelism): so does `WireFormat` unless told otherwise, and
/// `with_rank(None)` still writes nil.
#[test]
fn batches_carry_data_parallel_rank_0_unless_told_otherwise() {
    let message = EventMessage::Resync(Arc::new(Resync::new(0, 0, Vec::new())));
    for (format, rank, last_byte) in [
        (WireFormat::new(4), Some(0), 0x00),
        (WireFormat::new(4).with_rank(Some(7)), Some(7), 0x07),
        (WireFormat::new(4).with_rank(None), None, 0xc0),
    ] {
        assert_eq!(format.batch(&message, 1.0).data_parallel_rank(), rank);
        let bytes = format.encode(&message, 1.0).unwrap();
        assert_eq!(bytes.last(), Some(&last_byte), "{rank:?}");
        assert_eq!(decode(&bytes).unwrap().data_parallel_rank(), rank);
    }
}
