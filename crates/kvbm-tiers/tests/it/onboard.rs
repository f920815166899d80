//! Matching across tiers and bringing a prefix up.

use kvbm_tiers::{Settled, TierConfig, TierId};

use crate::support::{chain, compute, device, planned, run_all, tiers};

#[test]
fn lookup_takes_each_block_from_the_highest_tier_and_stops_at_a_gap() {
    let device = device(8);
    let mut tiers = tiers(
        &device,
        vec![TierConfig::new("CPU", 2), TierConfig::new("DISK", 8)],
    );
    let hashes = chain(1, 4);
    // All four go down to G2 then G3; G2 keeps only the last two.
    for hash in &hashes {
        tiers.offload(compute(&device, &[*hash]));
        run_all(&mut tiers).unwrap();
    }
    drop(device.allocate_blocks(8).unwrap());
    assert_eq!(tiers.lookup(&hashes), [0, 2, 2], "G2 for two, G3 for two");
    let gap = [hashes[0], chain(9, 1)[0], hashes[2]];
    assert_eq!(tiers.lookup(&gap), [0, 0, 1], "stops at the first miss");
    let onboard = tiers.onboard(&hashes, 3);
    assert_eq!(
        (onboard.blocks, onboard.loaded_from.clone()),
        (3, vec![0, 1, 2])
    );
    let plan = planned(&mut tiers);
    assert_eq!(plan.len(), 2, "one load per source tier");
    for transfer in &plan {
        assert_eq!(transfer.destination, TierId::DEVICE);
    }
    let mut loaded = Vec::new();
    for transfer in plan {
        let Settled::Loaded { blocks, .. } = tiers.complete(transfer.id).unwrap() else {
            panic!("a load")
        };
        loaded.push(blocks);
    }
    assert_eq!(device.match_blocks(&hashes).len(), 3);
    tiers.audit().unwrap();
}

#[test]
fn holds_answers_each_block_on_its_own_past_a_gap() {
    let device = device(8);
    let mut tiers = tiers(
        &device,
        vec![TierConfig::new("CPU", 2), TierConfig::new("DISK", 8)],
    );
    let hashes = chain(3, 4);
    for hash in &hashes {
        tiers.offload(compute(&device, &[*hash]));
        run_all(&mut tiers).unwrap();
    }
    drop(device.allocate_blocks(8).unwrap());
    let stranger = chain(9, 1)[0];
    let asked = [hashes[0], stranger, hashes[2], hashes[3]];
    assert_eq!(tiers.holds(&asked), [true, false, true, true]);
    assert_eq!(tiers.lookup(&asked), [0, 0, 1], "lookup stops at the gap");
    // Nothing was pinned: every lower block is still evictable.
    for (_, pool) in tiers.audit().unwrap().pools {
        assert_eq!(pool.in_use_blocks(), 0);
    }
}

#[test]
fn a_block_being_loaded_is_waited_for_not_loaded_twice() {
    let device = device(8);
    let mut tiers = tiers(&device, vec![TierConfig::new("CPU", 8)]);
    let hashes = chain(2, 3);
    tiers.offload(compute(&device, &hashes));
    run_all(&mut tiers).unwrap();
    drop(device.allocate_blocks(8).unwrap());
    let first = tiers.onboard(&hashes[..2], 8);
    let second = tiers.onboard(&hashes, 8);
    assert_eq!(second.blocks, 3);
    assert_eq!(second.loaded_from, [0, 1], "only the third is loaded again");
    assert!(
        second.transfers.contains(&first.transfers[0]),
        "waits for the first's load"
    );
    assert_eq!(tiers.lookup(&hashes), [3, 0]);
    tiers.audit().unwrap();
}

#[test]
fn no_room_on_the_device_loads_nothing() {
    let device = device(2);
    let mut tiers = tiers(&device, vec![TierConfig::new("CPU", 8)]);
    let hashes = chain(3, 2);
    tiers.offload(compute(&device, &hashes));
    run_all(&mut tiers).unwrap();
    let held = device.allocate_blocks(2).unwrap();
    let onboard = tiers.onboard(&hashes, 8);
    assert_eq!((onboard.blocks, onboard.transfers.len()), (0, 0));
    assert!(planned(&mut tiers).is_empty());
    drop(held);
    tiers.audit().unwrap();
}

/// Two devices (two engines) share one pool below them: what one stores,
/// the other loads; both store the same block at once and the pool keeps
/// one copy.
#[test]
fn a_shared_pool_serves_every_device_that_shares_it() {
    use kvbm_blocks::BlockManager;
    use kvbm_tiers::{Lower, Tiers};
    let pool = BlockManager::<Lower>::builder()
        .block_count(8)
        .block_size(crate::support::BLOCK)
        .build()
        .unwrap();
    let (a_device, b_device) = (device(4), device(4));
    let mut a = Tiers::new(a_device.clone(), vec![TierConfig::shared("REMOTE", &pool)]).unwrap();
    let mut b = Tiers::new(b_device.clone(), vec![TierConfig::shared("REMOTE", &pool)]).unwrap();
    let hashes = chain(7, 2);
    a.offload(compute(&a_device, &hashes));
    b.offload(compute(&b_device, &hashes[..1]));
    run_all(&mut a).unwrap();
    run_all(&mut b).unwrap();
    assert_eq!(pool.metrics().inactive_blocks, 2, "one copy of each block");
    let c_device = device(4);
    let mut c = Tiers::new(c_device.clone(), vec![TierConfig::shared("REMOTE", &pool)]).unwrap();
    assert_eq!(c.lookup(&hashes), [0, 2]);
    c.onboard(&hashes, 8);
    run_all(&mut c).unwrap();
    assert_eq!(c_device.scan_matches(&hashes), [true, true]);
    for tiers in [&a, &b, &c] {
        tiers.audit().unwrap();
    }
    // A pool of another block size cannot be shared.
    let other = BlockManager::<Lower>::builder()
        .block_count(8)
        .block_size(8)
        .build()
        .unwrap();
    assert!(Tiers::new(device(4), vec![TierConfig::shared("REMOTE", &other)]).is_err());
}
