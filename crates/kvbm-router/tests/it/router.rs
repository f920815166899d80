//! The router fed by real block pools through vLLM's event form.

use kvbm_blocks::{BlockManager, SequenceHash};
use kvbm_events::{HashForm, WireFormat, WireGroup};
use kvbm_router::{KvAware, RouteRequest, Router, RouterError, WorkerLoad, block_key};
use kvbm_sequence::{AttentionKind, BlockSequence, Salt};

use crate::stored;

struct Gpu;

fn chain(len: usize) -> Vec<SequenceHash> {
    let mut hashes: Vec<SequenceHash> = Vec::new();
    for value in 1..=len as u128 {
        hashes.push(match hashes.last() {
            Some(parent) => parent.child(value * 1000),
            None => SequenceHash::root(value * 1000),
        });
    }
    hashes
}

fn pool() -> BlockManager<Gpu> {
    BlockManager::builder()
        .block_count(8)
        .block_size(2)
        .build()
        .unwrap()
}

/// Registers `hashes` in `pool` (with tokens) and keeps them cached.
fn cache(pool: &BlockManager<Gpu>, hashes: &[SequenceHash]) {
    let staged = (pool
        .allocate_blocks(hashes.len())
        .unwrap()
        .into_iter()
        .zip(hashes))
    .map(|(block, &hash)| block.stage(hash, 2).unwrap())
    .collect();
    let tokens: Vec<u32> = (0..2 * hashes.len() as u32).collect();
    drop(pool.register_blocks_with_tokens(staged, &tokens).unwrap());
}

#[test]
fn overlaps_follow_two_pools_events_in_both_hash_forms() {
    for form in [HashForm::Int64, HashForm::Bytes] {
        let (a, b) = (pool(), pool());
        let (events_a, events_b) = (a.subscribe_events(16), b.subscribe_events(16));
        let format = WireFormat::new(2).with_hash_form(form);
        let hashes = chain(5);
        cache(&a, &hashes[..4]);
        cache(&b, &hashes[..2]);
        drop(b.allocate_blocks(7).unwrap()); // evicts b's second block
        a.flush_events();
        b.flush_events();
        let router = Router::new();
        for (worker, events) in [(1, &events_a), (2, &events_b)] {
            router.add_worker(worker).unwrap();
            for message in events.drain() {
                for event in format.events(&message) {
                    router.apply(worker, &event).unwrap();
                }
            }
        }
        let keys: Vec<u128> = (hashes.iter())
            .map(|&h| block_key(&format.hash(h)))
            .collect();
        assert_eq!(router.index().overlaps(&keys), [(1, 4), (2, 1)], "{form:?}");
        let request = RouteRequest::new(&keys, 10, 2);
        let decision = router.route(&request, &mut KvAware::new(0)).unwrap();
        assert_eq!((decision.worker, decision.overlap_blocks), (1, 4));
    }
}

#[test]
fn a_grouped_engines_window_blocks_neither_count_nor_erase_its_full_ones() {
    // A full-attention group and a window group, one pool: both groups'
    // blocks of one prefix go out under the same wire hashes with their
    // group. Evicting the window's blocks must not take the full group's
    // out of the index, nor must storing them count twice: whether the
    // full group is 0 (kvbm's order) or 1 (vLLM's for gpt-oss, whose first
    // layer slides), and whether the router reads the wire's events or
    // the pool's messages.
    let window = AttentionKind::SlidingWindow { window: 4 };
    for (kinds, full_group) in [
        ([AttentionKind::Full, window], 0),
        ([window, AttentionKind::Full], 1),
    ] {
        for from_messages in [false, true] {
            let format = WireFormat::new(2)
                .with_hash_form(HashForm::Int64)
                .with_kv_groups(
                    kinds
                        .iter()
                        .map(|&k| WireGroup::from_attention(k))
                        .collect(),
                );
            let pool = BlockManager::<Gpu>::builder()
                .block_count(8)
                .block_size(2)
                .build()
                .unwrap();
            let events = pool.subscribe_events(16);
            let tokens: Vec<u32> = (0..6).collect();
            let hashes = |group: usize| {
                let salt = Salt::NONE.for_group(group);
                BlockSequence::with_salt(tokens.clone(), 2, salt).unwrap()
            };
            let (full, sliding) = (hashes(full_group), hashes(1 - full_group));
            // The window's blocks first: the least recently used, evicted
            // first.
            cache(&pool, sliding.sequence_hashes());
            cache(&pool, full.sequence_hashes());
            let router = Router::new();
            router.add_worker(1).unwrap();
            let keys: Vec<u128> = (full.sequence_hashes().iter())
                .map(|&h| block_key(&format.hash(h)))
                .collect();
            let apply = |router: &Router| {
                pool.flush_events();
                for message in events.drain() {
                    if from_messages {
                        router.apply_message(1, &message, &format).unwrap();
                        continue;
                    }
                    for event in format.events(&message) {
                        router.apply(1, &event).unwrap();
                    }
                }
            };
            apply(&router);
            let case = format!("full group {full_group}, messages {from_messages}");
            assert_eq!(router.index().overlaps(&keys), [(1, 3)], "{case}");
            assert_eq!(router.index().held(1), 3, "{case}: counted once");
            // Four new blocks take the two free ones and evict two of the
            // window's.
            let held = pool.allocate_blocks(4).unwrap();
            apply(&router);
            assert_eq!(pool.metrics().evictions, 2);
            assert_eq!(
                router.index().overlaps(&keys),
                [(1, 3)],
                "{case}: the full group's stay"
            );
            drop(held);
        }
    }
}

#[test]
fn a_resync_forgets_and_a_restarted_worker_starts_empty() {
    let router = Router::new();
    router.add_worker(1).unwrap();
    router.apply(1, &stored(&[1, 2, 3])).unwrap();
    router.clear_worker(1).unwrap();
    assert!(router.index().is_empty());
    assert_eq!(router.stats(1).unwrap().clears, 1);
    router.apply(1, &stored(&[1])).unwrap();
    router.remove_worker(1).unwrap();
    assert!(
        router.index().is_empty(),
        "a departed worker's blocks leave with it"
    );
    assert_eq!(router.add_worker(1), Ok(()));
    assert_eq!(router.add_worker(1), Err(RouterError::DuplicateWorker(1)));
    assert_eq!(router.stats(1).unwrap().held_blocks, 0);
}

#[test]
fn unknown_workers_are_refused_and_change_nothing() {
    let router = Router::new();
    assert_eq!(
        router.apply(5, &stored(&[1])),
        Err(RouterError::UnknownWorker(5))
    );
    assert_eq!(
        router.set_load(5, WorkerLoad::default()),
        Err(RouterError::UnknownWorker(5))
    );
    assert_eq!(router.remove_worker(5), Err(RouterError::UnknownWorker(5)));
    assert!(router.index().is_empty());
    let request = RouteRequest::new(&[1], 1, 16);
    assert_eq!(router.route(&request, &mut KvAware::new(0)), None);
}

#[test]
fn loads_reach_the_policy() {
    let router = Router::new();
    for worker in [1, 2] {
        router.add_worker(worker).unwrap();
    }
    let busy = WorkerLoad::new(100, 0, 9);
    router.set_load(1, busy).unwrap();
    let request = RouteRequest::new(&[], 32, 16);
    let candidates = router.candidates(&request);
    assert_eq!(candidates[0].load, busy);
    assert_eq!(
        router.route(&request, &mut KvAware::new(0)).unwrap().worker,
        2
    );
}
