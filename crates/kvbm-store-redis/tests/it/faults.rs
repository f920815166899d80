//! Bad input and failing servers: each a typed error in bounded time,
//! nothing panics, nothing already stored is lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use kvbm_store::{BlockStore, StoreError};
use kvbm_store_redis::{RedisClusterStore, RedisConfig};

use crate::support::{
    Cluster, Server, blocks_of, closed_port, cluster_info, config, have_redis_server, keys,
    keys_on, kvs, put_all, unique_namespace, wait_until,
};

const BLOCK: usize = 1024;

#[test]
fn an_unreachable_cluster_is_a_typed_error_within_the_timeout() {
    let nodes = vec![
        format!("redis://{}", closed_port()),
        format!("redis://{}", closed_port()),
    ];
    let started = Instant::now();
    let err = RedisClusterStore::connect(config(&nodes, "unreachable", BLOCK)).unwrap_err();
    let took = started.elapsed();
    match &err {
        StoreError::Remote(why) => {
            for node in &nodes {
                assert!(why.contains(node.as_str()), "{why}");
            }
        }
        StoreError::Timeout(_) => {}
        other => panic!("expected Remote or Timeout, got {other:?}"),
    }
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

#[test]
fn a_bad_config_is_refused_before_the_network() {
    let bad = RedisConfig::new(["redis://127.0.0.1:1"], "a{b}", BLOCK, 8);
    assert!(matches!(
        RedisClusterStore::connect(bad),
        Err(StoreError::Config(_))
    ));
    let none = RedisConfig::new(Vec::<String>::new(), "ns", BLOCK, 8);
    assert!(matches!(
        RedisClusterStore::connect(none),
        Err(StoreError::Config(_))
    ));
}

#[test]
fn a_standalone_redis_is_not_a_cluster() {
    if !have_redis_server("a_standalone_redis_is_not_a_cluster") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = Server::spawn(dir.path(), false);
    let started = Instant::now();
    match RedisClusterStore::connect(config(&[server.url()], "standalone", BLOCK)) {
        Err(StoreError::Config(why)) => assert!(why.contains("not a cluster"), "{why}"),
        other => panic!("expected Config, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn a_master_killed_mid_transfer_fails_only_its_blocks() {
    let test = "a_master_killed_mid_transfer_fails_only_its_blocks";
    if !have_redis_server(test) {
        return;
    }
    let mut cluster = Cluster::start(3);
    let namespace = unique_namespace("killed");
    let store = RedisClusterStore::connect(config(&cluster.urls(), &namespace, BLOCK)).unwrap();

    let before = keys(5, 60);
    let blocks = put_all(&store, &before, BLOCK);
    let victim = 1;
    let on_victim = keys_on(&cluster.servers[victim].url(), &namespace);
    assert!(!on_victim.is_empty() && on_victim.len() < before.len());
    let dies = |key: u128| on_victim.contains(&store.namespace().redis_key(key));

    // Traffic while the master dies: every answer typed, every block
    // returned byte-exact.
    let stop = AtomicBool::new(false);
    let batches = thread::scope(|scope| {
        let traffic = scope.spawn(|| {
            let mut batches = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut buffers = vec![vec![0u8; BLOCK]; before.len()];
                let mut reads: Vec<(u128, &mut [u8])> = before
                    .iter()
                    .zip(&mut buffers)
                    .map(|(&key, buffer)| (key, &mut buffer[..]))
                    .collect();
                for (at, result) in store.get(&mut reads).into_iter().enumerate() {
                    match result {
                        Ok(_) => assert_eq!(buffers[at], blocks[at]),
                        Err(StoreError::Remote(_) | StoreError::Timeout(_)) => {
                            assert!(dies(before[at]), "a surviving block failed");
                        }
                        Err(other) => panic!("untyped failure: {other:?}"),
                    }
                }
                batches += 1;
            }
            batches
        });
        thread::sleep(Duration::from_millis(50));
        cluster.servers[victim].kill();
        thread::sleep(Duration::from_millis(150));
        stop.store(true, Ordering::Relaxed);
        traffic.join().unwrap()
    });
    assert!(batches > 0);

    // After: the dead master's blocks fail, in bounded time; the others load.
    let check = |when: &str| {
        let started = Instant::now();
        let mut buffers = vec![vec![0u8; BLOCK]; before.len()];
        let mut reads: Vec<(u128, &mut [u8])> = before
            .iter()
            .zip(&mut buffers)
            .map(|(&key, buffer)| (key, &mut buffer[..]))
            .collect();
        let results = store.get(&mut reads);
        let took = started.elapsed();
        for (at, result) in results.into_iter().enumerate() {
            if dies(before[at]) {
                assert!(
                    matches!(result, Err(StoreError::Remote(_) | StoreError::Timeout(_))),
                    "{when}: {result:?}"
                );
            } else {
                result.unwrap_or_else(|err| panic!("{when}: a surviving block: {err}"));
                assert_eq!(buffers[at], blocks[at]);
            }
        }
        assert!(took < Duration::from_secs(3), "{when}: took {took:?}");
        eprintln!("{when}: a 60-block get took {took:?}");
    };
    check("just after the kill");

    // New puts: those hashed to the dead master fail, the rest are stored.
    let after = keys(6, 30);
    let new_blocks = kvs(&after, BLOCK);
    let puts = blocks_of(&after, &new_blocks);
    let results = store.put(&puts);
    let stored: Vec<u128> = after
        .iter()
        .zip(&results)
        .filter(|(_, result)| result.is_ok())
        .map(|(&key, _)| key)
        .collect();
    assert!(
        results.iter().any(Result::is_err),
        "some hash to the dead master"
    );
    assert!(!stored.is_empty(), "the survivors take the rest");
    for result in &results {
        assert!(matches!(
            result,
            Ok(()) | Err(StoreError::Remote(_) | StoreError::Timeout(_))
        ));
    }
    assert_eq!(store.contains(&stored), vec![true; stored.len()]);
    // The batch was sent twice (pipeline, then key by key), and still each
    // stored block is counted once and each failed one not at all.
    assert_eq!(store.len(), before.len() + stored.len());

    // Once the survivors have marked the master failed, they still serve
    // their slots (`cluster-require-full-coverage no`).
    let survivor = cluster.servers[0].url();
    wait_until("the survivors mark the dead master failed", || {
        cluster_info(&survivor).contains("cluster_state:ok") && cluster_nodes_fail(&survivor)
    });
    check("after the failure is agreed");
}

/// Whether a node's view of the cluster has a master flagged `fail`.
fn cluster_nodes_fail(node: &str) -> bool {
    redis::Client::open(node)
        .and_then(|client| client.get_connection_with_timeout(Duration::from_millis(200)))
        .and_then(|mut connection| {
            redis::cmd("CLUSTER")
                .arg("NODES")
                .query::<String>(&mut connection)
        })
        .is_ok_and(|nodes| nodes.lines().any(|line| line.contains("master,fail")))
}
