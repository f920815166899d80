//! Every `BlockError` a caller can provoke, and that a refused call changes
//! nothing and hands consumed handles back.

use kvbm_blocks::{BlockError, BlockManager, ImmutableBlocks, MAX_BLOCKS, SequenceHash};

use crate::{BLOCK_SIZE, Gpu, audit, chain, manager, register};

#[test]
fn builder_rejects_missing_or_zero_block_count() {
    let missing = BlockManager::<Gpu>::builder().block_size(16).build();
    assert_eq!(missing.unwrap_err(), BlockError::ZeroBlockCount);
    let zero = BlockManager::<Gpu>::builder().block_count(0).build();
    assert_eq!(zero.unwrap_err(), BlockError::ZeroBlockCount);
}

#[test]
fn builder_rejects_zero_block_size() {
    let err = BlockManager::<Gpu>::builder()
        .block_count(4)
        .block_size(0)
        .build();
    assert_eq!(err.unwrap_err(), BlockError::ZeroBlockSize);
}

#[test]
fn builder_rejects_more_blocks_than_ids_can_name() {
    let err = BlockManager::<Gpu>::builder()
        .block_count(MAX_BLOCKS + 1)
        .build();
    assert_eq!(
        err.unwrap_err(),
        BlockError::TooManyBlocks {
            requested: MAX_BLOCKS + 1,
            max: MAX_BLOCKS
        }
    );
}

/// Issue 11, defect 10: the largest pool ids can name needs over 100 GB of
/// bookkeeping; building it used to abort the process ("memory allocation
/// failed"). It is a typed error on any machine that cannot provide it
/// (every machine this project runs on).
#[test]
fn a_pool_too_large_for_memory_is_a_typed_error_not_an_abort() {
    let err = BlockManager::<Gpu>::builder()
        .block_count(MAX_BLOCKS)
        .block_size(16)
        .build();
    assert_eq!(
        err.unwrap_err(),
        BlockError::OutOfMemory { blocks: MAX_BLOCKS }
    );
}

#[test]
fn asking_for_more_blocks_than_exist_says_how_many_do() {
    let manager = manager(4);
    let err = manager.allocate_blocks(5).unwrap_err();
    assert_eq!(
        err,
        BlockError::ExceedsCapacity {
            requested: 5,
            total: 4
        }
    );
    assert_eq!(
        err.to_string(),
        "requested 5 blocks but the pool only has 4"
    );
}

#[test]
fn a_short_pool_refuses_without_allocating_or_evicting_anything() {
    let manager = manager(4);
    let held = manager.allocate_blocks(2).unwrap();
    drop(register(&manager, &chain(1, 1)));
    let before = audit(&manager);
    let err = manager.allocate_blocks(4).unwrap_err();
    assert_eq!(
        err,
        BlockError::InsufficientBlocks {
            requested: 4,
            available: 2
        }
    );
    assert_eq!(
        err.to_string(),
        "requested 4 blocks but only 2 are available"
    );
    assert_eq!(
        audit(&manager),
        before,
        "nothing allocated, nothing evicted"
    );
    assert_eq!(manager.metrics().evictions, 0);
    assert_eq!(manager.scan_matches(&chain(1, 1)), [true]);
    drop(held);
}

#[test]
fn staging_the_wrong_token_count_hands_the_block_back() {
    let manager = manager(2);
    let block = manager.allocate_blocks(1).unwrap().pop().unwrap();
    let id = block.block_id();
    let rejected = block
        .stage(SequenceHash::root(1), BLOCK_SIZE + 1)
        .unwrap_err();
    assert_eq!(
        rejected.error(),
        &BlockError::TokenCountMismatch {
            expected: BLOCK_SIZE,
            actual: BLOCK_SIZE + 1
        }
    );
    let block = rejected.into_inner();
    assert_eq!(block.block_id(), id);
    assert_eq!(audit(&manager).held_blocks, 1, "still allocated to us");
    let complete = block.stage(SequenceHash::root(1), BLOCK_SIZE).unwrap();
    drop(complete);
}

#[test]
fn registering_a_block_from_another_manager_is_refused() {
    let ours = manager(2);
    let theirs = manager(2);
    let block = theirs.allocate_blocks(1).unwrap().pop().unwrap();
    let complete = block.stage(SequenceHash::root(1), BLOCK_SIZE).unwrap();
    let rejected = ours.register_block(complete).unwrap_err();
    assert_eq!(rejected.error(), &BlockError::ForeignManager);
    let complete = rejected.into_inner();
    assert_eq!(audit(&theirs).held_blocks, 1);
    assert_eq!(audit(&ours).free_blocks, 2);
    let registered = theirs.register_block(complete).unwrap();
    assert_eq!(audit(&theirs).active_blocks, 1);
    drop(registered);
}

#[test]
fn a_batch_with_one_foreign_block_registers_nothing() {
    let ours = manager(2);
    let theirs = manager(2);
    let stage = |m: &BlockManager<Gpu>, v| {
        let block = m.allocate_blocks(1).unwrap().pop().unwrap();
        block.stage(SequenceHash::root(v), BLOCK_SIZE).unwrap()
    };
    let batch = vec![stage(&ours, 1), stage(&theirs, 2)];
    let (err, batch) = ours.register_blocks(batch).unwrap_err().into_parts();
    assert_eq!(err, BlockError::ForeignManager);
    assert_eq!(batch.len(), 2);
    assert_eq!(audit(&ours).held_blocks, 1);
    assert_eq!(ours.scan_matches(&[SequenceHash::root(1)]), [false]);
    drop(batch);
    assert_eq!(audit(&ours).free_blocks, 2);
    assert_eq!(audit(&theirs).free_blocks, 2);
}

#[test]
fn batches_refuse_blocks_from_another_manager() {
    let ours = manager(2);
    let theirs = manager(2);
    let mut batch = register(&ours, &chain(1, 1));
    let foreign = register(&theirs, &chain(1, 1));
    let foreign = batch.append(foreign).unwrap_err().into_inner();
    let single = foreign.get(0).unwrap();
    let single = batch.push(single).unwrap_err().into_inner();
    assert_eq!(batch.len(), 1);
    assert_eq!(audit(&theirs).active_blocks, 1);
    drop((single, foreign));
    assert_eq!(audit(&theirs).inactive_blocks, 1);
    drop(batch);
    let mut empty = ImmutableBlocks::<Gpu>::new();
    empty.append(register(&theirs, &chain(1, 1))).unwrap();
    assert_eq!(
        empty.len(),
        1,
        "an empty batch adopts the first manager it sees"
    );
}

#[test]
fn sequence_hash_parts_must_agree() {
    assert_eq!(
        SequenceHash::from_parts(1, Some(0), 0).unwrap_err(),
        BlockError::InvalidSequenceHash {
            position: 0,
            has_parent: true
        }
    );
    let err = SequenceHash::from_parts(1, None, 3).unwrap_err();
    assert_eq!(
        err,
        BlockError::InvalidSequenceHash {
            position: 3,
            has_parent: false
        }
    );
    assert_eq!(
        err.to_string(),
        "a sequence hash at position 3 needs a parent"
    );
}

#[test]
fn errors_are_send_sync_static() {
    fn is_error<E: std::error::Error + Send + Sync + 'static>() {}
    is_error::<BlockError>();
    is_error::<kvbm_blocks::Rejected<kvbm_blocks::MutableBlock<Gpu>>>();
    let rejected: BlockError = manager(1)
        .allocate_blocks(1)
        .unwrap()
        .pop()
        .unwrap()
        .stage(SequenceHash::root(1), 0)
        .unwrap_err()
        .into();
    assert!(matches!(rejected, BlockError::TokenCountMismatch { .. }));
}
