//! `Router::apply_message` (a pool's own messages, in process) leaves the
//! router exactly as `Router::apply` of the same messages in vLLM's form.

use std::sync::Arc;

use kvbm_blocks::{EventBatch, EventMessage, Resync, SequenceHash};
use kvbm_events::{HashForm, WireFormat};
use kvbm_router::{Router, RouterError, WorkerId};
use proptest::prelude::*;

/// One event of a generated batch: values from a small range, so stores,
/// removals and overlaps meet.
#[derive(Clone, Debug)]
enum Event {
    Stored(Vec<u128>),
    Removed(Vec<u128>),
    Cleared,
}

fn event() -> impl Strategy<Value = Event> {
    let values = prop::collection::vec(0..24u128, 1..6);
    prop_oneof![
        4 => values.clone().prop_map(Event::Stored),
        3 => values.prop_map(Event::Removed),
        1 => Just(Event::Cleared),
    ]
}

/// A message: a batch of events, or (rarely) a resync.
fn message() -> impl Strategy<Value = EventMessage> {
    prop_oneof![
        8 => prop::collection::vec(event(), 0..5).prop_map(|events| {
            let mut batch = EventBatch::new(1);
            for event in events {
                match event {
                    Event::Stored(values) => batch.push_stored(None, &values, &[]),
                    Event::Removed(values) => batch.push_removed(&values),
                    Event::Cleared => batch.push_cleared(),
                }
            }
            EventMessage::Batch(Arc::new(batch))
        }),
        1 => Just(EventMessage::Resync(Arc::new(Resync::new(1, 1, vec![SequenceHash::root(3)])))),
    ]
}

fn form() -> impl Strategy<Value = HashForm> {
    prop_oneof![Just(HashForm::Int64), Just(HashForm::Bytes)]
}

/// The media a message's format names (the device medium under both its
/// names, and another), and its block size: mostly the router's.
fn settings() -> impl Strategy<Value = (Option<&'static str>, u32)> {
    let medium = prop_oneof![Just(Some("GPU")), Just(None), Just(Some("CPU"))];
    (medium, prop_oneof![6 => Just(16u32), 1 => Just(32)])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::cases()))]

    #[test]
    fn fuzz_apply_message_is_apply_of_its_wire_events(
        form in form(),
        messages in prop::collection::vec((0..3u64, settings(), message()), 1..24),
    ) {
        let (direct, wire) = (Router::new(), Router::new());
        for worker in 0..2 {
            direct.add_worker(worker).unwrap();
            wire.add_worker(worker).unwrap();
        }
        for (worker, (medium, block_size), message) in &messages {
            let format = WireFormat::new(*block_size)
                .with_hash_form(form)
                .with_medium(medium.map(str::to_owned));
            let applied = direct.apply_message(*worker, message, &format);
            if *worker == 2 {
                // Unknown, even for an empty batch (which has no events to
                // refuse on the wire).
                prop_assert_eq!(applied, Err(RouterError::UnknownWorker(2)));
                continue;
            }
            // Refused (for its block size) where the wire batch is, with
            // the events before applied alike.
            prop_assert_eq!(applied, wire.apply_batch(*worker, &format.batch(message, 0.0)));
        }
        let format = WireFormat::new(16).with_hash_form(form);
        let keys: Vec<u128> = (0..24u128)
            .map(|v| kvbm_router::block_key(&format.hash_value(v)))
            .collect();
        prop_assert_eq!(direct.index().len(), wire.index().len());
        prop_assert_eq!(direct.block_size(), wire.block_size());
        prop_assert_eq!(direct.audit(), wire.audit());
        for &key in &keys {
            prop_assert_eq!(direct.index().holders(key), wire.index().holders(key));
            prop_assert_eq!(
                direct.index().overlaps_on(Some("CPU"), &[key]),
                wire.index().overlaps_on(Some("CPU"), &[key])
            );
        }
        for worker in 0..2 as WorkerId {
            prop_assert_eq!(direct.stats(worker), wire.stats(worker));
        }
    }
}
