//! Running one [`Transfer`]: read each block from its source, verify what a
//! store gives back, write it to its destination, in batches of bounded
//! size.

use kvbm_blocks::{BlockId, SequenceHash};
use kvbm_tiers::Transfer;

use super::stats::{Counters, add};
use super::{Endpoint, Failure};
use crate::{BlockRef, Checksum, Lineage, StoreError};

/// What one worker needs to run transfers, shared by all workers.
pub(crate) struct Context<'a> {
    pub(crate) counters: &'a Counters,
    pub(crate) block_bytes: usize,
    pub(crate) batch_blocks: usize,
}

/// Runs `transfer` from `source` to `destination`; `buffer` is the
/// worker's own, reused across transfers.
pub(crate) fn run(
    cx: &Context<'_>,
    transfer: &Transfer,
    source: &Endpoint,
    destination: &Endpoint,
    buffer: &mut Vec<u8>,
) -> Result<(), Failure> {
    let pairs: Vec<(BlockId, BlockId)> = transfer.pairs().collect();
    if pairs.len() != transfer.hashes.len() {
        return Err(Failure::plan(format!(
            "{} blocks but {} hashes",
            pairs.len(),
            transfer.hashes.len()
        )));
    }
    let bytes = cx.batch_blocks.min(pairs.len().max(1)) * cx.block_bytes;
    buffer.clear();
    buffer.resize(bytes, 0);
    let mut sums: Vec<Checksum> = Vec::with_capacity(cx.batch_blocks);
    let keys: Vec<u128> = transfer.hashes.iter().map(|h| h.value()).collect();
    let result = (|| {
        for (chunk, ((pairs, keys), hashes)) in pairs
            .chunks(cx.batch_blocks)
            .zip(keys.chunks(cx.batch_blocks))
            .zip(transfer.hashes.chunks(cx.batch_blocks))
            .enumerate()
        {
            let first = chunk * cx.batch_blocks;
            let buffer = &mut buffer[..pairs.len() * cx.block_bytes];
            sums.clear();
            read(cx, source, pairs, keys, buffer, &mut sums, first)?;
            write(cx, destination, pairs, hashes, buffer, &sums, first)?;
        }
        Ok(())
    })();
    if result.is_err()
        && let Endpoint::Store { store, .. } = destination
    {
        // The tier leaves a failed store's destinations absent: so does the
        // store, or it would fill with blocks nobody can reach. None of
        // these keys was in the tier before (it never copies a hash twice
        // into one tier), so removing all of them, written or not, is safe.
        let _ = store.remove(&keys);
    }
    result
}

/// Fills `buffer` with the chunk's blocks and `sums` with their checksums.
fn read(
    cx: &Context<'_>,
    source: &Endpoint,
    pairs: &[(BlockId, BlockId)],
    keys: &[u128],
    buffer: &mut [u8],
    sums: &mut Vec<Checksum>,
    first: usize,
) -> Result<(), Failure> {
    match source {
        Endpoint::Device(device) => {
            for (i, ((from, _), (key, bytes))) in pairs
                .iter()
                .zip(keys.iter().zip(buffer.chunks_mut(cx.block_bytes)))
                .enumerate()
            {
                device
                    .read(*from, bytes)
                    .map_err(|err| Failure::block(first + i, *key, err))?;
                // The device is where a block's bytes begin: its checksum is
                // taken here and travels with it from now on.
                sums.push(Checksum::of(*key, bytes));
            }
        }
        Endpoint::Store { store, .. } => {
            let mut reads: Vec<(u128, &mut [u8])> = keys
                .iter()
                .copied()
                .zip(buffer.chunks_mut(cx.block_bytes))
                .collect();
            let results = store.get(&mut reads);
            let verified_by_store = store.verifies_reads();
            for (i, (result, (key, bytes))) in results.into_iter().zip(reads).enumerate() {
                let sum = result.map_err(|err| {
                    if matches!(err, StoreError::Corrupt { .. }) {
                        add(&cx.counters.corrupt_blocks, 1);
                    }
                    Failure::block(first + i, key, err)
                })?;
                add(&cx.counters.bytes_read, bytes.len());
                if !verified_by_store && !sum.verifies(key, bytes) {
                    add(&cx.counters.corrupt_blocks, 1);
                    return Err(Failure::block(
                        first + i,
                        key,
                        StoreError::Corrupt {
                            key,
                            reason: "the bytes read do not match their checksum".into(),
                        },
                    ));
                }
                add(&cx.counters.verified_blocks, 1);
                sums.push(sum);
            }
        }
    }
    Ok(())
}

/// Writes the chunk's blocks from `buffer` to the destination.
fn write(
    cx: &Context<'_>,
    destination: &Endpoint,
    pairs: &[(BlockId, BlockId)],
    hashes: &[SequenceHash],
    buffer: &[u8],
    sums: &[Checksum],
    first: usize,
) -> Result<(), Failure> {
    match destination {
        Endpoint::Device(device) => {
            for (i, ((_, to), (hash, bytes))) in pairs
                .iter()
                .zip(hashes.iter().zip(buffer.chunks(cx.block_bytes)))
                .enumerate()
            {
                device
                    .write(*to, bytes)
                    .map_err(|err| Failure::block(first + i, hash.value(), err))?;
                add(&cx.counters.loaded_blocks, 1);
            }
        }
        Endpoint::Store {
            store, follower, ..
        } => {
            if let Some(follower) = follower {
                follower.sync(store, cx.counters);
            }
            let blocks: Vec<BlockRef<'_>> = hashes
                .iter()
                .zip(sums)
                .zip(buffer.chunks(cx.block_bytes))
                .map(|((hash, checksum), bytes)| BlockRef {
                    key: hash.value(),
                    lineage: Lineage::of(*hash),
                    checksum: *checksum,
                    bytes,
                })
                .collect();
            let mut results = store.put(&blocks);
            if let Some(follower) = follower
                && results
                    .iter()
                    .any(|r| matches!(r, Err(StoreError::Full { .. })))
            {
                // The tier may have evicted since the last sync: catch up
                // once and retry the blocks that found no room.
                follower.sync(store, cx.counters);
                let retry: Vec<usize> = (0..results.len())
                    .filter(|&i| matches!(results[i], Err(StoreError::Full { .. })))
                    .collect();
                let again: Vec<BlockRef<'_>> = retry.iter().map(|&i| blocks[i]).collect();
                for (i, result) in retry.into_iter().zip(store.put(&again)) {
                    results[i] = result;
                }
            }
            for (i, (result, block)) in results.into_iter().zip(&blocks).enumerate() {
                result.map_err(|err| Failure::block(first + i, block.key, err))?;
                add(&cx.counters.stored_blocks, 1);
                add(&cx.counters.bytes_written, block.bytes.len());
            }
        }
    }
    Ok(())
}
