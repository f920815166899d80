//! The transfer engine over a Redis Cluster tier, with a fake engine whose
//! KV for each block is a function of its hash: a master killed between
//! offload and onboarding fails the loads of its blocks (their requests
//! recompute), the others load byte for byte, and nothing wrong is loaded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvbm_blocks::{BlockManager, SequenceHash};
use kvbm_store::{BlockStore, EngineConfig, HostDevice, TierStore, TransferEngine};
use kvbm_store_redis::RedisClusterStore;
use kvbm_tiers::{Settled, TierConfig, TierId, Tiers, Transfer};

use crate::support::{Cluster, config, have_redis_server, keys_on, unique_namespace};

const TOKENS: usize = 4;
const BYTES: usize = 2048;

#[derive(Debug)]
struct Gpu;

fn chain(seed: u128, n: usize) -> Vec<SequenceHash> {
    let mut hashes = vec![SequenceHash::root(seed)];
    for i in 1..n {
        let next = hashes[i - 1].child(seed.wrapping_mul(7_919) ^ i as u128);
        hashes.push(next);
    }
    hashes
}

/// Runs every planned transfer until none is in flight; returns the loaded
/// blocks that held their own KV and those that did not.
fn drain(tiers: &mut Tiers<Gpu>, engine: &TransferEngine, memory: &HostDevice) -> (usize, usize) {
    let (mut right, mut wrong) = (0, 0);
    let mut backlog: Vec<Transfer> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        tiers.flush_events();
        tiers.take_planned(&mut backlog);
        for transfer in std::mem::take(&mut backlog) {
            if let Err(back) = engine.try_submit(transfer) {
                backlog.push(back);
            }
        }
        if tiers.in_flight_count() == 0 {
            return (right, wrong);
        }
        assert!(Instant::now() < deadline, "transfers did not settle");
        let Some(report) = engine.report_timeout(Duration::from_millis(200)) else {
            continue;
        };
        for settled in tiers.settle_all(&[(report.id, report.outcome())]).unwrap() {
            if let Settled::Loaded { blocks, .. } = settled {
                for (id, hash) in blocks.block_ids().zip(blocks.sequence_hashes()) {
                    if memory.holds(id, hash.value()).unwrap() {
                        right += 1;
                    } else {
                        wrong += 1;
                    }
                }
            }
        }
    }
}

#[test]
fn a_master_killed_before_onboarding_fails_only_its_loads() {
    let test = "a_master_killed_before_onboarding_fails_only_its_loads";
    if !have_redis_server(test) {
        return;
    }
    let mut cluster = Cluster::start(3);
    let namespace = unique_namespace("engine");
    let store =
        Arc::new(RedisClusterStore::connect(config(&cluster.urls(), &namespace, BYTES)).unwrap());
    let pool = BlockManager::<Gpu>::builder()
        .block_count(16)
        .block_size(TOKENS)
        .build()
        .unwrap();
    let mut tiers = Tiers::new(pool.clone(), vec![TierConfig::new("REMOTE", 256)]).unwrap();
    let remote = TierId::lower(0).unwrap();
    let memory = Arc::new(HostDevice::new(BYTES, 16).unwrap());
    let following = tiers.pool(remote).unwrap().subscribe_events(1024);
    let engine = TransferEngine::new(
        memory.clone(),
        vec![TierStore::new(remote, store.clone() as Arc<dyn BlockStore>).following(following)],
        EngineConfig::default().with_workers(3),
    )
    .unwrap();

    // Twelve requests compute 4 blocks each; every block goes to Redis.
    let chains: Vec<Vec<SequenceHash>> = (1..=12).map(|seed| chain(seed, 4)).collect();
    for hashes in &chains {
        let blocks = pool.allocate_blocks(4).unwrap();
        let staged = blocks
            .into_iter()
            .zip(hashes)
            .map(|(block, &hash)| {
                memory.compute(block.block_id(), hash.value()).unwrap();
                block.stage(hash, TOKENS).unwrap()
            })
            .collect();
        let registered: Vec<_> = pool.register_blocks(staged).unwrap().into_iter().collect();
        tiers.offload(registered);
        drain(&mut tiers, &engine, &memory);
    }
    assert_eq!(engine.stats().failed_transfers, 0);
    assert_eq!(store.len(), 48);

    // One master dies; the device forgets everything (its blocks reused).
    // Keys land by slot, and slots follow the run's namespace: the victim
    // is the master that leaves the most chains whole, so some chain
    // always survives (any one master is hit by all twelve in about 7% of
    // namespaces).
    let on_master: Vec<Vec<String>> = (cluster.servers.iter())
        .map(|server| keys_on(&server.url(), &namespace))
        .collect();
    let whole_without = |dead: &[String], hashes: &[SequenceHash]| {
        hashes
            .iter()
            .all(|h| !dead.contains(&store.namespace().redis_key(h.value())))
    };
    let chains_whole = |dead: &[String]| chains.iter().filter(|h| whole_without(dead, h)).count();
    let victim = (0..on_master.len())
        .max_by_key(|&i| (chains_whole(&on_master[i]), std::cmp::Reverse(i)))
        .unwrap();
    let dead = on_master[victim].clone();
    assert!(!dead.is_empty() && dead.len() < 48);
    assert!(
        chains_whole(&dead) > 0,
        "every master holds a block of every chain"
    );
    cluster.servers[victim].kill();
    drop(pool.allocate_blocks(16).unwrap());

    let survives = |hashes: &[SequenceHash]| whole_without(&dead, hashes);
    let (mut right, mut wrong, mut expected) = (0, 0, 0);
    for hashes in &chains {
        let onboard = tiers.onboard(hashes, 16);
        assert_eq!(onboard.blocks, 4);
        let (r, w) = drain(&mut tiers, &engine, &memory);
        right += r;
        wrong += w;
        if survives(hashes) {
            expected += 4;
            assert_eq!(r, 4, "a chain on surviving masters did not load");
        }
        // Its blocks go back to the pool for the next chain.
        drop(pool.allocate_blocks(16).unwrap());
    }
    assert_eq!(wrong, 0, "a block loaded with another block's KV");
    assert!(right >= expected && expected > 0, "{right} {expected}");
    assert!(
        engine.stats().failed_transfers > 0,
        "no load touched the dead master"
    );
    tiers.audit().unwrap();
}
