//! `ImmutableBlocks`: one reference to the pool, many pinned blocks.

use kvbm_blocks::{BlockId, ImmutableBlocks, SequenceHash};

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

/// What one side of [`register_releasing_case`] leaves: the table, the
/// pool's counters and partition, the events and the eviction order.
#[derive(Debug, PartialEq)]
struct Outcome {
    table: Vec<u32>,
    metrics: kvbm_blocks::PoolMetrics,
    events: Vec<String>,
    evicted: Vec<SequenceHash>,
}

/// A table of `held` blocks and `staged` more to register, releasing the
/// first `release` of them, in a pool where another request cached the
/// first `shared` blocks of the chain and still pins `pinned` of them.
#[derive(Clone, Copy, Debug)]
struct ReleasingCase {
    eviction: kvbm_blocks::EvictionPolicy,
    duplicates: kvbm_blocks::DuplicatePolicy,
    shared: usize,
    pinned: usize,
    held: usize,
    staged: usize,
    release: usize,
}

/// How [`register_releasing_case`] registers and releases.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ReleasePath {
    /// `register_blocks_onto`, then the table's split and clear, as a
    /// sequence's `register` then `skip_to` did.
    Unfused,
    /// `register_blocks_onto_releasing`.
    Releasing,
    /// `register_passing_onto`, the released new blocks never staged (a
    /// case releasing every held block).
    Passing,
    /// `register_front_onto`, from a run of allocated blocks with one more
    /// block than it registers.
    Front,
}

/// Runs `case` through `path`.
fn register_releasing_case(case: ReleasingCase, path: ReleasePath) -> Outcome {
    let ReleasingCase {
        eviction,
        duplicates,
        shared,
        pinned,
        held,
        staged,
        release,
    } = case;
    let manager = kvbm_blocks::BlockManager::<Gpu>::builder()
        .block_count(96)
        .block_size(crate::BLOCK_SIZE)
        .eviction(eviction)
        .duplicates(duplicates)
        .build()
        .unwrap();
    let hashes = chain(1, held + staged);
    // Another request cached part of the chain (some of it still pinned),
    // and unrelated blocks, so registrations deduplicate or revive.
    let mut other = register(&manager, &hashes[..shared.min(hashes.len())]);
    register(&manager, &chain(100, 3)).clear();
    let pin = other.clone_range(0..pinned.min(other.len()));
    other.clear();
    let subscription = manager.subscribe_events(64);
    let _ = subscription.drain();
    let mut table = register(&manager, &hashes[..held]);
    let mut allocated: std::collections::VecDeque<_> =
        manager.allocate_blocks(staged).unwrap().into();
    let passing = match path {
        ReleasePath::Passing => release.saturating_sub(held).min(staged),
        ReleasePath::Unfused | ReleasePath::Releasing | ReleasePath::Front => 0,
    };
    let mut blocks: Vec<_> = (allocated.split_off(passing).into_iter())
        .zip(&hashes[held + passing..])
        .map(|(block, &hash)| block.stage(hash, crate::BLOCK_SIZE).unwrap())
        .collect();
    let tokens: Vec<u32> = (0..(staged * crate::BLOCK_SIZE) as u32).collect();
    if path == ReleasePath::Front {
        // The same blocks, in one run, and a spare that stays in it.
        let mut run = kvbm_blocks::MutableBlocks::new();
        for block in blocks.drain(..).map(kvbm_blocks::CompleteBlock::reset) {
            run.push(block).unwrap();
        }
        manager.allocate_onto(&mut run, 1).unwrap();
        let spare = run.block_ids()[staged];
        let staged_hashes = &hashes[held..held + staged];
        let registered =
            (manager.register_front_onto(&mut table, &mut run, staged_hashes, &tokens, release))
                .unwrap();
        assert_eq!(registered, staged);
        assert_eq!(run.block_ids(), [spare]);
    } else if path == ReleasePath::Passing {
        assert!(release >= held, "a passing case releases every held block");
        let passed = &hashes[held..held + passing];
        let registered = manager
            .register_passing_onto(&mut table, &mut allocated, passed, &mut blocks, &tokens)
            .unwrap();
        assert_eq!(registered, staged);
        assert!(allocated.is_empty());
    } else if path == ReleasePath::Releasing {
        let registered =
            (manager.register_blocks_onto_releasing(&mut table, &mut blocks, &tokens, release))
                .unwrap();
        assert_eq!(registered, staged);
    } else {
        manager
            .register_blocks_onto(&mut table, &mut blocks, &tokens)
            .unwrap();
        let kept = table.split_off(release);
        table.clear();
        table.append(kept).unwrap();
    }
    assert!(blocks.is_empty());
    audit(&manager);
    manager.flush_events();
    let events = (subscription.drain().iter())
        .flat_map(|message| match message {
            kvbm_blocks::EventMessage::Batch(batch) => {
                batch.events().map(|e| format!("{e:?}")).collect()
            }
            other => vec![format!("{other:?}")],
        })
        .collect();
    let outcome_table = ids(&table);
    let mut metrics = manager.metrics();
    if path == ReleasePath::Front {
        metrics.allocations -= 1; // the spare, freed with the run
    }
    drop((table, pin));
    let evicted = manager
        .allocate_blocks_with_evictions(manager.available_blocks())
        .unwrap()
        .evicted;
    Outcome {
        table: outcome_table,
        metrics,
        events,
        evicted,
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(crate::fuzz::cases()))]

    /// `register_blocks_onto_releasing`, `register_front_onto`, and
    /// `register_passing_onto` when every held block goes, are
    /// `register_blocks_onto` then the table's
    /// head released: the same table, counters, events and eviction order
    /// under every policy, with deduplicated, revived and pinned blocks
    /// among the released ones.
    #[test]
    fn fuzz_register_onto_releasing_matches_register_then_release(
        eviction in proptest::sample::select(vec![
            kvbm_blocks::EvictionPolicy::Lru,
            kvbm_blocks::EvictionPolicy::MultiLevelLru,
            kvbm_blocks::EvictionPolicy::Lineage,
        ]),
        duplicates in proptest::sample::select(vec![
            kvbm_blocks::DuplicatePolicy::Deduplicate,
            kvbm_blocks::DuplicatePolicy::Allow,
        ]),
        held in 0usize..6,
        // Past `register_front_onto`'s read-ahead batch of 32.
        staged in 0usize..40,
        shared in 0usize..44,
        pinned in 0usize..6,
        release in 0usize..48,
    ) {
        let case = ReleasingCase { eviction, duplicates, shared, pinned, held, staged, release };
        let unfused = register_releasing_case(case, ReleasePath::Unfused);
        proptest::prop_assert_eq!(&register_releasing_case(case, ReleasePath::Releasing), &unfused);
        proptest::prop_assert_eq!(&register_releasing_case(case, ReleasePath::Front), &unfused);
        if release >= held {
            proptest::prop_assert_eq!(&register_releasing_case(case, ReleasePath::Passing), &unfused);
        }
    }
}

#[test]
fn register_onto_releasing_refused_changes_nothing() {
    let manager = manager(8);
    let other = crate::manager(2);
    let hashes = chain(1, 4);
    let mut table = register(&manager, &hashes[..2]);
    let mut staged = crate::stage(&manager, &hashes[2..]);
    let before = (manager.metrics(), audit(&manager));

    // Tokens of the wrong length: refused, nothing registered or released.
    let error = (manager.register_blocks_onto_releasing(&mut table, &mut staged, &[1, 2, 3], 3))
        .unwrap_err();
    assert!(matches!(
        error,
        kvbm_blocks::BlockError::TokenCountMismatch { .. }
    ));
    assert_eq!((ids(&table), staged.len()), (vec![0, 1], 2));
    assert_eq!((manager.metrics(), audit(&manager)), before);
    // Another manager's table: refused the same way, that table untouched.
    let mut foreign = register(&other, &chain(9, 1));
    let error =
        (manager.register_blocks_onto_releasing(&mut foreign, &mut staged, &[], 3)).unwrap_err();
    assert_eq!(error, kvbm_blocks::BlockError::ForeignManager);
    assert_eq!((foreign.len(), staged.len()), (1, 2));
    assert!(foreign.belongs_to(&other));
    // Another manager's blocks: refused too.
    let mut strays = crate::stage(&other, &chain(20, 1));
    let error =
        (manager.register_blocks_onto_releasing(&mut table, &mut strays, &[], 3)).unwrap_err();
    assert_eq!(error, kvbm_blocks::BlockError::ForeignManager);
    assert_eq!((ids(&table), strays.len()), (vec![0, 1], 1));
    assert_eq!((manager.metrics(), audit(&manager)), before);

    // Accepted: the two held and the first new block are released, last
    // first; a release past the end releases everything.
    assert_eq!(
        manager.register_blocks_onto_releasing(&mut table, &mut staged, &[], 3),
        Ok(2)
    );
    assert_eq!(ids(&table), [3]);
    assert_eq!(manager.match_blocks(&hashes).len(), 4);
    let mut last = crate::stage(&manager, &chain(1, 5)[4..]);
    assert_eq!(
        manager.register_blocks_onto_releasing(&mut table, &mut last, &[], 99),
        Ok(1)
    );
    assert!(table.is_empty() && table.belongs_to(&manager));
    let a = audit(&manager);
    assert_eq!((a.active_blocks, a.inactive_blocks), (0, 5));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(crate::fuzz::cases()))]

    /// `release_head` is `split_off` of the rest, `clear` and `append`:
    /// the same table, counters and eviction order, with blocks another
    /// handle still pins among the released ones.
    #[test]
    fn fuzz_release_head_matches_split_clear_append(
        len in 0usize..10,
        pinned in proptest::collection::vec(proptest::bool::ANY, 10),
        count in 0usize..12,
    ) {
        let case = |in_place: bool| {
            let manager = manager(16);
            let mut table = register(&manager, &chain(1, len));
            let pins: Vec<_> = (0..len)
                .filter(|&i| pinned[i])
                .filter_map(|i| table.get(i))
                .collect();
            if in_place {
                table.release_head(count);
            } else {
                let kept = table.split_off(count);
                table.clear();
                table.append(kept).unwrap();
            }
            audit(&manager);
            let (ids, metrics) = (ids(&table), manager.metrics());
            drop((table, pins));
            let evicted = manager
                .allocate_blocks_with_evictions(manager.available_blocks())
                .unwrap()
                .evicted;
            (ids, metrics, evicted)
        };
        proptest::prop_assert_eq!(case(true), case(false));
    }
}

#[test]
fn release_head_of_an_empty_table_or_of_no_block_changes_nothing() {
    let manager = manager(4);
    let mut empty = ImmutableBlocks::<Gpu>::new();
    empty.release_head(3);
    assert!(empty.is_empty());
    let mut table = register(&manager, &chain(1, 2));
    table.release_head(0);
    assert_eq!(ids(&table), [0, 1]);
    table.release_head(9);
    assert!(table.is_empty() && table.belongs_to(&manager));
    assert_eq!(audit(&manager).inactive_blocks, 2);
}

#[test]
fn register_passing_onto_refused_changes_nothing() {
    let manager = manager(8);
    let other = crate::manager(4);
    let hashes = chain(1, 4);
    let mut table = register(&manager, &hashes[..1]);
    let mut passing: std::collections::VecDeque<_> = manager.allocate_blocks(2).unwrap().into();
    let mut staged = crate::stage(&manager, &hashes[3..]);
    let before = (manager.metrics(), audit(&manager));
    let unchanged = |table: &ImmutableBlocks<Gpu>, passing: usize, staged: usize| {
        assert_eq!((ids(table).len(), passing, staged), (1, 2, 1));
        assert_eq!((manager.metrics(), audit(&manager)), before);
    };

    // More hashes than passing blocks.
    let error = manager
        .register_passing_onto(&mut table, &mut passing, &hashes[..3], &mut staged, &[])
        .unwrap_err();
    assert!(matches!(
        error,
        kvbm_blocks::BlockError::InsufficientBlocks { .. }
    ));
    unchanged(&table, passing.len(), staged.len());
    // Tokens of the wrong length.
    let error = manager
        .register_passing_onto(&mut table, &mut passing, &hashes[1..3], &mut staged, &[1])
        .unwrap_err();
    assert!(matches!(
        error,
        kvbm_blocks::BlockError::TokenCountMismatch { .. }
    ));
    unchanged(&table, passing.len(), staged.len());
    // A passing block of another manager.
    passing.push_front(other.allocate_blocks(1).unwrap().pop().unwrap());
    let error = manager
        .register_passing_onto(&mut table, &mut passing, &hashes[..3], &mut staged, &[])
        .unwrap_err();
    assert_eq!(error, kvbm_blocks::BlockError::ForeignManager);
    passing.pop_front();
    unchanged(&table, passing.len(), staged.len());
    // Another manager's table.
    let mut foreign = register(&other, &chain(9, 1));
    let error = manager
        .register_passing_onto(&mut foreign, &mut passing, &hashes[1..3], &mut staged, &[])
        .unwrap_err();
    assert_eq!(error, kvbm_blocks::BlockError::ForeignManager);
    assert!(foreign.belongs_to(&other) && foreign.len() == 1);
    unchanged(&table, passing.len(), staged.len());

    // Accepted: the held block and the passing ones released, the staged
    // one kept.
    assert_eq!(
        manager.register_passing_onto(&mut table, &mut passing, &hashes[1..3], &mut staged, &[]),
        Ok(3)
    );
    assert_eq!(ids(&table).len(), 1);
    assert!(passing.is_empty() && staged.is_empty());
    assert_eq!(manager.match_blocks(&hashes).len(), 4);
    drop(table);
    let a = audit(&manager);
    assert_eq!((a.active_blocks, a.inactive_blocks), (0, 4));
}

/// A retagged chain is the chain of the retagged values, field by field
/// (a root keeps no parent), and a tagged pool key never equals the
/// untagged one.
#[test]
fn retagged_chains_are_chains_of_retagged_values() {
    let tag = 0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834_u128;
    let mut plain = vec![SequenceHash::root(7)];
    let mut tagged = vec![SequenceHash::root(7 ^ tag)];
    for value in [11u128, u128::MAX, 0, 1 << 100] {
        plain.push(plain[plain.len() - 1].child(value));
        tagged.push(tagged[tagged.len() - 1].child(value ^ tag));
    }
    for (p, t) in plain.iter().zip(&tagged) {
        assert_eq!(p.retagged(tag), *t);
        assert_eq!(t.retagged(tag), *p);
        assert_ne!(p.value(), t.value());
        assert_eq!(p.position(), t.position());
    }
    assert_eq!(tagged[0].parent(), None);
    assert_eq!(SequenceHash::root(3).retagged(0), SequenceHash::root(3));
}

#[test]
fn a_match_fills_a_dropped_batchs_buffer_with_the_room_asked_for() {
    let manager = manager(16);
    let hashes = chain(1, 8);
    let held = register(&manager, &hashes);
    for capacity in [0, 2, 12, 16, 40] {
        // The previous match's buffer comes back, whatever its size.
        let matched = manager.match_blocks_with_capacity(&hashes, capacity);
        assert_eq!(ids(&matched), ids(&held));
        assert!(matched.capacity() >= capacity.clamp(8, 16));
    }
    drop(held);
    assert_eq!(audit(&manager).inactive_blocks, 8);
}

#[test]
fn a_pool_keeps_a_few_small_buffers_only() {
    let manager = manager(1024);
    let hashes = chain(1, 4);
    let _held = register(&manager, &hashes);
    // A large table's buffer is freed, not kept for the next match.
    drop(manager.match_blocks_with_capacity(&hashes, 600));
    assert!(manager.match_blocks(&hashes).capacity() < 600);
    // Of five small ones dropped, four are kept: the fifth match allocates.
    let batches: Vec<_> = (0..5)
        .map(|_| manager.match_blocks_with_capacity(&hashes, 100))
        .collect();
    drop(batches);
    let matched: Vec<_> = (0..5).map(|_| manager.match_blocks(&hashes)).collect();
    let kept = matched
        .iter()
        .filter(|batch| batch.capacity() >= 100)
        .count();
    assert_eq!(kept, 4);
    assert!(matched.iter().all(|batch| ids(batch) == [0, 1, 2, 3]));
}
