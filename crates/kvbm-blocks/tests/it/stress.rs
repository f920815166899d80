//! Many threads allocating, registering, matching, cloning and dropping on one
//! pool at once. Exclusivity is checked live (a held block has one owner at a
//! time); conservation is checked once every handle is gone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use kvbm_blocks::{EvictionPolicy, ImmutableBlocks, SequenceHash};

use crate::{BLOCK_SIZE, Gpu, manager_with};

const THREADS: usize = 8;
const ROUNDS: u64 = 400;
const BLOCKS: usize = 48;

/// A deterministic per-thread generator (no shared RNG, no extra crate).
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn chain(first: u64, len: u64) -> Vec<SequenceHash> {
    let mut hashes = vec![SequenceHash::root(first.into())];
    for value in first + 1..first + len {
        let parent = hashes[hashes.len() - 1];
        hashes.push(parent.child(value.into()));
    }
    hashes
}

#[test]
fn concurrent_users_never_share_a_held_block_and_lose_nothing() {
    for policy in [
        EvictionPolicy::Lru,
        EvictionPolicy::MultiLevelLru,
        EvictionPolicy::Lineage,
    ] {
        let manager = manager_with(BLOCKS, policy);
        let owned: Arc<Vec<AtomicBool>> =
            Arc::new((0..BLOCKS).map(|_| AtomicBool::new(false)).collect());
        let matched_blocks = Arc::new(AtomicU64::new(0));
        let start = Arc::new(Barrier::new(THREADS));
        let workers: Vec<_> = (0..THREADS as u64)
            .map(|seed| {
                let (manager, owned, matched_blocks, start) = (
                    manager.clone(),
                    owned.clone(),
                    matched_blocks.clone(),
                    start.clone(),
                );
                thread::spawn(move || {
                    let mut rng = seed * 0x9e37_79b9 + 1;
                    let mut kept: Vec<ImmutableBlocks<Gpu>> = Vec::new();
                    start.wait();
                    for _ in 0..ROUNDS {
                        // Prompts share prefixes: 4 families of 8-block chains.
                        let family = next(&mut rng) % 4 * 100;
                        let len = 1 + next(&mut rng) % 8;
                        let hashes = chain(family, len);
                        let mut prefix = manager.match_blocks(&hashes);
                        matched_blocks.fetch_add(prefix.len() as u64, Ordering::Relaxed);
                        let missing = hashes.len() - prefix.len();
                        let Ok(blocks) = manager.allocate_blocks(missing) else {
                            continue; // the pool is busy; try another prompt
                        };
                        for block in &blocks {
                            let was = owned[block.block_id().index()].swap(true, Ordering::SeqCst);
                            assert!(!was, "block {} handed out twice", block.block_id());
                        }
                        let staged: Vec<_> = blocks
                            .into_iter()
                            .zip(&hashes[prefix.len()..])
                            .map(|(block, &hash)| {
                                owned[block.block_id().index()].store(false, Ordering::SeqCst);
                                block.stage(hash, BLOCK_SIZE).expect("right size")
                            })
                            .collect();
                        let fresh = manager.register_blocks(staged).expect("same manager");
                        prefix.append(fresh).expect("same manager");
                        match next(&mut rng) % 4 {
                            0 => kept.push(prefix.clone()),
                            1 => drop(prefix.into_iter().collect::<Vec<_>>()),
                            2 => {
                                let weak = prefix.downgrade(0).expect("non-empty");
                                drop(prefix);
                                drop(weak.upgrade());
                            }
                            _ => kept.push(prefix),
                        }
                        if kept.len() > 2 {
                            // Hand an old block table to another thread to drop.
                            let old = kept.remove(0);
                            thread::spawn(move || drop(old)).join().expect("dropper");
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().expect("worker panicked");
        }
        let audit = manager.audit().expect("consistent after the storm");
        assert_eq!(
            audit.free_blocks + audit.inactive_blocks,
            BLOCKS,
            "{policy:?}: {audit:?}"
        );
        assert_eq!(audit.in_use_blocks(), 0);
        assert_eq!(audit.registered_hashes, audit.inactive_blocks);
        let metrics = manager.metrics();
        assert_eq!(
            metrics.match_hashes_hit,
            matched_blocks.load(Ordering::Relaxed)
        );
        assert!(metrics.match_hashes_hit > 0, "shared prefixes were reused");
    }
}
