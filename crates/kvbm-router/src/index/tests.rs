//! The index's private parts: holder sets through every form, the walk
//! through every pair of forms, slots retired, swept and reused.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::holders::{Bits, Holders, Removal, View, WorkerSlot};
use super::shards::Shards;
use super::walk::Survivors;
use super::{PrefixIndex, Table};

/// Every slot live, up to `n`.
fn all_live(n: WorkerSlot) -> Bits {
    let mut live = Bits::default();
    (0..n).for_each(|slot| {
        live.insert(slot);
    });
    live
}

fn form(holders: &Holders) -> &'static str {
    match holders {
        Holders::Inline { .. } => "inline",
        Holders::List(_) => "list",
        Holders::Bits(_) => "bits",
    }
}

#[test]
fn a_holder_set_and_its_map_entry_stay_small() {
    assert_eq!(std::mem::size_of::<Holders>(), 16);
    assert_eq!(std::mem::size_of::<(u128, Holders)>(), 32);
}

#[test]
fn holders_grow_through_every_form_and_shrink_back() {
    let live = all_live(2_048);
    let mut holders = Holders::one(1_000);
    assert_eq!(form(&holders), "inline");
    // Slots spread over 1,024 (16 words): a list until 32, then bits.
    for slot in (0..1_024).step_by(16) {
        assert!(holders.insert(slot, &live), "{slot}");
        assert!(!holders.insert(slot, &live), "{slot} twice");
        let len = holders.len();
        let expected = match len {
            0..=3 => "inline",
            4..=31 => "list",
            _ => "bits",
        };
        assert_eq!(form(&holders), expected, "{len} holders");
    }
    assert_eq!(holders.len(), 65);
    let all: Vec<WorkerSlot> = holders.iter().collect();
    assert!(all.is_sorted());
    // Shrinking: bits hold on until a list of twice as many would fit.
    for slot in (0..1_024).step_by(16) {
        assert_eq!(holders.remove(slot), Removal::Removed);
        assert_eq!(holders.remove(slot), Removal::Absent, "{slot} twice");
        assert!(!holders.contains(slot));
    }
    assert_eq!(holders.iter().collect::<Vec<_>>(), [1_000]);
    assert_eq!(form(&holders), "inline");
    assert_eq!(holders.remove(1_000), Removal::Emptied);
    assert!(holders.is_empty());
}

#[test]
fn a_full_set_drops_dead_slots_before_growing() {
    let mut live = all_live(8);
    let mut holders = Holders::one(0);
    for slot in [1, 2] {
        holders.insert(slot, &live);
    }
    live.remove(1);
    live.remove(2);
    // Full inline, two of them dead: the new slot fits inline.
    assert!(holders.insert(5, &live));
    assert_eq!(form(&holders), "inline");
    assert_eq!(holders.iter().collect::<Vec<_>>(), [0, 5]);
}

#[test]
fn small_fleets_skip_the_list() {
    // Under 64 slots a bitset is one word: smaller than any list.
    let live = all_live(64);
    let mut holders = Holders::one(0);
    for slot in 1..4 {
        holders.insert(slot, &live);
    }
    assert_eq!(form(&holders), "bits");
}

/// `slots` as bits and as a sorted list.
fn forms_of(slots: &BTreeSet<WorkerSlot>) -> (Bits, Vec<WorkerSlot>) {
    let mut bits = Bits::default();
    slots.iter().for_each(|&s| {
        bits.insert(s);
    });
    (bits, slots.iter().copied().collect())
}

/// Cases per fuzz test: `KVBM_FUZZ_CASES` (`cargo xtask fuzz --cases N`),
/// else 256.
fn cases() -> u32 {
    std::env::var("KVBM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Any sequence of inserts and removes leaves a set equal to a
    /// `BTreeSet` of the same slots, whatever forms it went through.
    #[test]
    fn fuzz_holders_match_a_set(ops in prop::collection::vec((any::<bool>(), 0..300u32), 1..300)) {
        let live = all_live(300);
        let mut holders: Option<Holders> = None;
        let mut model = BTreeSet::new();
        for (insert, slot) in ops {
            match (&mut holders, insert) {
                (None, true) => {
                    holders = Some(Holders::one(slot));
                    model.insert(slot);
                }
                (None, false) => {}
                (Some(h), true) => prop_assert_eq!(h.insert(slot, &live), model.insert(slot)),
                (Some(h), false) => {
                    let expected = match (model.remove(&slot), model.is_empty()) {
                        (false, _) => Removal::Absent,
                        (true, false) => Removal::Removed,
                        (true, true) => Removal::Emptied,
                    };
                    prop_assert_eq!(h.remove(slot), expected);
                }
            }
            if let Some(h) = &holders {
                prop_assert_eq!(h.len(), model.len());
                prop_assert_eq!(h.iter().collect::<Vec<_>>(), model.iter().copied().collect::<Vec<_>>());
            }
        }
    }

    /// Any sequence of updates, in rounds or key by key, on any media,
    /// counts and leaves the holders a map of sets does.
    #[test]
    fn fuzz_updates_match_a_map_of_sets(
        ops in prop::collection::vec(
            (any::<bool>(), 0..6usize, 0..3usize, prop::collection::vec(0..300u128, 0..150)),
            1..40,
        ),
    ) {
        let live = all_live(6);
        let shards = Shards::default();
        let mut model: std::collections::BTreeMap<(usize, u128), BTreeSet<WorkerSlot>> =
            Default::default();
        for (insert, slot, medium, keys) in ops {
            let slot = slot as WorkerSlot;
            let expected = keys.iter().filter(|&&key| {
                let set = model.entry((medium, key)).or_default();
                if insert { set.insert(slot) } else { set.remove(&slot) }
            }).count();
            let done = if insert {
                shards.insert(medium, keys.iter().copied(), slot, &live)
            } else {
                shards.remove(medium, keys.iter().copied(), slot)
            };
            prop_assert_eq!(done, expected);
            for key in keys {
                let read = shards.read(key);
                let held: Vec<WorkerSlot> =
                    read.holders(medium, key).map_or_else(Vec::new, |h| h.iter().collect());
                let want: Vec<WorkerSlot> =
                    model.get(&(medium, key)).map_or_else(Vec::new, |s| s.iter().copied().collect());
                prop_assert_eq!(held, want);
            }
        }
    }

    /// A walk finds each worker's longest held prefix of the request,
    /// whatever else it holds.
    #[test]
    fn fuzz_walks_find_each_workers_longest_prefix(
        held in prop::collection::vec(
            (0..60usize, prop::collection::vec(0..80u128, 0..20)),
            1..6,
        ),
    ) {
        let index = PrefixIndex::new();
        let request: Vec<u128> = (0..60).collect();
        let mut want = Vec::new();
        for (worker, (depth, extra)) in held.iter().enumerate() {
            let worker = worker as u64;
            index.insert_many(worker, request[..*depth].iter().copied().chain(extra.iter().copied()));
            let mut keys: BTreeSet<u128> = request[..*depth].iter().copied().collect();
            keys.extend(extra);
            let longest = request.iter().take_while(|key| keys.contains(key)).count();
            if longest > 0 {
                want.push((worker, longest));
            }
        }
        let mut found = index.overlaps(&request);
        found.sort_unstable();
        prop_assert_eq!(found, want);
    }

    /// A walk of key sets in any forms ends each slot where a plain walk
    /// does.
    #[test]
    fn fuzz_survivors_match_a_plain_walk(
        sets in prop::collection::vec(prop::collection::btree_set(0..200u32, 0..80), 1..8),
        dense in prop::collection::vec(any::<bool>(), 8),
        dead in prop::collection::btree_set(0..200u32, 0..10),
    ) {
        let mut live = all_live(200);
        dead.iter().for_each(|&s| { live.remove(s); });
        let views: Vec<(Bits, Vec<WorkerSlot>)> = sets.iter().map(forms_of).collect();
        let view = |at: usize| -> View<'_> {
            let (bits, sorted) = &views[at];
            if dense[at] { View::Bits(bits.words()) } else { View::Sorted(sorted) }
        };
        let mut survivors = Survivors::start(view(0), &live);
        let mut ended = Vec::new();
        for (at, set) in sets.iter().enumerate().skip(1) {
            if survivors.is_empty() {
                break;
            }
            // An empty set stands for a key no one holds.
            let next = (!set.is_empty()).then(|| view(at));
            survivors.step(next, at, &mut ended);
        }
        survivors.finish(sets.len(), &mut ended);
        ended.sort_unstable();
        let mut expected: Vec<(WorkerSlot, usize)> = (sets[0].iter())
            .filter(|s| !dead.contains(s))
            .map(|&s| (s, sets.iter().take_while(|set| set.contains(&s)).count()))
            .collect();
        expected.sort_unstable();
        prop_assert_eq!(ended, expected);
    }
}

#[test]
fn ordered_sorts_few_and_scans_many_alike() {
    let mut table = Table::default();
    // Ids in reverse of their slots' order.
    for (n, id) in (0..300u64).rev().enumerate() {
        let at = table.position(id).unwrap_err();
        table.add(at, id);
        assert_eq!(table.slot(table.find(id).unwrap()), n as WorkerSlot);
    }
    let few: Vec<(WorkerSlot, usize)> = vec![(5, 1), (0, 2), (299, 3)];
    assert_eq!(table.ordered(few, None), [(0, 3), (294, 1), (299, 2)]);
    let many: Vec<(WorkerSlot, usize)> = (0..300).map(|s| (s, s as usize)).collect();
    let ordered = table.ordered(many, None);
    assert_eq!(ordered.len(), 300);
    assert!(ordered.iter().all(|&(id, slot)| id == 299 - slot as u64));
    // With a walk's survivors, few (sparse) and many (dense).
    let live = table.live().clone();
    // Everyone on the first key, slots 100.. on the second.
    let mut rest = Survivors::start(View::Bits(live.words()), &live);
    let second: Vec<WorkerSlot> = (100..300).collect();
    let (mut ended, second) = (Vec::new(), forms_of(&second.into_iter().collect()).0);
    rest.step(Some(View::Bits(second.words())), 1, &mut ended);
    assert_eq!(ended, (0..100).map(|s| (s, 1)).collect::<Vec<_>>());
    let mut survivors = Survivors::start(View::Sorted(&[4, 7]), &live);
    survivors.step(Some(View::Sorted(&[7])), 1, &mut Vec::new());
    for (ended, rest, expected) in [
        (Vec::new(), &survivors, vec![(292, 9)]),
        (vec![(0, 1)], &survivors, vec![(292, 9), (299, 1)]),
        (
            ended,
            &rest,
            (0..300)
                .map(|id| (id, if id >= 200 { 1 } else { 9 }))
                .collect(),
        ),
    ] {
        assert_eq!(table.ordered(ended, Some((rest, 9))), expected);
    }
}

#[test]
fn a_cleared_slot_is_reused_only_once_swept() {
    let index = PrefixIndex::new();
    for worker in 0..4u64 {
        index.insert_many(worker, (0..100).map(|k| u128::from(worker) * 1_000 + k));
    }
    let slot_of = |worker| {
        let table = index.read();
        table.slot(table.find(worker).unwrap())
    };
    let old = slot_of(2);
    // The clear retires the slot and the garbage (100 bits) is past the
    // floor: the sweep runs and frees it.
    assert_eq!(index.clear_worker(2), 100);
    assert_ne!(slot_of(2), old);
    assert_eq!(index.held(2), 0);
    assert!(index.holders(2_000).is_empty());
    assert!(!index.read().sweep_due());
    // A newcomer gets the swept slot, and none of its old bits.
    index.insert(7_777, 9);
    assert_eq!(slot_of(9), old);
    assert_eq!(index.holders(2_000), Vec::<u64>::new());
    assert_eq!(index.overlaps(&[2_000, 2_001]), []);
    assert_eq!(index.held(9), 1);
    assert_eq!(index.len(), 301);
}

#[test]
fn a_retired_slot_below_the_floor_waits_hidden() {
    let index = PrefixIndex::new();
    index.insert_many(1, [10, 11]);
    index.insert_many(2, [10, 11]);
    // Two bits of garbage: no sweep yet, but lookups never see them.
    assert_eq!(index.remove_worker(1), 2);
    assert_eq!(index.holders(10), [2]);
    assert_eq!(index.overlaps(&[10, 11]), [(2, 2)]);
    assert_eq!(index.len(), 2);
    // The worker comes back on a clean slot.
    index.insert(12, 1);
    assert_eq!(index.overlaps(&[10, 11]), [(2, 2)]);
    assert_eq!(index.overlaps(&[12]), [(1, 1)]);
    // Removing a worker that holds nothing frees its slot at once.
    index.clear_worker(1);
    index.remove_worker(1);
    assert_eq!(index.remove_worker(2), 2);
    assert!(index.is_empty());
    assert_eq!(index.len(), 0);
}

#[test]
fn dirty_slots_never_outnumber_the_workers_for_long() {
    let index = PrefixIndex::new();
    index.insert(1, 0);
    // Each churned worker leaves one bit: too little garbage to sweep, but
    // the dirty slots' number alone calls one.
    for worker in 1..200u64 {
        index.insert(1, worker);
        index.remove_worker(worker);
    }
    let table = index.read();
    assert!(table.live().words().len() <= 1, "{:?}", table.live());
    drop(table);
    assert_eq!(index.holders(1), [0]);
}
