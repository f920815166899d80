//! `ImmutableBlocks`: one reference to the pool, many pinned blocks.

use kvbm_blocks::{BlockId, ImmutableBlocks};

use crate::{Gpu, audit, chain, manager, register};

fn ids(batch: &ImmutableBlocks<Gpu>) -> Vec<u32> {
    batch.block_ids().map(BlockId::get).collect()
}

#[test]
fn truncate_releases_only_the_tail() {
    let manager = manager(4);
    let mut batch = register(&manager, &chain(1, 4));
    batch.truncate(9);
    assert_eq!(batch.len(), 4, "truncating past the end is a no-op");
    batch.truncate(1);
    assert_eq!(ids(&batch), [0]);
    let a = audit(&manager);
    assert_eq!((a.active_blocks, a.inactive_blocks), (1, 3));
    batch.clear();
    assert!(batch.is_empty());
    assert_eq!(audit(&manager).inactive_blocks, 4);
}

#[test]
fn clone_pins_every_block_again_until_both_drop() {
    let manager = manager(3);
    let batch = register(&manager, &chain(1, 3));
    let copy = batch.clone();
    assert_eq!(ids(&copy), ids(&batch));
    drop(batch);
    assert_eq!(audit(&manager).active_blocks, 3);
    drop(copy);
    assert_eq!(audit(&manager).inactive_blocks, 3);
}

#[test]
fn clone_range_pins_only_its_blocks_and_clamps_to_the_end() {
    let manager = manager(4);
    let batch = register(&manager, &chain(1, 4));
    let middle = batch.clone_range(1..3);
    let past = batch.clone_range(3..10);
    let empty = batch.clone_range(7..9);
    assert_eq!((ids(&middle), ids(&past)), (vec![1, 2], vec![3]));
    assert!(empty.is_empty());
    drop(batch);
    assert_eq!(audit(&manager).active_blocks, 3, "1, 2 and 3 still pinned");
    drop((middle, past, empty));
    assert_eq!(audit(&manager).inactive_blocks, 4);
}

#[test]
fn sequence_hashes_are_the_whole_hashes_in_order() {
    let manager = manager(4);
    let hashes = chain(1, 3);
    let batch = register(&manager, &hashes);
    assert_eq!(batch.sequence_hashes(), hashes);
    assert!(
        kvbm_blocks::ImmutableBlocks::<Gpu>::new()
            .sequence_hashes()
            .is_empty()
    );
}

#[test]
fn split_off_and_append_move_references_without_changing_counts() {
    let manager = manager(4);
    let mut head = register(&manager, &chain(1, 4));
    let tail = head.split_off(3);
    let beyond = head.split_off(10);
    assert!(beyond.is_empty());
    assert_eq!((ids(&head), ids(&tail)), (vec![0, 1, 2], vec![3]));
    assert_eq!(audit(&manager).active_blocks, 4);
    head.append(tail).unwrap();
    assert_eq!(ids(&head), [0, 1, 2, 3]);
    assert_eq!(audit(&manager).active_blocks, 4);
    drop(head);
    assert_eq!(audit(&manager).inactive_blocks, 4);
}

#[test]
fn pop_push_and_get_trade_single_handles() {
    let manager = manager(3);
    let mut batch = register(&manager, &chain(1, 3));
    let last = batch.pop().unwrap();
    assert_eq!(last.block_id(), BlockId::new(2));
    assert_eq!(audit(&manager).active_blocks, 3, "pop moves the reference");
    let second = batch.get(1).unwrap();
    assert!(batch.get(7).is_none());
    drop(batch);
    let a = audit(&manager);
    assert_eq!((a.active_blocks, a.inactive_blocks), (2, 1));
    let mut rebuilt = ImmutableBlocks::new();
    rebuilt.push(second).unwrap();
    rebuilt.push(last).unwrap();
    assert_eq!(ids(&rebuilt), [1, 2]);
    drop(rebuilt);
    assert_eq!(audit(&manager).inactive_blocks, 3);
}

#[test]
fn into_iter_hands_out_single_handles_and_releases_the_rest() {
    let manager = manager(4);
    let batch = register(&manager, &chain(1, 4));
    let mut iter = batch.into_iter();
    assert_eq!(iter.len(), 4);
    let first = iter.next().unwrap();
    drop(iter);
    let a = audit(&manager);
    assert_eq!((a.active_blocks, a.inactive_blocks), (1, 3));
    drop(first);
    let all: Vec<_> = manager.match_blocks(&chain(1, 4)).into_iter().collect();
    assert_eq!(all.len(), 4);
    drop(all);
    assert_eq!(audit(&manager).inactive_blocks, 4);
}

#[test]
fn batches_read_as_slices_of_block_info() {
    let manager = manager(2);
    let hashes = chain(7, 2);
    let batch = register(&manager, &hashes);
    let seen: Vec<_> = batch
        .iter()
        .map(|info| (info.hash_value(), info.position()))
        .collect();
    let expected: Vec<_> = hashes.iter().map(|h| (h.value(), h.position())).collect();
    assert_eq!(seen, expected);
    assert!(
        batch
            .iter()
            .zip(&hashes)
            .all(|(info, &hash)| info.holds(hash))
    );
    // A single handle still knows the whole hash, parent included.
    assert_eq!(
        batch.get(1).map(|block| block.sequence_hash()),
        Some(hashes[1])
    );
    assert_eq!(
        batch.downgrade(1).map(|weak| weak.sequence_hash()),
        Some(hashes[1])
    );
    assert_eq!(
        batch.first().map(|info| info.block_id()),
        Some(BlockId::new(0))
    );
    assert!(format!("{batch:?}").contains("block_ids"));
}

#[test]
fn pinned_only_by_counts_the_blocks_no_other_handle_pins() {
    let manager = manager(6);
    let batch = register(&manager, &chain(1, 4));
    assert_eq!(manager.pinned_only_by([&batch]), 4);
    // Another request shares the first two: they stay pinned without it.
    let sharer = batch.clone_range(0..2);
    assert_eq!(manager.pinned_only_by([&batch]), 2);
    // Listed with the sharer, every reference is accounted for.
    assert_eq!(manager.pinned_only_by([&batch, &sharer]), 4);
    assert_eq!(manager.pinned_only_by([&sharer]), 0);
    // An empty list, and a table of another manager, count nothing.
    assert_eq!(manager.pinned_only_by([]), 0);
    let other = crate::manager(2);
    let foreign = register(&other, &chain(7, 2));
    assert_eq!(manager.pinned_only_by([&foreign]), 0);
    // What it counted is what dropping the tables gives back.
    let cached = audit(&manager).inactive_blocks;
    drop(batch);
    assert_eq!(audit(&manager).inactive_blocks, cached + 2);
    drop(sharer);
    assert_eq!(audit(&manager).inactive_blocks, cached + 4);
}

#[test]
fn register_blocks_onto_appends_to_the_table_and_a_refusal_changes_nothing() {
    let manager = manager(6);
    let other = crate::manager(2);
    let hashes = chain(1, 4);
    let mut table = register(&manager, &hashes[..2]);
    let mut staged = crate::stage(&manager, &hashes[2..]);

    // Tokens of the wrong length: refused, both sides as they were.
    let error = (manager.register_blocks_onto(&mut table, &mut staged, &[1, 2, 3])).unwrap_err();
    assert!(matches!(
        error,
        kvbm_blocks::BlockError::TokenCountMismatch { .. }
    ));
    assert_eq!((table.len(), staged.len()), (2, 2));
    // Another manager's table: refused the same way.
    let mut foreign = register(&other, &chain(9, 1));
    let error = (manager.register_blocks_onto(&mut foreign, &mut staged, &[])).unwrap_err();
    assert_eq!(error, kvbm_blocks::BlockError::ForeignManager);
    assert_eq!((foreign.len(), staged.len()), (1, 2));
    let a = audit(&manager);
    assert_eq!(
        (a.active_blocks, a.held_blocks, a.registered_hashes),
        (2, 2, 2)
    );

    assert_eq!(
        manager.register_blocks_onto(&mut table, &mut staged, &[]),
        Ok(2)
    );
    assert!(staged.is_empty());
    assert_eq!(ids(&table), [0, 1, 2, 3]);
    assert_eq!(manager.match_blocks(&hashes).len(), 4);

    // An emptied table attached to another manager takes this one's blocks.
    foreign.clear();
    let mut more = crate::stage(&manager, &chain(5, 1));
    // Refused, it stays the other manager's.
    assert!(
        manager
            .register_blocks_onto(&mut foreign, &mut more, &[1])
            .is_err()
    );
    assert!(foreign.belongs_to(&other) && !foreign.belongs_to(&manager));
    assert_eq!(
        manager.register_blocks_onto(&mut foreign, &mut more, &[]),
        Ok(1)
    );
    assert!(foreign.belongs_to(&manager));
    drop((table, foreign));
    let a = audit(&manager);
    assert_eq!((a.active_blocks, a.inactive_blocks), (0, 5));
}
