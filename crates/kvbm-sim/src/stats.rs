//! [`HitStats`]: prefix-cache hit accounting shared by every mode.

use std::fmt;

use crate::WorkloadRequest;
use crate::format::{group, percent};
use crate::trace::ratio;

/// How much of the workload's prompts the cache already held.
///
/// A request's hit blocks are the longest prefix of its blocks found in the
/// cache (a block counts only with its whole prefix). Each hit block counts
/// the block size in tokens, capped at the request's `input_length`, so a
/// partial last block counts only the tokens it has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HitStats {
    /// Requests replayed.
    pub requests: u64,
    /// Prompt blocks over all requests.
    pub input_blocks: u64,
    /// Of those, blocks found in the cache.
    pub hit_blocks: u64,
    /// Prompt tokens over all requests.
    pub input_tokens: u64,
    /// Of those, tokens in hit blocks.
    pub hit_tokens: u64,
}

impl HitStats {
    /// Writes the blocks/tokens table of the text reports: input, hits
    /// (labelled `hit_label`, followed by `hit_note`) and hit rates.
    pub(crate) fn write_table(
        &self,
        f: &mut fmt::Formatter<'_>,
        hit_label: &str,
        hit_note: &str,
    ) -> fmt::Result {
        writeln!(f, "  {:<13}{:>14} {:>16}", "", "blocks", "tokens")?;
        let (input_blocks, input_tokens) = (group(self.input_blocks), group(self.input_tokens));
        writeln!(f, "  {:<13}{input_blocks:>14} {input_tokens:>16}", "input")?;
        let (hit_blocks, hit_tokens) = (group(self.hit_blocks), group(self.hit_tokens));
        writeln!(
            f,
            "  {hit_label:<13}{hit_blocks:>14} {hit_tokens:>16}{hit_note}"
        )?;
        let (block_rate, token_rate) = (
            percent(self.block_hit_rate()),
            percent(self.token_hit_rate()),
        );
        writeln!(f, "  {:<13}{block_rate:>14} {token_rate:>16}", "hit rate")
    }

    /// Counts one request whose first `hit_blocks` blocks were cached.
    pub fn record(&mut self, request: &WorkloadRequest<'_>, hit_blocks: usize, block_size: usize) {
        self.requests += 1;
        self.input_blocks += request.blocks.len() as u64;
        self.hit_blocks += hit_blocks as u64;
        self.input_tokens += request.input_tokens;
        let hit_tokens = (hit_blocks as u64).saturating_mul(block_size as u64);
        self.hit_tokens += hit_tokens.min(request.input_tokens);
    }

    /// Counts one request of `input_blocks` blocks whose first `hit_tokens`
    /// prompt tokens were cached, in whole blocks of `block_size` (serve
    /// mode, where the scheduler reports hits in tokens).
    pub(crate) fn record_tokens(
        &mut self,
        input_tokens: u64,
        input_blocks: u64,
        hit_tokens: u64,
        block_size: usize,
    ) {
        self.requests += 1;
        self.input_blocks += input_blocks;
        self.input_tokens += input_tokens;
        self.hit_tokens += hit_tokens;
        self.hit_blocks += hit_tokens / block_size.max(1) as u64;
    }

    /// `hit_blocks / input_blocks`, in `0.0..=1.0` (0 with no blocks).
    pub fn block_hit_rate(&self) -> f64 {
        ratio(self.hit_blocks, self.input_blocks)
    }

    /// `hit_tokens / input_tokens`, in `0.0..=1.0` (0 with no tokens).
    pub fn token_hit_rate(&self) -> f64 {
        ratio(self.hit_tokens, self.input_tokens)
    }
}
