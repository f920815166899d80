//! [`Workload`]: a trace split into blocks of the simulated block size, each
//! named by a chained [`SequenceHash`].
//!
//! # Sub-block hashes
//!
//! A block size `b` must divide 512, so each 512-token trace block splits
//! into `k = 512 / b` sub-blocks. Sub-block `j` (0-based) of trace block `i`
//! with trace id `x` gets the chained value
//!
//! ```text
//! value = xxh3_128_with_seed(le(parent) ++ le(x) ++ le(j as u32), SUB_BLOCK_SEED)
//! ```
//!
//! where `parent` is the value of the sub-block right before it in the
//! request (the last sub-block of trace block `i - 1` when `j == 0`), and `0`
//! (the empty prefix) for the request's very first sub-block. Each value thus
//! folds in every trace id and sub-index before it, so a sub-block matches
//! only together with its whole prefix, even in traces whose ids would not
//! encode their prefix. At `b = 512` (`k = 1`) the same rule applies, and the
//! values are in one-to-one correspondence with the trace's prefix chains.
//!
//! # The partial last block
//!
//! A request's last trace block holds `r = input_length - 512 × (n - 1)`
//! tokens (`1..=512`). It splits into `ceil(r / b)` sub-blocks, the ones that
//! hold tokens; the last of them is partial when `b` does not divide `r`.
//! Every request therefore has exactly `ceil(input_length / b)` blocks. Like
//! the trace, which names the partial block with its own id, the simulator
//! treats the partial sub-block as a cacheable block that occupies a whole
//! block of the cache; a hit counts `b` tokens per block, capped at the
//! request's `input_length` (so a partial block counts only its tokens).

use std::fmt;
use std::ops::Range;

use foldhash::HashSet;
use foldhash::HashSetExt;
use kvbm_blocks::SequenceHash;
use tracing::instrument;
use xxhash_rust::xxh3::xxh3_128_with_seed;

use crate::trace::TRACE_BLOCK_TOKENS;
use crate::{SimError, Trace};

/// Seed of the sub-block hash (the bytes of "kvbm-sim"), fixed so workloads
/// are reproducible across runs and machines.
pub const SUB_BLOCK_SEED: u64 = u64::from_le_bytes(*b"kvbm-sim");

/// The chained value of sub-block `sub_index` of the trace block `trace_id`,
/// after the sub-block whose value is `parent` (0 for the first).
pub fn sub_block_value(parent: u128, trace_id: u64, sub_index: u32) -> u128 {
    let mut bytes = [0u8; 28];
    bytes[..16].copy_from_slice(&parent.to_le_bytes());
    bytes[16..24].copy_from_slice(&trace_id.to_le_bytes());
    bytes[24..].copy_from_slice(&sub_index.to_le_bytes());
    xxh3_128_with_seed(&bytes, SUB_BLOCK_SEED)
}

/// Where one request's blocks sit in the workload's flat hash array.
#[derive(Clone, Debug)]
struct Span {
    blocks: Range<usize>,
    arrival_ms: u64,
    input_tokens: u64,
    output_tokens: u64,
}

/// A trace at one block size: per request, its arrival, lengths and chained
/// block hashes. Built once, replayed many times (every mode and every
/// capacity of a sweep reads the same workload).
#[derive(Clone)]
pub struct Workload {
    block_size: usize,
    /// Every request's hashes back to back: one allocation, not one per request.
    hashes: Vec<SequenceHash>,
    spans: Vec<Span>,
    input_tokens: u64,
}

/// One request of a [`Workload`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkloadRequest<'a> {
    /// Arrival time in milliseconds from the start of the trace.
    pub arrival_ms: u64,
    /// Prompt length in tokens.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// The prompt's blocks, first to last, each hash chained to its prefix.
    pub blocks: &'a [SequenceHash],
}

impl Workload {
    /// Splits every request of `trace` into `block_size`-token blocks.
    ///
    /// # Errors
    ///
    /// [`SimError::InvalidBlockSize`] unless `block_size` divides 512.
    #[instrument(level = "debug", skip_all, fields(block_size, requests = trace.len()))]
    pub fn new(trace: &Trace, block_size: usize) -> Result<Self, SimError> {
        if block_size == 0 || !TRACE_BLOCK_TOKENS.is_multiple_of(block_size) {
            return Err(SimError::InvalidBlockSize { block_size });
        }
        let per_trace_block = TRACE_BLOCK_TOKENS / block_size;
        let total: usize = trace
            .requests()
            .iter()
            .map(|request| request.hash_ids.len() * per_trace_block)
            .sum();
        let mut hashes = Vec::with_capacity(total);
        let mut spans = Vec::with_capacity(trace.len());
        let mut input_tokens = 0u64;
        for request in trace.requests() {
            let start = hashes.len();
            // A checked trace has 512·(n-1) < input_length <= 512·n, so this
            // is ceil(input_length / b) and lands inside the last trace block.
            let wanted = request.input_length.div_ceil(block_size as u64) as usize;
            let mut previous: Option<SequenceHash> = None;
            'request: for &trace_id in &request.hash_ids {
                for sub_index in 0..per_trace_block {
                    if hashes.len() - start == wanted {
                        break 'request;
                    }
                    let parent = previous.map_or(0, SequenceHash::value);
                    let value = sub_block_value(parent, trace_id, sub_index as u32);
                    let hash = match previous {
                        None => SequenceHash::root(value),
                        Some(previous) => previous.child(value),
                    };
                    hashes.push(hash);
                    previous = Some(hash);
                }
            }
            debug_assert_eq!(hashes.len() - start, wanted);
            spans.push(Span {
                blocks: start..hashes.len(),
                arrival_ms: request.timestamp,
                input_tokens: request.input_length,
                output_tokens: request.output_length,
            });
            input_tokens += request.input_length;
        }
        Ok(Self {
            block_size,
            hashes,
            spans,
            input_tokens,
        })
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether there are no requests (never, for a workload of a [`Trace`]).
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Blocks over all requests.
    pub fn total_blocks(&self) -> usize {
        self.hashes.len()
    }

    /// Prompt tokens over all requests.
    pub fn input_tokens(&self) -> u64 {
        self.input_tokens
    }

    /// Distinct block hashes over all requests: the most blocks a cache could
    /// ever hold for this workload, which makes it the "unbounded" capacity.
    /// O(blocks) with a hash set; call once per workload.
    pub fn distinct_blocks(&self) -> usize {
        let mut seen = HashSet::with_capacity(self.hashes.len() / 2);
        for hash in &self.hashes {
            seen.insert(hash.value());
        }
        seen.len()
    }

    /// The `index`-th request, if there is one.
    pub fn get(&self, index: usize) -> Option<WorkloadRequest<'_>> {
        self.spans.get(index).map(|span| self.request(span))
    }

    /// The requests in trace order.
    pub fn requests(&self) -> impl ExactSizeIterator<Item = WorkloadRequest<'_>> + '_ {
        self.spans.iter().map(|span| self.request(span))
    }

    fn request(&self, span: &Span) -> WorkloadRequest<'_> {
        WorkloadRequest {
            arrival_ms: span.arrival_ms,
            input_tokens: span.input_tokens,
            output_tokens: span.output_tokens,
            // Spans are built from this very vector, so the range is in bounds;
            // `get` keeps that an invariant rather than a panic site.
            blocks: self.hashes.get(span.blocks.clone()).unwrap_or_default(),
        }
    }
}

impl fmt::Debug for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workload")
            .field("block_size", &self.block_size)
            .field("requests", &self.spans.len())
            .field("blocks", &self.hashes.len())
            .field("input_tokens", &self.input_tokens)
            .finish()
    }
}

#[cfg(test)]
mod tests;
