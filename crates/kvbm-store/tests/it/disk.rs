//! The disk store: round trips, reopening after a restart or a crash, bad
//! directories and configurations, a model-based proptest and threads.

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use kvbm_store::{BlockRef, BlockStore, DiskConfig, DiskStore, StoreError};
use proptest::prelude::*;

use crate::support::{kv, put};

/// Blocks of the tests: with the 128-byte header, one 4 KiB page a slot.
const BYTES: usize = 256;
const STRIDE: u64 = 4096;
const HEADER: u64 = 128;

fn block(seed: u128) -> Vec<u8> {
    kv(seed, BYTES)
}

fn config(dir: &Path, capacity: usize) -> DiskConfig {
    DiskConfig::new(dir, BYTES, capacity).slots_per_file(4)
}

fn open(dir: &Path, capacity: usize) -> DiskStore {
    DiskStore::open(config(dir, capacity)).unwrap()
}

/// The block of `key`, read back and verified, or the error.
fn get(store: &DiskStore, key: u128) -> Result<Vec<u8>, StoreError> {
    let mut out = vec![0; store.block_bytes()];
    let sum = store.get(&mut [(key, &mut out[..])]).pop().unwrap()?;
    assert!(
        sum.verifies(key, &out),
        "a get returned bytes that do not verify"
    );
    Ok(out)
}

/// Slot `slot`'s file (4 slots a file) and its offset in it.
fn slot_at(dir: &Path, slot: u64) -> (std::path::PathBuf, u64) {
    (
        dir.join(format!("slots-{:05}.bin", slot / 4)),
        (slot % 4) * STRIDE,
    )
}

fn poke(dir: &Path, slot: u64, offset: u64, bytes: &[u8]) {
    let (path, at) = slot_at(dir, slot);
    let file = OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, at + offset).unwrap();
}

/// Ends `slot`'s file 10 bytes into the slot's block: a write that a crash
/// cut short.
fn cut_in_block(dir: &Path, slot: u64) {
    let (path, at) = slot_at(dir, slot);
    OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(at + HEADER + 10)
        .unwrap();
}

/// Changes the byte at `offset` of `slot`. By adding, not xoring: the
/// fuzzer may corrupt one byte twice, and a second xor would restore it
/// (128 additions would).
fn flip(dir: &Path, slot: u64, offset: u64) {
    let (path, at) = slot_at(dir, slot);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at + offset).unwrap();
    file.write_all_at(&[byte[0].wrapping_add(0x5a)], at + offset)
        .unwrap();
}

#[test]
fn blocks_round_trip_and_bad_sizes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 8);
    assert!(store.recovery().created);
    assert_eq!(
        (store.block_bytes(), store.capacity(), store.len()),
        (BYTES, 8, 0)
    );
    let (a, b) = (block(1), block(2));
    let results = store.put(&[put(1, &a), put(2, &b), put(3, &a[..10])]);
    assert!(results[0].is_ok() && results[1].is_ok());
    assert!(matches!(
        results[2],
        Err(StoreError::WrongSize {
            expected: BYTES,
            got: 10
        })
    ));
    assert_eq!(store.contains(&[1, 2, 3]), [true, true, false]);
    assert_eq!(store.len(), 2);
    let mut keys = store.keys().unwrap();
    keys.sort_unstable();
    assert_eq!(keys, [1, 2]);
    assert_eq!(get(&store, 1).unwrap(), a);
    assert_eq!(get(&store, 2).unwrap(), b);
    assert!(matches!(
        get(&store, 3),
        Err(StoreError::Missing { key: 3 })
    ));
    let mut short = [0u8; 3];
    assert!(matches!(
        store.get(&mut [(1, &mut short[..])])[0],
        Err(StoreError::WrongSize {
            expected: BYTES,
            got: 3
        })
    ));
    assert!(matches!(store.remove(&[1, 9])[..], [Ok(true), Ok(false)]));
    assert!(matches!(
        get(&store, 1),
        Err(StoreError::Missing { key: 1 })
    ));
    assert_eq!(store.len(), 1);
    assert!(format!("{store:?}").contains("DiskStore"));
}

#[test]
fn a_reopened_store_finds_every_completed_block() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 10);
    let blocks: Vec<Vec<u8>> = (0..10).map(block).collect();
    let puts: Vec<BlockRef<'_>> = (0..10).map(|key| put(key, &blocks[key as usize])).collect();
    assert!(store.put(&puts).iter().all(Result::is_ok));
    drop(store);
    // Three files: 4 + 4 + 2 slots.
    assert!(dir.path().join("slots-00002.bin").exists());
    let store = open(dir.path(), 10);
    let recovery = store.recovery();
    assert!(!recovery.created);
    assert_eq!((recovery.blocks, recovery.dropped()), (10, 0));
    for key in 0..10 {
        assert_eq!(get(&store, key).unwrap(), blocks[key as usize]);
    }
    // A reopen with headers only finds the same.
    drop(store);
    let store = DiskStore::open(config(dir.path(), 10).verify_on_open(false)).unwrap();
    assert_eq!(store.recovery().blocks, 10);
    assert_eq!(store.len(), 10);
}

#[test]
fn a_reopen_after_a_crash_drops_and_counts_torn_and_corrupt_slots() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 8);
    let blocks: Vec<Vec<u8>> = (0..8).map(block).collect();
    let puts: Vec<BlockRef<'_>> = (0..8).map(|key| put(key, &blocks[key as usize])).collect();
    assert!(store.put(&puts).iter().all(Result::is_ok));
    drop(store);
    // Key k is in slot k: puts take the lowest free slots in order.
    flip(dir.path(), 1, HEADER + 100); // a block's bytes rot
    flip(dir.path(), 2, 12); // a header's key rots
    poke(dir.path(), 3, 0, &[0; HEADER as usize]); // the header never landed
    // The last slot of the second file is cut short mid-block.
    cut_in_block(dir.path(), 7);

    let store = open(dir.path(), 8);
    let recovery = store.recovery();
    assert_eq!(recovery.blocks, 4);
    assert_eq!((recovery.dropped_corrupt, recovery.dropped_torn), (2, 2));
    assert_eq!(recovery.dropped_duplicates, 0);
    for key in [0, 4, 5, 6] {
        assert_eq!(get(&store, key).unwrap(), blocks[key as usize]);
    }
    for key in [1, 2, 3, 7] {
        assert!(matches!(get(&store, key), Err(StoreError::Missing { .. })));
    }
    // The dropped slots are free again, and tombstoned: a second reopen
    // counts nothing.
    assert!(store.put(&puts[1..4]).iter().all(Result::is_ok));
    drop(store);
    let store = open(dir.path(), 8);
    assert_eq!(
        (store.recovery().blocks, store.recovery().dropped()),
        (7, 0)
    );
    assert_eq!(get(&store, 2).unwrap(), blocks[2]);
}

#[test]
fn of_two_slots_with_one_key_a_reopen_keeps_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 4);
    let (a, b) = (block(0), block(1));
    assert!(
        store
            .put(&[put(0, &a), put(1, &b)])
            .iter()
            .all(Result::is_ok)
    );
    drop(store);
    // Slot 1 becomes a second copy of slot 0, as a crash between a put and
    // a tombstone could leave it.
    let (path, _) = slot_at(dir.path(), 0);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut copy = vec![0; STRIDE as usize];
    file.read_exact_at(&mut copy, 0).unwrap();
    file.write_all_at(&copy, STRIDE).unwrap();
    let store = open(dir.path(), 4);
    let recovery = store.recovery();
    assert_eq!(
        (
            recovery.blocks,
            recovery.dropped_duplicates,
            recovery.dropped()
        ),
        (1, 1, 1)
    );
    assert_eq!(get(&store, 0).unwrap(), a);
    assert!(matches!(
        get(&store, 1),
        Err(StoreError::Missing { key: 1 })
    ));
    drop(store);
    assert_eq!(open(dir.path(), 4).recovery().dropped(), 0);
}

#[test]
fn a_syncing_store_round_trips_through_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::open(config(dir.path(), 4).sync(true)).unwrap();
    let (a, b) = (block(1), block(2));
    assert!(
        store
            .put(&[put(1, &a), put(2, &b)])
            .iter()
            .all(Result::is_ok)
    );
    assert!(matches!(store.remove(&[2])[..], [Ok(true)]));
    drop(store);
    let store = DiskStore::open(config(dir.path(), 4).sync(true)).unwrap();
    assert_eq!(store.contains(&[1, 2]), [true, false]);
    assert_eq!(get(&store, 1).unwrap(), a);
}

#[test]
fn a_block_that_rots_while_open_is_corrupt_once_then_gone() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 4);
    let (a, b) = (block(10), block(11));
    assert!(
        store
            .put(&[put(10, &a), put(11, &b)])
            .iter()
            .all(Result::is_ok)
    );
    flip(dir.path(), 0, HEADER + 3);
    assert!(matches!(
        get(&store, 10),
        Err(StoreError::Corrupt { key: 10, .. })
    ));
    assert!(matches!(
        get(&store, 10),
        Err(StoreError::Missing { key: 10 })
    ));
    assert_eq!(store.contains(&[10, 11]), [false, true]);
    assert_eq!(get(&store, 11).unwrap(), b);
    // Its slot is reused, and the block can be put again.
    assert!(store.put(&[put(10, &a)])[0].is_ok());
    assert_eq!(get(&store, 10).unwrap(), a);
    drop(store);
    assert_eq!(open(dir.path(), 4).recovery().dropped(), 0);
}

/// Blocks larger than the store's read piece (256 KiB): a verified get or
/// reopen reads and hashes them piece by piece.
const LARGE: usize = 700_000;

#[test]
fn large_blocks_that_rot_in_any_piece_are_caught_by_a_get_and_by_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let config = || DiskConfig::new(dir.path(), LARGE, 4).slots_per_file(1);
    let blocks: Vec<Vec<u8>> = (0..4).map(|key| kv(key, LARGE)).collect();
    let rot = |slot: u64, at: u64| {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.path().join(format!("slots-{slot:05}.bin")))
            .unwrap();
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, HEADER + at).unwrap();
        file.write_all_at(&[!byte[0]], HEADER + at).unwrap();
    };
    let store = DiskStore::open(config()).unwrap();
    let puts: Vec<BlockRef<'_>> = (0..4).map(|key| put(key, &blocks[key as usize])).collect();
    assert!(store.put(&puts).iter().all(Result::is_ok));
    for key in 0..4 {
        assert_eq!(get(&store, key).unwrap(), blocks[key as usize]);
    }
    // Key k is in slot k, one slot a file. Rot in the first piece, the
    // second, and the block's last byte: each get fails once, then the
    // block is gone; the untouched block still reads.
    for (key, at) in [(0, 5), (1, 300_000), (2, LARGE as u64 - 1)] {
        rot(key, at);
        assert!(
            matches!(get(&store, key as u128), Err(StoreError::Corrupt { .. })),
            "rot at byte {at} of block {key} was served"
        );
        assert!(matches!(
            get(&store, key as u128),
            Err(StoreError::Missing { .. })
        ));
    }
    assert_eq!(get(&store, 3).unwrap(), blocks[3]);
    // Put back, then rot while closed: the reopen drops exactly the rotten.
    assert!(store.put(&puts[..3]).iter().all(Result::is_ok));
    drop(store);
    let mut slots: Vec<u64> = (0..4).collect();
    slots.sort_by_key(|&slot| {
        let mut header = [0u8; 24];
        fs::File::open(dir.path().join(format!("slots-{slot:05}.bin")))
            .unwrap()
            .read_exact_at(&mut header, 0)
            .unwrap();
        u128::from_le_bytes(header[8..24].try_into().unwrap())
    });
    rot(slots[1], 400_000);
    rot(slots[3], LARGE as u64 - 2);
    let store = DiskStore::open(config()).unwrap();
    assert_eq!(
        (store.recovery().blocks, store.recovery().dropped_corrupt),
        (2, 2)
    );
    assert_eq!(store.contains(&[0, 1, 2, 3]), [true, false, true, false]);
    assert_eq!(get(&store, 0).unwrap(), blocks[0]);
    assert_eq!(get(&store, 2).unwrap(), blocks[2]);
}

#[test]
fn a_collision_keeps_the_stored_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 4);
    let (old, new) = (block(1), block(2));
    assert!(store.put(&[put(5, &old)])[0].is_ok());
    assert!(matches!(
        store.put(&[put(5, &new)])[0],
        Err(StoreError::Collision { key: 5 })
    ));
    assert!(store.put(&[put(5, &old)])[0].is_ok());
    assert_eq!(store.len(), 1);
    assert_eq!(get(&store, 5).unwrap(), old);
    drop(store);
    let store = open(dir.path(), 4);
    assert_eq!(get(&store, 5).unwrap(), old);
}

#[test]
fn a_full_store_refuses_and_a_removal_makes_room() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 2);
    let blocks: Vec<Vec<u8>> = (0..3).map(block).collect();
    let results = store.put(&[put(0, &blocks[0]), put(1, &blocks[1]), put(2, &blocks[2])]);
    assert!(results[0].is_ok() && results[1].is_ok());
    assert!(matches!(results[2], Err(StoreError::Full { capacity: 2 })));
    assert!(matches!(store.remove(&[0])[..], [Ok(true)]));
    assert!(store.put(&[put(2, &blocks[2])])[0].is_ok());
    assert_eq!(get(&store, 2).unwrap(), blocks[2]);
    // The capacity bounds the files, whatever the disk has free.
    let file = dir.path().join("slots-00000.bin");
    assert!(fs::metadata(file).unwrap().len() <= 2 * STRIDE);
}

#[test]
fn removed_blocks_do_not_come_back_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 4);
    let blocks: Vec<Vec<u8>> = (0..4).map(block).collect();
    let puts: Vec<BlockRef<'_>> = (0..4).map(|key| put(key, &blocks[key as usize])).collect();
    assert!(store.put(&puts).iter().all(Result::is_ok));
    assert!(store.remove(&[1, 3]).iter().all(|r| matches!(r, Ok(true))));
    drop(store);
    let store = open(dir.path(), 4);
    assert_eq!(store.contains(&[0, 1, 2, 3]), [true, false, true, false]);
    assert_eq!(store.recovery().dropped(), 0);
}

#[test]
fn an_io_error_fails_its_block_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::open(DiskConfig::new(dir.path(), BYTES, 2).slots_per_file(1)).unwrap();
    // The first slot's file cannot be opened: a directory squats its name.
    fs::create_dir(dir.path().join("slots-00000.bin")).unwrap();
    let (a, b) = (block(1), block(2));
    let results = store.put(&[put(1, &a), put(2, &b)]);
    assert!(matches!(results[0], Err(StoreError::Io(_))));
    assert!(results[1].is_ok());
    assert_eq!(store.contains(&[1, 2]), [false, true]);
    assert!(matches!(
        get(&store, 1),
        Err(StoreError::Missing { key: 1 })
    ));
    assert_eq!(get(&store, 2).unwrap(), b);
    fs::remove_dir(dir.path().join("slots-00000.bin")).unwrap();
    assert!(store.put(&[put(1, &a)])[0].is_ok());
    assert_eq!(get(&store, 1).unwrap(), a);
}

/// Whether `store` holds exactly the blocks of `keys` (each `block(key)`).
fn holds_exactly(store: &DiskStore, keys: &[u128]) {
    let mut held = store.keys().unwrap();
    held.sort_unstable();
    let mut want = keys.to_vec();
    want.sort_unstable();
    assert_eq!(held, want);
    for &key in keys {
        assert_eq!(get(store, key).unwrap(), block(key));
    }
}

#[test]
fn a_batch_of_partly_consecutive_slots_is_stored_and_found_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 12);
    let first: Vec<Vec<u8>> = (0..8).map(block).collect();
    let puts: Vec<BlockRef<'_>> = (0..8).map(|key| put(key, &first[key as usize])).collect();
    assert!(store.put(&puts).iter().all(Result::is_ok));
    // Slots 1, 2, 5, 6 and 7 free again, taken back in reverse order.
    assert!(
        store
            .remove(&[1, 2, 5, 6, 7])
            .iter()
            .all(|r| matches!(r, Ok(true)))
    );
    // Seven new blocks take slots 7, 6, 5, 2, 1 (freed) and 8, 9 (fresh):
    // runs 1-2, 5-7 and 8-9 (7 and 8 are in two files). Between them, a
    // block already stored, a collision and a block of the wrong size.
    let new: Vec<Vec<u8>> = (10..17).map(block).collect();
    let mut batch: Vec<BlockRef<'_>> = Vec::new();
    for (key, bytes) in (10..17).zip(&new) {
        batch.push(put(key, bytes));
        match key {
            11 => batch.push(put(0, &first[0])),
            13 => batch.push(put(3, &new[0])),
            15 => batch.push(put(99, &new[0][..BYTES - 1])),
            _ => {}
        }
    }
    let results = store.put(&batch);
    let failed: Vec<u128> = batch
        .iter()
        .zip(&results)
        .filter(|(_, result)| result.is_err())
        .map(|(block, _)| block.key)
        .collect();
    assert_eq!(failed, [3, 99], "{results:?}");
    assert!(matches!(results[5], Err(StoreError::Collision { key: 3 })));
    let stored = [0, 3, 4, 10, 11, 12, 13, 14, 15, 16];
    holds_exactly(&store, &stored);
    // The run's padding is written only between slots: slot 9's file ends
    // with its block.
    let last = fs::metadata(dir.path().join("slots-00002.bin")).unwrap();
    assert_eq!(last.len(), STRIDE + HEADER + BYTES as u64);
    drop(store);
    let store = open(dir.path(), 12);
    assert_eq!(
        (store.recovery().blocks, store.recovery().dropped()),
        (stored.len(), 0)
    );
    holds_exactly(&store, &stored);
}

#[test]
fn a_run_whose_file_cannot_be_written_fails_its_blocks_only() {
    let dir = tempfile::tempdir().unwrap();
    let config = DiskConfig::new(dir.path(), BYTES, 6).slots_per_file(2);
    let store = DiskStore::open(config.clone()).unwrap();
    // The second file (slots 2 and 3) cannot be opened.
    fs::create_dir(dir.path().join("slots-00001.bin")).unwrap();
    let blocks: Vec<Vec<u8>> = (0..6).map(block).collect();
    let puts: Vec<BlockRef<'_>> = (0..6).map(|key| put(key, &blocks[key as usize])).collect();
    let results = store.put(&puts);
    for (key, result) in results.iter().enumerate() {
        if key == 2 || key == 3 {
            assert!(matches!(result, Err(StoreError::Io(_))), "{result:?}");
        } else {
            assert!(result.is_ok(), "{key}: {result:?}");
        }
    }
    holds_exactly(&store, &[0, 1, 4, 5]);
    drop(store);
    fs::remove_dir(dir.path().join("slots-00001.bin")).unwrap();
    let store = DiskStore::open(config).unwrap();
    assert_eq!(store.recovery().dropped(), 0);
    holds_exactly(&store, &[0, 1, 4, 5]);
    assert!(store.put(&puts[2..4]).iter().all(Result::is_ok));
    holds_exactly(&store, &[0, 1, 2, 3, 4, 5]);
}

#[test]
fn a_crash_mid_run_keeps_the_slots_that_landed_and_drops_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 4);
    let blocks: Vec<Vec<u8>> = (0..4).map(block).collect();
    let puts: Vec<BlockRef<'_>> = (0..4).map(|key| put(key, &blocks[key as usize])).collect();
    // One run, slots 0 to 3 of one file.
    assert!(store.put(&puts).iter().all(Result::is_ok));
    drop(store);
    // The crash: the run's pages landed in no order. From the middle of
    // slot 1's block to the end of slot 2's header nothing landed, and the
    // file ends in the middle of slot 3's block.
    let from = STRIDE + HEADER + 100;
    poke(
        dir.path(),
        1,
        HEADER + 100,
        &vec![0; (2 * STRIDE + HEADER - from) as usize],
    );
    cut_in_block(dir.path(), 3);
    let store = open(dir.path(), 4);
    let recovery = store.recovery();
    assert_eq!(recovery.blocks, 1);
    // Slot 1 fails its checksum; slot 2 has bytes behind an empty header,
    // slot 3 is cut short.
    assert_eq!((recovery.dropped_corrupt, recovery.dropped_torn), (1, 2));
    holds_exactly(&store, &[0]);
    // The dropped slots take the blocks again, as a run.
    assert!(store.put(&puts).iter().all(Result::is_ok));
    drop(store);
    let store = open(dir.path(), 4);
    assert_eq!(
        (store.recovery().blocks, store.recovery().dropped()),
        (4, 0)
    );
    holds_exactly(&store, &[0, 1, 2, 3]);
}

/// Names the directory the file size limit test's child process (the same
/// test, run again under a file size limit) writes into.
const FSIZE_CHILD: &str = "KVBM_DISK_FSIZE_CHILD";
/// The block size of the file size limit test: slots of 8 KiB.
const FSIZE_BYTES: usize = 8000;
const FSIZE_STRIDE: u64 = 8192;
const FSIZE_BLOCKS: u128 = 8;

/// The process's file size limit in bytes (`RLIMIT_FSIZE`).
fn file_size_limit() -> Option<u64> {
    let limits = fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max file size"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Run twice: by the test runner, and (with [`FSIZE_CHILD`] set) by itself
/// in a child process under the limit, where it writes the run.
#[test]
fn a_run_cut_short_by_a_file_size_limit_fails_the_blocks_it_did_not_write() {
    if let Some(dir) = std::env::var_os(FSIZE_CHILD) {
        write_under_file_size_limit(std::path::Path::new(&dir));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    // A limit of 40 blocks of the shell's unit (512 or 1024 bytes) falls
    // inside the run of eight 8 KiB slots; SIGXFSZ ignored, a write past
    // it fails with EFBIG (after writing what fits) instead of killing.
    // The child's output goes to pipes, which the limit does not bound.
    let child = std::process::Command::new("sh")
        .arg("-c")
        .arg(
            "trap '' XFSZ && ulimit -f 40 && exec \"$0\" --exact \
             disk::a_run_cut_short_by_a_file_size_limit_fails_the_blocks_it_did_not_write \
             --test-threads=1",
        )
        .arg(exe)
        .env(FSIZE_CHILD, dir.path())
        .output()
        .unwrap();
    assert!(
        child.status.success() && String::from_utf8_lossy(&child.stdout).contains("1 passed"),
        "the child failed ({}):\n{}\n{}",
        child.status,
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );
    // Without the limit: a reopen finds the blocks written whole (a
    // prefix of the run) and nothing torn, and the rest can be put now.
    let config = DiskConfig::new(dir.path(), FSIZE_BYTES, FSIZE_BLOCKS as usize);
    let store = DiskStore::open(config).unwrap();
    let found = store.recovery().blocks as u128;
    assert!(0 < found && found < FSIZE_BLOCKS, "{:?}", store.recovery());
    assert_eq!(store.recovery().dropped(), 0);
    let blocks: Vec<Vec<u8>> = (0..FSIZE_BLOCKS).map(|key| kv(key, FSIZE_BYTES)).collect();
    let puts: Vec<BlockRef<'_>> = (0..FSIZE_BLOCKS)
        .map(|key| put(key, &blocks[key as usize]))
        .collect();
    assert_eq!(
        store.contains(&(0..FSIZE_BLOCKS).collect::<Vec<_>>()),
        (0..FSIZE_BLOCKS).map(|key| key < found).collect::<Vec<_>>()
    );
    assert!(store.put(&puts).iter().all(Result::is_ok));
    let mut out = vec![0; FSIZE_BYTES];
    for key in 0..FSIZE_BLOCKS {
        let sum = store
            .get(&mut [(key, &mut out[..])])
            .pop()
            .unwrap()
            .unwrap();
        assert!(sum.verifies(key, &out) && out == blocks[key as usize]);
    }
}

/// The child's part: a run of eight slots put under the file size limit;
/// the blocks past it fail with `EFBIG`, the others are stored whole.
fn write_under_file_size_limit(dir: &std::path::Path) {
    let limit = file_size_limit().expect("the file size limit");
    let config = DiskConfig::new(dir, FSIZE_BYTES, FSIZE_BLOCKS as usize);
    let store = DiskStore::open(config).unwrap();
    let blocks: Vec<Vec<u8>> = (0..FSIZE_BLOCKS).map(|key| kv(key, FSIZE_BYTES)).collect();
    let puts: Vec<BlockRef<'_>> = (0..FSIZE_BLOCKS)
        .map(|key| put(key, &blocks[key as usize]))
        .collect();
    let results = store.put(&puts);
    let mut written = 0;
    for (key, result) in (0..FSIZE_BLOCKS).zip(&results) {
        let end = key as u64 * FSIZE_STRIDE + HEADER + FSIZE_BYTES as u64;
        if end <= limit {
            assert!(result.is_ok(), "block {key} fits under {limit}: {result:?}");
            let mut out = vec![0; FSIZE_BYTES];
            let sum = store
                .get(&mut [(key, &mut out[..])])
                .pop()
                .unwrap()
                .unwrap();
            assert!(sum.verifies(key, &out) && out == blocks[key as usize]);
            written += 1;
        } else {
            assert!(
                matches!(result, Err(StoreError::Io(err)) if err.raw_os_error() == Some(27)),
                "block {key} passes {limit}: {result:?}"
            );
            assert_eq!(store.contains(&[key]), [false]);
        }
    }
    assert!(0 < written && written < FSIZE_BLOCKS, "limit {limit}");
    assert_eq!(store.len(), written as usize);
}

#[test]
fn bad_configurations_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for config in [
        DiskConfig::new(dir.path(), 0, 4),
        DiskConfig::new(dir.path(), BYTES, 0),
        DiskConfig::new(dir.path(), usize::MAX, 4),
        DiskConfig::new(dir.path(), BYTES, usize::MAX),
        DiskConfig::new(dir.path(), BYTES, 4).slots_per_file(0),
        DiskConfig::new(dir.path(), BYTES, 1 << 20).slots_per_file(1),
    ] {
        assert!(matches!(
            DiskStore::open(config),
            Err(StoreError::Config(_))
        ));
    }
    // Nothing was created for them.
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn missing_foreign_and_non_directories_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("a/b");
    let err = DiskStore::open(config(&missing, 4).create(false)).unwrap_err();
    assert!(
        matches!(err, StoreError::Directory { ref path, .. } if path == &missing),
        "{err}"
    );
    assert!(!missing.exists());
    // Created when asked.
    assert!(open(&missing, 4).recovery().created);

    let foreign = dir.path().join("foreign");
    fs::create_dir(&foreign).unwrap();
    fs::write(foreign.join("notes.txt"), b"mine").unwrap();
    let err = DiskStore::open(config(&foreign, 4)).unwrap_err();
    assert!(matches!(err, StoreError::Directory { .. }), "{err}");
    assert!(err.to_string().contains("notes.txt"), "{err}");
    assert_eq!(fs::read(foreign.join("notes.txt")).unwrap(), b"mine");

    let empty = dir.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let err = DiskStore::open(config(&empty, 4).create(false)).unwrap_err();
    assert!(matches!(err, StoreError::Directory { .. }), "{err}");

    let file = dir.path().join("file");
    fs::write(&file, b"").unwrap();
    assert!(matches!(
        DiskStore::open(config(&file, 4)),
        Err(StoreError::Directory { .. })
    ));
}

#[test]
fn a_directory_is_used_by_one_store_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 4);
    let err = DiskStore::open(config(dir.path(), 4)).unwrap_err();
    assert!(matches!(err, StoreError::Directory { .. }), "{err}");
    drop(store);
    open(dir.path(), 4);
}

#[test]
fn a_reopen_with_another_block_size_or_a_smaller_capacity_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = block(1);
    assert!(open(dir.path(), 4).put(&[put(1, &a)])[0].is_ok());
    let err = DiskStore::open(DiskConfig::new(dir.path(), 512, 4)).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::WrongSize {
                expected: BYTES,
                got: 512
            }
        ),
        "{err}"
    );
    let err = DiskStore::open(config(dir.path(), 3)).unwrap_err();
    assert!(matches!(err, StoreError::Config(_)), "{err}");
    // A larger capacity grows the store, and nothing was lost on the way.
    let store = open(dir.path(), 6);
    assert_eq!(store.capacity(), 6);
    assert_eq!(get(&store, 1).unwrap(), a);
    drop(store);
    assert!(matches!(
        DiskStore::open(config(dir.path(), 4)),
        Err(StoreError::Config(_))
    ));
    assert_eq!(open(dir.path(), 6).capacity(), 6);
}

#[test]
fn a_read_only_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ro = dir.path().join("ro");
    fs::create_dir(&ro).unwrap();
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).unwrap();
    // Root (CI containers often run tests as root) writes through a 0o555
    // directory: there is nothing read-only to detect, so only check that
    // opening works and say so.
    let probe = ro.join("probe-as-root");
    let root = fs::write(&probe, b"").is_ok();
    if root {
        fs::remove_file(&probe).unwrap();
    }
    let result = DiskStore::open(config(&ro, 4));
    if root {
        eprintln!("running as root: a 0o555 directory is writable, nothing to refuse");
        assert!(result.is_ok());
    } else {
        let err = result.unwrap_err();
        assert!(matches!(err, StoreError::Directory { .. }), "{err}");
        assert!(err.to_string().contains("read-only"), "{err}");
    }
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn corrupt_or_hostile_metadata_is_refused_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let a = block(1);
    assert!(open(dir.path(), 4).put(&[put(1, &a)])[0].is_ok());
    let meta = dir.path().join("kvbm-disk-store.meta");
    let good = fs::read(&meta).unwrap();

    // A declared capacity of 2^60 (the checksum no longer matches), a
    // truncated file, a huge one, and garbage.
    let mut huge_capacity = good.clone();
    huge_capacity[40..48].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let mut bad_magic = good.clone();
    bad_magic[0] ^= 1;
    for bytes in [
        huge_capacity,
        bad_magic,
        good[..20].to_vec(),
        vec![0xff; 1 << 20],
        Vec::new(),
    ] {
        fs::write(&meta, &bytes).unwrap();
        let err = DiskStore::open(config(dir.path(), 4)).unwrap_err();
        assert!(matches!(err, StoreError::Directory { .. }), "{err}");
    }
    // The metadata restored, the block is still there.
    fs::write(&meta, &good).unwrap();
    let store = open(dir.path(), 4);
    assert_eq!(get(&store, 1).unwrap(), a);
}

#[test]
fn threads_putting_getting_and_removing_only_ever_read_whole_blocks() {
    const THREADS: u64 = 4;
    const OPS: u64 = 300;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(dir.path(), 32));
    let handles: Vec<_> = (0..THREADS)
        .map(|thread| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut state = thread.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                let mut out = vec![0u8; BYTES];
                for _ in 0..OPS {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    // Keys 0..8 are shared, the rest are this thread's.
                    let key = if state & 1 == 0 {
                        u128::from(state >> 8) % 8
                    } else {
                        100 * u128::from(thread + 1) + u128::from(state >> 8) % 8
                    };
                    match (state >> 4) % 3 {
                        0 => {
                            let bytes = block(key);
                            let result = store.put(&[put(key, &bytes)]).pop().unwrap();
                            assert!(matches!(result, Ok(()) | Err(StoreError::Full { .. })));
                        }
                        1 => match store.get(&mut [(key, &mut out[..])]).pop().unwrap() {
                            Ok(sum) => {
                                assert!(sum.verifies(key, &out));
                                assert_eq!(out, block(key));
                            }
                            Err(StoreError::Missing { .. }) => {}
                            Err(err) => panic!("get {key}: {err}"),
                        },
                        _ => assert!(store.remove(&[key])[0].is_ok()),
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    let mut held = store.keys().unwrap();
    held.sort_unstable();
    drop(store);
    let store = open(dir.path(), 32);
    assert_eq!(store.recovery().dropped(), 0);
    let mut found = store.keys().unwrap();
    found.sort_unstable();
    assert_eq!(found, held);
    for key in found {
        assert_eq!(get(&store, key).unwrap(), block(key));
    }
}

/// A step of the model test.
#[derive(Clone, Debug)]
enum Op {
    /// Puts the key with one of two byte patterns.
    Put(u128, u128),
    /// Puts keys in one call (their slots coalesced into runs where they
    /// follow one another), a key perhaps twice.
    PutBatch(Vec<(u128, u128)>),
    Get(u128),
    Remove(u128),
    Reopen,
    /// Flips a byte of a slot's header or block.
    Corrupt(u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    const KEYS: u128 = 8;
    prop_oneof![
        4 => (0..KEYS, 0..2u128).prop_map(|(key, variant)| Op::Put(key, variant)),
        2 => proptest::collection::vec((0..KEYS, 0..2u128), 1..7).prop_map(Op::PutBatch),
        4 => (0..KEYS).prop_map(Op::Get),
        2 => (0..KEYS).prop_map(Op::Remove),
        1 => Just(Op::Reopen),
        1 => (0..MODEL_CAPACITY as u64, 0..HEADER + BYTES as u64)
            .prop_map(|(slot, at)| Op::Corrupt(slot, at)),
    ]
}

const MODEL_CAPACITY: usize = 5;

/// What the model knows of a key: its bytes, and whether a byte of its slot
/// was flipped (so its get must fail, once).
#[derive(Clone, Debug)]
struct Held {
    bytes: Vec<u8>,
    rotten: bool,
}

/// The key of the live block in `slot`, read from its header if the header
/// is whole.
fn live_key(dir: &Path, slot: u64) -> Option<u128> {
    let (path, at) = slot_at(dir, slot);
    let file = fs::File::open(path).ok()?;
    let mut header = [0u8; HEADER as usize];
    file.read_exact_at(&mut header, at).ok()?;
    let seal = HEADER as usize - 8;
    let sum = xxhash_rust::xxh3::xxh3_64(&header[..seal]);
    (&header[..8] == b"KVBMBLK2" && header[seal..].iter().eq(&sum.to_le_bytes()))
        .then(|| u128::from_le_bytes(header[8..24].try_into().unwrap()))
}

/// Checks a put's result against the model, and puts the block in it.
fn expect_put(
    model: &mut HashMap<u128, Held>,
    key: u128,
    bytes: Vec<u8>,
    result: &Result<(), StoreError>,
) -> Result<(), TestCaseError> {
    match model.get(&key) {
        Some(held) if held.bytes == bytes => prop_assert!(result.is_ok()),
        Some(_) => prop_assert!(
            matches!(result, Err(StoreError::Collision { .. })),
            "{result:?}"
        ),
        None if model.len() == MODEL_CAPACITY => {
            prop_assert!(matches!(result, Err(StoreError::Full { .. })), "{result:?}")
        }
        None => {
            prop_assert!(result.is_ok(), "{result:?}");
            model.insert(
                key,
                Held {
                    bytes,
                    rotten: false,
                },
            );
        }
    }
    Ok(())
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let open = || DiskStore::open(config(dir.path(), MODEL_CAPACITY)).unwrap();
    let mut store = open();
    let mut model: HashMap<u128, Held> = HashMap::new();
    for op in ops {
        match *op {
            Op::Put(key, variant) => {
                let bytes = block(key * 2 + variant);
                let result = store.put(&[put(key, &bytes)]).pop().unwrap();
                expect_put(&mut model, key, bytes, &result)?;
            }
            Op::PutBatch(ref batch) => {
                let bytes: Vec<Vec<u8>> = batch
                    .iter()
                    .map(|&(key, variant)| block(key * 2 + variant))
                    .collect();
                let puts: Vec<BlockRef<'_>> = batch
                    .iter()
                    .zip(&bytes)
                    .map(|(&(key, _), bytes)| put(key, bytes))
                    .collect();
                let results = store.put(&puts);
                prop_assert_eq!(results.len(), batch.len());
                // The store answers as if the blocks were put one by one.
                for ((&(key, _), bytes), result) in batch.iter().zip(bytes).zip(&results) {
                    expect_put(&mut model, key, bytes, result)?;
                }
            }
            Op::Get(key) => {
                let result = get(&store, key);
                match model.get(&key) {
                    None => prop_assert!(
                        matches!(result, Err(StoreError::Missing { .. })),
                        "{result:?}"
                    ),
                    Some(held) if held.rotten => {
                        prop_assert!(
                            matches!(result, Err(StoreError::Corrupt { .. })),
                            "{result:?}"
                        );
                        model.remove(&key);
                    }
                    Some(held) => prop_assert_eq!(result.unwrap(), held.bytes.clone()),
                }
            }
            Op::Remove(key) => {
                let result = store.remove(&[key]).pop().unwrap();
                prop_assert_eq!(result.unwrap(), model.remove(&key).is_some());
            }
            Op::Reopen => {
                drop(store);
                store = open();
                let rotten = model.values().filter(|held| held.rotten).count();
                prop_assert!(store.recovery().dropped_corrupt >= rotten);
                model.retain(|_, held| !held.rotten);
            }
            Op::Corrupt(slot, at) => {
                let (path, _) = slot_at(dir.path(), slot);
                let (_, offset) = slot_at(dir.path(), slot);
                let long_enough = fs::metadata(&path)
                    .is_ok_and(|meta| meta.len() >= offset + HEADER + BYTES as u64);
                if !long_enough {
                    continue;
                }
                if let Some(held) = live_key(dir.path(), slot).and_then(|key| model.get_mut(&key)) {
                    held.rotten = true;
                }
                flip(dir.path(), slot, at);
            }
        }
        prop_assert_eq!(store.len(), model.len());
        for key in 0..8 {
            let held = model.get(&key);
            prop_assert_eq!(store.contains(&[key])[0], held.is_some());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::support::cases(64)))]

    #[test]
    fn fuzz_the_store_agrees_with_a_map_through_reopens_and_rot(
        ops in proptest::collection::vec(op(), 1..40)
    ) {
        run(&ops)?;
    }
}
