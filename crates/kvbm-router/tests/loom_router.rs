//! Loom models of the router's worker protocol: every interleaving (up to
//! `LOOM_MAX_PREEMPTIONS`) of a few threads adding and removing workers,
//! applying their events and routing, through the public API, over the
//! real lock order (order list, map shard, tally, index table, worker set;
//! see `src/router.rs`). A lock-order inversion shows up as a loom
//! deadlock, a half-added or half-removed worker as a failed assertion.
//!
//! Run: `RUSTFLAGS="--cfg kvbm_loom -C debug-assertions" LOOM_MAX_PREEMPTIONS=2
//! cargo test -p kvbm-router --release --target-dir target/loom --test loom_router`
#![cfg(kvbm_loom)]

use loom::sync::Arc;
use loom::thread;

use kvbm_events::{BlockHash, BlockStored, KvEvent};
use kvbm_router::{Candidate, Decision, KvAware, RouteRequest, Router, RouterError, WorkerId};

/// The worker that comes and goes.
const W: WorkerId = 7;

/// A worker that stays (in the other shard of the loom workers map).
const BYSTANDER: WorkerId = 8;

/// A stored event for integer-hashed blocks `keys` (tokens are not read).
fn stored(keys: &[u64]) -> KvEvent {
    KvEvent::BlockStored(BlockStored {
        block_hashes: keys.iter().map(|&k| BlockHash::Int(k)).collect(),
        parent_block_hash: None,
        token_ids: Vec::new(),
        block_size: 16,
        lora_id: None,
        medium: None,
        lora_name: None,
    })
}

/// A request for the blocks `keys`, 16 tokens each.
fn request(keys: &[u128]) -> RouteRequest<'_> {
    RouteRequest {
        keys,
        prompt_tokens: 16 * keys.len(),
        block_size: 16,
    }
}

/// The candidates a route for `keys` weighs.
fn candidates(router: &Router, keys: &[u128]) -> Vec<Candidate> {
    router.candidates(&request(keys))
}

/// A removal racing a re-add of the same worker, then the re-added
/// worker's first event (what a health check and discovery do to a
/// restarting engine): either the re-add came after the removal and the
/// worker is whole and fresh (listed, counted, its new block found by a
/// route, its old one gone), or it came first, was refused as a duplicate,
/// and the removal left nothing (its events refused). Never a zombie:
/// listed but refusing its events, or its fresh block wiped.
#[test]
fn readd_racing_removal_leaves_a_whole_worker_or_none() {
    loom::model(|| {
        let router = Arc::new(Router::new());
        router.add_worker(W).expect("fresh worker");
        router.apply(W, &stored(&[1])).expect("live worker");
        let remover = {
            let router = Arc::clone(&router);
            thread::spawn(move || router.remove_worker(W))
        };
        let added = router.add_worker(W);
        let applied = router.apply(W, &stored(&[2]));
        // Listed until the removal, so the removal finds it.
        assert_eq!(remover.join().expect("no panic"), Ok(()));

        router.audit().expect("consistent after the race");
        if router.workers() == [W] {
            assert_eq!(added, Ok(()), "listed, yet the re-add was refused");
            assert_eq!(applied, Ok(()), "a zombie: listed but refusing events");
            let stats = router.stats(W).expect("listed, so counted");
            assert_eq!(stats.held_blocks, 1, "the block stored after the re-add");
            assert_eq!(
                candidates(&router, &[2]),
                [Candidate::new(W, 1, Default::default())],
                "the block stored after the re-add is matched"
            );
            assert!(router.index().holders(1).is_empty(), "a block of before");
            assert_eq!(router.apply(W, &stored(&[3])), Ok(()));
            assert_eq!(router.index().held(W), 2);
        } else {
            assert!(router.workers().is_empty());
            assert_eq!(added, Err(RouterError::DuplicateWorker(W)));
            assert_eq!(
                router.apply(W, &stored(&[3])),
                Err(RouterError::UnknownWorker(W))
            );
            assert_eq!(router.stats(W), None);
            assert_eq!(router.index().held(W), 0);
            assert!(router.index().is_empty(), "the old incarnation's blocks");
        }
        router.audit().expect("consistent after one more event");
    });
}

/// An engine's events racing its worker's removal: each event is applied
/// whole before the removal or refused after it (once refused, always
/// refused), and the removal leaves nothing of the worker in the index,
/// however the events fell, while a bystander's blocks stay.
#[test]
fn events_racing_removal_leave_nothing_of_the_worker() {
    loom::model(|| {
        let router = Arc::new(Router::new());
        router.add_worker(W).expect("fresh worker");
        router.add_worker(BYSTANDER).expect("fresh worker");
        router.apply(BYSTANDER, &stored(&[1])).expect("live worker");
        let engine = {
            let router = Arc::clone(&router);
            thread::spawn(move || [1, 2].map(|key| router.apply(W, &stored(&[key]))))
        };
        assert_eq!(router.remove_worker(W), Ok(()));
        let [first, second] = engine.join().expect("no panic");

        for result in [&first, &second] {
            assert!(
                matches!(result, Ok(()) | Err(RouterError::UnknownWorker(W))),
                "{result:?}"
            );
        }
        if first.is_err() {
            assert!(second.is_err(), "accepted after a refusal: {second:?}");
        }
        let audit = router.audit().expect("consistent after the race");
        assert_eq!((audit.workers, audit.held_blocks), (1, 1));
        assert_eq!(router.workers(), [BYSTANDER]);
        assert_eq!(router.stats(W), None);
        assert_eq!(router.index().held(W), 0);
        assert_eq!(router.index().overlaps(&[1, 2]), [(BYSTANDER, 1)]);
        assert!(router.index().holders(2).is_empty());
        assert_eq!(
            candidates(&router, &[1, 2]),
            [Candidate::new(BYSTANDER, 1, Default::default())]
        );
    });
}

/// Two workers added while a request is routed and the router audited:
/// the audit finds each of them whole or absent (never listed without its
/// counters or set, which `candidates` would silently skip), the route
/// still sends the request to the worker holding its prefix, crediting no
/// one else, and both end listed.
#[test]
fn additions_racing_a_route_offer_only_whole_workers() {
    loom::model(|| {
        const HOLDER: WorkerId = 2;
        let router = Arc::new(Router::new());
        router.add_worker(HOLDER).expect("fresh worker");
        router.apply(HOLDER, &stored(&[1])).expect("live worker");
        let adders = [1, 4].map(|worker| {
            let router = Arc::clone(&router);
            thread::spawn(move || router.add_worker(worker))
        });
        let keys = [1, 2];
        let seen = candidates(&router, &keys);
        let decision = router.route(&request(&keys), &mut KvAware::new(0));
        let racing = router.audit();
        for adder in adders {
            assert_eq!(adder.join().expect("no panic"), Ok(()));
        }

        racing.expect("consistent at any moment");
        let ids: Vec<WorkerId> = seen.iter().map(|c| c.worker).collect();
        assert!(
            ids.windows(2).all(|pair| pair[0] < pair[1]),
            "candidates out of order: {ids:?}"
        );
        assert!(ids.contains(&HOLDER), "{ids:?}");
        for candidate in &seen {
            let overlap = usize::from(candidate.worker == HOLDER);
            assert_eq!(candidate.overlap_blocks, overlap, "{candidate:?}");
        }
        assert_eq!(
            decision,
            Some(Decision {
                worker: HOLDER,
                overlap_blocks: 1
            })
        );
        let audit = router.audit().expect("consistent after the race");
        assert_eq!((audit.workers, audit.held_blocks), (3, 1));
        assert_eq!(router.workers(), [1, HOLDER, 4]);
    });
}
