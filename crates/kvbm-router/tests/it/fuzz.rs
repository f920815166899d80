//! API fuzzer: arbitrary sequences of router calls (workers added and
//! removed, events of any hashes, `u64::MAX` and duplicates included, on
//! any medium and block size, of any KV cache group and kind, loads,
//! routes) against a sequential reference model: a map of worker to its
//! keys per medium, and the group each worker is scored on.
//!
//! After every call: its result is the model's (refusals typed and
//! exact), every live worker's counters are the model's, the audit passes
//! and counts what the model holds, and routes offer the model's
//! candidates. `cargo xtask fuzz` runs it long (`KVBM_FUZZ_CASES`).

use std::collections::{BTreeMap, BTreeSet};

use kvbm_events::{BlockHash, BlockRemoved, BlockStored, KvEvent, WireGroup};
use kvbm_router::{
    Candidate, LeastLoaded, Policy, PrefixIndex, RouteRequest, Router, RouterError, WorkerId,
    WorkerLoad, WorkerStats, block_key,
};
use proptest::prelude::*;

/// Worker ids the ops draw from (extremes included).
const WORKERS: [WorkerId; 4] = [0, 1, 2, WorkerId::MAX];

#[derive(Clone, Debug)]
enum Op {
    Add(WorkerId),
    Remove(WorkerId),
    Stored {
        worker: WorkerId,
        hashes: Vec<BlockHash>,
        medium: Option<String>,
        block_size: u32,
        lora_name: Option<String>,
        /// `group_idx` and `kv_cache_spec_kind`.
        group: Option<(i64, Option<String>)>,
    },
    Removed {
        worker: WorkerId,
        hashes: Vec<BlockHash>,
        medium: Option<String>,
        group: Option<i64>,
    },
    Cleared(WorkerId),
    SetLoad(WorkerId, WorkerLoad),
    Route(Vec<BlockHash>, usize),
}

fn worker() -> impl Strategy<Value = WorkerId> {
    prop::sample::select(WORKERS.to_vec())
}

/// Hashes from a small range (so events meet), the extremes, and byte
/// strings of any length (keyed by their first 16 bytes).
fn hash() -> impl Strategy<Value = BlockHash> {
    prop_oneof![
        6 => (0..8u64).prop_map(BlockHash::Int),
        1 => Just(BlockHash::Int(u64::MAX)),
        1 => prop::collection::vec(prop_oneof![Just(0u8), Just(1), Just(255)], 0..20)
            .prop_map(|bytes| BlockHash::Bytes(bytes.into())),
    ]
}

fn hashes() -> impl Strategy<Value = Vec<BlockHash>> {
    prop::collection::vec(hash(), 0..6)
}

/// The device medium under both names, a few others, enough distinct ones
/// to pass the limit, and a name too long to keep.
fn medium() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        4 => Just(None),
        4 => Just(Some("GPU".to_owned())),
        2 => Just(Some("CPU".to_owned())),
        2 => (0..10u8).prop_map(|i| Some(format!("tier{i}"))),
        1 => Just(Some("m".repeat(PrefixIndex::MAX_MEDIUM_NAME + 1))),
        1 => Just(Some(String::new())),
    ]
}

fn block_size() -> impl Strategy<Value = u32> {
    prop_oneof![8 => Just(16u32), 1 => Just(32), 1 => Just(0), 1 => Just(u32::MAX)]
}

/// No group (a model of one), a few small ones, and the extremes.
fn group_idx() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![
        4 => Just(None),
        4 => (0..3i64).prop_map(Some),
        1 => Just(Some(i64::MAX)),
        1 => Just(Some(-1)),
    ]
}

/// vLLM's kinds, full and not, none said, and a name it has not.
fn kind() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        Just(Some("full_attention".to_owned())),
        Just(Some("mla_attention".to_owned())),
        Just(Some("sliding_window".to_owned())),
        Just(Some("chunked_local_attention".to_owned())),
        Just(Some("no such kind".to_owned())),
    ]
}

fn load() -> impl Strategy<Value = WorkerLoad> {
    let value = prop_oneof![0..100u64, Just(u64::MAX)];
    (value.clone(), value.clone(), value).prop_map(|(a, q, r)| WorkerLoad::new(a, q, r))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => worker().prop_map(Op::Add),
        1 => worker().prop_map(Op::Remove),
        6 => (
            worker(), hashes(), medium(), block_size(), prop::option::of(Just("lora".to_owned())),
            group_idx(), kind(),
        )
            .prop_map(|(worker, hashes, medium, block_size, lora_name, group, kind)| Op::Stored {
                worker, hashes, medium, block_size, lora_name,
                group: group.map(|group| (group, kind)),
            }),
        3 => (worker(), hashes(), medium(), group_idx())
            .prop_map(|(worker, hashes, medium, group)| Op::Removed { worker, hashes, medium, group }),
        1 => worker().prop_map(Op::Cleared),
        1 => (worker(), load()).prop_map(|(w, l)| Op::SetLoad(w, l)),
        2 => (hashes(), prop_oneof![0..200usize, Just(usize::MAX)])
            .prop_map(|(h, p)| Op::Route(h, p)),
    ]
}

/// One worker's counters, as `WorkerStats` has them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counters {
    stored: u64,
    removed: u64,
    unknown_removals: u64,
    clears: u64,
    block_size_refusals: u64,
    medium_refusals: u64,
}

impl Counters {
    fn of(stats: &WorkerStats) -> Self {
        Self {
            stored: stats.stored_blocks,
            removed: stats.removed_blocks,
            unknown_removals: stats.unknown_removals,
            clears: stats.clears,
            block_size_refusals: stats.block_size_refusals,
            medium_refusals: stats.medium_refusals,
        }
    }
}

#[derive(Debug, Default)]
struct ModelWorker {
    /// Keys by medium slot (0 the device).
    held: BTreeMap<usize, BTreeSet<u128>>,
    counters: Counters,
    load: WorkerLoad,
    /// The KV cache group its events count in, once a store taught it.
    scored: Option<i64>,
}

impl ModelWorker {
    fn held(&self) -> usize {
        self.held.values().map(BTreeSet::len).sum()
    }
}

/// The router, naively and sequentially.
#[derive(Debug, Default)]
struct Model {
    block_size: Option<u32>,
    /// Media besides the device medium, in slot order from 1.
    media: Vec<String>,
    workers: BTreeMap<WorkerId, ModelWorker>,
}

impl Model {
    fn find(&self, medium: Option<&str>) -> Option<usize> {
        match medium {
            None | Some("GPU") => Some(0),
            Some(name) => self.media.iter().position(|m| m == name).map(|at| at + 1),
        }
    }

    fn worker(&mut self, worker: WorkerId) -> Result<&mut ModelWorker, RouterError> {
        self.workers
            .get_mut(&worker)
            .ok_or(RouterError::UnknownWorker(worker))
    }

    fn apply(&mut self, op: &Op) -> Result<(), RouterError> {
        match op {
            Op::Add(w) => match self.workers.contains_key(w) {
                true => Err(RouterError::DuplicateWorker(*w)),
                false => {
                    self.workers.insert(*w, ModelWorker::default());
                    Ok(())
                }
            },
            Op::Remove(w) => self
                .workers
                .remove(w)
                .map(drop)
                .ok_or(RouterError::UnknownWorker(*w)),
            Op::Stored {
                worker,
                hashes,
                medium,
                block_size,
                group,
                ..
            } => {
                // Another group's store, or one of a group not known to
                // cover whole prefixes before any did, is left out.
                let scored = self.worker(*worker)?.scored;
                let learns = match (group, scored) {
                    (None, _) => None,
                    (Some((group, _)), Some(scored)) if *group == scored => None,
                    (Some(_), Some(_)) => return Ok(()),
                    (Some((group, kind)), None) => {
                        let full = kind.as_deref().map_or(*group == 0, WireGroup::is_full_kind);
                        if !full {
                            return Ok(());
                        }
                        Some(*group)
                    }
                };
                let fixed = self.block_size;
                let slot = self.find(medium.as_deref());
                let refusal = match (fixed, slot, medium) {
                    (Some(fixed), ..) if fixed != *block_size => {
                        self.worker(*worker)?.counters.block_size_refusals += 1;
                        Some(RouterError::BlockSizeMismatch {
                            worker: *worker,
                            router: fixed,
                            event: *block_size,
                        })
                    }
                    (_, None, Some(name)) if name.len() > PrefixIndex::MAX_MEDIUM_NAME => {
                        self.worker(*worker)?.counters.medium_refusals += 1;
                        Some(RouterError::MediumNameTooLong {
                            len: name.len(),
                            max: PrefixIndex::MAX_MEDIUM_NAME,
                        })
                    }
                    (_, None, Some(name)) if self.media.len() + 1 == PrefixIndex::MAX_MEDIA => {
                        self.worker(*worker)?.counters.medium_refusals += 1;
                        Some(RouterError::TooManyMedia {
                            medium: name.clone(),
                            max: PrefixIndex::MAX_MEDIA,
                        })
                    }
                    _ => None,
                };
                if let Some(refusal) = refusal {
                    return Err(refusal);
                }
                let slot = slot.unwrap_or_else(|| {
                    self.media.push(medium.clone().unwrap_or_default());
                    self.media.len()
                });
                self.block_size = Some(*block_size);
                let state = self.worker(*worker)?;
                if learns.is_some() {
                    state.scored = learns;
                }
                let held = state.held.entry(slot).or_default();
                held.extend(hashes.iter().map(block_key));
                state.counters.stored += hashes.len() as u64;
                Ok(())
            }
            Op::Removed {
                worker,
                hashes,
                medium,
                group,
            } => {
                let slot = self.find(medium.as_deref());
                let state = self.worker(*worker)?;
                if group.is_some_and(|group| state.scored != Some(group)) {
                    return Ok(());
                }
                for hash in hashes {
                    let known = slot
                        .and_then(|slot| state.held.get_mut(&slot))
                        .is_some_and(|held| held.remove(&block_key(hash)));
                    state.counters.unknown_removals += u64::from(!known);
                    state.counters.removed += 1;
                }
                Ok(())
            }
            Op::Cleared(w) => {
                let state = self.worker(*w)?;
                state.held.clear();
                state.counters.clears += 1;
                Ok(())
            }
            Op::SetLoad(w, load) => {
                self.worker(*w)?.load = *load;
                Ok(())
            }
            Op::Route(..) => Ok(()),
        }
    }

    fn candidates(&self, keys: &[u128]) -> Vec<Candidate> {
        (self.workers.iter())
            .map(|(&worker, state)| {
                let device = state.held.get(&0);
                let overlap_blocks = keys
                    .iter()
                    .take_while(|k| device.is_some_and(|held| held.contains(k)))
                    .count();
                Candidate::new(worker, overlap_blocks, state.load)
            })
            .collect()
    }
}

/// The router's call for `op`.
fn call(router: &Router, op: &Op) -> Result<(), RouterError> {
    match op {
        Op::Add(w) => router.add_worker(*w),
        Op::Remove(w) => router.remove_worker(*w),
        Op::Stored {
            worker,
            hashes,
            medium,
            block_size,
            lora_name,
            group,
        } => {
            let mut stored = BlockStored::new(hashes.clone(), None, Vec::new(), *block_size);
            stored.medium = medium.clone();
            stored.lora_name = lora_name.clone();
            if let Some((group, kind)) = group {
                stored.group_idx = Some(*group);
                stored.kv_cache_spec_kind = kind.clone();
            }
            let event = KvEvent::BlockStored(stored);
            router.apply(*worker, &event)
        }
        Op::Removed {
            worker,
            hashes,
            medium,
            group,
        } => {
            let mut removed = BlockRemoved::new(hashes.clone());
            removed.medium = medium.clone();
            removed.group_idx = *group;
            let event = KvEvent::BlockRemoved(removed);
            router.apply(*worker, &event)
        }
        Op::Cleared(w) => router.clear_worker(*w),
        Op::SetLoad(w, load) => router.set_load(*w, *load),
        Op::Route(..) => Ok(()),
    }
}

/// Everything observable about the router equals the model.
fn check(router: &Router, model: &Model, op: &Op) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        router.workers(),
        model.workers.keys().copied().collect::<Vec<_>>()
    );
    prop_assert_eq!(router.block_size(), model.block_size);
    let audit = router.audit();
    prop_assert!(audit.is_ok(), "{:?}", audit);
    let audit = audit.unwrap();
    let held: usize = model.workers.values().map(ModelWorker::held).sum();
    prop_assert_eq!(
        (audit.workers, audit.held_blocks, audit.media),
        (model.workers.len(), held, 1 + model.media.len())
    );
    let names: Vec<Option<&str>> = [None, Some("GPU")]
        .into_iter()
        .chain(model.media.iter().map(|m| Some(m.as_str())))
        .collect();
    for &w in &WORKERS {
        let Some(state) = model.workers.get(&w) else {
            prop_assert!(router.stats(w).is_none());
            prop_assert_eq!(router.index().held(w), 0);
            continue;
        };
        let stats = router.stats(w);
        prop_assert!(stats.is_some());
        let stats = stats.unwrap();
        prop_assert_eq!(stats.held_blocks, state.held());
        prop_assert_eq!(Counters::of(&stats), state.counters, "worker {}", w);
        for &name in &names {
            let slot = model.find(name).unwrap();
            let expected = state.held.get(&slot).map_or(0, BTreeSet::len);
            prop_assert_eq!(router.index().held_on(w, name), expected, "{:?}", name);
        }
    }
    let distinct: BTreeSet<u128> = (model.workers.values())
        .flat_map(|state| state.held.values().flatten().copied())
        .collect();
    prop_assert_eq!(router.index().len(), distinct.len());
    prop_assert_eq!(router.index().is_empty(), distinct.is_empty());
    if let Op::Route(hashes, prompt_tokens) = op {
        let keys: Vec<u128> = hashes.iter().map(block_key).collect();
        let request = RouteRequest::new(&keys, *prompt_tokens, 16);
        let expected = model.candidates(&keys);
        prop_assert_eq!(router.candidates(&request), expected.clone());
        let decision = router.route(&request, &mut LeastLoaded);
        let chosen = LeastLoaded.choose(&request, &expected);
        prop_assert_eq!(
            decision.map(|d| d.worker),
            chosen.map(|i| expected[i].worker)
        );
        prop_assert_eq!(
            decision.map(|d| d.overlap_blocks),
            chosen.map(|i| expected[i].overlap_blocks)
        );
        // Each medium's overlaps, as a policy weighing tiers would see them.
        for &name in &names {
            let slot = model.find(name).unwrap();
            let expected: Vec<(WorkerId, usize)> = (model.workers.iter())
                .filter_map(|(&w, state)| {
                    let held = state.held.get(&slot)?;
                    let depth = keys.iter().take_while(|k| held.contains(k)).count();
                    (depth > 0).then_some((w, depth))
                })
                .collect();
            prop_assert_eq!(router.index().overlaps_on(name, &keys), expected);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::cases()))]

    /// Any sequence of calls leaves the router exactly as the sequential
    /// model: same results, same counters, same blocks per medium, same
    /// candidates; and the audit passes after every call.
    #[test]
    fn fuzz_the_router_matches_a_sequential_model(
        fixed in prop::option::of(block_size()),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let router = fixed.map_or_else(Router::new, Router::with_block_size);
        let mut model = Model { block_size: fixed, ..Model::default() };
        for op in &ops {
            let expected = model.apply(op);
            prop_assert_eq!(call(&router, op), expected, "{:?}", op);
            check(&router, &model, op)?;
        }
    }
}
