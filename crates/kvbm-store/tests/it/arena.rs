//! The host arena.
use kvbm_store::{BlockStore, HostArena, StoreError};

use crate::support::{kv, put};

fn block(key: u128, bytes: usize) -> Vec<u8> {
    kv(key, bytes)
}

#[test]
fn a_full_arena_refuses_and_a_removal_makes_room() {
    let arena = HostArena::new(8, 2).unwrap();
    let (a, b, c) = (block(1, 8), block(2, 8), block(3, 8));
    let results = arena.put(&[put(1, &a), put(2, &b), put(3, &c)]);
    assert!(results[0].is_ok() && results[1].is_ok());
    assert!(matches!(results[2], Err(StoreError::Full { capacity: 2 })));
    assert_eq!(arena.contains(&[1, 2, 3]), [true, true, false]);
    assert!(matches!(arena.remove(&[1, 9])[..], [Ok(true), Ok(false)]));
    assert!(arena.put(&[put(3, &c)])[0].is_ok());
    let mut out = vec![0; 8];
    let sum = arena.get(&mut [(3, &mut out[..])]).pop().unwrap().unwrap();
    assert!(sum.verifies(3, &out));
    assert_eq!(out, c);
    assert!(matches!(
        arena.get(&mut [(1, &mut out[..])])[0],
        Err(StoreError::Missing { key: 1 })
    ));
}
