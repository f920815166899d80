//! Restarts: the disk tier's blocks outlive the engine's process; after a
//! restart (and a crash that rotted some of them) the tier adopts what its
//! store found, and every block loaded from it is exactly its own KV.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use kvbm_blocks::SequenceHash;
use kvbm_store::{BlockStore, DiskConfig, DiskStore, EngineConfig};
use kvbm_tiers::TierConfig;

use crate::support::{BYTES, Rig, chain};

fn disk(dir: &std::path::Path) -> Arc<DiskStore> {
    Arc::new(
        DiskStore::open(
            DiskConfig::new(dir, BYTES, 64)
                .slots_per_file(8)
                .create(true),
        )
        .unwrap(),
    )
}

/// Blocks of `hashes` a request can load: the prefix all of whose blocks
/// survived.
fn loadable(hashes: &[SequenceHash], survived: &[SequenceHash]) -> usize {
    hashes
        .iter()
        .take_while(|hash| survived.contains(hash))
        .count()
}

#[test]
fn completed_stores_survive_a_restart_and_rot_is_recomputed() {
    let dir = tempfile::tempdir().unwrap();
    let chains = [chain(1, 6), chain(2, 6), chain(3, 4)];
    {
        let mut rig = Rig::with_store(
            8,
            TierConfig::new("DISK", 64),
            disk(dir.path()),
            &[],
            EngineConfig::default(),
        );
        for hashes in &chains {
            drop(rig.compute(hashes));
            rig.drain();
        }
        assert_eq!(rig.host.len(), 16);
        assert_eq!(rig.engine.stats().failed_transfers, 0);
    }
    // While the engine is down, two blocks rot on disk.
    let slots = OpenOptions::new()
        .write(true)
        .open(dir.path().join("slots-00000.bin"))
        .unwrap();
    slots.write_at(&[0xff; 3], 4096 * 2 + 200).unwrap();
    slots.write_at(&[0xff; 3], 4096 * 5 + 300).unwrap();
    drop(slots);

    let store = disk(dir.path());
    assert_eq!(store.recovery().dropped_corrupt, 2);
    let survived = store.blocks();
    assert_eq!(survived.len(), 14);
    // Every survivor comes back with its whole hash (lineage included).
    for hash in &survived {
        assert!(chains.iter().any(|c| c.contains(hash)), "{hash:?}");
    }
    let mut rig = Rig::with_store(
        8,
        TierConfig::new("DISK", 64),
        store,
        &survived,
        EngineConfig::default(),
    );
    let mut expected = 0;
    for hashes in &chains {
        let onboard = rig.tiers.onboard(hashes, 8);
        assert_eq!(onboard.blocks, loadable(hashes, &survived));
        expected += onboard.blocks;
        rig.drain();
        // The device takes the next chain's loads.
        drop(rig.compute(&chain(100 + expected as u128, 8)));
        rig.drain();
    }
    assert!(expected >= 6, "{expected}");
    assert_eq!((rig.verified, rig.wrong), (expected, 0));
    assert_eq!(rig.engine.stats().failed_transfers, 0);
    rig.tiers.audit().unwrap();
}

/// Whether the store or the engine verifies, a block that rots on disk
/// under a running engine fails its load.
fn rot_while_running(verify_reads: bool) {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskConfig::new(dir.path(), BYTES, 64)
        .slots_per_file(8)
        .verify_reads(verify_reads);
    let store = Arc::new(DiskStore::open(store).unwrap());
    assert_eq!(store.verifies_reads(), verify_reads);
    let mut rig = Rig::with_store(
        8,
        TierConfig::new("DISK", 64),
        store,
        &[],
        EngineConfig::default(),
    );
    let first = chain(1, 6);
    drop(rig.compute(&first));
    rig.drain();
    drop(rig.compute(&chain(2, 8)));
    rig.drain();
    // Every slot of the first file rots under the running store.
    let slots = OpenOptions::new()
        .write(true)
        .open(dir.path().join("slots-00000.bin"))
        .unwrap();
    for slot in 0..8u64 {
        slots.write_at(&[0x5a; 5], 4096 * slot + 200).unwrap();
    }
    drop(slots);
    assert_eq!(rig.tiers.onboard(&first, 8).blocks, 6);
    rig.drain();
    let stats = rig.engine.stats();
    assert_eq!((rig.verified, rig.wrong), (0, 0));
    assert!(stats.corrupt_blocks >= 1, "{stats:?}");
    assert_eq!(stats.loaded_blocks, 0, "a rotten block reached the device");
    assert!(rig.pool.match_blocks(&first).is_empty());
    rig.tiers.audit().unwrap();
}

#[test]
fn a_block_that_rots_on_disk_while_running_fails_its_load_never_loads_wrong() {
    rot_while_running(true);
}

#[test]
fn with_reads_unverified_by_the_store_the_engine_catches_the_rot() {
    rot_while_running(false);
}
