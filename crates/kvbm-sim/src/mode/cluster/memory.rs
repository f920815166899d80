//! Cluster mode's memory estimate: what a replay allocates, worked out from
//! the configuration and the trace before anything is built, so that a
//! cluster this machine cannot hold (`--engines 20000` for 20) is a typed
//! error instead of an exhausted machine.
//!
//! A replay holds one policy's engines at a time (the policies run one
//! after another) and, beside them, the router's index, the queued prompts
//! and running sequences, and the trace-wide results. The estimate adds:
//!
//! - per engine: a fixed part ([`ENGINE_BYTES`] plus its event
//!   subscription's channel), its pool's tables (per block: [`SLOT_BYTES`],
//!   [`REGISTRY_BYTES`], [`LIST_BYTES`], and [`LINEAGE_BYTES`] or the
//!   multi-level sketch) and its event batches (per step token and block);
//! - per trace request, the record the engine it is routed to keeps of it
//!   ([`ROUTED_TRACK_BYTES`]);
//! - the blocks the router's index holds ([`ROUTER_BYTES_PER_BLOCK`]): no
//!   more than all pools hold, nor than the trace's requests can fill;
//! - the running sequences: at most `max_running` per engine, so no more
//!   than the longest `engines × max_running` requests of the trace
//!   ([`SEQUENCE_BYTES_PER_TOKEN`], [`SEQUENCE_BYTES_PER_BLOCK`]);
//! - every prompt ([`TOKEN_BYTES`] per token), as if all were queued at
//!   once, as in an overloaded cluster;
//! - per trace request: the parsed trace, the scheduler's state for it
//!   ([`REQUEST_BYTES`]) and its results (one timeline per policy, and two
//!   while an engine's results are merged);
//! - with `--replicate N`, all of the above for N times the requests,
//!   and the original trace beside its copies;
//! - the process itself ([`PROCESS_BYTES`]);
//!
//! and a quarter on top for the allocator ([`ALLOCATOR_MARGIN`]).
//!
//! Each term bounds what it stands for, so the estimate is above what a
//! replay really holds. The constants were read from the code and checked
//! with valgrind's massif (peak heap) and `/usr/bin/time` (peak resident
//! memory) on release builds, 2-core machine:
//!
//! | cluster (trace) | estimate | peak RSS |
//! |---|---:|---:|
//! | 16 engines of 187,500 blocks (full conversation trace: the README's) | 2.86 GB | 421-454 MB |
//! | 16 engines of 187,500 blocks (excerpt: the default cluster) | 0.46 GB | 220 MB |
//! | 2 engines of 187,500 blocks, 20× slower steps: everything queues (full) | 1.32 GB | 717 MB |
//! | 16 engines of 16,384 64-token blocks (full: the mocker comparison) | 2.04 GB | 66 MB |
//! | 64 engines of 16,384 blocks (full) | 3.06 GB | 172 MB |
//! | 256 engines of 4,096 blocks, lineage (full) | 3.28 GB | 331 MB |
//! | 8 engines of 1M 4-token blocks (full) | 4.24 GB | 869 MB |
//! | 64 engines of 4,096 blocks, multi-level (excerpt) | 0.55 GB | 127 MB |
//! | 4,000 engines of 1 block (excerpt) | 0.50 GB | 234 MB |
//! | 20,000 engines of 187,500 blocks (excerpt: `--engines 20000`) | 328 GB | refused |
//! | 1,000,000 engines of 1 block (excerpt) | 86.7 GB | refused |
//!
//! (Until `--replicate`, every engine kept a record of every trace
//! request, whichever engine it was routed to, and the rows above were
//! measured and estimated so. Each is now kept by the engine it is routed
//! to alone, which lowers the many-engine rows a little; the rows below
//! are measured and estimated as the code is now.)
//!
//! | cluster (trace) | estimate | peak RSS |
//! |---|---:|---:|
//! | 16 engines of 16,384 64-token blocks (full: the mocker comparison) | 2.03 GB | 52-60 MB |
//! | 128 engines of 16,384 blocks, `--replicate 8` (full) | 16.09 GB | 361-406 MB |
//! | 1,024 engines of 16,384 blocks, `--replicate 64` (full) | 128.6 GB | 2.87-3.03 GB |
//! | 1,024 engines of 16,384 blocks, one request (full, `--limit 1`) | 1.63 GB | 942 MB |
//!
//! The last row is the pools alone: 54 bytes a block resident (the
//! estimate's [`SLOT_BYTES`] + [`REGISTRY_BYTES`] + [`LIST_BYTES`] is 69).
//! The replicated rows are where the worst case is furthest from what a
//! replay holds: the copies' prompts, all queued at once, and every engine
//! running its 256 longest requests, for a cluster the copies load no more
//! per engine than 16 engines with the trace.
//!
//! The worst cases it allows for (every prompt queued, every engine
//! running its `max_running` longest requests) make it two to thirty
//! times what typical replays hold; the overloaded run comes closest
//! (massif's peak heap: 679 MB, of which 569 MB queued prompts; 383 MB for
//! the README's cluster). The pool and router
//! constants describe kvbm-blocks' and kvbm-router's tables as they are; a
//! change to those tables should revisit them.

use std::mem::size_of;

use kvbm_blocks::EventMessage;

use super::ClusterConfig;
use crate::events::SUBSCRIPTION_CAPACITY;
use crate::mode::serve::TRACK_BYTES;
use crate::{Eviction, RequestTimeline, Trace, TraceRequest};

/// One engine's fixed heap beside its event subscription and its pool's
/// tables: its scheduler and queue, its replay state, the router's worker
/// entry, its metric labels. Massif on 1,000 engines of one block and one
/// request: 28.9 kB per engine, of which 24.6 kB is the subscription's
/// channel (counted apart) and 4.3 kB the rest; taken here as 16 KiB, for
/// the allocator's headers and rounding on these many small allocations
/// (peak RSS grows by 55.7 kB per engine of one block on the excerpt).
pub(crate) const ENGINE_BYTES: u64 = 16 << 10;

/// The process before any replay: the binary, its libraries, thread stacks
/// and allocator arenas. Peak RSS of a one-engine, one-block, one-request
/// cluster: 6.3 MB; 16 MiB here.
pub(crate) const PROCESS_BYTES: u64 = 16 << 20;

/// A pool slot (kvbm-blocks `pool::Slot`): its hash's value and parent,
/// position, reference count, epoch and state. Massif: 144,000,000 bytes
/// for 16 pools of 187,500 blocks.
pub(crate) const SLOT_BYTES: u64 = 48;

/// A pool's registry, per block: a hashbrown table of 4-byte block ids and
/// a control byte per bucket, with buckets the next power of two above 8/7
/// of the blocks, so at most 2 × 8/7 × 5 < 12 bytes (massif: 20,971,776
/// bytes for 16 pools of 187,500 blocks, 7 each).
pub(crate) const REGISTRY_BYTES: u64 = 12;

/// The eviction lists, per block: two `u32` links and an owner byte
/// (massif: 24,000,000 + 3,000,000 bytes for 16 pools of 187,500 blocks).
pub(crate) const LIST_BYTES: u64 = 9;

/// Lineage eviction's three `u32`s per block (children, parent, parent
/// epoch).
pub(crate) const LINEAGE_BYTES: u64 = 12;

/// The router's index, per block it holds: a `u128` key and a control byte
/// per bucket of the worker's hash set. Removals leave tombstones, and a
/// set that fills with them doubles while it is over half full, so it may
/// end with up to 4 × 8/7 buckets per live block: 17 × 32/7 < 78 bytes.
/// Massif on the README's run: 147 MB for the 3M blocks of 16 full pools,
/// 49 bytes each.
pub(crate) const ROUTER_BYTES_PER_BLOCK: u64 = 80;

/// A running sequence's bytes per token: it copies its prompt's `u32`s at
/// admission, and the first generated token doubles the vector's capacity.
/// (Massif, on the overloaded run below: 48 MB of sequences for 2 engines'
/// 512 running requests.)
pub(crate) const SEQUENCE_BYTES_PER_TOKEN: u64 = 8;

/// A running sequence's state per block, beside its tokens: the block's
/// chained hash (40 bytes) and its id in the block table.
pub(crate) const SEQUENCE_BYTES_PER_BLOCK: u64 = 48;

/// A token id (`u32`): in a prompt (built at its arrival, kept until the
/// request leaves) and in an event batch.
pub(crate) const TOKEN_BYTES: u64 = 4;

/// A block hash in an event batch (`u128`).
const HASH_BYTES: u64 = 16;

/// Per trace request, beside its trace line, its timelines and its tracks:
/// the scheduler's queue entry and request (held while it waits or runs),
/// the replay's arrival order and assignment, its latency samples (three
/// `u64`s) and allocator rounding.
pub(crate) const REQUEST_BYTES: u64 = 256;

/// The record the engine a request is routed to keeps of it: its
/// [`TRACK_BYTES`] and index, in vectors that may have doubled past them,
/// and a hash-map entry (an index and a position, and a control byte, at
/// most 16/7 buckets per entry).
pub(crate) const ROUTED_TRACK_BYTES: u64 = 2 * (TRACK_BYTES as u64 + 8) + (2 * 8 + 1) * 16 / 7 + 1;

/// The allocator's share on top of what is allocated, as a divisor (a
/// quarter): chunk headers, per-thread arenas and fragmentation. Peak RSS
/// over peak heap in the measured runs: 1.06 (overloaded, large prompts)
/// to 1.19 (the README's cluster, two threads).
pub(crate) const ALLOCATOR_MARGIN: u128 = 4;

/// Multi-level eviction's count-min sketch: four rows of byte counters, 256
/// per pool block, each row 4 Ki to 2 Mi counters rounded up to a power of
/// two (kvbm-blocks `eviction::sketch`).
fn sketch_bytes(blocks: u128) -> u128 {
    let width = blocks.saturating_mul(256).clamp(1 << 12, 1 << 21);
    4 * width.next_power_of_two()
}

/// Tokens (prompt and output) of the `count` longest requests of `copies`
/// copies of `trace`, the most a running sequence at a time can be.
fn longest_requests(trace: &Trace, count: u128, copies: u128) -> u128 {
    let total = |request: &TraceRequest| {
        u128::from(request.input_length) + u128::from(request.output_length)
    };
    let requests = trace.requests();
    let copies = copies.max(1);
    // The `count` longest are each of the `whole` longest originals'
    // copies, and `part` copies of the next longest.
    let (whole, part) = (count / copies, count % copies);
    match usize::try_from(whole) {
        Ok(whole) if whole < requests.len() => {
            let mut sizes: Vec<u128> = requests.iter().map(total).collect();
            let (longest, &mut next, _) = sizes.select_nth_unstable_by(whole, |a, b| b.cmp(a));
            let longest = (longest.iter()).fold(0u128, |sum, &size| sum.saturating_add(size));
            longest
                .saturating_mul(copies)
                .saturating_add(next.saturating_mul(part))
        }
        _ => (requests.iter())
            .fold(0u128, |sum, request| sum.saturating_add(total(request)))
            .saturating_mul(copies),
    }
}

/// What a replay of `trace` with `config`, whose engines each have
/// `capacity_blocks` blocks, allocates at most, in bytes.
///
/// Every sum and product saturates (at `u128::MAX`, then `u64::MAX`): an
/// estimate that large is over any budget.
pub(super) fn estimate(config: &ClusterConfig, capacity_blocks: usize, trace: &Trace) -> u64 {
    let engine = &config.engine;
    let block_size = (engine.block_size as u128).max(1);
    let blocks = capacity_blocks as u128;
    let engines = config.engines as u128;
    let max_running = engine.scheduler.max_running as u128;
    let copies = config.replicate.max(1) as u128;
    let requests = (trace.len() as u128).saturating_mul(copies);
    let bytes = |count: u128, each: u64| count.saturating_mul(u128::from(each));
    let size = |count: u128, each: usize| count.saturating_mul(each as u128);

    let (mut prompt_tokens, mut request_blocks, mut hash_ids) = (0u128, 0u128, 0u128);
    for request in trace.requests() {
        let total = u128::from(request.input_length) + u128::from(request.output_length);
        prompt_tokens = prompt_tokens.saturating_add(u128::from(request.input_length));
        request_blocks = request_blocks.saturating_add(total.div_ceil(block_size));
        hash_ids = hash_ids.saturating_add(request.hash_ids.len() as u128);
    }
    let (prompt_tokens, request_blocks) = (
        prompt_tokens.saturating_mul(copies),
        request_blocks.saturating_mul(copies),
    );
    // The copies' ids, and the original's beside them.
    let trace_copies = if copies > 1 { copies + 1 } else { 1 };
    let hash_ids = hash_ids.saturating_mul(trace_copies);

    let per_block = SLOT_BYTES
        + REGISTRY_BYTES
        + LIST_BYTES
        + match engine.eviction {
            Eviction::Lineage => LINEAGE_BYTES,
            Eviction::Lru | Eviction::MultiLevel => 0,
        };
    let sketch = match engine.eviction {
        Eviction::MultiLevel => sketch_bytes(blocks),
        Eviction::Lru | Eviction::Lineage => 0,
    };
    let subscription = size(
        SUBSCRIPTION_CAPACITY as u128,
        size_of::<EventMessage>() + size_of::<usize>(),
    );
    // A step's batch: its tokens, and a hash per block stored or removed
    // (one per block of its tokens, and one more per running request whose
    // sequence grows into a new block; never more than the pool), built
    // while the previous one is in flight.
    let step_tokens =
        (engine.scheduler.token_budget as u128).min(blocks.saturating_mul(block_size));
    let step_blocks = (step_tokens.div_ceil(block_size))
        .saturating_add(max_running)
        .min(blocks);
    let events = bytes(step_tokens, TOKEN_BYTES)
        .saturating_add(bytes(step_blocks, 2 * HASH_BYTES))
        .saturating_mul(2);
    let per_engine = [
        u128::from(ENGINE_BYTES),
        subscription,
        sketch,
        bytes(blocks, per_block),
        events,
    ]
    .into_iter()
    .fold(0u128, u128::saturating_add);

    // What the router's index holds: registered blocks, no more than all
    // pools, nor than every request's blocks.
    let held_blocks = engines.saturating_mul(blocks).min(request_blocks);
    // What the running sequences hold.
    let running = engines.saturating_mul(max_running).min(requests);
    let running_tokens = longest_requests(trace, running, copies);
    let running_blocks = (running_tokens.div_ceil(block_size)).saturating_add(running);
    // A model's KV cache groups: a sequence (tokens, hashes, table) each.
    let groups = engine.kv_group_count().unwrap_or(1) as u128;

    let policies = config.policies.len() as u128;
    let per_request = (size_of::<TraceRequest>() as u128)
        .saturating_add(size(
            policies.saturating_add(2),
            size_of::<RequestTimeline>(),
        ))
        .saturating_add(u128::from(REQUEST_BYTES))
        .saturating_add(u128::from(ROUTED_TRACK_BYTES));
    // The original trace's requests beside their copies.
    let originals = if copies > 1 { trace.len() as u128 } else { 0 };

    let allocated = [
        engines.saturating_mul(per_engine),
        bytes(held_blocks, ROUTER_BYTES_PER_BLOCK),
        bytes(running_tokens, SEQUENCE_BYTES_PER_TOKEN).saturating_mul(groups),
        bytes(running_blocks, SEQUENCE_BYTES_PER_BLOCK).saturating_mul(groups),
        bytes(prompt_tokens, TOKEN_BYTES),
        requests.saturating_mul(per_request),
        size(originals, size_of::<TraceRequest>()),
        size(hash_ids, size_of::<u64>()),
    ]
    .into_iter()
    .fold(0u128, u128::saturating_add);
    let total = allocated
        .saturating_add(allocated / ALLOCATOR_MARGIN)
        .saturating_add(u128::from(PROCESS_BYTES));
    u64::try_from(total).unwrap_or(u64::MAX)
}
