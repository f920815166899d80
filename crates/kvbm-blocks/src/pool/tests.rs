//! The audit catches every kind of corruption it claims to (it is the oracle
//! of the model and stress tests, so it must not pass a broken pool).

use super::*;

fn pool_with_registered_block() -> PoolState {
    let mut pool = PoolState::new(4, EvictionPolicy::Lru, DuplicatePolicy::Deduplicate).unwrap();
    let ids = pool.allocate(2, |_| {}).unwrap();
    pool.register(ids[0], SequenceHash::root(7), &[]);
    pool.register(ids[1], SequenceHash::root(8), &[]);
    pool.release(ids[1]); // cached
    pool
}

fn violation(pool: &PoolState) -> String {
    match pool.audit() {
        Err(BlockError::InvariantViolated(msg)) => msg,
        other => panic!("corruption not detected: {other:?}"),
    }
}

#[test]
fn a_consistent_pool_passes() {
    let audit = pool_with_registered_block().audit().unwrap();
    assert_eq!(
        (
            audit.free_blocks,
            audit.active_blocks,
            audit.inactive_blocks,
            audit.registered_hashes
        ),
        (2, 1, 1, 2)
    );
}

#[test]
fn a_block_free_listed_twice_is_caught() {
    let mut pool = pool_with_registered_block();
    // Blocks 2 then 3 are free; 3 linking back to 2 lists 2 twice.
    pool.slots[3].refs = 2;
    assert!(violation(&pool).contains("on the free list twice"));
}

#[test]
fn a_free_list_that_ends_early_is_caught() {
    let mut pool = pool_with_registered_block();
    pool.slots[2].refs = u32::MAX;
    assert!(violation(&pool).contains("links 1 blocks and counts 2"));
}

#[test]
fn a_held_block_on_the_free_list_is_caught() {
    let mut pool = pool_with_registered_block();
    pool.slots[2].set_state(SlotState::Held); // still linked
    assert!(violation(&pool).contains("free-listed"));
}

#[test]
fn a_registered_block_missing_from_the_registry_is_caught() {
    let mut pool = pool_with_registered_block();
    assert!(pool.registry.remove(7, BlockId::new(0)));
    assert!(violation(&pool).contains("not in the registry"));
}

#[test]
fn a_pinned_block_in_the_cache_is_caught() {
    let mut pool = pool_with_registered_block();
    pool.inactive.insert(BlockId::new(0), SequenceHash::root(7));
    assert!(violation(&pool).contains("cached: true"));
}

#[test]
fn an_unreferenced_duplicate_is_caught() {
    let mut pool = pool_with_registered_block();
    assert_eq!(pool.free.pop(&mut pool.slots), Some(BlockId::new(2)));
    let slot = &mut pool.slots[2];
    slot.set_state(SlotState::Duplicate);
    assert!(violation(&pool).contains("duplicate"));
}

#[test]
fn a_stray_registry_entry_is_caught() {
    let mut pool = pool_with_registered_block();
    let slots = &pool.slots;
    let stray = pool
        .registry
        .insert_or_get(99, BlockId::new(3), |id| slots[id.index()].value);
    assert_eq!(stray, None, "99 was not registered");
    assert!(violation(&pool).contains("registry holds 3 hashes for 2"));
}

#[test]
fn references_are_sticky_at_saturation_instead_of_wrapping() {
    let mut pool = pool_with_registered_block();
    pool.slots[0].refs = u32::MAX;
    pool.add_ref(BlockId::new(0));
    pool.release(BlockId::new(0));
    assert_eq!(
        pool.slots[0].refs,
        u32::MAX,
        "a saturated block stays pinned"
    );
    assert_eq!(pool.inactive.len(), 1);
}

#[test]
fn a_slot_is_44_bytes_and_a_hash_40() {
    // Memory per cached block is mostly the slot; a nested `SequenceHash`
    // (40 bytes with padding) made it 56, 8-byte alignment 48.
    assert_eq!(std::mem::size_of::<Slot>(), 44);
    assert_eq!(std::mem::size_of::<SequenceHash>(), 40);
    let hash = SequenceHash::root(u128::MAX - 5).child(1 << 100);
    let slot = Slot::new(hash, 2, 3, SlotState::Registered);
    assert_eq!(slot.hash(), hash);
    assert_eq!(slot.value(), 1 << 100);
    assert_eq!(hash.parent(), Some(u128::MAX - 5));
    assert_eq!((slot.epoch(), slot.state()), (3, SlotState::Registered));
}

#[test]
fn a_slot_keeps_its_state_and_epoch_apart() {
    let mut slot = Slot::new(SequenceHash::root(7), 0, (1 << 30) - 1, SlotState::Held);
    slot.set_state(SlotState::Registered);
    assert_eq!(
        (slot.epoch(), slot.state()),
        ((1 << 30) - 1, SlotState::Registered)
    );
    // The epoch wraps within its 30 bits and never disturbs the state.
    slot.end_life();
    assert_eq!((slot.epoch(), slot.state()), (0, SlotState::Free));
    slot.end_life();
    assert_eq!((slot.epoch(), slot.state()), (1, SlotState::Free));
    for state in [SlotState::Held, SlotState::Duplicate, SlotState::Free] {
        slot.set_state(state);
        assert_eq!((slot.epoch(), slot.state()), (1, state));
    }
}
