//! The prefix index against a reference model: each worker's keys as a
//! plain set per medium, every query answered by walking every worker (what
//! the index did before it kept holders per key).
//!
//! Arbitrary sequences of stores, evictions, additions, removals and
//! clears across media, with floods of many workers onto one key (so
//! holder sets pass through every form: inline, list, bitset) and churn of
//! many workers (so retired slots pile up, get swept and are reused), on
//! the standalone index and on a router's. After every op: overlaps on
//! every medium, holders, tiered overlaps, counts and distinct keys equal
//! the model's. `cargo xtask fuzz` runs it long (`KVBM_FUZZ_CASES`).

use std::collections::{BTreeMap, BTreeSet};

use kvbm_events::{BlockHash, BlockRemoved, BlockStored, KvEvent};
use kvbm_router::{PrefixIndex, Router, WorkerId};
use proptest::prelude::*;

/// Media the ops name: the device under both its names, two lower tiers.
const MEDIA: [Option<&str>; 4] = [None, Some("GPU"), Some("CPU"), Some("DISK")];

/// Workers of floods and churn: enough for slots past 128, where a
/// holder set of a few is a list before it is a bitset (below 64 slots a
/// bitset is never larger than a list).
const CROWD: u64 = 1_000;
const CROWD_MAX: u64 = 150;

#[derive(Clone, Debug)]
enum Op {
    Store(WorkerId, usize, Vec<u128>),
    Evict(WorkerId, usize, Vec<u128>),
    Add(WorkerId),
    RemoveWorker(WorkerId),
    Clear(WorkerId),
    /// Workers `CROWD + from ..` (`count` of them) store `key`.
    Flood {
        key: u128,
        from: u64,
        count: u64,
    },
    /// Every other crowd worker from `from` is removed or cleared.
    Churn {
        from: u64,
        remove: bool,
    },
}

fn worker() -> impl Strategy<Value = WorkerId> {
    prop_oneof![
        4 => 0..4u64,
        1 => Just(u64::MAX),
        2 => (0..CROWD_MAX).prop_map(|w| CROWD + w),
    ]
}

fn keys() -> impl Strategy<Value = Vec<u128>> {
    let key = || prop_oneof![6 => 0..10u128, 1 => Just(u128::MAX)];
    prop_oneof![
        8 => prop::collection::vec(key(), 0..6),
        // Longer than the index takes in one round of locks, with every
        // key many times over.
        1 => prop::collection::vec(key(), 60..140),
    ]
}

fn medium() -> impl Strategy<Value = usize> {
    prop_oneof![3 => Just(0usize), 2 => Just(1), 2 => Just(2), 1 => Just(3)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (worker(), medium(), keys()).prop_map(|(w, m, k)| Op::Store(w, m, k)),
        3 => (worker(), medium(), keys()).prop_map(|(w, m, k)| Op::Evict(w, m, k)),
        1 => worker().prop_map(Op::Add),
        1 => worker().prop_map(Op::RemoveWorker),
        1 => worker().prop_map(Op::Clear),
        1 => (0..10u128, 0..CROWD_MAX, 1..CROWD_MAX)
            .prop_map(|(key, from, count)| Op::Flood { key, from, count }),
        1 => (0..CROWD_MAX, any::<bool>()).prop_map(|(from, remove)| Op::Churn { from, remove }),
    ]
}

/// Lower-tier weights a tiered query names (the device and a medium never
/// stored on are skipped by the index; zero and negative weights count).
fn weights() -> impl Strategy<Value = Vec<(&'static str, f64)>> {
    let name = prop::sample::select(vec!["CPU", "DISK", "GPU", "NVME"]);
    let weight = prop::sample::select(vec![0.0, 0.25, 0.5, 1.0, -0.5]);
    prop::collection::vec((name, weight), 0..4)
}

/// The index, naively: each worker's keys per medium slot, slots numbered
/// in order of first store as the index numbers them (the device is 0).
#[derive(Debug, Default)]
struct Model {
    /// Lower media, in slot order from 1.
    media: Vec<&'static str>,
    /// Each worker's keys, by medium slot.
    workers: BTreeMap<WorkerId, BTreeMap<usize, BTreeSet<u128>>>,
}

impl Model {
    fn find(&self, medium: Option<&str>) -> Option<usize> {
        match medium {
            None | Some("GPU") => Some(0),
            Some(name) => self.media.iter().position(|m| *m == name).map(|at| at + 1),
        }
    }

    fn admit(&mut self, medium: Option<&'static str>) -> usize {
        self.find(medium).unwrap_or_else(|| {
            self.media.push(medium.unwrap_or_default());
            self.media.len()
        })
    }

    fn held(&self, worker: WorkerId) -> usize {
        self.workers
            .get(&worker)
            .map_or(0, |held| held.values().map(BTreeSet::len).sum())
    }

    fn on(&self, worker: WorkerId, slot: usize) -> Option<&BTreeSet<u128>> {
        self.workers.get(&worker)?.get(&slot)
    }

    fn overlaps(&self, slot: usize, keys: &[u128]) -> Vec<(WorkerId, usize)> {
        (self.workers.keys())
            .filter_map(|&w| {
                let held = self.on(w, slot)?;
                let depth = keys.iter().take_while(|k| held.contains(k)).count();
                (depth > 0).then_some((w, depth))
            })
            .collect()
    }

    fn holders(&self, key: u128) -> Vec<WorkerId> {
        (self.workers.keys().copied())
            .filter(|&w| self.on(w, 0).is_some_and(|held| held.contains(&key)))
            .collect()
    }

    /// As the index documents it: the device prefix, then each block
    /// credited at the weight of the first named lower medium holding it,
    /// up to the first none holds.
    fn tiered(&self, weights: &[(&str, f64)], keys: &[u128]) -> Vec<(WorkerId, usize, f64)> {
        let slots: Vec<(usize, f64)> = (weights.iter())
            .filter_map(|&(name, weight)| {
                let slot = self.find(Some(name))?;
                (slot != 0).then_some((slot, weight))
            })
            .collect();
        (self.workers.keys().copied())
            .filter_map(|w| {
                let depth = self.on(w, 0).map_or(0, |held| {
                    keys.iter().take_while(|k| held.contains(k)).count()
                });
                let mut credit = 0.0;
                for key in &keys[depth..] {
                    let weight = (slots.iter()).find_map(|&(slot, weight)| {
                        self.on(w, slot)?.contains(key).then_some(weight)
                    });
                    match weight {
                        Some(weight) => credit += weight,
                        None => break,
                    }
                }
                (depth > 0 || credit > 0.0).then_some((w, depth, credit))
            })
            .collect()
    }

    fn distinct(&self) -> usize {
        let keys: BTreeSet<u128> = (self.workers.values())
            .flat_map(|media| media.values().flatten().copied())
            .collect();
        keys.len()
    }
}

/// The index under test: standalone (a store adds its worker) or a
/// router's (a store from an unknown worker is refused).
enum Target {
    Index(PrefixIndex),
    Router(Router),
}

fn stored_on(keys: &[u128], medium: Option<&str>) -> KvEvent {
    // Keys below 2^64 go as integer hashes, the rest as 16-byte strings
    // (keyed by their value either way).
    let hashes = keys.iter().map(|&k| match u64::try_from(k) {
        Ok(k) => BlockHash::Int(k),
        Err(_) => BlockHash::Bytes(k.to_be_bytes().to_vec().into()),
    });
    let mut stored = BlockStored::new(hashes.collect(), None, Vec::new(), 16);
    stored.medium = medium.map(str::to_owned);
    KvEvent::BlockStored(stored)
}

fn removed_on(keys: &[u128], medium: Option<&str>) -> KvEvent {
    let KvEvent::BlockStored(stored) = stored_on(keys, medium) else {
        unreachable!("a store")
    };
    let mut removed = BlockRemoved::new(stored.block_hashes);
    removed.medium = medium.map(str::to_owned);
    KvEvent::BlockRemoved(removed)
}

impl Target {
    fn index(&self) -> &PrefixIndex {
        match self {
            Target::Index(index) => index,
            Target::Router(router) => router.index(),
        }
    }

    /// Applies `op` to the target and the model, checking what the target
    /// returns.
    fn apply(&self, model: &mut Model, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Store(w, m, keys) => self.store(model, *w, MEDIA[*m], keys)?,
            Op::Evict(w, m, keys) => {
                let medium = MEDIA[*m];
                let slot = model.find(medium);
                let known = model.workers.contains_key(w);
                let held = (model.workers.get_mut(w))
                    .and_then(|media| media.get_mut(&slot?))
                    .map_or(0, |held| {
                        let mut distinct = keys.clone();
                        distinct.sort_unstable();
                        distinct.dedup();
                        distinct.iter().filter(|k| held.remove(k)).count()
                    });
                match self {
                    Target::Index(index) => {
                        prop_assert_eq!(index.remove_many_on(*w, medium, keys.clone()), held);
                    }
                    Target::Router(router) => {
                        let before = router.stats(*w).map(|s| s.held_blocks);
                        let result = router.apply(*w, &removed_on(keys, medium));
                        prop_assert_eq!(result.is_ok(), known);
                        let after = router.stats(*w).map(|s| s.held_blocks);
                        prop_assert_eq!(before.map(|b| b - held), after);
                    }
                }
            }
            Op::Add(w) => {
                match self {
                    Target::Index(index) => {
                        index.insert_many(*w, []);
                    }
                    Target::Router(router) => {
                        let added = router.add_worker(*w).is_ok();
                        prop_assert_eq!(added, !model.workers.contains_key(w));
                    }
                }
                model.workers.entry(*w).or_default();
            }
            Op::RemoveWorker(w) => self.remove_worker(model, *w)?,
            Op::Clear(w) => self.clear(model, *w)?,
            Op::Flood { key, from, count } => {
                let crowd = (CROWD + from..CROWD + from + count).filter(|w| w - CROWD < CROWD_MAX);
                for w in crowd {
                    if let Target::Router(router) = self {
                        let _ = router.add_worker(w);
                        model.workers.entry(w).or_default();
                    }
                    self.store(model, w, None, &[*key])?;
                }
            }
            Op::Churn { from, remove } => {
                for w in (CROWD + from..CROWD + CROWD_MAX).step_by(2) {
                    match remove {
                        true => self.remove_worker(model, w)?,
                        false => self.clear(model, w)?,
                    }
                }
            }
        }
        Ok(())
    }

    fn store(
        &self,
        model: &mut Model,
        w: WorkerId,
        medium: Option<&'static str>,
        keys: &[u128],
    ) -> Result<(), TestCaseError> {
        let known = model.workers.contains_key(&w);
        if matches!(self, Target::Router(_)) && !known {
            let refused = self.apply_router(w, &stored_on(keys, medium)).is_err();
            prop_assert!(refused, "a store from unknown worker {} accepted", w);
            return Ok(());
        }
        let slot = model.admit(medium);
        let held = model.workers.entry(w).or_default().entry(slot).or_default();
        let new = keys.iter().filter(|&&k| held.insert(k)).count();
        match self {
            Target::Index(index) => {
                prop_assert_eq!(index.insert_many_on(w, medium, keys.to_vec()), Ok(new));
            }
            Target::Router(router) => {
                let before = router.stats(w).map_or(0, |s| s.held_blocks);
                prop_assert!(router.apply(w, &stored_on(keys, medium)).is_ok());
                let after = router.stats(w).map_or(0, |s| s.held_blocks);
                prop_assert_eq!(after - before, new);
            }
        }
        Ok(())
    }

    fn apply_router(&self, w: WorkerId, event: &KvEvent) -> Result<(), kvbm_router::RouterError> {
        match self {
            Target::Router(router) => router.apply(w, event),
            Target::Index(_) => Ok(()),
        }
    }

    fn remove_worker(&self, model: &mut Model, w: WorkerId) -> Result<(), TestCaseError> {
        let held = model.held(w);
        let known = model.workers.remove(&w).is_some();
        match self {
            Target::Index(index) => prop_assert_eq!(index.remove_worker(w), held),
            Target::Router(router) => prop_assert_eq!(router.remove_worker(w).is_ok(), known),
        }
        Ok(())
    }

    fn clear(&self, model: &mut Model, w: WorkerId) -> Result<(), TestCaseError> {
        let held = model.held(w);
        let known = model.workers.get_mut(&w).map(BTreeMap::clear).is_some();
        match self {
            Target::Index(index) => prop_assert_eq!(index.clear_worker(w), held),
            Target::Router(router) => prop_assert_eq!(router.clear_worker(w).is_ok(), known),
        }
        Ok(())
    }
}

/// Every query of the index equals the model's answer.
fn check(
    target: &Target,
    model: &Model,
    queries: &[Vec<u128>],
    weights: &[(&'static str, f64)],
) -> Result<(), TestCaseError> {
    let index = target.index();
    for keys in queries {
        for medium in MEDIA {
            let expected = model
                .find(medium)
                .map_or_else(Vec::new, |slot| model.overlaps(slot, keys));
            prop_assert_eq!(
                index.overlaps_on(medium, keys),
                expected,
                "{:?} {:?}",
                medium,
                keys
            );
        }
        prop_assert_eq!(index.overlaps(keys), model.overlaps(0, keys));
        prop_assert_eq!(
            index.tiered_overlaps(weights, keys),
            model.tiered(weights, keys),
            "{:?} {:?}",
            weights,
            keys
        );
    }
    for key in (0..10).chain([u128::MAX]) {
        prop_assert_eq!(index.holders(key), model.holders(key), "key {}", key);
    }
    // Counters of a sample: the small ids, a few of the crowd, two never
    // seen (every worker's own count is in the router's audit).
    let sample = [
        0,
        1,
        2,
        3,
        4,
        u64::MAX,
        CROWD,
        CROWD + 1,
        CROWD + 99,
        CROWD + CROWD_MAX,
    ];
    for w in sample {
        prop_assert_eq!(index.held(w), model.held(w), "worker {}", w);
        for medium in MEDIA {
            let expected = (model.find(medium))
                .and_then(|slot| model.on(w, slot))
                .map_or(0, BTreeSet::len);
            prop_assert_eq!(
                index.held_on(w, medium),
                expected,
                "worker {} {:?}",
                w,
                medium
            );
        }
    }
    prop_assert_eq!(index.len(), model.distinct());
    prop_assert_eq!(index.is_empty(), model.distinct() == 0);
    if let Target::Router(router) = target {
        let audit = router.audit();
        prop_assert!(audit.is_ok(), "{:?}", audit);
        let workers: Vec<WorkerId> = model.workers.keys().copied().collect();
        prop_assert_eq!(router.workers(), workers);
    }
    Ok(())
}

fn run(
    target: Target,
    ops: &[Op],
    queries: &[Vec<u128>],
    weights: &[(&'static str, f64)],
) -> Result<(), TestCaseError> {
    let mut model = Model::default();
    for op in ops {
        target.apply(&mut model, op)?;
        check(&target, &model, queries, weights)?;
    }
    Ok(())
}

/// Requests the checks look up: prefixes of the small keys, in and out of
/// order, one past the end, empty.
fn queries() -> impl Strategy<Value = Vec<Vec<u128>>> {
    prop::collection::vec(keys(), 1..3).prop_map(|mut queries| {
        queries.push((0..10).collect());
        queries.push(Vec::new());
        queries
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::cases()))]

    /// Any sequence of ops on the standalone index leaves every query
    /// answered as the per-worker model answers it.
    #[test]
    fn fuzz_the_index_matches_a_per_worker_model(
        ops in prop::collection::vec(op(), 1..32),
        queries in queries(),
        weights in weights(),
    ) {
        run(Target::Index(PrefixIndex::new()), &ops, &queries, &weights)?;
    }

    /// The same through a router: additions, refusals, removals and clears
    /// take the router's paths (its sweeps run after its locks drop), and
    /// its audit passes after every op.
    #[test]
    fn fuzz_the_routers_index_matches_a_per_worker_model(
        ops in prop::collection::vec(op(), 1..32),
        queries in queries(),
        weights in weights(),
    ) {
        run(Target::Router(Router::new()), &ops, &queries, &weights)?;
    }
}

/// A key held by 300 workers at once (a bitset over its slots), then by
/// fewer and fewer as they leave and others join on reused slots: the
/// answers stay exact through every form and sweep.
#[test]
fn a_crowded_key_stays_exact_through_forms_and_sweeps() {
    let index = PrefixIndex::new();
    let mut model = Model::default();
    let target = Target::Index(index);
    let (queries, weights) = (vec![vec![1, 2, 3]], vec![("CPU", 0.5)]);
    let mut ops = Vec::new();
    for w in 0..300u64 {
        ops.push(Op::Store(w, 0, vec![1, 2]));
        if w % 3 == 0 {
            ops.push(Op::Store(w, 2, vec![3]));
        }
    }
    for w in (0..300u64).step_by(2) {
        ops.push(Op::RemoveWorker(w));
    }
    for w in 300..400u64 {
        ops.push(Op::Store(w, 0, vec![1]));
    }
    for w in (1..300u64).step_by(2) {
        ops.push(Op::Clear(w));
    }
    for op in &ops {
        target.apply(&mut model, op).unwrap();
    }
    check(&target, &model, &queries, &weights).unwrap();
    assert_eq!(target.index().holders(1), (300..400).collect::<Vec<_>>());
}
