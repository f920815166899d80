//! The two-phase protocol: nothing is matchable before its copy completes,
//! nothing in flight is evicted or reused, failed and abandoned copies leave
//! nothing behind, and bad reports change nothing.

use kvbm_blocks::BlockError;
use kvbm_tiers::{Outcome, Settled, TierConfig, TierError, TierId, TransferId};

use crate::support::{chain, compute, device, planned, tiers};

#[test]
fn a_stores_source_is_pinned_until_the_store_ends() {
    let device = device(2);
    let mut tiers = tiers(&device, vec![TierConfig::new("CPU", 4)]);
    let hashes = chain(1, 2);
    let blocks = compute(&device, &hashes);
    tiers.offload(blocks.clone());
    drop(blocks); // the request finished while its blocks are being stored
    let plan = planned(&mut tiers);
    let err = device.allocate_blocks(1).unwrap_err();
    assert!(matches!(
        err,
        BlockError::InsufficientBlocks { available: 0, .. }
    ));
    tiers.complete(plan[0].id).unwrap();
    assert_eq!(
        device.allocate_blocks(2).unwrap().len(),
        2,
        "released after the store"
    );
}

#[test]
fn a_failed_load_leaves_nothing_on_the_device() {
    let device = device(4);
    let mut tiers = tiers(&device, vec![TierConfig::new("CPU", 4)]);
    let hashes = chain(2, 2);
    tiers.offload(compute(&device, &hashes));
    let store = planned(&mut tiers);
    tiers.complete(store[0].id).unwrap();
    drop(device.allocate_blocks(4).unwrap()); // evicts both from the device
    let onboard = tiers.onboard(&hashes, 8);
    assert_eq!(onboard.blocks, 2);
    let load = planned(&mut tiers);
    assert_eq!(device.metrics().in_use_blocks, 2, "destinations held");
    assert!(
        device.match_blocks(&hashes).is_empty(),
        "not matchable in flight"
    );
    let settled = tiers.fail(load[0].id).unwrap();
    assert!(matches!(
        settled,
        Settled::Dropped {
            failed: true,
            blocks: 2,
            ..
        }
    ));
    assert!(
        device.match_blocks(&hashes).is_empty(),
        "a failed load is never a hit"
    );
    assert_eq!(device.metrics().free_blocks, 4, "destinations freed");
    let stats = tiers.stats(TierId::lower(0).unwrap()).unwrap();
    assert_eq!((stats.loaded_blocks, stats.failed_loads), (0, 2));
    tiers.audit().unwrap();
}

#[test]
fn an_abandoned_load_that_completes_late_is_thrown_away() {
    let device = device(4);
    let mut tiers = tiers(&device, vec![TierConfig::new("CPU", 4)]);
    let hashes = chain(3, 1);
    tiers.offload(compute(&device, &hashes));
    let store = planned(&mut tiers);
    tiers.complete(store[0].id).unwrap();
    drop(device.allocate_blocks(4).unwrap());
    tiers.onboard(&hashes, 8);
    let load = planned(&mut tiers);
    tiers.abandon(load[0].id).unwrap();
    // Another request may load it again meanwhile.
    assert_eq!(tiers.lookup(&hashes), [0, 1]);
    let settled = tiers.complete(load[0].id).unwrap();
    assert!(matches!(settled, Settled::Dropped { failed: false, .. }));
    assert!(device.match_blocks(&hashes).is_empty());
    tiers.audit().unwrap();
}

#[test]
fn reports_of_unknown_or_settled_transfers_are_refused_and_change_nothing() {
    let device = device(4);
    let mut tiers = tiers(&device, vec![TierConfig::new("CPU", 4)]);
    tiers.offload(compute(&device, &chain(4, 2)));
    let plan = planned(&mut tiers);
    let id = plan[0].id;
    let never = TransferId::clone(&id);
    assert_eq!(
        tiers
            .settle_all(&[(id, Outcome::Completed), (never, Outcome::Failed)])
            .unwrap_err(),
        TierError::DuplicateReport(id)
    );
    assert!(tiers.in_flight(id), "a refused batch settles nothing");
    tiers.complete(id).unwrap();
    assert_eq!(
        tiers.complete(id).unwrap_err(),
        TierError::UnknownTransfer(id)
    );
    assert_eq!(tiers.fail(id).unwrap_err(), TierError::UnknownTransfer(id));
    let counts = tiers.transfer_counts();
    assert_eq!((counts.planned, counts.completed, counts.failed), (1, 1, 0));
    tiers.audit().unwrap();
}

#[test]
fn invalid_tiers_are_refused() {
    let device = device(4);
    for (config, needle) in [
        (vec![TierConfig::new("CPU", 0)], "0 blocks"),
        (vec![TierConfig::new("", 4)], "name"),
        (
            vec![TierConfig::new("CPU", 4).with_max_incoming_blocks(0)],
            "incoming",
        ),
        (
            vec![TierConfig::new("CPU", 4), TierConfig::new("CPU", 4)],
            "twice",
        ),
        (vec![TierConfig::new("CPU", usize::MAX)], "blocks"),
    ] {
        let err = kvbm_tiers::Tiers::new(device.clone(), config).unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
    }
    let many = (0..300)
        .map(|i| TierConfig::new(format!("T{i}"), 1))
        .collect();
    assert_eq!(
        kvbm_tiers::Tiers::new(device, many).unwrap_err(),
        TierError::TooManyTiers(300)
    );
}
