//! What each offload policy copies down, and what it never copies twice.

use kvbm_tiers::{OffloadPolicy, Settled, TierConfig, TransferKind};

use crate::support::{chain, compute, device, g, in_tier, planned, run_all, tiers};

#[test]
fn write_through_copies_every_registered_block_down_the_chain() {
    let device = device(8);
    let mut tiers = tiers(
        &device,
        vec![TierConfig::new("CPU", 8), TierConfig::new("DISK", 16)],
    );
    let hashes = chain(1, 3);
    let blocks = compute(&device, &hashes);
    tiers.offload(blocks.clone());
    let plan = planned(&mut tiers);
    assert_eq!(plan.len(), 1, "one transfer for the batch");
    assert_eq!((plan[0].kind, plan[0].blocks()), (TransferKind::Store, 3));
    assert_eq!(
        in_tier(&tiers, g(0), &hashes),
        0,
        "not matchable before completion"
    );
    tiers.complete(plan[0].id).unwrap();
    assert_eq!(in_tier(&tiers, g(0), &hashes), 3);
    // Stored in G2, so G3 (write-through) takes them from G2.
    let next = planned(&mut tiers);
    assert_eq!((next[0].source, next[0].destination), (g(0), g(1)));
    tiers.complete(next[0].id).unwrap();
    assert_eq!(in_tier(&tiers, g(1), &hashes), 3);
    // Offered again: present everywhere, nothing is copied twice.
    tiers.offload(blocks);
    assert!(planned(&mut tiers).is_empty());
    tiers.audit().unwrap();
}

#[test]
fn a_hash_in_flight_is_not_copied_again() {
    let device = device(8);
    let mut tiers = tiers(&device, vec![TierConfig::new("CPU", 8)]);
    let blocks = compute(&device, &chain(2, 2));
    tiers.offload(blocks.clone());
    tiers.offload(blocks.clone());
    let plan = planned(&mut tiers);
    assert_eq!(plan.len(), 1);
    assert_eq!(plan[0].blocks(), 2);
    tiers.audit().unwrap();
}

#[test]
fn selective_copies_only_blocks_hit_often_enough() {
    let device = device(8);
    let policy = OffloadPolicy::Selective { min_hits: 2 };
    let mut tiers = tiers(
        &device,
        vec![TierConfig::new("CPU", 8).with_offload(policy)],
    );
    let hashes = chain(3, 2);
    let blocks = compute(&device, &hashes);
    tiers.offload(blocks.clone());
    assert!(planned(&mut tiers).is_empty(), "never hit yet");
    let first = device.match_blocks(&hashes[..1]);
    tiers.record_hits(&first);
    assert!(planned(&mut tiers).is_empty(), "one hit");
    tiers.record_hits(&first);
    let plan = planned(&mut tiers);
    assert_eq!(plan[0].blocks(), 1, "the twice-hit block only");
    tiers.complete(plan[0].id).unwrap();
    assert_eq!(in_tier(&tiers, g(0), &hashes), 1);
}

#[test]
fn selective_thresholds_past_the_counter_are_refused() {
    let device = device(4);
    let policy = OffloadPolicy::Selective { min_hits: 16 };
    let err = kvbm_tiers::Tiers::new(device, vec![TierConfig::new("CPU", 8).with_offload(policy)])
        .unwrap_err();
    assert!(err.to_string().contains("16 hits"), "{err}");
}

#[test]
fn write_back_keeps_headroom_by_evicting_into_stores() {
    let device = device(6);
    let config = TierConfig::new("CPU", 8)
        .with_offload(OffloadPolicy::WriteBack)
        .with_write_back_headroom(3);
    let mut tiers = tiers(&device, vec![config]);
    let hashes = chain(4, 5);
    drop(compute(&device, &hashes)); // 5 cached, 1 free
    tiers.offload(compute(&device, &[]));
    assert!(
        planned(&mut tiers).is_empty(),
        "write-back takes nothing at registration"
    );
    tiers.write_back();
    let plan = planned(&mut tiers);
    assert_eq!(plan[0].blocks(), 2, "two evicted to keep three free");
    // Evicted: gone from the device, pinned (not free) until the copy ends.
    let on_device = device.scan_matches(&hashes);
    assert_eq!(
        on_device.iter().filter(|&&p| p).count(),
        3,
        "the two coldest left"
    );
    let metrics = device.metrics();
    assert_eq!((metrics.free_blocks, metrics.in_use_blocks), (1, 2));
    tiers.complete(plan[0].id).unwrap();
    assert_eq!(device.metrics().free_blocks, 3);
    assert_eq!(in_tier(&tiers, g(0), &hashes), 2);
    tiers.audit().unwrap();
}

#[test]
fn stores_past_the_incoming_limit_are_skipped_and_counted() {
    let device = device(8);
    let mut tiers = tiers(
        &device,
        vec![TierConfig::new("CPU", 8).with_max_incoming_blocks(2)],
    );
    tiers.offload(compute(&device, &chain(5, 3)));
    let plan = planned(&mut tiers);
    assert_eq!(plan[0].blocks(), 2);
    assert_eq!(tiers.stats(g(0)).unwrap().skipped_stores, 1);
}

#[test]
fn a_full_tier_evicts_its_coldest_for_new_stores() {
    let device = device(8);
    let mut tiers = tiers(&device, vec![TierConfig::new("CPU", 2)]);
    for seed in 0..3 {
        tiers.offload(compute(&device, &chain(10 + seed, 1)));
        for settled in run_all(&mut tiers).unwrap() {
            assert!(matches!(settled, Settled::Stored { blocks: 1, .. }));
        }
    }
    let stats = tiers.stats(g(0)).unwrap();
    assert_eq!((stats.stored_blocks, stats.evicted_blocks), (3, 1));
    assert_eq!(in_tier(&tiers, g(0), &chain(10, 1)), 0, "the oldest went");
}
