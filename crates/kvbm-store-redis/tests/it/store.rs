//! The `BlockStore` contract on the shared cluster (`KVBM_REDIS_CLUSTER`).
//! Each test has its own namespace, so they run side by side.

use kvbm_store::{BlockStore, StoreError};
use kvbm_store_redis::{Namespace, RedisClusterStore};
use redis::cmd;

use crate::support::{
    block, blocks_of, config, keys, keys_on, kv, kvs, put_all, raw, shared_cluster,
    unique_namespace,
};

const BLOCK: usize = 4096;

/// A store on the shared cluster under a fresh namespace, or `None` when
/// the test is skipped.
fn store(test: &str) -> Option<(RedisClusterStore, Vec<String>)> {
    let nodes = shared_cluster(test)?;
    let namespace = unique_namespace(test);
    let store = RedisClusterStore::connect(config(&nodes, &namespace, BLOCK))
        .unwrap_or_else(|err| panic!("connecting to {nodes:?}: {err}"));
    Some((store, nodes))
}

#[test]
fn blocks_round_trip_byte_for_byte() {
    let Some((store, _)) = store("blocks_round_trip_byte_for_byte") else {
        return;
    };
    let keys = keys(1, 64);
    let blocks = put_all(&store, &keys, BLOCK);
    assert_eq!(store.len(), 64);
    assert_eq!(store.contains(&keys), vec![true; 64]);
    let mut listed = store.keys().unwrap();
    listed.sort_unstable();
    let mut expected = keys.clone();
    expected.sort_unstable();
    assert_eq!(
        listed, expected,
        "keys() lists exactly the namespace's blocks"
    );

    let mut buffers = vec![vec![0u8; BLOCK]; keys.len()];
    let mut reads: Vec<(u128, &mut [u8])> = keys
        .iter()
        .zip(&mut buffers)
        .map(|(&key, buffer)| (key, &mut buffer[..]))
        .collect();
    let sums = store.get(&mut reads);
    for ((&key, sum), (bytes, buffer)) in keys.iter().zip(sums).zip(blocks.iter().zip(&buffers)) {
        assert!(sum.unwrap().verifies(key, buffer));
        assert_eq!(buffer, bytes, "block {key:032x}");
    }
}

#[test]
fn a_batch_spreads_over_every_master() {
    let Some((store, nodes)) = store("a_batch_spreads_over_every_master") else {
        return;
    };
    let keys = keys(2, 48);
    put_all(&store, &keys, BLOCK);
    let namespace = store.namespace().as_str();
    let per_node: Vec<usize> = nodes
        .iter()
        .map(|node| keys_on(node, namespace).len())
        .collect();
    assert_eq!(per_node.iter().sum::<usize>(), 48, "{per_node:?}");
    assert!(
        per_node.iter().all(|&held| held > 0),
        "every master holds some blocks: {per_node:?}"
    );
}

#[test]
fn a_collision_keeps_the_stored_bytes() {
    let Some((store, _)) = store("a_collision_keeps_the_stored_bytes") else {
        return;
    };
    let key = 0x00c0_ffee;
    let first = kv(key, BLOCK);
    let other = kv(key + 1, BLOCK);
    store.put(&[block(key, &first)]).pop().unwrap().unwrap();
    // The same bytes again: nothing changes.
    store.put(&[block(key, &first)]).pop().unwrap().unwrap();
    assert!(matches!(
        store.put(&[block(key, &other)]).pop().unwrap(),
        Err(StoreError::Collision { key: k }) if k == key
    ));
    assert_eq!(store.len(), 1);
    let mut out = vec![0u8; BLOCK];
    store
        .get(&mut [(key, &mut out[..])])
        .pop()
        .unwrap()
        .unwrap();
    assert_eq!(out, first);
}

#[test]
fn namespaces_keep_deployments_apart() {
    let Some((a, nodes)) = store("namespaces_keep_deployments_apart") else {
        return;
    };
    let b = RedisClusterStore::connect(config(&nodes, &unique_namespace("other"), BLOCK)).unwrap();
    let key = 77;
    let (bytes_a, bytes_b) = (kv(1, BLOCK), kv(2, BLOCK));
    a.put(&[block(key, &bytes_a)]).pop().unwrap().unwrap();
    let mut out = vec![0u8; BLOCK];
    assert!(matches!(
        b.get(&mut [(key, &mut out[..])]).pop().unwrap(),
        Err(StoreError::Missing { key: 77 })
    ));
    assert_eq!(b.contains(&[key]), [false]);
    b.put(&[block(key, &bytes_b)]).pop().unwrap().unwrap();
    a.get(&mut [(key, &mut out[..])]).pop().unwrap().unwrap();
    assert_eq!(out, bytes_a);
    b.get(&mut [(key, &mut out[..])]).pop().unwrap().unwrap();
    assert_eq!(out, bytes_b);
    assert_eq!(a.keys().unwrap(), [key]);
    assert_eq!(b.keys().unwrap(), [key]);
    assert!(matches!(b.remove(&[key])[..], [Ok(true)]));
    assert!(b.keys().unwrap().is_empty());
    assert_eq!(a.keys().unwrap(), [key]);
}

#[test]
fn corrupt_values_are_refused_never_returned() {
    let Some((store, nodes)) = store("corrupt_values_are_refused_never_returned") else {
        return;
    };
    let keys = keys(3, 5);
    let blocks = put_all(&store, &keys, BLOCK);

    // Behind the store's back: find each key's node and rewrite its value.
    let namespace = Namespace::new(store.namespace().as_str()).unwrap();
    let redis_key = |key: u128| namespace.redis_key(key);
    let node_of = |key: u128| {
        nodes
            .iter()
            .find(|node| keys_on(node, namespace.as_str()).contains(&redis_key(key)))
            .expect("every key is on some master")
            .clone()
    };
    let stored = |key: u128| -> Vec<u8> {
        cmd("GET")
            .arg(redis_key(key))
            .query(&mut raw(&node_of(key)))
            .unwrap()
    };
    let overwrite = |key: u128, value: Vec<u8>| {
        let () = cmd("SET")
            .arg(redis_key(key))
            .arg(value)
            .query(&mut raw(&node_of(key)))
            .unwrap();
    };
    let mut flipped = stored(keys[0]);
    *flipped.last_mut().unwrap() ^= 0x40;
    overwrite(keys[0], flipped);
    let mut truncated = stored(keys[1]);
    truncated.truncate(100);
    overwrite(keys[1], truncated);
    overwrite(keys[2], b"garbage".to_vec());
    overwrite(keys[3], stored(keys[4])); // another block's value, misfiled

    for (at, &key) in keys[..4].iter().enumerate() {
        let mut out = vec![0u8; BLOCK];
        match store.get(&mut [(key, &mut out[..])]).pop().unwrap() {
            Err(StoreError::Corrupt { key: k, reason }) => {
                assert_eq!(k, key);
                eprintln!("value {at}: {reason}");
            }
            other => panic!("value {at}: expected Corrupt, got {other:?}"),
        }
        assert!(out.iter().all(|&byte| byte == 0), "no bytes handed out");
    }
    // A put over a corrupt value does not overwrite it either.
    assert!(store.put(&[block(keys[2], &blocks[2])])[0].is_err());
    let mut out = vec![0u8; BLOCK];
    store
        .get(&mut [(keys[4], &mut out[..])])
        .pop()
        .unwrap()
        .unwrap();
    assert_eq!(out, blocks[4]);
}

#[test]
fn wrong_sizes_fail_only_their_block() {
    let Some((store, _)) = store("wrong_sizes_fail_only_their_block") else {
        return;
    };
    let good = kv(10, BLOCK);
    let short = vec![1u8; BLOCK - 1];
    let results = store.put(&[block(10, &good), block(11, &short)]);
    assert!(results[0].is_ok());
    assert!(matches!(
        results[1],
        Err(StoreError::WrongSize { expected: BLOCK, got }) if got == BLOCK - 1
    ));
    let (mut out, mut long) = (vec![0u8; BLOCK], vec![0u8; BLOCK + 1]);
    let results = store.get(&mut [(10, &mut out[..]), (10, &mut long[..])]);
    assert!(results[0].is_ok());
    assert!(matches!(results[1], Err(StoreError::WrongSize { got, .. }) if got == BLOCK + 1));
    assert_eq!(out, good);
    assert_eq!(store.contains(&[10, 11]), [true, false]);
}

#[test]
fn capacity_counts_puts_and_removes() {
    let Some(nodes) = shared_cluster("capacity_counts_puts_and_removes") else {
        return;
    };
    let mut config = config(&nodes, &unique_namespace("capacity"), BLOCK);
    config.capacity_blocks = 4;
    let store = RedisClusterStore::connect(config).unwrap();
    let keys = keys(4, 6);
    let blocks = kvs(&keys, BLOCK);
    let puts = blocks_of(&keys, &blocks);
    let results = store.put(&puts);
    assert!(results[..4].iter().all(Result::is_ok), "{results:?}");
    assert!(
        results[4..]
            .iter()
            .all(|r| matches!(r, Err(StoreError::Full { capacity: 4 }))),
        "{results:?}"
    );
    assert_eq!(store.len(), 4);
    // Full, but a block already stored with these bytes is still fine.
    assert!(store.put(&puts[..1])[0].is_ok());

    assert_eq!(
        store
            .remove(&[keys[0], keys[5]])
            .into_iter()
            .map(Result::unwrap)
            .collect::<Vec<_>>(),
        [true, false]
    );
    assert_eq!(store.len(), 3);
    assert!(store.put(&puts[5..])[0].is_ok());
    assert_eq!(store.len(), 4);
    let mut out = vec![0u8; BLOCK];
    assert!(matches!(
        store.get(&mut [(keys[0], &mut out[..])]).pop().unwrap(),
        Err(StoreError::Missing { .. })
    ));
    assert!(store.put(&[]).is_empty() && store.contains(&[]).is_empty());
}
