//! Host memory per cached block: builds a pool of 1M blocks, fills it with
//! registered blocks no request holds (the prefix cache at capacity) and
//! prints the growth of the process's resident memory per block.
//!
//! `cargo run --release -p kvbm-blocks --example memory_per_block [lru|multi-level|lineage]`
//! (Linux: reads `/proc/self/statm`). Blocks are registered in batches of
//! 4,096 so that transient handles stay small next to the pool.

#![allow(clippy::print_stdout)] // an example's job is to print

use kvbm_blocks::{BlockError, BlockManager, EvictionPolicy, SequenceHash};

struct Host;

const BLOCKS: usize = 1 << 20;
const BATCH: usize = 4_096;
/// Chains of this many blocks, like prompts of 256 tokens in 16-token blocks.
const CHAIN: usize = 16;

/// Resident memory in bytes, from `/proc/self/statm` (pages of 4 KiB).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4_096)
}

fn main() -> Result<(), BlockError> {
    let policy = match std::env::args().nth(1).as_deref() {
        None | Some("lru") => EvictionPolicy::Lru,
        Some("multi-level") => EvictionPolicy::MultiLevelLru,
        Some("lineage") => EvictionPolicy::Lineage,
        Some(other) => {
            println!("unknown policy `{other}`: lru, multi-level or lineage");
            return Ok(());
        }
    };
    let before = resident_bytes().unwrap_or(0);
    let manager = BlockManager::<Host>::builder()
        .block_count(BLOCKS)
        .block_size(16)
        .eviction(policy)
        .build()?;
    let mut previous: Option<SequenceHash> = None;
    let mut value: u128 = 0x5eed << 64;
    for _ in 0..BLOCKS / BATCH {
        let blocks = manager.allocate_blocks(BATCH)?;
        let staged = blocks
            .into_iter()
            .map(|block| {
                value += 1;
                let hash = match previous {
                    Some(parent) if parent.position() + 1 < CHAIN as u32 => parent.child(value),
                    _ => SequenceHash::root(value),
                };
                previous = Some(hash);
                block.stage(hash, 16)
            })
            .collect::<Result<Vec<_>, _>>()?;
        drop(manager.register_blocks(staged)?);
    }
    let after = resident_bytes().unwrap_or(0);
    let metrics = manager.metrics();
    assert_eq!(metrics.inactive_blocks, BLOCKS, "every block cached");
    println!(
        "{policy:?}: {} cached blocks, {:.1} bytes of resident memory per block",
        metrics.inactive_blocks,
        after.saturating_sub(before) as f64 / BLOCKS as f64
    );
    Ok(())
}
