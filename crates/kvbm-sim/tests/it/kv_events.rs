//! Serve mode with its cache events followed: the report's counts, a mirror
//! a router could keep, and (with the `kv-events` feature) the same stream
//! read back from vLLM's ZeroMQ wire.

use std::collections::HashSet;

use kvbm_blocks::{CacheEvent, EventMessage};
use kvbm_sim::mode::serve::replay_with_events;
use kvbm_sim::{Capacity, EventSink, NoProgress, ServeConfig, SimError, Trace};

/// A router's view, failing on any event it could not apply.
#[derive(Default)]
struct Mirror {
    registered: HashSet<u128>,
    messages: u64,
    block_size: usize,
}

impl EventSink for Mirror {
    fn publish(&mut self, message: &EventMessage) -> Result<(), SimError> {
        self.messages += 1;
        let fail = |reason: String| Err(SimError::Events { reason });
        match message {
            EventMessage::Resync(resync) => {
                self.registered = resync.registered.iter().map(|h| h.value()).collect();
            }
            EventMessage::Batch(batch) => {
                for event in batch.events() {
                    match event {
                        CacheEvent::Stored {
                            parent,
                            hashes,
                            tokens,
                        } => {
                            if tokens.len() != hashes.len() * self.block_size {
                                return fail(format!("{} tokens for {hashes:?}", tokens.len()));
                            }
                            if parent.is_some_and(|p| !self.registered.contains(&p)) {
                                return fail(format!("{:#x} before its parent", hashes[0]));
                            }
                            for &hash in hashes {
                                if !self.registered.insert(hash) {
                                    return fail(format!("{hash:#x} stored twice"));
                                }
                            }
                        }
                        CacheEvent::Removed { hashes } => {
                            for hash in hashes {
                                if !self.registered.remove(hash) {
                                    return fail(format!("{hash:#x} removed, never stored"));
                                }
                            }
                        }
                        CacheEvent::Cleared => self.registered.clear(),
                    }
                }
            }
        }
        Ok(())
    }
}

/// A pool small enough (2,048 blocks) that the excerpt evicts.
fn config() -> ServeConfig {
    ServeConfig::new(16, Capacity::Blocks(2048))
}

#[test]
fn a_router_can_follow_the_events_and_the_report_counts_them() {
    let trace = Trace::conversation_excerpt().unwrap();
    let mut mirror = Mirror {
        block_size: 16,
        ..Mirror::default()
    };
    let report = replay_with_events(&trace, &config(), &mut NoProgress, Some(&mut mirror)).unwrap();
    let counts = report.kv_events.expect("counted");
    assert!(report.evictions > 0, "the pool is small enough to evict");
    assert_eq!(counts.removed_blocks, report.evictions);
    assert_eq!(
        (counts.resyncs, counts.missed_batches, counts.cleared),
        (1, 0, 0)
    );
    assert_eq!(counts.batches + counts.resyncs, mirror.messages);
    assert_eq!(
        mirror.registered.len() as u64,
        counts.stored_blocks - counts.removed_blocks
    );
    let json = report.to_json();
    assert_eq!(json["kv_events"]["stored_blocks"], counts.stored_blocks);
    assert_eq!(json["kv_events"]["removed_blocks"], report.evictions);
    // Publishing changes nothing about the replay itself.
    let plain = config().run(&trace).unwrap();
    assert_eq!(plain.kv_events, None);
    assert_eq!(
        (plain.hits, plain.evictions),
        (report.hits, report.evictions)
    );
}

/// A grouped engine's stream on vLLM's wire: every event names its group
/// (stores with the group's kind and window), a block hashes as group 0's
/// in every group, and a router following it holds exactly the full
/// group's blocks.
struct GroupedWire {
    format: kvbm_events::WireFormat,
    router: kvbm_router::Router,
    mirror: Mirror,
    by_group: [u64; 2],
}

impl EventSink for GroupedWire {
    fn publish(&mut self, message: &EventMessage) -> Result<(), SimError> {
        self.mirror.publish(message)?;
        let fail = |reason: String| Err(SimError::Events { reason });
        for event in self.format.events(message) {
            let group = match &event {
                kvbm_events::KvEvent::BlockStored(stored) => {
                    let window = (stored.kv_cache_spec_kind.as_deref())
                        .zip(Some(stored.kv_cache_spec_sliding_window));
                    match (stored.group_idx, window) {
                        (Some(0), Some(("full_attention", None)))
                        | (Some(1), Some(("sliding_window", Some(128)))) => {}
                        other => return fail(format!("a store names {other:?}")),
                    }
                    stored.group_idx
                }
                kvbm_events::KvEvent::BlockRemoved(removed) => removed.group_idx,
                kvbm_events::KvEvent::AllBlocksCleared => Some(0),
            };
            let Some(slot) = group.and_then(|g| self.by_group.get_mut(g as usize)) else {
                return fail(format!("an event of group {group:?}"));
            };
            *slot += 1;
            (self.router.apply(1, &event)).map_err(|e| SimError::Events {
                reason: e.to_string(),
            })?;
        }
        Ok(())
    }
}

#[test]
fn a_grouped_engines_events_name_their_groups_as_vllms_do() {
    let mut trace = Trace::conversation_excerpt().unwrap();
    trace.truncate(std::num::NonZeroUsize::new(60).unwrap());
    let model = kvbm_sim::KvModel::preset("gpt-oss-120b").unwrap();
    let config = ServeConfig::default().with_kv(kvbm_sim::KvSetup::new(model, 2_000_000_000));
    let router = kvbm_router::Router::new();
    router.add_worker(1).unwrap();
    let mut wire = GroupedWire {
        format: config.wire_format().unwrap(),
        router,
        mirror: Mirror {
            block_size: 16,
            ..Mirror::default()
        },
        by_group: [0; 2],
    };
    let report = replay_with_events(&trace, &config, &mut NoProgress, Some(&mut wire)).unwrap();
    assert!(report.evictions > 0, "the pool is small enough to evict");
    assert!(wire.by_group.iter().all(|&n| n > 0), "{:?}", wire.by_group);
    // The router holds group 0's blocks alone: a window's, hashing alike,
    // neither count twice nor take the full group's out when evicted.
    let full = (wire.mirror.registered.iter())
        .filter(|&&value| kvbm_sequence::group_of(value) == 0)
        .count();
    assert_eq!(wire.router.index().held(1), full);
    assert!(full < wire.mirror.registered.len());
}

#[cfg(feature = "kv-events")]
#[test]
fn serve_publishes_the_same_stream_on_vllms_wire() {
    use std::time::Duration;

    use kvbm_events::{HashForm, KvEvent, PublisherConfig, Subscriber, WireFormat};
    use kvbm_sim::ZmqEventSink;

    let trace = Trace::conversation_excerpt().unwrap();
    let publisher = PublisherConfig::new("tcp://127.0.0.1:*");
    let format = WireFormat::new(16).with_hash_form(HashForm::Int64);
    // Open first (no wait), then subscribe, then wait for the subscription.
    let mut sink = ZmqEventSink::new(&publisher, format.clone()).unwrap();
    let mut subscriber = Subscriber::new(sink.endpoint(), None, "", Some(0)).unwrap();
    sink.wait_for_subscriber(Duration::from_secs(10)).unwrap();
    let report = replay_with_events(&trace, &config(), &mut NoProgress, Some(&mut sink)).unwrap();
    let counts = report.kv_events.unwrap();
    assert_eq!(sink.published(), counts.batches + counts.resyncs);
    let (mut stored, mut removed, mut batches) = (0u64, 0u64, 0u64);
    while batches < sink.published() {
        let received = subscriber
            .recv(Duration::from_secs(10))
            .unwrap()
            .expect("a batch");
        for (seq, batch) in received {
            assert_eq!(seq, batches, "in order, none lost");
            batches += 1;
            for event in batch.events() {
                match event {
                    KvEvent::BlockStored(s) => {
                        assert_eq!(s.token_ids.len(), 16 * s.block_hashes.len());
                        stored += s.block_hashes.len() as u64;
                    }
                    KvEvent::BlockRemoved(r) => removed += r.block_hashes.len() as u64,
                    KvEvent::AllBlocksCleared => {}
                }
            }
        }
    }
    assert_eq!(subscriber.lost(), 0);
    assert_eq!(batches, counts.batches + counts.resyncs);
    assert_eq!(
        (stored, removed),
        (counts.stored_blocks, counts.removed_blocks)
    );
}

/// A router beside a monitor: two SUB sockets of one topic are two
/// subscribers to wait for, and once both are counted neither misses the
/// first batch (whose stores are the parents of everything after).
#[cfg(feature = "kv-events")]
#[test]
fn two_subscribers_of_one_topic_both_get_the_first_batch() {
    use std::num::NonZeroUsize;
    use std::time::Duration;

    use kvbm_events::{HashForm, PublisherConfig, Subscriber, WireFormat};
    use kvbm_sim::ZmqEventSink;

    let mut trace = Trace::conversation_excerpt().unwrap();
    trace.truncate(NonZeroUsize::new(20).unwrap());
    let publisher = PublisherConfig::new("tcp://127.0.0.1:*");
    let format = WireFormat::new(16).with_hash_form(HashForm::Int64);
    let mut sink = ZmqEventSink::new(&publisher, format).unwrap();
    // No replay socket and no `from`: a subscriber that joined late would
    // simply start at a later sequence number.
    let mut router = Subscriber::new(sink.endpoint(), None, "", None).unwrap();
    let mut monitor = Subscriber::new(sink.endpoint(), None, "", None).unwrap();
    let joined = sink
        .wait_for_subscribers(2, Duration::from_secs(10))
        .unwrap();
    assert_eq!(joined, 2, "both subscriptions counted");
    // Already reached: returns at once.
    assert_eq!(sink.wait_for_subscribers(1, Duration::ZERO).unwrap(), 2);
    let report = replay_with_events(&trace, &config(), &mut NoProgress, Some(&mut sink)).unwrap();
    assert!(report.kv_events.unwrap().batches > 0);
    for (name, subscriber) in [("router", &mut router), ("monitor", &mut monitor)] {
        let received = subscriber
            .recv(Duration::from_secs(10))
            .unwrap()
            .expect("a batch");
        let first = received.into_iter().next().map(|(seq, _)| seq);
        assert_eq!(first, Some(0), "{name} missed the first batch");
    }
}
