//! The [`BlockStore`] contract, run against every store of this crate (the
//! Redis store runs the same checks in `kvbm-store-redis`).

use std::sync::Arc;
use std::thread;

use kvbm_store::{BlockStore, DiskConfig, DiskStore, HostArena, StoreError};

use crate::support::{kv, put};

const BYTES: usize = 512;

fn block(key: u128) -> Vec<u8> {
    kv(key, BYTES)
}

/// Every store of `capacity` blocks, fresh, with whatever keeps it alive.
fn stores(capacity: usize) -> Vec<(Arc<dyn BlockStore>, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().unwrap();
    let disk =
        DiskStore::open(DiskConfig::new(dir.path().join("s"), BYTES, capacity).slots_per_file(3))
            .unwrap();
    vec![
        (Arc::new(HostArena::new(BYTES, capacity).unwrap()), None),
        (Arc::new(disk), Some(dir)),
    ]
}

fn get(store: &dyn BlockStore, key: u128) -> Result<Vec<u8>, StoreError> {
    let mut out = vec![0; BYTES];
    let sum = store.get(&mut [(key, &mut out[..])]).pop().unwrap()?;
    assert!(
        sum.verifies(key, &out),
        "{store:?} answered bytes that do not verify"
    );
    Ok(out)
}

#[test]
fn every_store_keeps_the_contract() {
    for (store, _dir) in stores(4) {
        let store = &*store;
        assert_eq!(
            (store.block_bytes(), store.capacity(), store.len()),
            (BYTES, 4, 0)
        );
        let (a, b) = (block(1), block(2));
        // A batch: one result per block, in order.
        let results = store.put(&[put(1, &a), put(2, &b), put(3, &a[..7])]);
        assert!(results[0].is_ok() && results[1].is_ok(), "{store:?}");
        assert!(
            matches!(
                results[2],
                Err(StoreError::WrongSize {
                    expected: BYTES,
                    got: 7
                })
            ),
            "{store:?}"
        );
        assert_eq!(get(store, 1).unwrap(), a);
        assert_eq!(get(store, 2).unwrap(), b);
        assert_eq!(store.contains(&[1, 2, 3]), [true, true, false]);
        // The same bytes again: nothing changes. Other bytes: refused, kept.
        assert!(store.put(&[put(1, &a)])[0].is_ok());
        assert!(
            matches!(
                store.put(&[put(1, &b)])[0],
                Err(StoreError::Collision { key: 1 })
            ),
            "{store:?}"
        );
        assert_eq!(get(store, 1).unwrap(), a);
        assert!(matches!(get(store, 9), Err(StoreError::Missing { key: 9 })));
        let mut short = [0u8; 3];
        assert!(matches!(
            store.get(&mut [(1, &mut short[..])])[0],
            Err(StoreError::WrongSize { .. })
        ));
        // Full, then a removal makes room.
        for key in 3..=4 {
            assert!(store.put(&[put(key, &block(key))])[0].is_ok());
        }
        assert!(matches!(
            store.put(&[put(5, &block(5))])[0],
            Err(StoreError::Full { capacity: 4 })
        ));
        let mut keys = store.keys().unwrap();
        keys.sort_unstable();
        assert_eq!(keys, [1, 2, 3, 4]);
        assert!(matches!(
            store.remove(&[2, 2, 7])[..],
            [Ok(true), Ok(false), Ok(false)]
        ));
        assert!(store.put(&[put(5, &block(5))])[0].is_ok());
        assert_eq!(get(store, 5).unwrap(), block(5));
        assert!(matches!(get(store, 2), Err(StoreError::Missing { .. })));
        assert_eq!(store.len(), 4);
    }
}

#[test]
fn threads_putting_reading_and_removing_never_see_other_bytes() {
    for (store, _dir) in stores(64) {
        let threads: Vec<_> = (0..4u128)
            .map(|t| {
                let store = Arc::clone(&store);
                thread::spawn(move || {
                    let mut seen = 0;
                    for round in 0..200u128 {
                        // Keys shared by all threads, and keys of this one.
                        let key = if round % 2 == 0 {
                            round % 24
                        } else {
                            1000 + t * 100 + round % 8
                        };
                        let bytes = block(key);
                        let _ = store.put(&[put(key, &bytes)]);
                        if let Ok(read) = get(&*store, key) {
                            assert_eq!(read, bytes);
                            seen += 1;
                        }
                        if round % 5 == 0 {
                            let _ = store.remove(&[key]);
                        }
                    }
                    seen
                })
            })
            .collect();
        let seen: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(seen > 0);
        for key in store.keys().unwrap() {
            assert_eq!(get(&*store, key).unwrap(), block(key));
        }
    }
}
