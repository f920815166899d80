//! [`SchedulerConfig`]: the per-step limits, with documented defaults.

use super::running::Limits;
use crate::{Aging, GenerationReserve, Selection};

/// The limits one [`Scheduler::step`](crate::Scheduler::step) works within.
///
/// Defaults follow vLLM's: 256 running requests, 8192 tokens per step, chunks
/// of up to 2048 prompt tokens, and 1% of the pool kept free as a watermark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchedulerConfig {
    /// Most requests running (admitted and holding blocks) at once.
    pub max_running: usize,
    /// Most tokens one step computes: prefill chunk tokens plus one per decode.
    pub token_budget: usize,
    /// Most prompt tokens one request prefills in one step (chunked prefill).
    pub chunk_size: usize,
    /// Blocks admission leaves free, so running requests can grow into them
    /// before anyone must be preempted. `None` means 1% of the pool.
    pub watermark_blocks: Option<usize>,
    /// Generated tokens a waiting request's admission estimate reserves.
    pub reserve: GenerationReserve,
    /// What admission does when the next request does not fit.
    pub selection: Selection,
    /// How priority and arrival order combine in the waiting queue. The
    /// default, [`Aging::Strict`], lets a steady stream of urgent requests
    /// starve less urgent ones; [`Aging::Window`] bounds how many later
    /// arrivals may overtake a request, and [`Aging::Timed`] how long it
    /// waits (waiting raises its urgency at a fixed rate), so every request
    /// is admitted.
    pub aging: Aging,
    /// Priority steps a preempted request's urgency rises each time it is
    /// preempted (vLLM issue 41951), at most
    /// [`MAX_BOOST_STEPS`](crate::MAX_BOOST_STEPS) in all; 0 (the default)
    /// leaves it at its place. It shares the aging key: one step is worth
    /// what `aging` makes a priority step (a priority level under
    /// [`Aging::Strict`], `w` arrivals under [`Aging::Window`], `step` of
    /// waiting under [`Aging::Timed`]), so a request preempted again and
    /// again is resumed ahead of fresh arrivals of its own priority, and
    /// never ahead of a `Critical` one that waited as long.
    pub preemption_boost: u32,
    /// Whether admission may preempt running requests for a more urgent
    /// waiting one (running requests that run out of blocks preempt the least
    /// important running request either way).
    pub preemption: Preemption,
    /// Whether admission credits a request's cached prefix (the default):
    /// the pool is charged only for the blocks its cached prefix does not
    /// cover (a cached block another request holds costs nothing; one taken
    /// from the evictable cache leaves the available count when matched).
    /// Without it, a request is charged its whole prompt plus reserve.
    /// Either way the token budget is charged only for tokens computed.
    /// Applies under [`Selection::HeadOfLine`]; [`Selection::SkipAhead`]'s
    /// bypass accounting prices requests by the queue's estimate.
    pub prefix_credit: bool,
    /// Draft tokens each decode verifies (speculative decoding; 0 turns it
    /// off). A decode then computes `1 + speculative_tokens` tokens, all
    /// counted against `token_budget`, and gains 1 to
    /// `speculative_tokens + 1` tokens. Fewer drafts are verified when the
    /// token budget or the request's output budget is short, or when the
    /// blocks above the watermark cannot hold their slots: drafts never make
    /// a request wait or be preempted.
    pub speculative_tokens: usize,
}

/// What admission may do when the most urgent waiting request does not fit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Preemption {
    /// Wait until running requests finish (vLLM's first-come-first-served
    /// policy).
    #[default]
    Never,
    /// Preempt running requests strictly less urgent than the waiting one,
    /// least urgent first (lowest priority, then latest arrival: vLLM's
    /// priority policy), when that frees enough blocks to admit it. A request
    /// is never preempted for an equally or less urgent one, nor for one that
    /// would still not fit; requests admitted in the same step are not
    /// preempted.
    ByPriority,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_running: 256,
            token_budget: 8192,
            chunk_size: 2048,
            watermark_blocks: None,
            reserve: GenerationReserve::default(),
            selection: Selection::HeadOfLine,
            aging: Aging::Strict,
            preemption: Preemption::Never,
            preemption_boost: 0,
            prefix_credit: true,
            speculative_tokens: 0,
        }
    }
}

impl SchedulerConfig {
    /// Sets [`max_running`](Self::max_running).
    pub fn with_max_running(mut self, max_running: usize) -> Self {
        self.max_running = max_running;
        self
    }

    /// Sets [`token_budget`](Self::token_budget).
    pub fn with_token_budget(mut self, tokens: usize) -> Self {
        self.token_budget = tokens;
        self
    }

    /// Sets [`chunk_size`](Self::chunk_size).
    pub fn with_chunk_size(mut self, tokens: usize) -> Self {
        self.chunk_size = tokens;
        self
    }

    /// Sets [`watermark_blocks`](Self::watermark_blocks).
    pub fn with_watermark_blocks(mut self, blocks: usize) -> Self {
        self.watermark_blocks = Some(blocks);
        self
    }

    /// Sets [`reserve`](Self::reserve).
    pub fn with_reserve(mut self, reserve: GenerationReserve) -> Self {
        self.reserve = reserve;
        self
    }

    /// Sets [`selection`](Self::selection).
    pub fn with_selection(mut self, selection: Selection) -> Self {
        self.selection = selection;
        self
    }

    /// Sets [`aging`](Self::aging).
    pub fn with_aging(mut self, aging: Aging) -> Self {
        self.aging = aging;
        self
    }

    /// Sets [`preemption`](Self::preemption).
    pub fn with_preemption(mut self, preemption: Preemption) -> Self {
        self.preemption = preemption;
        self
    }

    /// Sets [`preemption_boost`](Self::preemption_boost).
    pub fn with_preemption_boost(mut self, priority_steps: u32) -> Self {
        self.preemption_boost = priority_steps;
        self
    }

    /// Sets [`prefix_credit`](Self::prefix_credit).
    pub fn with_prefix_credit(mut self, credit: bool) -> Self {
        self.prefix_credit = credit;
        self
    }

    /// Sets [`speculative_tokens`](Self::speculative_tokens).
    pub fn with_speculative_tokens(mut self, draft_tokens: usize) -> Self {
        self.speculative_tokens = draft_tokens;
        self
    }

    /// What one request may be scheduled with `budget` tokens left in a
    /// pool of `total_blocks`.
    pub(super) fn limits(&self, budget: usize, total_blocks: usize) -> Limits {
        Limits {
            budget,
            chunk_size: self.chunk_size,
            draft_tokens: self.speculative_tokens,
            draft_floor: self.watermark(total_blocks),
        }
    }

    /// The watermark for a pool of `total_blocks`.
    pub(crate) fn watermark(&self, total_blocks: usize) -> usize {
        self.watermark_blocks.unwrap_or(total_blocks / 100)
    }
}
