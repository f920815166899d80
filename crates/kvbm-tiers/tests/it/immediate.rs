//! Copies completed at once (`offload_now`, `onboard_now`, `onboard_now_into`): the same
//! choices as the planned path, with nothing ever in flight.

use kvbm_tiers::{OffloadPolicy, TierConfig};

use crate::support::{batch, chain, compute, device, g, in_tier, planned, tiers};

#[test]
fn offload_now_stores_down_the_chain_at_once_and_never_twice() {
    let device = device(8);
    let mut tiers = tiers(
        &device,
        vec![TierConfig::new("CPU", 8), TierConfig::new("DISK", 16)],
    );
    let hashes = chain(1, 3);
    let blocks = compute(&device, &hashes);
    assert_eq!(tiers.offload_now(&batch(&blocks)), 3);
    assert!(planned(&mut tiers).is_empty(), "nothing in flight");
    assert_eq!(
        (
            in_tier(&tiers, g(0), &chain(1, 3)),
            in_tier(&tiers, g(1), &chain(1, 3))
        ),
        (3, 3)
    );
    assert_eq!(
        tiers.offload_now(&batch(&blocks)),
        0,
        "present: not stored twice"
    );
    let stats = tiers.stats(g(0)).unwrap();
    assert_eq!(stats.stored_blocks, 3);
    assert_eq!(tiers.transfer_counts().stored_blocks, 6, "both tiers");
    let audit = tiers.audit().unwrap();
    assert_eq!(audit.in_flight, 0);
}

#[test]
fn offload_now_skips_what_does_not_fit_and_what_a_store_brings() {
    let device = device(8);
    let mut tiers = tiers(&device, vec![TierConfig::new("CPU", 2)]);
    let hashes = chain(1, 4);
    let blocks = compute(&device, &hashes);
    // A planned store of the first block is in flight: not stored again.
    tiers.offload(blocks[..1].to_vec());
    let plan = planned(&mut tiers);
    assert_eq!(plan.len(), 1);
    assert_eq!(
        tiers.offload_now(&batch(&blocks)),
        1,
        "one slot left of two"
    );
    let stats = tiers.stats(g(0)).unwrap();
    assert_eq!(stats.skipped_stores, 2);
    tiers.complete(plan[0].id).unwrap();
    assert_eq!(in_tier(&tiers, g(0), &chain(1, 4)), 2);
    tiers.audit().unwrap();
}

#[test]
fn offload_now_of_another_pool_or_without_tiers_stores_nothing() {
    let device = device(4);
    let other = crate::support::device(4);
    let mut tiers = tiers(&device, vec![TierConfig::new("CPU", 4)]);
    let foreign = batch(&compute(&other, &chain(1, 2)));
    assert_eq!(tiers.offload_now(&foreign), 0);
    let mut bare = crate::support::tiers(&device, Vec::new());
    let mine = batch(&compute(&device, &chain(1, 2)));
    assert_eq!(bare.offload_now(&mine), 0);
    tiers.audit().unwrap();
}

#[test]
fn onboard_now_loads_a_prefix_from_each_highest_tier_and_stops_at_a_gap() {
    let device = device(8);
    let mut tiers = tiers(
        &device,
        vec![TierConfig::new("CPU", 2), TierConfig::new("DISK", 8)],
    );
    let hashes = chain(1, 4);
    for hash in &hashes {
        tiers.offload_now(&batch(&compute(&device, &[*hash])));
    }
    // Evict them all from the device.
    drop(device.allocate_blocks(8).unwrap());
    assert_eq!(device.scan_matches(&hashes), [false; 4]);
    let (loaded, from) = tiers.onboard_now(&hashes, 3);
    assert_eq!(loaded.sequence_hashes(), hashes[..3]);
    assert_eq!(from, [0, 1, 2], "DISK for two, then CPU for one");
    assert_eq!(device.scan_matches(&hashes), [true, true, true, false]);
    // A gap ends the walk.
    let gap = [hashes[3], chain(9, 1)[0], hashes[0]];
    let (after_gap, _) = tiers.onboard_now(&gap, 8);
    assert_eq!(after_gap.len(), 1);
    let stats = tiers.stats(g(1)).unwrap();
    assert_eq!((stats.hit_blocks, stats.loaded_blocks), (2, 2));
    assert!(planned(&mut tiers).is_empty());
    drop(loaded);
    drop(after_gap);
    tiers.audit().unwrap();
    assert_eq!(device.metrics().in_use_blocks, 0);
}

#[test]
fn onboard_now_into_reuses_a_buffer_and_counts_each_call_afresh() {
    let device = device(8);
    let mut tiers = tiers(&device, vec![TierConfig::new("CPU", 8)]);
    let hashes = chain(1, 2);
    tiers.offload_now(&batch(&compute(&device, &hashes)));
    drop(device.allocate_blocks(8).unwrap());
    let mut from = vec![7; 5];
    let loaded = tiers.onboard_now_into(&hashes, 8, &mut from);
    assert_eq!(loaded.len(), 2);
    assert_eq!(from, [0, 2], "cleared, one count per level");
    let none = tiers.onboard_now_into(&chain(9, 1), 8, &mut from);
    assert!(none.is_empty());
    assert_eq!(from, [0, 0], "nothing found: no count left from before");
    drop(loaded);
    tiers.audit().unwrap();
}

#[test]
fn onboard_now_with_no_room_or_a_load_in_flight_loads_nothing() {
    let device = device(2);
    let mut tiers = tiers(&device, vec![TierConfig::new("CPU", 8)]);
    let hashes = chain(3, 2);
    tiers.offload_now(&batch(&compute(&device, &hashes)));
    let held = device.allocate_blocks(2).unwrap();
    let (loaded, from) = tiers.onboard_now(&hashes, 8);
    assert_eq!((loaded.len(), from), (0, vec![0, 0]));
    let stats = tiers.stats(g(0)).unwrap();
    assert_eq!((stats.hit_blocks, stats.loaded_blocks), (0, 0), "undone");
    drop(held);
    // A planned load of the first block: the immediate walk does not wait.
    let onboard = tiers.onboard(&hashes[..1], 1);
    assert_eq!(onboard.blocks, 1);
    let (loaded, _) = tiers.onboard_now(&hashes, 8);
    assert!(loaded.is_empty());
    for transfer in planned(&mut tiers) {
        tiers.complete(transfer.id).unwrap();
    }
    tiers.audit().unwrap();
}

#[test]
fn a_selective_tier_below_takes_blocks_hit_often_enough() {
    let device = device(4);
    let mut tiers = tiers(
        &device,
        vec![
            TierConfig::new("CPU", 8),
            TierConfig::new("DISK", 8).with_offload(OffloadPolicy::Selective { min_hits: 2 }),
        ],
    );
    let hashes = chain(1, 2);
    tiers.offload_now(&batch(&compute(&device, &hashes)));
    assert_eq!(in_tier(&tiers, g(1), &chain(1, 2)), 0, "not hit yet");
    for round in 1..=2 {
        drop(device.allocate_blocks(4).unwrap());
        let (loaded, _) = tiers.onboard_now(&hashes, 8);
        assert_eq!(loaded.len(), 2);
        let expected = if round == 2 { 2 } else { 0 };
        assert_eq!(
            in_tier(&tiers, g(1), &chain(1, 2)),
            expected,
            "after {round} hits"
        );
    }
    tiers.audit().unwrap();
}
