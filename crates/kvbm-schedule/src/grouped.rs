//! [`GroupedSequence`]: one request of a model with several KV cache
//! groups (full, sliding-window and chunked-local layers), driven through
//! the same schedule/apply protocol as a [`SchedulableSequence`].

use std::sync::Arc;

use kvbm_blocks::{BlockId, BlockManager, SequenceHash};
use kvbm_sequence::{AttentionKind, KvCacheGroups, PromptTokens, RequestSequence, Salt, Tokens};

use crate::{ApplyError, DecodeOutcome, HistoryPolicy, SchedulableSequence, ScheduleError};

/// One request of a model whose layers form several [`KvCacheGroups`]: one
/// [`SchedulableSequence`] per group, all in one shared pool, moved in
/// lock-step (every group computes the same tokens in the same step).
///
/// What differs per group is which blocks it keeps: after each applied
/// step, a group whose layers read no further back than a window or a
/// chunk releases the registered blocks behind it into the cache (see
/// [`AttentionKind::first_needed_block`](kvbm_sequence::AttentionKind::first_needed_block)),
/// so a sliding-window group holds about `window / block_size` blocks
/// however long the request grows. Each group caches its blocks under the
/// request's chained hashes with its group's tag ([`Salt::for_group`]); a
/// prefix hit counts only as far as every group can serve it
/// ([`KvCacheGroups::longest_common_hit`]).
///
/// Every call is all or nothing across the groups: a schedule that cannot
/// allocate for one group gives back what the others allocated; a refused
/// apply changes nothing. Groups advance identically, so the first group's
/// checks stand for all.
///
/// Blocks released behind a window are released when a step is applied;
/// vLLM releases them when the request next allocates. The blocks held
/// between steps are the same; ours return to the pool one schedule
/// earlier.
///
/// ```
/// use std::sync::Arc;
/// use kvbm_blocks::BlockManager;
/// use kvbm_schedule::GroupedSequence;
/// use kvbm_sequence::{AttentionKind, KvCacheGroup, KvCacheGroups};
/// # struct Gpu;
/// let groups = Arc::new(KvCacheGroups::new(4, vec![
///     KvCacheGroup::new(AttentionKind::Full, 2),
///     KvCacheGroup::new(AttentionKind::SlidingWindow { window: 8 }, 2),
/// ])?);
/// let pool = BlockManager::<Gpu>::builder().block_count(64).block_size(4).build()?;
///
/// let mut seq = GroupedSequence::<Gpu>::new((0..40).collect(), 4, groups.clone())?;
/// seq.schedule_prefill(40, &pool)?;
/// seq.apply_prefill(Some(7), &pool)?;
/// // The full group keeps all 10 blocks; the window group only blocks 8
/// // and 9, which hold tokens 33..40, all the next token reads. Its
/// // blocks 0..8 went back to the cache.
/// assert_eq!(seq.group(0).unwrap().held_blocks(), 10);
/// assert_eq!(seq.group(1).unwrap().held_blocks(), 2);
/// assert_eq!(seq.group(1).unwrap().inner().skipped_blocks(), 8);
///
/// // Another request with the same prompt skips 9 blocks in both groups
/// // (the last token is always computed).
/// let mut other = GroupedSequence::<Gpu>::new((0..40).collect(), 4, groups)?;
/// assert_eq!(other.match_and_add_prefix(&pool)?, 9);
/// assert_eq!(other.kv_position(), 36);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct GroupedSequence<M> {
    groups: Arc<KvCacheGroups>,
    /// One per group, index for index with `groups`.
    sequences: Vec<SchedulableSequence<M>>,
    /// The `kv_position` below which no group has a block to release, as
    /// the last `release_unread` left the groups (0: unknown). Only a
    /// decode apply trusts it; every other call that moves positions or
    /// tables sets it to 0.
    unread_from: usize,
}

/// How often a hit is looked up again when a block scanned as cached was
/// evicted before it could be taken (another thread's allocation); after
/// that the request computes its prompt.
const HIT_ATTEMPTS: usize = 3;

impl<M> GroupedSequence<M> {
    /// A request with prompt `tokens` that may generate up to
    /// `max_output_tokens` tokens, under `groups` (unsalted; see
    /// [`with_salt`](Self::with_salt)).
    ///
    /// # Errors
    ///
    /// As [`SchedulableSequence::new`].
    pub fn new(
        tokens: Vec<u32>,
        max_output_tokens: usize,
        groups: Arc<KvCacheGroups>,
    ) -> Result<Self, ScheduleError> {
        Self::with_salt(tokens, max_output_tokens, groups, Salt::NONE)
    }

    /// As [`new`](Self::new), with every group's hashes rooted in `salt`
    /// ([`Salt::for_group`] of it).
    ///
    /// # Errors
    ///
    /// As [`SchedulableSequence::new`].
    pub fn with_salt(
        tokens: Vec<u32>,
        max_output_tokens: usize,
        groups: Arc<KvCacheGroups>,
        salt: Salt,
    ) -> Result<Self, ScheduleError> {
        Self::from_prompt(tokens.into(), max_output_tokens, groups, salt)
    }

    /// As [`with_salt`](Self::with_salt), from a prompt the groups take
    /// over or share with its other holders ([`PromptTokens`]). Either way
    /// the groups share the prompt's full blocks: each keeps only its
    /// partial last block and what it generates.
    ///
    /// # Errors
    ///
    /// As [`SchedulableSequence::new`].
    pub fn from_prompt(
        prompt: PromptTokens,
        max_output_tokens: usize,
        groups: Arc<KvCacheGroups>,
        salt: Salt,
    ) -> Result<Self, ScheduleError> {
        // The prompt is chained once for every group (a group's hashes are
        // the first's with its tag on), and every group keeps the room the
        // caller reserved for the generation.
        let salts: Vec<Salt> = (0..groups.len()).map(|g| salt.for_group(g)).collect();
        let sequences =
            RequestSequence::with_salts(prompt, max_output_tokens, groups.block_size(), &salts)?
                .into_iter()
                .map(|inner| SchedulableSequence::from_inner(inner, HistoryPolicy::Off))
                .collect();
        Ok(Self {
            groups,
            sequences,
            unread_from: 0,
        })
    }

    /// The groups this request is laid out for.
    pub fn groups(&self) -> &KvCacheGroups {
        &self.groups
    }

    /// Group `index`'s sequence: its block table, held blocks, history.
    pub fn group(&self, index: usize) -> Option<&SchedulableSequence<M>> {
        self.sequences.get(index)
    }

    /// The first group's sequence: positions, tokens and state are the same
    /// in every group.
    fn lead(&self) -> &SchedulableSequence<M> {
        &self.sequences[0]
    }

    /// Tokens whose KV is computed, in every group.
    pub fn kv_position(&self) -> usize {
        self.lead().kv_position()
    }

    /// Input plus generated tokens.
    pub fn total_tokens(&self) -> usize {
        self.lead().total_tokens()
    }

    /// Whether the output budget is spent.
    pub fn is_complete(&self) -> bool {
        self.lead().is_complete()
    }

    /// Whether prefill reached its target (decode may be scheduled).
    pub fn is_prefill_complete(&self) -> bool {
        self.lead().is_prefill_complete()
    }

    /// Tokens prefill still has to compute.
    pub fn remaining_prefill_tokens(&self) -> usize {
        self.lead().remaining_prefill_tokens()
    }

    /// Idle or the pending step, the same in every group.
    pub fn state(&self) -> crate::SequenceState {
        self.lead().state()
    }

    /// Every token, input then generated.
    pub fn tokens(&self) -> Tokens<'_> {
        self.lead().tokens()
    }

    /// Whether the chunk completing prefill must carry the first generated
    /// token (see [`SchedulableSequence::final_chunk_emits_token`]).
    pub fn final_chunk_emits_token(&self) -> bool {
        self.lead().final_chunk_emits_token()
    }

    /// Tokens generated so far.
    pub fn generated_tokens(&self) -> usize {
        self.lead().generated_tokens()
    }

    /// Tokens that may still be generated.
    pub fn remaining_tokens(&self) -> usize {
        self.lead().remaining_tokens()
    }

    /// Tokens per block, the same in every group.
    pub fn block_size(&self) -> usize {
        self.groups.block_size()
    }

    /// The sequences, one per group, in group order.
    pub fn sequences(&self) -> &[SchedulableSequence<M>] {
        &self.sequences
    }

    /// Blocks held over all groups.
    pub fn held_blocks(&self) -> usize {
        self.sequences
            .iter()
            .map(SchedulableSequence::held_blocks)
            .sum()
    }

    /// Group `index`'s page table: the index of its first block (blocks
    /// before it were released) and the blocks from there on.
    pub fn block_table(&self, index: usize) -> Option<(usize, Vec<BlockId>)> {
        let seq = self.sequences.get(index)?;
        Some((seq.inner().skipped_blocks(), seq.block_ids().collect()))
    }

    /// Takes the longest prefix every group can serve from `manager`'s
    /// cache, capped so the last token is computed, on a sequence that
    /// holds nothing; returns the hit in blocks (0 if it holds blocks
    /// already: a running request keeps what it has). Each group takes
    /// only the cached blocks its layers read, and looks up only the blocks
    /// its rule asks about ([`KvCacheGroups::longest_common_hit_by`]): about
    /// the hit for a full group, a window's worth for a sliding window.
    ///
    /// # Errors
    ///
    /// Nothing changes on error: [`ScheduleError::NotIdle`] if a step is
    /// pending, [`ScheduleError::Sequence`] for a manager of another block
    /// size.
    pub fn match_and_add_prefix(
        &mut self,
        manager: &BlockManager<M>,
    ) -> Result<usize, ScheduleError> {
        self.unread_from = 0;
        if self.held_blocks() > 0 || self.kv_position() > 0 {
            self.lead().require_idle("match_and_add_prefix")?;
            return Ok(0);
        }
        let block_size = self.groups.block_size();
        let cap = self.total_tokens().saturating_sub(1) / block_size;
        if cap == 0 {
            return Ok(0);
        }
        for _ in 0..HIT_ATTEMPTS {
            let mut probes: Vec<Probe<'_>> = (self.sequences.iter())
                .zip(self.groups.groups())
                .map(|(seq, group)| {
                    let hashes = seq.inner().sequence().sequence_hashes();
                    Probe::new(&hashes[..cap.min(hashes.len())], group.kind())
                })
                .collect();
            let hit = (self.groups).longest_common_hit_by(cap, |g, i| {
                probes
                    .get_mut(g)
                    .is_some_and(|probe| probe.is_cached(i, manager))
            });
            drop(probes);
            if hit == 0 {
                return Ok(0);
            }
            if self.take_hit(hit, manager)? {
                return Ok(hit);
            }
        }
        Ok(0)
    }

    /// Every group takes its needed blocks for a hit of `hit` blocks, or
    /// (if one group's blocks were evicted since the scan) none does.
    fn take_hit(&mut self, hit: usize, manager: &BlockManager<M>) -> Result<bool, ScheduleError> {
        let block_size = self.groups.block_size();
        for g in 0..self.sequences.len() {
            let needed = self.groups.groups()[g]
                .kind()
                .needed_for_hit(hit, block_size);
            match self.sequences[g].take_hit(needed, manager) {
                Ok(true) => {}
                outcome => {
                    for taken in &mut self.sequences[..g] {
                        // Idle and took only matched blocks: cannot fail.
                        taken
                            .release()
                            .map_err(|_| ScheduleError::NotReleased { held: 0 })?;
                    }
                    return outcome;
                }
            }
        }
        Ok(true)
    }

    /// Schedules a prefill chunk of `num_tokens` in every group, all or
    /// nothing (see [`SchedulableSequence::schedule_prefill`]).
    ///
    /// # Errors
    ///
    /// As [`SchedulableSequence::schedule_prefill`]; a group that cannot
    /// allocate undoes the groups scheduled before it.
    pub fn schedule_prefill(
        &mut self,
        num_tokens: usize,
        manager: &BlockManager<M>,
    ) -> Result<(), ScheduleError> {
        let schedule = |seq: &mut SchedulableSequence<M>| seq.schedule_prefill(num_tokens, manager);
        self.schedule_all(schedule, schedule)
    }

    /// Schedules a decode step in every group, all or nothing.
    ///
    /// # Errors
    ///
    /// As [`SchedulableSequence::schedule_decode`].
    pub fn schedule_decode(&mut self, manager: &BlockManager<M>) -> Result<(), ScheduleError> {
        // The first group's checks stand for all (they advance alike): on
        // every decode step the others only allocate and record, and when
        // the first allocated nothing (15 steps of 16) neither do they:
        // every group's table covers as many slots.
        let [lead, others @ ..] = self.sequences.as_mut_slice() else {
            return Ok(());
        };
        lead.schedule_decode(manager)?;
        let covered = lead.state()
            == (crate::SequenceState::DecodeScheduled {
                blocks_allocated: 0,
            });
        for g in 0..others.len() {
            let seq = &mut others[g];
            debug_assert!(seq.check_decode_preconditions("schedule_decode").is_ok());
            if covered {
                seq.schedule_decode_covered();
            } else if let Err(error) = seq.schedule_decode_checked(manager) {
                for done in std::iter::once(lead).chain(&mut others[..g]) {
                    // Scheduled just now, so revertible.
                    let _ = done.revert_schedule();
                }
                return Err(error);
            }
        }
        Ok(())
    }

    /// Schedules the step in every group, all or nothing: `lead` in the
    /// first, `rest` in each of the others; a group that refuses reverts
    /// the groups before it.
    fn schedule_all(
        &mut self,
        lead: impl FnOnce(&mut SchedulableSequence<M>) -> Result<(), ScheduleError>,
        mut rest: impl FnMut(&mut SchedulableSequence<M>) -> Result<(), ScheduleError>,
    ) -> Result<(), ScheduleError> {
        let [first, others @ ..] = self.sequences.as_mut_slice() else {
            return Ok(());
        };
        lead(first)?;
        for g in 0..others.len() {
            if let Err(error) = rest(&mut others[g]) {
                for done in std::iter::once(first).chain(&mut others[..g]) {
                    // Scheduled just now, so revertible.
                    let _ = done.revert_schedule();
                }
                return Err(error);
            }
        }
        Ok(())
    }

    /// Schedules a speculative decode step in every group, all or nothing.
    ///
    /// # Errors
    ///
    /// As [`SchedulableSequence::schedule_speculative`].
    pub fn schedule_speculative(
        &mut self,
        num_draft_tokens: usize,
        manager: &BlockManager<M>,
    ) -> Result<(), ScheduleError> {
        let schedule =
            |seq: &mut SchedulableSequence<M>| seq.schedule_speculative(num_draft_tokens, manager);
        self.schedule_all(schedule, schedule)
    }

    /// Commits the scheduled speculative step in every group (the same
    /// accepted tokens), then releases what each group reads no more.
    ///
    /// # Errors
    ///
    /// As [`SchedulableSequence::apply_speculative`]; nothing changes.
    pub fn apply_speculative(
        &mut self,
        accepted: &[u32],
        manager: &BlockManager<M>,
    ) -> Result<DecodeOutcome, ApplyError> {
        self.unread_from = 0;
        let apply = |seq: &mut SchedulableSequence<M>| seq.apply_speculative(accepted, manager);
        self.apply_all(apply, apply)
    }

    /// Commits the scheduled prefill chunk in every group, then releases
    /// what each group reads no more.
    ///
    /// # Errors
    ///
    /// As [`SchedulableSequence::apply_prefill`]; nothing changes.
    pub fn apply_prefill(
        &mut self,
        token: Option<u32>,
        manager: &BlockManager<M>,
    ) -> Result<(), ApplyError> {
        self.unread_from = 0;
        let Some(unread) = self.releases_last() else {
            let apply = |seq: &mut SchedulableSequence<M>| seq.apply_prefill(token, manager);
            return self.apply_all(apply, apply);
        };
        // The last group releases its unread blocks as it registers them:
        // its releases come after every group's registrations either way,
        // and no other group releases any.
        let [first, others @ .., last] = self.sequences.as_mut_slice() else {
            return Err(no_groups());
        };
        first.apply_prefill(token, manager)?;
        for seq in others {
            seq.apply_prefill(token, manager)?;
        }
        last.apply_prefill_releasing(token, manager, Some(unread))?;
        Ok(())
    }

    /// The last group's kind if it is the only group that releases unread
    /// blocks (a model of full-attention groups and one sliding window or
    /// chunk group, last): it may then release them at its registration
    /// with no other pool operation moving relative to them.
    fn releases_last(&self) -> Option<AttentionKind> {
        let [others @ .., last] = self.groups.groups() else {
            return None;
        };
        let full = |kind: AttentionKind| kind == AttentionKind::Full;
        (!others.is_empty() && !full(last.kind()) && others.iter().all(|g| full(g.kind())))
            .then(|| last.kind())
    }

    /// Commits the scheduled decode step in every group, then releases
    /// what each group reads no more.
    ///
    /// # Errors
    ///
    /// As [`SchedulableSequence::apply_decode`]; nothing changes.
    pub fn apply_decode(
        &mut self,
        token: u32,
        manager: &BlockManager<M>,
    ) -> Result<DecodeOutcome, ApplyError> {
        // As `schedule_decode`: the first group's checks stand for all, and
        // groups register alike, so when the first registers nothing (15
        // steps of 16) the others only append the token.
        let [lead, others @ ..] = self.sequences.as_mut_slice() else {
            return Err(no_groups());
        };
        let registers = !lead.registers_nothing_at(lead.kv_position() + 1);
        let outcome = lead.apply_decode(token, manager)?;
        for seq in others {
            debug_assert!(matches!(
                seq.state(),
                crate::SequenceState::DecodeScheduled { .. }
            ));
            if registers {
                seq.apply_decode_checked(token, manager)?;
            } else {
                seq.apply_decode_unregistered(token)?;
            }
        }
        self.release_unread();
        Ok(outcome)
    }

    /// Applies `lead` to the first group (whose refusal changes nothing),
    /// then `rest` to the others, which are in the same state and so accept
    /// too; then each group releases its unread blocks.
    fn apply_all<T, U>(
        &mut self,
        lead: impl FnOnce(&mut SchedulableSequence<M>) -> Result<T, ApplyError>,
        mut rest: impl FnMut(&mut SchedulableSequence<M>) -> Result<U, ApplyError>,
    ) -> Result<T, ApplyError> {
        let [first, others @ ..] = self.sequences.as_mut_slice() else {
            return Err(no_groups());
        };
        let outcome = lead(first)?;
        for seq in others {
            rest(seq)?;
        }
        self.release_unread();
        Ok(outcome)
    }

    /// After an apply: each group releases the blocks it reads no more.
    #[inline(always)]
    fn release_unread(&mut self) {
        // Most decode steps move no window past a block: the check is
        // inlined, the release is not.
        if self.kv_position() >= self.unread_from {
            self.release_unread_now();
        }
    }

    /// [`release_unread`](Self::release_unread) once a window may have
    /// moved past a block.
    #[inline(never)]
    fn release_unread_now(&mut self) {
        let kv_position = self.kv_position();
        let block_size = self.groups.block_size();
        let mut unread_from = usize::MAX;
        for (seq, group) in self.sequences.iter_mut().zip(self.groups.groups()) {
            let kind = group.kind();
            // A full group reads every block: nothing to release.
            if kind == AttentionKind::Full {
                continue;
            }
            if kind.first_needed_block(kv_position, block_size) > seq.inner().skipped_blocks() {
                // Idle after the apply, so this cannot be refused.
                let _ = seq.release_unread(kind);
            }
            let skipped = seq.inner().skipped_blocks();
            unread_from = unread_from.min(next_unread(kind, skipped, block_size));
        }
        self.unread_from = unread_from;
    }

    /// Undoes the scheduled step in every group.
    ///
    /// # Errors
    ///
    /// [`ApplyError::WrongState`] if no step is scheduled; nothing changes.
    pub fn revert_schedule(&mut self) -> Result<(), ApplyError> {
        let [lead, rest @ ..] = self.sequences.as_mut_slice() else {
            return Err(no_groups());
        };
        lead.revert_schedule()?;
        for seq in rest {
            seq.revert_schedule()?;
        }
        Ok(())
    }

    /// After a [`release`](Self::release), takes the longest prefix every
    /// group can serve again (as [`match_and_add_prefix`](Self::match_and_add_prefix));
    /// the rest is recomputed by prefill chunks.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::NotReleased`] if blocks are still held; as
    /// [`match_and_add_prefix`](Self::match_and_add_prefix) otherwise.
    pub fn reacquire(&mut self, manager: &BlockManager<M>) -> Result<usize, ScheduleError> {
        let held = self.held_blocks();
        if held > 0 {
            return Err(ScheduleError::NotReleased { held });
        }
        self.match_and_add_prefix(manager)
    }

    /// Preempts the request: every group gives every block back
    /// (registered ones stay cached) and `kv_position` drops to 0.
    ///
    /// # Errors
    ///
    /// [`ApplyError::WrongState`] if a step is scheduled; nothing changes.
    pub fn release(&mut self) -> Result<(), ApplyError> {
        self.unread_from = 0;
        for seq in &mut self.sequences {
            seq.release()?;
        }
        Ok(())
    }
}

/// Blocks a prefix match first looks up at once (one pool lock) for a
/// group; each further look-up of that group takes twice as many, up to
/// [`PROBE_MAX`]. A 128-token window over 16-token blocks needs 8.
const PROBE_FIRST: usize = 8;
/// The longest run a prefix match looks up at once for a group.
const PROBE_MAX: usize = 256;

/// One group's cached blocks as a prefix match learns them: looked up in
/// runs (without pinning anything or touching eviction order), forward
/// from the asked block for full attention and chunks, which scan up,
/// backward for a sliding window, which scans down. Only the last run is
/// kept: the rules ask in order, so earlier runs are not asked again.
struct Probe<'a> {
    hashes: &'a [SequenceHash],
    /// For full attention: how many leading blocks are cached, once looked
    /// up. A full group is asked from block 0 up to its first miss, so one
    /// look-up that stops there answers every question, with no run past
    /// the miss.
    prefix: Option<Option<usize>>,
    forward: bool,
    /// Block index of `found[0]`.
    start: usize,
    found: Vec<bool>,
    next_len: usize,
}

impl<'a> Probe<'a> {
    fn new(hashes: &'a [SequenceHash], kind: AttentionKind) -> Self {
        Self {
            hashes,
            prefix: (kind == AttentionKind::Full).then_some(None),
            forward: !matches!(kind, AttentionKind::SlidingWindow { .. }),
            start: 0,
            found: Vec::new(),
            next_len: PROBE_FIRST,
        }
    }

    fn is_cached<M>(&mut self, i: usize, manager: &BlockManager<M>) -> bool {
        if let Some(prefix) = &mut self.prefix {
            let cached = *prefix.get_or_insert_with(|| manager.registered_prefix(self.hashes));
            return i < cached;
        }
        if let Some(&known) = i.checked_sub(self.start).and_then(|k| self.found.get(k)) {
            return known;
        }
        if i >= self.hashes.len() {
            return false;
        }
        let len = self.next_len;
        self.next_len = (len * 2).min(PROBE_MAX);
        let range = if self.forward {
            i..(i + len).min(self.hashes.len())
        } else {
            (i + 1).saturating_sub(len)..i + 1
        };
        self.start = range.start;
        self.found = manager.scan_matches(&self.hashes[range]);
        self.found.get(i - self.start).copied().unwrap_or(false)
    }
}

/// The smallest `kv_position` at which a group of `kind` with `skipped`
/// blocks released has another to release
/// ([`AttentionKind::first_needed_block`] passes `skipped`; it never
/// decreases as the position grows); 0 (ask every time) for a kind this
/// does not know.
fn next_unread(kind: AttentionKind, skipped: usize, block_size: usize) -> usize {
    let block_size = block_size.max(1);
    let past = skipped.saturating_add(1).saturating_mul(block_size);
    match kind {
        AttentionKind::Full => usize::MAX,
        // (n + 1 - window) / block_size > skipped
        AttentionKind::SlidingWindow { window } => past.saturating_add(window).saturating_sub(1),
        // n / chunk * chunk / block_size > skipped
        AttentionKind::ChunkedLocal { chunk } => {
            let chunk = chunk.max(1);
            past.div_ceil(chunk).saturating_mul(chunk)
        }
        _ => 0,
    }
}

/// `KvCacheGroups` has at least one group, so a grouped sequence has at
/// least one sequence; reported as a refusal rather than a panic.
fn no_groups() -> ApplyError {
    ApplyError::WrongState {
        operation: "apply",
        expected: "at least one KV cache group",
        actual: crate::SequenceState::Idle,
    }
}

impl<M> std::fmt::Debug for GroupedSequence<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupedSequence")
            .field("groups", &self.groups.len())
            .field("kv_position", &self.kv_position())
            .field("held_blocks", &self.held_blocks())
            .finish()
    }
}

#[cfg(test)]
mod tests;
