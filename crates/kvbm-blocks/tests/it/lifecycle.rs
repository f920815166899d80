//! Each handle transition and where it leaves the block.

use kvbm_blocks::{BlockId, DuplicatePolicy, SequenceHash};

use crate::{BLOCK_SIZE, Gpu, audit, chain, manager, register};

#[test]
fn allocated_blocks_are_held_and_dropping_them_frees() {
    let manager = manager(4);
    let blocks = manager.allocate_blocks(3).unwrap();
    let ids: Vec<u32> = blocks.iter().map(|b| b.block_id().get()).collect();
    assert_eq!(ids, [0, 1, 2], "ids are page indices, handed out in order");
    assert_eq!(audit(&manager).held_blocks, 3);
    assert_eq!(manager.available_blocks(), 1);
    drop(blocks);
    assert_eq!(audit(&manager).free_blocks, 4);
}

#[test]
fn staged_and_reset_blocks_stay_held_until_dropped() {
    let manager = manager(2);
    let block = manager.allocate_blocks(1).unwrap().pop().unwrap();
    let id = block.block_id();
    let complete = block.stage(SequenceHash::root(9), BLOCK_SIZE).unwrap();
    assert_eq!(
        (complete.block_id(), complete.sequence_hash()),
        (id, SequenceHash::root(9))
    );
    assert_eq!(audit(&manager).held_blocks, 1);
    let mutable = complete.reset();
    assert_eq!(mutable.block_id(), id);
    assert_eq!(audit(&manager).held_blocks, 1);
    drop(mutable);
    assert_eq!(audit(&manager).free_blocks, 2);
    assert!(
        manager.match_blocks(&[SequenceHash::root(9)]).is_empty(),
        "staged content was never published"
    );
}

#[test]
fn dropping_a_complete_block_frees_it_without_publishing() {
    let manager = manager(1);
    let block = manager.allocate_blocks(1).unwrap().pop().unwrap();
    drop(block.stage(SequenceHash::root(3), BLOCK_SIZE).unwrap());
    assert_eq!(audit(&manager).free_blocks, 1);
    assert_eq!(manager.scan_matches(&[SequenceHash::root(3)]), [false]);
}

#[test]
fn last_immutable_handle_caches_the_block_and_matching_revives_it() {
    let manager = manager(4);
    let hashes = chain(10, 2);
    let blocks = register(&manager, &hashes);
    let a = audit(&manager);
    assert_eq!((a.active_blocks, a.inactive_blocks), (2, 0));

    let extra = blocks.get(0).unwrap();
    drop(blocks);
    let a = audit(&manager);
    assert_eq!(
        (a.active_blocks, a.inactive_blocks),
        (1, 1),
        "block 0 still pinned by its clone"
    );
    drop(extra);
    assert_eq!(audit(&manager).inactive_blocks, 2);

    let matched = manager.match_blocks(&hashes);
    assert_eq!(
        matched.block_ids().collect::<Vec<_>>(),
        [BlockId::new(0), BlockId::new(1)]
    );
    let a = audit(&manager);
    assert_eq!((a.active_blocks, a.inactive_blocks), (2, 0));
}

#[test]
fn match_stops_at_the_first_miss() {
    let manager = manager(4);
    let hashes = chain(1, 3);
    let held = register(&manager, &[hashes[0], hashes[2]]);
    let matched = manager.match_blocks(&hashes);
    assert_eq!(
        matched.len(),
        1,
        "hash 1 misses, so hash 2 is not part of the prefix"
    );
    assert_eq!(manager.scan_matches(&hashes), [true, false, true]);
    let m = manager.metrics();
    assert_eq!((m.match_hashes_requested, m.match_hashes_hit), (3, 1));
    drop((held, matched));
}

#[test]
fn registering_a_known_hash_deduplicates_onto_the_registered_block() {
    let manager = manager(4);
    let first = register(&manager, &chain(5, 1));
    let second = register(&manager, &chain(5, 1));
    assert_eq!(
        second.block_ids().collect::<Vec<_>>(),
        first.block_ids().collect::<Vec<_>>()
    );
    let a = audit(&manager);
    assert_eq!(
        (a.active_blocks, a.free_blocks),
        (1, 3),
        "the duplicate went back to the free pool"
    );
    assert_eq!(manager.metrics().deduplications, 1);
    drop(first);
    assert_eq!(
        audit(&manager).active_blocks,
        1,
        "still pinned by the deduplicated handle"
    );
    drop(second);
    assert_eq!(audit(&manager).inactive_blocks, 1);
}

#[test]
fn deduplicating_a_cached_hash_revives_it() {
    let manager = manager(3);
    drop(register(&manager, &chain(5, 1)));
    let again = register(&manager, &chain(5, 1));
    let a = audit(&manager);
    assert_eq!(
        (a.active_blocks, a.inactive_blocks, a.free_blocks),
        (1, 0, 2)
    );
    drop(again);
}

#[test]
fn allow_duplicates_keeps_a_second_unmatchable_copy_that_frees_on_drop() {
    let manager = kvbm_blocks::BlockManager::<Gpu>::builder()
        .block_count(4)
        .block_size(BLOCK_SIZE)
        .duplicates(DuplicatePolicy::Allow)
        .build()
        .unwrap();
    let hash = chain(5, 1);
    let first = register(&manager, &hash);
    let second = register(&manager, &hash);
    assert_ne!(first[0].block_id(), second[0].block_id());
    assert_eq!(audit(&manager).duplicate_blocks, 1);
    let matched = manager.match_blocks(&hash);
    assert_eq!(
        matched[0].block_id(),
        first[0].block_id(),
        "only the primary is matchable"
    );
    drop((second, matched));
    let a = audit(&manager);
    assert_eq!(
        (a.duplicate_blocks, a.free_blocks, a.active_blocks),
        (0, 3, 1)
    );
    drop(first);
    assert_eq!(audit(&manager).inactive_blocks, 1);
}

#[test]
fn weak_blocks_upgrade_while_held_or_cached_and_not_after_eviction() {
    let manager = manager(2);
    let blocks = register(&manager, &chain(1, 1));
    let weak = blocks.downgrade(0).unwrap();
    let strong = weak.upgrade().expect("held");
    drop((blocks, strong));
    assert_eq!(audit(&manager).inactive_blocks, 1);
    let revived = weak.upgrade().expect("cached blocks upgrade, reviving");
    assert_eq!(audit(&manager).active_blocks, 1);
    drop(revived);
    let all = manager.allocate_blocks(2).unwrap(); // evicts it
    assert!(weak.upgrade().is_none());
    drop(all);
    // The slot now holds other content: the old weak handle must not see it.
    let other = register(&manager, &chain(99, 1));
    assert!(weak.upgrade().is_none());
    drop(other);
}

#[test]
fn single_handles_clone_and_convert_into_batches() {
    let manager = manager(2);
    let block = register(&manager, &chain(1, 1)).pop().unwrap();
    let clone = block.clone();
    assert_eq!(clone.info(), block.info());
    let weak = block.downgrade();
    assert_eq!(weak.sequence_hash(), block.sequence_hash());
    drop(block);
    assert_eq!(audit(&manager).active_blocks, 1);
    let batch = kvbm_blocks::ImmutableBlocks::from(clone);
    assert_eq!(audit(&manager).active_blocks, 1);
    drop(batch);
    assert_eq!(audit(&manager).inactive_blocks, 1);
}

#[test]
fn allocation_evicts_cached_blocks_and_reports_their_hashes() {
    let manager = manager(3);
    let hashes = chain(1, 3);
    drop(register(&manager, &hashes));
    let allocation = manager.allocate_blocks_with_evictions(2).unwrap();
    assert_eq!(
        allocation.evicted,
        [hashes[2], hashes[1]],
        "a batch is released deepest first, so LRU evicts the chain's end first"
    );
    assert_eq!(manager.metrics().evictions, 2);
    assert_eq!(manager.scan_matches(&hashes), [true, false, false]);
    drop(allocation);
}

#[test]
fn clear_cache_frees_every_cached_block_but_not_held_ones() {
    let manager = manager(4);
    let held = register(&manager, &chain(1, 1));
    drop(register(&manager, &chain(10, 2)));
    let cleared = manager.clear_cache();
    let mut expected = chain(10, 2);
    expected.reverse();
    assert_eq!(cleared, expected);
    let a = audit(&manager);
    assert_eq!(
        (a.active_blocks, a.inactive_blocks, a.free_blocks),
        (1, 0, 3)
    );
    drop(held);
}

#[test]
fn handles_dropped_after_the_manager_still_return_their_blocks() {
    let manager = manager(2);
    let clone = manager.clone();
    let blocks = register(&manager, &chain(1, 1));
    drop(manager);
    drop(blocks);
    assert_eq!(audit(&clone).inactive_blocks, 1);
    assert!(clone.same_pool(&clone.clone()));
}

#[test]
fn hand_made_sequential_hashes_all_stay_distinct_at_scale() {
    // Trace ids are small consecutive integers; many of them must all
    // resolve to their own block (lookups stay O(1): see the benches).
    const N: u32 = 1 << 18;
    let manager = manager(N as usize);
    let hashes: Vec<SequenceHash> = (0..u128::from(N)).map(SequenceHash::root).collect();
    let blocks = register(&manager, &hashes);
    let matched = manager.match_blocks(&hashes[N as usize - 3..]);
    assert_eq!(
        matched.block_ids().map(BlockId::get).collect::<Vec<_>>(),
        [N - 3, N - 2, N - 1]
    );
    drop((blocks, matched));
}

#[test]
fn handles_know_which_manager_they_belong_to() {
    let ours = manager(4);
    let theirs = manager(4);
    let mutable = ours.allocate_blocks(1).unwrap().pop().unwrap();
    assert!(mutable.belongs_to(&ours) && mutable.belongs_to(&ours.clone()));
    assert!(!mutable.belongs_to(&theirs));
    let complete = mutable.stage(SequenceHash::root(1), BLOCK_SIZE).unwrap();
    assert!(complete.belongs_to(&ours) && !complete.belongs_to(&theirs));
    let single = ours.register_block(complete).unwrap();
    assert!(single.belongs_to(&ours) && !single.belongs_to(&theirs));
    let weak = single.downgrade();
    assert!(weak.belongs_to(&ours) && !weak.belongs_to(&theirs));
    let batch = kvbm_blocks::ImmutableBlocks::from(single);
    assert!(batch.belongs_to(&ours) && !batch.belongs_to(&theirs));
    let empty = kvbm_blocks::ImmutableBlocks::<Gpu>::new();
    assert!(
        empty.belongs_to(&ours) && empty.belongs_to(&theirs),
        "unattached"
    );
}

/// Real chained hash values use all 128 bits: values that differ only in
/// their high half, or have it set, register, match, stay audited and evict
/// like any other.
#[test]
fn values_using_all_128_bits_register_match_and_evict() {
    let manager = manager(8);
    let values = [u128::MAX, u128::MAX - 1, 1 << 100, (1 << 100) | 5, 7 << 64];
    let mut hashes = vec![SequenceHash::root(values[0])];
    for &value in &values[1..] {
        let parent = hashes[hashes.len() - 1];
        hashes.push(parent.child(value));
    }
    let blocks = register(&manager, &hashes);
    assert_eq!(manager.match_blocks(&hashes).len(), values.len());
    manager
        .audit()
        .expect("every registered block is in the registry");
    drop(blocks);
    assert_eq!(manager.match_blocks(&hashes).len(), values.len(), "cached");
    // Values sharing the low half with a registered one do not match it.
    let impostor = SequenceHash::root((1 << 99) | 0xffff_ffff_ffff_ffff);
    assert!(manager.match_blocks(&[impostor]).is_empty());
    let evicted = manager
        .allocate_blocks_with_evictions(8)
        .expect("all free or evictable");
    assert_eq!(evicted.evicted.len(), values.len());
    manager.audit().expect("consistent after evicting");
    assert!(manager.match_blocks(&hashes).is_empty());
}
