//! What a layer group that does not attend to every earlier token gives
//! back: `release_unread`, and `take_hit` for a prefix hit decided across
//! groups.

use std::ops::Range;

use kvbm_blocks::BlockManager;
use kvbm_sequence::AttentionKind;

use crate::{SchedulableSequence, ScheduleError, SequenceEvent};

impl<M> SchedulableSequence<M> {
    /// Releases the registered blocks that layers of `kind` read no more
    /// now that `kv_position` tokens are computed (those before
    /// [`AttentionKind::first_needed_block`]): they go back to the cache,
    /// still matchable, and the page table starts after them
    /// ([`RequestSequence::skipped_blocks`](kvbm_sequence::RequestSequence::skipped_blocks)).
    /// Returns how many were released; always 0 for full attention.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::NotIdle`] while a step is pending (its blocks are
    /// being written); nothing changes.
    pub fn release_unread(&mut self, kind: AttentionKind) -> Result<usize, ScheduleError> {
        self.require_idle("release_unread")?;
        let first = kind.first_needed_block(self.kv_position, self.inner.block_size());
        if first <= self.inner.skipped_blocks() {
            // The window has not passed a block since the last release
            // (15 steps of 16 while decoding): `skip_to` would change
            // nothing, and it is a call into another crate.
            return Ok(0);
        }
        let count = self.inner.skip_to(first);
        if count > 0 {
            self.record(SequenceEvent::UnreadReleased {
                count,
                kv_position: self.kv_position,
            });
        }
        Ok(count)
    }

    /// Takes a prefix hit decided for several layer groups at once: the
    /// cached blocks `needed` (from [`AttentionKind::needed_for_hit`]) are
    /// matched, the blocks before them skipped, and `kv_position` moves to
    /// the end of `needed`. All or nothing: if any block of `needed` is no
    /// longer cached (evicted since it was scanned), nothing is taken and
    /// it returns false.
    ///
    /// # Errors
    ///
    /// Nothing changes on error: [`ScheduleError::NotIdle`] if a step is
    /// pending, [`ScheduleError::NotReleased`] if blocks are held or KV
    /// computed (a hit starts a sequence), [`ScheduleError::Sequence`] for a
    /// manager of another block size, or a range past the sequence's
    /// matchable blocks (the last token is never matched).
    pub fn take_hit(
        &mut self,
        needed: Range<usize>,
        manager: &BlockManager<M>,
    ) -> Result<bool, ScheduleError> {
        self.require_idle("take_hit")?;
        let held = self.inner.held_blocks();
        if held > 0 || self.kv_position > 0 || self.inner.skipped_blocks() > 0 {
            return Err(ScheduleError::NotReleased { held });
        }
        self.check_manager(manager)?;
        let block_size = self.inner.block_size();
        let cap = self.inner.total_tokens().saturating_sub(1) / block_size;
        if needed.end > cap || needed.start > needed.end {
            return Err(ScheduleError::HitBeyondPrompt {
                start: needed.start,
                end: needed.end,
                matchable: cap,
            });
        }
        if needed.end == 0 {
            return Ok(true);
        }
        let hashes = &self.inner.sequence().sequence_hashes()[needed.clone()];
        let matched = manager.match_blocks(hashes);
        if matched.len() != hashes.len() {
            return Ok(false); // `matched` drops back into the cache
        }
        self.inner.skip_to(needed.start);
        self.inner.add_matched_blocks(matched)?;
        self.bind(manager);
        self.kv_position = needed.end * block_size;
        self.record(SequenceEvent::PrefixMatched {
            blocks_matched: needed.len(),
            kv_position: self.kv_position,
        });
        Ok(true)
    }
}
