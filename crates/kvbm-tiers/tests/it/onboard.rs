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
