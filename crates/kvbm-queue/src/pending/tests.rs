//! `Pending` against a sorted `Vec`, with the structure recounted after every
//! operation (links both ways, lists sorted, index and free list exact).

use proptest::prelude::*;

use super::{Entry, Pending};
use crate::{Aging, Priority, Request};

#[derive(Debug)]
struct T(u8);

impl Request for T {
    type Id = u8;
    fn id(&self) -> u8 {
        self.0
    }
    fn prompt_tokens(&self) -> u32 {
        0
    }
    fn max_new_tokens(&self) -> u32 {
        0
    }
}

/// An entry that arrived `seq`-th (at `7 × seq` ns) and was boosted by
/// `boost` priority steps.
fn boosted(id: u8, priority: Priority, seq: u64, boost: u32, aging: Aging) -> Entry<T> {
    let mut entry = Entry {
        request: T(id),
        id,
        priority,
        seq,
        rank: aging.rank(priority, seq, seq * 7),
        blocks: 0,
        bypassed: 0,
        boost: 0,
    };
    entry.boost(boost, aging);
    entry
}

fn entry(id: u8, priority: Priority, seq: u64, aging: Aging) -> Entry<T> {
    boosted(id, priority, seq, 0, aging)
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u8, usize),
    /// Re-insert the `n`-th most recently taken entry at its old seq,
    /// boosted by some more priority steps.
    Reinsert(usize, u32),
    Pop,
    Remove(u8),
    RemoveInstance(u8, u64),
    TakeNth(usize),
    Drain,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..8u8, 0..4usize).prop_map(|(id, p)| Op::Insert(id, p)),
        2 => (0..4usize, prop_oneof![2 => Just(0u32), 1 => 0u32..5]).prop_map(|(n, b)| Op::Reinsert(n, b)),
        2 => Just(Op::Pop),
        1 => (0..8u8).prop_map(Op::Remove),
        1 => (0..8u8, 0..40u64).prop_map(|(id, seq)| Op::RemoveInstance(id, seq)),
        2 => (0..8usize).prop_map(Op::TakeNth),
        1 => Just(Op::Drain),
    ]
}

/// (id, priority, seq, boost) in service order.
type Model = Vec<(u8, Priority, u64, u32)>;

fn sort(model: &mut Model, aging: Aging) {
    model.sort_by_key(|&(id, p, seq, boost)| boosted(id, p, seq, boost, aging).key());
}

fn fields(e: Entry<T>) -> (u8, Priority, u64, u32) {
    (e.id, e.priority, e.seq, e.boost)
}

fn run(ops: Vec<Op>, aging: Aging) -> Result<(), TestCaseError> {
    let mut pending = Pending::<T>::new(aging == Aging::Strict);
    let mut model: Model = Vec::new();
    let mut taken: Model = Vec::new();
    let mut next_seq = 0;
    for op in ops {
        match op {
            Op::Insert(id, p) => {
                let priority = Priority::ALL[p];
                let dup = model.iter().any(|m| m.0 == id);
                let result = pending.insert(entry(id, priority, next_seq, aging));
                prop_assert_eq!(result.is_err(), dup);
                if !dup {
                    model.push((id, priority, next_seq, 0));
                }
                next_seq += 1;
            }
            Op::Reinsert(n, more) => {
                if n < taken.len() {
                    let (id, priority, seq, boost) = taken.remove(taken.len() - 1 - n);
                    let dup = model.iter().any(|m| m.0 == id);
                    let entry = boosted(id, priority, seq, boost + more, aging);
                    prop_assert!(entry.boost <= crate::MAX_BOOST_STEPS);
                    let boost = entry.boost;
                    let result = pending.insert(entry);
                    prop_assert_eq!(result.is_err(), dup);
                    if !dup {
                        model.push((id, priority, seq, boost));
                    }
                }
            }
            Op::Pop => {
                let got = pending.pop_front().map(fields);
                let want = (!model.is_empty()).then(|| model.remove(0));
                prop_assert_eq!(got, want);
                taken.extend(got);
            }
            Op::Remove(id) => {
                let got = pending.remove(id).map(fields);
                let want = model
                    .iter()
                    .position(|m| m.0 == id)
                    .map(|i| model.remove(i));
                prop_assert_eq!(got, want);
                taken.extend(got);
            }
            Op::RemoveInstance(id, seq) => {
                let got = pending.remove_instance(id, seq).map(fields);
                let want = model
                    .iter()
                    .position(|m| m.0 == id && m.2 == seq)
                    .map(|i| model.remove(i));
                prop_assert_eq!(got, want);
            }
            Op::TakeNth(n) => {
                let mut cursor = pending.cursor();
                let mut slot = None;
                for _ in 0..=n {
                    slot = pending.next_in_order(&mut cursor);
                }
                let got = slot.map(|s| fields(pending.take(s)));
                let want = (n < model.len()).then(|| model.remove(n));
                prop_assert_eq!(got, want);
                taken.extend(got);
            }
            Op::Drain => {
                let got: Model = pending.drain().into_iter().map(fields).collect();
                prop_assert_eq!(&got, &model);
                taken.extend(got);
                model.clear();
            }
        }
        sort(&mut model, aging);
        pending.check_invariants().map_err(TestCaseError::fail)?;
        prop_assert_eq!(pending.len(), model.len());
        let snapshot: Vec<(u8, u64)> = model.iter().map(|m| (m.0, m.2)).collect();
        prop_assert_eq!(pending.snapshot(), snapshot);
    }
    Ok(())
}

proptest! {
    #[test]
    fn pending_matches_sorted_vec_strict(ops in prop::collection::vec(op(), 0..60)) {
        run(ops, Aging::Strict)?;
    }

    #[test]
    fn pending_matches_sorted_vec_aging(ops in prop::collection::vec(op(), 0..60), w in 0..4u64) {
        run(ops, Aging::Window(w))?;
    }

    #[test]
    fn pending_matches_sorted_vec_timed(ops in prop::collection::vec(op(), 0..60), ns in 0..40u64) {
        run(ops, Aging::Timed { step: std::time::Duration::from_nanos(ns) })?;
    }
}

#[test]
fn reinsert_goes_before_later_arrivals_of_its_priority() {
    let mut pending = Pending::<T>::new(true);
    for (id, seq) in [(1, 0), (2, 1), (3, 2)] {
        assert!(
            pending
                .insert(entry(id, Priority::Normal, seq, Aging::Strict))
                .is_ok()
        );
    }
    let first = pending.pop_front().map(|e| e.id);
    assert_eq!(first, Some(1));
    assert!(
        pending
            .insert(entry(1, Priority::Normal, 0, Aging::Strict))
            .is_ok()
    );
    assert_eq!(pending.snapshot(), [(1, 0), (2, 1), (3, 2)]);
    assert_eq!(pending.check_invariants(), Ok(()));
}

#[test]
fn freed_slots_are_reused() {
    let mut pending = Pending::<T>::new(true);
    for seq in 0..100 {
        assert!(
            pending
                .insert(entry(1, Priority::High, seq, Aging::Strict))
                .is_ok()
        );
        assert!(pending.remove(1).is_some());
    }
    assert_eq!(pending.slots.len(), 1);
    assert_eq!(pending.check_invariants(), Ok(()));
}

#[test]
fn drain_empties_but_keeps_the_allocations() {
    let mut pending = Pending::<T>::with_capacity(false, 4);
    for (id, seq) in (0..50).zip(0..) {
        assert!(
            pending
                .insert(entry(
                    id,
                    Priority::ALL[usize::from(id) % 4],
                    seq,
                    Aging::Window(2)
                ))
                .is_ok()
        );
    }
    let slots = pending.slots.capacity();
    assert_eq!(pending.drain().len(), 50);
    assert_eq!(pending.len(), 0);
    assert_eq!(pending.check_invariants(), Ok(()));
    assert_eq!(pending.slots.capacity(), slots);
    // hashbrown reports less capacity after removals (tombstones), but the
    // table is not released.
    assert!(pending.index.capacity() > 4);
    assert!(
        pending
            .insert(entry(1, Priority::Low, 99, Aging::Window(2)))
            .is_ok()
    );
    assert_eq!(pending.snapshot(), [(1, 99)]);
}
