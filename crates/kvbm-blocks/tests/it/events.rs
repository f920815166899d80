//! Event subscriptions: batches per flush, order, lag and resync, and a
//! mirror built from them that always matches the pool.

use std::collections::HashSet;
use std::sync::Arc;

use kvbm_blocks::{
    BlockError, BlockManager, CacheEvent, EventBatch, EventMessage, EventSubscription,
    ImmutableBlocks, MAX_PENDING_BLOCKS, SequenceHash,
};
use proptest::prelude::*;

use crate::{BLOCK_SIZE, Gpu, chain, manager, register, stage};

/// The tokens a test block holds: derived from its hash, so a mirror can
/// check every `Stored` carried the right ones.
fn tokens_of(hash: SequenceHash) -> Vec<u32> {
    tokens_of_value(hash.value())
}

fn tokens_of_value(value: u128) -> Vec<u32> {
    (0..BLOCK_SIZE as u32)
        .map(|i| (value as u32).wrapping_mul(31).wrapping_add(i))
        .collect()
}

fn values(hashes: &[SequenceHash]) -> Vec<u128> {
    hashes.iter().map(|h| h.value()).collect()
}

/// Allocates, stages and registers one block per hash, with their tokens.
fn register_with_tokens(
    manager: &BlockManager<Gpu>,
    hashes: &[SequenceHash],
) -> ImmutableBlocks<Gpu> {
    let staged = stage(manager, hashes);
    let tokens: Vec<u32> = hashes.iter().flat_map(|&h| tokens_of(h)).collect();
    manager
        .register_blocks_with_tokens(staged, &tokens)
        .expect("same manager, right token count")
}

/// What a router learns from one subscription, checked as it goes.
#[derive(Debug, Default)]
struct Mirror {
    registered: HashSet<u128>,
    sequence: u64,
    resyncs: u64,
}

impl Mirror {
    fn apply(&mut self, message: EventMessage) -> Result<(), String> {
        match message {
            EventMessage::Resync(resync) => {
                self.registered.clear();
                for hash in &resync.registered {
                    if let Some(parent) = hash.parent()
                        && !self.registered.contains(&parent)
                        && resync.registered.iter().any(|h| h.value() == parent)
                    {
                        return Err(format!("snapshot lists {hash:?} before its parent"));
                    }
                    self.registered.insert(hash.value());
                }
                self.sequence = resync.sequence;
                self.resyncs += 1;
            }
            EventMessage::Batch(batch) => {
                if batch.sequence() != self.sequence + 1 {
                    return Err(format!(
                        "batch {} after {}",
                        batch.sequence(),
                        self.sequence
                    ));
                }
                self.sequence = batch.sequence();
                for event in batch.events() {
                    self.apply_event(event)?;
                }
            }
        }
        Ok(())
    }

    fn apply_event(&mut self, event: CacheEvent<'_>) -> Result<(), String> {
        match event {
            CacheEvent::Stored {
                parent,
                hashes,
                tokens,
            } => {
                let first = hashes.first().ok_or("empty Stored")?;
                if let Some(parent) = parent
                    && !self.registered.contains(&parent)
                {
                    return Err(format!("{first:#x} stored before its parent"));
                }
                let expected: Vec<u32> = hashes.iter().flat_map(|&h| tokens_of_value(h)).collect();
                if !tokens.is_empty() && tokens != expected {
                    return Err(format!("wrong tokens for {hashes:?}: {tokens:?}"));
                }
                for &hash in hashes {
                    if !self.registered.insert(hash) {
                        return Err(format!("{hash:#x} stored twice"));
                    }
                }
            }
            CacheEvent::Removed { hashes } => {
                for hash in hashes {
                    if !self.registered.remove(hash) {
                        return Err(format!("{hash:#x} removed but never stored"));
                    }
                }
            }
            CacheEvent::Cleared => self.registered.clear(),
        }
        Ok(())
    }

    fn drain(&mut self, subscription: &EventSubscription) -> Result<(), String> {
        subscription
            .drain()
            .into_iter()
            .try_for_each(|message| self.apply(message))
    }
}

/// The events of a message that must be a batch.
fn batch_events(message: Option<EventMessage>) -> Arc<EventBatch> {
    match message {
        Some(EventMessage::Batch(batch)) => batch,
        other => panic!("expected a batch, got {other:?}"),
    }
}

/// Asserts the subscription's next message is a batch of exactly `expected`.
fn assert_next_batch(subscription: &EventSubscription, expected: &[CacheEvent<'_>], why: &str) {
    let batch = batch_events(subscription.try_recv());
    assert_eq!(batch.events().collect::<Vec<_>>(), expected, "{why}");
}

#[test]
fn a_subscriber_starts_with_a_resync_of_what_is_registered() {
    let manager = manager(8);
    let pinned = register(&manager, &chain(1, 2));
    drop(register(&manager, &chain(10, 1))); // cached, still registered
    let subscription = manager.subscribe_events(4);
    let Some(EventMessage::Resync(resync)) = subscription.try_recv() else {
        panic!("the first message is a resync");
    };
    let mut expected = chain(1, 2);
    expected.extend(chain(10, 1));
    let registered: HashSet<_> = resync.registered.iter().copied().collect();
    assert_eq!(registered, expected.into_iter().collect());
    assert_eq!((resync.sequence, resync.missed_batches), (0, 0));
    manager.flush_events();
    assert!(subscription.try_recv().is_none(), "nothing happened since");
    drop(pinned);
}

#[test]
fn a_step_names_a_chain_in_one_stored_with_its_tokens_then_its_evictions() {
    let manager = manager(4);
    let subscription = manager.subscribe_events(4);
    subscription.drain();
    let hashes = chain(1, 3);
    let first = register_with_tokens(&manager, &hashes[..2]);
    let second = register_with_tokens(&manager, &hashes[2..]);
    manager.flush_events();
    let tokens: Vec<u32> = hashes.iter().flat_map(|&h| tokens_of(h)).collect();
    assert_next_batch(
        &subscription,
        &[CacheEvent::Stored {
            parent: None,
            hashes: &values(&hashes),
            tokens: &tokens,
        }],
        "two registrations continuing one chain are one run",
    );
    // Released chain end first, as a request holding all three would.
    drop(second);
    drop(first);
    let allocation = manager.allocate_blocks_with_evictions(3).unwrap();
    manager.flush_events();
    assert_next_batch(
        &subscription,
        &[CacheEvent::Removed {
            hashes: &values(&allocation.evicted),
        }],
        "the evictions are one run, in eviction order",
    );
    assert_eq!(allocation.evicted, [hashes[2], hashes[1]]);
}

#[test]
fn batches_are_numbered_per_flush_and_empty_flushes_send_nothing() {
    let manager = manager(4);
    let subscription = manager.subscribe_events(8);
    let mut mirror = Mirror::default();
    mirror.drain(&subscription).unwrap();
    let mut held = Vec::new(); // pinned: each block's parent stays registered
    for (i, hash) in chain(1, 3).into_iter().enumerate() {
        held.push(register_with_tokens(&manager, &[hash]));
        manager.flush_events();
        manager.flush_events();
        let Some(EventMessage::Batch(batch)) = subscription.try_recv() else {
            panic!("one batch per flush with events");
        };
        assert_eq!(batch.sequence(), i as u64 + 1);
        assert!(
            subscription.try_recv().is_none(),
            "the empty flush sent nothing"
        );
        mirror.apply(EventMessage::Batch(batch)).unwrap();
    }
    assert_eq!(mirror.registered.len(), 3);
}

#[test]
fn a_batch_a_subscriber_keeps_is_never_reused_and_one_it_dropped_is_reused_clean() {
    let manager = manager(8);
    let subscription = manager.subscribe_events(8);
    subscription.drain();
    let first_chain = chain(1, 2);
    let first_blocks = register_with_tokens(&manager, &first_chain);
    manager.flush_events();
    let Some(EventMessage::Batch(kept)) = subscription.try_recv() else {
        panic!("a batch");
    };
    let kept_events = EventBatch::clone(&kept);
    // The log cannot take back a batch this subscriber still holds.
    let second_blocks = register_with_tokens(&manager, &chain(20, 1));
    manager.flush_events();
    let second = batch_events(subscription.try_recv());
    assert_eq!(*kept, kept_events, "a kept batch is untouched");
    assert_eq!(second.len(), 1);
    drop(kept);
    // Now every holder dropped the latest batch: the next one reuses its
    // buffers and must carry only its own events.
    drop(first_blocks);
    drop(second_blocks);
    let allocation = manager.allocate_blocks_with_evictions(8).unwrap();
    manager.flush_events();
    assert_next_batch(
        &subscription,
        &[CacheEvent::Removed {
            hashes: &values(&allocation.evicted),
        }],
        "the reused batch carries only its own removal",
    );
    drop(allocation);
    let third_chain = chain(40, 3);
    let _third = register_with_tokens(&manager, &third_chain);
    manager.flush_events();
    let tokens: Vec<u32> = third_chain.iter().flat_map(|&h| tokens_of(h)).collect();
    assert_next_batch(
        &subscription,
        &[CacheEvent::Stored {
            parent: None,
            hashes: &values(&third_chain),
            tokens: &tokens,
        }],
        "and then only its own store",
    );
}

#[test]
fn deduplicated_and_duplicate_registrations_are_not_announced_again() {
    let manager = manager(4);
    let subscription = manager.subscribe_events(4);
    subscription.drain();
    let hashes = chain(1, 2);
    let a = register_with_tokens(&manager, &hashes);
    manager.flush_events();
    subscription.drain();
    let b = register_with_tokens(&manager, &hashes);
    manager.flush_events();
    assert!(
        subscription.try_recv().is_none(),
        "a dedup changes nothing matchable"
    );
    drop((a, b));
}

#[test]
fn clearing_an_unpinned_cache_is_one_cleared_event() {
    let manager = manager(4);
    drop(register(&manager, &chain(1, 3)));
    let subscription = manager.subscribe_events(4);
    subscription.drain();
    manager.clear_cache();
    manager.flush_events();
    assert_next_batch(&subscription, &[CacheEvent::Cleared], "one clear");
}

#[test]
fn clearing_around_pinned_blocks_removes_only_the_cached_ones() {
    let manager = manager(4);
    let pinned = register(&manager, &chain(1, 1));
    drop(register(&manager, &chain(5, 2)));
    let subscription = manager.subscribe_events(4);
    subscription.drain();
    let evicted = manager.clear_cache();
    manager.flush_events();
    assert_next_batch(
        &subscription,
        &[CacheEvent::Removed {
            hashes: &values(&evicted),
        }],
        "the pinned block is still matchable, so this is not AllBlocksCleared",
    );
    drop(pinned);
}

#[test]
fn a_full_channel_counts_lost_batches_then_resyncs() {
    let manager = manager(8);
    let subscription = manager.subscribe_events(1);
    let mut mirror = Mirror::default();
    mirror.drain(&subscription).unwrap();
    let mut held = Vec::new();
    for hash in chain(1, 4) {
        held.push(register_with_tokens(&manager, &[hash]));
        manager.flush_events(); // the first fills the channel, the rest are lost
    }
    assert_eq!(subscription.missed_batches(), 3);
    mirror.drain(&subscription).unwrap();
    assert_eq!(mirror.registered.len(), 1, "only the first batch arrived");
    manager.flush_events(); // room again: the resync owed goes out
    let Some(EventMessage::Resync(resync)) = subscription.try_recv() else {
        panic!("a lagging subscriber is resynced, never left silently wrong");
    };
    assert_eq!((resync.sequence, resync.missed_batches), (4, 3));
    mirror.apply(EventMessage::Resync(resync)).unwrap();
    assert_eq!(mirror.registered.len(), 4);
    held.push(register_with_tokens(&manager, &chain(20, 1)));
    manager.flush_events();
    mirror.drain(&subscription).unwrap(); // batch 5 follows the resync of 4
    assert_eq!(mirror.registered.len(), 5);
    assert_eq!(subscription.missed_batches(), 3);
}

#[test]
fn a_slow_subscriber_does_not_hold_back_a_fast_one() {
    let manager = manager(8);
    let slow = manager.subscribe_events(1);
    let fast = manager.subscribe_events(64);
    let mut mirror = Mirror::default();
    mirror.drain(&fast).unwrap();
    let held: Vec<_> = chain(1, 5)
        .into_iter()
        .map(|hash| {
            let block = register_with_tokens(&manager, &[hash]);
            manager.flush_events();
            block
        })
        .collect();
    mirror.drain(&fast).unwrap();
    assert_eq!((mirror.registered.len(), fast.missed_batches()), (5, 0));
    assert_eq!(slow.missed_batches(), 5, "its resync filled its channel");
    drop(held);
}

#[test]
fn a_wrong_token_count_is_refused_and_registers_nothing() {
    let manager = manager(4);
    let subscription = manager.subscribe_events(4);
    subscription.drain();
    let staged = manager
        .allocate_blocks(2)
        .unwrap()
        .into_iter()
        .zip(chain(1, 2))
        .map(|(block, hash)| block.stage(hash, BLOCK_SIZE).unwrap())
        .collect();
    let rejected = manager
        .register_blocks_with_tokens(staged, &[7; BLOCK_SIZE])
        .unwrap_err();
    assert_eq!(
        rejected.error(),
        &BlockError::TokenCountMismatch {
            expected: 2 * BLOCK_SIZE,
            actual: BLOCK_SIZE
        }
    );
    assert_eq!(rejected.into_inner().len(), 2, "every block comes back");
    manager.flush_events();
    assert!(subscription.try_recv().is_none());
    assert_eq!(manager.scan_matches(&chain(1, 2)), [false, false]);
}

#[test]
fn after_the_last_subscriber_leaves_a_new_one_still_sees_the_whole_state() {
    let manager = manager(8);
    drop(manager.subscribe_events(2));
    let held = register(&manager, &chain(1, 2));
    manager.flush_events(); // notices nobody listens and stops recording
    drop(register(&manager, &chain(9, 1)));
    let subscription = manager.subscribe_events(2);
    let mut mirror = Mirror::default();
    mirror.drain(&subscription).unwrap();
    assert_eq!(mirror.registered.len(), 3);
    drop(held);
}

#[test]
fn an_unflushed_pool_sends_its_events_at_the_pending_cap() {
    let manager = manager(MAX_PENDING_BLOCKS + 1);
    let subscription = manager.subscribe_events(4);
    subscription.drain();
    let hashes: Vec<SequenceHash> = (0..MAX_PENDING_BLOCKS as u64)
        .map(|v| SequenceHash::root(v.into()))
        .collect();
    let held = register(&manager, &hashes);
    let Some(EventMessage::Batch(batch)) = subscription.try_recv() else {
        panic!("the pool flushed by itself at the cap");
    };
    let stored: usize = (batch.events())
        .map(|event| match event {
            CacheEvent::Stored { hashes, .. } => hashes.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(stored, MAX_PENDING_BLOCKS);
    drop(held);
}

#[derive(Clone, Debug)]
enum Op {
    /// Registers a chain (pinned until dropped), with or without tokens.
    Register {
        first: u64,
        len: usize,
        tokens: bool,
    },
    /// Drops one pinned registration.
    Release(usize),
    /// Allocates and frees blocks (evicting cached ones).
    Allocate(usize),
    Clear,
    Flush,
    /// The consumer reads everything waiting.
    Read,
    /// Reads everything waiting and keeps the batches (the pool must not
    /// reuse a batch anyone still holds).
    ReadKeeping,
    /// Drops the kept batches, checking none changed while held.
    DropKept,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        // Chains 10.., 20.., 30..: disjoint values, overlapping prefixes.
        4 => (1..4u64, 1..5usize, any::<bool>())
            .prop_map(|(family, len, tokens)| Op::Register { first: 10 * family, len, tokens }),
        2 => any::<usize>().prop_map(Op::Release),
        2 => (0..10usize).prop_map(Op::Allocate),
        1 => Just(Op::Clear),
        3 => Just(Op::Flush),
        2 => Just(Op::Read),
        1 => Just(Op::ReadKeeping),
        1 => Just(Op::DropKept),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::fuzz::cases()))]

    /// Whatever the pool does and however late the consumer reads, a mirror
    /// built from one subscription never sees a removal before its store or
    /// a store before its parent, and once it has read everything after a
    /// flush it holds exactly the registered set.
    #[test]
    fn fuzz_a_mirror_from_events_matches_the_pool(
        capacity in 1..4usize,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let manager = manager(8);
        let subscription = manager.subscribe_events(capacity);
        let mut mirror = Mirror::default();
        let mut pinned: Vec<ImmutableBlocks<Gpu>> = Vec::new();
        let mut seen: HashSet<SequenceHash> = HashSet::new();
        // Batches a slow consumer still holds, with their events as received.
        let mut kept: Vec<(Arc<EventBatch>, EventBatch)> = Vec::new();
        for op in ops {
            match op {
                Op::Register { first, len, tokens } => {
                    let hashes = chain(first, len);
                    if manager.available_blocks() < len {
                        continue;
                    }
                    seen.extend(&hashes);
                    let staged = manager.allocate_blocks(len).unwrap().into_iter().zip(&hashes)
                        .map(|(b, &h)| b.stage(h, BLOCK_SIZE).unwrap()).collect();
                    let tokens: Vec<u32> = match tokens {
                        true => hashes.iter().flat_map(|&h| tokens_of(h)).collect(),
                        false => Vec::new(),
                    };
                    let blocks = manager.register_blocks_with_tokens(staged, &tokens).unwrap();
                    pinned.push(blocks);
                }
                Op::Release(i) if !pinned.is_empty() => drop(pinned.swap_remove(i % pinned.len())),
                Op::Release(_) => {}
                Op::Allocate(n) => drop(manager.allocate_blocks(n)),
                Op::Clear => drop(manager.clear_cache()),
                Op::Flush => manager.flush_events(),
                Op::Read => mirror.drain(&subscription).map_err(TestCaseError::fail)?,
                Op::ReadKeeping => {
                    for message in subscription.drain() {
                        if let EventMessage::Batch(batch) = &message {
                            kept.push((batch.clone(), EventBatch::clone(batch)));
                        }
                        mirror.apply(message).map_err(TestCaseError::fail)?;
                    }
                }
                Op::DropKept => {
                    for (batch, events) in kept.drain(..) {
                        prop_assert_eq!(&*batch, &events, "a held batch changed");
                    }
                }
            }
        }
        for (batch, events) in &kept {
            prop_assert_eq!(&**batch, events, "a held batch changed");
        }
        // Read, flush (a resync owed goes out now there is room), read.
        mirror.drain(&subscription).map_err(TestCaseError::fail)?;
        manager.flush_events();
        mirror.drain(&subscription).map_err(TestCaseError::fail)?;
        manager.flush_events();
        mirror.drain(&subscription).map_err(TestCaseError::fail)?;
        let seen: Vec<SequenceHash> = seen.into_iter().collect();
        let actual: HashSet<u128> = seen.iter().zip(manager.scan_matches(&seen))
            .filter(|(_, registered)| *registered).map(|(h, _)| h.value()).collect();
        prop_assert_eq!(&mirror.registered, &actual);
        if subscription.missed_batches() == 0 {
            prop_assert_eq!(mirror.resyncs, 1, "only the first message was a resync");
        }
    }
}
