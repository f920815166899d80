//! [`StepPlan`] (what the engine runs this step), [`EngineOutput`] (what it
//! sampled) and [`StepReport`] (what applying it changed).

use kvbm_blocks::BlockId;

use super::{FinishReason, RequestId};

/// One engine iteration: which requests prefill which tokens and which
/// decode, with the blocks each newly holds.
///
/// Block tables are sent as deltas, as vLLM does: `new_blocks` are appended
/// to the request's table, except when `resumed` is true, where they are the
/// whole table: for a newly admitted or preempted-and-resumed request, and
/// after a table entry changed under the engine. That happens when two
/// requests computed the same prefix block at once: the later registration
/// is deduplicated onto the earlier request's block (same KV content), and
/// the engine may simply switch to it.
/// [`Scheduler::block_table`](crate::Scheduler::block_table) gives the full
/// table at any time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepPlan {
    /// The step's number, from 0.
    pub step: u64,
    /// Prompt chunks to compute (also recomputation after a preemption).
    pub prefill: Vec<PrefillWork>,
    /// Requests that compute their tail token and sample the next.
    pub decode: Vec<DecodeWork>,
    /// Requests preempted this step: their blocks are gone; they wait again.
    pub preempted: Vec<RequestId>,
    /// Requests that left while planning: one that outgrew the whole pool
    /// ([`FinishReason::CapacityExceeded`]), or one that cannot run at all.
    pub finished: Vec<Finished>,
    /// Copies between tiers to run (with [`Scheduler::with_tiers`](crate::Scheduler::with_tiers)):
    /// stores down the hierarchy and loads of onboarding requests' prefixes
    /// onto the device, each reported back through
    /// [`Scheduler::report_transfers`](crate::Scheduler::report_transfers)
    /// whenever it ends (this step or a later one). Stores may run beside
    /// the step; a load's destination blocks belong to no planned request
    /// until it is reported.
    pub transfers: Vec<kvbm_tiers::Transfer>,
    /// Requests admitted this step to wait for loads (onboarding): they
    /// hold device blocks and start computing in a later step's plan,
    /// `resumed`, once their loads are reported.
    pub onboarding: Vec<RequestId>,
    /// The previous step's table-update buffers, for this step's entries
    /// (a reused plan allocates no block lists once warm).
    pub(crate) spare: Spare,
}

impl StepPlan {
    /// Whether there is nothing to compute (transfers may still be listed).
    pub fn is_empty(&self) -> bool {
        self.prefill.is_empty() && self.decode.is_empty()
    }

    /// Tokens computed this step (draft tokens included).
    pub fn num_tokens(&self) -> usize {
        let prefill = self.prefill.iter().map(|p| p.num_tokens).sum::<usize>();
        let decode = self
            .decode
            .iter()
            .map(DecodeWork::num_tokens)
            .sum::<usize>();
        prefill + decode
    }

    /// Draft tokens proposed for verification this step.
    pub fn draft_tokens(&self) -> usize {
        self.decode.iter().map(|d| d.draft_tokens).sum()
    }

    /// Empties `prefill` and `decode`, keeping their entries' block lists
    /// in `spare` for the next entries.
    pub(crate) fn recycle_work(&mut self) {
        let spare = &mut self.spare;
        let lists = (self
            .prefill
            .iter_mut()
            .map(|p| (&mut p.new_blocks, &mut p.groups)))
        .chain(
            self.decode
                .iter_mut()
                .map(|d| (&mut d.new_blocks, &mut d.groups)),
        );
        for (blocks, groups) in lists {
            if blocks.capacity() > 0 {
                spare.ids.push(std::mem::take(blocks));
            }
            if groups.capacity() > 0 {
                spare.groups.push(std::mem::take(groups));
            }
        }
        self.prefill.clear();
        self.decode.clear();
    }
}

/// Block lists of a plan's earlier entries, for its next ones.
///
/// Not part of what a plan says: every spare set compares equal, a clone
/// starts with none, and `Debug` shows only how many there are.
#[derive(Default)]
pub(crate) struct Spare {
    ids: Vec<Vec<BlockId>>,
    groups: Vec<Vec<GroupBlocks>>,
}

impl Spare {
    /// An empty block list, reused when one is spare.
    pub(crate) fn block_ids(&mut self) -> Vec<BlockId> {
        let mut ids = self.ids.pop().unwrap_or_default();
        ids.clear();
        ids
    }

    /// A list of group updates, reused when one is spare: its entries are
    /// an earlier step's, for the caller to overwrite (keeping their block
    /// lists' memory) or drop.
    pub(crate) fn groups(&mut self) -> Vec<GroupBlocks> {
        self.groups.pop().unwrap_or_default()
    }
}

impl Clone for Spare {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for Spare {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Spare {}

impl std::fmt::Debug for Spare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spare")
            .field("block_lists", &self.ids.len())
            .field("group_lists", &self.groups.len())
            .finish()
    }
}

/// A prefill chunk: compute KV for tokens `start .. start + num_tokens`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PrefillWork {
    /// The request.
    pub id: RequestId,
    /// The first token position of the chunk (its KV position).
    pub start: usize,
    /// Tokens in the chunk.
    pub num_tokens: usize,
    /// Whether the chunk ends the prompt and must sample the first token.
    pub emits_token: bool,
    /// Blocks to append to the request's table (the whole table if `resumed`).
    pub new_blocks: Vec<BlockId>,
    /// Whether the table starts fresh this step.
    pub resumed: bool,
    /// With several KV cache groups ([`Scheduler::with_kv_groups`](crate::Scheduler::with_kv_groups)),
    /// each group's table update, in group order (`new_blocks` repeats the
    /// first's). Empty for a model of one full-attention group, and on a
    /// step that gives no group a block and starts no table fresh (as
    /// vLLM's `new_block_ids` is `None`): every group's table stays as the
    /// engine has it. Groups always grow together, so a step lists every
    /// group or none.
    pub groups: Vec<GroupBlocks>,
}

/// One KV cache group's part of a request's table update.
///
/// A group whose layers read no further back than a window or a chunk
/// releases the blocks behind it: its table's entries before
/// `first_block` are no longer the request's (the attention kernel never
/// reads them; a fresh table has no block there). Releases come with the
/// next update that lists the group, so `first_block` may lag the
/// group's window by a few steps; only a fresh table (`resumed`) needs
/// it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupBlocks {
    /// The first table entry the group still holds.
    pub first_block: usize,
    /// Blocks to append to the group's table; with `resumed`, the whole
    /// table from `first_block` on.
    pub new_blocks: Vec<BlockId>,
}

impl GroupBlocks {
    pub(crate) fn new(first_block: usize, new_blocks: Vec<BlockId>) -> Self {
        Self {
            first_block,
            new_blocks,
        }
    }
}

/// A decode step: compute the KV of the token at `position` (and, with
/// speculative decoding, of `draft_tokens` draft tokens after it) and sample
/// the next.
///
/// A speculative step's slots cover positions `position ..= position +
/// draft_tokens`; `new_blocks` may also hold the block of the slot after
/// them, where the token sampled after the last accepted draft goes next.
/// Blocks that end up holding only rejected drafts are given back by
/// [`apply`](crate::Scheduler::apply) and listed in
/// [`StepReport::rolled_back`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DecodeWork {
    /// The request.
    pub id: RequestId,
    /// Position of the token whose KV is computed.
    pub position: usize,
    /// Draft tokens the engine verifies after it (0 without speculative
    /// decoding; fewer than configured when the token budget or the
    /// request's output budget is short).
    pub draft_tokens: usize,
    /// Blocks to append to the request's table (the whole table if `resumed`).
    pub new_blocks: Vec<BlockId>,
    /// Whether the table starts fresh this step.
    pub resumed: bool,
    /// Each KV cache group's table update, as [`PrefillWork::groups`].
    pub groups: Vec<GroupBlocks>,
}

impl DecodeWork {
    /// Tokens this entry computes: the tail token and the drafts.
    pub fn num_tokens(&self) -> usize {
        self.draft_tokens.saturating_add(1)
    }
}

/// What the engine sampled for one planned request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineOutput {
    /// The request.
    pub id: RequestId,
    /// The sampled token: required for decodes and emitting prefill chunks,
    /// absent for other chunks. After a speculative step, the token sampled
    /// after the last accepted draft (the bonus token when every draft was
    /// accepted, the correction otherwise).
    pub token: Option<u32>,
    /// The draft tokens the engine accepted, in order (a prefix of the
    /// drafts it verified, at most [`DecodeWork::draft_tokens`]); empty for
    /// everything but speculative decodes. The request gains these and then
    /// `token`: 1 to `draft_tokens + 1` tokens per step.
    pub accepted_drafts: Vec<u32>,
    /// The engine saw a stop condition (end-of-sequence, stop string): the
    /// request finishes after this token.
    pub stop: bool,
}

impl EngineOutput {
    /// A sampled token, no stop.
    pub fn token(id: RequestId, token: u32) -> Self {
        Self {
            id,
            token: Some(token),
            accepted_drafts: Vec::new(),
            stop: false,
        }
    }

    /// A speculative step's result: the accepted draft tokens, then the
    /// token sampled after them.
    pub fn speculative(id: RequestId, accepted_drafts: Vec<u32>, token: u32) -> Self {
        Self {
            id,
            token: Some(token),
            accepted_drafts,
            stop: false,
        }
    }

    /// The same output, ending the request after its last token.
    pub fn with_stop(mut self) -> Self {
        self.stop = true;
        self
    }

    /// Tokens the request gains: the accepted drafts and the sampled token.
    pub fn num_tokens(&self) -> usize {
        self.accepted_drafts.len() + usize::from(self.token.is_some())
    }

    /// A chunk that samples nothing.
    pub fn no_token(id: RequestId) -> Self {
        Self {
            id,
            token: None,
            accepted_drafts: Vec::new(),
            stop: false,
        }
    }

    /// A sampled token that ends the request.
    pub fn stop(id: RequestId, token: u32) -> Self {
        Self {
            id,
            token: Some(token),
            accepted_drafts: Vec::new(),
            stop: true,
        }
    }
}

/// What applying a step changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepReport {
    /// The step applied.
    pub step: u64,
    /// Requests that produced their first token this step.
    pub first_tokens: Vec<RequestId>,
    /// Tokens generated this step, over all requests.
    pub generated_tokens: usize,
    /// Requests that finished, with why and how many tokens they generated.
    pub finished: Vec<Finished>,
    /// Draft tokens the engine verified this step (speculative decoding).
    pub verified_draft_tokens: usize,
    /// Of those, the ones it accepted.
    pub accepted_draft_tokens: usize,
    /// Blocks given back after speculative steps: each held only rejected
    /// draft tokens. The engine drops them from the end of the request's
    /// table.
    pub rolled_back: Vec<RolledBack>,
}

/// Blocks a request gave back because they held only rejected draft tokens
/// (last block of its table first).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RolledBack {
    /// The request.
    pub id: RequestId,
    /// The blocks, in the order they were given back (last table entry
    /// first); with KV cache groups, the first group's.
    pub blocks: Vec<BlockId>,
    /// With KV cache groups, each group's blocks given back, in group order
    /// (each last table entry first; every group gives back as many, as
    /// groups cover the same slots); empty with one group.
    pub groups: Vec<Vec<BlockId>>,
}

/// A request that left the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finished {
    /// The request.
    pub id: RequestId,
    /// Why it finished.
    pub reason: FinishReason,
    /// Tokens it generated.
    pub generated_tokens: usize,
}
