//! Prefill (and recompute) chunks: `schedule_prefill` / `apply_prefill`.

use kvbm_blocks::BlockManager;
use kvbm_sequence::AttentionKind;
use tracing::{instrument, trace};

use crate::{ApplyError, SchedulableSequence, ScheduleError, SequenceEvent, SequenceState};

impl<M> SchedulableSequence<M> {
    /// Schedules a prefill chunk computing the KV of the next `num_tokens`
    /// tokens (from [`kv_position`](Self::kv_position)) and allocates the
    /// blocks that cover them, all or nothing.
    ///
    /// The chunk may not pass the [`prefill_target`](Self::prefill_target):
    /// the prompt before any token was generated, everything but the tail
    /// token when recomputing after a preemption. A zero-token chunk is
    /// allowed (it computes nothing).
    ///
    /// # Errors
    ///
    /// Nothing changes on error:
    /// - [`ScheduleError::NotIdle`] if a step is pending;
    /// - [`ScheduleError::PrefillComplete`] if `kv_position` already reached
    ///   the target;
    /// - [`ScheduleError::PrefillOverrun`] if the chunk would pass it;
    /// - [`ScheduleError::AllocationFailed`] if the manager cannot supply the
    ///   blocks;
    /// - [`ScheduleError::Sequence`] for a manager of another block size or
    ///   pool.
    #[instrument(level = "debug", skip_all, fields(num_tokens = num_tokens, kv = self.kv_position))]
    pub fn schedule_prefill(
        &mut self,
        num_tokens: usize,
        manager: &BlockManager<M>,
    ) -> Result<(), ScheduleError> {
        self.require_idle("schedule_prefill")?;
        let prefill_target = self.prefill_target();
        let kv_position = self.kv_position;
        if kv_position >= prefill_target {
            return Err(ScheduleError::PrefillComplete {
                kv_position,
                prefill_target,
            });
        }
        let chunk_end = kv_position
            .checked_add(num_tokens)
            .filter(|&end| end <= prefill_target)
            .ok_or(ScheduleError::PrefillOverrun {
                kv_position,
                num_tokens,
                prefill_target,
            })?;
        self.check_manager(manager)?;
        let blocks_allocated = self.allocate_to_cover(chunk_end, manager)?;
        self.state = SequenceState::PrefillScheduled {
            num_tokens,
            blocks_allocated,
        };
        self.record(SequenceEvent::PrefillScheduled {
            num_tokens,
            kv_position,
            blocks_allocated,
        });
        Ok(())
    }

    /// Commits the scheduled prefill chunk: `kv_position` advances to its
    /// end and every block it made fully computed is registered.
    ///
    /// `token` is the token sampled from the chunk's last position. It must
    /// be given exactly when the chunk emits one: the chunk reaches the
    /// prefill target, nothing was generated yet and the output budget allows
    /// one ([`final_chunk_emits_token`](Self::final_chunk_emits_token)).
    /// It becomes the tail token (its KV is computed by the first decode
    /// step), so a block it fills is registered only then.
    ///
    /// # Errors
    ///
    /// The schedule stays pending and nothing changes, so a corrected retry
    /// works:
    /// - [`ApplyError::WrongState`] if no prefill is scheduled;
    /// - [`ApplyError::TokenOnNonFinalChunk`] if a token is given for a chunk
    ///   that emits none;
    /// - [`ApplyError::MissingTokenOnFinalChunk`] if the emitting chunk has
    ///   no token;
    /// - [`ApplyError::Sequence`] for a manager of another block size or
    ///   pool than the blocks held.
    pub fn apply_prefill(
        &mut self,
        token: Option<u32>,
        manager: &BlockManager<M>,
    ) -> Result<(), ApplyError> {
        self.apply_prefill_releasing(token, manager, None)
    }

    /// [`apply_prefill`](Self::apply_prefill), then, for a group of
    /// `unread` layers, [`release_unread`](Self::release_unread) in the
    /// same pass: the chunk's blocks the layers read no more go straight
    /// into the cache instead of joining the table first (the pool sees
    /// the same operations in the same order).
    pub(crate) fn apply_prefill_releasing(
        &mut self,
        token: Option<u32>,
        manager: &BlockManager<M>,
        unread: Option<AttentionKind>,
    ) -> Result<(), ApplyError> {
        let SequenceState::PrefillScheduled { num_tokens, .. } = self.state else {
            return Err(ApplyError::WrongState {
                operation: "apply_prefill",
                expected: "PrefillScheduled",
                actual: self.state,
            });
        };
        // The schedule checked `kv_position + num_tokens <= prefill_target`
        // and nothing has moved since.
        let chunk_end = self.kv_position + num_tokens;
        let prefill_target = self.prefill_target();
        let emits = chunk_end >= prefill_target && self.final_chunk_emits_token();
        match (token, emits) {
            (Some(_), false) => {
                return Err(ApplyError::TokenOnNonFinalChunk {
                    chunk_end,
                    prefill_target,
                    generated_tokens: self.inner.generated_tokens(),
                    max_output_tokens: self.inner.max_output_tokens(),
                });
            }
            (None, true) => return Err(ApplyError::MissingTokenOnFinalChunk { prefill_target }),
            _ => {}
        }
        self.check_manager(manager)?;
        // Registration first: it is the only fallible commit step, and the
        // token (if any) only fills a block that is not registered now.
        let (blocks_registered, released) = match unread {
            None => (self.register_computed(chunk_end, manager)?, 0),
            Some(kind) => self.register_computed_releasing(chunk_end, kind, manager)?,
        };
        if let Some(token) = token {
            // Cannot fail: `emits` means output budget is left.
            self.inner.append_token(token)?;
        }
        self.kv_position = chunk_end;
        self.state = SequenceState::Idle;
        trace!(chunk_end, blocks_registered, "prefill applied");
        self.record(SequenceEvent::PrefillApplied {
            num_tokens,
            kv_position: chunk_end,
            blocks_registered,
            token,
        });
        if released > 0 {
            self.record(SequenceEvent::UnreadReleased {
                count: released,
                kv_position: chunk_end,
            });
        }
        Ok(())
    }
}
