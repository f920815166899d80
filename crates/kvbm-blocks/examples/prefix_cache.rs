//! Prefix reuse and eviction, with numbers: chat requests that share a system
//! prompt run through a small block pool, one after another.
//!
//! `cargo run --release -p kvbm-blocks --example prefix_cache`
#![allow(clippy::print_stdout)] // an example's job is to print

use kvbm_blocks::{BlockError, BlockManager, EvictionPolicy, SequenceHash};

struct Gpu;

const BLOCK_SIZE: usize = 16;
const POOL_BLOCKS: usize = 64;
const SYSTEM_PROMPT_BLOCKS: u64 = 8;

/// Request `r`'s prompt: the shared system prompt, then its own blocks. A
/// block's hash chains its parent's, so equal values mean equal prefixes.
fn prompt(r: u64, own_blocks: u64) -> Vec<SequenceHash> {
    let mut hashes = vec![SequenceHash::root(1)];
    for block in 1..SYSTEM_PROMPT_BLOCKS {
        let parent = hashes[hashes.len() - 1];
        hashes.push(parent.child(u128::from(1 + block)));
    }
    for block in 0..own_blocks {
        let parent = hashes[hashes.len() - 1];
        hashes.push(parent.child(u128::from(1_000 * (r + 1) + block)));
    }
    hashes
}

fn main() -> Result<(), BlockError> {
    // Tail-first release makes LRU evict chain ends before the shared prompt;
    // try `EvictionPolicy::Lineage` or `MultiLevelLru` here too.
    for policy in [EvictionPolicy::Lru] {
        let manager = BlockManager::<Gpu>::builder()
            .block_count(POOL_BLOCKS)
            .block_size(BLOCK_SIZE)
            .eviction(policy)
            .build()?;
        let (mut prompt_blocks, mut hit_blocks, mut evicted) = (0, 0, 0);
        println!("{policy:?}: {POOL_BLOCKS} blocks of {BLOCK_SIZE} tokens");
        for r in 0..12 {
            let hashes = prompt(r, 4 + r % 5 * 3);
            // 1. Reuse whatever prefix is cached.
            let mut table = manager.match_blocks(&hashes);
            let hits = table.len();
            // 2. Compute the rest: allocate (evicting if needed), fill, publish.
            let allocation = manager.allocate_blocks_with_evictions(hashes.len() - hits)?;
            let staged = allocation
                .blocks
                .into_iter()
                .zip(&hashes[hits..])
                .map(|(block, &hash)| block.stage(hash, BLOCK_SIZE))
                .collect::<Result<Vec<_>, _>>()?;
            table.append(manager.register_blocks(staged)?)?;
            println!(
                "  request {r:>2}: {:>2} blocks, {hits:>2} from cache, {:>2} evicted to make room",
                hashes.len(),
                allocation.evicted.len()
            );
            prompt_blocks += hashes.len();
            hit_blocks += hits;
            evicted += allocation.evicted.len();
            // 3. Finish: the table drops, deepest block first, into the cache.
            drop(table);
        }
        let m = manager.metrics();
        println!(
            "  => {hit_blocks}/{prompt_blocks} prompt blocks reused ({:.0}%), {evicted} evictions, \
             {} blocks cached at the end\n",
            100.0 * hit_blocks as f64 / prompt_blocks as f64,
            m.inactive_blocks
        );
    }
    Ok(())
}
