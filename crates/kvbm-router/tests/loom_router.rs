//! Loom models of the router's worker protocol: every interleaving (up to
//! `LOOM_MAX_PREEMPTIONS`) of a few threads adding and removing workers,
//! applying their events and routing, through the public API, over the
//! real lock order (order list, map shard, tally, index table, key shard;
//! see `src/router.rs`), the index's garbage sweeps included. A lock-order inversion shows up as a loom
//! deadlock, a half-added or half-removed worker as a failed assertion.
//!
//! Run: `RUSTFLAGS="--cfg kvbm_loom -C debug-assertions" LOOM_MAX_PREEMPTIONS=2
//! cargo test -p kvbm-router --release --target-dir target/loom --test loom_router`
#![cfg(kvbm_loom)]

use loom::sync::Arc;
use loom::thread;

use kvbm_events::{BlockHash, BlockStored, KvEvent};
use kvbm_router::{
    Candidate, KvAware, PrefixIndex, RouteRequest, Router, RouterError, WorkerId, WorkerLoad,
};

/// The worker that comes and goes.
const W: WorkerId = 7;

/// A worker that stays (in the other shard of the loom workers map).
const BYSTANDER: WorkerId = 8;

/// A stored event for integer-hashed blocks `keys` (tokens are not read).
fn stored(keys: &[u64]) -> KvEvent {
    KvEvent::BlockStored(BlockStored::new(
        keys.iter().map(|&k| BlockHash::Int(k)).collect(),
        None,
        Vec::new(),
        16,
    ))
}

/// A request for the blocks `keys`, 16 tokens each.
fn request(keys: &[u128]) -> RouteRequest<'_> {
    RouteRequest::new(keys, 16 * keys.len(), 16)
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

/// A load report racing the worker's removal and re-add, beside a
/// bystander that reported before: the report lands on the old incarnation
/// (and goes with it), is refused between the two, or lands on the new
/// one; a re-added worker starts with no load, the bystander keeps its
/// own, and a route sees each worker with its own load, never a neighbour's
/// (the loads sit in an array beside the workers, shifted by every
/// addition and removal).
#[test]
fn a_load_report_racing_a_readd_lands_on_one_incarnation() {
    loom::model(|| {
        let busy = WorkerLoad::new(5, 6, 1);
        let bystander_load = WorkerLoad::new(1, 2, 3);
        let router = Arc::new(Router::new());
        router.add_worker(BYSTANDER).expect("fresh worker");
        router.add_worker(W).expect("fresh worker");
        router
            .set_load(BYSTANDER, bystander_load)
            .expect("live worker");
        let restarter = {
            let router = Arc::clone(&router);
            thread::spawn(move || {
                router.remove_worker(W).expect("live worker");
                router.add_worker(W).expect("removed first")
            })
        };
        let reported = router.set_load(W, busy);
        let seen = candidates(&router, &[]);
        restarter.join().expect("no panic");

        router.audit().expect("consistent after the race");
        for candidate in &seen {
            if candidate.worker == BYSTANDER {
                assert_eq!(candidate.load, bystander_load, "{seen:?}");
            } else {
                let own = [WorkerLoad::default(), busy];
                assert!(
                    own.contains(&candidate.load),
                    "a neighbour's load: {seen:?}"
                );
            }
        }
        let after = candidates(&router, &[]);
        let load_of = |worker| after.iter().find(|c| c.worker == worker).map(|c| c.load);
        assert_eq!(load_of(BYSTANDER), Some(bystander_load));
        match load_of(W) {
            Some(load) if load == busy => assert_eq!(reported, Ok(()), "landed, so accepted"),
            Some(load) => {
                assert_eq!(
                    load,
                    WorkerLoad::default(),
                    "the re-added worker starts idle"
                );
                if let Err(error) = reported {
                    assert_eq!(error, RouterError::UnknownWorker(W));
                }
            }
            None => panic!("re-added, so listed: {after:?}"),
        }
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
            decision.map(|d| (d.worker, d.overlap_blocks)),
            Some((HOLDER, 1))
        );
        let audit = router.audit().expect("consistent after the race");
        assert_eq!((audit.workers, audit.held_blocks), (3, 1));
        assert_eq!(router.workers(), [1, HOLDER, 4]);
    });
}

/// A worker removed while a newcomer stores and a lookup runs, on the
/// index alone: the removal sweeps the worker's bits (every removal with
/// blocks does, in the loom build) and frees its slot, which the newcomer
/// may get. The lookup sees the worker whole or gone, never the newcomer
/// credited with the removed worker's blocks (a recycled slot inheriting
/// old bits), and afterwards only what each one stored is there.
#[test]
fn a_recycled_slot_never_inherits_a_removed_workers_blocks() {
    loom::model(|| {
        const NEWCOMER: WorkerId = 9;
        let index = Arc::new(PrefixIndex::new());
        index.insert_many(W, [1, 2]);
        index.insert(1, BYSTANDER);
        let remover = {
            let index = Arc::clone(&index);
            thread::spawn(move || index.remove_worker(W))
        };
        let newcomer = {
            let index = Arc::clone(&index);
            thread::spawn(move || index.insert(3, NEWCOMER))
        };
        let seen = index.overlaps(&[1, 2]);
        assert!(
            seen == [(W, 2), (BYSTANDER, 1)] || seen == [(BYSTANDER, 1)],
            "{seen:?}"
        );
        assert_eq!(remover.join().expect("no panic"), 2);
        assert!(newcomer.join().expect("no panic"));

        assert_eq!(index.overlaps(&[1, 2]), [(BYSTANDER, 1)]);
        assert!(index.holders(2).is_empty());
        assert_eq!(index.overlaps(&[3]), [(NEWCOMER, 1)]);
        assert_eq!((index.held(W), index.held(NEWCOMER)), (0, 1));
        assert_eq!(index.len(), 2);
    });
}

/// A worker's clear racing its own store from another thread, and a
/// lookup: the store (which holds the worker table's read lock
/// throughout, the clear its write lock) lands whole after the clear or is
/// cleared whole, the block held before is gone either way, and the
/// counters agree with what lookups find.
#[test]
fn a_clear_racing_a_store_keeps_counts_and_lookups_agreeing() {
    loom::model(|| {
        let index = Arc::new(PrefixIndex::new());
        index.insert(1, W);
        let clearer = {
            let index = Arc::clone(&index);
            thread::spawn(move || index.clear_worker(W))
        };
        let stored = index.insert_many(W, [2, 3]);
        let seen = index.overlaps(&[2, 3]);
        let cleared = clearer.join().expect("no panic");

        assert_eq!(stored, 2, "both blocks were new to the worker");
        assert!(cleared == 1 || cleared == 3, "cleared {cleared}");
        assert!(index.holders(1).is_empty());
        let held = index.held(W);
        assert_eq!(held, 3 - cleared, "cleared {cleared}");
        let expected: &[(WorkerId, usize)] = if held == 2 { &[(W, 2)] } else { &[] };
        assert_eq!(index.overlaps(&[2, 3]), expected);
        // The store is whole to a lookup on its thread: seen, or cleared
        // since.
        assert!(
            seen == [(W, 2)] || seen.is_empty() && cleared == 3,
            "{seen:?}"
        );
        assert_eq!(index.len(), held);
    });
}

/// Load reports racing a route: a route reads each load without a lock,
/// so one racing two reports of the same worker (from two threads) must
/// still see one whole report, never fields of two, nor a field of a
/// report next to a stale one.
#[test]
fn a_route_racing_load_reports_sees_whole_reports() {
    loom::model(|| {
        let router = Arc::new(Router::new());
        router.add_worker(W).expect("fresh worker");
        // Every report's fields agree, so a torn one shows.
        let report = |k: u64| WorkerLoad::new(k, k, k);
        let reporters: Vec<_> = [1, 2]
            .map(|k| {
                let router = Arc::clone(&router);
                thread::spawn(move || router.set_load(W, report(k)).expect("live worker"))
            })
            .into_iter()
            .collect();
        let seen = candidates(&router, &[]);
        for reporter in reporters {
            reporter.join().expect("no panic");
        }
        let [candidate] = seen.as_slice() else {
            panic!("one worker: {seen:?}");
        };
        assert!(
            [0, 1, 2].map(report).contains(&candidate.load),
            "a torn load: {seen:?}"
        );
        let after = candidates(&router, &[]);
        assert!([1, 2].map(report).contains(&after[0].load), "{after:?}");
    });
}
