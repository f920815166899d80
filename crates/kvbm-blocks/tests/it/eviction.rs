//! Eviction order of each policy, seen through allocations.

use kvbm_blocks::{EvictionPolicy, SequenceHash};

use crate::{Gpu, audit, chain, manager_with, register};

fn evicted(manager: &kvbm_blocks::BlockManager<Gpu>, n: usize) -> Vec<u128> {
    let allocation = manager.allocate_blocks_with_evictions(n).unwrap();
    allocation.evicted.iter().map(|h| h.value()).collect()
}

#[test]
fn lru_evicts_the_least_recently_released_first() {
    let manager = manager_with(4, EvictionPolicy::Lru);
    let a = register(&manager, &chain(1, 1));
    let b = register(&manager, &chain(2, 1));
    let c = register(&manager, &chain(3, 1));
    drop(b);
    drop(a);
    drop(c);
    // One free block goes first, then b, a, c in release order.
    assert_eq!(evicted(&manager, 3), [2, 1]);
    audit(&manager);
}

#[test]
fn a_match_refreshes_recency_under_lru() {
    let manager = manager_with(2, EvictionPolicy::Lru);
    drop(register(&manager, &chain(1, 1)));
    drop(register(&manager, &chain(2, 1)));
    drop(manager.match_blocks(&chain(1, 1)));
    assert_eq!(evicted(&manager, 1), [2]);
}

#[test]
fn multi_level_lru_keeps_frequently_hit_blocks_over_newer_cold_ones() {
    let manager = manager_with(4, EvictionPolicy::MultiLevelLru);
    let hot = chain(1, 1);
    drop(register(&manager, &hot));
    for _ in 0..6 {
        drop(manager.match_blocks(&hot));
    }
    for value in 10..13 {
        drop(register(&manager, &chain(value, 1)));
    }
    // Under LRU, `hot` (released first) would be the first victim.
    assert_eq!(evicted(&manager, 3), [10, 11, 12]);
    assert_eq!(manager.scan_matches(&hot), [true]);
}

#[test]
fn frequency_is_remembered_across_eviction() {
    let manager = manager_with(2, EvictionPolicy::MultiLevelLru);
    let hot = chain(1, 1);
    drop(register(&manager, &hot));
    for _ in 0..6 {
        drop(manager.match_blocks(&hot));
    }
    drop(manager.allocate_blocks(2).unwrap()); // evicts everything
    drop(register(&manager, &hot)); // recomputed: the sketch still knows it
    drop(register(&manager, &chain(5, 1)));
    assert_eq!(evicted(&manager, 1), [5]);
}

/// A chain released root first (as dropping single handles in order does):
/// LRU would evict the shared root first, lineage evicts the leaf.
#[test]
fn lineage_evicts_leaves_before_parents_whatever_the_release_order() {
    for (policy, expected) in [
        (EvictionPolicy::Lru, vec![1, 2]),
        (EvictionPolicy::Lineage, vec![3, 2]),
    ] {
        let manager = manager_with(4, policy);
        let hashes = chain(1, 3);
        let singles: Vec<_> = register(&manager, &hashes).into_iter().collect();
        drop(singles); // a Vec drops front to back: root first
        drop(register(&manager, &[SequenceHash::root(50)]));
        assert_eq!(evicted(&manager, 2), expected, "{policy:?}");
        audit(&manager);
    }
}

#[test]
fn lineage_keeps_a_shared_prefix_while_any_child_is_cached() {
    let manager = manager_with(5, EvictionPolicy::Lineage);
    let prefix = SequenceHash::root(1);
    let left = [prefix, prefix.child(2)];
    let right = [prefix, prefix.child(3)];
    let l = register(&manager, &left);
    let r = manager.match_blocks(&right[..1]);
    let mut r = r;
    r.append(register(&manager, &right[1..])).unwrap();
    let singles: Vec<_> = l.into_iter().chain(r).collect();
    drop(singles); // prefix released early (first handle), children after
    // Evict two: both children go before the prefix they share.
    let mut victims = evicted(&manager, 4);
    victims.sort_unstable();
    assert_eq!(victims, [2, 3]);
    assert_eq!(manager.scan_matches(&[prefix]), [true]);
}

#[test]
fn lineage_falls_back_to_parents_when_no_leaf_is_cached() {
    let manager = manager_with(2, EvictionPolicy::Lineage);
    let hashes = chain(1, 2);
    let mut blocks = register(&manager, &hashes);
    let child = blocks.pop().unwrap(); // keep the leaf pinned
    drop(blocks);
    assert_eq!(evicted(&manager, 1), [1]);
    drop(child);
    audit(&manager);
}
