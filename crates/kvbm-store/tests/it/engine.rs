//! The transfer engine between a fake engine's device and a host arena,
//! driven by the tiers' own plans.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use kvbm_blocks::SequenceHash;
use kvbm_store::EngineConfig;
use kvbm_tiers::TierId;
use proptest::prelude::*;

use crate::support::{Rig, chain};

#[test]
fn offloaded_blocks_come_back_byte_for_byte() {
    let mut rig = Rig::new(8, 64, EngineConfig::default());
    let first = chain(1, 8);
    drop(rig.compute(&first));
    rig.drain();
    assert_eq!(rig.host.len(), 8);
    // Another request takes the whole device: the first chain is evicted.
    drop(rig.compute(&chain(2, 8)));
    rig.drain();
    assert!(rig.pool.match_blocks(&first).is_empty());
    let onboard = rig.tiers.onboard(&first, 8);
    assert_eq!(onboard.blocks, 8);
    rig.drain();
    assert_eq!((rig.verified, rig.wrong), (8, 0));
    assert_eq!(rig.pool.match_blocks(&first).len(), 8);
    let stats = rig.engine.stats();
    assert_eq!(stats.loaded_blocks, 8);
    assert_eq!(stats.verified_blocks, 8);
    assert_eq!(stats.stored_blocks, 16);
    assert_eq!(stats.bytes_written, 16 * crate::support::BYTES as u64);
    rig.tiers.audit().unwrap();
}

#[test]
fn the_store_follows_its_tiers_evictions() {
    // A host tier of 8 blocks under 40 computed ones: the tier evicts, and
    // the arena (exactly as large) must drop the same keys to take the next.
    let mut rig = Rig::new(8, 8, EngineConfig::default());
    for seed in 0..5 {
        drop(rig.compute(&chain(100 + seed, 8)));
        rig.drain();
    }
    let stats = rig.engine.stats();
    assert_eq!(stats.failed_transfers, 0, "{stats:?}");
    assert_eq!(stats.stored_blocks, 40);
    assert_eq!(rig.host.len(), 8);
    assert!(stats.removed_blocks >= 32, "{stats:?}");
}

#[test]
fn corrupt_reads_fail_their_loads_and_never_reach_a_request() {
    let mut rig = Rig::new(8, 64, EngineConfig::default());
    let first = chain(1, 6);
    drop(rig.compute(&first));
    rig.drain();
    drop(rig.compute(&chain(2, 8)));
    rig.drain();
    // Every read from now on comes back with a flipped bit.
    rig.faults.corrupt_every.store(1, Ordering::Relaxed);
    assert_eq!(rig.tiers.onboard(&first, 8).blocks, 6);
    rig.drain();
    let stats = rig.engine.stats();
    assert_eq!((rig.verified, rig.wrong), (0, 0));
    assert!(stats.corrupt_blocks >= 1, "{stats:?}");
    assert_eq!(stats.loaded_blocks, 0, "a corrupt block reached the device");
    assert!(rig.pool.match_blocks(&first).is_empty());
    // The host copy itself is intact: with reads healthy again it loads.
    rig.faults.corrupt_every.store(0, Ordering::Relaxed);
    assert_eq!(rig.tiers.onboard(&first, 8).blocks, 6);
    rig.drain();
    assert_eq!((rig.verified, rig.wrong), (6, 0));
}

#[test]
fn a_full_queue_hands_the_transfer_back() {
    let mut rig = Rig::new(
        64,
        256,
        EngineConfig::default().with_workers(1).with_queue(1),
    );
    for seed in 0..16 {
        drop(rig.compute(&chain(seed, 1)));
    }
    let mut plan = Vec::new();
    rig.tiers.take_planned(&mut plan);
    assert_eq!(plan.len(), 16);
    let mut refused = 0;
    for transfer in plan {
        if let Err(back) = rig.engine.try_submit(transfer) {
            refused += 1;
            rig.backlog.push(back);
        }
    }
    // One worker and one queue slot take at most two at once (the reports
    // channel holds two more).
    assert!(refused >= 12, "{refused} refused");
    rig.drain();
    let stats = rig.engine.stats();
    assert_eq!(stats.completed_transfers, 16);
}

/// What one step of the fuzz does.
#[derive(Clone, Debug)]
enum Op {
    /// A request computes the chain of this seed and length.
    Compute(u8, u8),
    /// A request onboards the chain of this seed and length.
    Onboard(u8, u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..12, 1u8..8).prop_map(|(s, n)| Op::Compute(s, n)),
        (0u8..12, 1u8..8).prop_map(|(s, n)| Op::Onboard(s, n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::support::cases(24)))]

    /// Under injected I/O errors, timeouts and corrupted reads, on three
    /// workers: every block the tiers register on the device holds exactly
    /// its own KV, every transfer is reported once, and the host store
    /// holds exactly what its tier holds once nothing is in flight.
    #[test]
    fn fuzz_faults_never_load_wrong_kv(
        ops in prop::collection::vec(op(), 1..40),
        put_every in 0u64..9,
        get_every in 0u64..9,
        corrupt_every in 0u64..9,
    ) {
        let mut rig = Rig::new(12, 16, EngineConfig::default().with_workers(3).with_queue(2).with_batch_blocks(3));
        rig.faults.put_every.store(put_every, Ordering::Relaxed);
        rig.faults.get_every.store(get_every, Ordering::Relaxed);
        rig.faults.corrupt_every.store(corrupt_every, Ordering::Relaxed);
        let mut universe: HashMap<u128, SequenceHash> = HashMap::new();
        for op in ops {
            match op {
                Op::Compute(seed, n) => {
                    let hashes = chain(u128::from(seed), n.into());
                    universe.extend(hashes.iter().map(|h| (h.value(), *h)));
                    drop(rig.compute(&hashes));
                }
                Op::Onboard(seed, n) => {
                    let hashes = chain(u128::from(seed), n.into());
                    rig.tiers.onboard(&hashes, 8);
                }
            }
            rig.drain();
            prop_assert_eq!(rig.wrong, 0);
        }
        let stats = rig.engine.stats();
        let counts = rig.tiers.transfer_counts();
        prop_assert_eq!(stats.completed_transfers, counts.completed);
        prop_assert_eq!(stats.failed_transfers, counts.failed);
        prop_assert_eq!(counts.in_flight, 0);
        rig.tiers.audit().unwrap();
        // The store holds exactly the tier's blocks.
        let host = TierId::lower(0).unwrap();
        let pool = rig.tiers.pool(host).unwrap();
        let keys = rig.host.keys().unwrap();
        prop_assert_eq!(keys.len(), pool.audit().unwrap().registered_hashes);
        for key in keys {
            let hash = universe[&key];
            prop_assert_eq!(pool.match_blocks(&[hash]).len(), 1, "{:032x} is stored but not in its tier", key);
        }
    }
}
