//! Taking and giving back cached KV: `match_and_add_prefix`, `release`
//! (preemption) and `reacquire`.

use kvbm_blocks::BlockManager;
use tracing::{debug, instrument};

use crate::{ApplyError, SchedulableSequence, ScheduleError, SequenceEvent};

impl<M> SchedulableSequence<M> {
    /// Matches the longest run of cached blocks that continues the computed
    /// prefix, adds them as this request's blocks and advances
    /// `kv_position` past them (their KV is computed already). Returns how
    /// many blocks matched.
    ///
    /// The match is capped so that at least one token is left for the
    /// forward pass: only blocks wholly within the first `total_tokens - 1`
    /// tokens count. A prompt that is entirely cached therefore keeps its
    /// last block uncached for this request (vLLM does the same): without
    /// that, prefill would be complete with no forward pass left to sample
    /// the first token from.
    ///
    /// Usually called once on a fresh sequence; mid-prefill it picks up
    /// blocks other requests registered meanwhile (a partially computed
    /// block it replaces is given back, recorded as
    /// [`UnassignedDropped`](SequenceEvent::UnassignedDropped)); while
    /// decoding the cap leaves nothing to match and it returns 0.
    ///
    /// # Errors
    ///
    /// Nothing changes on error:
    /// - [`ScheduleError::NotIdle`] if a step is pending;
    /// - [`ScheduleError::Sequence`] for a manager of another block size or
    ///   pool than the blocks held.
    #[instrument(level = "debug", skip_all, fields(kv = self.kv_position))]
    pub fn match_and_add_prefix(
        &mut self,
        manager: &BlockManager<M>,
    ) -> Result<usize, ScheduleError> {
        self.require_idle("match_and_add_prefix")?;
        let blocks_matched = self.match_capped(manager)?;
        self.record(SequenceEvent::PrefixMatched {
            blocks_matched,
            kv_position: self.kv_position,
        });
        Ok(blocks_matched)
    }

    /// Preempts the request: every block is given back (registered ones stay
    /// cached, so a later [`reacquire`](Self::reacquire) may match them) and
    /// `kv_position` drops to 0, since this request no longer holds any KV.
    /// The tokens stay.
    ///
    /// # Errors
    ///
    /// [`ApplyError::WrongState`] if a step is scheduled (revert it first);
    /// nothing changes.
    #[instrument(level = "debug", skip_all, fields(held = self.inner.held_blocks()))]
    pub fn release(&mut self) -> Result<(), ApplyError> {
        self.require_idle_to_apply("release")?;
        let blocks_released = self.inner.held_blocks();
        let kv_position = self.kv_position;
        self.inner.release();
        // Detached: the next blocks may come from any manager.
        self.bound = None;
        self.kv_position = 0;
        self.record(SequenceEvent::Released {
            blocks_released,
            kv_position,
        });
        Ok(())
    }

    /// After a [`release`](Self::release), matches the cached prefix again
    /// (with the cap of [`match_and_add_prefix`](Self::match_and_add_prefix))
    /// and sets `kv_position` to the matched tokens. Returns how many blocks
    /// matched.
    ///
    /// Nothing is allocated here. Tokens past the matched prefix, generated
    /// ones included, lost their KV with the released blocks: the prefill
    /// path recomputes them up to [`prefill_target`](Self::prefill_target)
    /// (`schedule_prefill` / `apply_prefill(None)` chunks, which allocate as
    /// they go), then decoding resumes, its first `schedule_decode`
    /// allocating the generation block. If the whole sequence is still
    /// cached, prefill is complete right away and `schedule_decode` may
    /// follow directly.
    ///
    /// # Errors
    ///
    /// Nothing changes on error:
    /// - [`ScheduleError::NotIdle`] if a step is pending;
    /// - [`ScheduleError::NotReleased`] if blocks are still held;
    /// - [`ScheduleError::Sequence`] for a manager of another block size.
    #[instrument(level = "debug", skip_all, fields(total = self.inner.total_tokens()))]
    pub fn reacquire(&mut self, manager: &BlockManager<M>) -> Result<usize, ScheduleError> {
        self.require_idle("reacquire")?;
        let held = self.inner.held_blocks();
        if held > 0 {
            return Err(ScheduleError::NotReleased { held });
        }
        let prefix_matched = self.match_capped(manager)?;
        let tokens_to_recompute = self.remaining_prefill_tokens();
        debug!(prefix_matched, tokens_to_recompute, "reacquired");
        self.record(SequenceEvent::Reacquired {
            prefix_matched,
            kv_position: self.kv_position,
            tokens_to_recompute,
        });
        Ok(prefix_matched)
    }

    /// The matching shared by `match_and_add_prefix` and `reacquire`.
    fn match_capped(&mut self, manager: &BlockManager<M>) -> Result<usize, ScheduleError> {
        self.check_manager(manager)?;
        let block_size = self.inner.block_size();
        // Idle: the blocks below `kv_position / block_size` are exactly the
        // assigned ones, so the match continues right after them.
        let from = self.kv_position / block_size;
        debug_assert_eq!(
            from,
            self.inner.skipped_blocks() + self.inner.assigned_blocks()
        );
        let cap = self.inner.total_tokens().saturating_sub(1) / block_size;
        let Some(hashes) = self.inner.sequence().sequence_hashes().get(from..cap) else {
            return Ok(0); // `cap <= from`: nothing may be matched
        };
        if hashes.is_empty() {
            return Ok(0);
        }
        // A match that starts the table gets room for all of it, so that
        // registering the rest never copies the matched blocks.
        let capacity = match self.inner.assigned_blocks() {
            0 => {
                (self.inner.sequence().block_capacity()).saturating_sub(self.inner.skipped_blocks())
            }
            _ => 0,
        };
        let matched = manager.match_blocks_with_capacity(hashes, capacity);
        let count = matched.len();
        if count == 0 {
            return Ok(0);
        }
        self.inner.add_matched_blocks(matched)?;
        self.bind(manager);
        let kv_position = (from + count) * block_size;
        // A partially computed block past the old position is now covered
        // by a cache hit; give it back.
        let dropped = self.inner.release_unassigned_beyond(kv_position);
        self.kv_position = kv_position;
        if dropped > 0 {
            self.record(SequenceEvent::UnassignedDropped { count: dropped });
        }
        Ok(count)
    }
}
