//! Loom models of the block pool: every interleaving (up to the preemption
//! bound) of 2-3 threads allocating, registering, matching, evicting and
//! dropping. Each model ends with an audit: nothing lost, nothing held twice.
//!
//! Run with `cargo xtask loom` (`--cfg kvbm_loom`, `LOOM_MAX_PREEMPTIONS=2`).
#![cfg(kvbm_loom)]

use kvbm_blocks::{BlockError, BlockManager, PoolAudit, SequenceHash};
use loom::thread;

struct Gpu;

const BLOCK_SIZE: usize = 2;

fn manager(blocks: usize) -> BlockManager<Gpu> {
    BlockManager::builder()
        .block_count(blocks)
        .block_size(BLOCK_SIZE)
        .build()
        .unwrap()
}

fn register_one(manager: &BlockManager<Gpu>, value: u64) -> kvbm_blocks::ImmutableBlock<Gpu> {
    let block = manager.allocate_blocks(1).unwrap().pop().unwrap();
    let complete = block
        .stage(SequenceHash::root(value.into()), BLOCK_SIZE)
        .unwrap();
    manager.register_block(complete).unwrap()
}

fn audit(manager: &BlockManager<Gpu>) -> PoolAudit {
    let audit = manager.audit().unwrap();
    assert_eq!(audit.total_blocks(), manager.total_blocks());
    audit
}

#[test]
fn concurrent_allocations_never_hand_out_one_block_twice() {
    loom::model(|| {
        let manager = manager(2);
        let other = manager.clone();
        let t = thread::spawn(move || other.allocate_blocks(1).unwrap());
        let mine = manager.allocate_blocks(1).unwrap();
        let theirs = t.join().unwrap();
        assert_ne!(mine[0].block_id(), theirs[0].block_id());
        assert_eq!(audit(&manager).held_blocks, 2);
        drop((mine, theirs));
        assert_eq!(audit(&manager).free_blocks, 2);
    });
}

#[test]
fn allocation_racing_a_drop_gets_the_block_only_once_it_is_free() {
    loom::model(|| {
        let manager = manager(1);
        let held = manager.allocate_blocks(1).unwrap();
        let dropper = thread::spawn(move || drop(held));
        let got = manager.allocate_blocks(1);
        dropper.join().unwrap();
        match got {
            Ok(blocks) => {
                assert_eq!(audit(&manager).held_blocks, 1);
                drop(blocks);
            }
            Err(err) => assert_eq!(
                err,
                BlockError::InsufficientBlocks {
                    requested: 1,
                    available: 0
                }
            ),
        }
        assert_eq!(audit(&manager).free_blocks, 1);
    });
}

#[test]
fn concurrent_registrations_of_one_hash_share_one_block() {
    loom::model(|| {
        let manager = manager(2);
        let other = manager.clone();
        let t = thread::spawn(move || register_one(&other, 7));
        let mine = register_one(&manager, 7);
        let theirs = t.join().unwrap();
        assert_eq!(mine.block_id(), theirs.block_id(), "deduplicated");
        let a = audit(&manager);
        assert_eq!((a.active_blocks, a.free_blocks), (1, 1));
        drop((mine, theirs));
        assert_eq!(audit(&manager).inactive_blocks, 1);
    });
}

#[test]
fn a_match_racing_the_last_drop_always_finds_the_block() {
    loom::model(|| {
        let manager = manager(2);
        let block = register_one(&manager, 7);
        let dropper = thread::spawn(move || drop(block));
        let matched = manager.match_blocks(&[SequenceHash::root(7)]);
        assert_eq!(matched.len(), 1, "held or cached, never missing");
        dropper.join().unwrap();
        assert_eq!(audit(&manager).active_blocks, 1);
        drop(matched);
        assert_eq!(audit(&manager).inactive_blocks, 1);
    });
}

#[test]
fn eviction_racing_a_match_gives_the_cached_block_to_exactly_one() {
    loom::model(|| {
        let manager = manager(1);
        drop(register_one(&manager, 7));
        let other = manager.clone();
        let matcher = thread::spawn(move || other.match_blocks(&[SequenceHash::root(7)]));
        let allocated = manager.allocate_blocks(1);
        let matched = matcher.join().unwrap();
        match (&allocated, matched.len()) {
            (Ok(_), 0) => assert_eq!(audit(&manager).held_blocks, 1),
            (Err(_), 1) => assert_eq!(audit(&manager).active_blocks, 1),
            (allocated, matched) => panic!("allocated {allocated:?} and matched {matched}"),
        }
        drop((allocated, matched));
        assert_eq!(audit(&manager).in_use_blocks(), 0);
    });
}

#[test]
fn clones_dropped_on_two_threads_release_exactly_once() {
    loom::model(|| {
        let manager = manager(2);
        let blocks = kvbm_blocks::ImmutableBlocks::from(register_one(&manager, 7));
        let copy = blocks.clone();
        let weak = blocks.downgrade(0).unwrap();
        let t = thread::spawn(move || drop(copy));
        let upgraded = weak.upgrade();
        drop(blocks);
        t.join().unwrap();
        assert!(upgraded.is_some(), "cached blocks upgrade too");
        drop(upgraded);
        let a = audit(&manager);
        assert_eq!((a.inactive_blocks, a.free_blocks), (1, 1));
    });
}

#[test]
fn drop_allocate_and_match_on_three_threads_agree_on_one_owner() {
    loom::model(|| {
        let manager = manager(2);
        let held = register_one(&manager, 7);
        let dropper = thread::spawn(move || drop(held));
        let other = manager.clone();
        let allocator = thread::spawn(move || other.allocate_blocks(2));
        let matched = manager.match_blocks(&[SequenceHash::root(7)]);
        dropper.join().unwrap();
        let allocated = allocator.join().unwrap();
        // The allocation needs block 7's slot, so it succeeds exactly when it
        // ran while the block sat in the cache, and then the match missed.
        assert_ne!(allocated.is_ok(), matched.len() == 1, "{allocated:?}");
        let a = audit(&manager);
        assert_eq!(a.held_blocks, if allocated.is_ok() { 2 } else { 0 });
        drop((allocated, matched));
        assert_eq!(audit(&manager).in_use_blocks(), 0);
    });
}
