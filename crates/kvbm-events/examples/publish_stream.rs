//! Publishes one known stream of KV events on vLLM's wire, for interop
//! checks against a real consumer (`cargo xtask dynamo-interop` runs it
//! against Dynamo's standalone indexer).
//!
//! `cargo run -p kvbm-events --features zmq --example publish_stream --
//! ENDPOINT BLOCKS [BLOCK_SIZE] [WAIT_MS] [HOLD_MS] [REMOVE]`
//!
//! Stores `BLOCKS` consecutive blocks of the prompt `0, 1, 2, ...` (block
//! size 16 by default) as one `BlockStored` with kvbm's chained hashes (the
//! low 64 bits, as integers), once a subscriber has joined (waiting at most
//! `WAIT_MS`, 10,000), then removes the last `REMOVE` of them (0) in a
//! second batch, and keeps the socket open `HOLD_MS` (2,000) so the
//! subscriber can read it all.

#![allow(clippy::print_stdout)] // an example's job is to print

use std::time::Duration;

use kvbm_events::{
    BlockHash, BlockRemoved, BlockStored, HashForm, KvEvent, KvEventBatch, Publisher,
    PublisherConfig,
};
use kvbm_sequence::BlockSequence;

fn arg(n: usize, default: u64) -> u64 {
    std::env::args()
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "tcp://127.0.0.1:5557".to_owned());
    let blocks = arg(2, 4) as usize;
    let block_size = arg(3, 16) as usize;
    let wait = Duration::from_millis(arg(4, 10_000));
    let hold = Duration::from_millis(arg(5, 2_000));
    let remove = (arg(6, 0) as usize).min(blocks);
    let tokens: Vec<u32> = (0..(blocks * block_size) as u32).collect();
    let sequence = BlockSequence::new(tokens.clone(), block_size)?;
    let hashes = sequence.sequence_hashes();
    let stored = BlockStored::new(
        hashes
            .iter()
            .map(|h| BlockHash::from_value(h.value(), HashForm::Int64))
            .collect(),
        None,
        tokens,
        block_size as u32,
    )
    .with_medium("GPU");
    // vLLM binds an endpoint with `*`; a plain host:port would connect.
    let bind = endpoint.replace("127.0.0.1", "*");
    let mut publisher = Publisher::new(&PublisherConfig::new(bind))?;
    if publisher.wait_for_subscribers(1, wait)? == 0 {
        return Err(format!("no subscriber joined within {wait:?}").into());
    }
    let removed: Vec<BlockHash> = stored.block_hashes[blocks - remove..].to_vec();
    let seq = publisher.publish(&KvEventBatch::new(0.0, vec![KvEvent::BlockStored(stored)]))?;
    println!(
        "published {blocks} blocks of {block_size} tokens as batch {seq} on {}",
        publisher.endpoint()
    );
    if remove > 0 {
        let removal = KvEvent::BlockRemoved(BlockRemoved::new(removed).with_medium("GPU"));
        let seq = publisher.publish(&KvEventBatch::new(1.0, vec![removal]))?;
        println!("removed the last {remove} as batch {seq}");
    }
    std::thread::sleep(hold);
    Ok(())
}
