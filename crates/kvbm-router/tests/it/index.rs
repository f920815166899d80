//! The prefix index against a plain model, and under threads.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kvbm_router::{PrefixIndex, Router, WorkerId};
use proptest::prelude::*;

use crate::{removed, stored};

#[derive(Clone, Debug)]
enum Op {
    Store(WorkerId, Vec<u64>),
    Remove(WorkerId, Vec<u64>),
    Clear(WorkerId),
    Leave(WorkerId),
    Query(Vec<u64>),
}

fn keys() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(0..12u64, 0..6)
}

fn op() -> impl Strategy<Value = Op> {
    let worker = 0..4u64;
    prop_oneof![
        4 => (worker.clone(), keys()).prop_map(|(w, k)| Op::Store(w, k)),
        2 => (worker.clone(), keys()).prop_map(|(w, k)| Op::Remove(w, k)),
        1 => worker.clone().prop_map(Op::Clear),
        1 => worker.prop_map(Op::Leave),
        3 => keys().prop_map(Op::Query),
    ]
}

/// Workers (and their one key each) that only take low numbers.
const FILLER: u64 = 1_000;

/// What each worker holds, naively.
fn model_overlaps(
    model: &BTreeMap<WorkerId, BTreeSet<u64>>,
    keys: &[u64],
) -> Vec<(WorkerId, usize)> {
    model
        .iter()
        .map(|(&w, held)| (w, keys.iter().take_while(|k| held.contains(k)).count()))
        .filter(|&(_, depth)| depth > 0)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::cases()))]

    /// Any sequence of events, clears, departures (and rejoins) leaves the
    /// router answering overlaps exactly as a per-worker set model does.
    /// Sometimes with 62 more workers holding a block each, so queries walk
    /// many workers that hold none of their blocks.
    #[test]
    fn fuzz_the_router_matches_a_model(
        fillers in prop_oneof![Just(0u64), Just(62u64)],
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let router = Router::new();
        let mut model: BTreeMap<WorkerId, BTreeSet<u64>> = BTreeMap::new();
        for filler in (0..fillers).map(|f| FILLER + f) {
            router.add_worker(filler).unwrap();
            router.apply(filler, &stored(&[filler])).unwrap();
            model.insert(filler, BTreeSet::from([filler]));
        }
        for op in ops {
            match op {
                Op::Store(w, keys) | Op::Remove(w, keys) if !model.contains_key(&w) => {
                    // Unknown workers are refused, and nothing changes; then join.
                    prop_assert!(router.apply(w, &stored(&keys)).is_err());
                    router.add_worker(w).unwrap();
                    model.insert(w, BTreeSet::new());
                }
                Op::Store(w, keys) => {
                    router.apply(w, &stored(&keys)).unwrap();
                    model.get_mut(&w).unwrap().extend(keys);
                }
                Op::Remove(w, keys) => {
                    router.apply(w, &removed(&keys)).unwrap();
                    let held = model.get_mut(&w).unwrap();
                    keys.iter().for_each(|k| { held.remove(k); });
                }
                Op::Clear(w) => match model.get_mut(&w) {
                    Some(held) => { router.clear_worker(w).unwrap(); held.clear(); }
                    None => prop_assert!(router.clear_worker(w).is_err()),
                },
                Op::Leave(w) => match model.remove(&w) {
                    Some(_) => router.remove_worker(w).unwrap(),
                    None => prop_assert!(router.remove_worker(w).is_err()),
                },
                Op::Query(keys) => {
                    let keys128: Vec<u128> = keys.iter().map(|&k| u128::from(k)).collect();
                    prop_assert_eq!(router.index().overlaps(&keys128), model_overlaps(&model, &keys));
                }
            }
            let distinct: BTreeSet<u64> = model.values().flatten().copied().collect();
            prop_assert_eq!(router.index().len(), distinct.len());
            prop_assert_eq!(router.workers(), model.keys().copied().collect::<Vec<_>>());
            for (&w, held) in &model {
                prop_assert_eq!(router.stats(w).unwrap().held_blocks, held.len());
            }
        }
    }
}

#[test]
fn overlap_stops_at_each_workers_first_missing_block() {
    let index = PrefixIndex::new();
    for key in [1, 2, 3] {
        index.insert(key, 7);
    }
    index.insert(1, 9);
    index.insert(3, 9); // a later block without the one before it does not count
    assert_eq!(index.overlaps(&[1, 2, 3, 4]), [(7, 3), (9, 1)]);
    assert_eq!(index.overlaps(&[2, 3]), [(7, 2)]);
    assert!(index.overlaps(&[5, 1]).is_empty());
    assert!(index.overlaps(&[]).is_empty());
    assert!(index.remove(3, 9));
    assert!(!index.remove(3, 9), "already gone");
    assert_eq!(index.holders(3), [7]);
    assert_eq!((index.held(7), index.held(9), index.held(8)), (3, 1, 0));
    assert_eq!(index.len(), 3, "distinct keys");
}

/// Many threads, one per worker, store and remove chains while others
/// query; afterwards the index holds exactly what each worker's own log
/// says it holds, and nothing was lost or duplicated.
#[test]
fn concurrent_workers_and_queries_lose_nothing() {
    concurrent_workers_and_queries(8, 2_000);
}

/// As above with 66 writers.
#[test]
fn concurrent_many_workers_and_queries_lose_nothing() {
    concurrent_workers_and_queries(66, 300);
}

fn concurrent_workers_and_queries(workers: u64, rounds: u64) {
    let router = Arc::new(Router::new());
    for w in 0..workers {
        router.add_worker(w).unwrap();
    }
    let writers: Vec<_> = (0..workers)
        .map(|w| {
            let router = Arc::clone(&router);
            std::thread::spawn(move || {
                let mut held = BTreeSet::new();
                for round in 0..rounds {
                    // Shared keys (0..64) and keys of this worker's own.
                    let key = (round * 7 + w * 13) % 64 + (round % 3) * (1000 + w * 100);
                    if round % 5 == 4 {
                        router.apply(w, &removed(&[key])).unwrap();
                        held.remove(&key);
                    } else {
                        router.apply(w, &stored(&[key])).unwrap();
                        held.insert(key);
                    }
                }
                (w, held)
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let router = Arc::clone(&router);
            std::thread::spawn(move || {
                let keys: Vec<u128> = (0..64).collect();
                for _ in 0..rounds {
                    for (_, depth) in router.index().overlaps(&keys) {
                        assert!(depth <= 64);
                    }
                }
            })
        })
        .collect();
    readers.into_iter().for_each(|r| r.join().unwrap());
    let mut expected: BTreeMap<u64, BTreeSet<WorkerId>> = BTreeMap::new();
    for writer in writers {
        let (w, held) = writer.join().unwrap();
        assert_eq!(router.stats(w).unwrap().held_blocks, held.len());
        for key in held {
            expected.entry(key).or_default().insert(w);
        }
    }
    assert_eq!(router.index().len(), expected.len());
    for (key, workers) in expected {
        let holders: BTreeSet<WorkerId> = router
            .index()
            .holders(u128::from(key))
            .into_iter()
            .collect();
        assert_eq!(holders, workers, "key {key}");
    }
}

/// Many workers (130): lookups, walks, removals and departures see every
/// one, and a newcomer holds only what it stores.
#[test]
fn many_workers_stay_exact() {
    let index = PrefixIndex::new();
    let workers: Vec<WorkerId> = (0..130).map(|w| 5_000 - w).collect();
    for (i, &w) in workers.iter().enumerate() {
        // Every worker holds block 1; worker i also holds 2 when i is even.
        assert_eq!(
            index.insert_many(w, [1, 2].into_iter().take(1 + (i + 1) % 2)),
            1 + (i + 1) % 2
        );
    }
    let mut all = workers.clone();
    all.sort_unstable();
    assert_eq!(index.holders(1), all);
    let even: BTreeSet<WorkerId> = workers.iter().step_by(2).copied().collect();
    let expected: Vec<(WorkerId, usize)> = all
        .iter()
        .map(|w| (*w, if even.contains(w) { 2 } else { 1 }))
        .collect();
    assert_eq!(index.overlaps(&[1, 2, 3]), expected);
    // The last worker leaves block 2, then entirely.
    let last = workers[128];
    assert!(index.remove(2, last));
    assert!(!index.remove(2, last), "already gone");
    assert_eq!(index.remove_worker(last), 1);
    assert!(!index.holders(1).contains(&last));
    // A worker leaves; a newcomer holds only what it stores.
    assert_eq!(index.remove_worker(workers[0]), 2);
    assert!(index.insert(3, 1));
    assert_eq!(index.holders(3), [1]);
    assert!(!index.holders(1).contains(&1));
    assert!(!index.holders(2).contains(&1));
    assert_eq!(index.holders(2).len(), 63);
    for &w in &workers {
        index.remove_worker(w);
    }
    assert_eq!(index.remove_many(1, [3]), 1);
    assert!(index.is_empty(), "{} keys left", index.len());
}

/// Workers that come and go while others store: the ones that stay hold
/// exactly what they stored, and a departed worker holds nothing.
#[test]
fn workers_leaving_and_rejoining_disturb_no_one_else() {
    const STAYING: u64 = 4;
    const ROUNDS: u64 = 1_000;
    let index = Arc::new(PrefixIndex::new());
    let stayers: Vec<_> = (0..STAYING)
        .map(|w| {
            let index = Arc::clone(&index);
            std::thread::spawn(move || {
                for round in 0..u128::from(ROUNDS) {
                    index.insert_many(w, [round, round + 1_000_000]);
                    index.remove_many(w, [round + 1_000_000]);
                }
            })
        })
        .collect();
    let churner = {
        let index = Arc::clone(&index);
        std::thread::spawn(move || {
            for round in 0..u128::from(ROUNDS) {
                index.insert_many(99, [round, round + 1]);
                assert!(index.remove_worker(99) <= 2);
            }
        })
    };
    for stayer in stayers {
        stayer.join().unwrap();
    }
    churner.join().unwrap();
    for w in 0..STAYING {
        assert_eq!(index.held(w), ROUNDS as usize, "worker {w}");
    }
    assert_eq!(index.held(99), 0);
    let keys: Vec<u128> = (0..u128::from(ROUNDS)).collect();
    let expected: Vec<(WorkerId, usize)> = (0..STAYING).map(|w| (w, ROUNDS as usize)).collect();
    assert_eq!(index.overlaps(&keys), expected);
}
